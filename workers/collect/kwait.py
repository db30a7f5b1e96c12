"""What a thread blocked in a system call waits on, and who is at the other end, from /proc only: no ptrace, the
process is never stopped.

From the call's arguments (/proc/PID/task/TID/syscall, already read by workers/collect/procfs.py):
- a call on an fd (read, write, recv, send, accept, connect, ioctl, fsync, ...): the fd's target (readlink
  /proc/PID/fd/FD) and its kind: pipe, fifo, socket, tty, file, device, eventfd, epoll, other;
- poll, ppoll, select, pselect6: the fds watched, read from the process's memory, and the timeout;
- epoll_wait, epoll_pwait, epoll_pwait2: the epoll fd's watched fds (/proc/PID/fdinfo/EPFD) and the timeout;
- wait4, waitid: the pid waited for and the children (a zombie's exit status or signal: /proc/PID/stat);
- flock, fcntl(F_SETLKW / F_OFD_SETLKW): the file, the lock asked for and its holders (/proc/locks);
- open, openat, openat2 (a FIFO's open waits for its other end): the path, read from memory;
- futex: the address (and "no timeout" when it has none); one shared between processes (no FUTEX_PRIVATE_FLAG: a
  named or process-shared semaphore) also the file it lies in, from /proc/PID/maps; nanosleep, clock_nanosleep:
  the time asked for.
The other end of a pipe or FIFO (its writers for a reader, its readers for a writer), of a local TCP or unix
connection (workers/collect/kwait_net.py) and of a lock (workers/collect/kwait_procs.py, with the children) comes
from one shared scan of /proc/*/fd per request (workers/collect/fdindex.py).

Bounded everywhere (MAX_* below; SECONDS per process beyond the shared scan), and it never raises: a thread that
exits meanwhile, an unreadable fd or a process that disappears give less. Memory (/proc/PID/mem: the access of a
ptrace read, no attach) is read only from a process nothing holds (not stopped, traced, frozen, in D, exiting),
as workers/collect/pyglobals.py does. Calls of a 32-bit (compat) process are not told apart from 64-bit ones.
"""

from __future__ import annotations

import os
import stat
import struct
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Tuple

from workers import procinfo
from workers.collect import fdindex, kwait_net, kwait_procs, pyglobals
from workers.collect import pyglobals_probe as probe

MAX_WATCHED = 64  # fds of one poll, select or epoll
MAX_RESOLVED = 32  # fds per process whose other ends are searched
MAX_PATH = 4096
MAX_FDINFO = 1 << 16  # bytes of an epoll fd's fdinfo (~70 bytes per watched fd)
MAX_NOTES = 8
MEMORY_BUDGET = 64 << 10  # bytes read from one process's memory
SECONDS = 0.5  # per process, beyond the shared scan of /proc/*/fd

_READS = ("read", "readv", "pread64", "preadv", "preadv2", "recvfrom", "recvmsg", "recvmmsg")
_WRITES = ("write", "writev", "pwrite64", "pwritev", "pwritev2", "sendto", "sendmsg", "sendmmsg", "sendfile")
_OTHER_FD = {"accept": "accept", "accept4": "accept", "connect": "connect", "ioctl": "", "fsync": "",
             "fdatasync": "", "ftruncate": "", "fallocate": "", "sync_file_range": "", "getdents64": "", "close": ""}
_TWO_FDS = {"splice": 2, "tee": 1, "copy_file_range": 2}  # in fd: arg 0, out fd: this argument
FAMILIES = dict([(n, "fd") for n in _READS + _WRITES + tuple(_OTHER_FD) + tuple(_TWO_FDS)]
                + [(n, "poll") for n in ("poll", "ppoll", "select", "pselect6")]
                + [(n, "epoll") for n in ("epoll_wait", "epoll_pwait", "epoll_pwait2")]
                + [(n, "wait") for n in ("wait4", "waitid")]
                + [(n, "lock") for n in ("flock", "fcntl")]
                + [(n, "open") for n in ("open", "openat", "openat2")]
                + [(n, "futex") for n in ("futex", "futex_waitv")]
                + [(n, "sleep") for n in ("nanosleep", "clock_nanosleep")]
                + [("rt_sigtimedwait", "signal")])

# A call stopped by a ptrace attach (a py-spy dump: an earlier sample's, or anyone's) or by a signal without a
# handler resumes as restart_syscall when the kernel keeps its state aside (poll; a futex or a nanosleep with a
# relative timeout). The syscall line then names restart_syscall, yet its argument registers are the call's own,
# as first made: the kernel function it sleeps in says which call it continues.
_RESTARTED = (("poll_schedule_timeout", "poll"), ("do_sys_poll", "poll"), ("futex", "futex"))

_F_SETLKW, _F_OFD_SETLKW = 7, 38
_FUTEX_WAITS = (0, 6, 9, 11, 13)  # WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2
_FUTEX_PRIVATE = 128  # FUTEX_PRIVATE_FLAG: a futex of this process alone (every pthread and Python lock)
_AT_FDCWD = -100
_POLL_READ, _POLL_WRITE = 0x1 | 0x2 | 0x40 | 0x80, 0x4 | 0x100 | 0x200
_EPOLL_READ, _EPOLL_WRITE = 0x1 | 0x2 | 0x40 | 0x80, 0x4 | 0x100 | 0x200
_TTY_MAJORS = frozenset([3, 4, 5] + list(range(136, 144)))  # BSD ptys, ttys and ttyS, /dev/tty and ptmx, pts
_TIMESPEC = struct.Struct("<qq")
_POLLFD = struct.Struct("<ihh")


_s32 = kwait_procs.s32


class Reader:
    """One process being read (kwait_procs.py reads its children and lock holders through it): its memory (opened on first use, or why not), the deadline, the shared caches."""

    def __init__(self, cache: Dict[str, Any], pid: int, process: Optional[Dict[str, Any]]) -> None:
        self.cache, self.pid = cache, pid
        self.index = fdindex.shared(cache)
        self.deadline = time.monotonic() + SECONDS
        self.resolved = 0
        self.mem_read = 0
        self.d_state = False  # the thread being read is in D: its process's memory is not read
        self._mem: Optional[probe.Memory] = None
        self._stat: Optional[List[str]] = None
        self._process = process or {}
        self.refusal: Optional[str] = None  # why memory is not read; None: not decided yet
        self.refused = False  # a read was refused (reset per thread)
        self.other_pidns = procinfo.ns_id(pid) is not None

    def over(self) -> bool:
        return time.monotonic() > self.deadline

    def ends(self, target: str, modes: Tuple[int, ...], role: str, skip: Optional[Tuple[int, int]] = None
             ) -> Tuple[List[Dict[str, Any]], bool]:
        """fdindex.ends, the shared scan's time (when this call made it) not counted against the deadline."""
        built = self.index.built
        out = fdindex.ends(self.index, target, modes, role, self.pid, skip)
        if not built and self.index.built:
            self.deadline += self.index.elapsed
        return out

    def stat(self) -> List[str]:
        if self._stat is None:
            try:
                self._stat = procinfo.stat_fields(self.pid)
            except (procinfo.Gone, OSError):
                self._stat = []
        return self._stat

    def why_not(self) -> str:
        """Why the process's memory (and its mappings) must not be read, "" when they may: decided on the first
        ask, as workers/collect/pyglobals.py decides."""
        if self.refusal is None:
            self.refusal = pyglobals.memory_refusal(self.pid, self._process, other_ns=False)
        return self.refusal

    def read(self, addr: int, size: int) -> Optional[bytes]:
        """size bytes of the process's memory at addr; None when refused or unreadable (see the module doc)."""
        if not addr:
            return None
        if self.why_not() or self.d_state:
            self.refused = True
            return None
        if self._mem is None:
            try:
                self._mem = probe.Memory(self.pid, MEMORY_BUDGET)
            except OSError as exc:
                self.refusal, self.refused = "cannot open /proc/%d/mem: %s" % (self.pid, exc.strerror or exc), True
                return None
        try:
            return self._mem.read(addr, size)
        except probe.Fault:
            return None
        finally:
            self.mem_read = self._mem.read_bytes

    def string(self, addr: int) -> Optional[str]:
        """A NUL-terminated string (a path) at addr, at most MAX_PATH bytes, read page by page."""
        out = b""
        while len(out) < MAX_PATH:
            chunk = min(4096 - (addr + len(out)) % 4096, MAX_PATH - len(out))
            data = self.read(addr + len(out), chunk)
            if data is None:
                return None
            end = data.find(b"\0")
            if end >= 0:
                return (out + data[:end]).decode("utf-8", "replace")
            out += data
        return out.decode("utf-8", "replace")

    def timespec(self, addr: int) -> Optional[float]:
        """A struct timespec as seconds; -1 for a NULL pointer: no timeout; None when unreadable."""
        if not addr:
            return -1.0
        data = self.read(addr, _TIMESPEC.size)
        if data is None:
            return None
        sec, nsec = _TIMESPEC.unpack(data)
        return round(sec + nsec / 1e9, 6) if sec >= 0 else None

    def close(self) -> None:
        if self._mem is not None:
            self._mem.close()


def annotate(cache: Dict[str, Any], pid: int, threads: List[Dict[str, Any]],
             process: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """Add "waits" (see the module doc; app/model/kwait.py's KernelWait is what the login side makes of it) to
    each thread of procfs.collect's list that sleeps (S or D) in a call it can say something about. cache: the
    request's shared cache (the /proc/*/fd index, the network tables); process: pstate.read()'s answer, which
    decides whether memory may be read. Returns the action to record (what was read), or None when no thread
    waits on anything named here."""
    ctx: Optional[Reader] = None
    waiting = 0
    try:
        for t in threads:
            if not isinstance(t, dict) or t.get("state") not in ("S", "D"):
                continue
            name = str(t.get("syscall") or "")
            restarted = name == "restart_syscall"
            if restarted:
                wchan = str(t.get("wchan") or "")
                name = next((call for prefix, call in _RESTARTED if wchan.startswith(prefix)), name)
            family = FAMILIES.get(name)
            raw = str(t.get("syscall_raw") or "").split()
            if family is None or len(raw) < 7:
                continue
            try:
                args = [int(a, 16) for a in raw[1:7]]
            except ValueError:
                continue
            if family == "futex":  # the common case (a private futex) costs nothing: no read at all
                t["waits"] = _futex(name, args)
                if not args[1] & _FUTEX_PRIVATE and name == "futex":
                    # shared between processes (a named or pshared semaphore, a lock in shared memory): which file
                    # holds it, from the process's mappings, read only where its memory may be read
                    try:
                        if ctx is None:
                            ctx = Reader(cache, pid, process)
                        _shared_futex(ctx, args[0], t["waits"])
                    except Exception as exc:  # never lose the dump over one thread's call: say what failed
                        t["waits"]["notes"] = ["a futex shared between processes; not read: %s: %s"
                                               % (type(exc).__name__, str(exc)[:200])]
                    waiting += 1
                if restarted:
                    t["waits"]["notes"] = [_RESUMED] + t["waits"].get("notes", [])
                continue
            if ctx is None:
                ctx = Reader(cache, pid, process)
            try:
                t["waits"] = _wait(ctx, name, family, args, t.get("state") == "D")
                if restarted:
                    t["waits"]["notes"] = ([_RESUMED] + t["waits"].get("notes", []))[:MAX_NOTES]
                if _left_call(pid, t, raw):
                    t["waits"].setdefault("notes", []).append(
                        "the thread left this call while it was read: what it waits on may have changed")
            except Exception as exc:  # never lose the dump over one thread's call: say what failed instead
                t["waits"] = {"syscall": name, "family": family,
                              "notes": ["not read: %s: %s" % (type(exc).__name__, str(exc)[:200])]}
            waiting += 1
    finally:
        if ctx is not None:
            ctx.close()
    if ctx is None or not waiting:
        return None
    what = "read what %d blocked thread%s wait%s on (/proc" % (waiting, "s" * (waiting != 1), "s" * (waiting == 1))
    if ctx.mem_read:
        what += "; %d bytes of its memory, not stopped" % ctx.mem_read
    if ctx.index.built:
        what += "; /proc/*/fd of %d processes searched once for this request" % ctx.index.scanned
    return what + ")"


_RESUMED = "resumed as restart_syscall (after a stop or a signal): read as the call it continues, its arguments as made"


def _left_call(pid: int, t: Dict[str, Any], raw: List[str]) -> bool:
    """The thread is no longer in the call whose arguments were read (one more read of its syscall line)."""
    try:
        now = procinfo.read_file("/proc/%d/task/%s/syscall" % (pid, t.get("tid")), 512).decode("ascii", "replace")
    except OSError:
        return True  # the thread exited
    return now.split()[:7] != raw[:7]


def _futex(name: str, args: List[int]) -> Dict[str, Any]:
    out = {"syscall": name, "family": "futex", "address": "0x%x" % args[0]}  # type: Dict[str, Any]
    if name == "futex_waitv" or (args[1] & 0x7F) in _FUTEX_WAITS:
        if args[3] == 0:
            out["timeout"] = -1.0  # no timeout: it waits until woken (the time itself is in memory: not read)
    return out


def _shared_futex(ctx: Reader, addr: int, out: Dict[str, Any]) -> None:
    """The file a shared futex lies in (/dev/shm/sem.NAME for a POSIX named semaphore), into out["path"]; a note
    either way. The mappings are read as memory is: not of a process something holds (Reader.read's rule)."""
    refusal = ctx.why_not()
    if refusal:
        out["notes"] = ["a futex shared between processes; its mappings not read: %s" % refusal]
        return
    key = "maps %d" % ctx.pid
    maps = ctx.cache.get(key)
    if maps is None:
        try:
            maps = probe.read_maps(ctx.pid)
        except (OSError, ValueError):
            maps = []
        ctx.cache[key] = maps
    inside = next((m for m in maps if m[0] <= addr < m[1]), None)
    path = inside[5][:MAX_PATH] if inside is not None else ""
    if path:
        out["path"] = path
    out["notes"] = ["a futex shared between processes (not private to this one)" +
                    (", in %s" % path if path else ", in anonymous shared memory")]


def _wait(ctx: Reader, name: str, family: str, args: List[int], d_state: bool) -> Dict[str, Any]:
    out = {"syscall": name, "family": family, "notes": []}  # type: Dict[str, Any]
    ctx.d_state, ctx.refused = d_state, False
    if family == "fd":
        _fd_call(ctx, name, args, out)
    elif family == "poll":
        _poll(ctx, name, args, out)
    elif family == "epoll":
        _epoll(ctx, name, args, out)
    elif family == "wait":
        kwait_procs.children(ctx, name, args, out)
    elif family == "lock":
        _lock(ctx, name, args, out)
    elif family == "open":
        _open(ctx, name, args, out)
    elif family == "sleep":
        _sleep(ctx, name, args, out)
    elif family == "signal":
        _signals(ctx, args, out)
    if ctx.refused:
        why = "the thread is in uninterruptible sleep (D)" if d_state and not ctx.refusal else ctx.refusal
        out["notes"].append("its memory was not read: %s" % why)
    if ctx.over():
        out["notes"].append("the %.1f s spent on this process ran out: other ends not searched" % SECONDS)
    out["notes"] = out["notes"][:MAX_NOTES]
    if not out["notes"]:
        del out["notes"]
    return out


def _fd_call(ctx: Reader, name: str, args: List[int], out: Dict[str, Any]) -> None:
    fd = out["fd"] = _s32(args[0])
    if name in _TWO_FDS:
        out["fds"] = [_fd(ctx, fd, "read"), _fd(ctx, _s32(args[_TWO_FDS[name]]), "write")]
        return
    access = "read" if name in _READS else "write" if name in _WRITES else _OTHER_FD.get(name, "")
    out["fds"] = [_fd(ctx, fd, access)]


def _fd(ctx: Reader, fd: int, access: str, search: bool = True) -> Dict[str, Any]:
    """One fd: its target, kind and, for a pipe, FIFO, socket or terminal, what is at the other end."""
    out = {"fd": fd, "access": access}  # type: Dict[str, Any]
    link = "/proc/%d/fd/%d" % (ctx.pid, fd)
    try:
        target = os.readlink(link)
    except OSError as exc:
        out["notes"] = ["fd %d not readable: %s" % (fd, exc.strerror or exc)]
        return out
    out["target"] = target[:300]
    kind, st = _classify(target, link)
    out["kind"] = kind
    if kind == "tty" and st is not None:
        _tty(ctx, st, out)
    if not search or ctx.over() or ctx.resolved >= MAX_RESOLVED:
        return out
    if kind in ("pipe", "fifo") and access in ("read", "write"):
        ctx.resolved += 1
        out["others"], out["complete"] = _pipe_ends(ctx, target, access)
    elif kind == "socket" and target.startswith("socket:[") and target.endswith("]"):
        ctx.resolved += 1
        try:
            inode = int(target[8:-1])
        except ValueError:
            return out
        got = kwait_net.endpoint(ctx.cache, ctx.index, ctx.pid, inode)
        notes = got.pop("notes", [])
        if access == "read":
            # a peer asleep reading its end of this very connection: both ends wait for the other to send
            for o in got.get("others") or []:
                if o.get("role") == "peer" and not o.get("own") and isinstance(o.get("fd"), int) \
                        and o.get("state") == "S" and kwait_procs.reads_fd(o["pid"], o["fd"]):
                    o["reading"] = True
        out.update(got)
        if notes:
            out.setdefault("notes", []).extend(notes)
    return out


def _pipe_ends(ctx: Reader, target: str, access: str) -> Tuple[List[Dict[str, Any]], bool]:
    """A reader's writers, a writer's readers (the thread's own process included, marked own)."""
    if access == "read":
        return ctx.ends(target, (1, 2), "writer")
    return ctx.ends(target, (0, 2), "reader")


def _classify(target: str, link: str) -> Tuple[str, Optional[os.stat_result]]:
    if target.startswith("pipe:["):
        return "pipe", None
    if target.startswith("socket:["):
        return "socket", None
    if target.startswith("anon_inode:"):
        return ("eventfd" if "eventfd" in target else "epoll" if "eventpoll" in target else "other"), None
    if not target.startswith("/"):
        return "other", None
    try:
        st = os.stat(link)  # the open file itself, whatever mount namespace its path belongs to
    except OSError:
        return "other", None
    return _kind_of(st), st


def _kind_of(st: os.stat_result) -> str:
    mode = st.st_mode
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISCHR(mode):
        return "tty" if os.major(st.st_rdev) in _TTY_MAJORS else "device"
    if stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "file"


def _tty(ctx: Reader, st: os.stat_result, out: Dict[str, Any]) -> None:
    """Whether the terminal is the process's controlling one, and whether its foreground group is the process's
    own (a background process reading its terminal gets SIGTTIN): /proc/PID/stat's tty_nr, pgrp and tpgid."""
    fields = ctx.stat()
    if len(fields) < 8:
        return
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    encoded = (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)  # the kernel's new_encode_dev
    try:
        tty_nr, pgrp, tpgid = int(fields[6]), int(fields[4]), int(fields[7])
    except ValueError:
        return
    controlling = tty_nr != 0 and (tty_nr == encoded or (major, minor) == (5, 0))  # /dev/tty: its own terminal
    out["controlling"] = controlling
    if controlling and tpgid > 0:
        out["foreground"] = tpgid == pgrp


def _watch_access(events: int, read_bits: int, write_bits: int) -> str:
    r, w = bool(events & read_bits), bool(events & write_bits)
    return "both" if r and w else "read" if r else "write" if w else ""


def _poll(ctx: Reader, name: str, args: List[int], out: Dict[str, Any]) -> None:
    watched: List[Tuple[int, str]] = []
    if name in ("poll", "ppoll"):
        n = args[1] & 0xFFFFFFFF
        out["timeout"] = (_s32(args[2]) / 1000.0 if _s32(args[2]) >= 0 else -1.0) if name == "poll" \
            else ctx.timespec(args[2])
        data = ctx.read(args[0], min(n, MAX_WATCHED) * _POLLFD.size) if n else b""
        if data is None:
            out["fds_total"] = n
            return
        for i in range(0, len(data), _POLLFD.size):
            fd, events, _ = _POLLFD.unpack_from(data, i)
            if fd >= 0:
                watched.append((fd, _watch_access(events & 0xFFFF, _POLL_READ, _POLL_WRITE)))
        out["fds_total"] = n
    else:  # select, pselect6: three fd_set bitmaps of nfds bits
        nfds = max(0, min(_s32(args[0]), 1024))
        out["timeout"] = _timeval(ctx, args[4]) if name == "select" else ctx.timespec(args[4])
        size = (nfds + 63) // 64 * 8
        sets = [ctx.read(args[i], size) if args[i] and size else b"" for i in (1, 2, 3)]
        if any(s is None for s in sets):
            return
        access: Dict[int, str] = {}
        for which, bits in zip(("read", "write", "read"), sets):
            for fd in range(min(nfds, len(bits or b"") * 8)):
                if (bits or b"")[fd // 8] >> (fd % 8) & 1:
                    had = access.get(fd)
                    access[fd] = which if had in (None, which) else "both"
        watched = sorted(access.items())
        out["fds_total"] = len(watched)
    out["fds"] = [_fd(ctx, fd, acc) for fd, acc in watched[:MAX_WATCHED]]


def _timeval(ctx: Reader, addr: int) -> Optional[float]:
    if not addr:
        return -1.0
    data = ctx.read(addr, _TIMESPEC.size)
    if data is None:
        return None
    sec, usec = _TIMESPEC.unpack(data)
    return round(sec + usec / 1e6, 6) if sec >= 0 else None


def _epoll(ctx: Reader, name: str, args: List[int], out: Dict[str, Any]) -> None:
    epfd = out["fd"] = _s32(args[0])
    if name == "epoll_pwait2":
        out["timeout"] = ctx.timespec(args[3])
    else:
        ms = _s32(args[3])
        out["timeout"] = ms / 1000.0 if ms >= 0 else -1.0
    try:
        info = procinfo.read_file("/proc/%d/fdinfo/%d" % (ctx.pid, epfd), MAX_FDINFO).decode("ascii", "replace")
    except OSError as exc:
        out["notes"].append("the epoll fd %d is not readable: %s" % (epfd, exc.strerror or exc))
        return
    if len(info) >= MAX_FDINFO:
        out["notes"].append("it watches more fds than the first %d KiB of its fdinfo list" % (MAX_FDINFO >> 10))
    watched: List[Tuple[int, str]] = []
    for line in info.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "tfd:" and f[2] == "events:" and f[1].isdigit():
            try:
                events = int(f[3], 16)
            except ValueError:
                continue
            watched.append((int(f[1]), _watch_access(events, _EPOLL_READ, _EPOLL_WRITE)))
    out["fds_total"] = len(watched)
    # the fds are the numbers in the table of the process that added them: this one, unless the epoll fd was
    # shared with another process (then a target may be another file)
    out["fds"] = [_fd(ctx, fd, acc) for fd, acc in watched[:MAX_WATCHED]]


def _lock(ctx: Reader, name: str, args: List[int], out: Dict[str, Any]) -> None:
    """flock(fd, op) and fcntl(fd, F_SETLKW | F_OFD_SETLKW, &flock): the file, the lock asked for and who holds
    a lock on it (/proc/locks by the file's device and inode); any other fcntl is a plain call on an fd."""
    fd = out["fd"] = _s32(args[0])
    if name == "fcntl":
        cmd = args[1] & 0xFFFFFFFF
        if cmd not in (_F_SETLKW, _F_OFD_SETLKW):
            out["family"] = "fd"
            out["fds"] = [_fd(ctx, fd, "")]
            return
        out["lock_type"] = "POSIX" if cmd == _F_SETLKW else "OFDLCK"
        raw = ctx.read(args[2], 2)  # struct flock's l_type: F_RDLCK 0, F_WRLCK 1
        if raw is not None:
            out["lock_mode"] = {0: "READ", 1: "WRITE"}.get(struct.unpack("<h", raw)[0], "")
    else:
        out["lock_type"] = "FLOCK"
        out["lock_mode"] = {1: "READ", 2: "WRITE"}.get(args[1] & 3, "")
    end = _fd(ctx, fd, "lock", search=False)
    out["fds"] = [end]
    out["path"] = end.get("target", "")
    try:
        st = os.stat("/proc/%d/fd/%d" % (ctx.pid, fd))
    except OSError:
        return
    holders, complete = kwait_procs.lock_holders(ctx, st, fd, end.get("target", ""), out)
    end["others"], end["complete"] = holders, complete


def _open(ctx: Reader, name: str, args: List[int], out: Dict[str, Any]) -> None:
    """An open blocked on a FIFO waits for its other end (the file is in the call's path argument, in memory)."""
    dirfd, at, flags_at = (_AT_FDCWD, 0, 1) if name == "open" else (_s32(args[0]), 1, 2)
    path = ctx.string(args[at])
    if path is None:
        return
    out["path"] = path[:MAX_PATH]
    if name == "openat2":
        raw = ctx.read(args[2], 8)  # struct open_how's flags
        flags = struct.unpack("<Q", raw)[0] if raw is not None else 0
    else:
        flags = args[flags_at]
    access = {0: "read", 1: "write"}.get(flags & 3, "")
    if path.startswith("/"):
        seen = "/proc/%d/root%s" % (ctx.pid, path)
    elif dirfd == _AT_FDCWD:
        seen = "/proc/%d/cwd/%s" % (ctx.pid, path)
    else:
        seen = "/proc/%d/fd/%d/%s" % (ctx.pid, dirfd, path)
    end = {"access": access, "target": path[:300]}  # type: Dict[str, Any]
    out["fds"] = [end]
    try:
        st = os.stat(seen)
    except OSError as exc:
        end["notes"] = ["%s: %s" % (path[:100], exc.strerror or exc)]
        return
    end["kind"] = _kind_of(st)
    if end["kind"] != "fifo" or access not in ("read", "write"):
        return
    # holders are indexed by the path their own fds show: this process's view of it, when it shares our mounts
    note = kwait_procs.by_path_note(ctx)
    real = path if note else os.path.realpath(seen)
    end["target"] = real[:300]
    end["others"], end["complete"] = _pipe_ends(ctx, real, access)
    if note and not end["others"]:
        end["notes"] = ["nobody found" + note]


def _sleep(ctx: Reader, name: str, args: List[int], out: Dict[str, Any]) -> None:
    """The time asked for (clock_nanosleep with TIMER_ABSTIME: the time left until its deadline)."""
    if name == "nanosleep":
        out["timeout"] = ctx.timespec(args[0])
        return
    clock, flags = args[0] & 0xFFFFFFFF, args[1]
    asked = ctx.timespec(args[2])
    if asked is None or asked < 0 or not flags & 1:
        out["timeout"] = asked if asked is None or asked >= 0 else None
        return
    try:
        now = time.clock_gettime(clock)
    except (OSError, OverflowError):
        out["notes"].append("an absolute deadline on clock %d" % clock)
        return
    out["timeout"] = round(max(0.0, asked - now), 6)


_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS",
                 8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM",
                 15: "SIGTERM", 16: "SIGSTKFLT", 17: "SIGCHLD", 18: "SIGCONT", 19: "SIGSTOP", 20: "SIGTSTP",
                 21: "SIGTTIN", 22: "SIGTTOU", 23: "SIGURG", 24: "SIGXCPU", 25: "SIGXFSZ", 26: "SIGVTALRM",
                 27: "SIGPROF", 28: "SIGWINCH", 29: "SIGIO", 30: "SIGPWR", 31: "SIGSYS"}  # x86_64 and aarch64 alike
MAX_SIGNALS = 16


def _signals(ctx: Reader, args: List[int], out: Dict[str, Any]) -> None:
    """rt_sigtimedwait (sigwait, sigwaitinfo, sigtimedwait): the signals it waits for (its set, 64 bits, read from
    memory) and its timeout (none: -1)."""
    out["timeout"] = ctx.timespec(args[2]) if args[2] else -1.0
    data = ctx.read(args[0], 8) if args[0] else None
    if data is None:
        return
    bits = struct.unpack("<Q", data)[0]
    names = [_SIGNAL_NAMES.get(n) or ("SIGRTMIN+%d" % (n - 34) if n >= 34 else "signal %d" % n)
             for n in range(1, 65) if bits >> (n - 1) & 1]
    out["signals"] = names[:MAX_SIGNALS]


# -- files a sleeping poll loop names ---------------------------------------------------------------------------

MAX_POLLED_PATHS = 3  # paths per thread
POLLED_FRAMES = 8  # innermost Python frames whose locals are looked at
_SKIP_TREES = ("/proc/", "/sys/", "/dev/")


def polled_paths(cache: Dict[str, Any], pid: int, threads: List[Dict[str, Any]], traces: Any) -> Optional[str]:
    """For each thread asleep in a sleep call (a poll loop sleeps, then checks again) whose innermost Python frames
    (py-spy's --locals, already redacted) hold absolute paths as string values: the processes of the node holding
    each path open for writing, as waits["watched"] ([{"target", "kind": "file", "access": "read", "others",
    "complete"}]), from the request's one scan of /proc/*/fd. Names are compared as the kernel gives them
    (readlink of /proc/PID/fd/FD): a path through a symlink is not matched. No file is opened or stat'ed, so a file
    system that does not answer cannot hold the worker. Returns the action to record, or None."""
    if not isinstance(traces, list):
        return None
    stacks = {t.get("os_thread_id"): t for t in traces if isinstance(t, dict)}
    index = fdindex.shared(cache)
    looked = 0
    for t in threads:
        waits = t.get("waits") if isinstance(t, dict) else None
        if not isinstance(waits, dict) or waits.get("family") != "sleep":
            continue
        stack = stacks.get(t.get("tid"))
        frames = stack.get("frames") if isinstance(stack, dict) else None
        if not isinstance(frames, list):
            continue
        paths: List[str] = []
        for frame in frames[:POLLED_FRAMES]:
            for local in (frame.get("locals") or [])[:64] if isinstance(frame, dict) else ():
                text = local.get("repr") if isinstance(local, dict) else None
                if not isinstance(text, str) or len(text) < 4 or len(text) > MAX_PATH + 2:
                    continue
                if text[0] not in "\"'" or text[-1] != text[0] or text[1] != "/":
                    continue
                path = text[1:-1]
                # an escape, a part the redaction masked or a cut repr is not the path's name as the kernel has it
                if "\\" in path or "\0" in path or "***" in path or path in paths or path.startswith(_SKIP_TREES):
                    continue
                paths.append(path)
                if len(paths) == MAX_POLLED_PATHS:
                    break
            if len(paths) == MAX_POLLED_PATHS:
                break
        watched = []
        for path in paths:
            writers, complete = fdindex.ends(index, path, (1, 2), "writer", pid)
            watched.append({"fd": None, "target": path, "kind": "file", "access": "read", "others": writers,
                            "complete": complete})
        if watched:
            waits["watched"] = watched
            looked += len(watched)
    if not looked:
        return None
    return "looked up which processes hold %d path%s a polling thread names open for writing (/proc/*/fd)" % (
        looked, "s" * (looked != 1))
