"""Point-to-point waits: a rank blocked in send/recv names its peer in the call's arguments.

torch.distributed's `send(tensor, dst)`, `recv(tensor, src)` (and isend/irecv, the *_object_list forms) carry
the peer's global rank as a local of their frame, which `--locals` reads. A rank in `recv(src=3)` waits for
rank 3; it stops waiting when rank 3 is in the matching `send(dst=it)`. An unmatched call is an edge of the
wait graph (app/analysis/graph.py): two ranks each waiting for the other (both in recv from each other, or one
in recv while its peer waits in a collective the first has not joined) are deadlocked.

Only ranks whose path waits in a point-to-point call are read (one frame's locals each), so a job of
collectives costs nothing here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from app.analysis.facts import Evidence, Fact, ranks_who
from app.analysis.fold import RankKey
from app.analysis.frames import bare_name
from app.analysis.tree import StackClass
from app.model import Frame, RankSnapshot

P2P = frozenset({"send", "recv", "send/recv"})
_SENDS = frozenset({"send", "isend", "send_object_list"})
_RECVS = frozenset({"recv", "irecv", "recv_object_list"})
_PEER_LOCALS = {"send": ("dst", "group_dst", "peer"), "recv": ("src", "group_src", "peer")}
_INT = re.compile(r"-?\d{1,9}")
MAX_READ = 4096  # ranks whose locals are read (a pipeline of 100k ranks: the first few thousand tell)


@dataclass(frozen=True)
class P2PCall:
    """One rank blocked in a point-to-point call, with the peer its arguments name (None: not readable)."""

    key: RankKey
    rank: Optional[int]
    op: str  # "send" or "recv"
    peer: Optional[int]
    argument: str  # `src=3`, or "" when the peer is unknown
    frame: Frame  # the torch.distributed frame of the call

    def text(self) -> str:
        return f"{self.op}({self.argument})" if self.argument else self.op


def _call(r: RankSnapshot) -> Optional[Tuple[str, Optional[int], str, Frame]]:
    t = r.main_thread
    if t is None:
        return None
    # innermost first: the public API frame (the call the user made) is the outermost matching one
    found: Optional[Tuple[str, Frame]] = None
    for f in t.frames:
        if f.native or "torch/distributed/" not in f.filename.replace("\\", "/"):
            continue
        name = bare_name(f.function)
        if name in _SENDS:
            found = ("send", f)
        elif name in _RECVS:
            found = ("recv", f)
    if found is None:
        return None
    op, frame = found
    for want in _PEER_LOCALS[op]:
        for local in frame.locals:
            if local.name == want and _INT.fullmatch(local.repr.strip()):
                if want.startswith("group_"):  # a rank of the group, not the global rank: say so, no edge
                    return op, None, f"{want}={local.repr.strip()}", frame
                return op, int(local.repr.strip()), f"{want}={local.repr.strip()}", frame
    return op, None, "", frame


def p2p_calls(ranks: Sequence[RankSnapshot], classes: Sequence[StackClass],
              by_key: Optional[Dict[RankKey, RankSnapshot]] = None) -> List[P2PCall]:
    """The ranks of classes that wait in send/recv, each with its peer from the call's locals."""
    wanted = [k for c in classes if c.collective in P2P for k in c.ranks]
    if not wanted:
        return []
    lookup = by_key if by_key is not None else {(r.node, r.pid): r for r in ranks}
    out = []
    for k in wanted[:MAX_READ]:
        r = lookup.get(k)
        if r is None:
            continue
        call = _call(r)
        if call is not None:
            op, peer, arg, frame = call
            out.append(P2PCall(k, r.rank, op, peer, arg, frame))
    return out


def matched(a: P2PCall, b: Optional[P2PCall]) -> bool:
    """Whether b is the call that completes a: a send to it against its recv from a, or the other way."""
    if b is None or a.peer is None or b.peer is None:
        return False
    return a.op != b.op and a.peer == b.rank and b.peer == a.rank


def cycles(calls: Sequence[P2PCall]) -> List[List[P2PCall]]:
    """Cycles of unmatched point-to-point waits: rank a waits for b, b for ..., back to a."""
    by_rank = {c.rank: c for c in calls if c.rank is not None}
    nxt: Dict[int, int] = {}
    for c in calls:
        if c.rank is None or c.peer is None or c.peer not in by_rank or matched(c, by_rank[c.peer]):
            continue
        nxt[c.rank] = c.peer
    out: List[List[P2PCall]] = []
    done: set = set()
    for start in sorted(nxt):
        path: List[int] = []
        at: Optional[int] = start
        while at is not None and at in nxt and at not in path and at not in done:
            path.append(at)
            at = nxt[at]
        if at is not None and at in path:
            ring = path[path.index(at):]
            out.append([by_rank[x] for x in ring])
        done.update(path)
    return out


@dataclass(frozen=True)
class P2PEvidence(Evidence):
    """Unmatched point-to-point calls: a cycle of ranks each waiting for the next, or one call whose peer is
    elsewhere (`peer_class`: the class the peer's stack is in)."""

    ring: Tuple[P2PCall, ...] = ()
    call: Optional[P2PCall] = None
    peer_class: Optional[StackClass] = None


def p2p_facts(calls: Sequence[P2PCall], class_of: Dict[int, StackClass]) -> List[Fact]:
    """A deadlock of point-to-point calls, said as such; else each unmatched call's wait for a peer that is
    elsewhere (`class_of`: rank number -> the stack class of that rank, for the peers not in a p2p call)."""
    out: List[Fact] = []
    in_cycle: set = set()
    for ring in cycles(calls):
        in_cycle.update(c.rank for c in ring)
        out.append(Fact("p2p_wait", ranks_who(tuple(c.key for c in ring), tuple(c.rank for c in ring)), "high",
                        P2PEvidence(ring=tuple(ring))))
    by_rank = {c.rank: c for c in calls if c.rank is not None}
    for c in calls:
        if c.rank in in_cycle or c.peer is None or c.peer in by_rank:
            continue  # a peer in a p2p call of its own: matched, or part of a chain its own wait explains
        elsewhere = class_of.get(c.peer)
        if elsewhere is None:
            continue
        out.append(Fact("p2p_wait", ranks_who((c.key,), (c.rank,)), "medium",
                        P2PEvidence(call=c, peer_class=elsewhere)))
    return out
