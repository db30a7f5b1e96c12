"""Findings: what differs between ranks, in plain words, most likely culprit first; and the stack findings.

A finding names ranks and nodes (folded), says what is different and where their path leaves the majority's,
and how sure it is and why. The kinds are a closed set; `order` puts suspects before notes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Literal, Mapping, Optional, Sequence, Tuple, get_args

from app.analysis.fold import RankKey, brief, fold_nodes, short_keys
from app.analysis.frames import clean, focus_frame, frame_id, in_backward, is_library, named, path_collective
from app.analysis.tree import StackClass
from app.model import Frame, LoopInfo, RankSnapshot

FindingKind = Literal[
    "progressing",  # samples over time show ranks moving: not hung
    # process state outranks stack position: a stopped or frozen rank explains the others' wait by itself
    "stopped",  # SIGSTOP / job control / tracing stop
    "frozen",  # the cgroup freezer holds the rank (v1 freezer.state, v2 cgroup.freeze)
    "exited",  # a rank is a zombie, or vanished between samples
    "uninterruptible",  # D state: I/O or a driver
    "gpu_fault",  # GPU evidence (app/analysis/gpu_evidence.py): a fresh Xid, ECC errors, nvidia-smi hung
    "nccl_ras",  # NCCL's RAS: ranks missing from a communicator, collective counts that differ
    "lock_wait",  # a thread blocked on a lock another thread of its rank holds (or a deadlock of threads)
    "p2p_wait",  # a rank blocked in send/recv for a peer that is elsewhere, or ranks whose p2p calls form a cycle
    "gil_held",  # a thread holds the GIL while asleep in native code: no other thread of the rank runs Python
    "pipe_write",  # a thread blocked writing to a full pipe nobody drains
    "native_call",  # the main thread inside a native call (ctypes, a C extension) that does not return
    "slow_node",  # a node's ranks are held back (CPU throttling, run-queue wait, caught outside the collective)
    "different_collective",  # some ranks wait in another collective than the rest
    "minority_stack",  # a small class of ranks is somewhere else than a dominant one
    "iteration_split",  # same place, different loop iteration
    "launch_differs",  # a few ranks run with other command-line flags than the rest
    "collective_lag",  # the Flight Recorder shows ranks that issued fewer collectives in a group than the rest
    "still_running",  # a few ranks change between samples while the rest are stuck
    "missing_ranks",  # rank numbers expected from WORLD_SIZE / slots not found
    "node_failed",  # a node could not be inspected: its ranks are unknown
    "outside_peer",  # the ranks talk to addresses no inspected node has: the job runs there too
    "network_stall",  # sockets retransmitting or peers silent
    "thread_count",  # ranks with another number of threads than the rest
    "dump_failed",  # stacks missing for some ranks: the picture is incomplete
    "all_identical",  # every rank at the same place: stacks cannot tell the culprit
    "several_jobs",  # the snapshot holds ranks of more than one job
    "no_locals",  # loops on the path but no loop variables: run with --locals
    "launchers_only",  # a job's launchers run but no rank of it exists yet (issue 16.3)
    "no_data",  # nothing to analyse
]
Confidence = Literal["high", "medium", "low"]

KINDS: Tuple[str, ...] = get_args(FindingKind)
_CONFIDENCE = {"high": 0, "medium": 1, "low": 2}
MAX_CLASS_FINDINGS = 8  # minority classes named one by one; the rest are summed up in one finding


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    title: str  # one sentence: "rank 5 is in `next_batch` (loader.py:31) while 7 others wait in `all_reduce`"
    detail: str  # what is different, in plain words, with the frames on both sides
    confidence: Confidence
    reason: str  # why that confidence
    ranks: Tuple[RankKey, ...] = ()
    ranks_label: str = ""  # `ranks 0-6,8-15 on node[01-04]`
    nodes: str = ""  # `node[01-04]`
    culprit: bool = True  # False for notes about the data (incomplete, cannot tell)
    class_index: Optional[int] = None


def order(findings: Sequence[Finding], first: Sequence[Finding] = ()) -> Tuple[Finding, ...]:
    """Most likely culprit first, and never a less sure finding before a surer one: by confidence, and within one
    confidence `first` (the finding at the wait graph's root, app/analysis/waits.py), "progressing" (the job is
    not hung), then suspects, then notes about the data."""
    lead_ids = {id(f) for f in first}
    return tuple(sorted(findings, key=lambda f: (_CONFIDENCE[f.confidence], id(f) not in lead_ids, _head(f),
                                                 KINDS.index(f.kind))))


def lead(findings: Sequence[Finding]) -> Optional[Finding]:
    """The finding the verdict speaks of: "progressing" when the job moves, else the surest suspect, else the
    surest note. A note can be surer than every suspect ("loop iterations unknown"), yet it names no culprit."""
    return min(findings, key=lambda f: (_head(f), _CONFIDENCE[f.confidence] if f.culprit else 0,
                                        KINDS.index(f.kind)), default=None)


def _head(f: Finding) -> int:
    return 0 if f.kind == "progressing" else (1 if f.culprit else 2)


def where(c: StackClass) -> str:
    """`in `all_reduce` (distributed_c10d.py:2950)` or `in `next_batch` (loader.py:31)`."""
    collective, frame = path_collective(c.frames)
    if frame is None:
        frame = focus_frame(c.frames)
    return f"in {named(frame)}" if frame is not None else "in no frame"


def stack_findings(classes: Sequence[StackClass],
                   ranks: Optional[Mapping[RankKey, RankSnapshot]] = None) -> List[Finding]:
    """One finding per minority class, compared with the dominant (largest) class. `ranks` (by key): the ranks,
    whose own frames carry the loops around each line (a class's path does not)."""
    if len(classes) < 2:
        return []
    dominant = classes[0]
    out = [_versus(c, dominant, ranks) for c in classes[1:MAX_CLASS_FINDINGS + 1]]
    rest = classes[MAX_CLASS_FINDINGS + 1:]
    if rest:
        keys = tuple(k for c in rest for k in c.ranks)
        numbers = tuple(n for c in rest for n in c.numbers)
        out.append(Finding(
            "minority_stack", f"{len(rest)} more small groups of ranks are elsewhere",
            "; ".join(f"{c.label} {where(c)}" for c in rest[:20]) + ("; ..." if len(rest) > 20 else ""),
            "low", "many different stacks: the ranks may still be running, not hung",
            keys, short_keys(keys, numbers), fold_nodes(k[0] for k in keys)))
    return out


def _left_loop(c: StackClass, d: StackClass, k: int, ranks: Optional[Mapping[RankKey, RankSnapshot]]
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


def _versus(c: StackClass, d: StackClass, ranks: Optional[Mapping[RankKey, RankSnapshot]] = None) -> Finding:
    who = brief(c.who, c.size)
    verb = "is" if c.size == 1 else "are"
    others = f"{d.size} other{'s' if d.size != 1 else ''}"
    if d.collective is not None:
        theirs = f"{'waits' if d.size == 1 else 'wait'} in `{d.collective}`"
    else:
        theirs = f"{'is' if d.size == 1 else 'are'} {where(d)}"
    title = f"{who} {verb} {where(c)} while {others} {theirs}"
    k = _common_prefix(c, d)
    detail = f"{c.label}: {_parting(c, d, k)}"
    inner = c.frames[-1] if c.frames else None
    if inner is not None and inner is not focus_frame(c.frames) and c.collective is None:
        detail += f"; innermost frame {named(inner)}"
    tie = c.size == d.size
    small = c.size * 3 <= d.size
    kind: FindingKind
    conf: Confidence
    left = _left_loop(c, d, k, ranks)
    if left is not None and not tie:
        loop, in_frame = left
        short = clean(in_frame.filename.rsplit("/", 1)[-1] or "?", 80)
        header = clean(loop.header.strip().rstrip(":"), 100)
        if d.collective is not None:
            they = f"wait in `{d.collective}`"
        elif in_backward(d.frames):  # DDP's gradient all_reduce runs inside autograd's engine: no c10d frame
            they = f"are in autograd's backward, {where(d)}, where DDP all_reduces the gradients"
        else:
            they = f"are {where(d)}"
        title = (f"{who} {'has' if c.size == 1 else 'have'} left the loop `{header}` ({short}:{loop.line}) that "
                 f"{others} are still in: {who} {verb} {where(c)}, they {they}")
        detail += (f". The others still run `{header}` and wait there for collectives that {who} will not issue "
                   f"any more. Usually the ranks' inputs are uneven: a rank whose data ran out leaves the loop "
                   f"first. Give every rank the same number of batches (a DistributedSampler with drop_last=True), "
                   f"or let DDP's join() shadow the ranks that finished")
        conf, reason = _by_size(tie, small, f"{who} {verb} past the end of a loop the others are still inside", c, d)
        kind = "different_collective" if c.collective and d.collective and c.collective != d.collective \
            else "minority_stack"
        return Finding(kind, title, detail, conf, reason, c.ranks, c.label, c.nodes, class_index=c.index)
    if c.collective and d.collective and c.collective != d.collective:
        kind = "different_collective"
        conf, reason = _by_size(tie, small, f"a rank in `{c.collective}` can never meet ranks in `{d.collective}`",
                                c, d)
    elif c.collective and c.collective == d.collective:
        kind = "minority_stack"
        diverge = c.frames[k] if k < len(c.frames) else None
        if diverge is None or is_library(diverge):
            conf, reason = "low", f"both wait in `{c.collective}`; their paths differ only inside libraries"
        else:
            conf, reason = _by_size(tie, small, f"both wait in `{c.collective}` but called from different places"
                                    ", which pairs collectives that do not belong together", c, d)
            conf = "medium" if conf == "high" else conf
    elif d.collective and not c.collective:
        kind = "minority_stack"
        conf, reason = _by_size(tie, small, f"the others wait in `{d.collective}` for ranks that are elsewhere",
                                c, d)
    elif c.collective and not d.collective:
        kind = "minority_stack"
        conf, reason = _by_size(tie, small, f"{who} {'waits' if c.size == 1 else 'wait'} in `{c.collective}` "
                                "for the others, which are elsewhere: either side may hold the other up", c, d)
        conf = "medium" if conf == "high" else conf
    else:
        kind = "minority_stack"
        why = "no collective recognised; the smallest groups are the usual suspects"
        if in_backward(d.frames) and not in_backward(c.frames):  # DDP's all_reduce: no c10d frame in backward
            title = (f"{who} {verb} {where(c)} while {others} {'is' if d.size == 1 else 'are'} in autograd's "
                     f"backward {where(d)}, where DDP all_reduces the gradients")
            why = ("the others are in autograd's backward, where DDP's gradient all_reduce waits for every rank; "
                   "the smallest groups are the usual suspects")
        conf, reason = _by_size(tie, small, why, c, d)
        conf = "medium" if conf == "high" else conf
    return Finding(kind, title, detail, conf, reason, c.ranks, c.label, c.nodes, class_index=c.index)


def _by_size(tie: bool, small: bool, why: str, c: StackClass, d: StackClass) -> Tuple[Confidence, str]:
    if tie:
        return "low", f"{why}; but both groups hold {c.size} ranks, so either may be the odd one"
    if small:
        return "high", f"{why}, and {c.size} rank{'s' if c.size != 1 else ''} stand{'s' if c.size == 1 else ''} " \
            f"against {d.size}"
    return "medium", f"{why}; but the groups are of similar size ({c.size} and {d.size})"


def _common_prefix(a: StackClass, b: StackClass) -> int:
    k = 0
    for fa, fb in zip(a.frames, b.frames):
        if frame_id(fa, "function+line") != frame_id(fb, "function+line"):
            break
        k += 1
    return k


def _parting(c: StackClass, d: StackClass, k: int) -> str:
    """Where c's path leaves d's: the first frame that differs, on both sides."""
    mine = c.frames[k] if k < len(c.frames) else None
    theirs = d.frames[k] if k < len(d.frames) else None
    after = f" after {named(c.frames[k - 1])}" if k else " at the outermost frame"
    if mine is not None and theirs is not None:
        return f"its path leaves the others'{after}: {named(mine)} here, {named(theirs)} there"
    if mine is None and theirs is not None:
        return f"its path stops{after}, where the others go on into {named(theirs)}"
    if mine is not None:
        return f"its path goes on{after} into {named(mine)}, where the others' path ends"
    return "the paths are the same"


def identical_finding(c: StackClass, *, locals_missing: bool, network: bool, history: bool,
                      incomplete: bool = False, sockets: bool = True, locals_collected: bool = False,
                      moving: bool = False, explained: bool = False, ddp: bool = False) -> Finding:
    """Every rank at the same place: say so, and where the answer can come from instead. "Check the links" is
    advice for when nothing else explains it (`explained`: a [high] culprit finding does), never [high]: sockets
    that move bytes between samples (`moving`) say the links work."""
    one = c.size == 1
    if c.collective:
        at = f"wait{'s' if one else ''} in `{c.collective}`"
    elif ddp:  # DDP's all_reduce runs inside autograd's engine: no torch.distributed frame shows
        at = f"wait{'s' if one else ''} in DDP's gradient all_reduce, inside `backward`, {where(c)}"
    else:
        at = f"{'is' if one else 'are'} {where(c)}"
    who = ("the only rank" if one else f"all {c.size} ranks") + (
        (" with a stack" if one else " with stacks") if incomplete else "")
    title = f"{who} {at}{'' if one else ' at the same place'}: stacks cannot tell the culprit"
    hints = []
    conf: Confidence = "high"
    if network:
        hints.append("the network finding names the node whose sockets stall")
    elif moving:
        hints.append("their sockets moved bytes between samples: the links work")
    elif explained:
        hints.append("the findings above say what they wait for")
    elif sockets:
        hints.append("no socket shows a stall; if nothing else explains the hang, check the links between the "
                     "nodes (ss -tinpo on each)")
        conf = "medium"
    else:
        hints.append("no socket data was collected; check the links between the nodes (ss -tinpo on each)")
        conf = "medium"
    if locals_missing and not locals_collected:
        hints.append("run with --locals to tell loop iterations apart")
    elif locals_missing:
        hints.append("their loop variables could not be read, so an iteration difference would not show")
    if not history:
        hints.append("take samples over time (w in the TUI, or --samples N) to see whether ranks progress")
    return Finding("all_identical", title, f"{c.label} share one stack; " + "; ".join(hints) + ".",
                   conf, "every rank's stack and loop iteration are identical"
                   + ("" if conf == "high" else "; the advice is a guess, no evidence points at the network"),
                   c.ranks, c.label, c.nodes, culprit=False, class_index=c.index)
