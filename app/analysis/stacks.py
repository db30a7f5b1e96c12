"""Each rank's selected thread, and ranks grouped by raw path.

At 100k ranks x 60 frames nothing here may read every frame of every rank: ranks are grouped by their
threads' interned paths (model.ThreadStack.path: one lookup per run of ranks on the same path), and frames
are read once per distinct path.
"""

from __future__ import annotations

from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Dict, List, Optional, Sequence, Tuple

from app.analysis.options import AnalysisOptions, selector
from app.model import Frame, RankSnapshot, ThreadStack

raw_frame = attrgetter("function", "filename", "line")
_main_and_path = attrgetter("is_main", "path")
_first = itemgetter(0)
_second = itemgetter(1)

Path = Tuple[Frame, ...]


class Selected:
    """The thread the analysis merges of each rank: `at` the positions of the ranks whose thread has frames,
    `paths` their threads' paths (parallel to `at`), `no_stack` the other ranks."""

    __slots__ = ("at", "paths", "no_stack", "_chosen", "_threads")

    def __init__(self, at: Sequence[int], paths: Sequence[Path], no_stack: List[RankSnapshot], *,
                 chosen: Optional[Sequence[Optional[ThreadStack]]] = None,
                 threads: Sequence[Tuple[ThreadStack, ...]] = ()) -> None:
        self.at = at
        self.paths = paths
        self.no_stack = no_stack
        self._chosen = chosen
        self._threads = threads  # the fast path's: the selected thread is the first

    def thread(self, i: int) -> ThreadStack:
        """The selected thread of the rank at position i (one with frames: i is in `at`)."""
        t = self._chosen[i] if self._chosen is not None else self._threads[i][0]
        assert t is not None
        return t


def selected_stacks(ranks: Sequence[RankSnapshot], threads: Sequence[Tuple[ThreadStack, ...]],
                    options: AnalysisOptions) -> Selected:
    """The selected thread of every rank; `threads` is each rank's threads (columns.Facts.threads)."""
    if options.thread == "main":
        fast = _main_stacks(ranks, threads)
        if fast is not None:
            return fast
    select = selector(options)  # the general pass: a chosen thread, or main threads in the unusual shapes
    chosen = list(map(select, ranks))
    at = [i for i, t in enumerate(chosen) if t is not None and t.frames]
    paths = [chosen[i].path for i in at]  # type: ignore[union-attr]
    return Selected(at, paths, _without(ranks, at), chosen=chosen)


def _main_stacks(ranks: Sequence[RankSnapshot], threads: Sequence[Tuple[ThreadStack, ...]]) -> Optional[Selected]:
    """The usual case in C: every rank has threads and its first thread is the main one (None otherwise).
    One read of each first thread: is_main and path together."""
    if not all(threads):
        return None
    heads = list(map(_main_and_path, map(_first, threads)))
    if not all(map(_first, heads)):
        return None
    paths = list(map(_second, heads))  # a path is empty exactly when the frames are
    if all(paths):
        return Selected(range(len(ranks)), paths, [], threads=threads)
    at = [i for i, p in enumerate(paths) if p]
    return Selected(at, [paths[i] for i in at], _without(ranks, at), threads=threads)


def _without(ranks: Sequence[RankSnapshot], at: Sequence[int]) -> List[RankSnapshot]:
    kept = set(at)
    return [r for i, r in enumerate(ranks) if i not in kept]


RawKey = Tuple[Tuple[str, str, int], ...]
Part = Tuple[Path, List[int]]  # one path object and the positions (in the snapshot) of the ranks on it


def raw_groups(at: Sequence[int], paths: Sequence[Path]) -> Dict[RawKey, List[Part]]:
    """Ranks by raw path, (function, file, line) of every frame, as the parts of each raw path: its distinct
    path objects with their ranks, positions ascending within a part. Paths are interned when a stack is
    built, so neighbouring ranks on one path hold one object and a run of them costs one dict lookup, whatever
    the depth and whether or not their frames carry per-rank locals. A raw path has several parts when its
    ranks are in different loop iterations, or when equal paths are distinct objects (the intern table started
    over meanwhile): the raw key, computed once per path object, brings them together."""
    ids = list(map(id, paths))  # valid keys: the ranks keep their paths alive during this call
    by_id: Dict[int, Part] = {}
    for key, run in groupby(range(len(ids)), ids.__getitem__):  # j: an index into `at` and `paths`
        part = by_id.get(key)
        if part is None:
            js = list(run)
            by_id[key] = (paths[js[0]], list(map(at.__getitem__, js)))
        else:
            part[1].extend(map(at.__getitem__, run))
    raw: Dict[RawKey, List[Part]] = {}
    for part in by_id.values():
        raw.setdefault(tuple(map(raw_frame, part[0])), []).append(part)
    return raw
