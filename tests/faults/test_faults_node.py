"""Fault matrix, on the node (worker level, this machine): a rank with 200 threads and deep stacks, and `sudo -n`
that needs a password. Both are produced for real: a real target process, a real sudo and a real other user."""

from __future__ import annotations

import base64
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from app.decode import replies as parse
from app.analysis import analyze
from app.model import Snapshot
from app.session import SessionOptions
from worker_client import WorkerProc
from worker_targets import Target, proc_state, rank_env, tracer_pid, untouched, wait_blocked
from waiting import wait_until
from workers import procinfo
from workers.collect import pyspy
import testenv

THREADS, DEPTH = 200, 120
PYSPY = str(testenv.PYSPY)

# Every thread recurses DEPTH frames deep, then blocks reading a pipe that never gets data; so does the main thread.
MANY_THREADS = textwrap.dedent(f"""
    import os, sys, threading
    sys.setrecursionlimit(10000)
    started, (never, _keep) = threading.Barrier({THREADS} + 1), os.pipe()
    def deep(n, tag):
        if n:
            return deep(n - 1, tag)
        started.wait()
        os.read(never, 1)
    for i in range({THREADS}):
        threading.Thread(target=deep, args=({DEPTH}, i), name="worker-%d" % i, daemon=True).start()
    started.wait()
    print("ready", os.getpid(), flush=True)
    os.read(never, 1)
""")


def _target(t: Target) -> dict:
    return {"pid": t.pid, "start_time": procinfo.start_time(t.pid)}


def test_200_threads_with_deep_stacks_are_dumped_whole_in_bounded_time_and_memory() -> None:
    with Target([sys.executable, "-c", MANY_THREADS], env=rank_env(0)) as t, WorkerProc() as w:
        wait_blocked(t.pid)
        # "bounded" is the deadline the dump was given and met, whole; 4x the CLI's default per-rank deadline
        # (--timeout), as a user on a busy node gives it: py-spy walking 200 x 120 frames with their locals took
        # 34 s beside two CPU burners and the other work of a shared machine, past the 30 s default
        deadline = 4 * SessionOptions().dump_timeout
        t0 = time.monotonic()
        items, done = w.call("dump", {"targets": [_target(t)], "locals": True, "loops": True, "timeout": deadline},
                             timeout=deadline + 30)
        took = time.monotonic() - t0
        assert done["type"] == "done", done
        (item,) = items
        assert item["ok"], item["error"]
        workers_ = [th for th in item["pyspy"] if str(th.get("thread_name", "")).startswith("worker-")]
        assert len(workers_) == THREADS
        assert all(sum(f["name"] == "deep" for f in th["frames"]) == DEPTH + 1 for th in workers_)
        assert took < deadline, f"one dump of {THREADS} deep threads took {took:.1f} s, past its {deadline:g} s deadline"
        assert untouched(t.pid)
        # the worker's peak memory on the node stays small: it streams the tool's output, it does not hoard it
        with open(f"/proc/{w.proc.pid}/status") as f:
            hwm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        assert hwm_kb < 150_000, f"worker peak RSS {hwm_kb} kB"
        # login side: parse and analyse the rank, as the UI would, without blowing up
        discovered, _ = w.call("discover", {"pids": [t.pid]})
        rank = parse.apply_dump(parse.rank_from_discover("local", discovered[0]), item)
        assert len(rank.threads) >= THREADS + 1
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t1 = time.process_time()  # this process's CPU: the analysis's own work, whatever else runs beside it
        analysis = analyze(Snapshot(taken_at=0.0, duration=0.0, ranks=(rank,)))
        assert time.process_time() - t1 < 5 and analysis.verdict
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # kB


def test_sudo_that_needs_a_password_is_named_and_never_prompts() -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to run the worker as another user")
    if shutil.which("sudo") is None:
        pytest.skip("sudo is not installed (tests/install-deps.sh installs it)")
    # the worker runs as `nobody`, who has no sudo rule: `sudo -n` must refuse, never ask
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    with Target([sys.executable, "-c", "import os, time; print('ready', os.getpid(), flush=True); "
                 "time.sleep(1000)"], env=rank_env(0)) as t, \
            WorkerProc(python="/usr/bin/python3", isolated=True, prefix=as_nobody) as w:
        assert w.hello["tools"]["sudo"] is not None
        with open(PYSPY, "rb") as f:  # nobody's python has no py-spy beside it: push ours, as the session does
            data = f.read()
        _, pushed = w.call("push_tool", {"name": "py-spy", "data_b64": base64.b64encode(data).decode(),
                                         "sha256": hashlib.sha256(data).hexdigest()}, timeout=60)
        assert pushed["type"] == "done", pushed
        # refused at once, no prompt waited on: a sudo that waited would hold each call until its tool's deadline
        # (killed there as a `timeout`), so each call ends with sudo's refusal before py-spy's deadline, the
        # shorter of the two (strace's is its seconds + 10 s); measured per call, not both together
        t0 = time.monotonic()
        item = w.call("dump", {"targets": [_target(t)], "sudo": True}, timeout=30)[0][0]
        assert time.monotonic() - t0 < pyspy.DEFAULT_TIMEOUT
        assert item["error"]["code"] == "sudo_password", item["error"]
        assert "password" in item["error"]["message"]
        assert "NOPASSWD" in item["error"]["hint"] and "sudo -n" in item["error"]["hint"]
        t0 = time.monotonic()
        _, err = w.call("strace", dict(_target(t), seconds=0.2, sudo=True), timeout=30)
        assert time.monotonic() - t0 < pyspy.DEFAULT_TIMEOUT
        assert err["code"] == "sudo_password", err
        assert untouched(t.pid)
    # and sudo itself, asked the same way from a terminal-less process, says so too
    res = subprocess.run([*as_nobody, "sudo", "-n", "true"], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=10)
    assert res.returncode != 0 and "password" in res.stderr


# A FAKE gdb, for a fault that cannot be produced on demand with the real one: a debugger wedged on its
# target. It stops the target, then really attaches with ptrace (strace) and never finishes.
FAKE_HANGING_GDB = b"""#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = -p ] && pid=$2; shift; done
kill -STOP "$pid"
exec strace -qq -p "$pid" -o /dev/null
"""


def test_a_hanging_gdb_is_killed_at_its_deadline_and_the_target_left_neither_stopped_nor_traced() -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    with Target([sys.executable, "-c", "import os; r, w = os.pipe(); print('ready', os.getpid(), flush=True); "
                 "os.read(r, 1)"], env=rank_env(0)) as t, WorkerProc() as w:
        wait_blocked(t.pid)
        _, pushed = w.call("push_tool", {"name": "gdb", "data_b64": base64.b64encode(FAKE_HANGING_GDB).decode(),
                                         "sha256": hashlib.sha256(FAKE_HANGING_GDB).hexdigest()}, timeout=30)
        assert pushed["type"] == "done", pushed
        t0 = time.monotonic()
        _, err = w.call("gdb", dict(_target(t), timeout=1.5), timeout=30)
        took = time.monotonic() - t0
        assert err["code"] == "timeout" and "gdb" in err["message"] and "killed" in err["message"], err
        assert 1.5 <= took < 8, took
        assert "target state after:" in err["message"]  # checked after the kill (resumed if it was stopped)
        wait_until(lambda: untouched(t.pid), what="the rank neither stopped nor traced: %s (state %s, tracer %s)"
                   % (err["message"], proc_state(t.pid), tracer_pid(t.pid)))

