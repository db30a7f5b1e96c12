"""The files SSH reads on this machine (ssh configs and what they Include, identities, known_hosts), checked
before anything connects: each must be a regular file of a sane size, and Includes must not loop.

asyncssh opens them with a plain open(): a FIFO without a writer there blocks the event loop for ever, a device
never ends, and a config that includes itself recurses until Python gives up. So the command line checks every
file first (check_ssh_files: exit 2, one line naming the file), and the transport itself skips anything that is
not a regular file (usable), in case a file changes after the check. No asyncssh here: the CLI imports this.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from typing import Optional, Sequence

from app.inputs.files import InputFileError, check_input, open_input, read_bounded

DEFAULT_CONFIGS = ("~/.ssh/config", "/etc/ssh/ssh_config")
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2", "/etc/ssh/ssh_known_hosts",
                       "/etc/ssh/ssh_known_hosts2")
MAX_CONFIG_BYTES = 1 << 20  # a config with a block per node for 10,000 nodes is ~600 KB
MAX_KNOWN_HOSTS_BYTES = 64 << 20
MAX_IDENTITY_BYTES = 1 << 20
MAX_INCLUDE_DEPTH = 16  # OpenSSH's own limit (READCONF_MAX_DEPTH)
_INCLUDE = re.compile(r"[ \t]*include(?:[ \t]*=[ \t]*|[ \t]+)(.*)", re.IGNORECASE)


def usable(path: str) -> bool:
    """Whether `path` is a regular file this process may read (a FIFO, a device or a directory is not)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode) and os.access(path, os.R_OK)


def check_ssh_files(configs: Optional[Sequence[str]], identities: Sequence[str]) -> None:
    """InputFileError (exit 2, one line) for the first ssh file that cannot be read safely: `-F` files and
    identities must exist; the default configs and known_hosts files only when they exist."""
    for path in configs or ():
        _check_config(path, "ssh config (-F)", [])
    if configs is None:
        for default in DEFAULT_CONFIGS:
            path = os.path.expanduser(default)
            if os.path.lexists(path):
                _check_config(path, "ssh config", [])
    for path in identities:
        check_input(path, what="identity file (-i)", max_bytes=MAX_IDENTITY_BYTES)
    for default in DEFAULT_KNOWN_HOSTS:
        path = os.path.expanduser(default)
        if os.path.lexists(path):
            check_input(path, what="known_hosts file", max_bytes=MAX_KNOWN_HOSTS_BYTES)


def _check_config(path: str, what: str, stack: list) -> None:
    """The config and, depth first, every file it Includes (relative names are under ~/.ssh or /etc/ssh)."""
    st = check_input(path, what=what, max_bytes=MAX_CONFIG_BYTES)
    me = (st.st_dev, st.st_ino)
    if me in stack:
        raise InputFileError(path, "includes itself (an Include loop)", what=what)
    if len(stack) >= MAX_INCLUDE_DEPTH:
        raise InputFileError(path, f"Includes nest more than {MAX_INCLUDE_DEPTH} deep", what=what)
    with open_input(path, what=what, max_bytes=MAX_CONFIG_BYTES) as f:
        text = read_bounded(f, MAX_CONFIG_BYTES).decode("utf-8", "replace")
    base = os.path.dirname(os.path.abspath(path)) if not path.startswith("/etc/") else "/etc/ssh"
    if path == os.path.expanduser("~/.ssh/config") or os.path.dirname(os.path.abspath(path)) == \
            os.path.expanduser("~/.ssh"):
        base = os.path.expanduser("~/.ssh")
    for line in text.splitlines():
        m = _INCLUDE.match(line)
        if m is None:
            continue
        for pattern in m.group(1).split():
            full = os.path.expanduser(pattern.strip('"'))
            if not os.path.isabs(full):
                full = os.path.join(base, full)
            for included in sorted(glob.glob(full))[:256]:
                if os.path.isfile(included):  # asyncssh and OpenSSH skip what is not a file
                    _check_config(included, "ssh config (Include)", stack + [me])
