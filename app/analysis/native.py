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
  wait, not a `with` header), and the thread sleeps in a call that waits for nothing a Python API gives
  (pause, a futex of C code, a signal wait, a child).
- a write to a full pipe: the thread sleeps in write() with the kernel in pipe_write: the process reading
  the pipe's other end has stopped reading (a log shipper, `| tee`, a parent that never drains stdout); the
  node names that reader, from the processes holding the pipe's read end (ProcessHold.pipe_readers).

Each finding names the rank, the Python line that made the call and the kernel evidence. Confidence is high
only where the stacks single the rank out as well (it is not where the others are); else medium.
"""

from __future__ import annotations

from typing import Collection, List, Optional, Sequence, Tuple

from app.analysis.findings import Confidence, Finding
from app.analysis.fold import RankKey, fold_nodes, short_keys
from app.analysis.frames import clean, collective_of, is_library, named
from app.model import Frame, PipeReader, RankSnapshot, ThreadStack

MAX_FINDINGS = 4
# calls a thread sleeps in that no Python-level wait explains when its innermost Python frame is the job's code:
# time.sleep (nanosleep), socket and file reads (recv, read, poll) are left out, they are Python's own waits
WAIT_FOREVER = frozenset({"pause", "futex", "rt_sigsuspend", "rt_sigtimedwait", "wait4", "waitid"})
PIPE_WCHAN = ("pipe_write", "pipe_wait")  # and anon_pipe_write (6.x kernels), pipe_wait_writable: "pipe" in it
WRITES = frozenset({"write", "writev", "pwrite64", "pwritev", "pwritev2"})


def _label(t: ThreadStack) -> str:
    if t.is_main:
        return "main thread"
    return f"thread `{clean(t.name, 60)}`" if t.name else f"thread {t.tid}"


def _innermost_python(t: ThreadStack) -> Optional[Frame]:
    return next((f for f in t.frames if not f.native), None)


def _line_text(f: Frame) -> str:
    text = next((src for n, src in f.source if n == f.line), "")
    return f" `{clean(text.strip(), 100)}`" if text.strip() else ""


def _asleep(t: ThreadStack) -> bool:
    return t.state in ("S", "D") and bool(t.syscall) and t.syscall != "running"


def _finding(kind: str, r: RankSnapshot, title: str, detail: str, odd: Collection[RankKey], why: str) -> Finding:
    key = (r.node, r.pid)
    single = key in odd
    conf: Confidence = "high" if single else "medium"
    reason = why + ("; and the stacks single this rank out" if single else
                    "; but the stacks do not single this rank out, so it may not be what the others wait for")
    return Finding(kind, title, detail, conf, reason, (key,),  # type: ignore[arg-type]
                   f"{short_keys((key,), (r.rank,))} on {fold_nodes([r.node])}", fold_nodes([r.node]))


def gil_held(r: RankSnapshot, odd: Collection[RankKey]) -> Optional[Finding]:
    """A thread that owns the GIL while asleep in the kernel: native code that kept the GIL."""
    for t in r.threads:
        if not (t.owns_gil and _asleep(t)):
            continue
        f = _innermost_python(t)
        if f is None or collective_of(f) is not None:
            continue
        others = [o for o in r.threads if o is not t and o.frames]
        if t.syscall == "futex" and (is_library(f) or not others):
            # C code waiting for its own thread pool with the GIL held (torch's CPU ops do, between their workers'
            # chunks): a normal moment of a running job. Named only under the job's own code and with Python
            # threads that the held GIL stops
            continue
        who = short_keys(((r.node, r.pid),), (r.rank,))
        if len(others) == 1:
            stuck = f"; its other Python thread, {_label(others[0])}, cannot run"
        elif others:
            stuck = (f"; its {len(others)} other Python threads ({', '.join(_label(o) for o in others[:3])}"
                     f"{', ...' if len(others) > 3 else ''}) cannot run")
        else:
            stuck = ""
        title = (f"{who}'s {_label(t)} holds the GIL while blocked in native code called from {named(f)}: it "
                 f"sleeps in `{clean(t.syscall, 40)}`{stuck}")
        detail = (f"{who} on {clean(r.node, 60)}: py-spy says its {_label(t)} owns the GIL, and /proc says it "
                  f"sleeps in the kernel in `{clean(t.syscall, 40)}` (wchan {clean(t.wchan or '?', 60)}), called from "
                  f"{named(f)}{_line_text(f)}. CPython releases the GIL around its own blocking calls, so this is "
                  f"native code that kept it (a ctypes.PyDLL call, or a C extension without "
                  f"Py_BEGIN_ALLOW_THREADS); no other thread of the process can run Python until it returns. "
                  f"`py-spy dump --native --pid {r.pid}` on {clean(r.node, 60)} shows the C frames")
        return _finding("gil_held", r, title, detail, odd,
                        "the thread owns the GIL and sleeps in the kernel, which CPython's own calls never do")
    return None


def native_call(r: RankSnapshot, odd: Collection[RankKey]) -> Optional[Finding]:
    """The main thread inside a native call from the job's own code, asleep in a call that waits forever."""
    t = r.main_thread
    if t is None or t.owns_gil or not _asleep(t) or t.syscall not in WAIT_FOREVER or t.enters_with:
        return None
    f = _innermost_python(t)
    if f is None or is_library(f) or collective_of(f) is not None:
        return None
    who = short_keys(((r.node, r.pid),), (r.rank,))
    title = (f"{who}'s main thread is inside a native call that does not return, made at {named(f)}: it sleeps "
             f"in `{clean(t.syscall, 40)}` with the GIL released")
    detail = (f"{who} on {clean(r.node, 60)}: its innermost Python frame is the job's own {named(f)}{_line_text(f)}, "
              f"with no Python wait below it, and /proc says the thread sleeps in the kernel in "
              f"`{clean(t.syscall, 40)}` (wchan {clean(t.wchan or '?', 60)}): a C function (a ctypes call, a C "
              f"extension) that waits for something that does not come. `py-spy dump --native --pid {r.pid}` or "
              f"`gdb -p {r.pid}` on {clean(r.node, 60)} (hangscope --native / --gdb) shows which")
    return _finding("native_call", r, title, detail, odd,
                    f"the main thread sleeps in `{clean(t.syscall, 40)}` right below the job's own code")


def pipe_write(r: RankSnapshot, odd: Collection[RankKey]) -> Optional[Finding]:
    """A thread asleep in write() on a full pipe."""
    threads = sorted(r.threads, key=lambda t: not t.is_main)
    for t in threads:
        if t.state != "S" or t.syscall not in WRITES or "pipe" not in t.wchan:
            continue
        f = next((g for g in t.frames if not g.native and not is_library(g)), None) or _innermost_python(t)
        at = f" in {named(f)}" if f is not None else ""
        who = short_keys(((r.node, r.pid),), (r.rank,))
        reader, reader_detail = _pipe_reader(r)
        title = (f"{who}'s {_label(t)} is blocked writing to a full pipe{at}: "
                 + (f"{reader}, which holds its read end, does not read" if reader else
                    "the process reading the other end has stopped reading"))
        detail = (f"{who} on {clean(r.node, 60)}: its {_label(t)} sleeps in `{clean(t.syscall, 40)}` with the kernel "
                  f"in {clean(t.wchan, 60)}: the pipe's buffer is full and nothing drains it"
                  f"{' (from ' + named(f) + _line_text(f) + ')' if f is not None else ''}. " + (reader_detail or
                  f"Find the reader with `ls -l /proc/{r.pid}/fd` (the pipe:[inode]) and the process holding that "
                  f"pipe's read end; a log shipper, a `| tee` or a parent that never reads the rank's stdout is the "
                  f"usual one"))
        return _finding("pipe_write", r, title, detail, odd,
                        "the thread sleeps in write() on a pipe whose buffer is full")
    return None


_READER_STATES = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible sleep (D)",
                  "Z": "a zombie", "R": "running"}


def _pipe_reader(r: RankSnapshot) -> Tuple[str, str]:
    """(who holds the pipe's read end, in a few words; the detail on every reader) from the node's search of
    /proc (ProcessHold.pipe_readers); ("", "") when it was not searched, ("", why) when nobody was found."""
    hold = r.hold
    if hold is None or not hold.pipe:
        return "", ""
    readers = hold.pipe_readers
    if not readers:
        if not hold.pipe_search_complete:
            return "", (f"The node's /proc was searched for the other end of {clean(hold.pipe, 40)} within its "
                        "limits and no reader was found; `ls -l /proc/*/fd | grep` the inode to look further.")
        return "", (f"No process holds {clean(hold.pipe, 40)} open for reading: its reader has exited and the "
                    "write should fail with EPIPE; a reader in another PID namespace is not visible from the node.")

    def one(p: PipeReader) -> str:
        what = " ".join(p.cmdline) or p.comm
        if p.pid == r.pid:
            return f"{short_keys(((r.node, r.pid),), (r.rank,))} itself"
        rel = " (its child)" if p.ppid == r.pid else (" (its parent)" if p.ppid is not None and p.pid == r.ppid
                                                     else "")
        return f"pid {p.pid} `{clean(what, 80)}`{rel}"

    def doing(p: PipeReader) -> str:
        state = _READER_STATES.get(p.state)
        if state:
            return state
        return f"asleep in {clean(p.wchan, 60)}" if p.wchan else "asleep"

    first = readers[0]
    short = one(first) + (f" (and {len(readers) - 1} more)" if len(readers) > 1 else "")
    detail = "; ".join(f"{one(p)} holds the read end of {clean(hold.pipe, 40)} and is {doing(p)}" for p in readers)
    detail += (": it never drains the pipe. Make it read (or end it and let the rank see EPIPE), or send the "
               "rank's output to a file instead of a pipe.")
    return clean(short, 200), detail


def native_findings(ranks: Sequence[RankSnapshot], odd: Collection[RankKey]) -> List[Finding]:
    """One finding per rank at most (GIL first, then a pipe, then a native call), held ranks left to their
    state's finding; at most MAX_FINDINGS, the ranks the stacks single out first."""
    out: List[Tuple[bool, Finding]] = []
    for r in ranks:
        if not r.threads or (r.hold is not None and r.hold.held):
            continue
        found = gil_held(r, odd) or pipe_write(r, odd) or native_call(r, odd)
        if found is not None:
            out.append(((r.node, r.pid) not in odd, found))
    out.sort(key=lambda p: p[0])
    return [f for _, f in out[:MAX_FINDINGS]]
