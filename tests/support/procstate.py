"""What a process is doing now, in one line, for a test's failure message: a test that waited for a process in
vain says whether it was stopped, traced (and by whom), blocked with a signal pending or masked, and in which
cgroup, so that a failure seen once in CI can be told from a hang of the code under test."""

from __future__ import annotations

import os
from pathlib import Path


def tracer(pid: int) -> str:
    """Who traces `pid` now (a process in `t` state is stopped by one): "traced by PID: COMMAND", or ""."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        by = int(next(line.split()[1] for line in status.splitlines() if line.startswith("TracerPid:")))
        if not by:
            return ""
        return f"traced by {by}: " + Path(f"/proc/{by}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (OSError, StopIteration, ValueError) as e:
        return f"tracer unknown: {e}"


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
    parts.append(tracer(pid) or "not traced")
    parts.append(f"load {' '.join(str(round(x, 1)) for x in os.getloadavg())}")
    return "; ".join(parts)
