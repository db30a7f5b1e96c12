"""Point-to-point waits: a rank blocked in send/recv names its peer in the call's arguments.

torch.distributed's `send(tensor, dst)`, `recv(tensor, src)` (and isend/irecv, the *_object_list forms) carry
the peer's global rank as a local of their frame, which `--locals` reads. A rank in `recv(src=3)` waits for
rank 3; it stops waiting when rank 3 is in the matching `send(dst=it)`. An unmatched call is an edge of the
wait graph (app/analysis/waits.py): two ranks each waiting for the other (both in recv from each other, or one
in recv while its peer waits in a collective the first has not joined) are deadlocked.

Only ranks whose path waits in a point-to-point call are read (one frame's locals each), so a job of
collectives costs nothing here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from app.analysis.findings import Finding
from app.analysis.fold import RankKey
from app.analysis.frames import bare_name, clean, named
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


def _who(c: P2PCall) -> str:
    return f"rank {c.rank}" if c.rank is not None else f"pid {c.key[1]}"


def p2p_findings(calls: Sequence[P2PCall], where_of: Dict[int, str]) -> List[Finding]:
    """A deadlock of point-to-point calls, said as such; else each unmatched call's wait for a peer that is
    elsewhere (`where_of`: rank number -> where that rank is, for the peers that are not in a p2p call)."""
    out: List[Finding] = []
    in_cycle: set = set()
    for ring in cycles(calls):
        in_cycle.update(c.rank for c in ring)
        parts = [f"{_who(c)} waits in {named(c.frame)} for rank {c.peer} ({clean(c.argument, 40)})" for c in ring]
        who = " and ".join(_who(c) for c in ring)
        out.append(Finding(
            "p2p_wait", clean(f"{who} are deadlocked in point-to-point calls: each waits for the other", 300),
            "; ".join(parts) + ". Neither call can complete: every send needs the peer's matching recv. Make the "
            "pairs match (one side sends while the other receives: order them by rank, or use batch_isend_irecv)",
            "high", "a cycle of ranks each blocked in send/recv towards the next, read from the calls' arguments",
            tuple(c.key for c in ring), ", ".join(_who(c) for c in ring), ",".join(sorted({c.key[0] for c in ring}))))
    by_rank = {c.rank: c for c in calls if c.rank is not None}
    for c in calls:
        if c.rank in in_cycle or c.peer is None or c.peer in by_rank:
            continue  # a peer in a p2p call of its own: matched, or part of a chain its own wait explains
        elsewhere = where_of.get(c.peer)
        if elsewhere is None:
            continue
        out.append(Finding(
            "p2p_wait", clean(f"{_who(c)} waits in {named(c.frame)} for rank {c.peer} ({c.argument}), which is "
                              f"{elsewhere}", 300),
            f"{_who(c)}'s {c.op} names rank {c.peer} as its peer ({clean(c.argument, 40)}), and rank {c.peer} is not in "
            f"a matching {'recv' if c.op == 'send' else 'send'}: it is {elsewhere}. The two ranks disagree on what "
            "comes next (a send or recv one of them skipped, or a collective issued between them)",
            "medium", "the call's own argument names the peer, and the peer's stack shows it elsewhere; which of "
            "the two took the wrong path is not known", (c.key,), _who(c), c.key[0]))
    return out
