"""Output paths: where hangscope may write (--snapshot, --export and its DIR.tar.gz, --json, the TUI's export),
checked before anything connects, and the one way a file is written.

The rules, one checker for every writer:
- the target is new, or an existing REGULAR file (replaced only with --force); a symlink, a FIFO, a device, a
  socket or a directory where a file goes is refused: hangscope never writes through one nor replaces one;
- never into /proc, /sys or /dev (or any kernel pseudo file system, wherever it is mounted);
- never over a file the same command reads (the hosts file, the --load snapshot: same st_dev and st_ino);
- the directory that will hold it exists and is a directory; with writable=True (the command line's up-front
  check) also that it is writable and not full: found before the collection, not after it. The TUI's export
  leaves that to the write, which keeps the bundle in memory for a retry elsewhere.
A file is written by create-and-rename in its own directory: a temporary name created O_EXCL|O_NOFOLLOW (mode
0600) relative to the directory's descriptor, written, fsync'd, then linked to the final name when that is new
(link() never replaces: a file that appeared meanwhile is not clobbered) or renamed over the regular file
--force allows; the directory is fsync'd last. A half-written file never carries the final name.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from typing import Collection, Iterable, Optional, Sequence, Union

from app.errors import HangscopeError, InputError
from app.inputs.files import identity
from app.inputs.fs import kind, os_reason, system_tree

_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UnsafeOutputError(InputError):
    """An output path hangscope refuses to write to (exit 2, before anything connects)."""

    title = "unsafe output path"


class OutputExistsError(InputError):
    """The output exists and --force was not given."""

    title = "output exists"


class WriteError(HangscopeError):
    """Writing failed after the checks (disk full, permission changed meanwhile): exit 1, data still printed."""

    title = "could not write"
    hint = "choose another path (the data is still printed above)"

    def __init__(self, message: str, *, errno_: Optional[int] = None) -> None:
        super().__init__(message)
        self.errno = errno_


class UnwritableOutputError(InputError):
    """With --load nothing is collected: an output that cannot be written is all the command was asked to do,
    so it is bad input (exit 2), like a path refused up front."""

    title = "could not write"
    hint = "choose another path, or free space"


def write_reason(exc: OSError) -> str:
    """Why a write failed, in the words of a one-line message."""
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    if exc.errno == errno.EROFS:
        return "the filesystem is read-only"
    return os_reason(exc)


def check_file(path: str, *, flag: str = "", force: bool, inputs: Iterable[str] = (), writable: bool = False
               ) -> None:
    """Refuse a path where hangscope must not (or, with writable, cannot) write a file."""
    _check_name(path, flag)
    if path.endswith("/"):
        raise UnsafeOutputError(f"{_at(flag, path)}: names a directory; give a file name")
    st = _lstat(path, flag)
    if st is not None:
        _check_existing_file(path, st, flag=flag, force=force, inputs=inputs)
    _check_directory(os.path.dirname(path) or ".", flag, path, parent=True, writable=writable)


def check_dir(path: str, *, flag: str = "", force: bool, marker: str, names: Collection[str] = (),
              inputs: Iterable[str] = (), writable: bool = False) -> None:
    """Refuse, up front, a path where hangscope must not write a directory of `names` (a bundle): an existing
    one is reused only with force, only when it holds `marker` (an earlier bundle) or nothing, and only when
    every name it would replace is a regular file (or a symlink: the rename replaces the link, never its target)
    that no input of this command is."""
    _check_name(path, flag)
    path = os.path.normpath(path)  # "link/" would make lstat follow the link
    st = _lstat(path, flag)
    if st is None:
        _check_directory(os.path.dirname(path) or ".", flag, path, parent=True, writable=writable)
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeOutputError(f"{_at(flag, path)}: is a symlink; hangscope never writes through one")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeOutputError(f"{_at(flag, path)}: exists and is {kind(st.st_mode)}, not a directory")
    _check_directory(path, flag, path, parent=False, writable=writable)
    if not force:
        raise OutputExistsError(f"{_at(flag, path)}: exists; pass --force to replace the bundle in it")
    try:
        entries = os.listdir(path)
    except OSError as exc:
        raise UnsafeOutputError(f"{_at(flag, path)}: cannot be listed: {os_reason(exc)}") from None
    if entries and marker not in entries:
        # --force replaces an earlier bundle; it never scatters files into (and chmods) an unrelated directory
        raise UnsafeOutputError(f"{_at(flag, path)}: is not empty and holds no hangscope bundle ({marker}); "
                                "refusing to write into it")
    for name in names:
        target = os.path.join(path, name)
        inner = _lstat(target, flag)
        if inner is not None and not stat.S_ISLNK(inner.st_mode):
            _check_existing_file(target, inner, flag=flag, force=True, inputs=inputs)


def check_where(path: str, *, flag: str = "") -> None:
    """Where a directory hangscope keeps writing into (watch's --out) may be: the directory when it exists, else
    the parent it would be made in, is a directory outside the system trees (never in /proc, /sys or /dev). What
    an existing one must be besides (its owner, its mode, not a link) is its caller's to check."""
    _check_name(path, flag)
    path = os.path.normpath(path)
    st = _lstat(path, flag)
    if st is None:
        _check_directory(os.path.dirname(path) or ".", flag, path, parent=True, writable=False)
    elif stat.S_ISDIR(st.st_mode):
        _check_directory(path, flag, path, parent=False, writable=False)


def check_room(directory: str, sizes: Iterable[int], *, shown: str) -> None:
    """Refuse, before its first byte, a write the file system of `directory` has no room for: each file takes
    whole blocks, and a full disk found half-way leaves a partial bundle behind. A WriteError (a disk that
    fills meanwhile still fails in the write itself, which leaves the earlier file as it was)."""
    try:
        vfs = os.statvfs(directory)
    except OSError:
        return  # the write itself will say why
    block = vfs.f_frsize or vfs.f_bsize or 4096
    need = sum(-(-size // block) for size in sizes) * block
    free = (vfs.f_bfree if os.geteuid() == 0 else vfs.f_bavail) * block
    if vfs.f_blocks and need > free:
        raise WriteError(f"cannot write {shown}: no space left on the device (needs {_kib(need)}, "
                         f"{_kib(free)} free); nothing was written", errno_=errno.ENOSPC)


def _kib(size: int) -> str:
    return f"{-(-size // 1024)} KiB"


def write_file(path: str, data: Union[bytes, Iterable[bytes]], *, flag: str = "", force: bool,
               inputs: Sequence[str] = ()) -> None:
    """Write `data` to `path` (0600) by create-and-rename, after checking it once more (it may have changed
    since the up-front check) and that it fits; UnsafeOutputError/OutputExistsError (exit 2) or WriteError
    (exit 1). `data` given as pieces is written as they come, never held whole (a snapshot of 12,500 nodes is
    ~600 MB): its size is known only once written, so a disk without room for it fails in the write itself,
    which leaves the earlier file at `path` as it was and no temporary file."""
    check_file(path, flag=flag, force=force, inputs=inputs)
    parent = os.path.dirname(path) or "."
    if isinstance(data, bytes):
        check_room(parent, [len(data)], shown=path)
    try:
        dfd = os.open(parent, _OPEN_DIR)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {write_reason(exc)}", errno_=exc.errno) from None
    try:
        write_at(dfd, os.path.basename(path), data, replace=force, shown=path)
        try:
            os.fsync(dfd)
        except OSError:
            pass  # some file systems refuse fsync on a directory; the file itself was synced
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {write_reason(exc)}", errno_=exc.errno) from None
    finally:
        os.close(dfd)


def write_at(dfd: int, name: str, data: Union[bytes, Iterable[bytes]], *, replace: bool,
             replace_links: bool = False, shown: Optional[str] = None) -> None:
    """Create-and-rename `name` in the directory open as `dfd`. With replace, an existing REGULAR file of that
    name is replaced (and a symlink, with replace_links: inside a bundle directory of our own the rename replaces
    the link, never writing to its target); anything else there, or anything at all without replace, is left
    alone and refused.
    OSError from the file system passes through; a refusal is UnsafeOutputError or OutputExistsError."""
    shown = shown or name
    tmp = f".hangscope-{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, _OPEN_NEW, 0o600, dir_fd=dfd)
    try:
        try:
            os.fchmod(fd, 0o600)  # the umask does not decide who reads a snapshot
            for piece in (data,) if isinstance(data, bytes) else data:
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view):]
            os.fsync(fd)  # a full disk can surface only here (delayed allocation)
        finally:
            os.close(fd)
        _install(dfd, tmp, name, replace=replace, replace_links=replace_links, shown=shown)
    finally:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass  # renamed: nothing left to remove


def _install(dfd: int, tmp: str, name: str, *, replace: bool, replace_links: bool, shown: str) -> None:
    """Give the written temporary file its final name without ever replacing anything but a regular file."""
    try:
        st: Optional[os.stat_result] = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not (stat.S_ISREG(st.st_mode) or replace_links and stat.S_ISLNK(st.st_mode)):
            raise UnsafeOutputError(f"{shown}: became {kind(st.st_mode)} during the run; left as it is")
        if not replace:
            raise OutputExistsError(f"{shown}: appeared during the run; left as it is (pass --force to replace it)")
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return
    try:
        os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)  # never replaces
    except FileExistsError:
        raise OutputExistsError(f"{shown}: appeared during the run; left as it is") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            raise
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # a file system without hard links (vfat)


def _check_name(path: str, flag: str) -> None:
    if not path or not path.strip():
        raise UnsafeOutputError(f"{flag or 'the output path'} is empty; give a path")
    if "\0" in path:
        raise UnsafeOutputError(f"{_at(flag, repr(path))}: holds a NUL byte")


def _lstat(path: str, flag: str) -> Optional[os.stat_result]:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeOutputError(f"{_at(flag, path)}: {os_reason(exc)}") from None


def _check_existing_file(path: str, st: os.stat_result, *, flag: str, force: bool, inputs: Iterable[str]) -> None:
    if not stat.S_ISREG(st.st_mode):
        what = kind(st.st_mode)
        why = ("hangscope never writes through one" if stat.S_ISLNK(st.st_mode) else
               "give a file name in it" if stat.S_ISDIR(st.st_mode) else
               "hangscope writes only regular files, and never replaces anything else")
        raise UnsafeOutputError(f"{_at(flag, path)}: is {what}; {why}")
    for source in inputs:
        if source and source != "-" and identity(source) == (st.st_dev, st.st_ino):
            raise UnsafeOutputError(f"{_at(flag, path)}: is the same file as {source}, which this command reads; write elsewhere")
    if not force:
        raise OutputExistsError(f"{_at(flag, path)}: exists; pass --force to replace it")


def _check_directory(directory: str, flag: str, path: str, *, parent: bool, writable: bool) -> None:
    """The directory that holds (parent) or is the output: there, a directory, outside the system trees; with
    writable, also writable and not full."""
    what = f"its parent directory {directory}" if parent else f"directory {directory}"
    try:
        st = os.stat(directory)
    except OSError as exc:
        where = f" ({directory})" if parent else ""
        raise UnsafeOutputError(f"{_at(flag, path)}: {what.replace(' ' + directory, '')} {os_reason(exc)}{where}"
                                ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeOutputError(f"{_at(flag, path)}: {directory} is {kind(st.st_mode)}, not a directory")
    tree = system_tree(directory)
    if tree is not None:
        raise UnsafeOutputError(f"{_at(flag, path)}: is in {tree}; hangscope never writes into kernel interfaces")
    if not writable:
        return
    try:
        vfs = os.statvfs(directory)
    except OSError as exc:
        raise UnsafeOutputError(f"{_at(flag, path)}: {what}: {os_reason(exc)}") from None
    if vfs.f_flag & os.ST_RDONLY:
        raise UnsafeOutputError(f"{_at(flag, path)}: {what} is on a read-only file system")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UnsafeOutputError(f"{_at(flag, path)}: cannot write into {what} (permission denied)")
    if (vfs.f_bfree if os.geteuid() == 0 else vfs.f_bavail) == 0:
        raise UnsafeOutputError(f"{_at(flag, path)}: the file system of {what} is full")


def _at(flag: str, path: str) -> str:
    return f"{flag} {path}" if flag else path
