"""What a path is on this machine: its file type in words, and whether it lies in a system tree (/proc, /sys,
/dev, or any kernel pseudo file system wherever it is mounted) where hangscope never reads nor writes."""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional

# Kernel file systems whose files are interfaces, not data: reading one can block (/proc/kmsg) or consume
# (a tracing pipe), writing one changes the kernel (/sys/kernel/mm/transparent_hugepage/enabled).
PSEUDO_FS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                       "securityfs", "configfs", "bpf", "pstore", "efivarfs", "fusectl", "mqueue", "binfmt_misc",
                       "autofs", "hugetlbfs", "rpc_pipefs", "nsfs", "selinuxfs", "smackfs"})
SYSTEM_TREES = ("/proc", "/sys", "/dev")
ALLOWED_IN_DEV = ("/dev/shm",)  # a tmpfs for files, not devices
_MOUNTINFO_MAX = 4 << 20
_OS_REASONS = {errno.ENOENT: "does not exist", errno.EACCES: "permission denied", errno.EPERM: "permission denied",
               errno.ELOOP: "is a symlink loop", errno.ENAMETOOLONG: "the name is too long",
               errno.ENOTDIR: "a part of the path is not a directory"}


def kind(mode: int) -> str:
    """A file type in words, with an article: "a FIFO", "a character device", ..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def os_reason(exc: OSError, *, missing: str = "does not exist") -> str:
    """Why an OSError happened, in the words of a one-line message (`missing`: the words for ENOENT)."""
    if exc.errno == errno.ENOENT:
        return missing
    return _OS_REASONS.get(exc.errno or 0, (exc.strerror or str(exc)).lower())


def system_tree(path: str) -> Optional[str]:
    """The system tree `path` resolves into ("/proc", "/sys", "/dev" or a pseudo file system's type), or None.
    Symlinks on the way are resolved: a link into /sys is /sys."""
    real = os.path.realpath(path)
    for top in SYSTEM_TREES:
        if real == top or real.startswith(top + "/"):
            if not any(real == ok or real.startswith(ok + "/") for ok in ALLOWED_IN_DEV):
                return top
    fstype = fs_type(real)
    return fstype if fstype in PSEUDO_FS else None


def fs_type(real: str) -> Optional[str]:
    """The type of the file system that holds the absolute, resolved path `real` (from this process's mount
    table), or None when the table cannot be read."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            table = f.read(_MOUNTINFO_MAX).decode("utf-8", "replace")
    except OSError:
        return None
    best, best_type = "", None
    for line in table.splitlines():
        fields = line.split(" ")
        if len(fields) < 7 or " - " not in line:
            continue
        point = _unescape(fields[4])
        after = line.split(" - ", 1)[1].split(" ")
        inside = real == point or point == "/" or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # the last of equal mounts is the one on top
            best, best_type = point, after[0] if after else None
    return best_type


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in octal (\\040)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)
