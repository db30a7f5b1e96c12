"""The process-group timeout a rank's script sets in its source (`init_process_group(timeout=timedelta(...))`),
read from the script file on the node without touching the rank (`hangscope watch` keeps its stall limit well
below the job's own watchdog: app/watch/timeouts.py).

The script is the first argument after the interpreter's options on the rank's command line, read through
/proc/PID/cwd (a relative path) or /proc/PID/root (a rank in another mount namespace). Its source is parsed,
never run: a timeout counts when it is a `timedelta(...)` of numbers written at the call, or a name bound once in
the file to one; any other expression is reported as set but unreadable (the job's own default then does not
apply, and hangscope says it cannot tell). Parsed once per file version (path, mtime, size): a sample costs one
stat per rank.
"""

from __future__ import annotations

import ast
import os
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Tuple

from workers import procinfo

MAX_FILE_BYTES = 2 << 20
MAX_CACHED = 64
# the torch.distributed calls that take the timeout of the groups they make
CALLS = ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration")
_UNITS = {"weeks": 604800.0, "days": 86400.0, "hours": 3600.0, "minutes": 60.0, "seconds": 1.0,
          "milliseconds": 0.001, "microseconds": 1e-6}
_POSITIONAL = ("days", "seconds", "microseconds", "milliseconds", "minutes", "hours", "weeks")  # timedelta's order
# interpreter options that take a value (`python -X dev -W ignore train.py`)
_VALUE_OPTIONS = ("-X", "-W", "-Q")

_lock = threading.Lock()
_cache: Dict[Tuple[str, int, int], Optional[Dict[str, Any]]] = {}


def script_of(argv: List[str]) -> Optional[str]:
    """The script a python command line runs (`python -u train.py --lr 1`), or None (-c, -m, stdin)."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-c", "-m", "-"):
            return None
        if a in _VALUE_OPTIONS:
            i += 2
            continue
        if a.startswith("-") and len(a) > 1:
            i += 1
            continue
        return a
    return None


def for_pid(pid: int, in_container: bool) -> Optional[Dict[str, Any]]:
    """{"seconds": float | None, "where": "train.py:42", "text": the expression} for the shortest timeout the
    rank's script gives a process group; None when the script names none (or cannot be read)."""
    try:
        raw = procinfo.read_file("/proc/%d/cmdline" % pid, 1 << 16)
    except (OSError, ValueError):
        return None
    argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return None
    script = script_of(argv)
    if not script or not script.endswith(".py"):
        return None
    if os.path.isabs(script):
        path = "/proc/%d/root%s" % (pid, script) if in_container else script
    else:
        path = "/proc/%d/cwd/%s" % (pid, script)
    found = read(path)
    if found is None:
        return None
    return dict(found, where="%s:%s" % (os.path.basename(script), found["line"]))


def read(path: str) -> Optional[Dict[str, Any]]:
    """The shortest process-group timeout the file sets (cached per file version); None without one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not (st.st_mode & 0o170000) == 0o100000 or st.st_size > MAX_FILE_BYTES:
        return None  # a FIFO or a device must never be opened, a huge file never parsed
    key = (path, st.st_mtime_ns, st.st_size)
    with _lock:
        if key in _cache:
            return _cache[key]
    try:
        with open(path, "rb") as f:
            source = f.read(MAX_FILE_BYTES).decode("utf-8", "replace")
        found = parse(source)
    except (OSError, ValueError, SyntaxError, RecursionError, MemoryError):
        found = None
    with _lock:
        if len(_cache) >= MAX_CACHED:
            _cache.clear()
        _cache[key] = found
    return found


def parse(source: str) -> Optional[Dict[str, Any]]:
    """{"seconds", "line", "text"} of the shortest timeout given to a process-group call in `source`, with
    seconds None when every one found is an expression that cannot be read without running the script."""
    tree = ast.parse(source)
    bound = _bound_names(tree)
    known: List[Tuple[float, int, str]] = []
    unknown: List[Tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _name(node.func) not in CALLS:
            continue
        for kw in node.keywords:
            if kw.arg != "timeout":
                continue
            text = (ast.get_source_segment(source, kw.value) or "")[:200]
            seconds = _seconds(kw.value, bound)
            if seconds is None:
                unknown.append((node.lineno, text))
            else:
                known.append((seconds, node.lineno, text))
    if known:
        seconds, line, text = min(known)
        return {"seconds": seconds, "line": line, "text": text}
    if unknown:
        line, text = min(unknown)
        return {"seconds": None, "line": line, "text": text}
    return None


def _name(func: Any) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _bound_names(tree: ast.AST) -> Dict[str, Optional[float]]:
    """Names assigned a readable timedelta in the file; a name bound twice (to different values) is unknown."""
    out: Dict[str, Optional[float]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, _timedelta(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, _timedelta(node.value)
        else:
            continue
        out[name] = value if name not in out or out[name] == value else None
    return out


def _seconds(value: Any, bound: Dict[str, Optional[float]]) -> Optional[float]:
    if isinstance(value, ast.Name):
        return bound.get(value.id)
    return _timedelta(value)


def _timedelta(value: Any) -> Optional[float]:
    """Seconds of `timedelta(minutes=5)`, `datetime.timedelta(0, 300)`; None for anything else."""
    if not isinstance(value, ast.Call) or _name(value.func) != "timedelta":
        return None
    total = 0.0
    for i, arg in enumerate(value.args[:len(_POSITIONAL)]):
        number = _number(arg)
        if number is None:
            return None
        total += number * _UNITS[_POSITIONAL[i]]
    if len(value.args) > len(_POSITIONAL):
        return None
    for kw in value.keywords:
        number = _number(kw.value)
        if kw.arg not in _UNITS or number is None:
            return None
        total += number * _UNITS[kw.arg]
    return total if 0 < total < 1e9 else None


def _number(node: Any) -> Optional[float]:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):  # timedelta(seconds=60 * 30)
        a, b = _number(node.left), _number(node.right)
        return a * b if a is not None and b is not None else None
    return None
