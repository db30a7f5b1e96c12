"""Where the stacks part: each minority class of ranks against the dominant one, and every rank at one place.

A minority class is a suspect when its path leaves the majority's; how sure depends on the collectives on both
sides (ranks in another collective can never meet the others; ranks elsewhere hold the others in theirs) and on
the sizes (one rank against seven is a suspect, four against four is a tie). A class that has left a loop the
others are still in is said as such, when it can be known. Facts only: the sentences are app/analysis/prose's.

A class at a later line of a function than the others, whose path from there runs inside a loop, is past the end
of that loop: it left the loop, or, when a loop holds both lines (in that function or a caller), it is in another
iteration of that loop. Stacks alone cannot tell those apart (epoch N's validation after the batch loop and epoch
N+1's batches look the same); the loop variables' values the worker read can (`loop_parting`):

| what is known of the loop around both sides | what is said | confidence | why |
|---|---|---|---|
| no loop holds both lines | it left the loop (`left_loop`) | by sizes | it can only get back by returning and being called again |
| the values are the same on both sides | it left the loop in the same iteration (`left_loop`) | by sizes | same iteration, past the inner loop's end: its data ran out first (uneven inputs) |
| the values differ | it is N iterations behind (or ahead), not out of the loop (`other_iteration`) | by sizes | the others went on into the next iteration and wait there for it: a straggler, or held there |
| not read (no locals, unreadable) | either reading, and what tells them apart (`left_or_behind`) | at most [medium] | stacks cannot tell a rank that left the loop from one an iteration behind |

A class waiting in a collective at another line of a loop both sides are in (not past its end) is read the same
way (`_within`): where the loop's values differ, it is N iterations behind or ahead (`other_iteration`); where they
are the same or unknown, the collectives on both sides speak. A class behind holds every class at the others'
iteration (whatever they wait in cannot finish without it): those are then no [high] culprit of their own.

A class asleep in autograd's backward with no collective frame below waits in DDP's gradient all_reduce (its Reducer
runs it from the C++ engine); against a class in another collective, the two never match (`other_collective`).

A class in a collective at an earlier line of one function than the others, in the same iteration of a loop around
both (every value the same), is in a call the others ran and left: the collective completed for them (a broadcast's
tree, a ring), so it waits there for a member that never joined (`passed`). With another minority class to be that
member it is held, no culprit of its own; alone, the collectives speak. Not for a send or recv (its one peer need
not run that line). Where one of a loop's values is the same on both sides and another differs, the one that
differs counts something else than iterations (samples, tokens): the same iteration of that loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Literal, Mapping, Optional, Sequence, Tuple

from app.analysis.coordinates import meaningful
from app.analysis.facts import Confidence, Evidence, Fact, FactKind, ranks_who
from app.analysis.fold import RankKey
from app.analysis.frames import frame_id, in_backward, is_library
from app.analysis.p2p import P2P, class_call
from app.analysis.tree import StackClass
from app.model import Frame, LoopInfo, RankSnapshot

MAX_CLASS_FINDINGS = 8  # minority classes named one by one; the rest are summed up in one fact

# How the two sides' collectives relate, which decides how sure a minority class is a suspect
Case = Literal[
    "left_loop",  # it left a loop the others are still in (no loop holds both, or the same iteration of the one that does)
    "other_iteration",  # past the end of the loop the others are in, but in another iteration of a loop around both
    "left_or_behind",  # past the end of that loop, inside a loop around both whose iteration is not known
    "other_collective",  # both in collectives, different ones: they can never meet
    "same_collective",  # both in the same collective, called from different places
    "same_collective_library",  # ... their paths differ only inside libraries
    "others_in_collective",  # the others wait in a collective for ranks that are elsewhere
    "it_in_collective",  # it waits in a collective for the others, which are elsewhere
    "no_collective",  # no collective recognised on either side
    "backward",  # no collective; the others are in autograd's backward (DDP's all_reduce), it is not
    # in a collective at an earlier line of the iteration the others are in (the same values): they passed it, so it
    # waits for a rank that has not joined it (a tree or ring lets the other members finish): another class's
    "passed",
    "many",  # several more small classes, summed up
]
SizeCase = Literal["tie", "small", "similar"]
Reading = Literal["left", "behind", "ahead", "other", "unknown"]
MEMBERS_READ = 16  # ranks of each side whose loop values are read (the most common values speak for the side)


@dataclass(frozen=True)
class LoopParting:
    """A class at a later line than the others, past the end of the loop they are still in: how it stands to that
    loop, by the loop around both sides (`around`: the innermost loop that holds both lines, in the function where
    the paths part or a caller) and its variables' values on each side."""

    loop: LoopInfo  # the loop the others are still in
    frame: Frame  # ... and the frame it belongs to
    reading: Reading  # left: no loop around both, or the same iteration of it; behind/ahead/other: another iteration
    around: Optional[LoopInfo] = None
    around_frame: Optional[Frame] = None
    name: str = ""  # the loop variable compared (the outermost whose value differs, or the innermost known)
    mine: str = ""  # its value on this class's ranks
    theirs: str = ""  # ... on the others'
    delta: Optional[int] = None  # iterations ahead (positive) or behind (negative), when both values are integers
    within: bool = False  # both sides inside `loop`, at different lines of one function (not past its end)


@dataclass(frozen=True)
class StackEvidence(Evidence):
    """A minority class against the dominant one: where its path parts from theirs and what each waits in."""

    mine: StackClass
    theirs: StackClass
    parting: int  # index of the first frame that differs (frames outermost first)
    case: Case
    size: SizeCase
    loop: Optional[LoopInfo] = None  # left_loop: the loop the others are still in
    loop_frame: Optional[Frame] = None  # ... and the frame it belongs to
    theirs_backward: bool = False  # the others are in autograd's backward (DDP)
    mine_backward: bool = False  # this class waits in autograd's backward (DDP's gradient all_reduce)
    rest: Tuple[StackClass, ...] = ()  # "many": the classes summed up
    past: Optional[LoopParting] = None  # left_loop, other_iteration, left_or_behind: how it stands to that loop


@dataclass(frozen=True)
class IdenticalEvidence(Evidence):
    """Every rank with a stack at one place: stacks cannot tell; where the answer can come from instead."""

    cls: StackClass
    ddp: bool  # they wait in DDP's gradient all_reduce inside backward
    network: bool  # a network fact names a stall
    moving: bool  # their sockets moved bytes between samples: the links work
    progressing: bool  # ranks on more than one node progress between samples: collectives across nodes complete
    explained: bool  # a [high] culprit fact explains the wait
    sockets: bool  # socket data was collected
    locals_missing: bool
    locals_collected: bool
    history: bool
    incomplete: bool  # some ranks have no stack


def stack_facts(classes: Sequence[StackClass],
                ranks: Optional[Mapping[RankKey, RankSnapshot]] = None) -> List[Fact]:
    """One fact per minority class, against the dominant (largest) class. `ranks` (by key): the ranks, whose own
    frames carry the loops around each line (a class's path does not)."""
    if len(classes) < 2:
        return []
    dominant = classes[0]
    # with another minority class to be the member a collective waits for, a class in one the others passed is held
    out = [_versus(c, dominant, ranks, others=len(classes) > 2) for c in classes[1:MAX_CLASS_FINDINGS + 1]]
    # Two minority classes that part only at a line of the same function of the job's code (ranks 4-5 at
    # `send.wait()`, rank 6 at `recv.wait()` of one exchange) are one minority at one place of the program: the
    # line does not single either out against the other, so neither is [high] on its stacks alone
    out = [dataclasses.replace(f, strength="medium") if f.strength == "high" and isinstance(f.data, StackEvidence)
           and _sibling(f.data.mine, classes[1:]) else f for f in out]
    # A class iterations behind the others holds them: whatever the ranks at the others' iteration wait in (the
    # next step's first collective, which it has not reached) cannot finish without it; such a class is no
    # culprit of its own
    if any(f.strength == "high" and _behind(f) for f in out):
        out = [dataclasses.replace(f, strength="medium") if f.strength == "high" and not _behind(f) else f
               for f in out]
    rest = tuple(classes[MAX_CLASS_FINDINGS + 1:])
    if rest:
        keys = tuple(k for c in rest for k in c.ranks)
        numbers = tuple(n for c in rest for n in c.numbers)
        out.append(Fact("minority_stack", ranks_who(keys, numbers), "low",
                        StackEvidence(rest[0], dominant, 0, "many", "similar", rest=rest)))
    return out


def _behind(f: Fact) -> bool:
    e = f.data
    return isinstance(e, StackEvidence) and e.case == "other_iteration" and e.past is not None \
        and e.past.delta is not None and e.past.delta < 0


def _sibling(c: StackClass, minority: Sequence[StackClass]) -> bool:
    """Whether another minority class stands in the same function of the job's code as c, at another line (the
    first frame where their paths part: same function and file), neither in a collective (but a send or recv)."""
    for o in minority:
        # a send and a receive of one exchange are at one place too (`send.wait()`, `recv.wait()`); two collectives
        # at two lines are two calls
        if o is c or (o.collective is not None and o.collective not in P2P) \
                or (c.collective is not None and c.collective not in P2P):
            continue
        k = common_prefix(c, o)
        if k < len(c.frames) and k < len(o.frames):
            a, b = c.frames[k], o.frames[k]
            if (a.function, a.filename) == (b.function, b.filename) and not is_library(a):
                return True
    return False


def left_loop(c: StackClass, d: StackClass, k: int, ranks: Optional[Mapping[RankKey, RankSnapshot]]
              ) -> Optional[Tuple[LoopInfo, Frame]]:
    """The loop the others are still in and c is past the end of: where the paths part, both are in one function,
    c at a later line, and the others' path from there on runs inside a loop (read from one of their ranks' frames,
    whose loops the worker found in the source). (loop, the frame whose loop it is), or None. Whether c left it or
    is in another iteration of a loop around both is `loop_parting`'s question."""
    if ranks is None or k == 0 or k >= len(c.frames) or k >= len(d.frames) or not d.ranks:
        return None
    mine, theirs = c.frames[k], d.frames[k]
    if (mine.function, mine.filename) != (theirs.function, theirs.filename) or mine.line <= theirs.line:
        return None
    rep = ranks.get(d.ranks[0])
    if rep is None:
        return None
    below = {(f.function, f.filename, f.line) for f in d.frames[k:]}
    thread = rep.main_thread
    for f in reversed(thread.frames if thread is not None else ()):  # outermost first, as the path
        if (f.function, f.filename, f.line) not in below or not f.loops or is_library(f):
            continue
        same_function = (f.function, f.filename) == (mine.function, mine.filename)
        for loop in f.loops:  # outermost first: the loop that holds the work the others still do
            # deeper than where the paths part, c is not in that function at all; in the same function, c's
            # line is past the loop's end
            if not same_function or not loop.line <= mine.line <= loop.end_line:
                return loop, f
    return None


def _aligned(r: Optional[RankSnapshot], path: Sequence[Frame], upto: int) -> List[Optional[Frame]]:
    """The rank's own frames (which carry loops and loop values) at the class path's positions 0..upto, matched in
    order by function, file and line (the path may leave frames out)."""
    thread = r.main_thread if r is not None else None
    own = tuple(reversed(thread.frames)) if thread is not None else ()
    out: List[Optional[Frame]] = []
    i = 0
    for p in path[:upto + 1]:
        while i < len(own) and (own[i].function, own[i].filename, own[i].line) != (p.function, p.filename, p.line):
            i += 1
        out.append(own[i] if i < len(own) else None)
        i += 1
    return out


Around = List[Tuple[int, LoopInfo]]  # (position on the path, loop), outermost first


def _around(d: StackClass, k: int, line: int, rep: Optional[RankSnapshot]) -> Tuple[Around, List[Optional[Frame]]]:
    """The loops that hold both sides: every loop of the frames above where the paths part (both stand at the same
    line there), and the loops of the parting frame that hold both lines."""
    own = _aligned(rep, d.frames, k)
    out: Around = []
    for j, f in enumerate(own):
        if f is None:
            continue
        out += [(j, loop) for loop in f.loops if j < k or loop.line <= line <= loop.end_line]
    return out, own


def _values(members: Sequence[RankKey], path: Sequence[Frame], k: int, around: Around,
            ranks: Mapping[RankKey, RankSnapshot]) -> Tuple[Tuple[Tuple[str, str], ...], ...]:
    """One side's values of each loop's variables (loop by loop), the most common among a few of its ranks."""
    seen: Dict[tuple, int] = {}
    for key in members[:MEMBERS_READ]:
        own = _aligned(ranks.get(key), path, k)
        coord = []
        for j, loop in around:
            f = own[j]
            names = loop.variables + loop.counters
            coord.append(tuple((n, v) for n, v in (f.iteration if f is not None else ())
                               if n in names and meaningful(v)))
        seen[tuple(coord)] = seen.get(tuple(coord), 0) + 1
    return max(seen, key=seen.__getitem__) if seen else tuple(() for _ in around)


def _integer(v: str) -> Optional[int]:
    try:
        return int(v)
    except ValueError:
        return None


def loop_parting(c: StackClass, d: StackClass, k: int, ranks: Optional[Mapping[RankKey, RankSnapshot]]
                 ) -> Optional[LoopParting]:
    """How c, at a later line than the others where the paths part, stands to the loop they are still in (the
    table in the module doc): left it, another iteration of a loop around both (the first loop, outermost first,
    whose values differ), or not known."""
    found = left_loop(c, d, k, ranks)
    if found is None:
        return _within(c, d, k, ranks)
    if ranks is None:
        return None
    loop, frame = found
    around, own = _around(d, k, c.frames[k].line, ranks.get(d.ranks[0]))
    if not around:
        return LoopParting(loop, frame, "left")
    mine = _values(c.ranks, c.frames, k, around, ranks)
    theirs = _values(d.ranks, d.frames, k, around, ranks)
    unknown: Optional[Tuple[int, LoopInfo]] = None
    same: Optional[Tuple[int, LoopInfo, str, str]] = None
    for (j, held), a, b in zip(around, mine, theirs):
        values = dict(b)
        common = [(n, v, values[n]) for n, v in a if n in values]
        if not common:
            unknown = (j, held)  # the innermost loop whose iteration is not known
            continue
        for n, v, w in common:
            if v != w:
                x, y = _integer(v), _integer(w)
                delta = x - y if x is not None and y is not None else None
                reading: Reading = "other" if delta is None else "behind" if delta < 0 else "ahead"
                return LoopParting(loop, frame, reading, held, own[j], n, v, w, delta)
        same = (j, held, common[0][0], common[0][1])
    if unknown is not None:  # equal where known, but a loop around both whose iteration is not known
        j, held = unknown
        return LoopParting(loop, frame, "unknown", held, own[j])
    assert same is not None
    j, held, n, v = same
    return LoopParting(loop, frame, "left", held, own[j], n, v, v, 0)


def _within(c: StackClass, d: StackClass, k: int, ranks: Optional[Mapping[RankKey, RankSnapshot]]
            ) -> Optional[LoopParting]:
    """Both sides in a loop around both lines of one function of the job's (where the paths part), at different
    lines, this class waiting in a collective: another iteration of it when its variables' values differ between
    the sides (the outermost loop whose values differ), else None (the same iteration, or not known: the
    collectives speak). A class held elsewhere than in a collective is said by what holds it, not by this."""
    if ranks is None or c.collective is None or k == 0 or k >= len(c.frames) or k >= len(d.frames) or not d.ranks:
        return None
    mine, theirs = c.frames[k], d.frames[k]
    if (mine.function, mine.filename) != (theirs.function, theirs.filename) or mine.line == theirs.line \
            or is_library(mine):
        return None
    around, own = _around(d, k, mine.line, ranks.get(d.ranks[0]))
    if not around:
        return None
    for (j, held), a, b in zip(around, _values(c.ranks, c.frames, k, around, ranks),
                               _values(d.ranks, d.frames, k, around, ranks)):
        values = dict(b)
        if any(values.get(n) == v for n, v in a):
            # one of the loop's values is the same on both sides, another differs: the one that differs counts
            # something else than iterations (samples, tokens: `seen += len(batch)`), so this loop's iteration is
            # the same; an outer loop's may still differ
            continue
        for n, v in a:
            w = values.get(n)
            if w is not None and w != v:
                x, y = _integer(v), _integer(w)
                delta = x - y if x is not None and y is not None else None
                reading: Reading = "other" if delta is None else "behind" if delta < 0 else "ahead"
                frame = own[j]
                if frame is None:
                    return None
                return LoopParting(held, frame, reading, held, frame, n, v, w, delta, within=True)
    return None


def _passed(c: StackClass, d: StackClass, k: int, ranks: Optional[Mapping[RankKey, RankSnapshot]]
            ) -> Optional[LoopParting]:
    """This class in a collective at an earlier line of one function of the job's than the others, inside a loop
    around both whose values are the same on both sides: the others ran that line in this very iteration and went
    on, so the collective completed for them; this class waits in it for a member that never joined (a broadcast's
    or a ring's missing link). None when that is not so, or not known (no loop values read)."""
    if ranks is None or c.collective is None or c.collective in ("send", "recv", "send/recv") or k == 0 \
            or k >= len(c.frames) or k >= len(d.frames) or not d.ranks:
        return None  # a send or recv waits for its one peer, which need not run the same line
    mine, theirs = c.frames[k], d.frames[k]
    if (mine.function, mine.filename) != (theirs.function, theirs.filename) or mine.line >= theirs.line \
            or is_library(mine):
        return None
    around, own = _around(d, k, mine.line, ranks.get(d.ranks[0]))
    if not around:
        return None
    compared: Optional[Tuple[LoopInfo, Frame, Tuple[str, str]]] = None
    for (j, held), a, b in zip(around, _values(c.ranks, c.frames, k, around, ranks),
                               _values(d.ranks, d.frames, k, around, ranks)):
        values = dict(b)
        same = [(n, v) for n, v in a if values.get(n) == v]
        if not a or len(same) != len(a) or len(a) != len(values):
            return None  # a value differs, or is not known on one side: not this reading
        frame = own[j]
        if frame is not None:
            compared = (held, frame, same[-1])
    if compared is None:
        return None
    held, at, (name, value) = compared
    return LoopParting(held, at, "left", held, at, name, value, value, 0, within=True)


def common_prefix(a: StackClass, b: StackClass) -> int:
    k = 0
    for fa, fb in zip(a.frames, b.frames):
        if frame_id(fa, "function+line") != frame_id(fb, "function+line"):
            break
        k += 1
    return k


def _size(c: StackClass, d: StackClass) -> Tuple[SizeCase, Confidence]:
    if c.size == d.size:
        return "tie", "low"
    if c.size * 3 <= d.size:
        return "small", "high"
    return "similar", "medium"


def _versus(c: StackClass, d: StackClass, ranks: Optional[Mapping[RankKey, RankSnapshot]] = None,
            others: bool = False) -> Fact:
    f = _versus_read(c, d, ranks, others)
    if f.strength == "high" and c.collective in P2P and _peer_unknown(c, ranks):
        # a send or receive waits for its one peer, not for the others: whether it is the call too many or its
        # peer skipped the matching one is for the peer's place to say (p2p.py's edges, where its arguments name
        # it), never for its stacks alone
        return dataclasses.replace(f, strength="medium")
    return f


def _versus_read(c: StackClass, d: StackClass, ranks: Optional[Mapping[RankKey, RankSnapshot]],
                 others: bool) -> Fact:
    k = common_prefix(c, d)
    size, conf = _size(c, d)
    who = ranks_who(c.ranks, c.numbers)
    backward = d.collective is None and in_backward(d.frames)
    passed = _passed(c, d, k, ranks) if others else None
    if passed is not None:
        # the others passed its collective in this iteration: it waits there for a member that never joined, which
        # another minority class is the lead for; not a culprit of its own
        return Fact("minority_stack", who, "low",
                    StackEvidence(c, d, k, "passed", size, passed.loop, passed.frame, backward,
                                  mine_backward=_ddp_gradients(c, ranks), past=passed),
                    culprit=False, class_index=c.index)
    past = loop_parting(c, d, k, ranks)
    if past is not None and size != "tie":
        kind: FactKind = "different_collective" if c.collective and d.collective and c.collective != d.collective \
            else "minority_stack"
        parted: Case = "left_loop" if past.reading == "left" else "left_or_behind" if past.reading == "unknown" \
            else "other_iteration"
        if parted == "left_or_behind" and conf == "high":
            conf = "medium"  # which of two readings is not known: never [high]
        return Fact(kind, who, conf, StackEvidence(c, d, k, parted, size, past.loop, past.frame, backward,
                                                   mine_backward=_ddp_gradients(c, ranks), past=past),
                    class_index=c.index)
    if c.collective and d.collective and c.collective != d.collective:
        return Fact("different_collective", who, conf, StackEvidence(c, d, k, "other_collective", size),
                    class_index=c.index)
    # A side asleep in autograd's backward with no collective of torch.distributed's showing waits in DDP's gradient
    # all_reduce (the Reducer runs it from the C++ engine): against a side in a collective of its own, two calls
    # that never match (in the same backward too: one in a collective of a hook or an autograd Function of its own)
    mine_ddp, theirs_ddp = _ddp_gradients(c, ranks), _ddp_gradients(d, ranks)
    if (mine_ddp and d.collective) or (theirs_ddp and c.collective):
        return Fact("different_collective", who, conf,
                    StackEvidence(c, d, k, "other_collective", size, theirs_backward=theirs_ddp,
                                  mine_backward=mine_ddp), class_index=c.index)
    if c.collective and c.collective == d.collective:
        diverge = c.frames[k] if k < len(c.frames) else None
        if diverge is None or is_library(diverge):
            return Fact("minority_stack", who, "low", StackEvidence(c, d, k, "same_collective_library", size),
                        class_index=c.index)
        return Fact("minority_stack", who, "medium" if conf == "high" else conf,
                    StackEvidence(c, d, k, "same_collective", size), class_index=c.index)
    if d.collective and not c.collective:
        return Fact("minority_stack", who, conf, StackEvidence(c, d, k, "others_in_collective", size),
                    class_index=c.index)
    if c.collective and not d.collective:
        return Fact("minority_stack", who, "medium" if conf == "high" else conf,
                    StackEvidence(c, d, k, "it_in_collective", size), class_index=c.index)
    case: Case = "backward" if backward and not in_backward(c.frames) else "no_collective"
    return Fact("minority_stack", who, "medium" if conf == "high" else conf,
                StackEvidence(c, d, k, case, size, theirs_backward=backward), class_index=c.index)


def _peer_unknown(c: StackClass, ranks: Optional[Mapping[RankKey, RankSnapshot]]) -> bool:
    call = class_call(c, ranks)
    return call is None or call.peer is None


def _ddp_gradients(c: StackClass, ranks: Optional[Mapping[RankKey, RankSnapshot]]) -> bool:
    """Whether a class waits in DDP's gradient all_reduce: its path runs autograd's backward with no collective of
    its own showing, and its ranks' main threads sleep (a backward that computes is on a CPU; one that waits in the
    Reducer's all_reduce sleeps in the engine's C++). Only with the ranks to read (the first MEMBERS_READ)."""
    if c.collective is not None or not in_backward(c.frames) or ranks is None:
        return False
    states = [t.state for t in (getattr(ranks.get(k), "main_thread", None) for k in c.ranks[:MEMBERS_READ])
              if t is not None]
    return bool(states) and all(state in ("S", "D") for state in states)


def identical_fact(c: StackClass, *, locals_missing: bool, network: bool, history: bool, incomplete: bool = False,
                   sockets: bool = True, locals_collected: bool = False, moving: bool = False,
                   explained: bool = False, ddp: bool = False, progressing: bool = False) -> Fact:
    """Every rank at the same place: say so, and where the answer can come from instead. "Check the links" is
    advice for when nothing else explains it (`explained`: a [high] culprit fact does), never [high]: sockets
    that move bytes between samples (`moving`) say the links work, and so do ranks on several nodes that progress
    between samples (`progressing`): their collectives across nodes complete."""
    sure = network or moving or explained or progressing
    return Fact("all_identical", ranks_who(c.ranks, c.numbers), "high" if sure else "medium",
                IdenticalEvidence(c, ddp, network, moving, progressing, explained, sockets, locals_missing,
                                  locals_collected, history, incomplete), culprit=False, class_index=c.index)
