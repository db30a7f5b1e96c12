"""What SSH authentication tried, for the auth_failed message: agent, identity files, encrypted keys skipped.

hangscope never prompts: an encrypted key is usable only through ssh-agent, so the message says which keys
were skipped for that reason. Only reads key files on this (login) node, and only after a failure.
"""

from __future__ import annotations

import getpass
import os
from typing import Any, Optional, Sequence

from app.errors import TransportError
from app.transport.sshlib import asyncssh

# asyncssh's default identity files, in its order (public_key._DEFAULT_KEY_FILES)
DEFAULT_IDENTITIES = ("id_ed25519_sk", "id_ecdsa_sk", "id_ed448", "id_ed25519", "id_ecdsa", "id_rsa", "id_dsa")


def identity_candidates(cfg: Optional[Any], identity: Sequence[str]) -> list[str]:
    """The identity files an attempt uses: explicit ones, else ssh config IdentityFile, else the defaults."""
    if identity:
        paths = list(identity)
    elif cfg is not None and cfg.get("IdentityFile"):
        paths = [str(p) for p in cfg.get("IdentityFile")]
    else:
        paths = [os.path.join("~", ".ssh", name) for name in DEFAULT_IDENTITIES]
    return [os.path.expanduser(p) for p in paths]


def _key_state(path: str) -> Optional[str]:
    """None when the file is absent; else "usable", "encrypted" or "unreadable"."""
    if not os.path.exists(path):
        return None
    try:
        asyncssh.read_private_key(path)
    except asyncssh.KeyImportError as exc:
        return "encrypted" if "passphrase" in str(exc).lower() else "unreadable"
    except (OSError, ValueError):
        return "unreadable"
    return "usable"


def auth_failure(name: str, cfg: Optional[Any], identity: Sequence[str], reason: str) -> TransportError:
    """auth_failed naming the user and everything that was offered, so the user knows what to fix."""
    user = cfg.get("User") if cfg is not None else None
    tried: list[str] = []
    agent = os.environ.get("SSH_AUTH_SOCK")
    if agent:
        tried.append(f"ssh-agent at {agent}")
    skipped: list[str] = []
    bad: list[str] = []
    for path in identity_candidates(cfg, identity):
        state = _key_state(path)
        if state == "usable":
            tried.append(path)
        elif state == "encrypted":
            skipped.append(path)
        elif state == "unreadable":
            bad.append(path)
        elif identity:  # an explicitly named file that does not exist is worth saying
            bad.append(f"{path} (missing)")
    parts = [f"tried {', '.join(tried)}" if tried else "no key was available to offer"]
    if skipped:
        parts.append(f"skipped encrypted key(s) {', '.join(skipped)}: hangscope never asks for a passphrase, "
                     "load them into ssh-agent (ssh-add)")
    if bad:
        parts.append(f"could not read {', '.join(bad)}")
    who = f"as {user or getpass.getuser()!r}"
    return TransportError("auth_failed", f"{name}: the server refused authentication {who} ({reason}); "
                          + "; ".join(parts), phase="login")
