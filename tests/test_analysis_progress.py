"""Progress over samples (stuck / progressing / gone, CPU between samples) and the rank-vs-rank diff."""

from __future__ import annotations

from dataclasses import replace

from analysis_snapshots import ALL_REDUCE, LOADING, in_step, job, rank, snapshot, stack
from app.analysis import analyze
from app.analysis.diff import diff_ranks, diff_vs_majority
from app.analysis.progress import track
from app.model import Frame, Local


def sample(at: float, steps: dict, cpu: dict = {}, n: int = 8):  # type: ignore[no-untyped-def]
    ranks = [rank(r, f"node{r // 4 + 1:02d}", in_step(ALL_REDUCE, steps.get(r, 10)), world=n,
                  cpu_time=cpu.get(r, 5.0)) for r in range(n)]
    return snapshot(ranks, taken_at=at, locals=True)


def test_stuck_ranks_since_the_first_unchanged_sample_and_how_they_spend_cpu() -> None:
    history = [sample(100.0, {}), sample(110.0, {}, {3: 7.0})]
    now = sample(130.0, {}, {3: 27.0})  # rank 3 burnt 20 s of CPU in 20 s: it spins
    a = analyze(now, history=history)
    p = {x.rank: x for x in a.progress}
    assert all(x.status == "stuck" for x in p.values())
    assert (p[0].since, p[0].duration, p[0].samples) == (100.0, 30.0, 3)
    assert p[0].activity == "sleeping" and p[0].cpu == 0.0
    assert p[3].activity == "spinning" and p[3].cpu == 1.0
    assert not any(f.kind == "progressing" for f in a.findings)


def test_a_job_whose_ranks_move_is_progressing_not_hung() -> None:
    a = analyze(sample(20.0, {r: 12 for r in range(8)}), history=[sample(10.0, {r: 11 for r in range(8)})])
    assert {x.status for x in a.progress} == {"progressing"}
    assert a.findings[0].kind == "progressing"
    assert a.verdict == "The job is progressing: 8 of 8 ranks changed stack or iteration between samples; it is not hung."


def test_one_rank_still_running_among_stuck_ones() -> None:
    before = sample(10.0, {5: 3})
    now = sample(20.0, {5: 4})
    a = analyze(now, history=[sample(0.0, {5: 2}), before])
    f = next(f for f in a.findings if f.kind == "still_running")
    assert f.title == "rank 5 still changes between samples while 7 others are stuck" and f.confidence == "high"


def test_a_rank_gone_between_samples_and_pid_reuse() -> None:
    first = sample(10.0, {})
    ranks = list(sample(20.0, {}).ranks)
    ranks[2] = replace(ranks[2], start_time=999)  # the pid now belongs to a new process
    del ranks[6]
    a = analyze(snapshot(ranks, taken_at=20.0), history=[first])
    gone = {(x.rank, x.start_time) for x in a.progress if x.status == "gone"}
    assert gone == {(2, 1), (6, 1)}
    assert {(x.rank, x.status) for x in a.progress if x.start_time == 999} == {(2, "unknown")}
    f = next(f for f in a.findings if f.kind == "exited")
    assert f.title == "ranks 2,6 are gone since an earlier sample"


def test_a_single_sample_tells_nothing_about_progress() -> None:
    assert {x.status for x in track([sample(1.0, {})])} == {"unknown"}
    assert track([]) == ()


def test_diff_rank_against_rank_marks_the_first_divergence() -> None:
    ranks = list(job(8, 4, rank5=LOADING))
    d = diff_ranks(snapshot(ranks), ("node02", 1005), ("node01", 1000))
    assert d.left == "rank 5 (node02 pid 1005)" and d.divergence == 1
    assert [(r.left.function if r.left else None, r.right.function if r.right else None, r.same)
            for r in d.rows] == [("<module>", "<module>", True), ("train", "train", False),
                                 ("next_batch", "wrapper", False), (None, "all_reduce", False)]
    assert d.rows[1].first_divergence and d.rows[1].line_differs
    assert not any(r.first_divergence for r in d.rows[2:])


def test_diff_against_the_majority_calls_out_the_iteration_and_locals() -> None:
    snap = sample(1.0, {7: 11}, n=8)
    ranks = list(snap.ranks)
    train = [f for f in ranks[7].threads[0].frames]
    train[2] = replace(train[2], locals=(Local("loss", "0.25"), Local("step", "11")))
    ranks[7] = replace(ranks[7], threads=(replace(ranks[7].threads[0], frames=tuple(train)),))
    snap = replace(snap, ranks=tuple(ranks))
    a = analyze(snap)
    d = diff_vs_majority(snap, a, ("node02", 1007))
    assert d.right == "rank 0 (node01 pid 1000)"
    assert d.divergence is None and not d.identical
    assert d.iteration_note == "rank 7 is 1 iteration ahead of rank 0 (step=11 vs 10)"
    row = next(r for r in d.rows if r.iteration)
    assert row.left.function == "train" and [(v.name, v.left, v.right) for v in row.iteration][0] == \
        ("step", "11", "10")
    assert {(v.name, v.left, v.right) for v in row.locals} == {("loss", "0.25", None), ("step", "11", None)}
    same = diff_vs_majority(snap, a, ("node01", 1000))  # the reference itself is compared with the next one
    assert same.right == "rank 1 (node01 pid 1001)" and same.identical


def test_diff_of_a_rank_in_another_class() -> None:
    other = stack("barrier (distributed_c10d.py:4100)", "train (job.py:64)", "<module> (job.py:120)")
    snap = snapshot(job(4, 4, rank2=other))
    d = diff_vs_majority(snap, analyze(snap), ("node01", 1002))
    assert d.divergence == 1 and d.rows[1].left == Frame("train", d.rows[1].left.filename, 64)


def test_object_addresses_are_not_a_difference() -> None:
    """`<Namespace at 0x7f09...>` on one rank and `<Namespace at 0x7fb9...>` on another are the same value: every
    process has its own addresses. A real difference inside such a value still counts."""
    snap = sample(1.0, {7: 11}, n=8)
    ranks = list(snap.ranks)

    def with_locals(i: int, args: str, batch: str, group: str) -> None:
        frames = list(ranks[i].threads[0].frames)
        frames[2] = replace(frames[2], locals=(Local("args", args), Local("batch", batch), Local("group", group),
                                               Local("step", str(frames[2].iteration[0][1]))))
        ranks[i] = replace(ranks[i], threads=(replace(ranks[i].threads[0], frames=tuple(frames)),))

    with_locals(7, "<Namespace at 0x7f0247b01650>", "(<Tensor at 0x7f0233c0b840>, <Tensor at 0x7f0233c0b7f0>)",
                "<ProcessGroup at 0x7f0249683030> (gloo)")
    for i in range(7):
        with_locals(i, f"<Namespace at 0x7fb9{i:08x}>", "(<Tensor at 0x7f7ac0daae90>, <Tensor at 0x7f7ac0daa440>)",
                    "<ProcessGroup at 0x7f7af2c8b3b0> (nccl)")
    snap = replace(snap, ranks=tuple(ranks))
    d = diff_vs_majority(snap, analyze(snap), ("node02", 1007))
    listed = {v.name for r in d.rows for v in r.locals}
    assert listed == {"step", "group"}  # step 11 vs 10; gloo vs nccl; never args or batch


def test_recorded_job_diff_lists_only_real_differences() -> None:
    """The recorded skip job (real py-spy --locals output): rank 2 against the majority differs in its step and
    its own rank-dependent values, not in the dozen objects whose addresses differ."""
    from pathlib import Path

    from app.model import snapshot_from_json

    snap, _ = snapshot_from_json((Path(__file__).parent / "data/scenarios/skip.json").read_text())
    culprit = next(r for r in snap.ranks if r.rank == 2)
    d = diff_vs_majority(snap, analyze(snap), (culprit.node, culprit.pid))
    shown = [(v.name, v.left, v.right) for r in d.rows for v in r.iteration + r.locals]
    assert all(" at 0x" not in (left or "") for _, left, _ in shown), shown
    assert ("step", "4", "3") in shown
