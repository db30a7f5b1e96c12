"""The worker's progress counters (workers/collect/progress.py) on real processes: CPU, context switches,
run-queue wait, output written, a real CPU-capped cgroup's throttling; the socket byte counters from
sock_diag; and their parsing into the model, hostile values included."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from app.model import RankSnapshot, Snapshot
from app.model.codec import from_dict, snapshot_from_json, snapshot_to_json
from app.decode.replies import counters, rank_from_discover
from workers.collect import progress, sockets
from waiting import wait_until

SPIN = "import time\nt = time.time()\nwhile time.time() - t < 30: pass\n"
TALK = "import sys, time\nfor i in range(300):\n    print('x' * 99, flush=True); time.sleep(0.01)\ntime.sleep(30)\n"


@contextlib.contextmanager
def child(code: str, **kw: object) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", code], **kw)  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_spinning_process_moves_cpu_and_schedstat_and_time() -> None:
    with child(SPIN) as p:
        time.sleep(0.3)
        a = progress.collect(p.pid)
        time.sleep(0.5)
        b = progress.collect(p.pid)
    assert a is not None and b is not None
    assert b["at"] > a["at"]
    assert b["utime"] + b["stime"] > a["utime"] + a["stime"], "CPU time moved"
    assert b["run_ns"] > a["run_ns"] and b["wait_ns"] >= a["wait_ns"]
    assert b["nonvoluntary_ctxt"] >= a["nonvoluntary_ctxt"] and isinstance(b["voluntary_ctxt"], int)
    assert a["state"] in "RS"


# one line, then (once the test says go) 299 more, then quiet: each read is taken while the output stands still,
# so what one read takes from /proc/PID/io and from the file's position agree whatever the machine's load
STEPPED = ("import os, sys, time\nprint('x' * 99, flush=True)\n"
           "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
           "for i in range(299):\n    print('x' * 99, flush=True)\ntime.sleep(60)\n")


def test_output_to_a_file_is_counted_and_a_gone_process_gives_none(tmp_path: Path) -> None:
    log, go = tmp_path / "out.log", tmp_path / "go"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-c", STEPPED, str(go)], stdout=f, stderr=subprocess.STDOUT)
    try:
        # python starts slowly on a busy node
        wait_until(lambda: log.stat().st_size == 100, 30, "the child's first line", interval=0.05)
        a = progress.collect(proc.pid)
        go.touch()
        wait_until(lambda: log.stat().st_size == 30_000, 30, "the child's 300 lines", interval=0.05)
        b = progress.collect(proc.pid)
        pid = proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert a is not None and b is not None and (a["log_bytes"], b["log_bytes"]) == (100, 30_000)
    assert "wchar" in b and b["wchar"] >= b["log_bytes"]
    assert progress.collect(pid) is None


def test_output_to_a_pipe_is_not_counted() -> None:
    with child(TALK, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as p:
        time.sleep(0.2)
        got = progress.collect(p.pid)
    assert got is not None and "log_bytes" not in got


@pytest.fixture
def capped_cgroup() -> Iterator[tuple[Path, Path, int]]:
    """A real cgroup capped to 10 % of a CPU (v2 cpu.max where the cpu controller is there, else v1)."""
    if os.geteuid() != 0:
        pytest.skip("creating a cgroup needs root")
    v2 = Path("/sys/fs/cgroup")
    controllers = (v2 / "cgroup.controllers").read_text() if (v2 / "cgroup.controllers").exists() else ""
    root = v2 if "cpu" in controllers.split() else Path("/sys/fs/cgroup/cpu")
    path = root / f"hangscope-test-{secrets.token_hex(3)}"
    path.mkdir()
    if root == v2:
        (path / "cpu.max").write_text("10000 100000")
    else:
        (path / "cpu.cfs_period_us").write_text("100000")
        (path / "cpu.cfs_quota_us").write_text("10000")
    try:
        yield root, path, 10000
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(pid)
        for _ in range(50):
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_a_capped_cgroup_shows_its_limit_and_rising_throttling(capped_cgroup: tuple[Path, Path, int]) -> None:
    root, path, quota = capped_cgroup
    with child(SPIN) as p:
        (path / "cgroup.procs").write_text(str(p.pid))
        time.sleep(0.4)
        a = progress.collect(p.pid)
        time.sleep(0.8)
        b = progress.collect(p.pid)
    assert a is not None and b is not None
    cg = b["cgroup"]
    assert cg["path"] == "/" + path.name and cg["quota_us"] == quota and cg["period_us"] == 100000
    assert cg["nr_throttled"] > a["cgroup"]["nr_throttled"], "the spinner runs out of quota every period"
    assert cg["throttled_us"] > a["cgroup"]["throttled_us"]
    # an uncapped process: its own cgroup, no limit
    own = progress.collect(os.getpid())
    assert own is not None and own["cgroup"]["quota_us"] is None


def test_cgroup_files_are_parsed_for_both_versions() -> None:
    assert progress.parse_cgroup("12:cpu,cpuacct:/slurm/job1\n0::/user.slice/x\n") == ("/user.slice/x",
                                                                                       "/slurm/job1")
    assert progress.parse_cgroup("garbage\n") == (None, None)
    mountinfo = ("30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
                 "31 25 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
                 "32 25 0:27 /sub /mnt/cpu rw - cgroup cgroup rw,cpu\n")
    assert progress.cgroup_mounts(mountinfo) == ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/cpu")
    assert progress._ancestors("/a/b") == ["/a/b", "/a", "/"]


def test_socket_byte_counters_from_sock_diag() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    with server, client, peer:
        client.sendall(b"x" * 50_000)
        got = 0
        while got < 50_000:
            got += len(peer.recv(65536))
        time.sleep(0.05)
        table = sockets.netlink_table()
        if table is None:
            pytest.skip("sock_diag netlink is not allowed here")
        rows = {(r["local"], r["peer"]): r for r in sockets.for_pid(os.getpid(), None, table)}
        here, there = "%s:%d" % client.getsockname(), "%s:%d" % server.getsockname()
    assert rows[(here, there)]["bytes_acked"] >= 50_000
    assert rows[(there, here)]["bytes_received"] == 50_000
    assert sockets.parse_ss("ESTAB 0 0 10.0.0.1:5 10.0.0.2:6\n\t cubic bytes_acked:700 bytes_received:9 lastsnd:4\n"
                            )[("10.0.0.1:5", "10.0.0.2:6")] == {"bytes_acked": 700, "bytes_received": 9, "lastsnd": 4}


def test_hostile_counters_are_dropped_and_old_snapshots_load() -> None:
    assert counters(None) is None and counters({"utime": 1}) is None  # no time: useless
    c = counters({"at": 5.0, "state": "Rxx", "utime": -1, "stime": "2", "voluntary_ctxt": True, "wait_ns": 7,
                  "cgroup": {"path": "x" * 2000, "quota_us": -5, "nr_throttled": 3}})
    assert c is not None and c.state == "R" and c.utime is None and c.stime is None and c.voluntary_ctxt is None
    assert c.wait_ns == 7 and c.cgroup is not None and len(c.cgroup.path) == 512 and c.cgroup.quota_us is None
    r = rank_from_discover("n1", {"pid": 5, "start_time": 1, "counters": {"at": 1.0, "utime": 0.5},
                                  "sockets": [{"local": "a:1", "peer": "b:2", "state": "ESTABLISHED",
                                               "bytes_acked": 10, "bytes_received": -1}]})
    assert r.counters is not None and r.counters.utime == 0.5
    assert r.sockets[0].bytes_acked == 10 and r.sockets[0].bytes_received is None
    # a snapshot written before the counters existed has neither key: it loads, without them
    old = from_dict(RankSnapshot, {"node": "n1", "pid": 5, "start_time": 1,
                                   "sockets": [{"local": "a:1", "peer": "b:2", "state": "ESTABLISHED"}]})
    assert old.counters is None and old.sockets[0].bytes_acked is None
    snap, _ = snapshot_from_json(snapshot_to_json(Snapshot(taken_at=1.0, ranks=(r,))))
    assert snap.ranks[0].counters == r.counters
