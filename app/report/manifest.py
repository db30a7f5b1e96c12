"""manifest.json: what the bundle is, who made it with which versions, which nodes answered, what was
redacted (counts by rule, never values) and what was left out and why."""

from __future__ import annotations

import hashlib
import sys
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from app import __version__
from app.model import Snapshot
from app.model.codec import to_dict

BUNDLE_FORMAT = "hangscope.bundle"
BUNDLE_VERSION = 1
_LOGIN_PACKAGES = ("asyncssh", "textual", "psutil", "ClusterShell")


def iso(ts: Optional[float]) -> Optional[str]:
    """The time in ISO 8601 (UTC), None when there is none or it is outside the calendar (a loaded file may
    say 9e14)."""
    if not ts:
        return None
    try:
        return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return None


def login_versions() -> Dict[str, str]:
    """Versions of hangscope and what it runs with on the login node (no hostnames, no paths)."""
    out = {"hangscope": __version__, "python": sys.version.split()[0]}
    for dist in _LOGIN_PACKAGES:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def build_manifest(snapshot: Snapshot, *, created_at: float, files: Mapping[str, bytes],
                   redactions: Mapping[str, int], skipped: Sequence[Tuple[str, str]],
                   history: Sequence[Snapshot] = (), tests_included: bool = False,
                   pyspy_version: Optional[str] = None,
                   by_channel: Optional[Mapping[str, int]] = None) -> Dict[str, Any]:
    ranks = snapshot.ranks
    versions = login_versions()
    if pyspy_version:
        versions["py-spy (login node)"] = pyspy_version
    return {
        "format": BUNDLE_FORMAT,
        "format_version": BUNDLE_VERSION,
        "created_at": iso(created_at),
        "versions": versions,
        "snapshot": {
            "taken_at": iso(snapshot.taken_at),
            "duration_s": round(snapshot.duration, 3),
            "written_by": snapshot.hangscope_version or None,
            "complete": snapshot.complete,
            "interrupted": snapshot.interrupted,
            "options": to_dict(snapshot.options),
            "history_samples": len(history),
            "gpu_tests": tests_included,
        },
        "hosts": [n.name for n in snapshot.nodes],
        "nodes": [_node(n) for n in snapshot.nodes],
        "ranks": {
            "found": len(ranks),
            "collected": sum(1 for r in ranks if r.collected and not r.partial),
            "partial": sum(1 for r in ranks if r.partial),
            "failed": sum(1 for r in ranks if r.error is not None),
        },
        "files": [{"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                  for name, data in files.items()],
        "redactions": {
            "by_rule": dict(sorted(redactions.items())),
            "total": sum(redactions.values()),
            # every value replaced in the data, on the node before it was sent and here: one *** or token each
            "by_channel": dict(sorted((by_channel or {}).items())),
            "note": "by_rule: how many values each rule of the export's pass replaced (with *** for the pattern "
                    "rules, with <TYPE len=N #HASH> for default-deny: a value not safe by the rule, hashed with a "
                    "key made for this bundle and never written); by_channel: how many of either the snapshot "
                    "holds per channel (argv, env, locals, source lines, strace, ...), the *** mostly replaced on "
                    "the node before anything was sent; the values themselves are recorded nowhere",
        },
        "skipped": [{"item": item, "reason": reason} for item, reason in skipped],
    }


def _node(n: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {"name": n.name, "state": n.state, "ranks_found": n.ranks_found}
    if n.address and n.address != n.name:
        out["address"] = n.address
    if n.error is not None:
        out["error"] = {"code": n.error.code, "phase": n.error.phase, "message": n.error.message,
                        "hint": n.error.hint}
    if n.info is not None:
        out["python"] = n.info.python
        out["kernel"] = n.info.kernel
        out["ptrace_scope"] = n.info.ptrace_scope
        out["tools"] = {t.name: t.version or "found" for t in n.info.tools}
    if n.warnings:
        out["warnings"] = list(n.warnings)
    if n.timings:
        out["timings_s"] = {phase: round(sec, 3) for phase, sec in n.timings}
    return out
