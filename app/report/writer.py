"""Writing a bundle to disk: a 0700 directory of 0600 files, no symlink followed, nothing overwritten without
force, and every write failure reported with what was and was not written (the data stays in memory).

Which paths may be written is app.inputs.paths' one checker (the command line's --snapshot and --json use it
too), and every file is written its way: a temporary name created O_EXCL|O_NOFOLLOW relative to the directory's
descriptor (the bundle directory itself opened O_NOFOLLOW), fsync'd, then renamed over the final name: a rename
replaces a symlink planted inside an earlier bundle instead of writing through it, and a half-written file never
carries the final name.
"""

from __future__ import annotations

import errno
import io
import os
import tarfile
from typing import Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from app.errors import HangscopeError
from app.inputs import paths

MANIFEST = "manifest.json"  # its presence marks a directory as an earlier bundle (safe to --force over)
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ExportError(HangscopeError):
    """The bundle could not be exported to that path."""

    title = "export failed"


# Refusals are the one path checker's (exit 2): an existing path without force, a symlink, a device or a FIFO,
# a directory that is not a bundle, a system tree, an input of the same command.
BundleExistsError = paths.OutputExistsError
UnsafePathError = paths.UnsafeOutputError


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


def check_destination(out_dir: str, *, force: bool, tar: bool, names: Collection[str] = (),
                      inputs: Iterable[str] = (), flag: str = "", writable: bool = False) -> None:
    """Refuse before anything is written: an existing path without force, a symlink, a device or FIFO, a
    directory that is not a bundle, a file of `names` in it that is not a regular file or is one of `inputs`
    (with writable, also an unwritable or full directory: the command line's check before collecting)."""
    out_dir = os.path.normpath(out_dir)  # "link/" would make lstat and O_NOFOLLOW follow the link
    inputs = tuple(inputs)
    paths.check_dir(out_dir, flag=flag, force=force, marker=MANIFEST, names=names, inputs=inputs,
                    writable=writable)
    if tar:
        paths.check_file(tarball_path(out_dir), flag="--tar" if flag else "", force=force, inputs=inputs,
                         writable=writable)


def tarball_path(out_dir: str) -> str:
    return os.path.normpath(out_dir) + ".tar.gz"


def write_files(out_dir: str, files: Mapping[str, bytes], *, force: bool) -> List[str]:
    """Write `files` (flat names) into out_dir; returns the paths written, in order."""
    out_dir = os.path.normpath(out_dir)
    for name in files:
        if not name or "/" in name or name.startswith(".") or "\0" in name:
            raise ValueError(f"bad bundle file name {name!r}")
    paths.check_dir(out_dir, force=force, marker=MANIFEST, names=files)
    check_room(out_dir, [len(data) for data in files.values()], pending=files)
    written: List[str] = []
    try:
        dfd = _open_dir(out_dir)
    except OSError as exc:
        raise _write_error(out_dir, exc, written, files) from exc
    try:
        for i, (name, data) in enumerate(files.items()):
            try:
                paths.write_at(dfd, name, data, replace=True, replace_links=True,
                               shown=os.path.join(out_dir, name))
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
    data = tar_bytes(os.path.basename(os.path.normpath(out_dir)) or "hangscope-report", files, mtime)
    try:
        paths.write_file(path, data, force=force)
    except paths.WriteError as exc:
        raise BundleWriteError(str(exc), written=[], pending={os.path.basename(path): data},
                               errno_=exc.errno) from exc
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


def check_room(out_dir: str, sizes: Sequence[int], *, pending: Mapping[str, bytes]) -> None:
    """The whole bundle is measured before its first file: a disk without room for it is a message, never a
    partial bundle (an existing directory is where it goes, a new one is made in its parent)."""
    where = out_dir if os.path.isdir(out_dir) else (os.path.dirname(out_dir) or ".")
    try:
        paths.check_room(where, sizes, shown=out_dir)
    except paths.WriteError as exc:
        raise BundleWriteError(str(exc), written=[], pending=pending, errno_=exc.errno) from None


def _write_error(path: str, exc: OSError, written: Sequence[str], pending: Mapping[str, bytes]) -> BundleWriteError:
    done = f"; {len(written)} file(s) were written before it" if written else ""
    return BundleWriteError(f"cannot write {path}: {paths.write_reason(exc)}{done}", written=written,
                            pending=pending, errno_=exc.errno)
