"""The worker on a real hung torch gloo job (2 ranks under torchrun --standalone, `skip` scenario: rank 1 is
one step ahead on the same line): discovery, dumps with locals/loops and native frames, strace on gloo."""

from __future__ import annotations

from typing import Iterator

import pytest

import jobs
from app.decode import replies as parse
from worker_client import WorkerProc
from worker_targets import untouched

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def job(torch_support: None) -> Iterator[jobs.Job]:
    started = jobs.start_local_job("skip", nproc=2, culprit=1)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def worker(job: jobs.Job) -> Iterator[WorkerProc]:
    with WorkerProc() as w:
        yield w


@pytest.fixture(scope="module")
def ranks(job: jobs.Job, worker: WorkerProc) -> dict:
    items, done = worker.call("discover")
    assert done["type"] == "done"
    return {i["rank"]: i for i in items if i["pid"] in {r.host_pid for r in job.ranks.values()}}


def test_discovery_finds_both_ranks_and_not_torchrun(job: jobs.Job, worker: WorkerProc, ranks: dict) -> None:
    assert sorted(ranks) == [0, 1]
    assert {ranks[r]["pid"] for r in ranks} == {job.ranks[0].host_pid, job.ranks[1].host_pid}
    launcher = ranks[0]["launcher_pid"]
    assert ranks[0]["launcher"] == ranks[1]["launcher"] == "torchrun" and ranks[1]["launcher_pid"] == launcher
    items, _ = worker.call("discover")
    assert launcher not in {i["pid"] for i in items}
    assert all(s["local"].startswith("127.0.0.1:") for s in ranks[0]["sockets"])


def test_locals_and_loops_tell_the_culprit_by_its_step(worker: WorkerProc, ranks: dict) -> None:
    targets = [{"pid": ranks[r]["pid"], "start_time": ranks[r]["start_time"]} for r in (0, 1)]
    items, done = worker.call("dump", {"targets": targets, "locals": True, "loops": True, "source_context": 3})
    by_pid = {i["pid"]: i for i in items}
    steps = {}
    for r in (0, 1):
        snap = parse.apply_dump(parse.rank_from_discover("local", ranks[r]), by_pid[ranks[r]["pid"]])
        assert snap.collected and snap.error is None
        train = next(f for f in snap.main_thread.frames if f.function == "train")
        assert train.loops[0].header == "for step, batch in enumerate(loader):"
        steps[r] = dict(train.iteration)["step"]
        assert snap.main_thread.frames[0].function == "all_reduce"
        assert untouched(snap.pid)
    assert steps == {0: "3", 1: "4"}


def test_native_dump_reaches_the_collective_wait(worker: WorkerProc, ranks: dict) -> None:
    target = {"pid": ranks[0]["pid"], "start_time": ranks[0]["start_time"]}
    items, _ = worker.call("dump", {"targets": [target], "native": True, "timeout": 30}, timeout=60)
    snap = parse.apply_dump(parse.rank_from_discover("local", ranks[0]), items[0])
    assert "c10d::Work::wait" in {f.function for f in snap.main_thread.frames if f.native}
    assert untouched(snap.pid)


def test_strace_on_gloo_is_capped_and_shows_the_main_thread_in_futex(worker: WorkerProc, ranks: dict) -> None:
    pid = ranks[1]["pid"]
    _, done = worker.call("strace", {"pid": pid, "start_time": ranks[1]["start_time"], "seconds": 1.0,
                                     "max_lines": 100})
    res = parse.strace_result(done)
    assert res.truncated and done["data"]["lines"] > 100  # gloo's pollers: hundreds of epoll_wait per second
    assert {t.tid: t for t in res.threads}[pid].blocked_in == "futex(FUTEX_WAIT_BITSET)"
    assert untouched(pid)
