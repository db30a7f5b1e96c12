"""asyncssh, imported here once for the modules of app.transport that use it (auth, hostkeys, ssh, sshconfig).

At import, asyncssh looks for liboqs (its optional sntrup761 key exchange) with `ctypes.util.find_library`,
twice ("oqs", "liboqs"). On Linux that function runs `ldconfig -p` and then, for a library the cache lacks,
a C compiler and the linker (`gcc -Wl,-t`, `ld -t`): ~33 ms of wall time and ~35 ms of CPU at every start of
the CLI, and a compiler run on the login node, which has no business there. While asyncssh is imported,
`find_library` here looks in the directories the dynamic loader searches (LD_LIBRARY_PATH, the directories of
/etc/ld.so.conf and its includes, the system's library directories) without starting a process, and gives
the library's full path, which `ctypes.cdll.LoadLibrary` loads as asyncssh does with the name it is given.
A liboqs installed anywhere else is not found; asyncssh then offers the key exchanges it has without it
(ML-KEM from `cryptography`, curve25519), as on a machine without liboqs.
"""

from __future__ import annotations

import ctypes.util
import functools
import glob
import os
import re
from typing import Iterator, List, Optional

# The directories glibc's loader searches besides its cache (64-bit first; multiarch as on Debian/Ubuntu).
_SYSTEM_DIRS = ("/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib", "/usr/lib", "/usr/local/lib",
                "/usr/local/lib64")
_MAX_CONF_FILES = 64  # ld.so.conf includes read at most (a bound on what one start reads)


def _conf_dirs(path: str = "/etc/ld.so.conf", depth: int = 0, seen: Optional[List[str]] = None) -> Iterator[str]:
    """The directories /etc/ld.so.conf names, its `include` globs followed (two levels, bounded)."""
    seen = [] if seen is None else seen
    if depth > 2 or len(seen) >= _MAX_CONF_FILES or path in seen:
        return
    seen.append(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 16).splitlines()
    except OSError:
        return
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line.startswith("include "):
            for inc in sorted(glob.glob(line.split(None, 1)[1].strip()))[:_MAX_CONF_FILES]:
                yield from _conf_dirs(inc, depth + 1, seen)
        elif line.startswith("/"):
            yield line


@functools.lru_cache(maxsize=None)
def _names(directory: str) -> tuple[str, ...]:
    """A directory's entries (merged-/usr systems list one directory under two names: read once)."""
    try:
        return tuple(os.listdir(directory))
    except OSError:
        return ()


def find_library_without_compiler(name: str) -> Optional[str]:
    """The full path of lib<name>.so or lib<name>.so.<version> in the loader's directories, or None."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += list(_conf_dirs()) + list(_SYSTEM_DIRS)
    plain = "lib%s.so" % name
    versioned = re.compile(re.escape(plain) + r"(?:\.\d+)+$")
    for d in dict.fromkeys(os.path.realpath(d) for d in dirs):  # in order, once each
        names = _names(d)
        found = sorted(n for n in names if n.startswith(plain) and (n == plain or versioned.match(n)))
        if found:
            return os.path.join(d, found[0])
    return None


# Module level, so that this is the process's first import of asyncssh wherever app.transport is used.
_real_find_library = ctypes.util.find_library
ctypes.util.find_library = find_library_without_compiler
try:
    import asyncssh
finally:
    ctypes.util.find_library = _real_find_library
    _names.cache_clear()

__all__ = ["asyncssh"]
