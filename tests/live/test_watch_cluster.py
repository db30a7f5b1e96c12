"""hangscope watch, live on the test cluster with a real torch gloo DDP job (4 nodes x 2 ranks,
tests/ddp_train.py), as a user runs it (the real CLI in the background, its output read as it comes):

- the healthy job watched for over a minute is never captured, and the watch costs each node little;
- a node whose sshd is killed (the watch's connection cut with it), or whose link to the login side is cut with
  iptables, is said lost, then reconnected;
- a rank stopped with SIGSTOP stalls the job: captured (the headline names the stopped rank), then resumed;
- a node capped to 3 % of a CPU: the job runs slow and is captured as slow, the node named as the analysis does
  (3 %, not the 10 % of test_oss_cluster: on this shared 2-core machine a rank often gets little more than
  10 % of a core anyway, and the job must fall well below half its rate whatever the load).

Jobs that hang for good are in test_watch_hang_cluster.py (a cluster of their own). Small --every and --stall
keep each test short (the defaults, 30 s and 120 s, are for users); the long healthy run is bench/watch.py --soak.
The watch runner is shared with that module (WatchRun, watching).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest

import jobs as jobs_mod
from cluster import Cluster
from cpu_cap import CpuCap
from jobs import REPO, Job, start_job
from waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]

DDP = Path(jobs_mod.__file__).resolve().parent / "ddp_train.py"  # beside jobs.py (tests/ or tests/support/)
EVERY, STALL = 2.0, 12.0
# The job trains on a small share of the CPU (its step a few ms of compute, then a sleep), so the other tests on
# this 2-core machine keep theirs; a rank capped to 3 % of a CPU still takes several times its step.
LIGHT = ("--width", "96", "--batch", "8", "--step-delay", "0.1")
LOGIN = ("--connect-timeout", "30")  # a loaded machine's key exchange is not what these tests are about


class WatchRun:
    """`hangscope watch ...` running in the background; its stdout read back as it grows."""

    def __init__(self, cluster: Cluster, tmp_path: Path, *args: str, hosts: Optional[Path] = None) -> None:
        self.out = tmp_path / f"watch-{time.monotonic_ns()}"
        self.log = tmp_path / f"{self.out.name}.log"
        hosts = hosts or cluster.hosts_file(tmp_path)
        argv = [sys.executable, "-m", "app", "watch", str(hosts), "--out", str(self.out), "-v", *LOGIN, *args]
        self.started = time.time()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, env=cluster.env(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=str(REPO))

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float, what: str = "") -> re.Match:
        def seen() -> Optional[re.Match]:
            found = re.search(pattern, self.text())
            if found is None and self.proc.poll() is not None:
                raise AssertionError(f"the watch exited {self.proc.returncode} before {what or pattern}:\n{self.text()}")
            return found

        try:
            return wait_until(seen, timeout, what or pattern, interval=0.2)
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or pattern}:\n{self.text()}") \
                from None

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.text()))

    def history(self) -> List[dict]:
        lines = []
        for name in ("history.1.jsonl", "history.jsonl"):
            path = self.out / name
            if path.exists():
                lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return lines

    def captures(self) -> List[Path]:
        return sorted(p for p in self.out.iterdir() if p.is_dir()) if self.out.exists() else []

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the watch did not exit within {timeout:.0f} s:\n{self.text()}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster(cluster_factory: Callable[..., Cluster]) -> Iterator[Cluster]:
    """A cluster of this module's own: the session cluster's hung job would be watched beside ours."""
    built = cluster_factory(4)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture(scope="module")
def training(cluster: Cluster) -> Iterator[Job]:
    """One healthy DDP job (tests/ddp_train.py) shared by the tests that leave it training."""
    job = start_job(cluster, "ddp-train", nodes=4, ranks_per_node=2, script=DDP, wait=False, timeout=240,
                    extra_args=LIGHT)
    try:
        yield job
    finally:
        job.stop()


@pytest.fixture
def watching(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., WatchRun]]:
    runs: List[WatchRun] = []

    def start(*args: str, hosts: Optional[Path] = None) -> WatchRun:
        runs.append(WatchRun(cluster, tmp_path, *args, hosts=hosts))
        return runs[-1]

    try:
        yield start
    finally:
        for run in runs:
            run.stop()
            print(f"\n--- {run.log.name} ---\n{run.text()}")


def steady(run: WatchRun, samples: int = 4, timeout: float = 120) -> None:
    """Wait until the watch has seen the job progress in `samples` samples (its rate reference is set)."""
    wait_until(lambda: run.count(r"sample in [0-9.]+ s: job \S+ progressing") >= samples, timeout,
               f"{samples} samples of the job progressing", interval=0.2)


def test_a_healthy_job_is_never_captured_and_the_watch_costs_little(watching, training: Job) -> None:
    """After the rate reference is set, three stall windows of watching (--stall 12) and no capture; bench/watch.py
    --only soak watches a healthy job with the defaults for as long as it is asked (30 minutes in its example)."""
    run = watching("--every", str(EVERY), "--stall", str(STALL))
    steady(run)
    started, watched = time.monotonic(), 3 * STALL + 4
    wait_until(lambda: time.monotonic() - started >= watched or run.proc.poll() is not None, watched + 15,
               f"{watched:.0f} s of watching", interval=0.5)
    assert run.proc.poll() is None, run.text()
    text = run.text()
    assert "capturing" not in text and run.captures() == [], text
    assert "following job" in text and run.count("following job") == 1
    samples = run.history()
    assert len(samples) >= 15  # the cost below is a median over them, per node
    costs = [share for s in samples for share in s["cost"].values()]
    assert len({n for s in samples for n in s["cost"]}) == 4, "every node's cost measured"
    # the worker's and its sshd's CPU per node at a sample every 2 s (15x the default rate); bench/watch.py
    # measures the default interval
    assert sorted(costs)[len(costs) // 2] < 0.05, f"median watch CPU per node {sorted(costs)[len(costs) // 2]:.3f}"
    for loc in training.ranks.values():
        with open(f"/proc/{loc.host_pid}/status") as f:
            assert "TracerPid:\t0" in f.read(), "no rank was traced"


@pytest.mark.parametrize("how", ["sshd", "link"])
def test_a_node_that_drops_is_said_lost_and_then_reconnected(watching, training: Job, cluster: Cluster,
                                                             how: str) -> None:
    """sshd: node02's sshd killed with its sessions (the watch's connection with it); link: everything between
    node02 and the login side dropped by iptables in node02's namespace (the job's own traffic goes on)."""
    run = watching("--every", str(EVERY), "--stall", "60")
    steady(run, 2)
    node = cluster["node02"]
    rules = [("INPUT", "-s", cluster.login_ip, "-j", "DROP"), ("OUTPUT", "-d", cluster.login_ip, "-j", "DROP")]
    if how == "sshd":
        node.kill_sshd(sessions=True)
    else:
        for rule in rules:
            node.iptables("-A", *rule)
    try:
        run.wait_for(r"node02: lost \(", 120, "node02 said lost")
    finally:
        if how == "sshd":
            node.start_sshd()
        else:
            for rule in rules:
                node.iptables("-D", *rule)
    run.wait_for(r"node02: reconnected after \d+", 150, "node02 reconnected")
    steady(run, run.count("progressing") + 2)
    assert "capturing" not in run.text(), "the job trained on while node02 could not be sampled"


def test_a_stalled_job_is_captured_and_said_to_resume(watching, training: Job) -> None:
    run = watching("--every", str(EVERY), "--stall", str(STALL), "--slow", "0")
    steady(run)
    stopped = training.ranks[3]
    os.kill(stopped.host_pid, signal.SIGSTOP)
    try:
        run.wait_for(r"has made no progress for", STALL + 60, "the stall")
        run.wait_for(r"captured \(hang\)", 180, "the capture")
    finally:
        os.kill(stopped.host_pid, signal.SIGCONT)
    match = run.wait_for(r"resumed: it progresses again after ([^\n]+) without progress", 120, "the resumption")
    assert match.group(1)
    headline = run.wait_for(r"hangscope: ([^\n]+)", 5).group(1)
    assert "Rank 3" in headline and "stopped" in headline, headline
    assert len(run.captures()) == 1


def test_a_throttled_node_is_captured_as_slow_and_named(watching, training: Job) -> None:
    run = watching("--every", str(EVERY), "--stall", str(STALL))
    steady(run, 6)
    pids = [loc.host_pid for loc in training.ranks.values() if loc.node == "node04"]
    with CpuCap(0.03) as cap:
        for pid in pids:
            cap.add(pid)
        run.wait_for(r"is slow: \d+% of its recent rate", STALL + 90, "the slow stretch")
        run.wait_for(r"captured \(slow\)", 180, "the slow capture")
    headline = run.wait_for(r"hangscope: ([^\n]+)", 5).group(1)
    assert "node04" in headline and "slow" in headline, headline
    assert "capturing" in run.text() and run.count("captured") == 1
