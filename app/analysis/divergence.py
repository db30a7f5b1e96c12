"""Where the stacks part: each minority class of ranks against the dominant one, and every rank at one place.

A minority class is a suspect when its path leaves the majority's; how sure depends on the collectives on both
sides (ranks in another collective can never meet the others; ranks elsewhere hold the others in theirs) and on
the sizes (one rank against seven is a suspect, four against four is a tie). A class that has left a loop the
others are still in (uneven inputs) is said as such. Facts only: the sentences are app/analysis/prose's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Literal, Mapping, Optional, Sequence, Tuple

from app.analysis.facts import Confidence, Evidence, Fact, ranks_who
from app.analysis.fold import RankKey
from app.analysis.frames import frame_id, in_backward, is_library
from app.analysis.tree import StackClass
from app.model import Frame, LoopInfo, RankSnapshot

MAX_CLASS_FINDINGS = 8  # minority classes named one by one; the rest are summed up in one fact

# How the two sides' collectives relate, which decides how sure a minority class is a suspect
Case = Literal[
    "left_loop",  # it left a loop the others are still in
    "other_collective",  # both in collectives, different ones: they can never meet
    "same_collective",  # both in the same collective, called from different places
    "same_collective_library",  # ... their paths differ only inside libraries
    "others_in_collective",  # the others wait in a collective for ranks that are elsewhere
    "it_in_collective",  # it waits in a collective for the others, which are elsewhere
    "no_collective",  # no collective recognised on either side
    "backward",  # no collective; the others are in autograd's backward (DDP's all_reduce), it is not
    "many",  # several more small classes, summed up
]
SizeCase = Literal["tie", "small", "similar"]


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
    rest: Tuple[StackClass, ...] = ()  # "many": the classes summed up


@dataclass(frozen=True)
class IdenticalEvidence(Evidence):
    """Every rank with a stack at one place: stacks cannot tell; where the answer can come from instead."""

    cls: StackClass
    ddp: bool  # they wait in DDP's gradient all_reduce inside backward
    network: bool  # a network fact names a stall
    moving: bool  # their sockets moved bytes between samples: the links work
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
    out = [_versus(c, dominant, ranks) for c in classes[1:MAX_CLASS_FINDINGS + 1]]
    rest = tuple(classes[MAX_CLASS_FINDINGS + 1:])
    if rest:
        keys = tuple(k for c in rest for k in c.ranks)
        numbers = tuple(n for c in rest for n in c.numbers)
        out.append(Fact("minority_stack", ranks_who(keys, numbers), "low",
                        StackEvidence(rest[0], dominant, 0, "many", "similar", rest=rest)))
    return out


def left_loop(c: StackClass, d: StackClass, k: int, ranks: Optional[Mapping[RankKey, RankSnapshot]]
              ) -> Optional[Tuple[LoopInfo, Frame]]:
    """The loop the others are still in and c has left: where the paths part, both are in one function, c at a
    later line, and the others' path from there on runs inside a loop (read from one of their ranks' frames,
    whose loops the worker found in the source). (loop, the frame whose loop it is), or None."""
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


def _versus(c: StackClass, d: StackClass, ranks: Optional[Mapping[RankKey, RankSnapshot]] = None) -> Fact:
    k = common_prefix(c, d)
    size, conf = _size(c, d)
    who = ranks_who(c.ranks, c.numbers)
    backward = d.collective is None and in_backward(d.frames)
    left = left_loop(c, d, k, ranks)
    if left is not None and size != "tie":
        kind = "different_collective" if c.collective and d.collective and c.collective != d.collective \
            else "minority_stack"
        return Fact(kind, who, conf, StackEvidence(c, d, k, "left_loop", size, left[0], left[1], backward),  # type: ignore[arg-type]
                    class_index=c.index)
    if c.collective and d.collective and c.collective != d.collective:
        return Fact("different_collective", who, conf, StackEvidence(c, d, k, "other_collective", size),
                    class_index=c.index)
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


def identical_fact(c: StackClass, *, locals_missing: bool, network: bool, history: bool, incomplete: bool = False,
                   sockets: bool = True, locals_collected: bool = False, moving: bool = False,
                   explained: bool = False, ddp: bool = False) -> Fact:
    """Every rank at the same place: say so, and where the answer can come from instead. "Check the links" is
    advice for when nothing else explains it (`explained`: a [high] culprit fact does), never [high]: sockets
    that move bytes between samples (`moving`) say the links work."""
    sure = network or moving or explained
    return Fact("all_identical", ranks_who(c.ranks, c.numbers), "high" if sure else "medium",
                IdenticalEvidence(c, ddp, network, moving, explained, sockets, locals_missing, locals_collected,
                                  history, incomplete), culprit=False, class_index=c.index)
