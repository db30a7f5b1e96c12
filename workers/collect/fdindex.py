"""Which processes hold an open file (a pipe, a socket, a FIFO or a file by its path), from one scan of /proc/*/fd
per worker request, and the facts hangscope names such a process by.

The scan is lazy and shared: it runs the first time a dump of the request asks who is at the other end of what a
blocked thread waits on (workers/collect/kwait.py, workers/pstate.py's pipe readers), and every rank of the
request reads the same index. It is bounded (MAX_PROCESSES processes, SCAN_SECONDS, MAX_ENTRIES entries) and says
when it did not reach the end. Only /proc is read: readlink of each fd, never an open of what it points to.
"""

from __future__ import annotations

import os
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Tuple

from workers import procinfo

MAX_PROCESSES = 4096  # processes whose fds are read
SCAN_SECONDS = 0.5  # ... for at most this long
MAX_FDS = 4096  # fds read per process
MAX_ENTRIES = 1 << 18  # index entries (~100 bytes each) before the scan stops
MAX_HOLDERS = 8  # processes named per open file

# What is indexed: the objects a blocked call can have another end on. /dev, /proc and /sys paths (terminals,
# devices, the worker's own reads) are left out: nothing here asks who else holds them.
_KEPT = ("pipe:[", "socket:[", "/")
_SKIPPED = ("/dev/", "/proc/", "/sys/")

_lock = threading.Lock()


class FdIndex:
    """readlink target -> [(pid, fd)] over the node's processes (the worker's own left out), built once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by: Optional[Dict[str, List[Tuple[int, int]]]] = None
        self._facts: Dict[int, Optional[Dict[str, Any]]] = {}  # process() per pid, for this request
        self.scanned = 0  # processes whose fd table was listed
        self.complete = False  # every process was read to its last fd, within every bound
        self.elapsed = 0.0

    def holders(self, target: str) -> List[Tuple[int, int]]:
        """The (pid, fd) pairs whose fd points at target, in pid order (built on the first call)."""
        with self._lock:
            if self._by is None:
                self._build()
        assert self._by is not None
        return list(self._by.get(target, ()))

    def process(self, pid: int) -> Optional[Dict[str, Any]]:
        """process(pid), read once per request (a rank's own process is the other end of many of its threads): a
        copy, to be added to."""
        if pid not in self._facts:
            self._facts[pid] = process(pid)
        facts = self._facts[pid]
        return dict(facts, cmdline=list(facts["cmdline"])) if facts is not None else None

    @property
    def built(self) -> bool:
        return self._by is not None

    def _build(self) -> None:
        started = time.monotonic()
        deadline = started + SCAN_SECONDS
        by: Dict[str, List[Tuple[int, int]]] = {}
        entries = 0
        complete = True
        me = os.getpid()
        try:
            pids = procinfo.all_pids()
        except OSError:
            pids, complete = [], False
        if len(pids) > MAX_PROCESSES:
            pids, complete = pids[:MAX_PROCESSES], False
        for pid in pids:
            if pid == me:
                continue
            if time.monotonic() > deadline or entries >= MAX_ENTRIES:
                complete = False
                break
            base = "/proc/%d/fd/" % pid
            try:
                names = os.listdir(base)
            except OSError:
                continue  # gone, or another user's (not root): nothing to read
            self.scanned += 1
            if len(names) > MAX_FDS:
                names, complete = names[:MAX_FDS], False
            for name in names:
                try:
                    link = os.readlink(base + name)
                except OSError:
                    continue
                if not link.startswith(_KEPT) or link.startswith(_SKIPPED):
                    continue
                by.setdefault(link, []).append((pid, int(name)))
                entries += 1
        self._by = by
        self.complete = complete
        self.elapsed = round(time.monotonic() - started, 4)


def shared(cache: Dict[str, Any]) -> FdIndex:
    """The index kept in a request's shared cache (Request.shared), made on first use."""
    with _lock:
        index = cache.get("fd_index")
        if index is None:
            index = cache["fd_index"] = FdIndex()
    return index


def access(pid: int, fd: int) -> Optional[int]:
    """The fd's access mode (0 read, 1 write, 2 both) from /proc/PID/fdinfo/FD's flags; None when unreadable."""
    try:
        data = procinfo.read_file("/proc/%d/fdinfo/%d" % (pid, fd), 4096)
    except OSError:
        return None
    for line in data.decode("ascii", "replace").splitlines():
        if line.startswith("flags:"):
            try:
                return int(line.split(":", 1)[1].strip(), 8) & 3
            except ValueError:
                return None
    return None


def process(pid: int) -> Optional[Dict[str, Any]]:
    """{"pid", "comm", "state", "ppid", "wchan", "cmdline" (redacted)}; None when it is gone."""
    from workers.redact import redact_argv

    try:
        fields = procinfo.stat_fields(pid)
        ppid = int(fields[3])
    except (procinfo.Gone, OSError, IndexError, ValueError):
        return None
    try:
        raw = procinfo.read_file("/proc/%d/cmdline" % pid, 4096).decode("utf-8", "replace").split("\0")
    except OSError:
        raw = []
    return {"pid": pid, "comm": fields[1][:64], "state": fields[2][:2], "ppid": ppid,
            "wchan": procinfo.wchan(pid)[:100], "cmdline": [a[:200] for a in redact_argv([a for a in raw if a])[:16]]}


def ends(index: FdIndex, target: str, modes: Tuple[int, ...], role: str, own_pid: int,
         skip: Optional[Tuple[int, int]] = None) -> Tuple[List[Dict[str, Any]], bool]:
    """The processes holding target open with an access mode in modes, as {"role", "fd", "own", + process()}: at
    most MAX_HOLDERS, one entry per process; skip: a (pid, fd) not to count (the waiting call's own).
    (the ends, whether the search was complete)."""
    out: List[Dict[str, Any]] = []
    seen = set()
    complete = True
    for pid, fd in index.holders(target):
        if pid in seen or (pid, fd) == skip:
            continue
        mode = access(pid, fd)
        if mode is None or mode not in modes:
            continue
        if len(out) >= MAX_HOLDERS:
            complete = False
            break
        facts = index.process(pid)
        if facts is None:
            continue
        seen.add(pid)
        facts.update(role=role, fd=fd, own=pid == own_pid)
        out.append(facts)
    return out, complete and index.complete
