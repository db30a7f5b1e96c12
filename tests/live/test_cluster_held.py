"""Live: a rank held by its process state on the test cluster, `hangscope HOSTS --print` over real SSH.

A healthy 2-node x 2-rank gloo job trains; one rank is then stopped with SIGSTOP, frozen by a real cgroup v2
`cgroup.freeze`, or frozen by a real v1 freezer cgroup, and the other three block in their next all_reduce
waiting for it. The headline must say what holds the rank, that the others wait for it and what resumes it;
no dump may run past the held deadline, nothing may claim a resume, and afterwards the rank is in exactly the
state it was (stopped stays stopped, frozen stays frozen, nothing traced). Each test releases the rank and
waits for the job to train again, so the tests share one job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

from app.model.codec import snapshot_from_json
from cluster import UNHURRIED_LOGIN, Cluster, run_login
from jobs import Job, _main_thread, start_job
from worker_targets import proc_state, tracer_pid
from waiting import wait_until
from workers import pstate
from workers.collect import pyspy

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]
HELD = 3  # node02, local rank 1: not the first rank, not on the first node
V2 = pstate.cgroup_mounts()[0]
V1 = pstate.cgroup_mounts()[1].get("freezer", "")


@pytest.fixture(scope="module")
def job_and_cluster(cluster_factory: Callable[..., Cluster]) -> Iterator[tuple[Job, Cluster]]:
    # a cluster of its own: the session's shared hung job must stay as it is, and a second job on the same
    # nodes would be another test (jobs)
    cluster = cluster_factory(2)
    job = start_job(cluster, "healthy", nodes=2, ranks_per_node=2, extra_args=["--step-delay", "0.2"])
    try:
        yield job, cluster
    finally:
        job.stop()
        cluster.close()


def others_blocked(job: Job) -> None:
    """Wait until the ranks other than HELD sit still in one syscall: they wait for the held one."""
    seen: dict[int, tuple] = {}

    def still() -> bool:
        ok = True
        for rank, loc in job.ranks.items():
            if rank == HELD:
                continue
            sample = _main_thread(loc.host_pid)
            assert sample is not None, f"rank {rank} exited:\n{job.log_tail()}"
            ok = ok and seen.get(rank) == sample and sample[1] != "running"
            seen[rank] = sample
        return ok

    wait_until(still, 60, "the other ranks to block waiting for the held one", interval=0.5)


def training_again(job: Job) -> None:
    """After the rank is released: every rank's CPU time and context switches move again."""
    first = {r: _main_thread(loc.host_pid) for r, loc in job.ranks.items()}
    wait_until(lambda: all(_main_thread(loc.host_pid) != first[r] for r, loc in job.ranks.items()), 60,
               "the job to train again")


def hangscope(cluster: Cluster, tmp: Path, *flags: str) -> tuple[str, object, dict]:
    hosts = tmp / "hosts.txt"
    hosts.write_text("".join(f"{n} slots=2\n" for n in cluster.names))
    out = tmp / f"snap-{uuid.uuid4().hex[:6]}.json"
    res = run_login([sys.executable, "-m", "app", str(hosts), *UNHURRIED_LOGIN, "--print", "--snapshot", str(out), *flags], cluster,
                    timeout=240, cwd=str(REPO))
    assert out.exists(), f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    snap, analysis = snapshot_from_json(out.read_text())
    assert analysis is not None
    return " ".join(res.stdout.split()), snap, analysis  # as one line: the summary wraps at 100 columns


def assert_held_report(stdout: str, snap: object, analysis: dict, job: Job, kind: str) -> None:
    loc = job.ranks[HELD]
    ranks = {r.rank: r for r in snap.ranks}  # type: ignore[attr-defined]
    assert sorted(ranks) == [0, 1, 2, 3], stdout
    held = ranks[HELD]
    assert held.hold is not None and held.hold.kind == kind, held.hold
    first = analysis["findings"][0]
    assert first["kind"] == kind and first["ranks"] == [[loc.node, loc.pid]], (first, stdout)
    assert first["confidence"] == "high"
    assert "the other 3 ranks wait for it" in first["title"], first["title"]
    # no tool spent its timeout on the held rank, and nothing claims a resume
    assert held.elapsed < pyspy.HELD_TIMEOUT + 2, held.elapsed
    assert not held.resumed and not any("SIGCONT" in a or "attached with ptrace" in a for a in held.actions)
    assert any("never attached" in a for a in held.actions), held.actions
    assert "resumed" not in stdout, stdout
    # no [high] network lead made of the held rank's silence
    assert not any(f["kind"] == "network_stall" and f["confidence"] == "high" for f in analysis["findings"])


def test_a_sigstopped_rank_is_the_headline_and_stays_stopped(job_and_cluster, tmp_path) -> None:
    job, cluster = job_and_cluster
    pid = job.ranks[HELD].host_pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: proc_state(pid) == "T", what="rank stopped")
        others_blocked(job)
        # --native and --strace: tools that attach; on the stopped rank neither may run nor wait
        stdout, snap, analysis = hangscope(cluster, tmp_path, "--native", "--strace", "0.5")
        assert_held_report(stdout, snap, analysis, job, "stopped")
        held = next(r for r in snap.ranks if r.rank == HELD)  # type: ignore[attr-defined]
        assert held.error is None and held.strace is None
        assert any(f"strace not run on pid {job.ranks[HELD].pid}: it is stopped" in a for a in held.actions), held.actions
        assert all(r.strace is not None for r in snap.ranks if r.rank != HELD)  # type: ignore[attr-defined]
        node_pid = job.ranks[HELD].pid
        assert stdout.startswith(f"hangscope: Rank {HELD} is stopped (SIGSTOP or job control); the other 3 ranks "
                                 f"wait for it; `kill -CONT {node_pid}` on node02 resumes it."), stdout
        assert "3 sleeping, rank 3 stopped; 0 progressing" in stdout, stdout  # the progress line
        assert proc_state(pid) == "T" and tracer_pid(pid) == 0  # exactly as it was
    finally:
        os.kill(pid, signal.SIGCONT)
    training_again(job)


@contextlib.contextmanager
def frozen(pid: int, version: int) -> Iterator[Path]:
    mount = V2 if version == 2 else V1
    if not mount:
        pytest.skip(f"no cgroup v{version} {'hierarchy' if version == 2 else 'freezer'} mounted on this machine")
    group = Path(mount) / f"hangscope-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    control, freeze, thaw = (("cgroup.freeze", "1", "0") if version == 2 else ("freezer.state", "FROZEN", "THAWED"))
    home = next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if (line.startswith("0::") if version == 2 else "freezer" in line.split(":")[1].split(",")))
    try:
        (group / "cgroup.procs").write_text(str(pid))
        (group / control).write_text(freeze)
        wait_until(lambda: is_frozen(group, version), what=f"cgroup v{version} frozen")
        yield group
    finally:
        (group / control).write_text(thaw)
        with contextlib.suppress(OSError):
            (Path(mount) / home.lstrip("/") / "cgroup.procs").write_text(str(pid))
        wait_until(lambda: not (group / "cgroup.procs").read_text().strip(), what="cgroup emptied")
        group.rmdir()


def is_frozen(group: Path, version: int) -> bool:
    if version == 2:
        return "frozen 1" in (group / "cgroup.events").read_text().splitlines()
    return (group / "freezer.state").read_text().strip() == "FROZEN"


@pytest.mark.parametrize("version", [2, 1], ids=["cgroup-v2-freeze", "cgroup-v1-freezer"])
def test_a_frozen_rank_is_the_headline_with_its_cgroup_and_stays_frozen(job_and_cluster, tmp_path,
                                                                        version: int) -> None:
    job, cluster = job_and_cluster
    pid = job.ranks[HELD].host_pid
    with frozen(pid, version) as group:
        others_blocked(job)
        state_before = proc_state(pid)
        # two samples: the progress line must name the frozen rank too
        stdout, snap, analysis = hangscope(cluster, tmp_path, "--samples", "2", "--interval", "0.5")
        assert_held_report(stdout, snap, analysis, job, "frozen")
        control = group / ("cgroup.freeze" if version == 2 else "freezer.state")
        thaw = f"echo {'0' if version == 2 else 'THAWED'} > {control}"
        assert stdout.startswith(f"hangscope: Rank {HELD} is frozen by the cgroup freezer (v{version} cgroup "
                                 f"/{group.name}); the other 3 ranks wait for it; thaw with `{thaw}` on node02."), stdout
        assert "uninterruptible" not in analysis["findings"][0]["title"]
        assert f"rank {HELD} frozen (cgroup freezer); 0 progressing" in stdout, stdout  # the progress line
        assert is_frozen(group, version) and proc_state(pid) == state_before and tracer_pid(pid) == 0
    training_again(job)
