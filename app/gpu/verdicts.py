"""The overall verdict of a `--test` in words, and whether it passed (what the exit code reports). Pure."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from app.gpu.model import GpuTestResults, NetReport, PairReport, TestRun

if TYPE_CHECKING:
    from app.gpu.runner import Preflight


def _base(base: GpuTestResults, pre: "Preflight") -> GpuTestResults:
    return replace(base, inventory=tuple(pre.inventories), node_errors=tuple(sorted(pre.errors.items())))


def single_run(base: GpuTestResults, pre: "Preflight", run: TestRun) -> GpuTestResults:
    verdict = run.message
    if pre.errors:
        verdict += "; not tested: " + ", ".join(sorted(pre.errors))
    if run.leftovers:
        verdict += "; processes outlived the test and were killed on " + ", ".join(n for n, _ in run.leftovers)
    return replace(_base(base, pre), runs=(run,), ok=run.status == "ok" and not pre.errors, verdict=verdict)


def pair_results(base: GpuTestResults, pre: "Preflight", report: PairReport, gpu_reports: list[PairReport],
                 runs: list[TestRun]) -> GpuTestResults:
    parts = [report.verdict] + [r.verdict for r in gpu_reports]
    if pre.errors:
        parts.append("not tested: " + ", ".join(sorted(pre.errors)))
    bad = any(r.faults or r.inconclusive for r in [report, *gpu_reports])
    return replace(_base(base, pre), runs=tuple(runs), pairs=report, gpu_pairs=tuple(gpu_reports),
                   ok=not bad and not pre.errors, verdict="; ".join(parts))


def net_results(base: GpuTestResults, pre: "Preflight", net: NetReport) -> GpuTestResults:
    parts = list(net.findings)
    if net.suggestion:
        parts.append(f"suggestion: {net.suggestion} (the same interface and subnet on every node)")
    if not parts:
        opened = sorted({f"{c.host}:{c.port}" for c in net.checks})
        reach = f"every node reaches {', '.join(opened)}; " if opened else ""
        picks = sorted({n.nccl_pick for n in net.nodes if n.nccl_pick})
        parts.append(f"{reach}NCCL would use {', '.join(picks) or 'no interface'} on every node")
    return replace(_base(base, pre), net=net, ok=not net.findings and not net.suggestion, verdict="; ".join(parts),
                   node_errors=tuple(sorted({n.node: n.error for n in net.nodes if n.error}.items())))
