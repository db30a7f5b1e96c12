"""hangscope watch's --out directory: private, bounded, never written through a link.

The directory is created 0700, or, when it exists, must be a real directory (not a symlink) owned by this user
and writable by nobody else: then nobody else can plant a symlink, a device or a FIFO inside it. Each capture is
a bundle directory `YYYYmmdd-HHMMSS-KIND-JOB/` written by the report's writer (app/report/writer.py: 0700, files
0600, O_NOFOLLOW, temp name then rename); at most `keep` of them stay, the oldest removed first (only
directories that are hangscope bundles, read through a directory fd, never following a link). The cheap
samples go to `history.jsonl`, rotated to `history.1.jsonl` at HISTORY_BYTES: two files at most.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
from typing import Any, List, Mapping, Optional

from app.errors import InputError
from app.inputs.fs import kind, os_reason
from app.inputs.paths import check_where
from app.report.writer import MANIFEST, UnsafePathError

HISTORY = "history.jsonl"
HISTORY_OLD = "history.1.jsonl"
HISTORY_BYTES = 4 << 20  # per file: the history holds 2 files at most
CAPTURE_NAME = re.compile(r"^\d{8}-\d{6}(-\d+)?-(hang|slow)-[A-Za-z0-9._-]{1,48}$")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class OutDir:
    def __init__(self, path: str, keep: int) -> None:
        self.path = os.path.abspath(path)
        self.keep = keep
        self._history_fd: Optional[int] = None
        self._history_size = 0

    def prepare(self) -> None:
        """Create the directory (0700) or check an existing one; InputError (exit 2) when it is unsafe. Never in
        /proc, /sys or /dev (or a kernel pseudo file system: app.inputs.paths.check_where), checked before
        anything is created; an existing directory is used as it is (its mode is the user's: never changed), when it is
        a real directory of this user that nobody else can write into."""
        check_where(self.path, flag="--out")  # the main command's rules for where an output may be
        created = False
        try:
            os.mkdir(self.path, 0o700)
            created = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise InputError(f"--out {self.path}: cannot create it: {os_reason(exc)}") from None
        try:
            st = os.lstat(self.path)
        except OSError as exc:
            raise InputError(f"--out {self.path}: {os_reason(exc)}") from None
        if stat.S_ISLNK(st.st_mode):
            raise InputError(f"--out {self.path} is a symlink; give the directory itself")
        if not stat.S_ISDIR(st.st_mode):
            raise InputError(f"--out {self.path} exists and is {kind(st.st_mode)}, not a directory")
        if st.st_uid != os.geteuid():
            raise InputError(f"--out {self.path} belongs to another user (uid {st.st_uid}); use a directory of yours")
        if st.st_mode & 0o022:
            raise InputError(f"--out {self.path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): "
                             "they could plant links where the captures go",
                             hint=f"chmod 700 {self.path}, or give a new directory (hangscope creates it 0700)")
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise InputError(f"--out {self.path}: cannot write into it (permission denied)")
        if created:
            try:  # captures hold stacks and command lines: private whatever the umask was
                os.chmod(self.path, 0o700, follow_symlinks=False)
            except OSError as exc:
                raise InputError(f"--out {self.path}: {os_reason(exc)}") from None

    # -- captures ----------------------------------------------------------------------------------------

    def capture_path(self, kind: str, job: str, at: Optional[float] = None) -> str:
        """A new, unused directory name for a capture of `job` (the name keeps only safe characters)."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if at is None else at))
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", job or "unidentified").strip("._-")[:48] or "job"
        name = f"{stamp}-{kind}-{slug}"
        n = 1
        while os.path.lexists(os.path.join(self.path, name)):
            n += 1
            name = f"{stamp}-{n}-{kind}-{slug}"
        return os.path.join(self.path, name)

    def captures(self) -> List[str]:
        """The capture directories here (bundles: a manifest inside), oldest first (their names sort by time)."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        return [os.path.join(self.path, n) for n in sorted(names, key=_order)
                if CAPTURE_NAME.match(n) and _is_bundle(os.path.join(self.path, n))]

    def prune(self) -> List[str]:
        """Remove the oldest captures beyond `keep`; returns what was removed."""
        removed = []
        found = self.captures()
        for path in found[:max(0, len(found) - self.keep)]:
            if _remove_bundle(path):
                removed.append(path)
        return removed

    # -- the history of cheap samples --------------------------------------------------------------------

    def record(self, entry: Mapping[str, Any]) -> None:
        """Append one sample to history.jsonl (rotated at HISTORY_BYTES); a write error is dropped: the history
        is a record, never a reason to stop watching."""
        line = (json.dumps(entry, separators=(",", ":"), ensure_ascii=True, default=str) + "\n").encode()
        try:
            if self._history_fd is None or self._history_size + len(line) > HISTORY_BYTES:
                self._rotate()
            assert self._history_fd is not None
            os.write(self._history_fd, line)
            self._history_size += len(line)
        except (OSError, AssertionError):
            self.close()

    def _rotate(self) -> None:
        dfd = os.open(self.path, _DIR)
        try:
            if self._history_fd is not None:  # full: the current file becomes the old one
                os.close(self._history_fd)
                self._history_fd = None
                os.rename(HISTORY, HISTORY_OLD, src_dir_fd=dfd, dst_dir_fd=dfd)
            fd = _open_history(dfd)
            if os.fstat(fd).st_size >= HISTORY_BYTES:  # a full one from an earlier run: start a new file
                os.close(fd)
                os.rename(HISTORY, HISTORY_OLD, src_dir_fd=dfd, dst_dir_fd=dfd)
                fd = _open_history(dfd)
        finally:
            os.close(dfd)
        self._history_fd, self._history_size = fd, os.fstat(fd).st_size

    def close(self) -> None:
        if self._history_fd is not None:
            try:
                os.close(self._history_fd)
            except OSError:
                pass
        self._history_fd = None


def _open_history(dfd: int) -> int:
    fd = os.open(HISTORY, _APPEND, 0o600, dir_fd=dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device planted there (O_NONBLOCK: the open did not wait)
        os.close(fd)
        raise OSError(errno.EINVAL, f"{HISTORY} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _order(name: str) -> tuple:
    parts = name.split("-")
    serial = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 1
    return (parts[0], parts[1] if len(parts) > 1 else "", serial, name)


def _is_bundle(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and stat.S_ISREG(os.lstat(os.path.join(path, MANIFEST)).st_mode)
    except OSError:
        return False


def _remove_bundle(path: str) -> bool:
    """Remove one capture directory: only when it is a real directory holding a bundle's manifest; its regular
    files are unlinked through the directory's fd (a link inside is removed, never followed)."""
    try:
        dfd = os.open(path, _DIR)
    except OSError:
        return False
    try:
        names = os.listdir(dfd)
        if MANIFEST not in names:
            return False
        for name in names:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise UnsafePathError(f"{path}/{name} is a directory: not what a capture holds; left as it is")
            os.unlink(name, dir_fd=dfd)
    except (OSError, UnsafePathError):
        return False
    finally:
        os.close(dfd)
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True
