"""A rank's recent error output, where it can be read on its node without touching the rank (issue 16.5).

Two places: the end of its stderr when that is a file (torchrun's --log-dir/--redirects, a batch script's
`2> log`, SLURM's --error), read through /proc/PID/fd/2, and torchrun's elastic error file
(TORCHELASTIC_ERROR_FILE: the JSON a rank wrapped in @record writes when it raises). A tty, a pipe or a socket is
never read (nothing can be read back from them without taking it from their reader). Only a tail that holds an
error-looking line comes back, from the start of its last traceback (or a few lines before the error), bounded
and redacted here, on the node: it is remote text to the login side.
"""

from __future__ import annotations

import json
import os
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Sequence, Tuple

from workers.lazyre import lazy
from workers.redact import redact_text

TAIL_BYTES = 16 << 10  # read from the end of the file
MAX_LINES = 30  # lines kept from where the error starts
MAX_CHARS = 3000
MAX_ERROR_FILE = 256 << 10
CONTEXT = 3  # lines kept above an error line that is not inside a traceback
ERROR_LINE = lazy(
    r"Traceback \(most recent call last\)|\b[A-Z]\w*(Error|Exception|Interrupt)\b(:|$)|\bNCCL (WARN|ERROR)\b|"
    r"\bWatchdog caught\b|\bCUDA error\b|\bSegmentation fault\b|\bcore dumped\b|\bfatal( error)?:|"
    r"\bterminate called\b|\bKilled\b|\bsignal \d+ \(SIG[A-Z]+\)")


def _tail_lines(text: str) -> Optional[List[str]]:
    """The lines from where the last error starts (its traceback's first line, or a few lines above it), at
    most MAX_LINES; None when nothing in the text looks like an error."""
    lines = text.splitlines()
    last = next((i for i in range(len(lines) - 1, -1, -1) if ERROR_LINE.search(lines[i])), None)
    if last is None:
        return None
    start = next((i for i in range(last, max(-1, last - 200), -1)
                  if lines[i].lstrip().startswith("Traceback (most recent call last)")), None)
    if start is None:
        start = max(0, last - CONTEXT)
    kept = lines[start:]
    return kept[:MAX_LINES // 3] + ["..."] + kept[-(MAX_LINES - MAX_LINES // 3):] if len(kept) > MAX_LINES else kept


def _text(lines: Sequence[str]) -> str:
    return redact_text("\n".join(line[:400] for line in lines))[:MAX_CHARS]


def stderr_tail(pid: int) -> Optional[Dict[str, Any]]:
    """The end of the rank's stderr when it is a regular file and ends with an error; None otherwise."""
    fd = "/proc/%d/fd/2" % pid
    try:
        link = os.readlink(fd)
        st = os.stat(fd)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or not link.startswith("/"):
        return None  # a tty, a pipe, a socket, /dev/null: nothing to read back
    try:
        with open(fd, "rb") as f:
            f.seek(max(0, st.st_size - TAIL_BYTES))
            data = f.read(TAIL_BYTES)
    except OSError:
        return None
    text = data.decode("utf-8", "replace")
    if st.st_size > TAIL_BYTES:
        text = text.partition("\n")[2]  # the first line read is cut
    lines = _tail_lines(text)
    if lines is None:
        return None
    return {"source": "stderr", "path": link[:500], "size": st.st_size, "text": _text(lines),
            "age": round(max(0.0, time.time() - st.st_mtime), 1)}


def error_file(pid: int, path: str) -> Optional[Dict[str, Any]]:
    """torchrun's elastic error file of the rank (TORCHELASTIC_ERROR_FILE), once the rank wrote it."""
    if not path.startswith("/") or len(path) > 4096:
        return None
    where = "/proc/%d/root%s" % (pid, path)  # the rank's own mount namespace (a container's files)
    try:
        st = os.stat(where)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ERROR_FILE:
            return None
        with open(where, "rb") as f:
            raw = f.read(MAX_ERROR_FILE)
    except OSError:
        return None
    try:
        doc = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        lines = _tail_lines(raw.decode("utf-8", "replace")[-TAIL_BYTES:])
    else:
        msg = doc.get("message") if isinstance(doc, dict) else None
        if isinstance(msg, dict):  # {"message": {"message": "RuntimeError: ...", "extraInfo": {"py_callstack"...}}}
            info = msg.get("extraInfo")
            stack = info.get("py_callstack") if isinstance(info, dict) else None
            text = str(stack or msg.get("message") or "")
        else:
            text = str(msg or "")
        lines = _tail_lines(text[-TAIL_BYTES:]) or ([text.strip()[:400]] if text.strip() else None)
    if not lines:
        return None
    return {"source": "error_file", "path": path[:500], "size": st.st_size, "text": _text(lines),
            "age": round(max(0.0, time.time() - st.st_mtime), 1)}


def collect(pid: int, env: Sequence[Tuple[str, str]]) -> List[Dict[str, Any]]:
    """What the rank wrote of an error where it can be read: its stderr's end, its elastic error file."""
    out = []
    tail = stderr_tail(pid)
    if tail is not None:
        out.append(tail)
    path = dict(env).get("TORCHELASTIC_ERROR_FILE")
    if path:
        found = error_file(pid, path)
        if found is not None:
            out.append(found)
    return out
