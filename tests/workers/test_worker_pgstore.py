"""The worker's store_ranks op (workers/collect/pgstore.py) against a real job's TCPStore: a 2-rank gloo job
started by torch.multiprocessing.spawn on this machine (tests/support/spawn_job.py, no RANK in any environment). The
store names each rank's gloo listener with its rank, by LIST_KEYS or, as on a torch without it, by CHECK; the
store's keys and values are the same after the reads as before (torch's own client says so); an endpoint that is
not a TCPStore, one that never answers, one that refuses, and a rank in another network namespace each end in a
clear store_unreadable error within the deadline."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

import testenv  # noqa: F401 (the interpreter and py-spy the worker uses)
from waiting import wait_until
from jobs import SpawnJob
from worker_client import WorkerProc
from workers.collect import sockets

pytestmark = pytest.mark.torch
# torch's own client: every key the store lists, with a digest of its value (GETNUMKEYS, LIST_KEYS, GET)
_STORE_CONTENT = """
import datetime, hashlib, json, sys
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=10))
keys = sorted(s.list_keys())
print(json.dumps({"num_keys": s.num_keys(), "keys": {k: hashlib.sha256(s.get(k)).hexdigest() for k in keys}}))
"""


@pytest.fixture(scope="module")
def job(local_spawn_job: SpawnJob) -> tuple[int, dict[int, int]]:
    """(the store's port, rank -> pid) of the session's hung 2-rank mp.spawn job on this machine (read only)."""
    return local_spawn_job.port, local_spawn_job.ranks


def _listeners(pid: int) -> list[str]:
    return [row["local"] for row in sockets.for_pid(pid) if row["state"] == "LISTEN"
            and not row["local"].startswith(("0.0.0.0:", "[::]:"))]


def _content(port: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _STORE_CONTENT, str(port)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProc]:
    with WorkerProc() as w:
        yield w


def _ask(worker: WorkerProc, args: dict, timeout: float = 60) -> dict:
    _, done = worker.call("store_ranks", args, timeout=timeout)
    return done


def test_the_store_names_each_ranks_gloo_listener_with_its_rank(job, worker) -> None:
    port, pids = job
    listeners = {pid: _listeners(pid) for pid in pids.values()}
    assert all(len(v) == 1 for v in listeners.values()), listeners  # gloo's one listener per rank
    before = _content(port)
    for list_keys, how in ((True, "LIST_KEYS"), (False, "CHECK")):  # CHECK: a torch without LIST_KEYS
        done = _ask(worker, {"store": f"127.0.0.1:{port}", "pid": pids[0], "list_keys": list_keys,
                             "listeners": [lst for v in listeners.values() for lst in v] + ["127.0.0.1:1"]})
        assert done["type"] == "done", done
        data = done["data"]
        assert data["how"] == how and data["read"] == 2, data
        assert data["ranks"] == {listeners[pid][0]: number for number, pid in pids.items()}, data
    # read-only: every key and value as before, and the ranks still wait where they were
    assert _content(port) == before
    assert all(Path(f"/proc/{pid}").exists() for pid in pids.values())


def test_an_endpoint_that_is_not_a_store_is_refused_with_why(job, worker) -> None:
    _, pids = job
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held: list[socket.socket] = []

    def serve(answer: bytes) -> None:
        conn, _ = server.accept()
        held.append(conn)
        if answer:
            conn.recv(64)
            conn.sendall(answer)

    addr = "127.0.0.1:%d" % server.getsockname()[1]
    try:
        t = threading.Thread(target=serve, args=(b"HTTP",))  # answers, but not with the ping's nonce
        t.start()
        done = _ask(worker, {"store": addr, "pid": pids[0], "listeners": [], "timeout": 2.0})
        t.join(10)
        assert done["type"] == "error" and done["code"] == "store_unreadable", done
        assert "not a TCPStore" in done["message"] and addr in done["message"], done
        t = threading.Thread(target=serve, args=(b"",))  # accepts and never answers: the deadline ends it
        t.start()
        started = time.monotonic()
        done = _ask(worker, {"store": addr, "pid": pids[0], "listeners": [], "timeout": 0.5})
        t.join(10)
        assert done["type"] == "error" and done["code"] == "store_unreadable", done
        assert "no answer within 0.5 s" in done["message"], done
        assert time.monotonic() - started < 30  # the 0.5 s deadline, not a hang (generous for a loaded machine)
    finally:
        for c in held:
            c.close()
        server.close()
    with socket.socket() as s:  # nothing listens there any more
        s.bind(("127.0.0.1", 0))
        closed = "127.0.0.1:%d" % s.getsockname()[1]
    done = _ask(worker, {"store": closed, "pid": pids[0], "listeners": []})
    assert done["type"] == "error" and done["code"] == "store_unreadable" and "refused" in done["message"], done


def test_a_rank_in_another_network_namespace_is_not_asked_from_here(worker) -> None:
    if os.geteuid() != 0:
        pytest.skip("creating a network namespace needs root")  # the suite runs as root (tests/README.md)
    proc = subprocess.Popen(["unshare", "--net", "sleep", "300"])
    try:
        wait_until(lambda: os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink("/proc/self/ns/net"), 10,
                   "the child in its own network namespace")
        done = _ask(worker, {"store": "127.0.0.1:29500", "pid": proc.pid, "listeners": []})
        assert done["type"] == "error" and done["code"] == "store_unreadable", done
        assert "another network namespace" in done["message"], done
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("args", [
    {"store": "127.0.0.1:1", "listeners": [], "pid": "1"},
    {"store": 7, "listeners": [], "pid": 1},
    {"store": "127.0.0.1:1", "listeners": "x", "pid": 1},
    {"store": "127.0.0.1:1", "listeners": [1], "pid": 1},
])
def test_bad_arguments_are_a_bad_request(worker, args: dict) -> None:
    done = _ask(worker, args)
    assert done["type"] == "error" and done["code"] == "bad_request", done
