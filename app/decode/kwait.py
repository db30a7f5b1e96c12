"""A thread's "waits" (workers/collect/kwait.py: what a blocked call waits on, who is at the other end) turned into
the model's KernelWait: remote data, so every value is type-checked and bounded as it is taken, and nothing raises.
"""

from __future__ import annotations

import math
from sys import intern
import re
from typing import Any, Optional, cast, get_args

from app.model import EndRole, FdKind, KernelWait, OtherEnd, WaitFamily, WaitFd

MAX_FDS = 64
MAX_OTHERS = 8
MAX_NOTES = 8
MAX_ARGS = 16
_FAMILIES = frozenset(get_args(WaitFamily))
_KINDS = frozenset(get_args(FdKind))
_ROLES = frozenset(get_args(EndRole))
_ACCESS = frozenset(("read", "write", "both", "accept", "connect", "lock", ""))
_PROTOS = frozenset(("tcp", "udp", "unix", ""))
_LOCK_TYPES = frozenset(("FLOCK", "POSIX", "OFDLCK", ""))
_LOCK_MODES = frozenset(("READ", "WRITE", ""))
_ADDRESS = re.compile(r"0x[0-9a-f]{1,16}")
_INT32 = 1 << 31


def _int(value: Any, low: int = -_INT32, high: int = _INT32) -> Optional[int]:
    """An int within [low, high), else None (bools are not ints here)."""
    return value if type(value) is int and low <= value < high else None


def _str(value: Any, limit: int) -> str:
    """Bounded; a short one interned (the same states, paths and names on many ranks: app/decode/replies.py)."""
    if type(value) is not str:
        return ""
    value = value[:limit]
    return intern(value) if len(value) <= 200 else value


def _one_of(value: Any, allowed: frozenset) -> str:
    return value if isinstance(value, str) and value in allowed else ""


def _list(value: Any, limit: int) -> list:
    return value[:limit] if isinstance(value, list) else []


def _notes(value: Any) -> tuple[str, ...]:
    return tuple(n[:300] for n in _list(value, MAX_NOTES) if isinstance(n, str))


def _seconds(value: Any) -> Optional[float]:
    """A timeout: -1 (none) or a finite, non-negative number of seconds (at most ~30 years), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if value == -1:
        return -1.0
    return float(value) if 0 <= value < 1e9 else None


def cpu_time(value: Any) -> Optional[float]:
    """A thread's CPU seconds: finite and non-negative, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if 0 <= value < 1e12 else None


def other_end(raw: Any) -> Optional[OtherEnd]:
    if not isinstance(raw, dict):
        return None
    role, pid = _one_of(raw.get("role"), _ROLES), _int(raw.get("pid"), 1)
    if not role or pid is None:
        return None
    return OtherEnd(role=cast(EndRole, role), pid=pid, comm=_str(raw.get("comm"), 64), state=_str(raw.get("state"), 2),
                    ppid=_int(raw.get("ppid"), 0), wchan=_str(raw.get("wchan"), 100),
                    cmdline=tuple(a[:200] for a in _list(raw.get("cmdline"), MAX_ARGS) if isinstance(a, str)),
                    fd=_int(raw.get("fd"), 0), own=raw.get("own") is True, lock=_str(raw.get("lock"), 100),
                    exit_code=_int(raw.get("exit_code"), 0, 256), exit_signal=_str(raw.get("exit_signal"), 20),
                    core_dumped=raw.get("core_dumped") is True)


def _others(value: Any) -> tuple[OtherEnd, ...]:
    return tuple(o for o in (other_end(r) for r in _list(value, MAX_OTHERS)) if o is not None)


def _bool(value: Any) -> Optional[bool]:
    return value if isinstance(value, bool) else None


def wait_fd(raw: Any) -> Optional[WaitFd]:
    if not isinstance(raw, dict):
        return None
    return WaitFd(fd=_int(raw.get("fd")), target=_str(raw.get("target"), 300), kind=cast(FdKind, _one_of(raw.get("kind"), _KINDS)),
                  access=_one_of(raw.get("access"), _ACCESS), proto=_one_of(raw.get("proto"), _PROTOS),
                  local=_str(raw.get("local"), 300), peer=_str(raw.get("peer"), 300), state=_str(raw.get("state"), 20),
                  send_q=_int(raw.get("send_q"), 0, 1 << 63), recv_q=_int(raw.get("recv_q"), 0, 1 << 63),
                  others=_others(raw.get("others")), complete=raw.get("complete") is not False,
                  controlling=_bool(raw.get("controlling")), foreground=_bool(raw.get("foreground")),
                  notes=_notes(raw.get("notes")))


def kernel_wait(raw: Any) -> Optional[KernelWait]:
    """workers/collect/kwait.py's dict for one thread; None when absent or not one (an unknown family included)."""
    if not isinstance(raw, dict):
        return None
    family = _one_of(raw.get("family"), _FAMILIES)
    if not family:
        return None
    address = raw.get("address")
    return KernelWait(
        syscall=_str(raw.get("syscall"), 40), family=cast(WaitFamily, family), fd=_int(raw.get("fd")),
        fds=tuple(f for f in (wait_fd(r) for r in _list(raw.get("fds"), MAX_FDS)) if f is not None),
        fds_total=_int(raw.get("fds_total"), 0), timeout=_seconds(raw.get("timeout")),
        child_pid=_int(raw.get("child_pid")), children=_others(raw.get("children")),
        children_complete=raw.get("children_complete") is not False,
        lock_type=_one_of(raw.get("lock_type"), _LOCK_TYPES), lock_mode=_one_of(raw.get("lock_mode"), _LOCK_MODES),
        path=_str(raw.get("path"), 1000),
        address=address if isinstance(address, str) and _ADDRESS.fullmatch(address) else "",
        notes=_notes(raw.get("notes")))
