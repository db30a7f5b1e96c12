"""Who waits for whom inside one process: threads blocked entering a `with` block whose lock another thread holds.

The worker reads, from each frame's source, the `with` blocks around its current line (Frame.withs): a frame
whose line is a `with X:` header and that is blocked there (in futex, where the kernel says: a lock's acquire
sleeps there, an `open()` in the header does not) waits to acquire X; a frame inside the body of
`with X:` holds X. Within one rank, thread A waiting for X and thread B holding X (the same expression in the
same file) is an edge A -> B; a cycle of edges is a deadlock. What the holder itself waits on (its innermost
frame) says why it does not let go. A thread inside `with cond:` that is in `cond.wait()` has released it.

This is evidence from stacks and source, not from the lock objects: a lock taken with acquire() or held by a
thread that is gone leaves a waiter with no visible holder, said as such and with low confidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from app.analysis.facts import Confidence, Evidence, Fact, ranks_who
from app.model import Frame, RankSnapshot, ThreadStack, rank_key

MAX_FINDINGS = 4
_ENTER_FUNCTIONS = ("__enter__", "acquire", "_acquire_restore")  # threading.Lock/RLock/Condition entry, in Python
LockKey = Tuple[str, str]  # (file, expression as written)


@dataclass(frozen=True)
class Wait:
    thread: ThreadStack
    frame: Frame  # the frame at the `with` header
    key: LockKey
    header: str


def _python(frames: Sequence[Frame]) -> List[Frame]:
    return [f for f in frames if not f.native]


def _blocked(t: ThreadStack) -> bool:
    """Not running Python code now: idle to py-spy, or sleeping in the kernel."""
    return not t.active or t.state in ("S", "D")


def waiting(t: ThreadStack) -> Optional[Wait]:
    """The `with` block this thread is blocked entering, if any (innermost Python frames first)."""
    if not _blocked(t):
        return None
    # the innermost three Python frames, read lazily: this runs for every thread of every rank
    frames: List[Frame] = []
    for f in t.frames:
        if f.native:
            continue
        frames.append(f)
        if len(frames) == 3:
            break
    for i, f in enumerate(frames):
        if not f.withs:
            continue
        entering = [w for w in f.withs if w.entering]
        if entering:
            inner = frames[:i]
            if not inner and t.syscall and t.syscall != "futex":
                # a C call in the header itself (`with open(fifo) as f:`, `with socket.create_connection(...)`)
                # waits in its own system call: only a lock's acquire sleeps in futex
                return None
            # above the `with` line only the lock's own entry code (threading.py), or nothing (a C lock)
            if all(g.function in _ENTER_FUNCTIONS and g.filename.endswith("threading.py") for g in inner):
                w = entering[-1]
                if w.items and w.items[0]:
                    return Wait(t, f, (f.filename, w.items[0]), w.header)
            return None
    return None


def held(t: ThreadStack) -> Set[LockKey]:
    """What this thread holds: the context managers of every `with` body its frames are in, except a
    condition it waits on (Condition.wait releases it)."""
    frames = _python(t.frames)
    out: Set[LockKey] = set()
    for i, f in enumerate(frames):
        inner = frames[i - 1] if i > 0 else None
        line_text = next((text for n, text in f.source if n == f.line), "")
        for w in f.withs:
            if w.entering:
                continue
            for item in w.items:
                if not item:
                    continue
                released = (f"{item}.wait(" in line_text or f"{item}.wait_for(" in line_text or
                            (inner is not None and inner.function in ("wait", "wait_for")
                             and inner.filename.endswith("threading.py") and f"{item}.wait" in line_text))
                if not released:
                    out.add((f.filename, item))
    return out


@dataclass(frozen=True)
class LockEdge:
    rank: RankSnapshot
    waiter: Wait
    holder: Optional[ThreadStack]


def lock_edges(r: RankSnapshot) -> List[LockEdge]:
    waits = [w for w in map(waiting, r.threads) if w is not None]
    if not waits:
        return []  # the common case, a few frames per thread looked at: holds are read only when someone waits
    holds = {t.tid: held(t) for t in r.threads}
    edges = []
    for w in waits:
        holder = next((h for h in r.threads if h.tid != w.thread.tid and w.key in holds[h.tid]), None)
        edges.append(LockEdge(r, w, holder))
    return edges


def _cycle(edges: List[LockEdge]) -> List[LockEdge]:
    """Edges that form a cycle of waits (a deadlock), in order, or []."""
    by_waiter: Dict[int, LockEdge] = {e.waiter.thread.tid: e for e in edges if e.holder is not None}
    for start in by_waiter:
        seen: List[int] = []
        tid: Optional[int] = start
        while tid is not None and tid in by_waiter and tid not in seen:
            seen.append(tid)
            holder = by_waiter[tid].holder
            tid = holder.tid if holder is not None else None
        if tid is not None and tid in seen:
            return [by_waiter[x] for x in seen[seen.index(tid):]]
    return []


@dataclass(frozen=True)
class LockEvidence(Evidence):
    """Threads of one rank waiting for `with` locks: a cycle (a deadlock), or one waiter and its holder."""

    rank: RankSnapshot
    cycle: Tuple[LockEdge, ...] = ()  # a deadlock, in order
    edge: Optional[LockEdge] = None
    odd: bool = False  # the stacks single this rank out


def lock_facts(ranks: Sequence[RankSnapshot], odd: Set[Tuple[str, int]],
               candidates: Optional[Sequence[bool]] = None) -> List[Fact]:
    """Threads blocked on a lock another thread of their rank holds (and deadlocks). `odd`: (node, pid) of the
    ranks the stacks single out (minority classes): there a lock wait is the likely cause, elsewhere a lead.
    `candidates`: RankSnapshot.enters_with per rank when the caller has read it (columns.Facts): only ranks with
    a thread at a `with` header are looked at, so a snapshot without any costs one pass over a column."""
    out: List[Fact] = []
    flags = candidates if candidates is not None else [r.enters_with for r in ranks]
    for r, flag in zip(ranks, flags):
        if not flag:
            continue
        edges = lock_edges(r)
        if not edges:
            continue
        key = rank_key(r)
        who = ranks_who((key,), (r.rank,))
        cycle = _cycle(edges)
        if cycle:
            out.append(Fact("lock_wait", who, "high", LockEvidence(r, tuple(cycle), odd=key in odd)))
            continue
        for e in edges:
            conf: Confidence
            if e.holder is not None:
                if _blocked(e.holder) and key in odd:
                    conf = "high"
                elif _blocked(e.holder):
                    conf = "medium"
                else:
                    conf = "low"
            else:
                conf = "low"
            out.append(Fact("lock_wait", who, conf, LockEvidence(r, edge=e, odd=key in odd),
                            culprit=key in odd or conf != "low"))
        if len(out) >= MAX_FINDINGS:
            break
    return out[:MAX_FINDINGS]


def blocked(t: ThreadStack) -> bool:
    return _blocked(t)


def held_name(edge: LockEdge, cycle: List[LockEdge]) -> str:
    """In a cycle, what this edge's waiter holds: the lock the previous waiter in the cycle waits for."""
    for other in cycle:
        if other.holder is not None and other.holder.tid == edge.waiter.thread.tid:
            return other.waiter.key[1]
    return "?"
