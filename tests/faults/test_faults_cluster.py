"""Fault matrix on the SSH test cluster, through the real CLI: hangscope SIGKILLed or interrupted (Ctrl+C once,
twice) mid-collection, a node's sshd killed mid-collection. After each, every node's process list is checked:
no worker, no tool and no ssh session of hangscope may stay, and no rank of the shared hung job may be left
stopped or traced. Each test restores what it breaks (sshd)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.model.codec import snapshot_from_json
from waiting import wait_until
from faults_nodes import cmdline, leftovers, stopped_or_traced

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
STRACE_SECONDS = "8"  # long enough to act while every node's worker has strace attached to a rank


def _start(cluster, *args: str, stderr: object = subprocess.PIPE) -> subprocess.Popen[str]:
    """hangscope in its own session (a signal to it is a signal to it alone), output captured."""
    return subprocess.Popen([sys.executable, "-m", "app", *args], env=cluster.env(), cwd=str(REPO), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                            start_new_session=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def _strace_on(node) -> bool:
    """strace attached to a rank (`strace -f -p PID`), not the worker's `strace -V` probe at start."""
    return any(p.comm == "strace" and b"-p\0" in cmdline(p.host_pid) for p in node.procs())


def _job_pids(hung_job) -> list[int]:
    return [loc.host_pid for loc in hung_job.ranks.values()]


def _clean_within(cluster, hung_job, seconds: float) -> float:
    """Seconds until nothing of hangscope is left on any node and no rank is stopped or traced."""
    t0 = time.monotonic()
    wait_until(lambda: not leftovers(cluster.nodes) and not stopped_or_traced(_job_pids(hung_job)), seconds,
         "nothing of hangscope left on the nodes")
    return time.monotonic() - t0


def _job_hosts(cluster, hung_job, tmp_path: Path) -> Path:
    return cluster.hosts_file(tmp_path, sorted({loc.node for loc in hung_job.ranks.values()}))


def test_sigkilled_hangscope_leaves_nothing_on_any_node(cluster, hung_job, tmp_path) -> None:
    assert not leftovers(cluster.nodes), "a previous test left hangscope processes behind"
    proc = _start(cluster, str(_job_hosts(cluster, hung_job, tmp_path)), "--print", "-q", "--samples", "1",
                  "--strace", "30")
    try:
        wait_until(lambda: all(_strace_on(n) for n in cluster.nodes) or proc.poll() is not None, 60,
             "strace attached on every node")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGKILL)  # no handler, no cleanup of its own: only the nodes can clean up
        proc.wait(timeout=10)
        took = _clean_within(cluster, hung_job, 10)
    finally:
        _stop(proc)
    print(f"\nnodes clean {took:.2f} s after hangscope was SIGKILLed mid-strace")


def test_ctrl_c_once_keeps_partial_data_exits_130_and_leaves_nothing(cluster, hung_job, tmp_path) -> None:
    out = tmp_path / "partial.json"
    proc = _start(cluster, str(_job_hosts(cluster, hung_job, tmp_path)), "--snapshot", str(out), "-q",
                  "--samples", "1", "--strace", "30")
    try:
        wait_until(lambda: any(_strace_on(n) for n in cluster.nodes) or proc.poll() is not None, 60, "strace attached")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
        assert time.monotonic() - t0 < 10, "a cancel must not wait for the 30 s strace"
        assert proc.returncode == 130, stderr
        assert "cancelling" in stderr
        snap, _ = snapshot_from_json(out.read_text())  # what arrived is kept
        assert snap.interrupted and len(snap.ranks) == len(hung_job.ranks)
        assert all(r.main_thread is not None and r.main_thread.frames for r in snap.ranks), "stacks kept"
        assert "rank" in stdout  # the summary of what arrived is printed
        _clean_within(cluster, hung_job, 10)
    finally:
        _stop(proc)


def test_ctrl_c_twice_aborts_with_130_and_leaves_nothing(cluster, hung_job, tmp_path) -> None:
    err = tmp_path / "stderr.txt"
    with open(err, "w") as err_file:
        proc = _start(cluster, str(_job_hosts(cluster, hung_job, tmp_path)), "--print", "-q", "--samples", "1",
                      "--strace", "30", stderr=err_file)
    try:
        wait_until(lambda: any(_strace_on(n) for n in cluster.nodes) or proc.poll() is not None, 60, "strace attached")
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: "cancelling" in err.read_text(), 10, "the first Ctrl+C to be taken")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)
        assert proc.returncode == 130, err.read_text()
        assert "aborted" in err.read_text()
        _clean_within(cluster, hung_job, 10)
    finally:
        _stop(proc)


def test_sshd_killed_mid_collection_is_lost_and_keeps_partial_data(cluster, hung_job, tmp_path) -> None:
    node = cluster["node02"]
    out = tmp_path / "lost.json"
    proc = _start(cluster, str(_job_hosts(cluster, hung_job, tmp_path)), "--snapshot", str(out), "-q",
                  "--samples", "1", "--strace", STRACE_SECONDS)
    try:
        wait_until(lambda: _strace_on(node) or proc.poll() is not None, 60, "strace attached on node02")
        node.kill_sshd(sessions=True)  # the node's sshd and every session it serves: the connection drops
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 1, stderr  # partial, not a crash
        snap, _ = snapshot_from_json(out.read_text())
        states = {n.name: n for n in snap.nodes}
        assert states["node02"].state == "partial", states["node02"]
        assert states["node02"].error.code == "lost" and "node02" in states["node02"].error.message
        assert all(s.state == "done" for name, s in states.items() if name != "node02")
        lost = [r for r in snap.ranks if r.node == "node02"]
        assert len(lost) == 2 and len(snap.ranks) == len(hung_job.ranks)
        for r in lost:  # the stacks taken before the loss are kept, marked partial with the reason
            assert r.partial and r.error is not None and r.error.code == "lost"
            assert r.main_thread is not None and r.main_thread.frames
        assert not snap.complete
        wait_until(lambda: not leftovers([node]) and not stopped_or_traced(_job_pids(hung_job)), 10,
             "node02 clean after its sessions were killed")
    finally:
        _stop(proc)
        node.start_sshd()
