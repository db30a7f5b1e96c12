"""The demo job's scenarios hang (or progress) exactly as app/demo/job.py promises, across nodes and locally."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from cluster import PYSPY, Cluster
from jobs import Job, _main_thread, start_job, start_local_job
from waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support"),
              pytest.mark.per_worker_fixtures("each test starts and stops its own job; they share a 2-node cluster")]

ALL_REDUCE = "all_reduce (torch/distributed/distributed_c10d.py:"


def local_dump(pid: int, *flags: str) -> str:
    return subprocess.run([str(PYSPY), "dump", *flags, "--pid", str(pid)], capture_output=True, text=True,
                          timeout=30, check=True).stdout


def main_thread_frames(dump: str) -> list[str]:
    """The main thread's frames as 'function (file:line)', innermost first, from a plain py-spy dump."""
    lines = dump.split('"MainThread"', 1)[1].splitlines()[1:]
    frames = []
    for line in lines:
        if not line.startswith("    ") or line.startswith("Thread "):
            break
        if not line.startswith("     "):  # deeper indentation: Arguments/Locals blocks of --locals
            frames.append(line.strip())
    return frames


def train_step(dump: str) -> int:
    """The `step` local of train() in a `py-spy dump --locals` output."""
    section = dump.split("    train (", 1)[1]
    match = re.search(r"^\s+step: (\d+)$", section, re.MULTILINE)
    assert match, section[:800]
    return int(match.group(1))


def test_skip_puts_every_rank_on_the_same_line_one_step_apart() -> None:
    job = start_local_job("skip", nproc=3)
    try:
        assert job.culprit == 2
        assert {r: loc.step for r, loc in job.ranks.items()} == {0: 3, 1: 3, 2: 4}
        dumps = {r: local_dump(loc.host_pid, "--locals") for r, loc in job.ranks.items()}
        frames = {r: main_thread_frames(d) for r, d in dumps.items()}
        assert frames[0] == frames[1] == frames[2]  # identical stacks, to the line
        assert frames[0][0].startswith("all_reduce (") and any(f.startswith("train (") for f in frames[0])
        assert {r: train_step(d) for r, d in dumps.items()} == {0: 3, 1: 3, 2: 4}
    finally:
        job.stop()
    assert job_processes(job) == []


def test_healthy_job_keeps_making_progress() -> None:
    job = start_local_job("healthy", nproc=2)
    try:
        pid = job.ranks[0].host_pid
        first = train_step(local_dump(pid, "--locals"))
        wait_until(lambda: train_step(local_dump(pid, "--locals")) >= first + 3, 30, "the healthy job to train on")
    finally:
        job.stop()
    assert job_processes(job) == [] and _main_thread(pid) is None


@pytest.fixture(scope="module")
def pair(cluster_factory: Callable[..., Cluster]) -> Iterator[Cluster]:
    """Two nodes for the jobs that break things here, one after the other (each test stops its job and undoes
    what it did): not the session cluster, whose shared hung job must stay as it is; one build, not one each."""
    cluster = cluster_factory(2)
    try:
        yield cluster
    finally:
        cluster.close()


def test_die_leaves_the_others_waiting_in_all_reduce(pair: Cluster) -> None:
    cluster = pair
    job = start_job(cluster, "die", nodes=2, ranks_per_node=1)
    try:
        assert job.culprit == 1 and job.ranks[1].where == "exit" and job.ranks[1].node == "node02"
        node2 = cluster["node02"]
        # the rank is gone; nothing left on its node claims to be rank 1 (the socket holder has no RANK)
        assert job.ranks[1].pid not in node2.pids()
        holders = [pid for pid in job_processes(job) if b"socket_holder.py" in cmdline(pid)]
        assert len(holders) == 1
        for proc in node2.procs():
            with contextlib.suppress(OSError):
                assert b"RANK=1" not in Path(f"/proc/{proc.host_pid}/environ").read_bytes().split(b"\0"), proc
        dump = cluster["node01"].run(["py-spy", "dump", "--pid", str(job.ranks[0].pid)]).stdout
        assert main_thread_frames(dump)[0].startswith("all_reduce (")
        # stopping the job by any means (here: every other process of it killed) ends the holder too
        for pid in job_processes(job):
            if pid not in holders:
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: _main_thread(holders[0]) is None, 30, "the socket holder to exit once its peers are gone")
    finally:
        job.stop()
    assert job_processes(job) == []


def test_netcut_hangs_every_rank_in_all_reduce(pair: Cluster) -> None:
    cluster = pair
    job = start_job(cluster, "netcut", nodes=2, ranks_per_node=1)
    node2 = cluster["node02"]
    rules = [("INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"), ("INPUT", "-j", "DROP"),
             ("OUTPUT", "-p", "tcp", "--sport", "22", "-j", "ACCEPT"), ("OUTPUT", "-j", "DROP")]
    try:
        for chain, *rule in rules:
            node2.iptables("-A", chain, *rule)
        job.wait_blocked(timeout=60)
        steps = []
        for loc in job.ranks.values():
            dump = cluster[loc.node].run(["py-spy", "dump", "--locals", "--pid", str(loc.pid)]).stdout
            assert main_thread_frames(dump)[0].startswith("all_reduce ("), dump
            steps.append(train_step(dump))
        # ring all_reduce: a rank that got all its data before the cut may be one step further
        assert max(steps) - min(steps) <= 1
    finally:
        for chain, *rule in rules:
            node2.iptables("-D", chain, *rule)
        job.stop()
    assert job_processes(job) == []


def cmdline(host_pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{host_pid}/cmdline").read_bytes()
    return b""


def job_processes(job: Job) -> list[int]:
    """Host pids of the live processes that carry the job's mark, on every place it ran."""
    found = []
    for place in job.places:
        for proc in place.procs():
            try:
                environ = Path(f"/proc/{proc.host_pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if job.mark.encode() in environ and _main_thread(proc.host_pid) is not None:
                found.append(proc.host_pid)
    return found
