"""Collection through the real worker on stand-in ranks: py-spy dumps with locals and loops, /proc data,
strace, gdb, and every way a target can be gone, changed, traced or left stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

import testenv
from worker_client import WorkerProc
from worker_targets import (PROG, Target, alive, proc_state, rank_env, start_rank, tracer_pid, untouched, without_tool)
from waiting import wait_until
from workers import procinfo


def target_of(t: Target) -> dict:
    return {"pid": t.pid, "start_time": procinfo.start_time(t.pid)}


def dump_one(w: WorkerProc, t: Target, **opts: object) -> dict:
    items, done = w.call("dump", dict({"targets": [target_of(t)]}, **opts))
    assert done["type"] == "done" and done["data"]["count"] == 1, done
    assert len(items) == 1
    return items[0]


def thread_named(item: dict, name: str) -> dict:
    return next(t for t in item["pyspy"] if t["thread_name"] == name)


def test_dump_shows_where_each_thread_blocks_with_locals_loops_and_source() -> None:
    with start_rank(0) as t, WorkerProc() as w:
        item = dump_one(w, t, locals=True, loops=True, source_context=2)
        assert item["ok"] and item["error"] is None
        main = thread_named(item, "MainThread")
        assert [f["name"] for f in main["frames"][:2]] == ["wait_forever", "train"]
        train = main["frames"][1]
        assert {lc["name"]: lc["repr"] for lc in train["locals"]}["step"] == "3"
        key = "%s:%d" % (PROG, train["line"])
        (loop,) = item["loops"][key]
        assert loop["kind"] == "for" and loop["variables"] == ["step", "batch"]
        assert loop["header"] == "for step, batch in enumerate(loader):"
        spin = thread_named(item, "spinner")["frames"][1]
        (wloop,) = item["loops"]["%s:%d" % (PROG, spin["line"])]
        assert wloop["kind"] == "while" and wloop["counters"] == ["i"] and wloop["variables"] == []
        assert {lc["name"]: lc["repr"] for lc in spin["locals"]}["i"] == "7"
        src = item["source"][PROG]
        assert src[str(train["line"])].strip() == "wait_forever(\"train\")"
        assert str(train["line"] - 2) in src and str(train["line"] + 2) in src
        threads = item["procfs"]["threads"]
        assert len(threads) == 2 and all(th["syscall"] == "read" and th["state"] == "S" for th in threads)
        # left as it was, not stopped: right after py-spy detaches, the thread it woke may still be runnable (R)
        # on a busy machine before it blocks in read again
        assert item["state_before"] == "S" and item["state_after"] in ("S", "R") and item["resumed"] is False
        assert untouched(t.pid)


def test_native_dump_and_many_targets_stream_one_item_each() -> None:
    with start_rank(0) as a, start_rank(1) as b, WorkerProc() as w:
        items, done = w.call("dump", {"targets": [target_of(a), target_of(b)], "native": True,
                                      "concurrency": 2})
        assert sorted(i["pid"] for i in items) == sorted([a.pid, b.pid]) and done["data"]["count"] == 2
        for item in items:
            assert item["ok"], item["error"]
            frames = thread_named(item, "MainThread")["frames"]
            assert any(f["name"] == "wait_forever" for f in frames)
            assert any(f.get("module") for f in frames)  # native frames carry their shared object
        assert untouched(a.pid) and untouched(b.pid)


def test_pid_reuse_is_refused_without_touching_the_process() -> None:
    with start_rank(0) as t, WorkerProc() as w:
        target = target_of(t)
        target["start_time"] -= 1
        items, _ = w.call("dump", {"targets": [target]})
        assert items[0]["error"]["code"] == "target_changed" and items[0]["pyspy"] is None
        assert items[0]["procfs"] == {"threads": []}  # not even /proc is read for the wrong process
        _, err = w.call("strace", dict(target, seconds=0.2))
        assert err["code"] == "target_changed"


def test_exited_targets_are_reported_not_a_crash() -> None:
    with WorkerProc() as w:
        t = start_rank(0)
        gone = target_of(t)
        t.kill()
        items, done = w.call("dump", {"targets": [gone]})
        assert items[0]["error"]["code"] == "target_exited" and done["type"] == "done"
        # a rank that dies while the request is in flight: whichever step sees it, the answer is the same
        with start_rank(0) as t2:
            rid = w.send("dump", {"targets": [target_of(t2)], "native": True})
            t2.kill()
            items, done = w.wait(rid)
            assert done["type"] == "done"
            assert items[0]["ok"] or items[0]["error"]["code"] == "target_exited"
        _, err = w.call("gdb", dict(gone))
        assert err["code"] == "target_exited"


def test_already_traced_names_the_tracer() -> None:
    with start_rank(0) as t, WorkerProc() as w:
        tracer = subprocess.Popen(["strace", "-qq", "-p", str(t.pid), "-o", "/dev/null"],
                                  stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: tracer_pid(t.pid) == tracer.pid, what="strace attached")
            item = dump_one(w, t)
            assert item["error"]["code"] == "already_traced"
            assert "PID %d (strace)" % tracer.pid in item["error"]["message"]
            assert item["procfs"]["threads"]  # /proc data still comes back
            # --nonblocking does not attach, so it still works beside a tracer
            assert dump_one(w, t, nonblocking=True)["ok"]
        finally:
            tracer.kill()
            tracer.wait()
        wait_until(lambda: untouched(t.pid), what="target released")


def test_strace_output_is_capped_and_the_target_released() -> None:
    with Target([os.sys.executable, PROG, "busy"], env=rank_env(0)) as t, WorkerProc() as w:
        _, done = w.call("strace", {"pid": t.pid, "start_time": procinfo.start_time(t.pid), "seconds": 0.5,
                                    "max_lines": 20})
        d = done["data"]
        assert d["truncated"] is True and d["lines"] > 20
        lines = d["output"].splitlines()
        # the first and the last ten lines around one marker: the end shows what is still blocked
        assert len(lines) == 21 and lines[10].startswith("[truncated: ") and lines[10].endswith(" lines]")
        assert "read(3" in d["output"]  # the main thread's blocking read, begun before strace attached
        assert any("select(" in ln or "pselect6(" in ln for ln in lines)
        assert 0.5 <= d["elapsed"] < 5 and d["resumed"] is False
        wait_until(lambda: untouched(t.pid), what="strace detached")


def test_gdb_backtraces_all_threads_and_detaches() -> None:
    with start_rank(0) as t, WorkerProc() as w:
        _, done = w.call("gdb", dict(target_of(t), timeout=60))
        out = done["data"]["output"]
        assert "Thread 2" in out and "read" in out
        assert untouched(t.pid)  # detached, not left stopped
        # gdb's attach interrupted the rank's blocking read; the kernel restarts it on detach, so the rank runs for
        # a moment (longer on a busy machine) before it sleeps in the read again
        wait_until(lambda: proc_state(t.pid) == "S", what="the rank to sleep in its read again after gdb")


def test_ping_answers_during_a_long_strace_and_cancel_ends_it() -> None:
    with start_rank(0) as t, WorkerProc() as w:
        rid = w.send("strace", dict(target_of(t), seconds=120))
        tracer = wait_until(lambda: tracer_pid(t.pid), what="strace attached")
        _, pong = w.call("ping", timeout=5)
        assert pong["type"] == "done"
        _, done = w.call("cancel", {"target": rid}, timeout=10)
        assert done["data"]["cancelled"] is True
        _, err = w.wait(rid, timeout=10)
        assert err["type"] == "error" and err["code"] == "cancelled"
        wait_until(lambda: not alive(tracer), what="strace killed")
        wait_until(lambda: untouched(t.pid), what="target released")


def test_eof_kills_running_tools_and_releases_the_target() -> None:
    with start_rank(0) as t, WorkerProc() as w:
        w.send("strace", dict(target_of(t), seconds=120))
        tracer = wait_until(lambda: tracer_pid(t.pid), what="strace attached")
        assert w.close(timeout=10) == 0
        assert not alive(tracer)
        wait_until(lambda: untouched(t.pid), what="target released")


@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "no-setpriv"])
def test_a_sigkilled_worker_takes_its_tools_along(setpriv: bool, tmp_path) -> None:
    # With util-linux's setpriv the parent-death signal is set by `setpriv --pdeathsig` in front of the tool;
    # on a node without it, by a preexec hook in the forked child. Either way a SIGKILLed worker (no chance
    # to clean up) still takes its tools along.
    if not setpriv and os.getuid() != 0:
        pytest.skip("needs root for a mount namespace that hides setpriv")
    prefix = [] if setpriv else without_tool(str(tmp_path), "setpriv")
    if not setpriv:  # the namespace really has no usable setpriv
        assert subprocess.run(prefix + ["sh", "-c", "! test -s /usr/bin/setpriv"]).returncode == 0
    with start_rank(0) as t, WorkerProc(prefix=prefix) as w:
        _, done = w.call("dump", {"targets": [target_of(t)]})
        assert done["type"] == "done"
        w.send("strace", dict(target_of(t), seconds=120))
        tracer = wait_until(lambda: tracer_pid(t.pid), what="strace attached")
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait()
        wait_until(lambda: not alive(tracer), what="strace gone (PR_SET_PDEATHSIG)")
        wait_until(lambda: untouched(t.pid), what="target released")


def test_two_ptrace_tools_never_share_a_target() -> None:
    with start_rank(0) as t, WorkerProc() as w:
        rid = w.send("strace", dict(target_of(t), seconds=120))
        wait_until(lambda: tracer_pid(t.pid), what="strace attached")
        _, err = w.call("gdb", target_of(t))
        assert err["code"] == "already_traced"
        w.call("cancel", {"target": rid})
        w.wait(rid)


def test_oldest_supported_python_runs_every_op_stdlib_only() -> None:
    py39 = testenv.other_python("3.9")
    if not os.path.exists(py39):
        import pytest

        pytest.skip("no python3.9 here")
    with start_rank(0, ["--helper"]) as t, WorkerProc(python=py39, isolated=True) as w:
        assert w.hello["python"].startswith("3.9") and w.hello["psutil"] is False
        items, _ = w.call("discover")
        assert t.pid in {i["pid"] for i in items}
        item = w.call("dump", {"targets": [target_of(t)], "locals": True, "loops": True})[0][0]
        assert item["ok"] and item["loops"], item
        _, done = w.call("strace", dict(target_of(t), seconds=0.2))
        assert done["type"] == "done"
        assert untouched(t.pid)


def test_secrets_in_locals_never_leave_the_node() -> None:
    import json

    secret = "hf_" + "S3cr3t" * 6
    with start_rank(0, TARGET_SECRET=secret) as t, WorkerProc() as w:
        item = dump_one(w, t, locals=True)
        assert item["ok"] and secret not in json.dumps(item)
        frame = next(f for f in thread_named(item, "MainThread")["frames"] if f["name"] == "rank")
        assert {lc["name"]: lc["repr"] for lc in frame["locals"]}["hf_token"] == "***"


def test_a_held_collect_discovers_at_once_and_dumps_only_after_go_or_its_hold() -> None:
    """A cold pass: the session sends each node's collect as soon as it is connected, with `hold`; the worker
    discovers and reports at once, then waits for `go` (sent once every node has discovered) before it dumps."""
    with start_rank(0) as t, WorkerProc() as w:
        req = w.send("collect", {"pids": [t.pid], "hold": 60.0})
        seen: list = []
        while not any("discovered" in m["data"] for m in seen):
            msg = w.read()
            assert msg["id"] == req and msg["type"] == "item", msg
            seen.append(msg)
        with pytest.raises(TimeoutError):  # held: no dump while nobody said go (its hold is a minute)
            w.read(timeout=1.0)
        _, released = w.call("go", {"target": req})
        assert released["data"] == {"released": True}, released
        items, done = w.wait(req)
        assert done["type"] == "done" and [i["dump"]["pid"] for i in items if "dump" in i] == [t.pid], done
        assert untouched(t.pid)
        _, late = w.call("go", {"target": req})  # the collect is over: nothing to release
        assert late["data"] == {"released": False}, late
        started = time.monotonic()
        items, done = w.call("collect", {"pids": [t.pid], "hold": 0.5})  # no go: the hold runs out, then it dumps
        assert done["type"] == "done" and any("dump" in i for i in items), done
        assert time.monotonic() - started >= 0.5
