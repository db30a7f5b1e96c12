"""What hangscope leaves on a test-cluster node, and whether a rank is stopped or traced: read from /proc."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterable

WORKER_MARK = b"zlib.decompress(base64"  # the bootstrap stage every hangscope worker starts as (python3 -c)
TOOLS = ("py-spy", "strace", "gdb")


def cmdline(host_pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{host_pid}/cmdline").read_bytes()
    return b""


def leftovers(nodes: Iterable[object]) -> list[str]:
    """'node: pid comm' for every hangscope worker, tool it started, or ssh session still alive on the nodes."""
    found = []
    for node in nodes:
        for proc in node.procs():  # type: ignore[attr-defined]
            cmd = cmdline(proc.host_pid)
            session = cmd.startswith(b"sshd: ") and b"[listener]" not in cmd  # a connection's sshd, not the daemon
            if WORKER_MARK in cmd or proc.comm in TOOLS or session:
                found.append(f"{node.name}: {proc.pid} {proc.comm}")  # type: ignore[attr-defined]
    return found


def stopped_or_traced(host_pids: Iterable[int]) -> list[str]:
    """'pid: why' for every process (or thread) in a stopped state or with a tracer attached."""
    bad = []
    for pid in host_pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines()
                              if ":\t" in line)
                state, tracer = status.get("State", "?")[:1], status.get("TracerPid", "0").strip()
                if state in ("T", "t") or tracer != "0":
                    bad.append(f"{pid}/{task.name}: state {state}, tracer {tracer}")
    return bad
