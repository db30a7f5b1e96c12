"""The session: connect -> hello -> discover -> dump on every node at once, streaming events; no UI imports.

This package root only names what the CLI and the TUI use; each lives in its own module:

- session.py: Session, which drives the nodes and keeps their workers warm between passes
- options.py: SessionOptions
- events.py: the events a session emits (NodeUpdate, RankUpdate, SnapshotDone)
- store.py: rank numbers from a job's store; peer_names.py: naming the addresses no inspected node has
"""

from __future__ import annotations

from app.session.events import NodeUpdate, RankUpdate, SessionEvent, SnapshotDone
from app.session.options import SessionOptions
from app.session.session import Session, dump_skew, raise_nofile_limit

__all__ = ["NodeUpdate", "RankUpdate", "Session", "SessionEvent", "SessionOptions", "SnapshotDone", "dump_skew",
           "raise_nofile_limit"]
