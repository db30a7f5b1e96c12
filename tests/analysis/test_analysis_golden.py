"""The analysis on real worker output: dumps recorded from a hung torch job (tests/data), parsed by app.decode.

They carry what code-built snapshots miss: py-spy 0.4's qualified names (`Thread.run`,
`_exception_logger.<locals>.wrapper`), unsymbolised native frames named by their (per-process) address,
and loop variables from --locals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Tuple

from app.analysis import AnalysisOptions, analyze
from app.analysis.text import summary_text
from app.model import CollectOptions, NodeStatus, Snapshot
from app.decode.replies import apply_dump, rank_from_discover

DATA = Path(__file__).resolve().parents[1] / "data"


def recorded(dump: str, **options: bool) -> Snapshot:
    discovered = json.loads((DATA / "worker_discover_torch.json").read_text())["items"]
    ranks = {item["pid"]: rank_from_discover("node01", item) for item in discovered}
    items = json.loads((DATA / f"worker_dump_{dump}.json").read_text())["items"]
    dumped = tuple(apply_dump(ranks[item["pid"]], item) for item in items if item["pid"] in ranks)
    return Snapshot(taken_at=1.0, options=CollectOptions(**options), nodes=(NodeStatus("node01", state="done"),),
                    ranks=dumped)


def functions(frames: Tuple) -> list:  # type: ignore[type-arg]
    return [f.function for f in frames]


def test_plain_dump_of_the_hung_job() -> None:
    snap = recorded("torch_plain")
    a = analyze(snap)
    (c,) = a.classes
    assert c.size == len(snap.ranks) == 2 and c.collective == "all_reduce"
    assert a.findings[0].kind == "all_identical"
    assert a.verdict == "All 2 ranks wait in `all_reduce` at the same place: stacks cannot tell the culprit."
    assert "all_reduce (distributed_c10d.py:3252) <- _exception_logger.<locals>.wrapper" in summary_text(snap, a)


def test_native_dump_merges_frames_that_differ_only_by_address() -> None:
    snap = recorded("torch_native", native=True)
    main = [r.main_thread for r in snap.ranks]
    addresses = [{f.function for f in t.frames if f.function.startswith("0x")} for t in main if t is not None]
    assert addresses[0] and addresses[0] != addresses[1]  # ASLR: the same code at other addresses
    a = analyze(snap)
    (c,) = a.classes
    assert c.collective == "all_reduce" and any(f.native for f in c.frames)
    without = analyze(snap, options=AnalysisOptions(native=False))
    assert not any(f.native for f in without.classes[0].frames)
    assert [f.kind for f in without.findings] == ["all_identical"]


def test_thread_bootstrap_folds_with_qualified_names() -> None:
    snap = recorded("torch_native", native=True)
    loader = AnalysisOptions(thread=lambda r: next((t for t in r.threads if any(
        f.function.endswith("_read_shards") for f in t.frames)), None), native=False)
    a = analyze(snap, options=loader)
    assert a.classes, "the recorded job has a data-loading thread"
    names = functions(a.classes[0].frames)
    assert "Thread.run" not in names and "Thread._bootstrap" not in names
    assert names[0].endswith("_read_shards")


def test_locals_split_ranks_by_loop_iteration() -> None:
    snap = recorded("torch_locals", locals=True)
    a = analyze(snap)
    (split,) = [s for s in a.iteration_splits if s.split]
    assert split.varying == ("step",)
    top = a.findings[0]
    assert top.kind == "iteration_split" and "1 iteration" in top.title and "`for step, batch in" in top.title
    assert top.confidence == "low"  # two ranks, one each: either may be the odd one


def test_denied_dump_is_reported_with_its_remedy() -> None:
    snap = recorded("denied")
    a = analyze(snap)
    denied = next(f for f in a.findings if f.kind == "dump_failed")
    assert denied.title.endswith("ptrace denied") and "ptrace_scope" in denied.detail
    assert "ptrace denied" in summary_text(snap, a).splitlines()[-1]
