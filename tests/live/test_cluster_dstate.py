"""Live: a rank in uninterruptible sleep (D) for real on a test cluster node, through the CLI over real SSH
(issue 16.4). The node mounts a FUSE file system whose one file never answers a read (tests/support/fuse_stall.py); a
rank process (RANK=0, WORLD_SIZE=1) reads it and sits in D. `hangscope node01 --print --strace 1 --gdb
--timeout 5` must name the state with its wait channel, the call and the file it waits on; dump it without
ptrace (py-spy --nonblocking, under the held deadline), run neither strace nor gdb on it (each recorded as not
run), and leave it exactly as it was (still D, not traced)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from app.model.codec import snapshot_from_json
from cluster import UNHURRIED_LOGIN, Cluster, run_login
from waiting import wait_until
from jobs import MARK, PYTHON, _kill_marked
from worker_targets import proc_state, tracer_pid
from workers.collect import pyspy

REPO = Path(__file__).resolve().parents[2]
FUSE_STALL = REPO / "tests" / "support" / "fuse_stall.py"
pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def d_state_rank(cluster_factory: Callable[..., Cluster]) -> Iterator[tuple[Cluster, int, int, str]]:
    """(cluster, the rank's pid in the node, its host pid, the stalled file) with the rank in D on node01."""
    cluster = cluster_factory(1)
    node = cluster.nodes[0]
    mountpoint = node.run(["mktemp", "-d", "/tmp/hangscope-fuse-XXXXXX"]).stdout.strip()
    path = f"{mountpoint}/stalled"
    server = node.spawn([PYTHON, str(FUSE_STALL), mountpoint], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    mark = "dstate-rank"
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        node.spawn([PYTHON, "-c", f"open({path!r}, 'rb').read(10)"],
                   env={"RANK": "0", "WORLD_SIZE": "1", MARK: mark})

        def reader() -> tuple[int, int] | None:
            for p in node.procs():
                try:
                    cmd = Path(f"/proc/{p.host_pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"stalled" in cmd and b"open(" in cmd and proc_state(p.host_pid) == "D":
                    return p.pid, p.host_pid
            return None

        pid, host_pid = wait_until(reader, 30, "the rank in D state, reading the stalled file", interval=0.1)
        yield cluster, pid, host_pid, path
    finally:
        node.run(["umount", "-l", mountpoint], check=False)  # aborts the pending read: the reader ends
        wait_until(lambda: not _kill_marked([node], f"{MARK}={mark}"), 15, "the D-state rank to die")
        server.kill()
        server.wait(timeout=10)
        node.run(["rmdir", mountpoint], check=False)


def test_a_d_state_rank_is_named_with_its_wait_and_file_and_no_blocking_tool_runs(d_state_rank, tmp_path) -> None:
    cluster, pid, host_pid, path = d_state_rank
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"{cluster.names[0]}\n")
    out = tmp_path / "snap.json"
    # --raw: the test reads back what was collected (the stalled file's path), not what a shared file may show
    res = run_login([sys.executable, "-m", "app", str(hosts), *UNHURRIED_LOGIN, "--print", "--snapshot", str(out),
                     "--raw", "--samples", "1", "--timeout", "5", "--strace", "1", "--gdb"], cluster, timeout=240,
                    cwd=str(REPO))
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    snap, analysis = snapshot_from_json(out.read_text())
    (rank,) = snap.ranks
    assert rank.pid == pid and rank.hold is not None
    hold = rank.hold
    assert (hold.kind, hold.syscall, hold.waits_on) == ("disk_sleep", "read", path) and hold.wchan, hold
    # the headline: the state, the file; the wait channel in the finding's detail
    headline = " ".join(res.stdout.split("\n\n", 1)[0].split())
    assert "rank 0 is in uninterruptible sleep (D)" in headline and path in headline, res.stdout
    assert f"in {hold.wchan} (read on {path})" in " ".join(res.stdout.split())
    assert analysis is not None and analysis["findings"][0]["kind"] == "uninterruptible"
    # dumped without ptrace, under the held deadline; strace and gdb not run on it, and said so
    assert rank.collected and rank.elapsed <= pyspy.HELD_TIMEOUT + 1.0, rank.elapsed
    assert not any("attached with ptrace" in a for a in rank.actions), rank.actions
    assert any("--nonblocking" in a for a in rank.actions), rank.actions
    assert rank.strace is None and rank.gdb is None
    refused = [a for a in rank.actions if "strace" in a or "gdb" in a]
    assert len(refused) == 2 and all("not" in a for a in refused), rank.actions
    assert not rank.resumed and "resumed" not in res.stdout.lower()
    # exactly as it was
    assert proc_state(host_pid) == "D" and tracer_pid(host_pid) == 0
