"""What a test leaves behind: child processes (anywhere below the pytest process), Python threads and open file
descriptors that were not there when it started (the autouse fixture in conftest.py fails the test with them).

Fixtures of a wider scope (the shared cluster, hung_job, a module's cluster) are set up before a test's own
function-scoped fixtures and torn down after them, so what they hold is in the "before" picture and is never
counted against a test. Something a test ends asynchronously (a killed process being reaped, a thread
finishing, an sshd session child after its channel closed) is given a grace period to go.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, Iterable, List, Set, Tuple

import psutil

from waiting import wait_until
from workers import procinfo

GRACE_S = 10.0  # generous: a loaded 2-core machine may take seconds to reap a process tree

# Daemons of wider-scoped fixtures that a test may restart (a shared cluster node's sshd, killed and started
# again by a fault test): each source gives their pids now; they and their direct children (sshd's listener)
# belong to the fixture, not to the test. Their sessions (grandchildren) are still the test's.
_DAEMONS: List[Callable[[], Iterable[int]]] = []


def daemons(source: Callable[[], Iterable[int]]) -> None:
    _DAEMONS.append(source)


def _exempt() -> Set[int]:
    pids: Set[int] = set()
    for source in _DAEMONS:
        for pid in source():
            pids.add(pid)
            with contextlib.suppress(psutil.Error):
                pids.update(c.pid for c in psutil.Process(pid).children())
    return pids


@dataclass(frozen=True)
class Picture:
    # (pid, start in clock ticks after boot): a reused pid is another process. Not psutil's create_time(), which
    # adds the boot time read again from /proc/stat at every call: the kernel derives that from the wall clock,
    # so a clock step (a VM's clock set again under load) moved every process's create time at once, and every
    # child, the session's clusters and jobs included, read as new and was killed as a leak (24 tests failed in
    # one run beside two CPU burners: "connection refused" from a shared cluster whose nodes were killed)
    children: FrozenSet[Tuple[int, int]]
    threads: FrozenSet[int]  # Thread.ident
    fds: Dict[int, str]  # fd -> what it refers to (readlink)


def _children() -> FrozenSet[Tuple[int, int]]:
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:  # exited: holds nothing but its exit status
                out.add((p.pid, procinfo.start_time(p.pid)))
        except (psutil.Error, procinfo.Gone, OSError, IndexError, ValueError):  # gone meanwhile
            pass
    return frozenset(out)


def _fds() -> Dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own fd, closed by now
            pass
    return out


def picture() -> Picture:
    return Picture(_children(), frozenset(t.ident for t in threading.enumerate() if t.ident is not None), _fds())


def _describe_process(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        return f"pid {pid} ({' '.join(p.cmdline())[:200] or p.name()})"
    except psutil.Error:
        return f"pid {pid}"


def _leaks(before: Picture, after: Picture) -> List[str]:
    exempt = _exempt()
    out = [f"child process {_describe_process(pid)}" for pid, _ in sorted(after.children - before.children)
           if pid not in exempt]
    threads = {t.ident: t for t in threading.enumerate()}
    out += [f"thread {threads[i].name!r} (daemon={threads[i].daemon}, target "
            f"{getattr(getattr(threads[i], '_target', None), '__qualname__', '?')})"
            for i in sorted(after.threads - before.threads) if i in threads and threads[i].is_alive()]
    out += [f"fd {fd} -> {target}" for fd, target in sorted(after.fds.items())
            if before.fds.get(fd) != target and not target.startswith(("/proc/self/fd", f"/proc/{os.getpid()}/fd"))]
    return out


def leaks_since(before: Picture, grace: float = GRACE_S) -> List[str]:
    """What is there now and was not in `before`, after waiting up to `grace` seconds for it to go."""
    found: List[str] = []

    def gone() -> bool:
        found[:] = _leaks(before, picture())
        return not found

    with contextlib.suppress(TimeoutError):
        wait_until(gone, grace, "what the test started to go", interval=0.1)
    return found


def kill_leaked_children(before: Picture) -> None:
    """Ends the child processes a test left, so that one leak does not spread into the next tests."""
    exempt = _exempt()
    for pid, started in picture().children - before.children:
        if pid in exempt:
            continue
        try:
            if procinfo.start_time(pid) == started:
                os.kill(pid, signal.SIGKILL)
        except (procinfo.Gone, OSError, IndexError, ValueError):  # gone meanwhile
            pass
