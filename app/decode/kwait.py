"""A thread's "waits" (workers/collect/kwait.py: what a blocked call waits on, who is at the other end) turned into
the model's KernelWait: remote data, so every value is type-checked and bounded as it is taken, and nothing raises.
"""

from __future__ import annotations

import math
from sys import intern
import re
from typing import Any, Optional, Tuple, get_args

from app.decode.build import Builder
from app.model.memo import BoundedMemo
from app.model import EndRole, FdKind, KernelWait, OtherEnd, WaitFamily, WaitFd

MAX_FDS = 64
MAX_OTHERS = 8
MAX_NOTES = 8
MAX_ARGS = 16
MAX_SIGNALS = 16
_FAMILIES = frozenset(get_args(WaitFamily))
_KINDS = frozenset(get_args(FdKind))
_ROLES = frozenset(get_args(EndRole))
_ACCESS = frozenset(("read", "write", "both", "accept", "connect", "lock", ""))
_PROTOS = frozenset(("tcp", "udp", "unix", ""))
_LOCK_TYPES = frozenset(("FLOCK", "POSIX", "OFDLCK", ""))
_LOCK_MODES = frozenset(("READ", "WRITE", ""))
_ADDRESS = re.compile(r"0x[0-9a-f]{1,16}")
_SIGNAL = re.compile(r"SIG[A-Z0-9]{2,8}(\+[0-9]{1,2})?|signal [0-9]{1,2}")
_INT32 = 1 << 31


def _int(value: Any, low: int = -_INT32, high: int = _INT32) -> Optional[int]:
    """An int within [low, high), else None (bools are not ints here)."""
    return value if type(value) is int and low <= value < high else None


def _str(value: Any, limit: int) -> str:
    """Bounded; a short one interned (the same states, paths and names on many ranks: app/decode/replies.py)."""
    if type(value) is not str or not value:
        return ""
    if len(value) > limit:
        value = value[:limit]
    return intern(value) if len(value) <= 200 else value


def _one_of(value: Any, allowed: frozenset) -> str:
    return value if type(value) is str and value in allowed else ""


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


# a blocked thread's wait makes ~3 of these (every rank, every pass): built without __init__ (app/decode/build.py)
_OTHER_END = Builder(OtherEnd).make
_WAIT_FD = Builder(WaitFd).make
_KERNEL_WAIT = Builder(KernelWait).make


def other_end(raw: Any) -> Optional[OtherEnd]:
    if type(raw) is not dict:
        return None
    g = raw.get
    role, pid = g("role"), g("pid")
    if type(role) is not str or role not in _ROLES or not role or type(pid) is not int or not 1 <= pid < _INT32:
        return None
    return _OTHER_END(
        role=role, pid=pid, comm=_str(g("comm"), 64), state=_str(g("state"), 2), ppid=_int(g("ppid"), 0),
        wchan=_str(g("wchan"), 100),
        cmdline=strs(g("cmdline"), MAX_ARGS, 200),
        fd=_int(g("fd"), 0), own=g("own") is True, lock=_str(g("lock"), 100),
        exit_code=_int(g("exit_code"), 0, 256), exit_signal=_str(g("exit_signal"), 20),
        core_dumped=g("core_dumped") is True, reads=_reads(g("reads")) if role == "child" else None,
        reading=role == "peer" and g("reading") is True)


def _reads(raw: Any) -> Optional[WaitFd]:
    """A child's pipe read (OtherEnd.reads): one level only, its writers' own `reads` never read."""
    fd = wait_fd(raw)
    return fd if fd is not None and fd.kind == "pipe" and all(o.reads is None for o in fd.others) else None


# Lists of strings that repeat across a job's ranks and passes (a command line: every rank of a torchrun job has
# the same, and so has the other end of many waits; a kernel stack: every thread blocked in the same call; a
# dump's actions), read once each: the key is the list's own content (a tuple of what the parser built: no text
# is compared twice), bounded like the rest. app/decode/replies.py reads its lists with it too.
_STR_TUPLES: BoundedMemo[tuple, tuple[str, ...]] = BoundedMemo(1 << 15)
MAX_KEY_CHARS = 16384  # a longer list is read each time it comes (as is one of more than 256 strings)


def strs(raw: Any, count: int = 1 << 30, limit: int = 1 << 30) -> tuple[str, ...]:
    """The strings of a list (others dropped), at most `count` of them and `limit` characters each (short ones
    interned, _str); each distinct list read once."""
    if type(raw) is not list or not raw:
        return ()
    if len(raw) > 256 or sum(len(a) for a in raw if type(a) is str) > MAX_KEY_CHARS:
        # not remembered: the key would keep the parser's text (a command line can be megabytes) in the table
        return tuple(_str(a, limit) for a in raw[:count] if type(a) is str)
    key = (count, limit, *raw)
    try:
        got = _STR_TUPLES.get(key)
    except TypeError:  # an unhashable element (remote data): read it, remember nothing
        return tuple(_str(a, limit) for a in raw[:count] if type(a) is str)
    if got is None:
        got = _STR_TUPLES.add(key, tuple(_str(a, limit) for a in raw[:count] if type(a) is str),
                              weight=1 + len(raw) // 8)
    return got


def _others(value: Any) -> tuple[OtherEnd, ...]:
    return tuple(o for o in (other_end(r) for r in _list(value, MAX_OTHERS)) if o is not None)


def _bool(value: Any) -> Optional[bool]:
    return value if isinstance(value, bool) else None


def wait_fd(raw: Any) -> Optional[WaitFd]:
    if type(raw) is not dict:
        return None
    g = raw.get
    others, notes = g("others"), g("notes")
    return _WAIT_FD(
        fd=_int(g("fd")), target=_str(g("target"), 300), kind=_one_of(g("kind"), _KINDS),
        access=_one_of(g("access"), _ACCESS), proto=_one_of(g("proto"), _PROTOS),
        local=_str(g("local"), 300), peer=_str(g("peer"), 300), state=_str(g("state"), 20),
        send_q=_int(g("send_q"), 0, 1 << 63), recv_q=_int(g("recv_q"), 0, 1 << 63),
        others=_others(others) if others else (), complete=g("complete") is not False,
        controlling=_bool(g("controlling")), foreground=_bool(g("foreground")),
        notes=_notes(notes) if notes else ())


def kernel_wait(raw: Any) -> Optional[KernelWait]:
    """workers/collect/kwait.py's dict for one thread; None when absent or not one (an unknown family included)."""
    if type(raw) is not dict:
        return None
    g = raw.get
    family = _one_of(g("family"), _FAMILIES)
    if not family:
        return None
    address, fds, children, notes, signals = g("address"), g("fds"), g("children"), g("notes"), g("signals")
    return _KERNEL_WAIT(
        syscall=_str(g("syscall"), 40), family=family, fd=_int(g("fd")),
        fds=tuple(f for f in (wait_fd(r) for r in _list(fds, MAX_FDS)) if f is not None) if fds else (),
        fds_total=_int(g("fds_total"), 0), timeout=_seconds(g("timeout")),
        child_pid=_int(g("child_pid")), children=_others(children) if children else (),
        children_complete=g("children_complete") is not False,
        lock_type=_one_of(g("lock_type"), _LOCK_TYPES), lock_mode=_one_of(g("lock_mode"), _LOCK_MODES),
        path=_str(g("path"), 1000),
        address=address if isinstance(address, str) and _ADDRESS.fullmatch(address) else "",
        signals=tuple(n for n in strs(signals, MAX_SIGNALS, 16) if _SIGNAL.fullmatch(n)) if signals else (),
        notes=_notes(notes) if notes else (),
        watched=_watched(g("watched")) if family == "sleep" and g("watched") else ())


MAX_POLLED_PATHS = 3


def _watched(raw: Any) -> Tuple[WaitFd, ...]:
    """A sleeping thread's polled files (KernelWait.watched): absolute paths of kind file, their writers."""
    out = []
    for r in _list(raw, MAX_POLLED_PATHS):
        f = wait_fd(r)
        if f is not None and f.kind == "file" and f.target.startswith("/"):
            out.append(f)
    return tuple(out)
