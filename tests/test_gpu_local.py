"""GPU tests for real on this machine through a local worker (no SSH): gloo on CPU, 2 ranks, torch 2.13.

The sanity test and the bench pass with numbers for every size; a test stuck at the rendezvous is stopped
with each rank's stack and nothing of it survives; closing the worker (the login side went away) kills a
running test too; an interpreter without torch is reported, not hung; the interpreter is taken from the
job's ranks when --python is not given."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys

import pytest

from app.gpu import events as ev
from app.gpu.launch import Launcher, LaunchSpec, PortBook
from app.gpu.model import PHASES
from app.gpu.options import GpuTestOptions
from app.gpu.runner import GpuTestRunner
from app.transport.local import start_local
from workers.gputest.marked import marked_pids

pytestmark = [pytest.mark.torch, pytest.mark.timeout(240), pytest.mark.usefixtures("torch_support")]
PY = sys.executable  # this interpreter has torch: it stands for the job's
NO_TORCH = "/usr/bin/python3"  # Debian's: no torch


@pytest.fixture
async def worker():
    conn = await start_local(PY)
    try:
        yield conn
    finally:
        await conn.close()


def config(port: int, world: int, mode: str = "sanity") -> dict:
    return {"mode": mode, "master_addr": "127.0.0.1", "master_port": port, "world_size": world, "rank_offset": 0,
            "backend": "auto", "sizes": [], "join_timeout": 300, "pg_timeout": 60, "watchdog": 300}


async def test_sanity_and_bench_pass_on_two_local_ranks(worker) -> None:
    opts = GpuTestOptions(python=PY, procs_per_node=2, sizes=(4096, 1 << 20), iters=3, warmup=1, timeout=30)
    events: list = []
    runner = GpuTestRunner({"local": worker}, opts, on_event=events.append)
    results = await runner.run("bench")
    (run,) = results.runs
    assert results.ok and run.status == "ok", results.verdict
    assert [(r.rank, r.status, r.value, r.device) for r in run.ranks] == [(0, "ok", 2.0, "cpu"), (1, "ok", 2.0, "cpu")]
    assert run.backend == "gloo" and run.world_size == 2  # no GPU here: gloo, chosen by the ranks at run time
    assert [r.size for r in run.bench] == [4096, 1 << 20]
    for row in run.bench:
        assert row.time_us > 0 and row.busbw == pytest.approx(row.size / (row.time_us / 1e6) / 1e9 * 2 * (2 - 1) / 2)
    assert isinstance(events[-1], ev.Finished) and isinstance(events[0], ev.RunStarted)
    phases = [e.phase for e in events if isinstance(e, ev.RankProgress) and e.rank == 0]
    assert phases == sorted(phases, key=PHASES.index) and phases[-1] == "done"
    assert any(line.startswith("[local:0] is OK (global rank: 0/2)") for line in run.log)  # the guide's line


async def test_a_test_stuck_at_the_rendezvous_is_stopped_with_stacks_and_leaves_nothing(worker) -> None:
    token = secrets.token_hex(8)
    port = (await worker.call("gpu_ports", {"count": 1}))["ports"][0]
    # world size 3 with 2 ranks launched: both wait at the rendezvous for a rank that never comes
    req = worker.request("gpu_launch", {"token": token, "python": PY, "nproc": 2, "config": config(port, 3),
                                        "timeout": 200})
    lines: list = []
    stopped = False
    async for item in req:
        lines += item["lines"]
        if not stopped and any('"missing": [2]' in text for _, _, text in lines):
            stopped = (await worker.call("gpu_stop", {"token": token}))["found"]
    assert stopped and req.done["stopped"] and not req.done["timed_out"]
    dumps = [text for stream, _, text in lines if stream == "err" and "in join_world" in text]
    assert len(dumps) == 2  # faulthandler answered SIGUSR1 on both ranks: where each one waited
    assert req.done["killed"] >= 2 and req.done["survivors"] == [] and marked_pids(token) == []


async def test_closing_the_worker_kills_a_running_test() -> None:
    conn = await start_local(PY)
    token = secrets.token_hex(8)
    try:
        port = (await conn.call("gpu_ports", {"count": 1}))["ports"][0]
        req = conn.request("gpu_launch", {"token": token, "python": PY, "nproc": 2, "config": config(port, 3),
                                          "timeout": 200})
        async for item in req:  # until a rank waits at the rendezvous; the request keeps running
            if any('"phase": "join"' in t for _, _, t in item["lines"]):
                break
        assert len(marked_pids(token)) >= 2  # torchrun and its ranks are running
    finally:
        await conn.close()  # EOF: the worker kills what it started, then exits
    deadline = asyncio.get_running_loop().time() + 15
    while marked_pids(token) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)  # polling under a deadline: the kernel reaps asynchronously
    assert marked_pids(token) == []


async def test_an_interpreter_without_torch_is_reported_not_hung(worker) -> None:
    runner = GpuTestRunner({"local": worker}, GpuTestOptions(python=NO_TORCH, timeout=30))
    results = await runner.run("sanity")
    (run,) = results.runs
    assert run.status == "failed" and not results.ok
    assert run.ranks[0].status == "not_started" and "No module named" in run.ranks[0].error
    assert run.elapsed < 25


async def test_the_interpreter_comes_from_the_jobs_ranks(worker) -> None:
    # a stand-in rank of a job: a python process carrying RANK/LOCAL_RANK, as torchrun's ranks do
    rank = subprocess.Popen([PY, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                            env={**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"})
    try:
        pre = await GpuTestRunner({"local": worker}, GpuTestOptions()).preflight()
    finally:
        rank.send_signal(signal.SIGKILL)
        rank.wait()
    assert os.path.realpath(pre.pythons["local"]) == os.path.realpath(PY)
    assert ("127.0.0.1", 29400) in pre.masters and pre.errors == {}


async def test_events_stream_ends_with_finished(worker) -> None:
    runner = GpuTestRunner({"local": worker}, GpuTestOptions(python=NO_TORCH, timeout=30))
    seen = [e async for e in runner.events("sanity")]
    assert isinstance(seen[0], ev.RunStarted) and isinstance(seen[-2], ev.RunFinished)
    assert isinstance(seen[-1], ev.Finished) and seen[-1].results.runs[0].status == "failed"


async def test_a_node_whose_launch_fails_is_blamed_and_the_others_are_stopped(worker) -> None:
    # two "nodes" on this machine: b's interpreter has no torch, so a's rank waits at the rendezvous for it
    other = await start_local(PY)
    try:
        conns = {"a": worker, "b": other}
        launcher = Launcher(conns, GpuTestOptions(timeout=60), {"a": PY, "b": NO_TORCH},
                            {"a": "127.0.0.1", "b": "127.0.0.1"}, lambda e: None)
        run = await launcher.run(LaunchSpec("sanity", ("a", "b"), (1, 1)))
    finally:
        await other.close()
    assert run.status == "failed" and run.elapsed < 45  # not the 60 s stall timeout: b ended early
    a, b = run.ranks
    assert (b.node, b.status, b.culprit) == ("b", "not_started", True) and "No module named" in b.error
    assert a.status in ("hung", "not_started") and not a.culprit  # stopped: it waited (or was starting)
    assert run.message.startswith("failed: rank 1 (b) not started: ")


async def test_concurrent_tests_never_get_the_same_port(worker) -> None:
    books = [PortBook((29500, 29999)) for _ in range(2)]  # two runners in one process share one book
    ports = await asyncio.gather(*(books[i % 2].take(worker) for i in range(16)))
    assert len(set(ports)) == 16 and all(29500 <= p <= 29999 for p in ports)
    for i, p in enumerate(ports):
        books[i % 2].release(p)
