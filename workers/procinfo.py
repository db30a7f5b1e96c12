"""Facts about one process, read from /proc, or through psutil when asked for (same results, slower).

Raises Gone for a process that disappears mid-read; an unreadable environment is `environ is None` with
`environ_denied` set, never an exception, so a scan can count processes it could not inspect.
"""

from __future__ import annotations

import os
import pwd

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Dict, List, Optional

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# psutil's status names back to /proc's letters, so both sources report the same state.
_PSUTIL_STATES = {"running": "R", "sleeping": "S", "disk-sleep": "D", "stopped": "T", "tracing-stop": "t",
                  "zombie": "Z", "dead": "X", "wake-kill": "K", "waking": "W", "idle": "I", "parked": "P"}


class Gone(Exception):
    """The process exited (or its pid was reused) while it was being read."""


class Proc:
    """One process as discovery needs it."""

    __slots__ = ("pid", "ppid", "comm", "exe", "cmdline", "uid", "state", "start_time", "num_threads",
                 "cpu_time", "rss", "environ", "environ_denied", "exec_key")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ppid = 0
        self.comm = ""
        self.exe = ""
        self.cmdline: List[str] = []
        self.uid: Optional[int] = None
        self.state = ""
        self.start_time = 0
        self.num_threads = 0
        self.cpu_time = 0.0
        self.rss = 0
        self.environ: Optional[Dict[str, str]] = None
        self.environ_denied = False
        self.exec_key: tuple = ()

    def copy(self) -> "Proc":
        p = Proc(self.pid)
        for name in Proc.__slots__:
            setattr(p, name, getattr(self, name))
        return p

    def update(self, fields: List[str]) -> None:
        """Take what changes while a process lives from its parsed /proc/PID/stat (parse_stat's list); RSS
        is not among them: stat's figure is the kernel's approximate per-CPU sum, statm's the exact one."""
        self.comm, self.state, self.ppid = fields[1], fields[2], int(fields[3])
        self.cpu_time = (int(fields[13]) + int(fields[14])) / CLK_TCK
        self.num_threads, self.start_time = int(fields[19]), int(fields[21])
        self.exec_key = exec_key(fields)


def read_file(path: str, limit: int = 1 << 20) -> bytes:
    with open(path, "rb") as f:
        return f.read(limit)


def parse_stat(data: bytes) -> List[str]:
    """/proc/PID/stat split into fields; field 2 (comm) may hold spaces and parentheses, so split at the
    last ')'. Index i of the result is field i+1 of proc(5): [0] pid, [1] comm, [2] state, [3] ppid."""
    text = data.decode("utf-8", "replace")
    head, _, rest = text.rpartition(")")
    pid, _, comm = head.partition(" (")
    return [pid, comm] + rest.split()


def stat_fields(pid: int) -> List[str]:
    try:
        return parse_stat(read_file("/proc/%d/stat" % pid))
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise Gone(pid) from exc


def start_time(pid: int) -> int:
    """Field 22 of /proc/PID/stat: start time in clock ticks after boot; the pid-reuse check compares it."""
    return int(stat_fields(pid)[21])


def exec_key(fields: List[str]) -> tuple:
    """What tells this process image from the one before an exec, from parsed /proc/PID/stat: comm (an exec
    names it after the new program, but python re-exec'ing python keeps it) and the start of its stack and
    of its arguments and environment (28, 48-51: every exec lays out a new stack, randomised by ASLR; zero
    for processes this user may not trace, where comm and the start time are all there is)."""
    # kernel threads (children of kthreadd, pid 2) never exec, and a kworker renames itself after the work
    # queue it serves ("kworker/0:0-events"): its name is no sign of a new image
    comm = "" if fields[3] == "2" or fields[0] == "2" else fields[1]
    return (comm, fields[21], fields[27]) + tuple(fields[47:51])


def rss(pid: int) -> int:
    """Resident bytes, from /proc/PID/statm (what psutil's memory_info().rss reads)."""
    return int(read_file("/proc/%d/statm" % pid).split()[1]) * PAGE_SIZE


def parse_environ(data: bytes) -> Dict[str, str]:
    env: Dict[str, str] = {}
    for entry in data.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        if eq and name:
            env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def status_field(pid: int, name: str) -> str:
    """One field of /proc/PID/status ("" when absent or unreadable), without splitting the whole file."""
    return status_field_at("/proc/%d/status" % pid, name)


def status_field_at(path: str, name: str) -> str:
    try:
        data = b"\n" + read_file(path)
    except OSError:
        return ""
    key = b"\n" + name.encode("ascii") + b":"
    at = data.find(key)
    if at < 0:
        return ""
    end = data.find(b"\n", at + len(key))
    return data[at + len(key):end if end >= 0 else len(data)].decode("utf-8", "replace").strip()


def ns_id(pid: int, tid: Optional[int] = None) -> Optional[int]:
    """The process's (or thread's) id in its own, innermost pid namespace, from NSpid; None when that is the
    id seen here (same namespace) or cannot be read."""
    own = pid if tid is None else tid
    path = "/proc/%d/status" % pid if tid is None else "/proc/%d/task/%d/status" % (pid, tid)
    ids = status_field_at(path, "NSpid").split()
    inner = int(ids[-1]) if ids and ids[-1].isdigit() else None
    return inner if inner != own else None


def wchan(pid: int, tid: Optional[int] = None) -> str:
    path = "/proc/%d/wchan" % pid if tid is None else "/proc/%d/task/%d/wchan" % (pid, tid)
    try:
        value = read_file(path, 256).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return "" if value == "0" else value


def namespace(pid: int, kind: str) -> Optional[str]:
    try:
        return os.readlink("/proc/%d/ns/%s" % (pid, kind))
    except OSError:
        return None


def user_name(uid: Optional[int]) -> str:
    if uid is None:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def all_pids() -> List[int]:
    return sorted(int(d) for d in os.listdir("/proc") if d.isdigit())


class ProcfsSource:
    """Reads /proc directly (the stdlib-only path)."""

    name = "procfs"

    def pids(self) -> List[int]:
        return all_pids()

    def read(self, pid: int, with_environ: bool = True, stat: Optional[List[str]] = None) -> Proc:
        p = Proc(pid)
        p.update(stat or stat_fields(pid))
        try:
            raw = read_file("/proc/%d/cmdline" % pid)
            p.cmdline = [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else []
            p.rss = rss(pid)
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise Gone(pid) from exc
        try:
            p.exe = os.readlink("/proc/%d/exe" % pid)
        except FileNotFoundError:
            if not os.path.exists("/proc/%d" % pid):
                raise Gone(pid)
        except OSError:
            pass  # another user's process: exe is hidden, the cmdline still tells
        uids = status_field(pid, "Uid").split()
        p.uid = int(uids[0]) if uids else None
        if with_environ:
            try:
                p.environ = parse_environ(read_file("/proc/%d/environ" % pid, 4 << 20))
            except PermissionError:
                p.environ_denied = True
            except (FileNotFoundError, ProcessLookupError) as exc:
                raise Gone(pid) from exc
        return p


class PsutilSource:
    """Reads through psutil; only what psutil lacks (start ticks, wchan, namespaces) comes from /proc."""

    name = "psutil"

    def __init__(self) -> None:
        import psutil

        self._ps = psutil

    def pids(self) -> List[int]:
        return sorted(self._ps.pids())

    def read(self, pid: int, with_environ: bool = True, stat: Optional[List[str]] = None) -> Proc:
        ps = self._ps
        p = Proc(pid)
        try:
            proc = ps.Process(pid)
            with proc.oneshot():
                p.comm, p.ppid = proc.name(), proc.ppid()
                p.state = _PSUTIL_STATES.get(proc.status(), "")
                times = proc.cpu_times()
                p.cpu_time = (round(times.user * CLK_TCK) + round(times.system * CLK_TCK)) / CLK_TCK
                p.num_threads = proc.num_threads()
                p.rss = proc.memory_info().rss
                p.uid = proc.uids().real
                p.cmdline = proc.cmdline()
            # psutil gives create_time in seconds; discovery needs /proc's ticks for the pid-reuse check.
            f = stat or stat_fields(pid)
            p.start_time, p.exec_key = int(f[21]), exec_key(f)
            try:
                p.exe = proc.exe()
            except ps.AccessDenied:
                pass
            if with_environ:
                try:
                    p.environ = proc.environ()
                except ps.AccessDenied:
                    p.environ_denied = True
        except (ps.NoSuchProcess, ps.ZombieProcess) as exc:
            raise Gone(pid) from exc
        return p


def source(prefer_psutil: bool = False):
    """/proc, or psutil when wanted and importable."""
    if prefer_psutil:
        try:
            return PsutilSource()
        except ImportError:
            pass
    return ProcfsSource()
