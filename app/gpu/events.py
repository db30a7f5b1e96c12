"""Progress events of the GPU tests, in the order they happen; the TUI shows them while tests run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from app.gpu.model import GpuTestResults, TestRun


@dataclass(frozen=True)
class RunStarted:
    run_id: str
    kind: str
    nodes: tuple[str, ...]
    master: str
    port: int


@dataclass(frozen=True)
class RankProgress:
    """A rank reached a new phase (see app.gpu.model.PHASES)."""

    run_id: str
    node: str
    rank: int
    local_rank: int
    phase: str


@dataclass(frozen=True)
class RunFinished:
    run: TestRun


@dataclass(frozen=True)
class RoundStarted:
    scope: str  # "nodes", or the node whose GPUs are paired
    index: int  # 1, 2, ...: the round's number (a round of 1-tuples tests each unit alone)
    tests: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Note:
    text: str


@dataclass(frozen=True)
class Finished:
    """Always the last event."""

    results: GpuTestResults


GpuEvent = Union[RunStarted, RankProgress, RunFinished, RoundStarted, Note, Finished]
