"""summary.md: the part of the bundle a user pastes into an issue. Verdict and findings first, then classes,
the culprit's stack and its diff against the majority, loop iterations, progress, node failures and GPU
tests; long parts folded in <details>. Remote text is stripped of control sequences and escaped."""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from app.analysis.diff import StackDiff
from app.analysis.fold import count_phrase, fold_nodes
from app.analysis.prose.gpu import evidence_lines
from app.analysis.done import done_lines
from app.analysis.output import age_text, blamed_ranks
from app.analysis.output import blocks as output_blocks
from app.analysis.processes import skew_line, tree_lines
from app.analysis.prose.graph import graph_lines
from app.analysis.prose.graph import shown as shown_graphs
from app.model import CollectOptions, Snapshot
from app.printable import clean
from app.report.facts import Facts, frame_line, main_frames
from app.report.manifest import iso
from app.report.markup import VALUE, md, md_block, md_cell, md_code, md_code_cell, md_sentence, strip
from app.report.share import Sharer

if TYPE_CHECKING:
    from app.analysis import Analysis
    from app.analysis.tree import StackTree, TreeNode

MAX_FINDINGS = 20
MAX_CLASSES = 30
TREE_LINES = 400


def render_summary(facts: Facts, analysis: Optional["Analysis"], red: Sharer, *,
                   tests: Optional[dict] = None, files: Sequence[str] = (),
                   first: Optional[CollectOptions] = None) -> str:
    """first: the options of the first sample of the run (its earlier snapshots), when known."""
    snap = facts.snapshot
    out: List[str] = ["# hangscope report", "", f"**Verdict:** {md_sentence(facts.verdict)}", "",
                      _context(snap, first), ""]
    if analysis is not None:
        out += _waits(analysis, red)
    out += _findings(facts)
    if facts.culprit is not None:
        out += _culprit(facts)
    if analysis is not None and analysis.classes:
        out += _classes(analysis, red, facts)
    if facts.iterations:
        out += ["## Loop iterations", ""]
        out += [f"- class {i + 1}: {md_sentence(text)}" for i, text in facts.iterations] + [""]
    if facts.progress:
        out += ["## Progress over samples", "", "| ranks | status | since | for | activity |", "|---|---|---|---|---|"]
        out += [f"| {md_cell(p.label)} | {md_cell(p.status)} | {iso(p.since) or '?'} | {p.duration:.0f} s | "
                f"{md_cell(p.activity)} |"
                for p in facts.progress] + [""]
    gpu = [(n.name, line) for n in snap.nodes for line in evidence_lines(n)]
    if gpu:
        out += ["## GPU evidence", ""] + [f"- {md(name)}: {md_sentence(line)}" for name, line in gpu] + [""]
    procs = tree_lines(snap)
    if procs:
        out += ["## Processes of the job", "", "Launchers above their ranks, each rank's children below it "
                "(never counted as ranks).", ""] + _details("Process tree", md_block("\n".join(procs))) + [""]
    written = output_blocks(snap, blamed_ranks(analysis.culprits) if analysis is not None else ())
    if written:
        out += ["## Recent error output", "", "What ranks wrote of an error where their node could read it back "
                "(stderr when it is a file, torchrun's elastic error file), redacted on the node.", ""]
        for b in written:
            age = f", {age_text(b.age)}" if b.age is not None else ""
            out += [md_sentence(f"{b.label}, {b.source}{age}:"), "", md_block(b.text), ""]
    skew = skew_line(snap)
    if skew:
        out += ["## Dump timing", "", md_sentence(skew), ""]
    done = done_lines(snap)
    if done:
        out += ["## What hangscope did to the processes", ""] + [f"- {md_sentence(line)}" for line in done] + [""]
    if facts.failures:
        out += ["## Node and rank failures", ""] + [f"- {md_sentence(line)}" for line in facts.failures] + [""]
    if tests is not None:
        out += ["## GPU tests", ""]
        verdict = tests.get("verdict") or tests.get("summary")
        if isinstance(verdict, str):
            out += [md_sentence(verdict), ""]
        out += _details("Test results (JSON)", md_block(json.dumps(tests, indent=1, ensure_ascii=False), "json")) + [""]
    if analysis is not None and analysis.classes:
        out += _details(f"Merged stack tree ({analysis.ranks_with_stacks} ranks)",
                        md_block(_tree_text(analysis.tree, red)))
    out += ["", "---", _footer(files)]
    return "\n".join(out) + "\n"


def _context(snap: Snapshot, first: Optional[CollectOptions] = None) -> str:
    nodes = fold_nodes(n.name for n in snap.nodes) or "this machine"
    failed = sum(1 for n in snap.nodes if n.state == "failed")
    opts = snap.options
    # Later samples (--samples, watch mode) are taken without pausing the ranks whatever the user asked for, so
    # a non-blocking last snapshot says nothing of --nonblocking: only a non-blocking first sample was asked so.
    given = first is not None and first.nonblocking
    switches = (("--locals", opts.locals), ("--native", opts.native), ("--nonblocking", given),
                ("--gdb", opts.gdb), ("--sudo", opts.sudo))
    flags = [name for name, on in switches if on]
    if opts.strace_seconds:
        flags.append(f"--strace {opts.strace_seconds:g}")
    parts = [f"Snapshot taken {iso(snap.taken_at) or 'at an unknown time'}",
             f"{count_phrase(len(snap.ranks))} on {count_phrase(len(snap.nodes), 'node')} ({md(nodes)})"]
    if failed:
        parts.append(f"{failed} node{'s' if failed != 1 else ''} failed")
    if snap.interrupted:
        parts.append("collection was interrupted: data is partial")
    text = ", ".join(parts) + "."
    if flags:
        text += " Collected with " + ", ".join(md_code(f) for f in flags) + "."
    if opts.nonblocking and not given:
        text += " This sample was taken without pausing the ranks (py-spy's non-blocking mode)."
    return text


def _waits(analysis: "Analysis", red: Sharer) -> List[str]:
    """Who waits for whom (app/analysis/graph.py), under the verdict: one line per edge, the culprit, next."""
    graphs = shown_graphs(analysis.waits)
    if not graphs:
        return []
    out = ["## Who waits for whom", ""]
    for g in graphs:
        if len(graphs) > 1:
            out.append(f"- job {md(red.text(g.job), 200)}:")
        out += [f"{'  ' if len(graphs) > 1 else ''}- {md_sentence(red.text(line))}" for line in graph_lines(g)]
    return out + [""]


def _findings(facts: Facts) -> List[str]:
    if not facts.findings:
        return []
    out = ["## Findings (most likely culprit first)", ""]
    for i, f in enumerate(facts.findings[:MAX_FINDINGS], 1):
        out.append(f"{i}. **{md_sentence(f.title)}** ({f.confidence} confidence: {md_sentence(f.reason)})")
        if f.detail:
            out.append(f"   {md_sentence(f.detail)}")
        if f.ranks_label and f.ranks_label not in f.title:
            out.append(f"   Ranks: {md(f.ranks_label, 400)}")
    if len(facts.findings) > MAX_FINDINGS:
        out.append(f"\n{len(facts.findings) - MAX_FINDINGS} more findings are in report.html and snapshot.json.")
    return out + [""]


def _culprit(facts: Facts) -> List[str]:
    assert facts.culprit is not None
    out = [f"## Culprit: {md(facts.culprit.ranks_label or facts.culprit.title, 400)}", ""]
    r = facts.culprit_rank
    if r is None:
        return out + ["No stack was collected from it.", ""]
    out.append(f"Stack of {md(r.label)} on {md(r.node)} (pid {r.pid}, state {md(r.state or '?')}), "
               "innermost frame first:")
    out += ["", md_block("\n".join(one_line(frame_line(f)) for f in main_frames(r)) or "(no frames)"), ""]
    if facts.diff is not None:
        out += _diff(facts.diff)
    return out


def _diff(d: StackDiff) -> List[str]:
    body = [f"Diff against the majority: {md(d.left)} vs {md(d.right)}, outermost frame first"
            + (f"; {md_sentence(d.iteration_note)}" if d.iteration_note else "") + ".", "",
            "| | " + md_cell(d.left) + " | " + md_cell(d.right) + " |", "|---|---|---|"]
    for row in d.rows:
        mark = "**first divergence**" if row.first_divergence else ("same" if row.same else "differs")
        left = md_code_cell(f"{row.left.function} ({row.left.location})") if row.left else " "
        right = md_code_cell(f"{row.right.function} ({row.right.location})") if row.right else " "
        body.append(f"| {mark} | {left} | {right} |")
        for v in row.iteration + row.locals:
            body.append(f"| {md_code_cell(v.name)} | "
                        f"{md_code_cell(v.left if v.left is not None else '(none)', VALUE)} | "
                        f"{md_code_cell(v.right if v.right is not None else '(none)', VALUE)} |")
    return _details("Culprit vs majority, frame by frame", "\n".join(body)) + [""]


def _classes(analysis: "Analysis", red: Sharer, facts: Facts) -> List[str]:
    out = ["## Equivalence classes (ranks with the same stack, largest first)", "",
           "| class | ranks | count | waits in | innermost frames |", "|---|---|---|---|---|"]
    for c in analysis.classes[:MAX_CLASSES]:
        inner = " ← ".join(md_code_cell(red.text(f"{f.function} ({f.location})"))
                           for f in list(reversed(c.frames))[:3])
        out.append(f"| {c.index + 1} | {md_cell(red.text(c.label), 400)} | {c.size} | "
                   f"{md_code_cell(c.collective) if c.collective else '—'} | {inner or '—'} |")
    if len(analysis.classes) > MAX_CLASSES:
        out.append(f"\n{len(analysis.classes) - MAX_CLASSES} more classes are in report.html.")
    out.append("")
    stacks = []
    for c in analysis.classes[:MAX_CLASSES]:
        stacks.append(f"Class {c.index + 1}: {md(red.text(c.label), 400)}\n\n"
                      + md_block(red.text("\n".join(one_line(f"{f.function} ({f.location})")
                                                    for f in reversed(c.frames)))))
    return out + _details("Stacks of every class (innermost frame first)", "\n\n".join(stacks)) + [""]


def _tree_text(tree: "StackTree", red: Sharer) -> str:
    """The tree's first TREE_LINES frames in pre-order, indented by depth; without recursion (a recursive
    function's stack is thousands of frames deep)."""
    lines: List[str] = []
    todo: List[Tuple["TreeNode", int]] = [(tree.root, 0)]
    while todo and len(lines) < TREE_LINES:
        node, depth = todo.pop()
        if node.frame is not None:
            f = node.frame
            end = f"   <- {tree.label(node)}" if node.ends else ""
            lines.append(one_line(f"{node.count:>6}  {'  ' * depth}{f.function} ({f.location}){end}"))
        todo.extend((child, depth + (node.frame is not None)) for child in reversed(node.children))
    if len(lines) >= TREE_LINES:
        lines.append(f"... cut at {TREE_LINES} lines; report.html has the whole tree")
    return red.text("\n".join(lines))


def one_line(text: str) -> str:
    """A line of a code block made of remote names: a newline or other control character in a function's or a
    file's name is shown (␊), never a line of its own (a line that would read as hangscope's or as Markdown)."""
    return clean(text, None)


def _details(summary: str, body: str) -> List[str]:
    return [f"<details><summary>{html.escape(strip(summary, 300))}</summary>", "", body, "", "</details>"]


def _footer(files: Sequence[str]) -> str:
    listed = ", ".join(md_code(f) for f in files)
    rule = ("Values are shown only where they are safe to share (numbers, names, paths of names): secrets the "
            "pattern rules recognise read `***`, anything else `<str len=N #hash>` (its type, length and a hash keyed "
            "for this bundle: equal values hash alike here, nowhere else).")
    return f"{rule} Counts per rule in `manifest.json`. Bundle files: {listed}." if files else rule
