"""Plain-text tables of GPU test results for the terminal. Remote text is made printable (no escape codes)."""

from __future__ import annotations

from typing import Sequence

from app.gpu import bench
from app.gpu import inventory as inv
from app.gpu.model import GpuTestResults, NetReport, PairReport, TestRun


def printable(text: str) -> str:
    """Remote text reaches a terminal: control characters could move the cursor or retitle it."""
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in str(text))


def _grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    cells = [[printable(c) for c in header]] + [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def run_lines(run: TestRun, log_lines: int = 0) -> list[str]:
    out = [f"{run.id}: {run.status.upper()} on {', '.join(run.nodes)} (master {run.master}:{run.port}, "
           f"world size {run.world_size}, {run.backend or 'no backend chosen'}"
           + (f", CUDA_VISIBLE_DEVICES={run.cuda_visible_devices}" if run.cuda_visible_devices else "")
           + f", {run.elapsed:.1f} s)", "  " + printable(run.message)]
    rows = []
    for r in run.ranks:
        detail = r.error or (f"sum {r.value:g}" if r.value is not None else "")
        if r.stack:
            detail += f" at {r.stack[0]}"
        rows.append([r.node, str(r.rank), str(r.local_rank), r.status + ("*" if r.culprit else ""), r.phase,
                     (r.device + " " + r.gpu_name).strip(), detail[:160]])
    out += _grid(["node", "rank", "local", "status", "phase", "device", "detail"], rows)
    if any(r.culprit for r in run.ranks):
        out.append("  (* the rank(s) the others waited for, or that failed first)")
    if run.bench:
        out.append("  all_reduce bandwidth (busbw = algbw x 2(n-1)/n, as nccl-tests):")
        out += ["    " + line for line in bench.table(list(run.bench)).splitlines()]
    for n in run.nccl:
        out.append(f"  NCCL on {printable(n.host)}: {printable(n.summary or 'no network lines')}"
                   + (f", version {printable(n.version)}" if n.version else "")
                   + (f", transports {', '.join(map(printable, n.transports))}" if n.transports else ""))
        for w in n.warnings[:10]:
            out.append(f"    WARN {printable(w.source)} {printable(w.message)}")
    if run.not_finished and run.status == "hung":
        out.append(f"  did not finish: {', '.join(run.not_finished)} (every process of the test was killed there)")
    for node, error in run.node_errors:
        out.append(f"  {node}: {printable(error)}")
    for node, count in run.leftovers:
        out.append(f"  {node}: {count} process(es) of the test outlived it and were killed")
    if log_lines and run.status != "ok":
        out.append("  last output lines:")
        out += ["    " + printable(line)[:240] for line in run.log[-log_lines:]]
    return out


def matrix_lines(report: PairReport) -> list[str]:
    units = list(report.units)
    header = [report.scope if report.scope != "nodes" else ""] + units
    rows = []
    for a in units:
        row = [a]
        for b in units:
            c = report.cell(a, b)
            if c is None:
                row.append("-")
            elif c.busbw is not None and c.status in ("ok", "slow") and a != b:
                row.append(f"{c.status} {c.busbw:.3g}")
            else:
                row.append(c.status)
        rows.append(row)
    out = [f"pair matrix ({report.scope}; busbw GB/s; '-' not tested):"] + _grid(header, rows)
    if report.reference_busbw:
        out.append(f"  median busbw {report.reference_busbw:.3g} GB/s; slow below {report.slow_ratio:.0%} of it")
    out.append("  verdict: " + printable(report.verdict))
    return out


def net_lines(net: NetReport) -> list[str]:
    out = ["network:"]
    for n in net.nodes:
        if n.error:
            out.append(f"  {n.node}: {printable(n.error)}")
            continue
        ifaces = ", ".join(f"{i.name}{'' if i.up else '(down)'} " + "/".join(
            f"{a.address}/{a.prefix}" for a in i.addresses if a.family == "ipv4") for i in n.interfaces
            if i.kind != "loopback")
        ib = ", ".join(f"{p.device}:{p.port} {p.state} {p.rate}" for p in n.infiniband) or "none"
        out.append(f"  {n.node} ({printable(n.hostname)} -> {', '.join(n.hostname_addresses) or '?'}): "
                   f"{printable(ifaces)}; NCCL default {n.nccl_pick or 'none'}; InfiniBand {printable(ib)}")
    if net.checks:
        out += _grid(["from", "target", "address", "state", "ms"],
                     [[c.node, f"{c.host}:{c.port}", c.address, c.state, f"{c.ms:g}" if c.ms is not None else ""]
                      for c in net.checks])
    for f in net.findings:
        out.append("  finding: " + printable(f))
    if net.suggestion:
        out.append("  suggestion: " + net.suggestion)
    return out


def format_table(results: GpuTestResults, log_lines: int = 12) -> str:
    """The whole result as text: verdict first, then each part."""
    status = "INTERRUPTED" if results.interrupted else ("OK" if results.ok else "PROBLEM FOUND")
    out = [f"GPU test {results.kind} on {len(results.nodes)} node(s), {results.duration:.1f} s: {status}",
           "verdict: " + printable(results.verdict)]
    for node, error in results.node_errors:
        out.append(f"  {node}: not tested: {printable(error)}")
    for note in results.notes:
        out.append("note: " + printable(note))
    if results.pairs is not None:
        out += matrix_lines(results.pairs)
        for report in results.gpu_pairs:
            out += matrix_lines(report)
        shown = [r for r in results.runs if r.status != "ok"]
        if shown:
            out.append("runs that did not pass:")
            for run in shown:
                out += ["  " + line for line in run_lines(run)]
    else:
        for run in results.runs:
            out += run_lines(run, log_lines)
    if results.net is not None:
        out += net_lines(results.net)
    if results.inventory:
        out.append("GPUs:")
        out += [f"  {i.node}: {printable(inv.summary(i))}" for i in results.inventory]
    return "\n".join(out)
