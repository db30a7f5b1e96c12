"""The safety checks around every ptrace tool: the right process, not already traced, never left stopped.

Before a tool: the pid must still be the process that was discovered (start time), be alive, and have no
tracer. After: a target left stopped by the tool (and not stopped before) gets SIGCONT. A per-pid lock keeps
two ptrace tools of this worker (from concurrent requests) off one process.
"""

from __future__ import annotations

import os
import signal
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Tuple

from workers import procinfo, pstate

# A D state seen once may be a disk read that ends a moment later: it counts when it is still there this much later.
D_RECHECK = 0.05
OWN_TOOL_WAIT = 10.0  # seconds a tool of our own may keep a process traced before hold() reports it as it is


class CollectError(Exception):
    """Collection on one target cannot go on: target_exited, target_changed, already_traced, tool_missing."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def comm(pid: int) -> str:
    try:
        return procinfo.read_file("/proc/%d/comm" % pid, 256).decode("utf-8", "replace").strip()
    except OSError:
        return "?"


def tracer_pid(pid: int) -> int:
    value = procinfo.status_field(pid, "TracerPid") or "0"
    return int(value) if value.isdigit() else 0


def state(pid: int) -> str:
    """The one-letter state, or "" when the process is gone."""
    try:
        return procinfo.stat_fields(pid)[2]
    except (procinfo.Gone, OSError, IndexError):
        return ""


def check_before(pid: int, start_time: Optional[int], allow_tracer: bool = False) -> str:
    """The target's state letter; raises CollectError when it must not be touched."""
    try:
        fields = procinfo.stat_fields(pid)
    except (procinfo.Gone, OSError):
        raise CollectError("target_exited", "pid %d is gone" % pid)
    if start_time is not None and int(fields[21]) != start_time:
        raise CollectError("target_changed", "pid %d started at tick %s, not %d: it is another process now"
                          % (pid, fields[21], start_time))
    if fields[2] in ("Z", "X"):
        raise CollectError("target_exited", "pid %d has exited (zombie)" % pid)
    if not allow_tracer:
        tracer = tracer_pid(pid)
        if tracer and not pstate.ours(tracer):  # a tool of ours: the per-pid lock waits for it
            raise CollectError("already_traced", "pid %d is already traced by PID %d (%s)"
                              % (pid, tracer, comm(tracer)))
    return fields[2]


def check_after(pid: int, before: str, tool_killed: bool = False) -> Tuple[str, bool]:
    """(state after, resumed): SIGCONT a target the tool left stopped when it was not stopped before."""
    # The tool has been reaped, so the kernel has detached it; give a detach in flight a moment to land.
    # Only a stopped target can be one (stat is cheap; status, which has TracerPid, costs ~0.1 ms).
    after = state(pid)
    if after in ("T", "t"):
        deadline = time.monotonic() + 0.5
        while tracer_pid(pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        after = state(pid)
    if before in ("T", "t"):
        return after, False
    # A tool killed mid-attach can leave a group stop in flight: right after the detach the target shows R,
    # then stops for good. SIGCONT also discards a pending stop, so after a killed tool it is sent whatever
    # the state reads; a target that was running anyway only sees a SIGCONT it ignores by default.
    if after in ("T", "t") or (tool_killed and after):
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            return after, False
        now = state(pid) or after
        # resumed only when it was stopped and is no longer: SIGCONT does not thaw a frozen process
        return now, after in ("T", "t") and now not in ("T", "t")
    return after, False


def hold(pid: int, threads: Optional[List[Tuple[int, str]]] = None) -> Dict[str, Any]:
    """What holds the process (workers/pstate.py), with a D state checked twice: only a lasting one holds.
    A process traced by a tool of this worker's own (a dump of it still running beside a --nonblocking one) is
    not held by a debugger: its state is read again once that tool lets go (at most OWN_TOOL_WAIT seconds).
    threads: its threads' (tid, state) when already read."""
    info = pstate.read(pid, threads)
    deadline = time.monotonic() + OWN_TOOL_WAIT
    # traced, or still running with a tracer named: the kernel shows an attaching tracer before its stop lands
    while (info["kind"] == "traced" or info["tracer_pid"]) and _passing(info) and time.monotonic() < deadline:
        time.sleep(0.01)
        info = pstate.read(pid)
    if info["kind"] == "disk_sleep":
        time.sleep(D_RECHECK)
        info = pstate.read(pid)  # the threads read afresh too
    return info


def _passing(info: Dict[str, Any]) -> bool:
    """A tracing stop that is ours or already over: the tracer is a tool of this worker's, or it has let go (or
    gone) between the reads of the state letter and of TracerPid. A debugger's hold lasts; these do not."""
    tracer = info.get("tracer_pid") or 0
    return bool(info.get("tracer_ours")) or not tracer or not os.path.exists("/proc/%d" % tracer)


def refuse_held(pid: int, tool: str) -> None:
    """Raises CollectError(target_held) when a ptrace tool must not touch the process (pstate.HELD)."""
    info = hold(pid)
    if not pstate.held(info):
        return
    what = pstate.describe(info)
    if info["kind"] == "stopped":
        todo = "`kill -CONT %d` resumes it" % pid
    elif info["kind"] == "frozen":
        todo = "`%s` thaws it" % info["freezer"]["thaw"]
    elif info["kind"] == "traced":
        todo = "detach the tracer (PID %d) first" % info["tracer_pid"] if info["tracer_pid"] else "detach its tracer"
    else:
        todo = "it runs again when the kernel call returns"
    raise CollectError("target_held", "%s not run on pid %d: it is %s, and %s would %s; %s"
                       % (tool, pid, what, tool, "change that" if info["kind"] in ("stopped", "traced")
                          else "wait on it until its deadline", todo))


_locks: Dict[int, str] = {}
_locks_guard = threading.Lock()


class Exclusive:
    """`with Exclusive(pid, "strace"):` — raises CollectError(already_traced) if this worker already runs a
    ptrace tool on pid (the kernel allows one tracer; a second would fail in a less clear way)."""

    def __init__(self, pid: int, what: str) -> None:
        self.pid = pid
        self.what = what

    def __enter__(self) -> "Exclusive":
        with _locks_guard:
            holder = _locks.get(self.pid)
            if holder is not None:
                raise CollectError("already_traced", "pid %d is already being traced by this worker (%s)"
                                  % (self.pid, holder))
            _locks[self.pid] = self.what
        return self

    def __exit__(self, *exc: object) -> None:
        with _locks_guard:
            _locks.pop(self.pid, None)


class Shared:
    """The no-op counterpart of Exclusive, for tools that read memory without attaching."""

    def __enter__(self) -> "Shared":
        return self

    def __exit__(self, *exc: object) -> None:
        return None
