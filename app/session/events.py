"""What a session emits as results arrive: a node's status, a rank, a finished snapshot (SessionEvent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from app.model import NodeStatus, RankSnapshot, Snapshot


@dataclass(frozen=True)
class NodeUpdate:
    node: NodeStatus


@dataclass(frozen=True)
class RankUpdate:
    rank: RankSnapshot


@dataclass(frozen=True)
class SnapshotDone:
    snapshot: Snapshot


SessionEvent = Union[NodeUpdate, RankUpdate, SnapshotDone]
