"""What moves in a rank between two samples, read from /proc and the cgroup file system without touching it.

A stack says where a rank is; these counters say whether it gets anywhere: CPU time (/proc/PID/stat), context
switches (/proc/PID/status), time spent runnable but waiting for a CPU (/proc/PID/schedstat), bytes read and
written (/proc/PID/io, where this user may read it), what it wrote to stdout/stderr when those are files
(/proc/PID/fdinfo/{1,2} "pos"), and the CPU throttling of the cgroup that limits it (cgroup v2 cpu.stat and
cpu.max, v1 cpu.stat and cpu.cfs_quota_us/cfs_period_us). Bytes sent and received on its TCP sockets come with
the sockets (workers/collect/sockets.py: tcp_info's bytes_acked/bytes_received).

Each read is a small file, bounded, and a missing or unreadable one leaves its key out: ~20 us per rank.
Module-level loop counters (a script's `iter_num` at the top level, as nanoGPT's train.py keeps it) are not
read here but with the stacks: py-spy's --locals shows nothing for a `<module>` frame (its variables are
globals, not fast locals), so the dump reads them from the rank's memory (workers/collect/pyglobals.py, with
--locals only: /proc/PID/mem, the same access py-spy needs); the counters above tell a rank that progresses
without them.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Tuple

from workers import procinfo

MAX_CGROUP_DEPTH = 32  # ancestors walked up to find the cgroup that sets a CPU limit
_mounts: Optional[Tuple[Optional[str], Optional[str]]] = None  # (cgroup2 mount, v1 cpu controller mount)
# What changes rarely in a process (its cgroup, whether stdout/stderr are files) is read again after this many
# seconds, not on every sample: a long-lived worker (the TUI's refreshes) still sees a rank moved to a cgroup.
STICKY_SECONDS = 5.0
MAX_CACHED = 4096
_sticky: Dict[Tuple[str, int, str], Tuple[float, Any]] = {}


def _cached(kind: str, pid: int, read: Any, start: str = "") -> Any:
    """read() for this process (pid and start time: a reused pid is another process), at most every
    STICKY_SECONDS."""
    now = time.monotonic()
    hit = _sticky.get((kind, pid, start))
    if hit is not None and hit[0] > now:
        return hit[1]
    if len(_sticky) >= MAX_CACHED:
        _sticky.clear()
    value = read()
    _sticky[(kind, pid, start)] = (now + STICKY_SECONDS, value)
    return value


def _read(path: str, limit: int = 4096) -> Optional[str]:
    try:
        return procinfo.read_file(path, limit).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def _keyed(text: str) -> Dict[str, int]:
    """"name value" lines (cpu.stat, /proc/PID/io "name: value") as integers; other lines are skipped."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def cgroup_mounts(mountinfo: Optional[str] = None) -> Tuple[Optional[str], Optional[str]]:
    """Where the cgroup2 hierarchy and the v1 cpu controller are mounted (from /proc/self/mountinfo)."""
    text = mountinfo if mountinfo is not None else (_read("/proc/self/mountinfo", 1 << 20) or "")
    v2 = v1 = None
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        if not sep:
            continue
        fields, extra = head.split(), tail.split()
        if len(fields) < 5 or len(extra) < 3 or fields[3] != "/":
            continue  # a bind mount of a sub-tree: its paths do not start at the hierarchy's root
        if extra[0] == "cgroup2" and v2 is None:
            v2 = fields[4]
        elif extra[0] == "cgroup" and "cpu" in extra[2].split(",") and v1 is None:
            v1 = fields[4]
    return v2, v1


def _mount_points() -> Tuple[Optional[str], Optional[str]]:
    global _mounts
    if _mounts is None:
        _mounts = cgroup_mounts()
    return _mounts


def parse_cgroup(text: str) -> Tuple[Optional[str], Optional[str]]:
    """/proc/PID/cgroup: (the cgroup2 path, the v1 cpu controller's path)."""
    v2 = v1 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _ancestors(path: str) -> List[str]:
    out: List[str] = []
    path = "/" + path.strip("/")
    while len(out) < MAX_CGROUP_DEPTH:
        out.append(path)
        if path == "/":
            break
        path = path.rsplit("/", 1)[0] or "/"
    return out


def cgroup_cpu(pid: int, start: str = "") -> Optional[Dict[str, Any]]:
    """The CPU limit that applies to pid and how often it bit: the nearest cgroup (its own or an ancestor's)
    that sets a quota, with that cgroup's throttling counters; else the rank's own cgroup's counters (no
    limit). {"version", "path", "quota_us", "period_us", "nr_periods", "nr_throttled", "throttled_us"}."""
    paths = _cached("cgroup", pid, lambda: _cgroup_paths(pid), start)
    if paths is None:
        return None
    path2, path1 = paths
    mount2, mount1 = _mount_points()
    # v1 when the cpu controller is there (then v2 has none), else v2
    if path1 is not None and mount1 is not None:
        return _cgroup_v1(mount1, path1)
    if path2 is not None and mount2 is not None:
        return _cgroup_v2(mount2, path2)
    return None


def _cgroup_paths(pid: int) -> Optional[Tuple[Optional[str], Optional[str]]]:
    text = _read("/proc/%d/cgroup" % pid)
    return parse_cgroup(text) if text is not None else None


def _cgroup_v2(mount: str, path: str) -> Optional[Dict[str, Any]]:
    own = None
    for cg in _ancestors(path):
        base = mount.rstrip("/") + cg
        limit = _read(base + "/cpu.max", 256)
        stat = _read(base + "/cpu.stat")
        if stat is None:
            continue
        row = _row("v2", cg, _keyed(stat), None, None)
        row["throttled_us"] = _keyed(stat).get("throttled_usec")
        parts = (limit or "").split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            row["quota_us"], row["period_us"] = int(parts[0]), int(parts[1])
            return row
        if own is None:
            own = row
    return own


def _cgroup_v1(mount: str, path: str) -> Optional[Dict[str, Any]]:
    own = None
    for cg in _ancestors(path):
        base = mount.rstrip("/") + cg
        stat = _read(base + "/cpu.stat")
        if stat is None:
            continue
        values = _keyed(stat)
        quota, period = _read(base + "/cpu.cfs_quota_us", 64), _read(base + "/cpu.cfs_period_us", 64)
        q = int(quota) if quota and quota.strip().lstrip("-").isdigit() else None
        p = int(period) if period and period.strip().isdigit() else None
        row = _row("v1", cg, values, q if q is not None and q > 0 else None, p)
        time_ns = values.get("throttled_time")
        row["throttled_us"] = time_ns // 1000 if time_ns is not None else None
        if row["quota_us"] is not None:
            return row
        if own is None:
            own = row
    return own


def _row(version: str, path: str, values: Dict[str, int], quota: Optional[int], period: Optional[int]
         ) -> Dict[str, Any]:
    return {"version": version, "path": path[:512], "quota_us": quota, "period_us": period,
            "nr_periods": values.get("nr_periods"), "nr_throttled": values.get("nr_throttled"),
            "throttled_us": None}


def _log_fds(pid: int) -> List[int]:
    """Which of stdout and stderr are regular files (stderr left out when it is the same file)."""
    fds = []
    seen = set()
    for fd in (1, 2):
        try:
            target = os.readlink("/proc/%d/fd/%d" % (pid, fd))
            st = os.stat("/proc/%d/fd/%d" % (pid, fd))
        except OSError:
            continue
        if not target.startswith("/") or (st.st_mode & 0o170000) != 0o100000 or (st.st_dev, st.st_ino) in seen:
            continue  # a pipe, a terminal, a socket; or stderr sent to the same file
        seen.add((st.st_dev, st.st_ino))
        fds.append(fd)
    return fds


def _log_pos(pid: int, start: str = "") -> Optional[int]:
    """Bytes written so far to stdout and stderr where they are regular files (their file offsets)."""
    total = None
    for fd in _cached("log", pid, lambda: _log_fds(pid), start):
        info = _read("/proc/%d/fdinfo/%d" % (pid, fd), 1024)
        pos = _keyed(info).get("pos") if info else None
        if pos is not None:
            total = (total or 0) + pos
    return total


def collect(pid: int) -> Optional[Dict[str, Any]]:
    """The rank's counters now, with the node's time they were read at; None when the process is gone."""
    raw = _read("/proc/%d/stat" % pid)
    if raw is None:
        return None
    fields = procinfo.parse_stat(raw.encode())
    out: Dict[str, Any] = {"at": round(time.time(), 6), "state": fields[2]}
    try:
        out["utime"] = int(fields[13]) / procinfo.CLK_TCK
        out["stime"] = int(fields[14]) / procinfo.CLK_TCK
    except (IndexError, ValueError):
        pass
    status = _read("/proc/%d/status" % pid, 8192)
    if status:
        values = _keyed(status)
        out["voluntary_ctxt"] = values.get("voluntary_ctxt_switches")
        out["nonvoluntary_ctxt"] = values.get("nonvoluntary_ctxt_switches")
    sched = (_read("/proc/%d/schedstat" % pid, 256) or "").split()
    if len(sched) >= 2 and sched[0].isdigit() and sched[1].isdigit():
        out["run_ns"], out["wait_ns"] = int(sched[0]), int(sched[1])
    io = _read("/proc/%d/io" % pid, 1024)
    if io:
        values = _keyed(io)
        for key in ("rchar", "wchar", "read_bytes", "write_bytes"):
            if key in values:
                out[key] = values[key]
    # the main thread's own writes (its task's io): output that grew while the main thread wrote nothing was
    # written by another thread (a logger, a progress bar's timer, a server thread) or another process sharing the
    # file, which says nothing of whether the job's own loop moves
    main = _read("/proc/%d/task/%d/io" % (pid, pid), 1024)
    if main:
        wchar = _keyed(main).get("wchar")
        if wchar is not None:
            out["main_wchar"] = wchar
    start = fields[21] if len(fields) > 21 else ""
    log = _log_pos(pid, start)
    if log is not None:
        out["log_bytes"] = log
    cg = cgroup_cpu(pid, start)
    if cg is not None:
        out["cgroup"] = cg
    return out
