"""What holds a process, read before any tool touches it: stopped (by a signal or a tracer), frozen by the cgroup
freezer (v1 `freezer.state`, v2 `cgroup.freeze` / `cgroup.events`), in uninterruptible sleep (D, with its wait
channel and, where readable, the file its blocking call is on), a zombie or exiting.

Only /proc and cgroupfs are read: nothing here attaches, signals or waits on the process. The tool gating in
workers/collect/ uses `holds()` to keep blocking (ptrace) tools off processes they would hang on or change.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Tuple

from workers import procinfo

_PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit()

# Syscalls whose first argument is a file descriptor, by number, per architecture (the numbers
# /proc/PID/syscall shows): the ones a process is seen blocked in.
_FD_SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 16: "ioctl", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev",
               72: "fcntl", 73: "flock", 74: "fsync", 75: "fdatasync", 77: "ftruncate", 217: "getdents64",
               277: "sync_file_range", 285: "fallocate", 295: "preadv", 296: "pwritev", 306: "syncfs",
               40: "sendfile", 275: "splice", 326: "copy_file_range", 44: "sendto", 45: "recvfrom",
               46: "sendmsg", 47: "recvmsg", 3: "close"},
    "aarch64": {63: "read", 64: "write", 29: "ioctl", 67: "pread64", 68: "pwrite64", 65: "readv", 66: "writev",
                25: "fcntl", 32: "flock", 82: "fsync", 83: "fdatasync", 46: "ftruncate", 61: "getdents64",
                84: "sync_file_range", 47: "fallocate", 69: "preadv", 70: "pwritev", 267: "syncfs",
                71: "sendfile", 76: "splice", 285: "copy_file_range", 206: "sendto", 207: "recvfrom",
                211: "sendmsg", 212: "recvmsg", 57: "close"},
}
_mounts_cache: Optional[Tuple[str, Dict[str, str]]] = None


def _read(path: str, limit: int = 4096) -> str:
    try:
        return procinfo.read_file(path, limit).decode("utf-8", "replace")
    except OSError:
        return ""


def cgroup_mounts() -> Tuple[str, Dict[str, str]]:
    """(the cgroup2 mount point or "", {v1 controller: its mount point}), from this worker's mountinfo."""
    global _mounts_cache
    if _mounts_cache is not None:
        return _mounts_cache
    v2, v1 = "", {}  # type: str, Dict[str, str]
    for line in _read("/proc/self/mountinfo", 1 << 20).splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        if tail[0] == "cgroup2" and not v2:
            v2 = point
        elif tail[0] == "cgroup":
            for opt in tail[2].split(","):
                v1.setdefault(opt, point)
    _mounts_cache = (v2, v1)
    return _mounts_cache


def _cgroups(pid: int) -> Tuple[Optional[str], Optional[str]]:
    """(the v2 path, the v1 freezer path) of the process, relative to their mounts."""
    v2 = freezer = None
    for line in _read("/proc/%d/cgroup" % pid, 1 << 16).splitlines():
        hid, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if hid == "0" and ctrls == "":
            v2 = path
        elif "freezer" in ctrls.split(","):
            freezer = path
    return v2, freezer


def _join(mount: str, path: str) -> str:
    return mount.rstrip("/") + "/" + path.strip("/") if path.strip("/") else mount


def _parents(path: str) -> List[str]:
    """path, its parent, ... up to (without) the root."""
    out = []
    parts = [p for p in path.split("/") if p]
    while parts:
        out.append("/" + "/".join(parts))
        parts.pop()
    return out


def freezer(pid: int) -> Optional[Dict[str, Any]]:
    """The freezer that holds the process, or None: {"version": 1|2, "cgroup": the cgroup set to freeze (the
    one to thaw), "state": FROZEN|FREEZING, "path": its control file, "thaw": the command that thaws it}."""
    v2_mount, v1_mounts = cgroup_mounts()
    v2_path, v1_path = _cgroups(pid)
    if v2_mount and v2_path is not None and v2_path.strip("/"):
        events = _read(_join(v2_mount, v2_path) + "/cgroup.events")
        frozen = "frozen 1" in events.splitlines()
        own = _read(_join(v2_mount, v2_path) + "/cgroup.freeze").strip() == "1"  # set, maybe not complete yet
        # cgroup.freeze is each cgroup's own setting; an ancestor's freezes it too: name the one set (the
        # ancestors are read only for a frozen process: one or two reads in the usual case)
        setters = ([p for p in _parents(v2_path) if _read(_join(v2_mount, p) + "/cgroup.freeze").strip() == "1"]
                   if frozen or own else [])
        if frozen or setters:
            target = setters[0] if setters else v2_path
            control = _join(v2_mount, target) + "/cgroup.freeze"
            return {"version": 2, "cgroup": target, "state": "FROZEN" if frozen else "FREEZING", "path": control,
                    "thaw": "echo 0 > %s" % control}
    mount = v1_mounts.get("freezer")
    if mount and v1_path is not None and v1_path.strip("/"):
        state = _read(_join(mount, v1_path) + "/freezer.state").strip()
        if state in ("FROZEN", "FREEZING"):
            setters = [p for p in _parents(v1_path)
                       if _read(_join(mount, p) + "/freezer.self_freezing").strip() == "1"]
            target = setters[0] if setters else v1_path
            control = _join(mount, target) + "/freezer.state"
            return {"version": 1, "cgroup": target, "state": state, "path": control,
                    "thaw": "echo THAWED > %s" % control}
    return None


def _container_hint(cgroup: str) -> str:
    """`docker unpause ID` / `podman unpause ID` for a container's cgroup, "" otherwise."""
    for part in reversed(cgroup.split("/")):
        for prefix, tool in (("docker-", "docker"), ("libpod-", "podman")):
            if part.startswith(prefix) and part.endswith(".scope"):
                return "%s unpause %s" % (tool, part[len(prefix):-len(".scope")][:12])
    parts = cgroup.strip("/").split("/")
    if len(parts) >= 2 and parts[-2] == "docker" and len(parts[-1]) == 64:
        return "docker unpause %s" % parts[-1][:12]
    return ""


def _waits_on(pid: int, tid: int) -> Tuple[str, str]:
    """(the syscall, the file or device it is on) for a thread blocked in a call on a file descriptor."""
    raw = _read("/proc/%d/task/%d/syscall" % (pid, tid), 512).split()
    if not raw or not raw[0].lstrip("-").isdigit():
        return "", ""  # "running", or unreadable
    nr = int(raw[0])
    names = _FD_SYSCALLS.get(os.uname().machine, {})
    name = names.get(nr, "")
    if not name or len(raw) < 2:
        return name or ("syscall %d" % nr if nr >= 0 else ""), ""
    try:
        fd = int(raw[1], 16)
        return name, os.readlink("/proc/%d/fd/%d" % (pid, fd))[:300]
    except (ValueError, OSError):
        return name, ""


PIPE_WRITES = ("write", "writev", "pwrite64", "pwritev", "splice")


def pipe_wait(pid: int, threads: List[Dict[str, Any]], cache: Optional[Dict[str, Any]] = None
              ) -> Optional[Dict[str, Any]]:
    """A thread asleep writing to a pipe (its wait channel names a pipe): {"tid", "syscall", "pipe" ("pipe:[N]"),
    "readers": [{"pid", "comm", "state", "ppid", "wchan", "cmdline", "fd", "own"}], "scanned", "complete"}; None
    when no thread is. The readers are the processes holding the pipe open for reading (fdinfo's access mode, the
    writer's own process included), from the request's shared scan of /proc/*/fd (workers/collect/fdindex.py,
    bounded there; cache: the request's shared cache, a fresh one without it): only /proc is read."""
    from workers.collect import fdindex

    for t in threads:
        if not isinstance(t, dict) or t.get("state") != "S" or "pipe" not in str(t.get("wchan", "")):
            continue
        tid = t.get("tid")
        if not isinstance(tid, int):
            continue
        syscall, target = _waits_on(pid, tid)
        if syscall not in PIPE_WRITES or not target.startswith("pipe:["):
            continue
        index = fdindex.shared({} if cache is None else cache)
        readers, complete = fdindex.ends(index, target, (0, 2), "reader", pid)
        return {"tid": tid, "syscall": syscall, "pipe": target, "readers": readers, "scanned": index.scanned,
                "complete": complete}
    return None


OWN_TOOL_DEPTH = 3  # worker -> tool, worker -> sudo -> tool, worker -> sudo -> setpriv -> tool


def ours(tracer: int) -> bool:
    """Whether a tracer is a tool this worker started (py-spy, strace, gdb; through sudo or setpriv): its
    thread group descends from this process within OWN_TOOL_DEPTH generations. A tracer's pid in TracerPid is
    the tracing thread's; its Tgid names the process."""
    me = os.getpid()
    tgid = procinfo.status_field(tracer, "Tgid")
    pid = int(tgid) if tgid.isdigit() else tracer
    for _ in range(OWN_TOOL_DEPTH):
        parent = procinfo.status_field(pid, "PPid")
        if not parent.isdigit() or int(parent) <= 1:
            return False
        if int(parent) == me:
            return True
        pid = int(parent)
    return False


def read(pid: int, threads: Optional[List[Tuple[int, str]]] = None) -> Dict[str, Any]:
    """What holds the process (see the module doc). Keys: state (its letter), kind (running, sleeping,
    stopped, traced, frozen, disk_sleep, zombie, exiting, gone), stopped_by (signal, tracer or ""), tracer_pid,
    tracer, tracer_ours (present and true when the tracer is a tool this worker started: ours()), tty (it has a
    controlling terminal: job control can stop it), freezer (freezer()), wchan, syscall, waits_on, d_threads
    (threads in D). threads: (tid, state letter) already read (procfs.collect), else read."""
    out = {"state": "", "kind": "gone", "stopped_by": "", "tracer_pid": 0, "tracer": "", "tty": False,
           "freezer": None, "wchan": "", "syscall": "", "waits_on": "", "d_threads": []}  # type: Dict[str, Any]
    try:
        fields = procinfo.stat_fields(pid)
    except (procinfo.Gone, OSError, IndexError):
        return out
    state = out["state"] = fields[2]
    out["tty"] = fields[6] not in ("0", "")
    out["wchan"] = procinfo.wchan(pid)
    tracer = procinfo.status_field(pid, "TracerPid")
    out["tracer_pid"] = int(tracer) if tracer.isdigit() else 0
    if out["tracer_pid"]:
        out["tracer"] = _read("/proc/%d/comm" % out["tracer_pid"], 256).strip() or "?"
        if ours(out["tracer_pid"]):
            out["tracer_ours"] = True
    if state in ("Z", "X"):
        out["kind"] = "zombie"
        return out
    try:
        exiting = int(fields[8]) & _PF_EXITING
    except (IndexError, ValueError):
        exiting = 0
    if exiting:
        out["kind"] = "exiting"
        return out
    # Frozen first: a v1 frozen task shows D (and whatever wchan it was frozen in), a v2 frozen one S.
    frozen = freezer(pid)
    if frozen is not None:
        frozen["container"] = _container_hint(frozen["cgroup"])
        out["freezer"], out["kind"] = frozen, "frozen"
        return out
    if state in ("T", "t"):
        out["kind"] = "traced" if state == "t" or out["tracer_pid"] else "stopped"
        out["stopped_by"] = "tracer" if out["kind"] == "traced" else "signal"
        return out
    d_threads = [tid for tid, st in (_thread_states(pid) if threads is None else threads) if st == "D"]
    if state == "D" or d_threads:
        out["kind"], out["d_threads"] = "disk_sleep", d_threads or [pid]
        tid = pid if state == "D" else d_threads[0]
        out["syscall"], out["waits_on"] = _waits_on(pid, tid)
        if tid != pid:
            out["wchan"] = procinfo.wchan(pid, tid)
        return out
    out["kind"] = "running" if state == "R" else "sleeping"
    return out


def _thread_states(pid: int) -> List[Tuple[int, str]]:
    out: List[Tuple[int, str]] = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for name in tids[:4096]:
        if not name.isdigit():
            continue
        raw = _read("/proc/%d/task/%s/stat" % (pid, name), 1024)
        _, _, rest = raw.rpartition(")")
        st = rest.split()[:1]
        if st:
            out.append((int(name), st[0]))
    return out


# Kinds on which a blocking (ptrace) tool must not run: it would wait for a process that cannot answer
# (frozen, D: the attach waits for a stop that never comes) or change what the user sees (stopped, traced).
HELD = frozenset({"stopped", "traced", "frozen", "disk_sleep"})


def held(info: Dict[str, Any]) -> bool:
    return info.get("kind") in HELD


def describe(info: Dict[str, Any]) -> str:
    """One phrase: `stopped by a signal (SIGSTOP or job control)`, `frozen by the cgroup freezer (v2 cgroup
    /x)`, `in uninterruptible sleep (D) in read on /mnt/nfs/f, wchan rpc_wait_bit_killable`."""
    kind = info.get("kind")
    if kind == "stopped":
        return "stopped by a signal (SIGSTOP%s)" % (", or Ctrl-Z / job control in its terminal" if info.get("tty")
                                                     else " or job control")
    if kind == "traced":
        if info.get("tracer_pid"):
            return "stopped by its tracer, PID %d (%s)" % (info["tracer_pid"], info.get("tracer") or "?")
        return "in a tracing stop"
    if kind == "frozen":
        f = info.get("freezer") or {}
        return "frozen by the cgroup freezer (v%s cgroup %s, %s)" % (f.get("version"), f.get("cgroup"),
                                                                     f.get("state"))
    if kind == "disk_sleep":
        where = " in %s" % info["syscall"] if info.get("syscall") else ""
        on = " on %s" % info["waits_on"] if info.get("waits_on") else ""
        chan = ", wchan %s" % info["wchan"] if info.get("wchan") else ""
        return "in uninterruptible sleep (D)%s%s%s" % (where, on, chan)
    if kind == "zombie":
        return "a zombie (exited, not reaped)"
    if kind == "exiting":
        return "exiting"
    return ""
