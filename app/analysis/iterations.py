"""Loop-iteration diffing: ranks on the same path, told apart by the values of their loop variables.

Frames carry the loops enclosing their line (LoopInfo, from the worker's ast pass) and `iteration`, the
(name, value) of loop variables and counters from `py-spy --locals`. Within one class, ranks are split by
those values, outermost loop first: `step=1203: ranks 0-6; step=1204: rank 7`.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from app.analysis.coordinates import meaningful
from app.analysis.facts import Confidence, Evidence, Fact, Who, ranks_who
from app.analysis.fold import RankKey, label_parts
from app.analysis.frames import clean, is_library
from app.analysis.tree import Grouping, StackClass
from app.model import Frame, LoopInfo, RankSnapshot

Coordinate = Tuple[Tuple[str, str], ...]  # (name, value repr), outermost loop first
MAX_GROUP_FINDINGS = 3

_MAX_VALUE = 60  # characters of a value shown in a finding


@dataclass(frozen=True)
class IterationGroup:
    coordinate: Coordinate  # every known loop variable value of these ranks
    ranks: Tuple[RankKey, ...]
    numbers: Tuple[Optional[int], ...]
    who: str  # `ranks 0-6`
    nodes: str

    @property
    def label(self) -> str:
        return f"{self.who} on {self.nodes}"


@dataclass(frozen=True)
class IterationSplit:
    """One class's ranks by loop iteration; a single group means they all are in the same iteration."""

    class_index: int
    loops: Tuple[Frame, ...]  # the frames on the path that sit in loops, outermost first
    groups: Tuple[IterationGroup, ...]  # largest first
    varying: Tuple[str, ...] = ()  # names whose value differs between groups
    locals_missing: bool = False  # loops on the path, but no loop variable values were collected
    locals_collected: bool = False  # the dump asked for locals (then missing values were not readable)
    # ranks of the class with no value at all where the others have some (a held rank whose module globals were
    # not read, a failed read): their iteration is unknown, which is no evidence of another one
    unknown: Optional[IterationGroup] = None

    @property
    def split(self) -> bool:
        return len(self.groups) > 1

    def text(self, locals_collected: bool = False) -> str:
        """`step=1203: ranks 0-6; step=1204: rank 7`."""
        if self.locals_missing:
            return ("no loop variable had a readable value" if locals_collected or self.locals_collected
                    else "no loop variable values (run with --locals)")
        return "; ".join([f"{_show(g.coordinate, self.varying)}: {g.who}" for g in self.groups]
                         + ([f"no values: {self.unknown.who}"] if self.unknown is not None else []))


def _show(coord: Coordinate, names: Sequence[str]) -> str:
    shown = [(n, v) for n, v in coord if n in names] if names else list(coord)
    return ", ".join(f"{clean(n, 40)}={clean(v, _MAX_VALUE)}" for n, v in shown) or "no values"


def _meaningful(pairs: Tuple[Tuple[str, str], ...]) -> Coordinate:
    # values that identify an object rather than a position in a loop (`<Tensor at 0x7f..>`, a batch dict)
    # would put every rank in a group of its own; a snapshot file may carry any value
    return tuple((n, v) for n, v in pairs if meaningful(v))


def split_iterations(grouping: Grouping) -> Tuple[IterationSplit, ...]:
    """For every class with loops on its path: its ranks grouped by loop iteration."""
    out = []
    for c, groups, at in zip(grouping.classes, grouping.groups, grouping.at):
        lead = groups[0]
        # the job's own loops: a library's loop counts its own attempts (a lock file polled, a connection retried,
        # a queue re-read), which differ between ranks waiting at one place of the job's code
        positions = [j for j, i in enumerate(lead.kept) if (lead.frames[i].loops or lead.frames[i].iteration)
                     and not is_library(lead.frames[i])]
        if not positions:
            continue
        # Iteration values are read from the members' paths (ThreadStack.path), once per distinct path, not
        # from 100k scattered frames; ranks are their places in the class (c.ranks and c.numbers are sorted
        # and parallel), so a group's keys and numbers come from the class, not from the rank objects again.
        place = dict(zip(at, range(len(at))))
        by_raw: Dict[tuple, List[int]] = defaultdict(list)
        for g in groups:
            last = len(g.frames) - 1
            idxs = [last - g.kept[j] for j in positions]  # paths are innermost first, like the stacks
            for path, members in g.parts:
                by_raw[tuple(path[i].iteration for i in idxs)].extend(map(place.__getitem__, members))
        by_coord: Dict[Coordinate, List[int]] = defaultdict(list)
        for raw, places in by_raw.items():
            by_coord[tuple(p for pairs in raw for p in _meaningful(pairs))].extend(places)
        loops = tuple(c.frames[j] for j in positions)
        missing = list(by_coord) == [()]
        unknown = by_coord.pop((), None) if len(by_coord) > 1 else None
        ordered = sorted(by_coord.items(), key=lambda kv: (-len(kv[1]), _numeric_key(kv[0])))
        made = [_group(c, coord, places) for coord, places in ordered]
        out.append(IterationSplit(c.index, loops, tuple(made), _varying([g.coordinate for g in made]), missing,
                                  unknown=_group(c, (), unknown) if unknown else None))
    return tuple(out)


def _group(c: StackClass, coord: Coordinate, places: List[int]) -> IterationGroup:
    # the class's order restricted to these ranks is sort_ranks' order of them (fold.sort_positions)
    places.sort()
    keys = tuple(map(c.ranks.__getitem__, places))
    numbers = tuple(map(c.numbers.__getitem__, places))
    return IterationGroup(coord, keys, numbers, *label_parts(keys, numbers))


def _numeric_key(coord: Coordinate) -> Tuple[Tuple[int, object], ...]:
    return tuple((0, int(v)) if _is_int(v) else (1, v) for _, v in coord)


def _varying(coords: Sequence[Coordinate]) -> Tuple[str, ...]:
    values: Dict[str, set] = defaultdict(set)
    names: List[str] = []
    for coord in coords:
        seen = dict(coord)
        for n in seen:
            if n not in values:
                names.append(n)
        for n in names:
            values[n].add(seen.get(n))
    return tuple(n for n in names if len(values[n]) > 1)


def _is_int(v: str) -> bool:
    return bool(re.fullmatch(r"-?\d+", v.strip()))


@dataclass(frozen=True)
class IterationEvidence(Evidence):
    """A group of ranks on the majority's stack in another loop iteration (or, `many`, a class spread over many)."""

    split: IterationSplit
    group: Optional[IterationGroup]  # None: "many"
    major: IterationGroup
    name: Optional[str] = None  # the outermost loop variable whose value differs
    mine: str = ""
    theirs: str = ""
    frame: Optional[Frame] = None  # the frame of that variable's loop
    order: Optional[Tuple[str, str, str]] = None  # (sequence, its repr here, there): the same elements reordered
    many: bool = False
    collective: Optional[str] = None  # the collective the class waits in (every one of its ranks: one path)

    @property
    def delta(self) -> Optional[int]:
        """How many iterations ahead (positive) or behind, when both values are integers."""
        if self.name is not None and _is_int(self.mine) and _is_int(self.theirs):
            return int(self.mine) - int(self.theirs)
        return None


@dataclass(frozen=True)
class NoLocalsEvidence(Evidence):
    """Loops on the dominant class's path but no loop variable values."""

    split: IterationSplit
    collected: bool  # locals were asked for (then they were not readable)
    label: str  # the class's label, for display


def iteration_facts(split: IterationSplit, ranks: Optional[Dict[RankKey, RankSnapshot]] = None,
                    collective: Optional[str] = None) -> List[Fact]:
    """Which ranks are ahead or behind the majority, and by how much; with `ranks` (by key), whether they
    iterate the same sequence in another order (a set or dict whose order differs between processes)."""
    if not split.split:
        return []
    major = split.groups[0]
    minors = split.groups[1:]
    others = len(major.ranks)
    if len(minors) > MAX_GROUP_FINDINGS:
        keys = tuple(k for g in minors for k in g.ranks)
        numbers = tuple(n for g in minors for n in g.numbers)
        return [Fact("iteration_split", ranks_who(keys, numbers), "low",
                     IterationEvidence(split, None, major, many=True, collective=collective),
                     class_index=split.class_index)]
    out = []
    for g in minors:
        name, mine, theirs, frame = _first_difference(split, g.coordinate, major.coordinate)
        order = _order_differs(frame, name, g, major, ranks) if name is not None and frame is not None else None
        conf: Confidence
        if order is not None:
            conf = "high" if len(g.ranks) * 3 <= others else "medium"
        elif len(g.ranks) == others:
            conf = "low"
        elif name is not None and _is_int(mine) and _is_int(theirs) and len(g.ranks) * 3 <= others:
            conf = "high"
        else:
            conf = "medium"
        out.append(Fact("iteration_split", ranks_who(g.ranks, g.numbers), conf,
                        IterationEvidence(split, g, major, name, mine, theirs, frame, order, collective=collective),
                        class_index=split.class_index))
    return out


_FOR = re.compile(r"^\s*(?:async\s+)?for\s+.+?\s+in\s+(?:enumerate\(\s*)?([A-Za-z_][\w.]*)\s*\)?\s*:\s*$")
_MAX_SEQUENCE = 4096  # characters of a sequence's repr compared element by element


def _order_differs(frame: Frame, name: str, g: IterationGroup, major: IterationGroup,
                   ranks: Optional[Dict[RankKey, RankSnapshot]]) -> Optional[Tuple[str, str, str]]:
    """(the sequence's name, its repr on g's first rank, on the majority's) when the loop that binds `name` runs
    over a local sequence (`for name in names:`) that holds the same elements in another order on g's ranks."""
    loop = _loop_of(frame, name)
    match = _FOR.match(loop.header) if loop is not None else None
    if not match or ranks is None or not g.ranks or not major.ranks:
        return None
    seq = match.group(1)
    values = [_local_at(ranks.get(k), frame, seq) for k in (g.ranks[0], major.ranks[0])]
    mine, theirs = values
    if mine is None or theirs is None or mine == theirs:
        return None
    a, b = _elements(mine), _elements(theirs)
    if a is None or b is None or a == b or sorted(a) != sorted(b):
        return None
    return seq, mine, theirs


def _local_at(r: Optional[RankSnapshot], frame: Frame, name: str) -> Optional[str]:
    """The repr of local `name` in r's frame at the loop's place (same function and file), if collected."""
    if r is None:
        return None
    for t in r.threads:
        for f in t.frames:
            if f.function == frame.function and f.filename == frame.filename and f.locals:
                for local in f.locals:
                    if local.name == name:
                        return local.repr
    return None


def _elements(text: str) -> Optional[List[str]]:
    """A list or tuple literal's elements, as their reprs; None for anything else (never evaluated as code)."""
    if len(text) > _MAX_SEQUENCE:
        return None
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(node, (ast.List, ast.Tuple)):
        return None
    return [ast.dump(e) for e in node.elts]


def _first_difference(split: IterationSplit, mine: Coordinate, theirs: Coordinate
                      ) -> Tuple[Optional[str], str, str, Optional[Frame]]:
    """The outermost loop variable whose value differs, with both values and the frame of its loop."""
    theirs_d = dict(theirs)
    for n, v in mine:
        if n in theirs_d and theirs_d[n] != v:
            frame = next((f for f in split.loops if any(n == m for m, _ in f.iteration) or _loop_of(f, n)), None)
            return n, v, theirs_d[n], frame
    return None, "", "", None


def _loop_of(frame: Frame, name: str) -> Optional[LoopInfo]:
    for loop in reversed(frame.loops):  # innermost loop that binds the name
        if name in loop.variables or name in loop.counters:
            return loop
    return None


def loop_of(frame: Frame, name: str) -> Optional[LoopInfo]:
    return _loop_of(frame, name)


def locals_missing_fact(split: IterationSplit, locals_collected: bool, label: str) -> Fact:
    """Loops on the path but no values: say how to get them, or, with --locals on, why there are none."""
    return Fact("no_locals", Who(), "low" if locals_collected else "high",
                NoLocalsEvidence(split, locals_collected, label), culprit=False, class_index=split.class_index)
