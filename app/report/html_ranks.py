"""report.html's rank views: the grid of ranks coloured by class, the node table, and per-rank stacks with
locals, source, process facts, sockets, strace and gdb output. All remote text goes through markup.h."""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set

from app.model import Frame, NodeStatus, RankKey, RankSnapshot, Snapshot, ThreadStack, rank_key
from app.report.html_page import symbol
from app.report.markup import LINE, NAME, VALUE, h

TOOL_OUTPUT_LIMIT = 200_000  # characters of strace/gdb output per rank in the page (snapshot.json has it all)


key = rank_key


def anchors(ranks: Sequence[RankSnapshot]) -> Dict[RankKey, str]:
    """Element ids for ranks: made from an index, never from remote text."""
    return {key(r): f"rank-{i}" for i, r in enumerate(ranks)}


def rank_order(ranks: Iterable[RankSnapshot]) -> List[RankSnapshot]:
    return sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.node, r.pid))


def grid(snapshot: Snapshot, class_of: Mapping[RankKey, int], suspects: Set[RankKey], ids: Mapping[RankKey, str],
         shown: Set[RankKey], top_frame: Mapping[int, str]) -> str:
    """One row per node, one cell per rank (by local rank), coloured and marked by class."""
    by_node: Dict[str, List[RankSnapshot]] = {}
    for n in snapshot.nodes:
        by_node.setdefault(n.name, [])
    for r in snapshot.ranks:
        by_node.setdefault(r.node, []).append(r)
    failed = {n.name: n for n in snapshot.nodes if n.state == "failed"}
    rows = []
    for node, ranks in by_node.items():
        cells = []
        for r in sorted(ranks, key=lambda r: (r.local_rank is None, r.local_rank or 0, r.rank or 0, r.pid)):
            k = key(r)
            ci = class_of.get(k, -1)
            css = f"cell k{ci}" if ci >= 0 else "cell kx"
            if k in suspects:
                css += " suspect"
            tip = f"{r.label} \u00b7 {r.node} pid {r.pid} \u00b7 "
            tip += f"class {ci + 1}: {top_frame.get(ci, '')}" if ci >= 0 else "no stack"
            if r.error is not None:
                tip += f" \u00b7 {r.error.message}"
            text = str(r.rank) if r.rank is not None else f"p{r.pid}"
            href = f" href=\"#{ids[k]}\"" if k in shown else ""
            cells.append(f"<a class=\"{css}\"{href} title=\"{h(tip, 300)}\">{h(text)}</a>")
        if not cells:
            bad = failed.get(node)
            why = f"failed: {bad.error.message}" if bad is not None and bad.error is not None else "no ranks found"
            cells.append(f"<span class=\"fail\">{h(why, 300)}</span>")
        rows.append(f"<div class=\"mono\">{h(node)}</div><div class=\"cells\">{''.join(cells)}</div>")
    return f"<div class=\"grid\">{''.join(rows)}</div>"


MAX_NODE_ROWS = 256  # rows of the node table: the nodes with a problem first; snapshot.json has every node


def nodes_table(nodes: Sequence[NodeStatus], limit: int = MAX_NODE_ROWS) -> str:
    """One row per node, those that failed or gave part of their data first, at most `limit` rows, then a row
    saying how many more (at thousands of nodes the table would be most of the page)."""
    rows = ["<tr><th>node</th><th>state</th><th>ranks</th><th>tools</th><th>problem and remedy</th></tr>"]
    shown = sorted(nodes, key=lambda n: n.state == "done" and n.error is None and not n.warnings)[:limit]
    more = len(nodes) - len(shown)
    for n in shown:
        tools = ", ".join(f"{t.name} {t.version}".strip() for t in n.info.tools) if n.info else ""
        problem = ""
        if n.error is not None:
            phase = f" ({n.error.phase})" if n.error.phase else ""
            problem = f"<span class=\"fail\">{h(n.error.code)}{h(phase)}: {h(n.error.message, 600)}</span>"
            if n.error.hint:
                problem += f"<br>{h(n.error.hint, 600)}"
        for w in n.warnings:
            problem += f"<br>{h(w, 600)}"
        css = "fail" if n.state == "failed" else ("ok" if n.state == "done" else "")
        rows.append(f"<tr><td class=\"mono\">{h(n.name)}</td><td class=\"{css}\">{h(n.state)}</td>"
                    f"<td>{n.ranks_found}</td><td>{h(tools, 300)}</td><td>{problem}</td></tr>")
    if more:
        done = sum(1 for n in nodes if n.state == "done")
        rows.append(f"<tr><td colspan=\"5\" class=\"meta\">and {more:,} more nodes"
                    f"{' (all done)' if done >= more else ''}: snapshot.json lists every node</td></tr>")
    return f"<table>{''.join(rows)}</table>"


def frames_table(frames: Sequence[Frame], *, mark: Optional[int] = None) -> str:
    """Frames innermost first (as py-spy prints them), each with its locals and loop iteration."""
    rows = ["<tr><th>function</th><th>where</th><th>locals</th></tr>"]
    for i, f in enumerate(frames):
        css = " class=\"diverge\"" if mark is not None and i == mark else ""
        where = f"{h(f.filename, NAME)}:{f.line}" if f.line else h(f.filename or f.module or "?")
        extra = ""
        if f.iteration:
            pairs = ", ".join(f"<code>{h(n)}={h(v, VALUE)}</code>" for n, v in f.iteration)
            extra += f"<div>iteration: {pairs}</div>"
        if f.locals:
            extra += "<div class=\"locals\">" + "<br>".join(
                f"<code>{h(loc.name)}{' (arg)' if loc.arg else ''}{' (global)' if f.function == '<module>' else ''} = "
                f"{h(loc.repr, VALUE)}</code>" for loc in f.locals) + "</div>"
        native = " <span class=\"meta\">[native]</span>" if f.native else ""
        rows.append(f"<tr{css}><td class=\"mono\">{h(f.function)}{native}</td>"
                    f"<td class=\"mono loc\">{where}</td><td>{extra}</td></tr>")
    return f"<table class=\"frames\">{''.join(rows)}</table>"


def _source(frames: Sequence[Frame]) -> str:
    for f in frames:  # the innermost frame that carries source: where the rank's own code is
        if f.source:
            lines = "\n".join(("\u25b6 " if n == f.line else "  ") + f"{n:5d}  {h(t, LINE)}" for n, t in f.source)
            return f"<details><summary>source around {h(f.location)}</summary><pre>{lines}</pre></details>"
    return ""


def _thread(t: ThreadStack) -> str:
    facts = [f"tid {t.tid}"]
    if t.is_main:
        facts.append("main")
    for label, value in (("state", t.state), ("wchan", t.wchan), ("syscall", t.syscall)):
        if value:
            facts.append(f"{label} {value}")
    if t.active:
        facts.append("active")
    if t.owns_gil:
        facts.append("holds the GIL")
    head = (f"<h4>thread <span class=\"mono\">{h(t.name or '?')}</span> "
            f"<span class=\"meta\">{h(', '.join(facts), 300)}</span></h4>")
    body = frames_table(t.frames) if t.frames else "<p class=\"meta\">no Python frames</p>"
    if t.kernel_stack:
        kernel = h("\n".join(t.kernel_stack), LINE * 4, multiline=True)
        body += f"<details><summary>kernel stack</summary><pre>{kernel}</pre></details>"
    return head + body + _source(t.frames)


def rank_section(r: RankSnapshot, anchor: str, class_index: Optional[int], *, open_: bool = False) -> str:
    cls = f"class {class_index + 1} {symbol(class_index)}" if class_index is not None else "no stack"
    summary = f"{r.label} \u00b7 {r.node} pid {r.pid} \u00b7 {cls} \u00b7 state {r.state or '?'}"
    main = r.main_thread
    where = next((f for f in main.frames if f.iteration), None) if main is not None else None
    if where is not None:  # the loop iteration tells ranks of one class apart
        summary += " \u00b7 " + ", ".join(f"{n}={v}" for n, v in where.iteration)
    parts = [f"<details id=\"{anchor}\"{' open' if open_ else ''}><summary class=\"mono\">{h(summary, 400)}</summary>"]
    if r.error is not None:
        parts.append(f"<p class=\"fail\">{h(r.error.code)}: {h(r.error.message, 600)}"
                     + (f"<br>{h(r.error.hint, 600)}" if r.error.hint else "") + "</p>")
    if r.partial:
        parts.append("<p class=\"fail\">partial: only part of this rank's data arrived</p>")
    facts = [("launcher", f"{r.launcher} (pid {r.launcher_pid})" if r.launcher_pid else r.launcher),
             ("exe", r.exe), ("user", r.user), ("wchan", r.wchan), ("threads", str(r.num_threads)),
             ("cpu time", f"{r.cpu_time:.1f} s"), ("rss", f"{r.rss / 2**20:.0f} MiB"),
             ("container", "yes" if r.in_container else ""), ("resumed", "hangscope resumed it" if r.resumed else ""),
             ("dump took", f"{r.elapsed:.3f} s" if r.elapsed else "")]
    parts.append("<table>" + "".join(f"<tr><th>{k}</th><td class=\"mono\">{h(v, VALUE)}</td></tr>"
                                     for k, v in facts if v) + "</table>")
    if r.cmdline:
        parts.append(f"<h4>command line</h4><pre class=\"wrap\">{h(' '.join(r.cmdline), LINE * 2)}</pre>")
    if r.env:
        env = "".join(f"<tr><td class=\"mono\">{h(k)}</td><td class=\"mono\">{h(v, VALUE)}</td></tr>" for k, v in r.env)
        parts.append(f"<h4>environment (allowlisted)</h4><table>{env}</table>")
    parts.extend(_thread(t) for t in r.threads)
    if r.sockets:
        parts.append(_sockets(r))
    if r.strace is not None:
        parts.append(_tool_output(f"strace ({r.strace.seconds:g} s{', truncated' if r.strace.truncated else ''})",
                                  r.strace.output))
    if r.gdb:
        parts.append(_tool_output("gdb backtrace", r.gdb))
    parts.append("</details>")
    return "\n".join(parts)


def _sockets(r: RankSnapshot) -> str:
    rows = ["<tr><th>local</th><th>peer</th><th>state</th><th>send-q</th><th>recv-q</th><th>retransmits</th>"
            "<th>backoff</th></tr>"]
    for s in r.sockets:
        bad = " class=\"fail\"" if s.backoff or s.retransmits else ""
        rows.append(f"<tr{bad}><td class=\"mono\">{h(s.local)}</td><td class=\"mono\">{h(s.peer)}</td>"
                    f"<td>{h(s.state)}</td><td>{s.send_q}</td><td>{s.recv_q}</td><td>{s.retransmits}</td>"
                    f"<td>{s.backoff}</td></tr>")
    return "<details><summary>TCP sockets</summary><table>" + "".join(rows) + "</table></details>"


def _tool_output(title: str, text: str) -> str:
    note = ""
    if len(text) > TOOL_OUTPUT_LIMIT:
        note = f"<p class=\"meta\">first {TOOL_OUTPUT_LIMIT:,} characters of {len(text):,}; snapshot.json has all</p>"
    lines = "\n".join(h(line, LINE) for line in text[:TOOL_OUTPUT_LIMIT].splitlines())
    return f"<details><summary>{h(title)}</summary>{note}<pre>{lines}</pre></details>"
