"""The worker's first message: who and where it runs, and which tools it found."""

from __future__ import annotations

import os
import pwd
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Optional

    from workers.protocol import Hello

from workers import WORKER_VERSION
from workers.collect.tools import Tools
from workers.protocol import PROTOCOL_VERSION


def ptrace_scope() -> Optional[int]:
    """kernel.yama.ptrace_scope, or None when Yama is not built in (then only uid and capabilities count)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def has_psutil() -> bool:
    """Whether psutil could be imported (discovery uses it on request); found without importing it."""
    import importlib.machinery

    try:
        return importlib.machinery.PathFinder.find_spec("psutil") is not None
    except (ImportError, ValueError):
        return False


def pid_namespace(pid: str = "self") -> Optional[str]:
    try:
        return os.readlink("/proc/%s/ns/pid" % pid)
    except OSError:
        return None


def hello(tools: Tools) -> Hello:
    found, searched = tools.describe()
    uid = os.getuid()
    uname = os.uname()  # what platform.release()/machine() and socket.gethostname() read, minus two imports
    return {
        "type": "hello", "protocol": PROTOCOL_VERSION, "worker_version": WORKER_VERSION,
        "python": "%d.%d.%d" % sys.version_info[:3], "python_exe": sys.executable or "",
        "pid": os.getpid(), "uid": uid, "euid": os.geteuid(), "user": user_name(uid),
        "hostname": uname.nodename, "kernel": uname.release, "machine": uname.machine,
        "ptrace_scope": ptrace_scope(), "cpus": cpu_count(), "psutil": has_psutil(),
        "pid_ns": pid_namespace(), "tools": found, "searched": searched,
    }
