"""Stack diff: one rank against another, or against its class's majority, as rows a TUI or report renders.

Frames are aligned outermost first; the first frame whose identity differs is marked; rows show lines,
loop iteration values and locals that differ, side by side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, Tuple

from app.analysis.fold import RankKey, rank_lookup
from app.analysis.frames import fold_path, frame_id
from app.analysis.options import AnalysisOptions, selector
from app.model import Frame, RankSnapshot, Snapshot

if TYPE_CHECKING:
    from app.analysis import Analysis


@dataclass(frozen=True)
class ValueDiff:
    """A local or loop variable whose value differs (None: absent on that side)."""

    name: str
    left: Optional[str]
    right: Optional[str]


@dataclass(frozen=True)
class DiffRow:
    depth: int  # 0 = outermost
    left: Optional[Frame]
    right: Optional[Frame]
    same: bool  # the same frame by the analysis' identity
    first_divergence: bool = False
    line_differs: bool = False
    iteration: Tuple[ValueDiff, ...] = ()
    locals: Tuple[ValueDiff, ...] = ()


@dataclass(frozen=True)
class StackDiff:
    left: str  # labels: `rank 5 (node02 pid 4242)`
    right: str
    rows: Tuple[DiffRow, ...]
    divergence: Optional[int]  # index of the first divergent row; None when the paths are the same
    iteration_note: str = ""  # `rank 7 is 1 iteration ahead of rank 0 (step=1204 vs 1203)`

    @property
    def identical(self) -> bool:
        return self.divergence is None and not self.iteration_note and not any(r.locals for r in self.rows)


def _path(rank: RankSnapshot, options: AnalysisOptions) -> Tuple[Frame, ...]:
    t = selector(options)(rank)
    outer = tuple(reversed(t.frames)) if t is not None else ()
    return tuple(outer[i] for i in fold_path(outer, native=options.native, fold_machinery=options.fold_machinery))


# An object's address (`<Namespace at 0x7f09...>`, `<Tensor at 0x7fb9...>`) differs in every process: it tells
# nothing about where a rank is, so two values that differ only in addresses are the same value.
_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+")


def without_addresses(value: Optional[str]) -> Optional[str]:
    return None if value is None else _ADDRESS.sub("at 0x…", value)


def _values(a: Sequence[Tuple[str, str]], b: Sequence[Tuple[str, str]]) -> Tuple[ValueDiff, ...]:
    da, db = dict(a), dict(b)
    names = list(da) + [n for n in db if n not in da]
    return tuple(ValueDiff(n, da.get(n), db.get(n)) for n in names
                 if without_addresses(da.get(n)) != without_addresses(db.get(n)))


def label(rank: RankSnapshot) -> str:
    return f"{rank.label} ({rank.node} pid {rank.pid})"


def diff_stacks(left: RankSnapshot, right: RankSnapshot, options: AnalysisOptions = AnalysisOptions()) -> StackDiff:
    """Two ranks' selected threads, frame by frame."""
    a, b = _path(left, options), _path(right, options)
    rows = []
    divergence: Optional[int] = None
    note = ""
    for depth in range(max(len(a), len(b))):
        fa = a[depth] if depth < len(a) else None
        fb = b[depth] if depth < len(b) else None
        same = (fa is not None and fb is not None and divergence is None
                and frame_id(fa, options.identity) == frame_id(fb, options.identity))
        first = not same and divergence is None
        if first:
            divergence = depth
        # Values compare where the frames are the same, and where the paths part inside one function (the
        # loop variables of `train` at line 188 on one side and 202 on the other still tell the iterations).
        comparable = fa is not None and fb is not None and (
            same or (first and (fa.function, fa.filename) == (fb.function, fb.filename)))
        it: Tuple[ValueDiff, ...] = ()
        loc: Tuple[ValueDiff, ...] = ()
        if comparable and fa is not None and fb is not None:
            it = _values(fa.iteration, fb.iteration)
            loc = _values([(x.name, x.repr) for x in fa.locals], [(x.name, x.repr) for x in fb.locals])
        if it and not note:
            note = _iteration_note(left, right, it[0])
        rows.append(DiffRow(depth, fa, fb, same, first,
                            bool(fa is not None and fb is not None and fa.line != fb.line), it, loc))
    return StackDiff(label(left), label(right), tuple(rows), divergence, note)


def _iteration_note(left: RankSnapshot, right: RankSnapshot, d: ValueDiff) -> str:
    if d.left is None or d.right is None:
        return f"{d.name} is known on one side only"
    try:
        delta = int(d.left) - int(d.right)
    except ValueError:
        return f"{left.label} has {d.name}={d.left}, {right.label} has {d.name}={d.right}"
    steps = f"{abs(delta)} iteration{'s' if abs(delta) != 1 else ''}"
    return f"{left.label} is {steps} {'ahead of' if delta > 0 else 'behind'} {right.label} ({d.name}={d.left} vs {d.right})"


def diff_ranks(snapshot: Snapshot, left: RankKey, right: RankKey,
               options: AnalysisOptions = AnalysisOptions()) -> StackDiff:
    """Rank against rank, by (node, pid); KeyError when one is not in the snapshot."""
    ranks = rank_lookup(snapshot.ranks)
    return diff_stacks(ranks[left], ranks[right], options)


def diff_vs_majority(snapshot: Snapshot, analysis: "Analysis", rank: RankKey) -> StackDiff:
    """A rank against the majority: the first rank of the dominant class's largest iteration group (the
    dominant class itself when the rank is in another class)."""
    ranks = rank_lookup(snapshot.ranks)
    if not analysis.classes:
        raise KeyError("no classes to compare with")
    dominant = analysis.classes[0]
    reference = dominant.ranks[0]
    for split in analysis.iteration_splits:
        if split.class_index == dominant.index and split.groups:
            reference = split.groups[0].ranks[0]
    if reference == rank:  # the rank is the reference: compare with the next one of the majority
        pool = [k for k in dominant.ranks if k != rank]
        if pool:
            reference = pool[0]
    return diff_stacks(ranks[rank], ranks[reference], analysis.options)
