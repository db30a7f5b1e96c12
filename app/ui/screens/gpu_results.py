"""The results of a GPU test in their own screen: verdict first, then per-rank status, busbw, matrix or network.

Every string from a node (errors, NCCL lines, interface names, log lines) goes through app.ui.safe, and
tables get Text cells only: a rich Table parses plain strings as markup, Text it shows as written.
"""

from __future__ import annotations

from typing import List, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.gpu import inventory as inv
from app.gpu.bench import human_size, peak
from app.gpu.model import GpuTestResults, NetReport, PairReport, TestRun
from app.ui.safe import clean, counted

OK, BAD, WARN, DIM = "bold #5fd75f", "bold #ff5f87", "bold #ffaf00", "dim"
RANK_WORDS = {"ok": ("OK", OK), "broken": ("broken", BAD), "hung": ("hung", BAD), "not_started": ("not started", BAD)}
CELL_STYLE = {"ok": OK, "slow": WARN, "failed": BAD, "hung": BAD, "untested": DIM}
PORT_STYLE = {"open": OK}
LOG_LINES = 12


def _table(*headers: str) -> Table:
    table = Table(box=None, padding=(0, 2, 0, 0), show_edge=False, header_style="bold")
    for h in headers:
        table.add_column(h, overflow="fold")
    return table


def _t(text: object, limit: int = 160, style: str = "") -> Text:
    """Remote text for a table cell or a line: cleaned, capped, wrapped (never parsed as markup)."""
    return Text(clean(text, limit), style=style, end="")


def headline(results: GpuTestResults) -> Text:
    out = Text(end="")
    if results.interrupted:
        word, style = "INTERRUPTED", WARN
    else:
        word, style = ("OK", OK) if results.ok else ("PROBLEM FOUND", BAD)
    out.append(f"GPU test {results.kind} on {counted(len(results.nodes), 'node')}, {results.duration:.1f} s: ")
    out.append(word, style=style)
    out.append("\n")
    out.append_text(Text(clean(results.verdict or "no verdict", 2000), style="bold"))
    for node, error in results.node_errors:
        out.append("\n")
        out.append_text(_t(node, 60, BAD))
        out.append(": not tested: ")
        out.append_text(_t(error, 400))
    for note in results.notes:
        out.append("\nnote: ", style=DIM)
        out.append_text(_t(note, 400))
    return out


def rank_table(run: TestRun) -> Table:
    table = _table("node", "rank", "local", "status", "phase", "device", "error / result")
    for r in run.ranks:
        word, style = RANK_WORDS.get(r.status, (r.status, BAD))
        detail = r.error or (f"sum {r.value:g}" if r.value is not None else "")
        if r.stack:
            detail += f" at {r.stack[0]}"
        if r.waiting_for:
            detail += f" (waiting for rank {', '.join(map(str, r.waiting_for))})"
        table.add_row(_t(r.node, 40), Text(str(r.rank)), Text(str(r.local_rank)),
                      Text(word + (" *" if r.culprit else ""), style=style), _t(r.phase, 20),
                      _t(f"{r.device} {r.gpu_name}".strip(), 40), _t(detail, 300))
    return table


def bench_table(run: TestRun) -> Table:
    table = _table("size", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)")
    for b in run.bench:
        table.add_row(Text(f"{human_size(b.size)}B"), Text(str(b.count)), _t(b.dtype, 16), Text(f"{b.time_us:.1f}"),
                      Text(f"{b.algbw:.3f}"), Text(f"{b.busbw:.3f}", style="bold"))
    return table


def run_parts(run: TestRun, *, log: bool = True, message: bool = True) -> List[RenderableType]:
    out: List[RenderableType] = []
    head = Text(end="")
    head.append(run.id, style="bold")
    head.append(f"  {run.status.upper()}", style=OK if run.status == "ok" else BAD)
    head.append(f"  on {', '.join(clean(n, 40) for n in run.nodes)}  master {clean(run.master, 60)}:{run.port}  "
                f"world size {run.world_size}  {clean(run.backend, 20) or 'no backend chosen'}  {run.elapsed:.1f} s")
    if run.cuda_visible_devices:
        head.append(f"  CUDA_VISIBLE_DEVICES={clean(run.cuda_visible_devices, 40)}")
    if message:  # not when the verdict above already says it
        head.append("\n")
        head.append_text(_t(run.message, 600))
    out += [head, rank_table(run)]
    if any(r.culprit for r in run.ranks):
        out.append(Text("* the rank(s) the others waited for, or that failed first", style=DIM))
    if run.bench:
        out.append(Text("all_reduce bandwidth (busbw = algbw x 2(n-1)/n, as nccl-tests reports it):", style="bold"))
        out.append(bench_table(run))
        best = peak(list(run.bench))
        if best is not None:
            out.append(Text(f"peak busbw {best.busbw:.3f} GB/s at {human_size(best.size)}B", style="bold"))
    for n in run.nccl:
        line = Text("NCCL on ", end="")
        line.append_text(_t(n.host, 60))
        line.append(": ")
        line.append_text(_t(n.summary or "no network lines", 300))
        for w in n.warnings[:10]:
            line.append("\n  WARN ", style=WARN)
            line.append_text(_t(f"{w.source} {w.message}", 300))
        out.append(line)
    for node, error in run.node_errors:
        out.append(Text.assemble(_t(node, 60, BAD), ": ", _t(error, 400)))
    for node, count in run.leftovers:
        out.append(Text(f"{clean(node, 60)}: {count} process(es) of the test outlived it and were killed", style=WARN))
    if log and run.status != "ok" and run.log:
        out.append(Text("last output lines:", style="bold"))
        out.append(Text("\n".join(clean(line, 300) for line in run.log[-LOG_LINES:]), style=DIM))
    return out


def matrix(report: PairReport) -> List[RenderableType]:
    units = list(report.units)
    table = _table("" if report.scope == "nodes" else clean(report.scope, 30), *(clean(u, 20) for u in units))
    for a in units:
        row = [_t(a, 30, "bold")]
        for b in units:
            c = report.cell(a, b)
            if c is None:
                row.append(Text("-", style=DIM))
                continue
            label = c.status + (f" {c.busbw:.3g}" if c.busbw is not None and c.status in ("ok", "slow") and a != b
                                else "")
            row.append(Text(label, style=CELL_STYLE.get(c.status, "")))
        table.add_row(*row)
    title = Text(f"pair matrix ({clean(report.scope, 40)}; busbw GB/s; '-' not tested)", style="bold")
    out: List[RenderableType] = [title, table]
    if report.reference_busbw:
        out.append(Text(f"median busbw {report.reference_busbw:.3g} GB/s; slow below {report.slow_ratio:.0%} of it",
                        style=DIM))
    out.append(Text.assemble(("verdict: ", "bold"), Text(clean(report.verdict, 1000), style=BAD if report.faults
                                                           else OK)))
    return out


def net_parts(net: NetReport) -> List[RenderableType]:
    out: List[RenderableType] = []
    if net.checks:
        table = _table("from", "target", "address", "state", "ms")
        for c in net.checks:
            table.add_row(_t(c.node, 40), _t(f"{c.host}:{c.port}", 80), _t(c.address, 60),
                          Text(c.state, style=PORT_STYLE.get(c.state, BAD)),
                          Text(f"{c.ms:g}" if c.ms is not None else ""))
        out += [Text("reachability", style="bold"), table]
    nodes = _table("node", "hostname", "interfaces (ipv4)", "NCCL default", "InfiniBand")
    for n in net.nodes:
        if n.error:
            nodes.add_row(_t(n.node, 40), Text(""), _t(n.error, 300, BAD), Text(""), Text(""))
            continue
        ifaces = ", ".join(f"{i.name}{'' if i.up else '(down)'} " + "/".join(
            f"{a.address}/{a.prefix}" for a in i.addresses if a.family == "ipv4") for i in n.interfaces
            if i.kind != "loopback")
        ib = ", ".join(f"{p.device}:{p.port} {p.state} {p.rate}" for p in n.infiniband) or "none"
        nodes.add_row(_t(n.node, 40), _t(f"{n.hostname} -> {', '.join(n.hostname_addresses) or '?'}", 120),
                      _t(ifaces, 400), _t(n.nccl_pick or "none", 40), _t(ib, 200))
    out += [Text("interfaces", style="bold"), nodes]
    for f in net.findings:
        out.append(Text.assemble(("finding: ", BAD), Text(clean(f, 500))))
    if net.suggestion:
        out.append(Text.assemble(("suggestion: ", "bold"), Text(clean(net.suggestion, 200))))
    return out


def result_parts(results: GpuTestResults) -> List[RenderableType]:
    """Everything the results screen shows, top to bottom."""
    parts: List[RenderableType] = [headline(results)]
    if results.pairs is not None:
        parts += matrix(results.pairs)
        for report in results.gpu_pairs:
            parts += matrix(report)
        bad = [r for r in results.runs if r.status != "ok"]
        if bad:
            parts.append(Text(f"runs that did not pass ({len(bad)} of {len(results.runs)}):", style="bold"))
            for run in bad:
                parts += run_parts(run, log=False)
    elif results.net is not None:
        parts += net_parts(results.net)
    else:
        for run in results.runs:
            parts += run_parts(run, message=not results.verdict.startswith(run.message))
    if results.inventory:
        parts.append(Text("GPUs", style="bold"))
        parts += [Text.assemble(_t(i.node, 40, "bold"), ": ", _t(inv.summary(i), 600)) for i in results.inventory]
    return parts


def _spaced(parts: Sequence[RenderableType]) -> Group:
    out: List[RenderableType] = []
    for p in parts:
        if out and not isinstance(p, Table):  # a blank line between parts; a table stays under its title
            out.append(Text(""))
        if isinstance(p, Text) and p.end != "\n":
            p.end = "\n"  # in a Group, a Text without its newline runs into the table below it
        out.append(p)
    return Group(*out)


class GpuResultsScreen(Screen[None]):
    """One test's results; Esc goes back (the palette's "GPU test results" opens them again)."""

    BINDINGS = [Binding("escape,q", "app.pop_screen", "back"), Binding("G", "app.gpu_tests", "new test")]
    DEFAULT_CSS = """
    GpuResultsScreen #gpu-results-title { height: 1; background: $boost; padding: 0 1; text-style: bold; }
    GpuResultsScreen #gpu-results-body { height: 1fr; padding: 0 1; }
    """

    def __init__(self, results: GpuTestResults) -> None:
        super().__init__()
        self.results = results

    def compose(self) -> ComposeResult:
        yield Static(Text(f"GPU test results: {self.results.kind}", end=""), id="gpu-results-title")
        with VerticalScroll(id="gpu-results-body"):
            yield Static(_spaced(result_parts(self.results)), id="gpu-results")
        yield Footer()
