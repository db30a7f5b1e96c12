"""A rank at a later line than the others, past the end of the loop they are in: it left that loop (uneven inputs),
or it is an iteration behind in a loop around both (a straggler), and stacks alone cannot tell which
(app/analysis/divergence.py's table). And a straggler node whose ranks move while the rest waits for them in the
collective is a progressing job, not a hang (app/analysis/progress.py, held_back).

The Lightning cases are SYNTHETIC: built from the recorded `lightning-healthy` sample (tests/data/scenarios; the
real tests/oss/lightning_lm/train.py on the test cluster), its ranks 6-7 on node04 moved into `validate`
(train.py:32 in `train`, after `train_epoch`'s `for batch_idx` loop) and the samples' counters set by hand: what
tests/live/test_oss_cluster.py::test_a_cpu_throttled_node_is_named_slow[lightning] catches now and then when node04
is capped to 10% of a CPU.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

from analysis_snapshots import BARRIER, LOADING, rank, snapshot
from analysis_snapshots import ALL_REDUCE as ALL_REDUCE_FRAMES
from app.analysis import Analysis, analyze
from app.analysis.divergence import StackEvidence
from app.model import CgroupCpu, Frame, LoopInfo, Snapshot, ThreadStack
from app.model.codec import snapshot_from_json

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "scenarios"
SLOW = "node04"
SITE = "/tmp/venv-oss/lib/python3.11/site-packages"
VAL_LOOP = LoopInfo("for", 55, 59, "for k, batch in enumerate(val_dataloader):", ("k", "batch"))


def _validate(train: Frame, epoch: Optional[str], k: int, collective: bool) -> Tuple[Frame, ...]:
    """Frames innermost first: `validate` called from train.py:32, computing a batch (or, `collective`, waiting in
    an all_reduce at the end of it)."""
    at32 = dataclasses.replace(train, line=32, iteration=(("epoch", epoch),) if epoch is not None else ())
    if collective:
        inner: Tuple[Frame, ...] = (
            Frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 3252),
            Frame("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
            Frame("validate", train.filename, 60))
    else:
        inner = (Frame("forward", f"{SITE}/lightning/pytorch/demos/transformer.py", 60 + k % 3),
                 Frame("_FabricModule.forward", f"{SITE}/lightning/fabric/wrappers.py", 142),
                 Frame("validate", train.filename, 57, loops=(VAL_LOOP,),
                       iteration=(("k", str(k)),) if epoch is not None else ()))
    return inner + (at32,)


def lightning_straggler(*, iterations: bool = True, moving: bool = True, same_epoch: bool = False,
                        samples: int = 3) -> Tuple[Snapshot, List[Snapshot]]:
    """(latest sample, the earlier ones). Ranks 0-5 in epoch 1's backward (train.py:31, train_epoch:41), asleep,
    sockets quiet; ranks 6-7 on node04 in `validate` of epoch 0. moving: node04's cgroup caps it to 10% of a CPU,
    its ranks compute (stack and CPU move between samples); else nothing moves. iterations: the worker read the
    loop variables (`epoch`), else none. same_epoch: ranks 6-7 in epoch 1 too, waiting in an all_reduce under
    `validate`: they left the batch loop."""
    base = snapshot_from_json((GOLDEN / "lightning-healthy.json").read_text())[0]
    snaps = []
    for i in range(samples):
        at = base.taken_at + 2.0 * i
        ranks = []
        for r in base.ranks:
            main, c = r.main_thread, r.counters
            assert main is not None and c is not None and c.utime is not None
            frames = main.frames
            cpu, state, cgroup = 0.0, "S", c.cgroup
            if r.node == SLOW:
                train = next(f for f in frames if f.function == "train")
                epoch = ("1" if same_epoch else "0") if iterations else None
                frames = _validate(train, epoch, 10 + 7 * i if moving else 10, same_epoch) + tuple(
                    f for f in frames if f.function in ("main", "<module>"))
                if moving:
                    cpu, state = 0.2 * i, "R"
                    cgroup = CgroupCpu("v2", "/slow", 10000, 100000, 100 + 20 * i, 100 + 20 * i, 1_800_000 * i)
            else:
                frames = tuple(dataclasses.replace(f, iteration={
                    "train": (("epoch", "1"),), "train_epoch": (("batch_idx", "0"),)}[f.function] if iterations
                    else ()) if f.function in ("train", "train_epoch") else f for f in frames)
            quiet = 3000 + 2000 * i  # ms since each socket last sent or received: the collective waits
            socks = tuple(dataclasses.replace(s, last_send_ms=quiet if s.last_send_ms is not None else None,
                                              last_recv_ms=quiet if s.last_recv_ms is not None else None)
                          for s in r.sockets)
            thread = ThreadStack(main.tid, main.name, main.active, main.owns_gil, frames, state, is_main=True)
            ranks.append(dataclasses.replace(
                r, threads=(thread,) + tuple(t for t in r.threads if not t.is_main), sockets=socks, state=state,
                counters=dataclasses.replace(c, at=at, state=state, utime=c.utime + cpu, cgroup=cgroup),
                cpu_time=r.cpu_time + cpu))
        snaps.append(dataclasses.replace(base, taken_at=at, ranks=tuple(ranks)))
    return snaps[-1], snaps[:-1]


def run(**kw: object) -> Analysis:
    latest, history = lightning_straggler(**kw)  # type: ignore[arg-type]
    return analyze(latest, history=history)


def stack_finding(a: Analysis):  # type: ignore[no-untyped-def]
    (i,) = [i for i, f in enumerate(a.facts) if f.kind in ("minority_stack", "different_collective")]
    return a.findings[i], a.facts[i].data


def test_a_straggler_node_an_epoch_behind_at_a_later_line_is_a_progressing_job() -> None:
    """node04 capped to 10% of a CPU: its ranks are still in epoch 0's `validate` (train.py:32, after the batch loop)
    while the others wait in epoch 1's backward. They are an epoch behind, not out of the batch loop; they move,
    the rest waits for them in the collective: the job progresses at node04's pace."""
    a = run()
    assert a.verdict.startswith("The job is progressing"), a.verdict
    assert "node04 is slow: its ranks are CPU-throttled by their cgroup" in a.verdict
    assert a.findings[0].kind == "progressing" and a.culprit is None
    assert [f.kind for f in a.findings if f.culprit and f.confidence != "low"] == ["slow_node"], a.findings
    assert not any(f.kind == "still_running" for f in a.findings)
    assert {p.rank: p.status for p in a.progress} == {**{r: "waiting" for r in range(6)}, 6: "progressing",
                                                      7: "progressing"}
    # the stacks' fact says which reading holds, from the epoch values: behind by one, not out of the loop
    f, e = stack_finding(a)
    assert isinstance(e, StackEvidence) and e.case == "other_iteration" and e.past is not None
    assert (e.past.name, e.past.mine, e.past.theirs, e.past.delta) == ("epoch", "0", "1", -1)
    assert f.confidence == "low"  # a position read off one sample: the job moves
    assert f.title.startswith("ranks 6-7 are 1 iteration of `for epoch in range(max_epochs)` (train.py:30) behind 6 "
                              "others (epoch=0 vs 1), not out of the loop `for batch_idx, batch in "
                              "enumerate(train_dataloader)` (train.py:37) they are in"), f.title
    assert "left the loop" not in f.title and "uneven" not in f.detail
    assert "nobody: the job is progressing" in a.waits[0].headline


def test_an_epoch_behind_in_a_hung_job_is_the_culprit_not_out_of_the_loop() -> None:
    """The same stacks and epoch values with nothing moving: ranks 6-7 hold the others up, an epoch behind; the
    advice is not the uneven-inputs one."""
    a = run(moving=False)
    top = a.findings[0]
    assert top.kind == "minority_stack" and top.confidence == "high"
    assert a.verdict.startswith("Ranks 6-7 are 1 iteration of `for epoch in range(max_epochs)` (train.py:30) behind "
                                "6 others (epoch=0 vs 1)"), a.verdict
    assert "left the loop" not in a.verdict and "join()" not in a.verdict
    assert "earlier iteration of `for epoch in range(max_epochs)` (train.py:30)" in top.detail
    assert "(1 iteration behind)" in a.waits[0].headline


@pytest.mark.parametrize("samples", [3, 1])
def test_without_iteration_values_both_readings_are_said_and_what_tells_them_apart(samples: int) -> None:
    """No loop variable values and nothing moving (or one sample): stacks cannot tell a rank that left the batch loop
    from one an epoch behind. The finding says both, never [high], and the next step is what tells them apart."""
    a = run(iterations=False, moving=False, samples=samples)
    f, e = stack_finding(a)
    assert isinstance(e, StackEvidence) and e.case == "left_or_behind"
    assert f.confidence == "medium" and a.findings[0] is f
    assert f.title.startswith("ranks 6-7 are past the end of the loop `for batch_idx, batch in "
                              "enumerate(train_dataloader)` (train.py:37) that 6 others are in, inside `for epoch in "
                              "range(max_epochs)` (train.py:30): either ranks 6-7 left it or are an iteration behind"), \
        f.title
    assert "Stacks alone cannot tell these apart" in f.detail and "`epoch` on both sides" in f.detail
    assert "stacks alone cannot tell whether ranks 6-7 left" in f.reason
    assert a.verdict.startswith("Likely lead: ranks 6-7 are past the end of the loop")
    assert "have left the loop" not in a.verdict and "inputs are uneven" not in a.verdict
    assert "Next: tell the two readings apart: read `epoch` on both sides" in a.verdict
    assert "(left the loop or behind)" in a.waits[0].headline


def test_the_same_epoch_past_the_batch_loop_has_left_it() -> None:
    """Equal epoch values on both sides, ranks 6-7 past the end of the batch loop (in an all_reduce under
    `validate`): they left the loop in the same epoch, the uneven-inputs hang, said with the values."""
    a = run(same_epoch=True, moving=False)
    top = a.findings[0]
    assert top.kind == "minority_stack" and top.confidence == "high"
    assert top.title == ("ranks 6-7 have left the loop `for batch_idx, batch in enumerate(train_dataloader)` "
                         "(train.py:37) that 6 others are still in, in the same iteration of `for epoch in "
                         "range(max_epochs)` (train.py:30) (epoch=1 on both sides): ranks 6-7 are in `all_reduce` "
                         "(distributed_c10d.py:3252), they are in autograd's backward, in `train_epoch` "
                         "(train.py:41), where DDP all_reduces the gradients")
    assert "inputs are uneven" in top.detail and "join()" in a.verdict
    assert "in the same iteration of `for epoch in range(max_epochs)` (epoch=1 on both sides)" in top.reason


def test_a_straggler_without_slow_node_evidence_stays_a_lead() -> None:
    """Ranks 6-7 move while the rest waits, but nothing says their node is slow (no throttling, no CPU shortage):
    a rank that keeps running while the rest wait is the usual culprit (still_running), not a progressing job."""
    latest, history = lightning_straggler()
    unthrottled = [dataclasses.replace(s, ranks=tuple(
        dataclasses.replace(r, counters=dataclasses.replace(r.counters, cgroup=None, state="S"), state="S")
        if r.node == SLOW and r.counters is not None else r for r in s.ranks)) for s in history + [latest]]
    a = analyze(unthrottled[-1], history=unthrottled[:-1])
    assert not any(f.kind in ("progressing", "slow_node") for f in a.findings), a.findings
    assert any(f.kind == "still_running" for f in a.findings)


# SYNTHETIC, from the model's constructors: the loop around both sides is in a caller (`main`'s epoch loop), the
# paths part in `run_epoch`, where the others are in the step loop and rank 3 at a later line (a barrier)
EPOCH_LOOP = LoopInfo("for", 10, 14, "for epoch in range(epochs):", ("epoch",))
STEP_LOOP = LoopInfo("for", 50, 60, "for step, batch in enumerate(loader):", ("step", "batch"))


def _in_epoch(frames: Tuple[Frame, ...], epoch: Optional[int]) -> Tuple[Frame, ...]:
    out = []
    for f in frames:
        if f.function == "train":  # the step loop's function, called once per epoch from main
            f = Frame("run_epoch", f.filename, f.line, loops=(STEP_LOOP,) if f.line <= 60 else ())
            out += [f, Frame("main", f.filename, 12, loops=(EPOCH_LOOP,),
                             iteration=(("epoch", str(epoch)),) if epoch is not None else ())]
        elif f.function != "<module>":
            out.append(f)
    return tuple(out) + (Frame("<module>", f.filename, 120),)


@pytest.mark.parametrize("odd,others,case", [(2, 3, "other_iteration"), (3, 3, "left_loop"),
                                             (None, None, "left_or_behind")])
def test_the_loop_around_both_may_be_in_a_caller(odd: Optional[int], others: Optional[int], case: str) -> None:
    ranks = [rank(r, "node01", _in_epoch(BARRIER if r == 3 else ALL_REDUCE_FRAMES, odd if r == 3 else others),
                  world=4) for r in range(4)]
    a = analyze(snapshot(ranks))
    top, e = stack_finding(a)
    assert isinstance(e, StackEvidence) and e.case == case, (e.case, top.title)
    assert a.culprit is not None and a.culprit.fact.kind == "different_collective"  # rank 3, in `barrier`
    assert top.confidence == ("medium" if case == "left_or_behind" else "high")
    assert ("left the loop" in top.title) == (case == "left_loop")
    if case == "other_iteration":
        assert "1 iteration of `for epoch in range(epochs)` (job.py:10) behind 3 others (epoch=2 vs 3)" in top.title


def test_no_loop_around_both_is_left_the_loop_as_before() -> None:
    """Nothing loops around the function where the paths part: past the end of the step loop is out of it."""
    from analysis_snapshots import in_step

    ranks = [rank(r, "node01", in_step(BARRIER if r == 3 else ALL_REDUCE_FRAMES, 7), world=4) for r in range(4)]
    top = analyze(snapshot(ranks)).findings[0]
    assert top.title.startswith("rank 3 has left the loop `for step, batch in enumerate(loader)` (job.py:50) that 3 "
                                "others are still in: ")
    inside = [rank(r, "node01", in_step(LOADING if r == 3 else ALL_REDUCE_FRAMES, 7), world=4) for r in range(4)]
    assert "left the loop" not in analyze(snapshot(inside)).findings[0].title
