"""A real SLURM (slurmctld, slurmd per node, munge) on the namespace cluster: --slurm resolution and srun."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from app.errors import TransportError
from app.gpu.connect import close_workers, open_workers
from app.model.codec import snapshot_from_json
from app.slurm.job import SlurmError
from app.session import Session, SessionOptions
from app.slurm.resolve import host_specs, resolve_job
from app.transport.srun import SrunOptions, SrunTransport
from app.transport.base import WorkerConnection
from workers import protocol
from waiting import wait_until
from jobs import JOB_SCRIPT, MARK, PYTHON, REPO, Job
from slurm_cluster import SlurmCluster, build_slurm, slurm_problem

pytestmark = pytest.mark.cluster


def require_slurm() -> None:
    problem = slurm_problem()
    if problem:  # like the cluster itself: skipped on a dev box without the packages, a failure in CI
        if os.environ.get("CI"):
            pytest.fail(f"{problem} (env CI is set: tests/install-deps.sh installs them)", pytrace=False)
        pytest.skip(problem)


@pytest.fixture(scope="module")
def slurm(cluster_support: None) -> Iterator[SlurmCluster]:
    require_slurm()
    with build_slurm(2) as s:
        yield s


def submit(slurm: SlurmCluster, *args: str) -> str:
    out = slurm.run("sbatch", "--parsable", f"--output={slurm.dir}/job-%j.out", *args).stdout
    return out.strip().split(";")[0]


def wait_state(slurm: SlurmCluster, job_id: str, state: str) -> None:
    wait_until(lambda: slurm.run("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip() == state, 30,
         f"job {job_id} {state}", interval=0.1)


def test_running_job_resolves_to_its_nodes(slurm: SlurmCluster) -> None:
    job_id = submit(slurm, "-N", "2", "--job-name", "resolve me", "--wrap", "sleep 600")
    try:
        wait_state(slurm, job_id, "RUNNING")
        job = resolve_job(job_id, slurm.env())
        assert job.nodes == tuple(slurm.compute_names) and job.state == "RUNNING"
        assert job.name == "resolve me" and job.user == "root" and job.start_time
        assert job.source == "squeue --json" and not job.warnings  # 22.05: scontrol has no --json yet
        # inside the allocation, --slurm needs no id
        assert resolve_job(None, slurm.env({"SLURM_JOB_ID": job_id})).nodes == job.nodes
    finally:
        slurm.run("scancel", job_id, check=False)


def test_pending_job_is_refused_with_its_reason(slurm: SlurmCluster) -> None:
    job_id = submit(slurm, "--hold", "--wrap", "true")
    try:
        with pytest.raises(SlurmError) as err:
            resolve_job(job_id, slurm.env())
        assert err.value.problem == "not_running" and "PENDING" in str(err.value)
        assert "JobHeldUser" in str(err.value)
    finally:
        slurm.run("scancel", job_id, check=False)


def test_unknown_job_is_refused(slurm: SlurmCluster) -> None:
    with pytest.raises(SlurmError) as err:
        resolve_job("987654", slurm.env())
    assert err.value.problem == "unknown_job" and "987654" in str(err.value)


# -- the srun transport -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sleeper(slurm: SlurmCluster) -> Iterator[str]:
    """A running 2-node job to attach steps to."""
    job_id = submit(slurm, "-N", "2", "--wrap", "sleep 3000")
    try:
        wait_state(slurm, job_id, "RUNNING")
        # RUNNING is slurmctld's word; the batch step's processes (slurmstepd, the script, its sleep) start a moment
        # later, on a busy machine after the first test's leak picture, which then counts them as its own
        wait_until(lambda: any(_cmdline(p.host_pid) == b"sleep\x003000\x00" for n in slurm.computes
                               for p in n.procs()), 60, f"job {job_id}'s batch script to run its sleep")
        yield job_id
    finally:
        slurm.run("scancel", job_id, check=False)


def _cmdline(host_pid: int) -> bytes:
    try:
        return Path(f"/proc/{host_pid}/cmdline").read_bytes()
    except OSError:
        return b""


def srun_processes() -> list[int]:
    """hangscope's srun steps started from this process (srun forks a helper of its own: not counted)."""
    me = os.getpid()
    return [p.pid for p in psutil.process_iter(["name", "ppid"]) if p.info["name"] == "srun" and p.info["ppid"] == me]


def node_workers(slurm: SlurmCluster) -> list[str]:
    """Processes of hangscope's stages (mux or worker) still alive on the compute nodes."""
    def stage(host_pid: int) -> bool:
        try:
            return "base64,zlib" in " ".join(psutil.Process(host_pid).cmdline())
        except psutil.Error:
            return False

    return [f"{n.name}:{p.pid}" for n in slurm.computes for p in n.procs() if stage(p.host_pid)]


def node_tracers(slurm: SlurmCluster) -> dict[str, list[tuple[int, str, str]]]:
    """Every process of the compute nodes with its tracer: what a failed headline about a stop is checked against."""
    def tracer(host_pid: int) -> str:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
                if line.startswith("TracerPid:"):
                    return line.split()[1]
        return "?"

    return {n.name: [(p.pid, p.comm, tracer(p.host_pid)) for p in n.procs()] for n in slurm.computes}


async def test_srun_transport_runs_a_worker_on_every_node_in_one_step(slurm: SlurmCluster, sleeper: str) -> None:
    transport = SrunTransport(SrunOptions(job_id=sleeper, env=slurm.env(), start_timeout=60))
    conns = await asyncio.gather(*(transport.open(n) for n in slurm.compute_names))
    try:
        assert [c.hello["hostname"] for c in conns] == slurm.compute_names
        assert len(srun_processes()) == 1  # both nodes share one step
        for conn in conns:
            ranks = [item async for item in conn.request(protocol.DISCOVER({"pids": None}), timeout=30)]
            assert ranks == []  # `sleep` is no rank; the worker answers per node all the same
        # a 3 MB request and its reply cross the multiplexer intact, node by node
        data = os.urandom(3 << 20)
        done = await conns[1].call(protocol.PUSH_TOOL({"name": "py-spy", "data_b64": base64.b64encode(data).decode(),
                                                       "sha256": hashlib.sha256(data).hexdigest()}), timeout=60)
        assert done["name"] == "py-spy"
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    assert srun_processes() == []  # the step ended with its last node
    wait_until(lambda: node_workers(slurm) == [], 15, "no hangscope process left on the nodes")


async def test_srun_step_sends_a_shared_request_once_and_takes_its_nodes_from_a_file(
        slurm: SlurmCluster, sleeper: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At thousands of nodes the node list outgrows one argument and a request per node costs nodes^2 lines
    (--input=all): the list goes in a file, and one request id sent to every node goes out as one line for all."""
    from app.transport.base import next_request_id
    from app.transport.srun import step as step_mod

    monkeypatch.setattr(step_mod, "MAX_NODELIST", 1)  # what 12,500 names do: --nodefile
    sent: list[bytes] = []
    original = step_mod.Step.send
    monkeypatch.setattr(step_mod.Step, "send", lambda self, data: (sent.append(data), original(self, data)))
    transport = SrunTransport(SrunOptions(job_id=sleeper, env=slurm.env(), start_timeout=60))
    conns = await asyncio.gather(*(transport.open(n) for n in slurm.compute_names))
    try:
        (step,) = transport._steps
        assert step.nodefile is not None and os.path.exists(step.nodefile)
        assert [c.hello["hostname"] for c in conns] == slurm.compute_names
        shared = next_request_id()
        reqs = [c.request(protocol.DISCOVER({"pids": None}), timeout=30, req_id=shared) for c in conns]
        assert [r.id for r in reqs] == [shared, shared]
        answers = await asyncio.gather(*(r.collect() for r in reqs))
        assert all(done.get("count") == 0 for _, done in answers)  # `sleep` is no rank; each node answered
        requests = [line for line in sent if line.split(b" ")[1:2] == [b"D"]]
        assert len(requests) == 1 and requests[0].startswith(b"* D "), sent
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    assert step.nodefile is not None and not os.path.exists(step.nodefile)  # removed with the step
    assert srun_processes() == []


async def test_srun_transport_one_dead_worker_fails_only_its_node(slurm: SlurmCluster, sleeper: str) -> None:
    transport = SrunTransport(SrunOptions(job_id=sleeper, env=slurm.env(), start_timeout=60))
    a, b = await asyncio.gather(*(transport.open(n) for n in slurm.compute_names))
    try:
        assert b.pid is not None
        slurm.computes[1].run(["kill", "-9", str(b.pid)])
        with pytest.raises(TransportError) as err:
            await b.call(protocol.DISCOVER({"pids": None}), timeout=30)
        assert err.value.code == "worker_crashed" and slurm.compute_names[1] in str(err.value)
        assert await a.call(protocol.DISCOVER({"pids": None}), timeout=30) is not None  # the other node goes on
        # the session reopens a dead node's worker: a step of its own, beside the first
        again = await transport.open(slurm.compute_names[1])
        assert again.hello["hostname"] == slurm.compute_names[1] and len(srun_processes()) == 2
        await again.close()
    finally:
        await asyncio.gather(a.close(), b.close())
    assert srun_processes() == []


async def test_srun_to_a_job_that_is_gone_fails_each_node_with_sruns_reason(slurm: SlurmCluster) -> None:
    transport = SrunTransport(SrunOptions(job_id="987654", env=slurm.env(), start_timeout=30))
    results = await asyncio.gather(*(transport.open(n) for n in slurm.compute_names), return_exceptions=True)
    for node, result in zip(slurm.compute_names, results):
        assert isinstance(result, TransportError), result
        assert result.code == "lost" and node in str(result) and "srun step ended" in str(result)
        assert "987654" in str(result)
    assert srun_processes() == []


async def test_session_over_srun_and_auto_falls_back_when_ssh_is_refused(slurm: SlurmCluster, sleeper: str) -> None:
    job = resolve_job(sleeper, slurm.env())
    srun = SrunOptions(job_id=job.job_id, env=slurm.env(), start_timeout=60)
    ssh_config = (str(slurm.cluster.ssh_config),)
    for choice in ("srun", "auto"):
        session = Session(host_specs(job, choice), SessionOptions(srun=srun, ssh_config=ssh_config,
                                                                  connect_timeout=5))
        try:
            snap = await session.snapshot()
        finally:
            await session.close()
        assert [(n.name, n.state) for n in snap.nodes] == [(n, "done") for n in slurm.compute_names], snap.nodes
        if choice == "auto":  # no sshd on the nodes: every node said "refused", then srun got in
            assert all(any("reached over srun" in w and "refused" in w for w in n.warnings) for n in snap.nodes)
        assert srun_processes() == []
    assert {h.transport for h in host_specs(job)} == {"ssh"}  # --transport ssh: the job's nodes over SSH only


async def test_a_node_srun_cannot_launch_on_fails_alone(cluster_support: None) -> None:
    """srun aborts the whole step when one node's slurmd is gone; the other node gets in with a second step."""
    require_slurm()
    with build_slurm(2) as own:  # its own SLURM: this test breaks a node
        job_id = submit(own, "-N", "2", "--wrap", "sleep 3000")
        wait_state(own, job_id, "RUNNING")
        good, bad = own.compute_names
        for proc in own.computes[1].procs():
            if proc.comm == "slurmd":
                own.computes[1].run(["kill", "-9", str(proc.pid)])
        transport = SrunTransport(SrunOptions(job_id=job_id, env=own.env(), start_timeout=60))
        ok, failed = await asyncio.gather(transport.open(good), transport.open(bad), return_exceptions=True)
        try:
            assert isinstance(ok, WorkerConnection), ok
            assert ok.hello["hostname"] == good and any("second step" in w for w in ok.warnings)
            assert isinstance(failed, TransportError) and failed.code == "lost"
            assert f"failed on node {bad}" in str(failed) and str(failed).startswith(f"{bad}:")
        finally:
            if isinstance(ok, WorkerConnection):
                await ok.close()
            await transport.close()
        assert srun_processes() == []


# -- end to end: the hung torch job submitted with sbatch, investigated with --slurm over srun only ----------


@pytest.fixture(scope="module")
def hung_sbatch_job(slurm: SlurmCluster, torch_support: None,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Job]]:
    """The dataloader hang (the culprit blocks reading its batch, the others in all_reduce), 2 nodes x 2 ranks,
    launched the SLURM way: sbatch, then srun starts one torchrun per node."""
    workdir = tmp_path_factory.mktemp("sbatch-job")
    workdir.chmod(0o755)
    nodes, per_node, culprit, step = len(slurm.computes), 2, 3, 3
    job = Job("dataloader", culprit, step, nodes * per_node, list(slurm.computes), workdir,
              f"{MARK}={secrets.token_hex(4)}")
    launcher = [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--master_addr",
                slurm.computes[0].ip, "--master_port", "29500", "--nproc_per_node", str(per_node)]
    program = [str(JOB_SCRIPT), "--scenario", "dataloader", "--hang-step", str(step), "--culprit", str(culprit)]
    # one torchrun per node, its node rank from SLURM (expanded by the task's shell, not by ours)
    per_task = f'exec {shlex.join(launcher)} --node_rank "$SLURM_NODEID" {shlex.join(program)}'
    script = workdir / "job.sbatch"
    script.write_text(f"#!/bin/bash\nexec srun --nodes={nodes} --ntasks-per-node=1 bash -c {shlex.quote(per_task)}\n")
    env = {"HANGSCOPE_READY_FILE": str(job.ready_file), MARK: job.mark.split("=", 1)[1], "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(["sbatch", "--parsable", "-N", str(nodes), "--ntasks-per-node=1", "--job-name=hung",
                           f"--output={workdir}/job.log", str(script)], env=slurm.env(env), capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    try:
        try:
            job.wait_ready(120)
            job.wait_blocked(60)
        except BaseException:
            print((workdir / "job.log").read_text(errors="replace")[-3000:] if (workdir / "job.log").exists() else "")
            raise
        yield job_id, job
    finally:
        slurm.run("scancel", job_id, check=False)
        job.stop()


def test_hangscope_slurm_snapshot_over_srun_finds_every_rank_and_the_culprit(
        slurm: SlurmCluster, hung_sbatch_job: tuple[str, Job], tmp_path: Path) -> None:
    job_id, job = hung_sbatch_job
    assert all(not n.listening(22) for n in slurm.computes), "SSH must be off on the nodes for this test"
    out = tmp_path / "out.json"
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "app", "--slurm", job_id, "--transport", "srun", "--snapshot",
                          str(out)], env=slurm.env(), capture_output=True, text=True, timeout=240,
                         cwd=str(REPO), stdin=subprocess.DEVNULL)
    print(f"\nhangscope --slurm --transport srun --snapshot (2 samples), cold: {time.monotonic() - started:.2f} s\n"
          f"{res.stdout}")
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    assert f"job {job_id} (hung) of root: RUNNING, 2 node(s)" in res.stderr
    snap, analysis = snapshot_from_json(out.read_text())
    assert [(n.name, n.state) for n in snap.nodes] == [(n, "done") for n in slurm.compute_names]
    found = {r.rank: r for r in snap.ranks}
    assert sorted(found) == sorted(job.ranks)
    for rank, loc in job.ranks.items():
        r = found[rank]
        assert (r.node, r.pid, r.collected, r.error) == (loc.node, loc.pid, True, None)
        env = dict(r.env)
        assert env.get("SLURM_NODEID") == str(slurm.compute_names.index(loc.node)) and "SLURM_PROCID" in env
    first = analysis["findings"][0]
    assert first["ranks"] == [[job.ranks[job.culprit].node, job.ranks[job.culprit].pid]], first
    assert f"rank {job.culprit}" in res.stdout
    # the culprit's SLURM task ids next to its RANK: its node is the srun step's task 1 (node index 1)
    assert f"RANK {job.culprit}: SLURM_PROCID=1 SLURM_NODEID=1 SLURM_LOCALID=0" in res.stdout, res.stdout
    # the whole job (issue 16.3): on each node the srun step (slurmstepd) above torchrun above the two ranks, the
    # launchers never counted as ranks
    for node in slurm.compute_names:
        launchers = {p.kind: p for p in snap.processes if p.role == "launcher" and p.node == node}
        assert set(launchers) == {"srun", "torchrun"}, (node, launchers)
        ranks = sorted(r.pid for r in snap.ranks if r.node == node)
        assert sorted(launchers["torchrun"].of) == ranks and sorted(launchers["srun"].of) == ranks
        assert launchers["torchrun"].ppid == launchers["srun"].pid
        assert all(r.launcher == "torchrun" and r.launcher_pid == launchers["torchrun"].pid
                   for r in snap.ranks if r.node == node)
    assert srun_processes() == [] and node_workers(slurm) == []


def test_hangscope_watch_slurm_over_srun_captures_the_hung_job(slurm: SlurmCluster, hung_sbatch_job: tuple[str, Job],
                                                               tmp_path: Path) -> None:
    """`hangscope watch --slurm JOB --transport srun`: the job's nodes from SLURM, the cheap samples and the
    capture through one srun step (no SSH on the nodes); the hung job is captured, the headline names the culprit,
    --once ends the watch and nothing of it is left running, on the login side or in the allocation."""
    job_id, job = hung_sbatch_job
    assert all(not n.listening(22) for n in slurm.computes), "SSH must be off on the nodes for this test"
    out = tmp_path / "captures"
    res = subprocess.run([sys.executable, "-m", "app", "watch", "--slurm", job_id, "--transport", "srun",
                          "--every", "1", "--stall", "4", "--stall-start", "4", "--once", "--wait-start", "120",
                          "--out", str(out)], env=slurm.env(), capture_output=True, text=True, timeout=300,
                         cwd=str(REPO), stdin=subprocess.DEVNULL)
    print(f"\n{res.stdout}\n{res.stderr}")
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    assert "captured (hang)" in res.stdout
    (bundle,) = [p for p in out.iterdir() if p.is_dir()]
    doc = json.loads((bundle / "watch.json").read_text())
    assert doc["kind"] == "hang" and f"Rank {job.culprit}" in doc["headline"], \
        f"{doc['headline']}\nthe nodes' processes now (pid, comm, TracerPid): {node_tracers(slurm)}"
    snap, _ = snapshot_from_json((bundle / "snapshot.json").read_text())
    assert sorted(r.rank for r in snap.ranks if r.collected) == sorted(job.ranks)
    assert srun_processes() == [] and node_workers(slurm) == []


async def test_gpu_test_workers_open_in_the_allocation_over_srun(slurm: SlurmCluster, sleeper: str) -> None:
    job = resolve_job(sleeper, slurm.env())
    srun = SrunOptions(job_id=job.job_id, env=slurm.env(), start_timeout=60)
    conns, errors = await open_workers(host_specs(job, "srun"), SessionOptions(srun=srun))
    try:
        assert errors == {} and list(conns) == slurm.compute_names
        done = await conns[slurm.compute_names[0]].call(protocol.GPU_PORTS({"count": 2, "exclude": [], "low": 20000,
                                                                            "high": 30000}), timeout=30)
        assert len(done["ports"]) == 2
    finally:
        await close_workers(conns)
    assert srun_processes() == []
