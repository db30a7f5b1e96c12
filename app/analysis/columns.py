"""The ranks of a snapshot as columns: every attribute the analysis reads of a rank, read in one pass.

At 100k ranks the rank objects lie far apart in memory, each among its own threads, frames and locals, so a
pass that reads one attribute of every rank costs a cache miss per rank (~40 ms at 100k ranks with locals,
bench/analysis.py); one pass that reads all of them costs about four such passes. analyze() reads the ranks
here once and hands the columns to every step that needs a rank's attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, Dict, List, Optional, Sequence, Tuple

from app.analysis.fold import RankKey
from app.model import FlightRecord, RankSnapshot, TcpSocket, ThreadStack

_FIELDS = ("threads", "rank", "node", "pid", "world_size", "local_world_size", "master_addr", "master_port",
           "num_threads", "state", "env", "flight", "sockets", "enters_with", "wchan")
_ROW = attrgetter(*_FIELDS)


@dataclass(frozen=True)
class Facts:
    """Per-rank facts as columns, parallel to `ranks`, read once in C and shared by every step of analyze()."""

    ranks: Sequence[RankSnapshot]
    threads: Sequence[Tuple[ThreadStack, ...]]
    rank: Sequence[Optional[int]]
    node: Sequence[str]
    pid: Sequence[int]
    world: Sequence[Optional[int]]
    local_world: Sequence[Optional[int]]
    addr: Sequence[str]
    port: Sequence[Optional[int]]
    num_threads: Sequence[int]
    state: Sequence[str]
    env: Sequence[Tuple[Tuple[str, str], ...]]
    flight: Sequence[Optional[FlightRecord]]
    sockets: Sequence[Tuple[TcpSocket, ...]]
    wchan: Sequence[str]  # the process's (its main thread's) kernel wait: health.py tells the freezer's by it
    enters_with: Sequence[bool]  # a thread stands at a `with` header (RankSnapshot.enters_with; locks.py)
    key: Sequence[RankKey]  # (node, pid), made once: classes and groups take these tuples, not new ones


# Ranks are read a chunk at a time: the rows of one chunk are gone before the next is read, so the garbage
# collector's young-generation passes walk a few hundred fresh rows whose ranks are still in the CPU cache,
# not 100k rows pointing all over the heap (100k ranks: 0.17 s instead of 0.32 s for one zip(*rows)).
_CHUNK = 512
_COLUMN = tuple(itemgetter(i) for i in range(len(_FIELDS)))


def facts(ranks: Sequence[RankSnapshot]) -> Facts:
    columns: Tuple[List[Any], ...] = tuple([] for _ in _FIELDS)
    for start in range(0, len(ranks), _CHUNK):
        rows = list(map(_ROW, ranks[start:start + _CHUNK]))
        for column, get in zip(columns, _COLUMN):
            column.extend(map(get, rows))
    threads, rank, node, pid, world, local_world, addr, port, num_threads, state, env, flight, sockets, \
        enters_with, wchan = columns
    # One string object per node name (a snapshot read from JSON has one per rank): every later set, count
    # and fold of node names then reads a few hundred strings instead of 100k scattered ones.
    same: Dict[str, str] = {}
    node = list(map(same.setdefault, node, node))
    return Facts(ranks, threads, rank, node, pid, world, local_world, addr, port, num_threads, state, env, flight,
                 sockets, wchan, enters_with, list(zip(node, pid)))


def facts_of(ranks: Sequence[RankSnapshot], known: Optional[Facts]) -> Facts:
    """`known` when it was read from these very ranks, else the ranks read now."""
    return known if known is not None and known.ranks is ranks else facts(ranks)
