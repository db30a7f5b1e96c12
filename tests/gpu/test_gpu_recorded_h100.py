"""A real NCCL hang, recorded on an NVIDIA H100 by `make gpu-check` (tests/data/gpu/h100-nccl-hang.snapshot.json,
as `--snapshot` writes it: default-deny): 3 ranks sharing the GPU as three NCCL hosts, NCCL 2.28.9 with RAS on,
torch 2.11+cu130, the Flight Recorder on; rank 2 sleeps in a loop before its step's all_reduce, ranks 0-1 wait in
torch.cuda.synchronize with the CUDA runtime polling the GPU (state R, ~1.9 cores), their innermost frames bare
libcuda addresses. The first run of gpu-check called this job "progressing" [high].

Analysed as the CLI analyses two samples: the recorded one, and the same ranks read again 1.5 s later with nothing
moved but what a hung NCCL job moves (RAS keepalives, 848 B a rank) and the driver caught at other addresses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.analysis import analyze
from app.model import Snapshot
from app.model.codec import snapshot_from_json

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu" / "h100-nccl-hang.snapshot.json"


def _recorded() -> Snapshot:
    snap, _ = snapshot_from_json(DATA.read_text(encoding="utf-8"))
    return snap


def _later(snap: Snapshot, seconds: float = 1.5) -> Snapshot:
    """The same ranks `seconds` later: counters read again, RAS peers' sockets 424 B further on each, the driver
    polling at another address (and on a CPU), everything else as it was."""
    ranks = []
    for r in snap.ranks:
        assert r.counters is not None
        socks = tuple(replace(s, bytes_acked=s.bytes_acked + 212, bytes_received=s.bytes_received + 212)
                      if s.state == "ESTABLISHED" and s.last_send_ms is not None and s.last_send_ms < 1000
                      and s.bytes_acked is not None and s.bytes_received is not None and s.bytes_acked < 10_000
                      else s for s in r.sockets)
        threads = tuple(replace(t, frames=tuple(replace(f, function="0x7f00000" + f.function[-5:])
                                                if f.native and f.function.startswith("0x") else f for f in t.frames))
                        for t in r.threads)
        # the ranks in the synchronisation ran at 1.9 cores (state R: the runtime polls); the hung one sleeps
        burn = seconds * 1.9 if any(t.state == "R" for t in r.threads) else 0.0
        utime = r.counters.utime + burn if r.counters.utime is not None else None
        ranks.append(replace(r, sockets=socks, threads=threads, cpu_time=r.cpu_time + burn,
                             counters=replace(r.counters, at=r.counters.at + seconds, utime=utime)))
    return replace(snap, taken_at=snap.taken_at + seconds, ranks=tuple(ranks))


def test_the_recorded_nccl_hang_is_stuck_with_the_sleeping_rank_as_its_culprit() -> None:
    first = _recorded()
    now = _later(first)
    a = analyze(now, history=[first])
    assert {p.status for p in a.progress} == {"stuck"}, [(p.rank, p.moved) for p in a.progress]
    assert not any(f.kind == "progressing" for f in a.findings)
    assert all(not p.moved and any("control-sized" in q for q in p.quiet) for p in a.progress)
    # who, in what state, where the others wait, and the evidence NCCL itself gives
    assert a.verdict.startswith("NCCL RAS: rank 2 launched only 2 AllReduce operations") or \
        a.verdict.startswith("Rank 2 (pid"), a.verdict
    assert "sleeping in `time.sleep`" in a.verdict, a.verdict
    lead = a.findings[0]
    assert lead.confidence == "high" and all(k[1] == 542 for k in lead.ranks), lead
    assert len(a.classes) == 2, "ranks 0-1 wait at one place, whatever address the driver was caught at"


def test_the_waiting_ranks_wait_for_their_gpu_they_do_not_spin() -> None:
    first = _recorded()
    a = analyze(_later(first), history=[first])
    assert "the other 2 ranks wait for it in `torch.cuda.synchronize` at `main` (gpu_hang_job.py:107): the host " \
        "waits for its GPU" in " ".join(a.verdict.split()), a.verdict
    assert not any("spinning" in f.title and 542 not in (k[1] for k in f.ranks) for f in a.findings), \
        [f.title for f in a.findings]
    # and the progress summary says so too: their CPU is the synchronisation's polling (it said "2 spinning")
    assert {p.activity for p in a.progress if p.pid != 542} == {"polling"}


def test_the_flight_recorder_of_every_rank_holds_nccls_collectives() -> None:
    snap = _recorded()
    assert all(r.flight is not None and any("nccl:all_reduce" in e.profiling_name for e in r.flight.entries)
               for r in snap.ranks), "dump_nccl_trace_json's entries, merged with fr_trace_json's"


# Two more hangs recorded on an H100 by `bench/gpu_check.py --hangs kernel,cycle` (2026-11-27; the same machine,
# torch and NCCL as above, the Flight Recorder with start times on: TORCH_NCCL_ENABLE_TIMING=1), as --snapshot
# writes them. Before the recorder's "why" rules (app/analysis/flight.py), the first was "all 3 ranks ... blocked
# in cudaDeviceSynchronize", the culprit not named; the second named it by NCCL RAS's counts with "Next: see the
# GPU evidence: dmesg ... Xid", where its group was the cause.

def _recording(name: str) -> Snapshot:
    snap, _ = snapshot_from_json((DATA.parent / f"{name}.snapshot.json").read_text(encoding="utf-8"))
    return snap


def test_a_gpu_that_never_finishes_a_kernel_is_named_by_the_collective_it_has_not_started() -> None:
    """Rank 2 queued a kernel that does not end (torch.cuda._sleep) before its all_reduce: every host waits in
    torch.cuda.synchronize alike; only the recorder's start marks tell rank 2's GPU apart (#3 issued, not begun)."""
    first = _recording("h100-nccl-kernel-hang")
    culprit = next(r.pid for r in first.ranks if r.rank == 2)
    a = analyze(_later(first), history=[first])
    assert {p.status for p in a.progress} == {"stuck"}
    assert a.culprit is not None and [k[1] for k in a.culprit.who.keys] == [culprit]
    assert "rank 2's GPU has not started collective #3 of process group 0 (nccl:all_reduce), which the GPUs of " \
        "2 others started" in a.verdict, a.verdict
    assert "Next: find what rank 2's GPU runs before that collective" in a.verdict, a.verdict
    # one rank against two is not a [high] on start marks alone; and nothing else is [high] about another rank
    assert not [f for f in a.findings if f.culprit and f.confidence == "high" and culprit not in (k[1] for k in f.ranks)]


def test_a_rank_in_the_collective_of_another_group_is_named_with_the_group_it_waits_in() -> None:
    """Rank 2 all_reduces over a group of ranks 0 and 2 where the others all_reduce over the world: its record
    holds pg 1's #1 (in the entries: NCCL's status line for pg 1 has no count), which no other rank issued."""
    first = _recording("h100-nccl-group-cycle")
    culprit = next(r.pid for r in first.ranks if r.rank == 2)
    a = analyze(_later(first), history=[first])
    assert a.culprit is not None and [k[1] for k in a.culprit.who.keys] == [culprit]
    assert a.verdict.startswith("Rank 2 is behind in process group 0: last collective issued #2 where 2 others are "
                                "at #3, and waits in process group 1's collective #1 (nccl:all_reduce) instead, which "
                                "no other rank has issued;"), a.verdict
    assert "; it called that collective at `main` (gpu_hang_job.py:116): `dist.all_reduce(y, group=pair)" in a.verdict
    assert "dmesg" not in a.verdict and "make every rank call each group's collectives in one order" in a.verdict
    assert a.findings[0].confidence == "high"


def test_the_gpu_check_judges_the_headlines_culprit_not_the_first_finding() -> None:
    """bench/gpu_check.py reads the snapshot file's analysis as it is written. On the kernel hang the first finding
    is a [high] note that blames no one (all ranks at one place: stacks cannot tell) and names every rank; the
    headline's culprit is rank 2 alone. The check passes on that, and fails a [high] that blames another rank."""
    from test_gpu_check import _gpu_check_module

    judge = _gpu_check_module().judge_culprit
    first = _recording("h100-nccl-kernel-hang")
    culprit = next(r.pid for r in first.ranks if r.rank == 2)
    doc = analyze(_later(first), history=[first]).to_dict()
    assert doc["findings"][0]["culprit"] is False and len(doc["findings"][0]["ranks"]) == 3  # what misled it
    assert judge(doc, culprit)[0] == "pass", judge(doc, culprit)
    other = next(r.pid for r in first.ranks if r.rank == 0)
    assert judge(doc, other)[0] == "unnamed"  # a [medium] culprit elsewhere: said, not a failure
    blamed = {**doc, "findings": [*doc["findings"], {"kind": "blocked", "confidence": "high", "culprit": True,
                                                      "ranks": [["vm", other]]}]}
    status, said = judge(blamed, culprit)
    assert status == "fail" and f"blames pid(s) [{other}]" in said
    wrong_head = {**doc, "culprit": {**doc["culprit"], "ranks": [["vm", other]], "confidence": "high"}}
    assert judge(wrong_head, culprit)[0] == "fail"
    assert judge({"verdict": "", "findings": []}, culprit)[0] == "unnamed"
