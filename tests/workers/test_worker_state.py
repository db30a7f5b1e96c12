"""State first, tools second, through the real worker on stand-in ranks: a SIGSTOPped rank, a rank frozen by a
real cgroup v2 `cgroup.freeze`, one frozen by a real v1 freezer cgroup (where this machine mounts one), and one in
real uninterruptible sleep (D) reading a file of a FUSE file system that never answers (tests/support/fuse_stall.py).
Each is read before any tool, dumped without ptrace within the short held deadline, never claimed resumed, and
left in exactly the state it was in; strace and gdb refuse it at once instead of spending their timeout."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from worker_client import WorkerProc
from worker_targets import Target, proc_state, rank_env, start_rank, tracer_pid, wait_blocked
from waiting import wait_until
from workers import procinfo, pstate
from workers.collect import pyspy

V2 = pstate.cgroup_mounts()[0]
V1 = pstate.cgroup_mounts()[1].get("freezer", "")


def target_of(pid: int) -> dict:
    return {"pid": pid, "start_time": procinfo.start_time(pid)}


@contextlib.contextmanager
def frozen(pid: int, version: int) -> Iterator[str]:
    """Freeze pid in a fresh cgroup (v2 cgroup.freeze or v1 freezer.state); thaw and remove it afterwards."""
    if os.getuid() != 0:
        pytest.skip("needs root to create cgroups")
    mount = V2 if version == 2 else V1
    if not mount:
        pytest.skip(f"no cgroup v{version} {'hierarchy' if version == 2 else 'freezer'} mounted here")
    name = f"hangscope-test-{uuid.uuid4().hex[:8]}"
    path = Path(mount) / name
    path.mkdir()
    home = next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if (line.startswith("0::") if version == 2 else "freezer" in line.split(":")[1].split(",")))
    control, freeze, thaw = (("cgroup.freeze", "1", "0") if version == 2 else ("freezer.state", "FROZEN", "THAWED"))
    try:
        (path / "cgroup.procs").write_text(str(pid))
        (path / control).write_text(freeze)
        wait_until(lambda: still_frozen("/" + name, version), what=f"cgroup v{version} frozen")
        yield "/" + name
    finally:
        (path / control).write_text(thaw)
        with contextlib.suppress(OSError):
            (Path(mount) / home.lstrip("/") / "cgroup.procs").write_text(str(pid))
        wait_until(lambda: not (path / "cgroup.procs").read_text().strip(), what="cgroup emptied")
        path.rmdir()


def still_frozen(cgroup: str, version: int) -> bool:
    if version == 2:
        return "frozen 1" in (Path(V2) / cgroup.lstrip("/") / "cgroup.events").read_text().splitlines()
    return (Path(V1) / cgroup.lstrip("/") / "freezer.state").read_text().strip() == "FROZEN"


def dump(w: WorkerProc, pid: int, **opts: object) -> tuple[dict, float]:
    t0 = time.monotonic()
    items, done = w.call("dump", dict({"targets": [target_of(pid)]}, **opts), timeout=60)
    took = time.monotonic() - t0
    assert done["type"] == "done" and len(items) == 1, done
    return items[0], took


def assert_dumped_without_ptrace(item: dict, took: float, kind: str, frames: bool = True) -> None:
    assert item["process"]["kind"] == kind, item["process"]
    assert item["ok"], item["error"]
    if frames:
        assert any(f["name"] == "wait_forever" for th in item["pyspy"] for f in th["frames"])
    assert item["resumed"] is False
    assert any("never attached" in a for a in item["actions"]), item["actions"]
    assert not any("attached with ptrace" in a or "SIGCONT" in a for a in item["actions"]), item["actions"]
    assert any(n.startswith("not attached: the process is") for n in item["notes"]), item["notes"]
    # the deadline the worker sets for a held process, with a wide margin for a loaded machine
    assert took < pyspy.HELD_TIMEOUT + 2, took


def assert_tools_refuse(w: WorkerProc, pid: int, phrase: str) -> None:
    for op, args in (("gdb", {"timeout": 30}), ("strace", {"seconds": 5})):
        t0 = time.monotonic()
        _, err = w.call(op, dict(target_of(pid), **args), timeout=60)
        took = time.monotonic() - t0
        assert err["type"] == "error" and err["code"] == "target_held", err
        assert phrase in err["message"] and "resumed" not in err["hint"], err
        assert took < 5, f"{op} spent {took:.1f} s on a held process"


def test_a_stopped_rank_is_dumped_without_ptrace_and_left_stopped() -> None:
    with start_rank(0) as t, WorkerProc() as w:
        wait_blocked(t.pid)
        os.kill(t.pid, signal.SIGSTOP)
        wait_until(lambda: proc_state(t.pid) == "T", what="stopped")
        try:
            for native in (False, True):
                item, took = dump(w, t.pid, native=native)
                assert_dumped_without_ptrace(item, took, "stopped")
                assert item["process"]["stopped_by"] == "signal"
                assert item["state_before"] == item["state_after"] == "T"
                if native:
                    assert any("native frames need ptrace" in n for n in item["notes"])
            assert_tools_refuse(w, t.pid, "kill -CONT %d" % t.pid)
            assert proc_state(t.pid) == "T" and tracer_pid(t.pid) == 0  # exactly as it was: stopped, not traced
        finally:
            os.kill(t.pid, signal.SIGCONT)


@pytest.mark.parametrize("version", [2, 1], ids=["cgroup-v2-freeze", "cgroup-v1-freezer"])
def test_a_frozen_rank_is_named_with_its_cgroup_never_waited_on_and_never_claimed_resumed(version: int) -> None:
    with start_rank(0) as t, WorkerProc() as w:
        wait_blocked(t.pid)
        with frozen(t.pid, version) as cgroup:
            before = proc_state(t.pid)
            item, took = dump(w, t.pid, native=True)
            assert_dumped_without_ptrace(item, took, "frozen")
            f = item["process"]["freezer"]
            assert f["version"] == version and f["cgroup"] == cgroup and f["state"] == "FROZEN"
            assert f["thaw"] == ("echo 0 > %s/cgroup.freeze" % (V2.rstrip("/") + cgroup) if version == 2 else
                                 "echo THAWED > %s/freezer.state" % (V1.rstrip("/") + cgroup))
            assert_tools_refuse(w, t.pid, f["thaw"])
            # exactly as it was: still frozen, same state letter, nothing attached
            assert still_frozen(cgroup, version) and proc_state(t.pid) == before and tracer_pid(t.pid) == 0


def test_the_timeout_hint_no_longer_claims_a_resume() -> None:
    from workers.protocol import ERROR_HINTS

    assert "checked and resumed" not in ERROR_HINTS["timeout"]
    assert "target_held" in ERROR_HINTS


def test_reading_the_state_of_a_running_process_attaches_nothing() -> None:
    with start_rank(0) as t:
        wait_blocked(t.pid)
        info = pstate.read(t.pid)
        assert info["kind"] == "sleeping" and not pstate.held(info) and info["freezer"] is None
        assert proc_state(t.pid) == "S" and tracer_pid(t.pid) == 0


FUSE_STALL = Path(__file__).resolve().parents[1] / "support" / "fuse_stall.py"


@contextlib.contextmanager
def stalled_file() -> Iterator[str]:
    """A file whose read never completes (a FUSE server that never answers READ); unmounted afterwards."""
    if os.getuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse to mount a FUSE file system")
    mountpoint = tempfile.mkdtemp(prefix="hangscope-fuse-")
    server = subprocess.Popen([sys.executable, str(FUSE_STALL), mountpoint], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        yield os.path.join(mountpoint, "stalled")
    finally:
        subprocess.run(["umount", "-l", mountpoint], check=False)  # aborts the pending reads' requests
        server.kill()
        server.wait()
        os.rmdir(mountpoint)


def test_a_rank_in_d_state_is_dumped_without_ptrace_and_named_with_the_file_it_waits_on() -> None:
    from app.decode import replies as parse
    from app.analysis import analyze
    from app.model import Snapshot

    with stalled_file() as path, Target([sys.executable, "-c", "import sys; print('ready', flush=True); "
                                         f"open({path!r}, 'rb').read(10)"], env=rank_env(0, WORLD_SIZE="1")) as t, \
            WorkerProc() as w:
        wait_until(lambda: proc_state(t.pid) == "D", what="the rank in D state, reading the stalled file")
        item, took = dump(w, t.pid, native=True)
        assert_dumped_without_ptrace(item, took, "disk_sleep", frames=False)
        assert any(f["name"] == "<module>" for th in item["pyspy"] for f in th["frames"])  # its stack, read anyway
        hold = item["process"]
        assert hold["syscall"] == "read" and hold["waits_on"] == path and hold["wchan"]
        assert_tools_refuse(w, t.pid, "kernel call returns")
        assert proc_state(t.pid) == "D" and tracer_pid(t.pid) == 0  # exactly as it was
        discovered, _ = w.call("discover", {"pids": [t.pid]})
        rank = parse.apply_dump(parse.rank_from_discover("node01", discovered[0]), item)
        top = analyze(Snapshot(taken_at=0.0, duration=0.0, ranks=(rank,))).findings[0]
        assert top.kind == "uninterruptible" and top.title == (
            f"rank 0 is in uninterruptible sleep (D): waiting on I/O or a driver ({path})")
        assert "(read on %s)" % path in top.detail


PIPE_WRITER = """
import os, subprocess, sys
shipper = subprocess.Popen(["sleep", "86400"], stdin=subprocess.PIPE)  # holds the read end, never reads
print("ready %d %d" % (os.getpid(), shipper.pid), flush=True)
def log_line():
    shipper.stdin.write(b"x" * (1 << 20))  # more than a pipe's buffer: blocks once the buffer is full
    shipper.stdin.flush()
log_line()
"""


def test_a_rank_blocked_writing_to_a_full_pipe_names_the_process_holding_its_read_end() -> None:
    """The worker reads which thread waits on which pipe, and finds the pipe's readers in /proc/*/fd (their
    access mode from fdinfo): the never-reading child, not the writer's own write end. The search attaches
    nothing; py-spy's own attach (the default dump) interrupts the write, which the kernel restarts on detach, so
    the writer is runnable for a moment after the dump before it blocks on the pipe again."""
    with Target([sys.executable, "-c", PIPE_WRITER], env=rank_env(0)) as t, WorkerProc() as w:
        writer, reader = int(t.ready[0]), int(t.ready[1])
        wait_until(lambda: "pipe" in procinfo.wchan(writer), what="the writer to block on the full pipe")
        item, _ = dump(w, writer)
        piped = item["process"]["pipe"]
        assert item["process"]["kind"] == "sleeping" and piped["syscall"] == "write"
        assert piped["pipe"] == os.readlink(f"/proc/{writer}/fd/{_fd_of(writer, piped['pipe'])}")
        (found,) = piped["readers"]
        assert (found["pid"], found["comm"], found["ppid"], found["cmdline"]) == (reader, "sleep", writer,
                                                                                    ["sleep", "86400"])
        assert found["state"] == "S" and piped["complete"] is True
        assert "searched /proc/*/fd for the pipe's readers" in item["actions"]
        assert tracer_pid(writer) == 0  # detached
        wait_until(lambda: "pipe" in procinfo.wchan(writer), what="the writer to block on the pipe again")
        os.kill(reader, signal.SIGKILL)


def _fd_of(pid: int, target: str) -> int:
    return next(int(fd) for fd in os.listdir(f"/proc/{pid}/fd") if os.readlink(f"/proc/{pid}/fd/{fd}") == target)


def _pyspy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(found):
        pytest.skip("py-spy not installed")
    return found


def test_a_rank_traced_by_a_dump_of_our_own_is_not_held_by_a_debugger() -> None:
    """A --nonblocking dump may run beside this worker's own blocking py-spy on the same rank (guard.Shared); the
    rank is then in a tracing stop with our py-spy as its tracer. That is not a debugger holding it: hold() waits
    for our tool to let go and reads the state then. A tracer that is not ours is still reported as one."""
    from workers.collect import guard
    spy = _pyspy()
    t = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.001)"])
    try:
        wait_until(lambda: proc_state(t.pid) in ("S", "R") and "time" in Path(f"/proc/{t.pid}/cmdline").read_text(),
                   20, "the target to start")
        time.sleep(0.3)  # past the interpreter's start-up
        # 4 s of readings at least, and on until one has caught our py-spy tracing the rank (the premise): on a
        # loaded machine few dumps start in 4 s and a reading lands inside one's short attach only by chance
        stop, give_up = time.monotonic() + 4, time.monotonic() + 90
        ours_seen = 0
        kinds = set()
        named: list = []  # readings that name our tool as the tracer (it attaches before its stop lands)
        tools = []
        while time.monotonic() < stop or (not ours_seen and time.monotonic() < give_up):
            if not tools or tools[-1].poll() is not None:  # a blocking dump of ours, one after another
                tools.append(subprocess.Popen([spy, "dump", "--pid", str(t.pid)], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
            ours_seen += bool(pstate.read(t.pid).get("tracer_ours"))
            held = guard.hold(t.pid)
            kinds.add(held["kind"])
            named.extend([held] if held["tracer_pid"] else [])
        for tool in tools:
            tool.wait(timeout=30)
        assert ours_seen, "the premise: our own py-spy was seen tracing the rank"
        assert kinds <= {"running", "sleeping"}, kinds
        assert named == [], named[:3]

        # a tracer that does not descend from this process (strace, reparented away from us): reported as it is
        if not shutil.which("strace"):
            return
        subprocess.run(["sh", "-c", f"strace -p {t.pid} -o /dev/null >/dev/null 2>&1 &"], check=True)
        try:
            wait_until(lambda: tracer_pid(t.pid) != 0, 20, "strace to attach")
            info = pstate.read(t.pid)
            assert info["tracer_pid"] and not info.get("tracer_ours"), info
        finally:
            tracer = tracer_pid(t.pid)
            if tracer:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(procinfo.status_field(tracer, "Tgid") or tracer), signal.SIGKILL)
            wait_until(lambda: tracer_pid(t.pid) == 0, 20, "strace to let go")
    finally:
        t.kill()
        t.wait()


def test_a_nonblocking_dump_beside_our_own_blocking_one_reports_no_thread_stopped() -> None:
    """The dump code itself (pyspy.dump, --nonblocking, in this process as in the worker) while a blocking py-spy
    of this process's own dumps the same rank in a loop: the letters it reads first may catch our tool's tracing
    stop; what it reports (the state before, every thread's letter, what holds the process) never says stopped."""
    from workers.collect import pyspy as pyspy_mod
    from workers.request import Request, Worker
    spy = _pyspy()
    t = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.001)"])
    try:
        wait_until(lambda: proc_state(t.pid) in ("S", "R"), 20, "the target to start")
        time.sleep(0.3)
        req = Request(Worker(lambda msg: None, {}), 1, "dump", {"nonblocking": True, "timeout": 10.0})
        opts = pyspy_mod.DumpOptions(req)
        stop, give_up = time.monotonic() + 6, time.monotonic() + 90  # 6 s and 5 dumps at least, whatever the load
        tools, items = [], []
        while time.monotonic() < stop or (len(items) < 5 and time.monotonic() < give_up):
            if not tools or tools[-1].poll() is not None:
                tools.append(subprocess.Popen([spy, "dump", "--pid", str(t.pid)], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
            items.append(pyspy_mod.dump(req, t.pid, procinfo.start_time(t.pid), opts))
        for tool in tools:
            tool.wait(timeout=30)
        assert len(items) >= 5
        for item in items:
            letters = [th["state"] for th in item["procfs"]["threads"]]
            assert item["state_before"] not in ("T", "t") and not set(letters) & {"T", "t"}, (item["state_before"],
                                                                                          letters)
            assert item["process"]["kind"] in ("running", "sleeping"), item["process"]
            # nor names our tool as its tracer: the kernel shows an attaching tracer before its stop lands
            assert not item["process"]["tracer_pid"], item["process"]
    finally:
        t.kill()
        t.wait()
