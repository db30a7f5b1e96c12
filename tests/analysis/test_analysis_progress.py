"""Progress over samples (stuck / progressing / gone, CPU between samples) and the rank-vs-rank diff."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import pytest

from analysis_snapshots import ALL_REDUCE, LOADING, in_step, job, rank, snapshot, stack
from app.analysis import analyze
from app.analysis.diff import diff_ranks, diff_vs_majority
from app.analysis.frames import place_frames
from app.analysis.progress import BULK_RATE, stuck_summary, track
from app.analysis.text import summary_text
from app.model import (CgroupCpu, FlightGroup, FlightRecord, Frame, Local, LoopInfo, ProgressCounters, RankSnapshot,
                       Snapshot, TcpSocket)


def sample(at: float, steps: dict, cpu: Optional[dict] = None, n: int = 8):  # type: ignore[no-untyped-def]
    ranks = [rank(r, f"node{r // 4 + 1:02d}", in_step(ALL_REDUCE, steps.get(r, 10)), world=n,
                  cpu_time=(cpu or {}).get(r, 5.0)) for r in range(n)]
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


# --- progress from counters: what moves, not what a stack looks like ------------------------------------

BACKWARD = stack("_engine_run_backward (/opt/venv/lib/python3.11/site-packages/torch/autograd/graph.py:829)",
                 "backward (/opt/venv/lib/python3.11/site-packages/torch/autograd/__init__.py:364)",
                 "backward (/opt/venv/lib/python3.11/site-packages/torch/_tensor.py:647)",
                 "<module> (train.py:305)")


def counted(at: float, rank_no: int, node: str, *, cpu: float, sent: int, store: int = 0, throttled_us: int = 0,
            nr_throttled: int = 0, quota: Optional[int] = None, wait_s: float = 0.0, state: str = "S",
            frames: tuple = BACKWARD, log: int = 0, main: Optional[int] = None) -> RankSnapshot:
    """A rank of a 4-node job at time `at` whose counters read `cpu` seconds and `sent` bytes so far."""
    socks = (TcpSocket(f"10.0.0.{rank_no}:40{rank_no:02d}", "10.0.0.9:41000", "ESTABLISHED",
                       bytes_acked=sent, bytes_received=sent),
             TcpSocket(f"10.0.0.{rank_no}:50{rank_no:02d}", "10.0.0.1:29500", "ESTABLISHED",
                       bytes_acked=store, bytes_received=store))
    cg = CgroupCpu("v1", "/slow" if quota else "/", quota, 100000, 100, nr_throttled, throttled_us)
    c = ProgressCounters(at=at, state=state, utime=cpu, stime=0.0, voluntary_ctxt=int(at), nonvoluntary_ctxt=0,
                         run_ns=int(cpu * 1e9), wait_ns=int(wait_s * 1e9), log_bytes=log, main_wchar=main,
                         cgroup=cg)
    return rank(rank_no, node, frames, world=8, master_port=29500, sockets=socks, counters=c)


def ddp_sample(at: float, per_rank: dict, **common: Any) -> Snapshot:
    ranks = []
    for r in range(8):
        kw = dict(common)
        kw.update(per_rank.get(r, {}))
        ranks.append(counted(at, r, f"node{r // 2 + 1:02d}", **kw))
    return snapshot(ranks, taken_at=at, locals=True)


def test_ranks_on_one_frame_whose_sockets_move_are_progressing_not_stuck() -> None:
    """nanoGPT under DDP: every rank in `Tensor.backward` at the same line in both samples, the loop counters
    unreadable module globals; the gradients moving on every rank's sockets say it trains."""
    before = ddp_sample(10.0, {}, cpu=1.0, sent=10_000)
    now = ddp_sample(11.0, {5: {"frames": ALL_REDUCE}}, cpu=1.15, sent=60_000)
    a = analyze(now, history=[before])
    assert {p.status for p in a.progress} == {"progressing"}
    assert all(p.net_bytes == 100_000 and p.store_bytes == 0 for p in a.progress)
    assert a.findings[0].kind == "progressing" and a.findings[0].confidence == "high"
    assert a.verdict.startswith("The job is progressing: 8 of 8 ranks moved between samples (sockets moved 800.0 kB "
                                "on 8, 1 changed stack); it is not hung")
    assert not any(f.kind == "still_running" for f in a.findings)
    assert not any(f.culprit and f.confidence != "low" for f in a.findings)


def test_bytes_to_the_store_alone_are_not_progress() -> None:
    """A rank polling the store for a missing peer moves bytes there and gets nowhere."""
    before = ddp_sample(10.0, {}, cpu=1.0, sent=10_000, store=100, frames=ALL_REDUCE)
    now = ddp_sample(12.0, {}, cpu=1.0, sent=10_000, store=5_000, frames=ALL_REDUCE)
    a = analyze(now, history=[before])
    assert {p.status for p in a.progress} == {"stuck"}
    assert all(p.store_bytes == 9_800 and p.net_bytes == 0 for p in a.progress)
    assert not any(f.kind == "progressing" for f in a.findings)


def test_output_written_is_progress() -> None:
    before = ddp_sample(10.0, {}, cpu=1.0, sent=0, log=100, frames=ALL_REDUCE)
    now = ddp_sample(11.0, {}, cpu=1.0, sent=0, log=400, frames=ALL_REDUCE)
    a = analyze(now, history=[before])
    assert {p.moved for p in a.progress} == {("output 300 B",)}
    assert a.findings[0].kind == "progressing"


def test_output_the_main_thread_did_not_write_is_not_progress() -> None:
    """A hung job still writes: a logger thread, a progress bar's timer, a warning a server thread prints when it is
    asked for its record, another process on the same file. Output counts when the main thread wrote."""
    before = ddp_sample(10.0, {}, cpu=1.0, sent=0, log=100, frames=ALL_REDUCE, main=5_000)
    now = ddp_sample(11.0, {}, cpu=1.0, sent=0, log=400, frames=ALL_REDUCE, main=5_000)
    a = analyze(now, history=[before])
    assert {p.status for p in a.progress} == {"stuck"}
    assert {p.quiet for p in a.progress} == {("output 300 B (not by the main thread)",)}
    assert not any(f.kind == "progressing" for f in a.findings)
    wrote = ddp_sample(11.0, {}, cpu=1.0, sent=0, log=400, frames=ALL_REDUCE, main=5_300)
    a = analyze(wrote, history=[before])
    assert {p.moved for p in a.progress} == {("output 300 B",)}
    assert a.findings[0].kind == "progressing"


def test_control_sized_traffic_to_the_peers_is_not_progress() -> None:
    """NCCL RAS keepalives and the gathers a RAS query starts, heartbeats, a monitor's polls: a few hundred bytes a
    second on connections to the peers while every rank waits. Seen on an H100 (make gpu-check): 848 B a rank."""
    before = ddp_sample(10.0, {}, cpu=1.0, sent=10_000, frames=ALL_REDUCE)
    now = ddp_sample(11.5, {}, cpu=1.0, sent=10_424, frames=ALL_REDUCE)
    a = analyze(now, history=[before])
    assert {p.status for p in a.progress} == {"stuck"}
    assert {p.quiet for p in a.progress} == {("sockets 848 B (control-sized)",)}
    assert all(p.net_bytes == 848 and not p.sockets_moved for p in a.progress)
    assert not any(f.kind == "progressing" for f in a.findings)
    # the job's data: BULK_RATE and more a second is progress
    bulk = ddp_sample(11.5, {}, cpu=1.0, sent=10_000 + int(BULK_RATE * 1.5 / 2), frames=ALL_REDUCE)
    a = analyze(bulk, history=[before])
    assert {p.status for p in a.progress} == {"progressing"}


def test_native_frames_inside_a_wait_and_bare_addresses_are_not_a_new_place() -> None:
    """A rank in torch.cuda.synchronize: the driver polls the GPU, caught at another address in libcuda each
    time (stripped: no symbols), under cudaDeviceSynchronize. Its place is the same in both samples."""
    def polling(addr: str, inner: str = "sched_yield") -> tuple:
        return (Frame(addr, "/usr/lib/libcuda.so.580", 0, "/usr/lib/libcuda.so.580", native=True),
                Frame(inner, "/usr/lib/libc.so.6", 0, "/usr/lib/libc.so.6", native=True),
                Frame("cudaDeviceSynchronize", "/x/libcudart.so.13", 0, "/x/libcudart.so.13", native=True),
                Frame("synchronize", "/x/site-packages/torch/cuda/__init__.py", 1162),
                Frame("main", "train.py", 107))
    first, second = polling("0x7f96c0bd36bd"), polling("0x7f96c0e14833", "clock_gettime")
    assert place_frames(first) == place_frames(second) == first[2:] == second[2:]
    assert [f.function for f in place_frames(first[1:])] == ["cudaDeviceSynchronize", "synchronize", "main"]
    # an address outside any wait the tables name is dropped too; a named native function is a place
    free = (Frame("0x1", "/lib/x.so", 0, native=True), Frame("compute_kernel", "/lib/x.so", 0, native=True),
            Frame("main", "train.py", 5))
    assert [f.function for f in place_frames(free)] == ["compute_kernel", "main"]
    before = ddp_sample(10.0, {}, cpu=1.0, sent=0, frames=first)
    now = ddp_sample(11.0, {}, cpu=2.9, sent=0, frames=second)
    a = analyze(now, history=[before])
    assert {p.status for p in a.progress} == {"stuck"}
    assert all("stack" not in p.moved for p in a.progress)
    # ranks caught at different addresses inside the same wait are at one place, not two groups (the H100 run
    # split two waiting ranks and called one of them the odd one out)
    mixed = ddp_sample(11.0, {r: {"frames": first if r % 2 else second} for r in range(8)}, cpu=2.9, sent=0)
    native = replace(mixed, options=replace(mixed.options, native=True))
    assert len(analyze(native, history=[before]).classes) == 1


def test_ranks_called_stuck_that_burn_cpu_weaken_the_still_running_lead() -> None:
    """One rank changes stack while the others sit on one frame without moving bytes: the classic lead, but
    when those others used CPU between samples, "stuck" is only their stack: not [high]."""
    before = ddp_sample(10.0, {5: {"frames": LOADING}}, cpu=1.0, sent=0, frames=ALL_REDUCE)
    idle = ddp_sample(11.0, {5: {"frames": ALL_REDUCE}}, cpu=1.0, sent=0, frames=ALL_REDUCE)
    busy = ddp_sample(11.0, {5: {"frames": ALL_REDUCE}}, cpu=1.3, sent=0, frames=ALL_REDUCE)
    sure = next(f for f in analyze(idle, history=[before]).findings if f.kind == "still_running")
    assert sure.confidence == "high"
    doubt = next(f for f in analyze(busy, history=[before]).findings if f.kind == "still_running")
    assert doubt.confidence == "medium" and "used CPU between samples" in doubt.reason


def test_ranks_polling_in_a_gpu_wait_are_polling_not_spinning_and_do_not_weaken_the_lead() -> None:
    """The H100 runs: ranks in torch.cuda.synchronize use 1.9 cores while the CUDA runtime polls the GPU. The
    progress summary called them "spinning" from their CPU share alone, and counted that CPU as work, although
    the wait model calls them blocked in the synchronisation. Their activity is now the wait's: polling."""
    sync = (Frame("0x7f96c0bd36bd", "/usr/lib/libcuda.so.580", 0, "/usr/lib/libcuda.so.580", native=True),
            Frame("cudaDeviceSynchronize", "/x/libcudart.so.13", 0, "/x/libcudart.so.13", native=True),
            Frame("synchronize", "/x/site-packages/torch/cuda/__init__.py", 1162),
            Frame("main", "train.py", 107))
    before = ddp_sample(10.0, {5: {"frames": LOADING}}, cpu=1.0, sent=0, frames=sync)
    now = ddp_sample(11.0, {5: {"frames": ALL_REDUCE}}, cpu=2.9, sent=0, frames=sync)
    a = analyze(now, history=[before])
    p = {x.rank: x for x in a.progress}
    assert {p[r].activity for r in range(8) if r != 5} == {"polling"}
    assert "7 polling in a wait" in stuck_summary(a.progress) and "spinning" not in stuck_summary(a.progress)
    lead = next(f for f in a.findings if f.kind == "still_running")
    assert lead.confidence == "high"
    # the same CPU on a frame that does not poll is a spin, and weakens the lead
    hot = ddp_sample(11.0, {5: {"frames": ALL_REDUCE}}, cpu=2.9, sent=0, frames=LOADING)
    a = analyze(hot, history=[replace(before, ranks=tuple(replace(r, threads=hot.ranks[i].threads)
                                                        for i, r in enumerate(before.ranks)))])
    assert {x.activity for x in a.progress if x.rank != 5} == {"spinning"}


def test_a_throttled_node_is_named_slow_in_a_progressing_job() -> None:
    slow = {6: {"quota": 10000}, 7: {"quota": 10000}}
    before = ddp_sample(10.0, {r: dict(v, throttled_us=1_000_000, nr_throttled=10) for r, v in slow.items()},
                        cpu=1.0, sent=10_000)
    now = ddp_sample(12.0, {r: dict(v, throttled_us=2_700_000, nr_throttled=30) for r, v in slow.items()},
                     cpu=1.1, sent=30_000)
    a = analyze(now, history=[before])
    assert a.findings[0].kind == "progressing"
    (f,) = [f for f in a.findings if f.kind == "slow_node"]
    assert f.nodes == "node04" and f.title == "node04 is slow: its ranks are CPU-throttled by their cgroup"
    assert "/slow (10% of a CPU) was CPU-throttled 85% of the time" in f.detail
    assert a.verdict.endswith("; node04 is slow: its ranks are CPU-throttled by their cgroup.")
    assert next(p for p in a.progress if p.rank == 6).throttled == pytest.approx(0.85)


def test_ranks_a_slow_node_holds_back_are_not_stuck() -> None:
    """Live, Lightning with node04 capped to 10 % of a CPU: between two samples node01's ranks sat in the
    all_reduce waiting for node04 (no bytes yet) and node04's ranks computed on one frame; the others moved
    gradients. Neither pair is stuck: they wait for, or are, the slow node, and the job is progressing [high]."""
    def per_rank(at: float, step: int) -> dict:
        ranks: dict = {r: {"sent": 10_000 + step * 20_000} for r in range(2, 6)}
        ranks.update({r: {"sent": 5_000, "frames": ALL_REDUCE} for r in (0, 1)})
        ranks.update({r: {"sent": 7_000, "frames": LOADING, "quota": 10000, "state": "R", "cpu": 1.0 + at / 100,
                          "throttled_us": int(at * 850_000), "nr_throttled": int(at)} for r in (6, 7)})
        return ranks

    before, now = ddp_sample(10.0, per_rank(10.0, 0), cpu=1.0), ddp_sample(12.0, per_rank(12.0, 1), cpu=1.0)
    a = analyze(now, history=[before])
    status = {p.rank: p.status for p in a.progress}
    assert status == {0: "waiting", 1: "waiting", 2: "progressing", 3: "progressing", 4: "progressing",
                      5: "progressing", 6: "slow", 7: "slow"}
    first = a.findings[0]
    assert first.kind == "progressing" and first.confidence == "high", a.findings
    assert first.title.startswith("the job is progressing: 4 of 8 ranks moved between samples")
    assert "ranks 0-1 waited in the collective for the slow node's ranks" in first.detail
    assert [f.nodes for f in a.findings if f.kind == "slow_node"] == ["node04"]
    assert "2 waiting for a slow node, 2 slow; 4 progressing" in " ".join(summary_text(now, a).split())

    # the same stacks with nothing holding node04 back (no throttling, and its ranks get a whole CPU while they
    # run): nothing explains node01's unchanged ranks, so they stay stuck
    def free(at: float, step: int) -> dict:
        ranks = {r: {k: v for k, v in kw.items() if k not in ("quota", "throttled_us", "nr_throttled")}
                 for r, kw in per_rank(at, step).items()}
        for r in (6, 7):
            ranks[r]["cpu"] = 1.0 + at  # a core's worth of CPU between samples: computing, not held back
        return ranks

    b = analyze(ddp_sample(12.0, free(12.0, 1), cpu=1.0), history=[ddp_sample(10.0, free(10.0, 0), cpu=1.0)])
    assert not any(f.kind == "slow_node" for f in b.findings)
    assert {p.rank for p in b.progress if p.status == "stuck"} >= {0, 1}
    assert not any(p.status in ("waiting", "slow") for p in b.progress)


def test_a_node_held_to_a_fraction_of_a_cpu_is_slow_without_its_cgroup_counters() -> None:
    """node04's ranks throttled to ~1 % of a CPU, on a node that cannot read its cgroup's counters (a container
    with its own cgroup namespace): runnable (state R) in every sample yet a fraction of a CPU between them, caught
    outside the collective while the others wait in it. The CPU time per second of wall time says what the cgroup
    file system cannot: node04 is slow, and the job progresses."""
    def per_rank(at: float, step: int) -> dict:
        ranks: dict = {r: {"sent": 10_000 + step * 20_000} for r in range(2, 6)}
        ranks.update({r: {"sent": 5_000, "frames": ALL_REDUCE} for r in (0, 1)})
        ranks.update({r: {"sent": 7_000, "frames": LOADING, "state": "R", "cpu": 1.0 + at / 100} for r in (6, 7)})
        return ranks

    a = analyze(ddp_sample(12.0, per_rank(12.0, 1), cpu=1.0), history=[ddp_sample(10.0, per_rank(10.0, 0), cpu=1.0)])
    slow = [f for f in a.findings if f.kind == "slow_node"]
    assert [f.nodes for f in slow] == ["node04"], a.findings
    assert slow[0].title == "node04 is slow: its ranks get a fraction of a CPU while they want one"
    assert "runnable (state R) in every sample yet ran 1% of a CPU" in slow[0].detail
    assert a.findings[0].kind == "progressing"
    assert {p.rank: p.status for p in a.progress if p.rank in (6, 7)} == {6: "slow", 7: "slow"}


def test_a_culprit_still_running_on_a_slow_node_does_not_make_the_others_waiting() -> None:
    """One rank keeps changing on a throttled node while the 7 others sit in the all_reduce: a hang with a lead
    (or a slow rank), never "progressing" because a slow node explains the wait."""
    def per_rank(at: float, step: int) -> dict:
        ranks: dict = {r: {"sent": 5_000, "frames": ALL_REDUCE} for r in range(7)}
        ranks[7] = {"sent": 7_000 + step, "frames": LOADING if step else ALL_REDUCE, "quota": 10000, "state": "R",
                    "cpu": 1.0 + at / 100, "throttled_us": int(at * 850_000), "nr_throttled": int(at), "log": step}
        ranks[6].update(quota=10000, throttled_us=int(at * 850_000), nr_throttled=int(at))
        return ranks

    a = analyze(ddp_sample(12.0, per_rank(12.0, 1), cpu=1.0), history=[ddp_sample(10.0, per_rank(10.0, 0), cpu=1.0)])
    assert not any(p.status in ("waiting", "slow") for p in a.progress), [(p.rank, p.status) for p in a.progress]
    assert not any(f.kind == "progressing" for f in a.findings)


def test_no_slow_node_when_no_node_stands_out() -> None:
    everyone = {r: {"throttled_us": 0, "nr_throttled": 0, "wait_s": 0.5} for r in range(8)}
    before = ddp_sample(10.0, everyone, cpu=1.0, sent=10_000)
    now = ddp_sample(12.0, {r: dict(v, wait_s=1.2) for r, v in everyone.items()}, cpu=1.1, sent=30_000)
    assert not any(f.kind == "slow_node" for f in analyze(now, history=[before]).findings)
    # a whole job short of CPU is not one slow node either
    half = {r: {"quota": 10000, "nr_throttled": 30, "throttled_us": 2_700_000} for r in range(8)}
    start = ddp_sample(10.0, {r: dict(v, nr_throttled=10, throttled_us=1_000_000) for r, v in half.items()},
                       cpu=1.0, sent=10_000)
    assert not any(f.kind == "slow_node" for f in analyze(ddp_sample(12.0, half, cpu=1.1, sent=30_000),
                                                          history=[start]).findings)


def test_a_node_waiting_for_cpu_far_longer_than_the_others_is_slow() -> None:
    waits = {r: {"wait_s": 0.1} for r in range(8)}
    later = {r: {"wait_s": 0.2 if r < 6 else 1.6} for r in range(8)}
    a = analyze(ddp_sample(12.0, later, cpu=1.1, sent=30_000), history=[ddp_sample(10.0, waits, cpu=1.0,
                                                                                    sent=10_000)])
    (f,) = [f for f in a.findings if f.kind == "slow_node"]
    assert f.nodes == "node04" and "waited for a CPU 75% of the time, the other nodes' 5%" in f.detail


def test_all_ranks_at_one_place_advice_follows_the_evidence() -> None:
    """`check the links` is a guess when nothing points at the network: never [high]; and not said at all
    when the sockets moved bytes between samples."""
    hung = analyze(ddp_sample(11.0, {}, cpu=1.0, sent=0, frames=ALL_REDUCE),
                   history=[ddp_sample(10.0, {}, cpu=1.0, sent=0, frames=ALL_REDUCE)])
    same = next(f for f in hung.findings if f.kind == "all_identical")
    assert same.confidence == "medium" and "check the links" in same.detail
    moving = analyze(ddp_sample(11.0, {}, cpu=1.1, sent=50_000, frames=ALL_REDUCE),
                     history=[ddp_sample(10.0, {}, cpu=1.0, sent=0, frames=ALL_REDUCE)])
    same = next(f for f in moving.findings if f.kind == "all_identical")
    assert "check the links" not in same.detail and "the links work" in same.detail
    assert same.confidence == "low"
    # control traffic alone (a keepalive): the job is not moving, but the links carry bytes: no guess at them
    control = analyze(ddp_sample(11.0, {}, cpu=1.1, sent=5_000, frames=ALL_REDUCE),
                      history=[ddp_sample(10.0, {}, cpu=1.0, sent=0, frames=ALL_REDUCE)])
    assert {p.status for p in control.progress} == {"stuck"}
    same = next(f for f in control.findings if f.kind == "all_identical")
    assert "check the links" not in same.detail and "the links work" in same.detail

    # a job that progresses on several nodes by its stacks alone (socket bytes not measured, or none moved between
    # these two samples): its collectives across nodes complete, so the links work, and no guess at them
    stacks_moved = analyze(ddp_sample(11.0, {}, cpu=1.2, sent=0, frames=ALL_REDUCE),
                           history=[ddp_sample(10.0, {}, cpu=1.0, sent=0)])
    assert {p.status for p in stacks_moved.progress} == {"progressing"}
    same = next(f for f in stacks_moved.findings if f.kind == "all_identical")
    assert "check the links" not in same.detail and "the links work" in same.detail


def test_counters_of_old_snapshots_are_absent_and_the_stacks_decide() -> None:
    before, now = sample(10.0, {r: 11 for r in range(8)}), sample(20.0, {r: 12 for r in range(8)})
    assert all(r.counters is None for r in now.ranks)
    a = analyze(now, history=[before])
    assert {p.status for p in a.progress} == {"progressing"} and all(p.net_bytes is None for p in a.progress)


def test_where_ranks_were_caught_names_a_slow_node_only_over_enough_samples() -> None:
    """Caught computing (state R, outside the collective) while the others wait in it: with 2 samples that is
    chance in a running job; over 4 samples it is a slow node, said with less confidence than counters."""
    def run(n: int) -> list:
        return [ddp_sample(10.0 + i, {6: {"frames": LOADING, "state": "R"}, 7: {"frames": LOADING, "state": "R"}},
                           cpu=1.0 + i, sent=10_000 * (i + 1), frames=ALL_REDUCE) for i in range(n)]
    two = run(2)
    assert not any(f.kind == "slow_node" for f in analyze(two[-1], history=two[:-1]).findings)
    four = run(4)
    (f,) = [f for f in analyze(four[-1], history=four[:-1]).findings if f.kind == "slow_node"]
    assert f.nodes == "node04" and f.confidence == "medium"
    assert "outside the collective in 100% of samples" in f.detail and "(state R)" in f.detail


def test_ddp_backward_counts_as_waiting_in_the_gradient_all_reduce() -> None:
    """DDP's all_reduce runs inside autograd's engine: `Tensor.backward` is a collective wait when the Reducer
    shows natively, or when the rank's sockets to its peers move; otherwise it is computing."""
    from app.analysis.frames import collective_of, ddp_reducer, in_backward
    from app.analysis.progress import _in_collective
    from app.analysis.options import AnalysisOptions

    reducer = Frame("c10d::Reducer::finalize_backward()", "libtorch_cpu.so", 0, native=True)
    assert collective_of(reducer) == "all_reduce"
    outermost_first = tuple(reversed(BACKWARD))
    assert in_backward(outermost_first) and not ddp_reducer(outermost_first)
    assert ddp_reducer((reducer,) + outermost_first)
    r = counted(1.0, 0, "node01", cpu=1.0, sent=0)
    assert _in_collective(r, AnalysisOptions(), sockets_active=True) is True
    assert _in_collective(r, AnalysisOptions(), sockets_active=False) is False
    native = counted(1.0, 0, "node01", cpu=1.0, sent=0, frames=(reducer,) + BACKWARD)
    assert _in_collective(native, AnalysisOptions(), sockets_active=False) is True


def test_every_rank_in_ddp_backward_with_sockets_in_use_waits_in_the_gradient_all_reduce() -> None:
    """One snapshot: every rank in `Tensor.backward`, sockets to the peers used within the last second."""
    ranks = [replace(counted(1.0, r, f"node{r // 2 + 1:02d}", cpu=1.0, sent=5),
                     sockets=(TcpSocket(f"10.0.0.{r}:4000", "10.0.0.9:41000", "ESTABLISHED", last_send_ms=20,
                                        last_recv_ms=30),)) for r in range(8)]
    same = next(f for f in analyze(snapshot(ranks)).findings if f.kind == "all_identical")
    assert same.title.startswith("all 8 ranks wait in DDP's gradient all_reduce, inside `backward`, in `<module>`")
    idle = [replace(r, sockets=(replace(r.sockets[0], last_send_ms=60_000, last_recv_ms=60_000),)) for r in ranks]
    same = next(f for f in analyze(snapshot(idle)).findings if f.kind == "all_identical")
    assert same.title.startswith("all 8 ranks are in `<module>`")

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

    from app.model.codec import snapshot_from_json

    snap, _ = snapshot_from_json((Path(__file__).parent.parent / "data/scenarios/skip.json").read_text())
    culprit = next(r for r in snap.ranks if r.rank == 2)
    d = diff_vs_majority(snap, analyze(snap), (culprit.node, culprit.pid))
    shown = [(v.name, v.left, v.right) for r in d.rows for v in r.iteration + r.locals]
    assert all(" at 0x" not in (left or "") for _, left, _ in shown), shown
    assert ("step", "4", "3") in shown


def test_a_rank_computing_in_its_loop_is_not_called_spinning_until_it_has_stood_there_long() -> None:
    """One rank computes a long step (a matrix product under one Python line of its loop) while the others wait
    for it in all_reduce. Over two samples a second apart that is a straggler or a hang inside the computation:
    the rank is named, computing, not 'spinning ... the loop never exits'. Over samples 12 s apart it spins."""
    loop = (LoopInfo("while", 317, 318, "while time.monotonic() < until:"),)
    body = (Frame("main", "job.py", 318, loops=loop, source=((318, "a = torch.tanh(a @ a * 0.01)"),)),
            Frame("<module>", "job.py", 400))

    def sample(at: float) -> Snapshot:
        snap = ddp_sample(at, {3: {"frames": body, "state": "R", "cpu": at}}, cpu=1.0, sent=0, frames=ALL_REDUCE)
        return replace(snap, ranks=tuple(replace(r, threads=(replace(r.threads[0], state="R"),)) if r.rank == 3
                                         else r for r in snap.ranks))

    a = analyze(sample(11.0), history=[sample(10.0)])
    assert "Rank 3" in a.verdict and "spinning" not in a.verdict and "never exits" not in a.verdict, a.verdict
    assert not any("spinning" in f.title for f in a.findings), [f.title for f in a.findings]
    assert "see whether rank 3 finishes this step: sample again over a longer interval" in a.verdict, a.verdict
    later = analyze(sample(22.0), history=[sample(10.0), sample(16.0)])
    assert "Rank 3" in later.verdict and "spinning" in later.verdict, later.verdict


def test_collectives_the_flight_recorder_counts_are_progress_whatever_carries_them() -> None:
    """NCCL over NVLink or InfiniBand moves no socket bytes, and a rank sampled twice inside one long GPU step
    stands at one place: the job's own count of its collectives (the Flight Recorder, read live) says it moves.
    A record that did not move, or one read from a dump file, says nothing."""
    def sample(at: float, seq: int, source: str = "worker_server") -> Snapshot:
        snap = ddp_sample(at, {}, cpu=1.0, sent=0, frames=ALL_REDUCE)
        record = FlightRecord(source, groups=(FlightGroup("0", last_enqueued=seq, last_completed=seq - 1),))
        return replace(snap, ranks=tuple(replace(r, flight=record) for r in snap.ranks))

    a = analyze(sample(11.0, 7), history=[sample(10.0, 5)])
    assert {p.status for p in a.progress} == {"progressing"}
    assert {p.moved for p in a.progress} == {("2 collectives (Flight Recorder)",)}
    assert a.verdict.startswith("The job is progressing: 8 of 8 ranks moved between samples (8 issued collectives "
                                "(Flight Recorder))"), a.verdict
    assert {p.status for p in analyze(sample(11.0, 5), history=[sample(10.0, 5)]).progress} == {"stuck"}
    dumped = analyze(sample(11.0, 7, "dump_file"), history=[sample(10.0, 5, "dump_file")])
    assert {p.status for p in dumped.progress} == {"stuck"}


def test_a_nodes_figure_against_all_the_others_is_the_median_without_it() -> None:
    """The slow-node evidence compares each node with the median of every other node (kept linear in nodes:
    12,500 nodes each against the 12,499 others must not take 12,500 sorts)."""
    from statistics import median

    from app.analysis.progress import median_without

    cases = [[0.1, 0.2], [0.0, 0.0, 0.5], [0.1, 0.3, 0.3, 0.9], [1.0, 2.0, 3.0, 4.0, 5.0]]
    for values in cases:
        for v in values:
            rest = list(values)
            rest.remove(v)
            assert median_without(sorted(values), v) == pytest.approx(median(rest))


def test_ranks_on_one_stack_share_one_signature_and_a_rank_elsewhere_has_its_own() -> None:
    """Progress compares where each rank stands across samples: one signature object per distinct place (at
    12,500 nodes x 8 deep ranks every rank's own copy was ~1 GB while --print ran, issue 27), made from the
    frames each rank has, never from another rank's."""
    from app.analysis.options import AnalysisOptions
    from app.analysis.progress import _Signatures

    signature = _Signatures(AnalysisOptions())
    a, b = (rank(r, "node01", in_step(ALL_REDUCE, 10)) for r in (0, 1))  # equal stacks, built apart
    later = rank(2, "node01", in_step(ALL_REDUCE, 11))
    assert a.main_thread.frames is not b.main_thread.frames
    assert signature(a) is signature(b) is signature(a)
    assert signature(later) != signature(a)
    for r in (a, later):
        assert signature(r) == tuple((f.function, f.filename, f.line, f.iteration)
                                     for f in place_frames(r.main_thread.frames))


def test_ranks_whose_frames_keep_locals_of_their_own_are_signed_once_per_place() -> None:
    """Each rank keeps its own locals (an object's address, its rank number) in the same frames: its frames tuple is
    its own, its place is not. The signature comes from the thread's interned path, once per place, and equals
    the one its own frames give."""
    from app.analysis.options import AnalysisOptions
    from app.analysis.progress import _Signatures

    def own(r: int) -> RankSnapshot:
        frames = tuple(replace(f, locals=(Local("peer", f"<socket at 0x7f{r:04x}>", True),))
                       for f in in_step(ALL_REDUCE, 10))
        return rank(r, "node01", frames)

    signature = _Signatures(AnalysisOptions())
    ranks = [own(r) for r in range(4)]
    assert len({r.main_thread.frames for r in ranks}) == 4 and len({id(r.main_thread.path) for r in ranks}) == 1
    assert len({id(signature(r)) for r in ranks}) == 1
    assert signature(ranks[3]) == tuple((f.function, f.filename, f.line, f.iteration)
                                        for f in place_frames(ranks[3].main_thread.frames))
    assert len(signature._by_path) == 1


def test_a_d_state_caught_once_in_a_rank_that_moved_is_passing_not_a_suspect() -> None:
    """A training job on busy nodes: one sample catches rank 5 in D (a page fault, a disk read), but rank 5 moved
    between the samples as the others did. The kernel's word holds for one moment only: no [medium] suspect. A
    rank held in D that did not move stays one."""
    def with_d(s, moved: bool):  # type: ignore[no-untyped-def]
        ranks = list(s.ranks)
        ranks[5] = replace(ranks[5], state="D", wchan="vm_mmap_pgoff")
        return replace(s, ranks=tuple(ranks))

    steps = {r: 12 for r in range(8)}
    a = analyze(with_d(sample(20.0, steps), True), history=[sample(10.0, {r: 11 for r in range(8)})])
    assert a.findings[0].kind == "progressing"
    d = next(f for f in a.findings if f.kind == "uninterruptible")
    assert d.confidence == "low", d
    assert "rank 5 on node02 moved between samples: a D state seen in one sample is a passing kernel wait" in d.reason
    assert not [f for f in a.findings if f.culprit and f.confidence != "low" and f.kind != "progressing"]

    held = {r: 12 for r in range(8) if r != 5}  # rank 5 stays at step 11: it did not move
    a = analyze(with_d(sample(20.0, {**held, 5: 11}), False), history=[sample(10.0, {r: 11 for r in range(8)})])
    d = next(f for f in a.findings if f.kind == "uninterruptible")
    assert d.confidence == "medium" and "passing" not in d.reason, d
