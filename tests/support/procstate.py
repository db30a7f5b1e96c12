"""What a process is doing now, in one line, for a test's failure message: a test that waited for a process in
vain says whether it was stopped, traced (and by whom), blocked with a signal pending or masked, and in which
cgroup, so that a failure seen once in CI can be told from a hang of the code under test."""

from __future__ import annotations

import os
from pathlib import Path

from waiting import wait_until


def _tracer(tracer_pid: str) -> str:
    """Who traces a process, from its status's TracerPid (a process in `t` state is stopped by one)."""
    if tracer_pid in ("", "0"):
        return "not traced"
    try:
        return f"traced by {tracer_pid}: " + Path(f"/proc/{tracer_pid}/cmdline").read_bytes().replace(
            b"\0", b" ").decode(errors="replace").strip()
    except OSError as e:
        return f"traced by {tracer_pid} ({e.strerror})"


def describe(pid: int) -> str:
    """State, kernel wait channel, system call, signals (pending, blocked, caught), tracer, cgroup, load."""
    base = Path(f"/proc/{pid}")
    try:
        stat = (base / "stat").read_text().rsplit(")", 1)[1].split()
        status = dict(line.split(":", 1) for line in (base / "status").read_text().splitlines() if ":" in line)
    except OSError as e:
        return f"pid {pid}: gone ({e.strerror})"
    parts = [f"pid {pid}: state {stat[0]}"]
    for name in ("wchan", "syscall", "cgroup"):
        try:
            text = (base / name).read_text().strip()
        except OSError:
            continue
        parts.append(f"{name} {text.split()[0] if name == 'syscall' and text else text.replace(chr(10), ' ')}")
    parts += [f"{k} {status[k].strip()}" for k in ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt",
                                                   "voluntary_ctxt_switches") if k in status]
    parts.append(_tracer(status.get("TracerPid", "").strip()))
    parts.append(f"load {' '.join(str(round(x, 1)) for x in os.getloadavg())}")
    return "; ".join(parts)


def wait_exec(pid: int, timeout: float = 10.0) -> None:
    """Wait until a process this test just started has finished its exec: Popen returns when the child's
    execve has replaced its memory, but the kernel sets up the new command line and environment a moment later,
    and until then /proc/PID/cmdline and /proc/PID/environ read as empty (seen on a loaded machine in 110 of
    300 spawns). A test that reads them (as discovery does) waits here first."""
    try:
        wait_until(Path(f"/proc/{pid}/cmdline").read_bytes, timeout, f"pid {pid}'s command line", interval=0.005)
    except TimeoutError as e:
        raise TimeoutError(f"{e}: {describe(pid)}") from None
