"""report.html: the verdict and the culprit first, then findings, the grid of ranks coloured by class, the
merged tree (collapsible), diffs, loop iterations, progress timeline, nodes, GPU tests and per-rank stacks.

Every piece of text that is not a literal of this module goes through markup.h / h_sentence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from app.analysis.diff import StackDiff, diff_vs_majority
from app.analysis.fold import count_phrase
from app.analysis.prose.gpu import evidence_lines
from app.analysis.done import done_lines
from app.analysis.output import age_text, blamed_ranks
from app.analysis.output import blocks as output_blocks
from app.analysis.processes import tree_lines
from app.analysis.prose.graph import graph_lines
from app.analysis.prose.graph import shown as shown_graphs
from app.model import Snapshot
from app.report import html_ranks as hr
from app.report.facts import Facts, RankKey, main_frames, top_frames
from app.report.html_extra import progress_section, tests_section
from app.report.html_page import page, symbol
from app.report.manifest import iso
from app.report.markup import VALUE, h, h_sentence
from app.report.share import Sharer

if TYPE_CHECKING:
    from app.analysis import Analysis
    from app.analysis.tree import StackTree, TreeNode

MAX_RANK_SECTIONS = 256  # per-rank stacks in the page; snapshot.json has every rank
MAX_FINDINGS = 64  # findings in the page; snapshot.json has every one (its analysis)
MAX_TREE_NODES = 3000
MAX_CLASS_DIFFS = 8


def render_html(facts: Facts, analysis: Optional["Analysis"], red: Sharer, *, history_times: Sequence[float] = (),
                tests: Optional[Dict[str, Any]] = None, version: str = "") -> Tuple[str, List[Tuple[str, str]]]:
    """The page and the items it left out (for the manifest)."""
    snap = facts.snapshot
    skipped: List[Tuple[str, str]] = []
    ranks = hr.rank_order(snap.ranks)
    ids = hr.anchors(ranks)
    shown = _shown(ranks, facts, analysis)
    if len(shown) < len(ranks):
        skipped.append(("report.html: per-rank stacks",
                        f"{len(ranks) - len(shown)} of {len(ranks)} ranks not shown (the page shows the suspects, "
                        f"one rank per class and the first {MAX_RANK_SECTIONS} ranks); snapshot.json has them all"))
    n_classes = len(analysis.classes) if analysis is not None else 0
    sections = [_header(snap, version, tests is not None, bool(facts.progress)),
                f"<div class=\"verdict\" id=\"verdict\"><strong>Verdict:</strong> {h_sentence(facts.verdict)}</div>"]
    if facts.culprit is not None:
        sections.append(_culprit(facts, ids, shown))
    if analysis is not None:
        sections.append(_waits(analysis))
    sections.append(_findings(facts))
    sections.append(_grid(facts, analysis, red, ids, shown))
    if analysis is not None and analysis.classes:
        sections.append(_diffs(facts, analysis))
        tree, cut = _tree(analysis.tree, red)
        sections.append(tree)
        if cut:
            skipped.append(("report.html: merged tree", f"cut at {MAX_TREE_NODES} nodes; snapshot.json's analysis "
                                                         "has the whole tree"))
    if facts.iterations:
        sections.append("<h2 id=\"iterations\">Loop iterations</h2><ul>" + "".join(
            f"<li>class {i + 1} {symbol(i)}: {h_sentence(t)}</li>" for i, t in facts.iterations) + "</ul>")
    if facts.progress:
        sections.append(progress_section(facts.progress, history_times, snap.taken_at))
    sections.append("<h2 id=\"nodes\">Nodes</h2>" + hr.nodes_table(snap.nodes)
                    + ("<ul>" + "".join(f"<li>{h_sentence(line)}</li>" for line in facts.failures) + "</ul>"
                       if facts.failures else ""))
    procs = tree_lines(snap)
    if procs:
        sections.append("<h2 id=\"processes\">Processes of the job</h2><p class=\"meta\">Launchers above their "
                        "ranks, each rank's children below it (never counted as ranks).</p><pre class=\"mono\">"
                        + "\n".join(h(line, 400) for line in procs) + "</pre>")
    written = output_blocks(snap, blamed_ranks(analysis.culprits) if analysis is not None else ())
    if written:
        sections.append("<h2 id=\"output\">Recent error output</h2><p class=\"meta\">What ranks wrote of an error "
                        "where their node could read it back (stderr when it is a file, torchrun's elastic error "
                        "file), redacted on the node.</p>" + "".join(
                            f"<h3>{h(b.label, 200)}, {h(b.source, 600)}"
                            f"{' &middot; ' + h(age_text(b.age)) if b.age is not None else ''}</h3>"
                            f"<pre class=\"mono\">{h(b.text, 4000)}</pre>" for b in written))
    done = done_lines(snap)
    if done:
        sections.append("<h2 id=\"done\">What hangscope did to the processes</h2><ul>" + "".join(
            f"<li>{h_sentence(line)}</li>" for line in done) + "</ul>")
    gpu = [(n.name, line) for n in snap.nodes for line in evidence_lines(n)]
    if gpu:
        sections.append("<h2 id=\"gpu\">GPU evidence</h2><ul>" + "".join(
            f"<li><span class=\"mono\">{h(name)}</span>: {h_sentence(line)}</li>" for name, line in gpu) + "</ul>")
    if tests is not None:
        sections.append(tests_section(tests))
    sections.append("<h2 id=\"ranks\">Per-rank stacks</h2><p class=\"meta\">Innermost frame first, as py-spy prints "
                    "them; locals and loop iterations where collected.</p>")
    cut_output: List[str] = []
    for r in ranks:
        k = hr.key(r)
        if k in shown:
            sections.append(hr.rank_section(r, ids[k], facts.class_of.get(k), open_=k in facts.suspects))
            if max(len(r.gdb or ""), len(r.strace.output) if r.strace else 0) > hr.TOOL_OUTPUT_LIMIT:
                cut_output.append(f"{r.label} on {r.node}")
    if cut_output:
        who = ", ".join(cut_output[:10]) + (" and more" if len(cut_output) > 10 else "")
        skipped.append((f"report.html: strace/gdb output of {who}",
                        f"cut at {hr.TOOL_OUTPUT_LIMIT:,} characters per rank; snapshot.json has all of it"))
    sections.append("<footer class=\"meta\"><p>Values are shown only where they are safe to share (numbers, names, "
                    "paths of names): secrets the pattern rules recognise read <code>***</code>, anything else "
                    "<code>&lt;str len=N #hash&gt;</code> (its type, length and a hash keyed for this bundle); "
                    "manifest.json counts the replacements by rule. Text from nodes is shown literally.</p></footer>")
    title = f"hangscope report: {h(facts.verdict, 120)}"
    return red.whole(page(title, sections, n_classes)), skipped


def _header(snap: Snapshot, version: str, tests: bool, progress: bool) -> str:
    links = [("verdict", "verdict"), ("culprit", "culprit"), ("findings", "findings"), ("grid", "ranks by class"),
             ("diffs", "diffs"), ("tree", "merged tree"), ("iterations", "iterations")]
    if progress:
        links.append(("progress", "progress"))
    links.append(("nodes", "nodes"))
    if tests:
        links.append(("tests", "GPU tests"))
    links.append(("ranks", "per-rank stacks"))
    meta = (f"snapshot taken {h(iso(snap.taken_at) or '?')} \u00b7 {count_phrase(len(snap.ranks))} on "
            f"{count_phrase(len(snap.nodes), 'node')}"
            f" \u00b7 collected in {snap.duration:.2f} s \u00b7 hangscope {h(version)}")
    if snap.interrupted:
        meta += " \u00b7 <span class=\"fail\">interrupted: partial data</span>"
    nav = "".join(f"<a href=\"#{a}\">{t}</a>" for a, t in links)
    return f"<header><h1>hangscope report</h1><p class=\"meta\">{meta}</p><nav>{nav}</nav></header>"


def _culprit(facts: Facts, ids: Dict[RankKey, str], shown: Set[RankKey]) -> str:
    f = facts.culprit
    assert f is not None
    out = [f"<section id=\"culprit\"><h2>Culprit: {h(f.ranks_label or f.title, 400)}</h2>",
           f"<p><strong>{h_sentence(f.title)}</strong></p><p>{h_sentence(f.detail)}</p>",
           f"<p class=\"meta\">{h(f.confidence)} confidence: {h_sentence(f.reason)}</p>"]
    r = facts.culprit_rank
    if r is not None:
        k = hr.key(r)
        link = f" (<a href=\"#{ids[k]}\">all of its data</a>)" if k in shown else ""
        out.append(f"<h3>Stack of {h(r.label)} on {h(r.node)}, pid {r.pid}{link}</h3>")
        out.append(hr.frames_table(main_frames(r)))
    if facts.diff is not None:
        out.append("<h3>Against the majority</h3>" + diff_table(facts.diff))
    out.append("</section>")
    return "\n".join(out)


def _waits(analysis: "Analysis") -> str:
    """Who waits for whom (app/analysis/graph.py): per job, one item per wait, the culprit and what to run next
    (the page is redacted as a whole afterwards; every piece is escaped here)."""
    graphs = shown_graphs(analysis.waits)
    if not graphs:
        return ""
    out = ["<h2 id=\"waits\">Who waits for whom</h2>"]
    for g in graphs:
        if len(graphs) > 1:
            out.append(f"<h3>job {h(g.job, 200)}</h3>")
        out.append("<ul>" + "".join(f"<li>{h_sentence(line)}</li>" for line in graph_lines(g)) + "</ul>")
    return "".join(out)


def _findings(facts: Facts) -> str:
    if not facts.findings:
        return "<h2 id=\"findings\">Findings</h2><p>No findings.</p>"
    items = []
    for f in facts.findings[:MAX_FINDINGS]:
        ranks = f"<div class=\"meta\">{h(f.ranks_label, 400)}</div>" if f.ranks_label else ""
        items.append(f"<div class=\"finding {h(f.confidence)}\"><strong>{h_sentence(f.title)}</strong>{ranks}"
                     f"<div>{h_sentence(f.detail)}</div><div class=\"why\">{h(f.confidence)} confidence: "
                     f"{h_sentence(f.reason)}</div></div>")
    if len(facts.findings) > MAX_FINDINGS:
        items.append(f"<p class=\"meta\">and {len(facts.findings) - MAX_FINDINGS:,} more findings: snapshot.json "
                     "has them all (its analysis)</p>")
    return "<h2 id=\"findings\">Findings, most likely culprit first</h2>" + "".join(items)


def _grid(facts: Facts, analysis: Optional["Analysis"], red: Sharer, ids: Dict[RankKey, str],
          shown: Set[RankKey]) -> str:
    tops = top_frames(analysis, red)
    out = ["<h2 id=\"grid\">Ranks by class</h2>",
           "<p class=\"meta\">One row per node; each cell is a rank, coloured and marked by its class; the "
           "outlined cells are the culprit. Hover for details, click for its stacks.</p>",
           hr.grid(facts.snapshot, facts.class_of, facts.suspects, ids, shown, tops)]
    if analysis is not None and analysis.classes:
        rows = ["<tr><th>class</th><th>ranks</th><th>count</th><th>waits in</th><th>innermost frames</th></tr>"]
        for c in analysis.classes:
            inner = " \u2190 ".join(f"<code>{h(red.text(f'{f.function} ({f.location})'))}</code>"
                                    for f in list(reversed(c.frames))[:3])
            waits = h(c.collective) if c.collective else "\u2014"
            rows.append(f"<tr><td><span class=\"swatch k{c.index}\">{c.index + 1}</span></td>"
                        f"<td>{h(red.text(c.label), 400)}</td><td>{c.size}</td><td>{waits}</td><td>{inner}</td></tr>")
        out.append("<table id=\"classes\">" + "".join(rows) + "</table>")
    return "\n".join(out)


def diff_table(d: StackDiff) -> str:
    note = f"<p>{h_sentence(d.iteration_note)}</p>" if d.iteration_note else ""
    rows = [f"<tr><th></th><th>{h(d.left)}</th><th>{h(d.right)}</th></tr>"]
    for row in d.rows:
        css = " class=\"diverge\"" if row.first_divergence else (" class=\"same\"" if row.same else "")
        mark = "first divergence" if row.first_divergence else ("" if row.same else "differs")
        cells = [f"<code>{h(f'{fr.function} ({fr.location})')}</code>" if fr is not None else ""
                 for fr in (row.left, row.right)]
        rows.append(f"<tr{css}><td>{mark}</td><td>{cells[0]}</td><td>{cells[1]}</td></tr>")
        for v in row.iteration + row.locals:
            rows.append(f"<tr class=\"diverge\"><td><code>{h(v.name)}</code></td>"
                        f"<td><code>{h(v.left if v.left is not None else '(none)', VALUE)}</code></td>"
                        f"<td><code>{h(v.right if v.right is not None else '(none)', VALUE)}</code></td></tr>")
    return note + "<table class=\"diff\">" + "".join(rows) + "</table>"


def _diffs(facts: Facts, analysis: "Analysis") -> str:
    """The first rank of each minority class against the majority (the culprit's is in its own section)."""
    out = ["<h2 id=\"diffs\">Diffs against the majority</h2>"]
    lookup = {hr.key(r): r for r in facts.snapshot.ranks}
    culprit = hr.key(facts.culprit_rank) if facts.culprit_rank is not None else None
    shown = 0
    for c in analysis.classes[1:]:
        k = c.ranks[0]
        if k == culprit or k not in lookup or shown >= MAX_CLASS_DIFFS:
            continue
        try:
            d = diff_vs_majority(facts.snapshot, analysis, k)
        except KeyError:
            continue
        out.append(f"<details><summary>class {c.index + 1} {symbol(c.index)}: {h(d.left)} vs {h(d.right)}</summary>"
                   f"{diff_table(d)}</details>")
        shown += 1
    if len(out) == 1:
        out.append("<p class=\"meta\">" + ("The culprit's diff is in the culprit section above." if culprit else
                                           "One class only: every rank has the same stack.") + "</p>")
    return "\n".join(out)


def _tree(tree: "StackTree", red: Sharer) -> Tuple[str, bool]:
    """The merged stack tree as nested lists, outermost frame first, at most MAX_TREE_NODES frames in pre-order.
    Built without recursion: a rank deep in a recursive function has a stack thousands of frames deep."""
    budget = MAX_TREE_NODES

    def head(node: "TreeNode") -> str:
        f = node.frame
        assert f is not None
        label = f" <span class=\"meta\">\u2190 {h(red.text(tree.label(node)), 400)}</span>" if node.ends else ""
        return (f"<span class=\"count\">{node.count}</span><code>{h(red.text(f'{f.function} ({f.location})'))}</code>"
                f"{label}")

    top: List[str] = []
    # per open node: its head, its children's html so far, its children still to visit, where its own html goes
    stack: List[Tuple[str, List[str], Iterator["TreeNode"], List[str]]] = [("", top, iter(tree.root.children), [])]
    while stack:
        _, kids, todo, _ = stack[-1]
        child = next(todo, None) if budget > 0 else None
        if child is not None:
            budget -= 1
            stack.append((head(child), [], iter(child.children), kids))
            continue
        text, kids, _, parent = stack.pop()
        if stack:  # the root has no line of its own
            parent.append(f"<li>{text}</li>" if not kids else
                          f"<li><details open><summary>{text}</summary><ul>{''.join(kids)}</ul></details></li>")
    html = ("<h2 id=\"tree\">Merged stack tree</h2><p class=\"meta\">Outermost frame first; the number is how many "
            "ranks passed through the frame; click a frame to fold it.</p>"
            f"<div class=\"tree\"><ul>{''.join(top)}</ul></div>")
    return html, budget <= 0


def _shown(ranks: Sequence[Any], facts: Facts, analysis: Optional["Analysis"]) -> Set[RankKey]:
    """Which ranks get a per-rank section: suspects, the first rank of each class, failed ranks, then the
    rest in rank order up to MAX_RANK_SECTIONS."""
    order: List[RankKey] = list(facts.suspects)
    for f in facts.findings:
        if f.culprit:
            order.extend(f.ranks[:16])
    if analysis is not None:
        order.extend(c.ranks[0] for c in analysis.classes if c.ranks)
    order.extend(hr.key(r) for r in ranks if r.error is not None)
    order.extend(hr.key(r) for r in ranks)
    known = {hr.key(r) for r in ranks}
    shown: Set[RankKey] = set()
    for k in order:
        if len(shown) >= MAX_RANK_SECTIONS:
            break
        if k in known:
            shown.add(k)
    return shown
