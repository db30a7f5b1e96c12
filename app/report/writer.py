"""Writing a bundle to disk: a 0700 directory of 0600 files, no symlink followed, nothing overwritten without
force, and every write failure reported with what was and was not written (the data stays in memory).

Every file is written to a temporary name with O_EXCL|O_NOFOLLOW relative to a directory fd opened with
O_NOFOLLOW, then renamed over the final name: a rename replaces a symlink planted there instead of writing
through it, and a half-written file never carries the final name.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat
import tarfile
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from app.errors import HangscopeError, InputError

MANIFEST = "manifest.json"  # its presence marks a directory as an earlier bundle (safe to --force over)
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ExportError(HangscopeError):
    """The bundle could not be exported to that path."""

    title = "export failed"


class BundleExistsError(InputError):
    """The export path exists and --force was not given."""

    title = "export path exists"
    hint = "pass --force to replace an earlier bundle there, or choose another directory"


class UnsafePathError(ExportError):
    """The export path is a symlink, not a directory, or a directory that is not a hangscope bundle."""

    title = "unsafe export path"
    hint = "choose a new directory: hangscope creates it (0700) and writes the bundle inside"


class BundleWriteError(ExportError):
    """Writing failed part-way (disk full, read-only, permission). `pending` holds every file not written, so
    the caller can retry elsewhere; `bundle` is set by the exporter to the whole in-memory bundle."""

    title = "export write failed"
    hint = "the report is still in memory: export it again to another directory (free space or a writable disk)"

    def __init__(self, message: str, *, written: Sequence[str], pending: Mapping[str, bytes],
                 errno_: Optional[int] = None) -> None:
        super().__init__(message)
        self.written: Tuple[str, ...] = tuple(written)
        self.pending: Dict[str, bytes] = dict(pending)
        self.errno = errno_
        self.bundle: object = None


def check_destination(out_dir: str, *, force: bool, tar: bool) -> None:
    """Refuse before anything is written: an existing path without force, a symlink, a non-bundle dir."""
    out_dir = os.path.normpath(out_dir)  # "link/" would make lstat and O_NOFOLLOW follow the link
    _check_dir(out_dir, force=force)
    if tar:
        _check_file(tarball_path(out_dir), force=force)


def tarball_path(out_dir: str) -> str:
    return os.path.normpath(out_dir) + ".tar.gz"


def write_files(out_dir: str, files: Mapping[str, bytes], *, force: bool) -> List[str]:
    """Write `files` (flat names) into out_dir; returns the paths written, in order."""
    out_dir = os.path.normpath(out_dir)
    for name in files:
        if not name or "/" in name or name.startswith(".") or "\0" in name:
            raise ValueError(f"bad bundle file name {name!r}")
    _check_dir(out_dir, force=force)
    written: List[str] = []
    try:
        dfd = _open_dir(out_dir)
    except OSError as exc:
        raise _write_error(out_dir, exc, written, files) from exc
    try:
        for i, (name, data) in enumerate(files.items()):
            try:
                _write_at(dfd, name, data)
            except OSError as exc:
                raise _write_error(os.path.join(out_dir, name), exc, written,
                                   dict(list(files.items())[i:])) from exc
            written.append(os.path.join(out_dir, name))
        try:
            os.fsync(dfd)
        except OSError:
            pass  # some filesystems refuse fsync on a directory; the files themselves were synced
    finally:
        os.close(dfd)
    return written


def write_tarball(out_dir: str, files: Mapping[str, bytes], *, mtime: float, force: bool) -> str:
    """The same files as OUT_DIR.tar.gz (entries under the directory's name, 0600, no owner names)."""
    out_dir = os.path.normpath(out_dir)
    path = tarball_path(out_dir)
    _check_file(path, force=force)
    data = tar_bytes(os.path.basename(os.path.normpath(out_dir)) or "hangscope-report", files, mtime)
    parent = os.path.dirname(os.path.abspath(path))
    try:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _write_error(path, exc, [], {os.path.basename(path): data}) from exc
    try:
        _write_at(dfd, os.path.basename(path), data)
    except OSError as exc:
        raise _write_error(path, exc, [], {os.path.basename(path): data}) from exc
    finally:
        os.close(dfd)
    return path


def tar_bytes(top: str, files: Mapping[str, bytes], mtime: float) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(_tarinfo(top, tarfile.DIRTYPE, 0o700, 0, mtime))
        for name, data in files.items():
            tf.addfile(_tarinfo(f"{top}/{name}", tarfile.REGTYPE, 0o600, len(data), mtime), io.BytesIO(data))
    return buf.getvalue()


def _tarinfo(name: str, kind: bytes, mode: int, size: int, mtime: float) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.size, ti.mtime = kind, mode, size, int(mtime)
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""  # the login user's name is not the recipient's business
    return ti


def _check_dir(out_dir: str, *, force: bool) -> None:
    try:
        st = os.lstat(out_dir)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ExportError(f"cannot inspect {out_dir}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{out_dir} is a symlink; refusing to follow it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{out_dir} exists and is not a directory")
    if not force:
        raise BundleExistsError(f"{out_dir} exists; pass --force to replace the bundle in it")
    try:
        entries = os.listdir(out_dir)
    except OSError as exc:
        raise ExportError(f"cannot read {out_dir}: {exc.strerror or exc}") from exc
    if entries and MANIFEST not in entries:
        # --force replaces an earlier bundle; it never scatters files into (and chmods) an unrelated directory
        raise UnsafePathError(f"{out_dir} is not empty and holds no hangscope bundle ({MANIFEST}); "
                              "refusing to write into it")


def _check_file(path: str, *, force: bool) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path} is a symlink; refusing to follow it")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{path} exists and is not a regular file")
    if not force:
        raise BundleExistsError(f"{path} exists; pass --force to replace it")


def _open_dir(out_dir: str) -> int:
    """Create out_dir 0700 (or reuse an earlier bundle's, checked above) and open it without following links."""
    try:
        os.mkdir(out_dir, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError as exc:
        raise ExportError(f"cannot create {out_dir}: its parent directory does not exist") from exc
    try:
        dfd = os.open(out_dir, _OPEN_DIR)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(f"{out_dir} became a symlink or a file; refusing to follow it") from exc
        raise
    try:
        os.fchmod(dfd, 0o700)  # mkdir's mode is filtered by the umask; the bundle dir is private whatever it is
    except OSError:
        os.close(dfd)
        raise
    return dfd


def _write_at(dfd: int, name: str, data: bytes) -> None:
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, _OPEN_NEW, 0o600, dir_fd=dfd)
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)  # a full disk can surface only here (delayed allocation); report it, not lose data
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise


def _write_error(path: str, exc: OSError, written: Sequence[str], pending: Mapping[str, bytes]) -> BundleWriteError:
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        reason = "no space left on the device"
    elif exc.errno == errno.EROFS:
        reason = "the filesystem is read-only"
    done = f"; {len(written)} file(s) were written before it" if written else ""
    return BundleWriteError(f"cannot write {path}: {reason}{done}", written=written, pending=pending,
                            errno_=exc.errno)
