"""The files hangscope reads (a hosts file, a --load snapshot, ssh configs, identities, known_hosts): regular
files only, opened without ever blocking.

A FIFO without a writer blocks open() for ever and a device never ends (/dev/zero) or consumes what it reads
(/proc/kmsg), so the type is checked before the file is opened (stat), and again on the descriptor, opened
O_NONBLOCK, in case the path changed in between. `-` (stdin) is the caller's business. Reads are bounded.
"""

from __future__ import annotations

import io
import os
import stat
from typing import BinaryIO, Callable, Optional

from app.errors import InputError
from app.inputs.fs import kind, os_reason, system_tree

_OPEN = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class InputFileError(InputError):
    """A file to read that cannot be used; `reason` without the path, for callers that say where themselves."""

    def __init__(self, path: str, reason: str, *, what: str = "") -> None:
        super().__init__(f"{what + ' ' if what else ''}{path}: {reason}")
        self.path = path
        self.reason = reason


def check_input(path: str, *, what: str = "", max_bytes: Optional[int] = None, stdin_ok: bool = False
                ) -> os.stat_result:
    """The stat of `path` when it is a regular file hangscope may read (symlinks followed); InputFileError
    naming the file type otherwise ("a FIFO (named pipe)", "a character device", "a directory", ...)."""
    if not path:
        raise InputFileError(path, "an empty path", what=what)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputFileError(path, os_reason(exc, missing="no such file"), what=what) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(path, f"is {kind(st.st_mode)}, not a regular file" + _stdin_hint(st.st_mode, stdin_ok),
                             what=what)
    tree = system_tree(path)
    if tree is not None:
        raise InputFileError(path, f"cannot read it: it is in {tree}, a kernel interface, not a file", what=what)
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputFileError(path, f"is {st.st_size} bytes, more than the {_mib(max_bytes)} this file can "
                             "reasonably be; is it the right file?", what=what)
    return st


def open_input(path: str, *, what: str = "", max_bytes: Optional[int] = None, stdin_ok: bool = False) -> BinaryIO:
    """`path` opened for reading in binary, after check_input; the descriptor itself is checked once more
    (opened O_NONBLOCK, so a FIFO put there in the meantime cannot block) and then set back to blocking."""
    st = check_input(path, what=what, max_bytes=max_bytes, stdin_ok=stdin_ok)
    try:
        fd = os.open(path, _OPEN)
    except OSError as exc:
        raise InputFileError(path, os_reason(exc), what=what) from None
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise InputFileError(path, "changed while it was opened", what=what)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(stream: BinaryIO, limit: int, start: Optional[Callable[[bytes], None]] = None,
                 max_lines: Optional[int] = None) -> bytes:
    """At most limit + 1 bytes (one more than allowed, so the caller can tell "too large" from "just fits"), held
    once; with max_lines, reading also stops once more than that many lines are in (a text input refused by its
    line count need not be read to its byte limit). `start` sees the first bytes that are not blank, once, and may
    raise to refuse the input there: a file of zeros or of another format costs one read, not `limit` bytes."""
    out = io.BytesIO()
    lines = 0
    while out.tell() <= limit and (max_lines is None or lines <= max_lines):
        chunk = stream.read(min(1 << 20, limit + 1 - out.tell()))
        if not chunk:
            break
        if start is not None:
            head = chunk.lstrip()
            if head:
                start(head)
                start = None
        if max_lines is not None:
            lines += chunk.count(b"\n")
        out.write(chunk)
    return out.getvalue()  # the buffer itself, not a copy


def stdin_problem() -> Optional[str]:
    """Why stdin cannot be read as `-` (closed, a directory, a terminal nobody will type into), or None."""
    try:
        st = os.fstat(0)
    except OSError:
        return "stdin is closed"
    if stat.S_ISDIR(st.st_mode):
        return "stdin is a directory"
    if os.isatty(0):
        return "stdin is a terminal: pipe the input in (e.g. scontrol show hostnames | hangscope -)"
    return None


def identity(path: str) -> Optional[tuple[int, int]]:
    """(st_dev, st_ino) of the file `path` names (symlinks followed), None when there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _stdin_hint(mode: int, stdin_ok: bool) -> str:
    return " ('-' reads stdin)" if stdin_ok and (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)) else ""


def _mib(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"
