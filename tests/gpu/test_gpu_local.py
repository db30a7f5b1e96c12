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
from app.gpu.runner import GpuTestRunner, Preflight
from app.transport import bootstrap
from app.transport.local import spawn_worker, start_local
from workers import protocol
from workers.gputest.marked import marked_pids
from procstate import wait_exec
from waiting import wait_until_async

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
    port = (await worker.call(protocol.GPU_PORTS({"count": 1})))["ports"][0]
    # world size 3 with 2 ranks launched: both wait at the rendezvous for a rank that never comes
    req = worker.request(protocol.GPU_LAUNCH({"token": token, "python": PY, "nproc": 2, "config": config(port, 3),
                                              "timeout": 200}))
    lines: list = []
    stopped = False
    async for item in req:
        lines += item["lines"]
        if not stopped and any('"missing": [2]' in text for _, _, text in lines):
            stopped = (await worker.call(protocol.GPU_STOP({"token": token})))["found"]
    assert stopped and req.done["stopped"] and not req.done["timed_out"]
    dumps = [text for stream, _, text in lines if stream == "err" and "in join_world" in text]
    assert len(dumps) == 2  # faulthandler answered SIGUSR1 on both ranks: where each one waited
    assert req.done["killed"] >= 2 and req.done["survivors"] == [] and marked_pids(token) == []


async def test_closing_the_worker_kills_a_running_test() -> None:
    conn = await start_local(PY)
    token = secrets.token_hex(8)
    try:
        port = (await conn.call(protocol.GPU_PORTS({"count": 1})))["ports"][0]
        req = conn.request(protocol.GPU_LAUNCH({"token": token, "python": PY, "nproc": 2, "config": config(port, 3),
                                                "timeout": 200}))
        async for item in req:  # until a rank waits at the rendezvous; the request keeps running
            if any('"phase": "join"' in t for _, _, t in item["lines"]):
                break
        assert len(marked_pids(token)) >= 2  # torchrun and its ranks are running
    finally:
        await conn.close()  # EOF: the worker kills what it started, then exits
    # polling under a deadline: the kernel reaps asynchronously
    await wait_until_async(lambda: not marked_pids(token), 15, "the worker's processes to go", interval=0.05)


async def test_an_interpreter_without_torch_is_reported_not_hung(worker) -> None:
    stall = 240  # the test's own deadline: a run that waited for it would have hung on the missing torch
    runner = GpuTestRunner({"local": worker}, GpuTestOptions(python=NO_TORCH, timeout=stall))
    results = await runner.run("sanity")
    (run,) = results.runs
    assert run.status == "failed" and not results.ok
    assert run.ranks[0].status == "not_started" and "No module named" in run.ranks[0].error
    assert run.elapsed < stall  # ended by the rank's own exit, not by the deadline


async def test_the_interpreter_comes_from_the_jobs_ranks(worker) -> None:
    # a stand-in rank of a job: a python process carrying RANK/LOCAL_RANK, as torchrun's ranks do
    rank = subprocess.Popen([PY, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                            env={**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"})
    try:
        wait_exec(rank.pid)  # its command line and environment are what the runner reads
        runner = GpuTestRunner({"local": worker}, GpuTestOptions())
        pre = await runner.preflight()
        # this rank's interpreter (other jobs' ranks on this shared machine are discovered too; not this test's)
        own = Preflight()
        await runner.choose_python("local", worker, [rank.pid], own)
    finally:
        rank.send_signal(signal.SIGKILL)
        rank.wait()
    # the path the rank was started by, not /proc/PID/exe: in a venv that is the base interpreter, without torch
    assert own.pythons["local"] == PY and pre.pythons["local"]
    assert own.python_notes["local"] == f"local: python {PY} (the job's interpreter: pid {rank.pid}'s command line " \
        f"(argv[0] {PY}))"
    assert ("127.0.0.1", 29400) in pre.masters and pre.errors == {}


async def test_a_rank_started_through_a_venv_symlink_by_a_relative_path_keeps_its_venv(tmp_path) -> None:
    # a venv's bin/python is a symlink to the base interpreter; the rank was started as ./bin/python from the
    # venv's folder: the interpreter is that path, resolved against the rank's cwd, not the symlink's target
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(os.path.realpath(PY))
    rank = subprocess.Popen(["./bin/python", "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                            cwd=str(venv), env={**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    try:
        wait_exec(rank.pid)  # its command line is what rank_python reads
        from workers.gputest.interpreters import rank_python
        python, why = rank_python(rank.pid)
    finally:
        rank.kill()
        rank.wait()
    assert python == str(venv / "bin" / "python") and python != os.path.realpath(PY)
    assert why == f"pid {rank.pid}'s command line (argv[0] ./bin/python)"


async def test_with_no_job_on_the_node_the_python3_on_path_with_torch_is_used_and_named(monkeypatch) -> None:
    # the user killed the hung job and now tests the nodes: no --python needed when python3 on PATH has torch
    folder = os.path.dirname(PY)
    assert os.access(os.path.join(folder, "python3"), os.X_OK), "the tests' environment has a python3"
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    # a node with no job: the worker in a PID namespace of its own (a user namespace makes it root there), whose
    # /proc shows no other process. On this machine other work runs jobs (another xdist worker's SLURM tests,
    # other users' venvs) whose interpreters the worker would rightly pick before python3 on PATH
    payload = bootstrap.build_payload()
    conn = await spawn_worker(["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child",
                               "--mount-proc", PY, "-c", payload.stage()], payload.data, python=PY)
    try:
        pre = Preflight()  # no rank on the node
        await GpuTestRunner({"local": conn}, GpuTestOptions()).choose_python("local", conn, [], pre)
    finally:
        await conn.close()
    assert pre.errors == {} and pre.pythons["local"] == os.path.join(folder, "python3")
    assert pre.python_notes["local"].startswith(f"local: python {folder}/python3 (python3 on this node's PATH "
                                                "(torch 2.13.0")


async def test_with_no_job_and_no_torch_on_path_the_error_says_what_was_tried(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # Debian's python3 only: no torch
    # a node with no job: the worker in a PID namespace of its own sees no process of this shared machine (whose
    # SLURM test jobs name a venv with torch, which the search rightly takes)
    conn = await start_local(f"unshare --pid --fork --mount-proc {PY}")
    try:
        pre = Preflight()  # no rank on the node (other jobs on this shared machine are none of this test's)
        await GpuTestRunner({"local": conn}, GpuTestOptions()).choose_python("local", conn, [], pre)
    finally:
        await conn.close()
    error = pre.errors["local"]
    assert error.startswith("no job runs here and no python with torch was found (tried /usr/bin/python3 "
                            "(python3 on this node's PATH): ") and "torch" in error
    assert error.endswith("; pass --python PATH") and "local" not in pre.pythons


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
        stall = 240  # a's stall deadline: the run must end because b failed, long before it
        launcher = Launcher(conns, GpuTestOptions(timeout=stall), {"a": PY, "b": NO_TORCH},
                            {"a": "127.0.0.1", "b": "127.0.0.1"}, lambda e: None)
        run = await launcher.run(LaunchSpec("sanity", ("a", "b"), (1, 1)))
    finally:
        await other.close()
    assert run.status == "failed" and run.elapsed < stall  # not the stall deadline: b ended early
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
