"""Per-thread facts from /proc that need no ptrace: state, wchan, current syscall, kernel stack, CPU time (and,
added by workers/collect/kwait.py, what a thread blocked in a call waits on).

These still show where a rank waits when py-spy is denied (ptrace_scope, other users) or fails.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional

from workers import procinfo

# Syscalls a hung rank is typically blocked in, by number, for the two architectures clusters run.
_X86_64 = {0: "read", 1: "write", 2: "open", 3: "close", 4: "stat", 5: "fstat", 6: "lstat", 7: "poll", 9: "mmap",
           16: "ioctl", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev", 21: "access", 23: "select",
           24: "sched_yield", 26: "msync", 34: "pause", 35: "nanosleep", 40: "sendfile", 42: "connect", 43: "accept",
           44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4", 65: "semop", 69: "msgsnd",
           70: "msgrcv", 72: "fcntl", 73: "flock", 74: "fsync", 75: "fdatasync", 77: "ftruncate", 82: "rename",
           83: "mkdir", 84: "rmdir", 87: "unlink", 128: "rt_sigtimedwait", 130: "rt_sigsuspend", 162: "sync",
           202: "futex", 208: "io_getevents", 217: "getdents64", 219: "restart_syscall", 220: "semtimedop",
           230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid", 257: "openat", 262: "newfstatat",
           263: "unlinkat", 270: "pselect6", 271: "ppoll", 275: "splice", 276: "tee", 277: "sync_file_range",
           278: "vmsplice", 281: "epoll_pwait", 285: "fallocate", 288: "accept4", 295: "preadv", 296: "pwritev",
           299: "recvmmsg", 306: "syncfs", 307: "sendmmsg", 316: "renameat2", 318: "getrandom",
           326: "copy_file_range", 327: "preadv2", 328: "pwritev2", 332: "statx", 426: "io_uring_enter", 437: "openat2", 441: "epoll_pwait2",
           449: "futex_waitv"}
_AARCH64 = {4: "io_getevents", 22: "epoll_pwait", 25: "fcntl", 29: "ioctl", 32: "flock", 34: "mkdirat",
            35: "unlinkat", 46: "ftruncate", 47: "fallocate", 48: "faccessat", 56: "openat", 57: "close",
            61: "getdents64", 63: "read", 64: "write", 65: "readv", 66: "writev", 67: "pread64", 68: "pwrite64",
            69: "preadv", 70: "pwritev", 71: "sendfile", 72: "pselect6", 73: "ppoll", 75: "vmsplice", 76: "splice",
            77: "tee", 79: "newfstatat", 80: "fstat", 81: "sync", 82: "fsync", 83: "fdatasync",
            84: "sync_file_range", 95: "waitid", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep",
            124: "sched_yield", 128: "restart_syscall", 133: "rt_sigsuspend", 137: "rt_sigtimedwait",
            188: "msgrcv", 189: "msgsnd", 192: "semtimedop", 193: "semop", 202: "accept", 203: "connect",
            206: "sendto", 207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 222: "mmap", 227: "msync",
            242: "accept4", 243: "recvmmsg", 260: "wait4", 267: "syncfs", 269: "sendmmsg", 276: "renameat2",
            278: "getrandom", 285: "copy_file_range", 286: "preadv2", 287: "pwritev2", 291: "statx", 426: "io_uring_enter", 437: "openat2",
            441: "epoll_pwait2", 449: "futex_waitv"}
SYSCALLS = {"x86_64": _X86_64, "amd64": _X86_64, "aarch64": _AARCH64, "arm64": _AARCH64}


def syscall_name(text: str, machine: Optional[str] = None) -> str:
    """First field of /proc/PID/task/TID/syscall as a name: "futex", "running", "" (not in a syscall),
    or "syscall_N" for numbers outside the table."""
    fields = text.split()
    if not fields:
        return ""
    if fields[0] == "running":
        return "running"
    try:
        nr = int(fields[0])
    except ValueError:
        return ""
    if nr < 0:
        return ""  # blocked, but not inside a system call
    table = SYSCALLS.get(machine or os.uname().machine, {})
    return table.get(nr, "syscall_%d" % nr)


def _read(path: str, limit: int = 4096) -> Optional[str]:
    try:
        return procinfo.read_file(path, limit).decode("utf-8", "replace")
    except OSError:
        return None


def thread(pid: int, tid: int, ns_tid: bool = True) -> Optional[Dict[str, Any]]:
    base = "/proc/%d/task/%d/" % (pid, tid)
    stat = _read(base + "stat")
    if stat is None:
        return None  # the thread exited meanwhile
    fields = procinfo.parse_stat(stat.encode())
    syscall = _read(base + "syscall")
    stack = _read(base + "stack", 16384)
    # py-spy run inside a container reports thread ids of the container's pid namespace
    nstid = procinfo.ns_id(pid, tid) if ns_tid else None
    try:  # user + system time (fields 14 and 15): a thread spinning on a core gains ~1 s per second
        cpu_time: Optional[float] = round((int(fields[13]) + int(fields[14])) / procinfo.CLK_TCK, 2)
    except (IndexError, ValueError):
        cpu_time = None
    return {"nstid": nstid,
        "tid": tid, "comm": fields[1], "state": fields[2], "wchan": procinfo.wchan(pid, tid), "cpu_time": cpu_time,
        "syscall": syscall_name(syscall) if syscall else "",
        "syscall_raw": (syscall or "").strip()[:200],
        # "[<0>] futex_wait_queue+0x6c/0xb0": keep the symbol, drop the address part
        "kernel_stack": [line.split("] ", 1)[-1].strip() for line in stack.splitlines()] if stack else [],
    }


def collect(pid: int, ns_tids: bool = True) -> Dict[str, Any]:
    """{"threads": [...]} for every thread of pid (empty when the process is gone or /proc is hidden).
    ns_tids: read each thread's id in its own pid namespace (only differs for a rank in a container)."""
    try:
        tids = sorted(int(t) for t in os.listdir("/proc/%d/task" % pid) if t.isdigit())
    except OSError:
        return {"threads": []}
    threads: List[Dict[str, Any]] = []
    for tid in tids:
        info = thread(pid, tid, ns_tids)
        if info is not None:
            threads.append(info)
    return {"threads": threads}
