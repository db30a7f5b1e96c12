"""Host key policy for SSH: which known_hosts files apply, unknown vs changed keys, accepting new ones on request.

Host keys are always verified. known_hosts files are never modified, except that an explicit
accept_new=True appends an UNKNOWN key (never a changed one) to ~/.ssh/known_hosts, as OpenSSH's
StrictHostKeyChecking=accept-new does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, cast

from app.errors import TransportError
from app.transport.files import usable
from app.transport.sshlib import asyncssh

DEFAULT_USER_FILES = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_FILES = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
DEFAULT_PORT = 22


def known_hosts_paths(config: Optional[asyncssh.config.SSHConfig],
                      override: Optional[Sequence[str]] = None) -> tuple[str, ...]:
    """The files to trust, OpenSSH's way: UserKnownHostsFile then GlobalKnownHostsFile (or their defaults).

    asyncssh alone reads only ~/.ssh/known_hosts and treats `UserKnownHostsFile none` as "verify nothing";
    here "none" simply contributes no file, so verification can never be switched off.
    """
    if override is not None:
        wanted: list[str] = list(override)
    else:
        # asyncssh's config values are typed `object`; these two options are lists of paths.
        user = cast(Optional[Sequence[str]], config.get("UserKnownHostsFile", None) if config is not None else None)
        system = cast(Optional[Sequence[str]],
                      config.get("GlobalKnownHostsFile", None) if config is not None else None)
        wanted = list(DEFAULT_USER_FILES if user is None else user)
        wanted += list(DEFAULT_GLOBAL_FILES if system is None else system)
    out = []
    for path in wanted:
        full = os.path.expanduser(str(path))
        if full.lower() != "none" and full not in out:
            out.append(full)
    return tuple(out)


class KnownHostsCache:
    """Parsed known_hosts per set of files, read once per session (hundreds of nodes share them)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, ...], asyncssh.SSHKnownHosts] = {}
        self.warnings: list[str] = []

    def get(self, paths: tuple[str, ...]) -> asyncssh.SSHKnownHosts:
        known = self._cache.get(paths)
        if known is None:
            known = asyncssh.SSHKnownHosts()
            for path in paths:
                self._load(known, path)
            self._cache[paths] = known
        return known

    def _load(self, known: asyncssh.SSHKnownHosts, path: str) -> None:
        if not usable(path):
            return  # a missing or unreadable file trusts nothing, as with OpenSSH; a FIFO or a device is not read
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        try:
            known.load(text)
        except ValueError:
            # OpenSSH skips lines it cannot parse; asyncssh rejects the whole file. Keep the good lines.
            bad = 0
            for line in text.splitlines():
                try:
                    probe = asyncssh.SSHKnownHosts()
                    probe.load(line)
                except ValueError:
                    bad += 1
                    continue
                known.load(line)
            self.warnings.append(f"{path}: skipped {bad} malformed line(s)")


def entry_host(host: str, port: Optional[int]) -> str:
    """How known_hosts names a host: `host`, or `[host]:port` off port 22."""
    return host if not port or port == DEFAULT_PORT else f"[{host}]:{port}"


@dataclass
class HostKeyCheck:
    """One connection's host key decision; asyncssh asks it only about keys that known_hosts does not trust."""

    known: asyncssh.SSHKnownHosts
    accept_new: bool = False
    offered: Optional[asyncssh.SSHKey] = None
    lookup: tuple[str, Optional[int]] = ("", None)  # the name and port the key was looked up under
    had_entries: bool = False
    accepted: bool = False
    notes: list[str] = field(default_factory=list)

    def validate(self, host: str, addr: str, port: int) -> None:
        port_ = port if port != DEFAULT_PORT else None
        host_keys, ca_keys = asyncssh.match_known_hosts(self.known, host, addr, port_)[:2]
        self.had_entries = bool(host_keys or ca_keys)
        self.lookup = (host, port)

    def decide(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.offered = key
        self.validate(host, addr, port)
        if self.accept_new and not self.had_entries:
            self.accepted = True
            return True
        return False

    @property
    def fingerprint(self) -> str:
        return self.offered.get_fingerprint("sha256") if self.offered is not None else "unknown"

    def error(self, name: str, detail: str) -> TransportError:
        """The classified failure: unknown and changed keys are different problems with different remedies."""
        where = entry_host(*self.lookup) if self.lookup[0] else name
        if self.offered is None:
            if "revoked" in detail.lower():
                return TransportError("host_key_changed", f"{name}: the host key of {where} is marked @revoked "
                                      f"in known_hosts ({detail})", phase="connect")
            # e.g. a ProxyJump host, which asyncssh verifies itself against the same files
            return TransportError("ssh_error", f"{name}: host key verification failed: {detail}", phase="connect")
        kind = self.offered.get_algorithm()
        if self.had_entries:
            return TransportError("host_key_changed", f"{name}: the {kind} host key of {where} CHANGED: the "
                                  f"server offers {self.fingerprint}, which differs from known_hosts",
                                  phase="connect")
        return TransportError("host_key_unknown", f"{name}: the host key of {where} is not in known_hosts: "
                              f"the server offers {kind} {self.fingerprint}", phase="connect")

    def append_accepted(self, path: str = "~/.ssh/known_hosts") -> Optional[str]:
        """Write the accepted key to the user's known_hosts (only after the key exchange proved it)."""
        if not self.accepted or self.offered is None:
            return None
        full = Path(os.path.expanduser(path))
        line = f"{entry_host(*self.lookup)} {self.offered.export_public_key('openssh').decode('ascii').strip()}\n"
        full.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(full, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("ascii"))
        finally:
            os.close(fd)
        # the in-memory copy too, so a reconnect in this session does not append the same key again
        self.known.load(line)
        return str(full)
