"""Threads held in native code: a call that never returns, with or without the GIL, and a write to a full pipe.

py-spy shows the Python frames only: a thread inside a C function (a ctypes call, a C extension, a builtin
write) shows its innermost Python frame at the line that made the call. What the thread waits on is in
/proc: its state, the system call it sleeps in (/proc/PID/task/TID/syscall) and the kernel function
(wchan). Three classes are told apart from that evidence:

- the GIL held in native code: py-spy says the thread owns the GIL, and /proc says it sleeps in the kernel.
  CPython releases the GIL around every blocking call of its own, so this is native code that did not
  (ctypes.PyDLL, a C extension without Py_BEGIN_ALLOW_THREADS): no other thread of the process runs Python.
  A futex wait under a library's frame, or in a process with no other Python thread, is left out: torch's CPU
  ops wait for their thread pool with the GIL held, a moment of every running job.
- a native call that does not return: the innermost Python frame is the job's own code (not a library's
  wait, not a `with` header, not a line whose call the wait-site table names: `self._lock.acquire()` sleeps in
  futex too, and is a lock's wait, said by the waits), and the thread sleeps in a call that waits for nothing a
  Python API gives (pause, a futex of C code, a signal wait, a child).
- a write to a full pipe: the thread sleeps in write() with the kernel in pipe_write: the process reading
  the pipe's other end has stopped reading (a log shipper, `| tee`, a parent that never drains stdout); the
  node names that reader, from the processes holding the pipe's read end (ProcessHold.pipe_readers).

Each finding names the rank, the Python line that made the call and the kernel evidence. Confidence is high
only where the stacks single the rank out as well (it is not where the others are); else medium.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, List, Optional, Sequence, Tuple

from app.analysis.blocking import call_site
from app.analysis.facts import Confidence, Evidence, Fact, ranks_who
from app.analysis.fold import RankKey
from app.analysis.frames import collective_of, is_library
from app.model import Frame, RankSnapshot, ThreadStack

MAX_FINDINGS = 4
# calls a thread sleeps in that no Python-level wait explains when its innermost Python frame is the job's code:
# time.sleep (nanosleep), socket and file reads (recv, read, poll) are left out, they are Python's own waits
WAIT_FOREVER = frozenset({"pause", "futex", "rt_sigsuspend", "rt_sigtimedwait", "wait4", "waitid"})
PIPE_WCHAN = ("pipe_write", "pipe_wait")  # and anon_pipe_write (6.x kernels), pipe_wait_writable: "pipe" in it
WRITES = frozenset({"write", "writev", "pwrite64", "pwritev", "pwritev2"})


@dataclass(frozen=True)
class NativeEvidence(Evidence):
    """A thread of one rank held in native code: the GIL kept while asleep, a call that does not return, or a
    write to a full pipe (with what the node found at the pipe's other end: ProcessHold.pipe_readers)."""

    rank: RankSnapshot
    thread: ThreadStack
    frame: Optional[Frame]  # the Python frame that made the call
    odd: bool  # the stacks single this rank out
    others: Tuple[ThreadStack, ...] = ()  # gil_held: the rank's other Python threads, which cannot run


def _innermost_python(t: ThreadStack) -> Optional[Frame]:
    return next((f for f in t.frames if not f.native), None)


def _asleep(t: ThreadStack) -> bool:
    return t.state in ("S", "D") and bool(t.syscall) and t.syscall != "running"


def _fact(kind: str, r: RankSnapshot, t: ThreadStack, frame: Optional[Frame], odd: Collection[RankKey],
          others: Tuple[ThreadStack, ...] = ()) -> Fact:
    key = (r.node, r.pid)
    single = key in odd
    conf: Confidence = "high" if single else "medium"
    return Fact(kind, ranks_who((key,), (r.rank,)), conf, NativeEvidence(r, t, frame, single, others))  # type: ignore[arg-type]


def gil_held(r: RankSnapshot, odd: Collection[RankKey]) -> Optional[Fact]:
    """A thread that owns the GIL while asleep in the kernel: native code that kept the GIL."""
    for t in r.threads:
        if not (t.owns_gil and _asleep(t)):
            continue
        f = _innermost_python(t)
        if f is None or collective_of(f) is not None:
            continue
        others = tuple(o for o in r.threads if o is not t and o.frames)
        if t.syscall == "futex" and (is_library(f) or not others):
            # C code waiting for its own thread pool with the GIL held (torch's CPU ops do, between their workers'
            # chunks): a normal moment of a running job. Named only under the job's own code and with Python
            # threads that the held GIL stops
            continue
        if t.is_main and _read_by_node(t):
            # the rank's own work waits in that call, and the node read what for: the wait's fact says it (and that
            # the GIL is held); a helper thread keeping the GIL is what stops the main thread, and is said as such
            continue
        return _fact("gil_held", r, t, f, odd, others)
    return None


# Calls whose wait the node reads down to its object (workers/collect/kwait.py): an open of a FIFO, a read or write
# on an fd, a file lock, a wait for a child. Holding the GIL there is a consequence (the rank's other Python threads
# stop), not the cause: what the call waits for is.
_READ_FAMILIES = ("open", "fd", "lock", "wait")


def _read_by_node(t: ThreadStack) -> bool:
    w = t.waits
    return w is not None and w.family in _READ_FAMILIES and bool(w.fds or w.path or w.children)


def native_call(r: RankSnapshot, odd: Collection[RankKey]) -> Optional[Fact]:
    """The main thread inside a native call from the job's own code, asleep in a call that waits forever."""
    t = r.main_thread
    if t is None or t.owns_gil or not _asleep(t) or t.syscall not in WAIT_FOREVER or t.enters_with:
        return None
    f = _innermost_python(t)
    if f is None or is_library(f) or collective_of(f) is not None or call_site(f, t.syscall) is not None:
        return None
    return _fact("native_call", r, t, f, odd)


def pipe_write(r: RankSnapshot, odd: Collection[RankKey]) -> Optional[Fact]:
    """A thread asleep in write() on a full pipe."""
    writing = [t for t in r.threads if t.state == "S" and t.syscall in WRITES and "pipe" in t.wchan]
    if not writing:
        return None
    t = min(writing, key=lambda t: not t.is_main)  # the main thread first, else the first in the rank's order
    f = next((g for g in t.frames if not g.native and not is_library(g)), None) or _innermost_python(t)
    return _fact("pipe_write", r, t, f, odd)


def native_facts(ranks: Sequence[RankSnapshot], odd: Collection[RankKey]) -> List[Fact]:
    """One fact per rank at most (GIL first, then a pipe, then a native call), held ranks left to their state's
    fact; at most MAX_FINDINGS, the ranks the stacks single out first."""
    out: List[Tuple[bool, Fact]] = []
    for r in ranks:
        if not r.threads or (r.hold is not None and r.hold.held):
            continue
        found = gil_held(r, odd) or pipe_write(r, odd) or native_call(r, odd)
        if found is not None:
            out.append(((r.node, r.pid) not in odd, found))
    out.sort(key=lambda p: p[0])
    return [f for _, f in out[:MAX_FINDINGS]]
