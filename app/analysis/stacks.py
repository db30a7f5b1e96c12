"""Each rank's selected stack, and ranks grouped by raw path: the one pass over every frame of every rank.

At 100k ranks x 60 frames this pass is most of the analysis time, so it stays in C (attrgetter and map over
frame tuples, dict lookups on whole-path keys); nothing here is done per frame in Python.
"""

from __future__ import annotations

from operator import attrgetter, itemgetter
from typing import Dict, List, Optional, Sequence, Tuple

from app.analysis.options import AnalysisOptions, selector
from app.model import Frame, RankSnapshot

raw_frame = attrgetter("function", "filename", "line")
_threads = attrgetter("threads")
_frames = attrgetter("frames")
_is_main = attrgetter("is_main")
_first = itemgetter(0)

Stacks = Tuple[List[RankSnapshot], List[Tuple[Frame, ...]], List[RankSnapshot]]


def selected_stacks(ranks: Sequence[RankSnapshot], options: AnalysisOptions) -> Stacks:
    """The selected thread's frames of every rank that has some, and the ranks that have none."""
    with_stack: List[RankSnapshot] = []
    stacks: List[Tuple[Frame, ...]] = []
    no_stack: List[RankSnapshot] = []
    if options.thread == "main":
        fast = _main_stacks(ranks)
        if fast is not None:
            return fast
    select = selector(options)  # the general pass: a chosen thread, or main threads in the unusual shapes
    for r in ranks:
        t = select(r)
        if t is not None and t.frames:
            with_stack.append(r)
            stacks.append(t.frames)
        else:
            no_stack.append(r)
    return with_stack, stacks, no_stack


def _main_stacks(ranks: Sequence[RankSnapshot]) -> Optional[Stacks]:
    """The usual case in C: every rank has threads and its first thread is the main one (None otherwise)."""
    threads = list(map(_threads, ranks))
    if not all(threads):
        return None
    first = list(map(_first, threads))
    if not all(map(_is_main, first)):
        return None
    stacks = list(map(_frames, first))
    if all(stacks):
        return list(ranks), stacks, []
    with_stack = [r for r, s in zip(ranks, stacks) if s]
    return with_stack, [s for s in stacks if s], [r for r, s in zip(ranks, stacks) if not s]


RawKey = Tuple[Tuple[str, str, int], ...]


_Members = Tuple[List[RankSnapshot], List[Tuple[Frame, ...]]]  # ranks and their stacks, in parallel


def raw_groups(ranks: List[RankSnapshot], stacks: List[Tuple[Frame, ...]]) -> Dict[RawKey, _Members]:
    """Ranks by raw path: (function, file, line) of every frame. The one pass over every frame of every rank,
    so it stays in C: reading three attributes of 6M frames is most of the analysis time at 100k ranks.
    When identical frames are one shared object (an interning parser), frames are keyed by identity first,
    which skips the attribute reads; the grouping is the same either way."""
    raw: Dict[RawKey, _Members] = {}
    if _shares_frames(stacks):
        by_id: Dict[Tuple[int, ...], _Members] = {}
        prev: Tuple[Frame, ...] = ()
        entry: Optional[_Members] = ([], [])
        for r, frames in zip(ranks, stacks):
            # Neighbouring ranks mostly share a stack: tuple == compares shared frames by identity, 60
            # pointer checks instead of a 60-element key (a frame equal in content but not in identity
            # falls back to Frame.__eq__, which is slow but right).
            if frames != prev:
                k = tuple(map(id, frames))  # valid: the snapshot keeps every frame alive meanwhile
                entry = by_id.get(k)
                if entry is None:
                    entry = by_id[k] = ([], [])
                prev = frames
            assert entry is not None
            entry[0].append(r)
            entry[1].append(frames)
        for members, group_stacks_ in by_id.values():
            key = tuple(map(raw_frame, group_stacks_[0]))
            entry = raw.get(key)
            if entry is None:
                raw[key] = (members, group_stacks_)
            else:
                entry[0].extend(members)
                entry[1].extend(group_stacks_)
        return raw
    for r, frames in zip(ranks, stacks):
        key = tuple(map(raw_frame, frames))
        entry = raw.get(key)
        if entry is None:
            raw[key] = ([r], [frames])
        else:
            entry[0].append(r)
            entry[1].append(frames)
    return raw


def _shares_frames(stacks: List[Tuple[Frame, ...]], sample: int = 64) -> bool:
    """Whether ranks share Frame objects: the outermost frames of a sample of ranks are mostly the same objects."""
    if len(stacks) < 4:
        return False
    step = max(1, len(stacks) // sample)
    outer = [s[-1] for s in stacks[::step]]
    return len(set(map(id, outer))) * 2 <= len(outer)
