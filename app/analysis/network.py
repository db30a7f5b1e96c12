"""Network stalls from the ranks' TCP sockets: which node or link retransmits, or went silent.

When every rank waits in the same collective at the same iteration, the stacks cannot point at anyone; a
node cut off from the others still shows in its sockets (RTO backoff, retransmissions, unacknowledged
bytes), and in its peers' sockets towards it. Peers are mapped to nodes through the addresses the ranks'
own sockets use locally, NodeStatus.address, and MASTER_ADDR (the node of rank 0).
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import Dict, List, Literal, Optional, Sequence, Tuple

from app.analysis.facts import Confidence, Evidence, Fact, nodes_who
from app.analysis.frames import clean
from app.model import RankSnapshot, Snapshot, TcpSocket
from app.model.process import endpoint_host

_sockets = attrgetter("sockets")
UNACKED_MS = 1000  # unacknowledged bytes older than this are a stall, not traffic in flight
SILENT_MS = 10_000
MAX_EVIDENCE = 6


@dataclass(frozen=True)
class StalledSocket:
    node: str
    pid: int
    rank: Optional[int]
    local: str
    peer: str
    peer_node: Optional[str]
    state: str
    reasons: Tuple[str, ...]

    def text(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
        to = f"{clean(self.peer_node, 60)} ({clean(self.peer, 60)})" if self.peer_node else clean(self.peer, 60)
        return f"{clean(self.node, 60)} {who} {clean(self.local, 60)} -> {to}: {', '.join(self.reasons)}"


host_of = endpoint_host  # a socket's own: TcpSocket.local_host / .peer_host (parsed once)


@lru_cache(maxsize=1 << 16)
def _routable(host: str) -> bool:
    # memoized: asked for every socket of every rank, several times per analysis; a job has few addresses, and
    # ipaddress's parser costs ~40 us an address (a third of the analysis at 12,500 nodes, bench/scale.py)
    if not host or not (host[0].isdigit() or ":" in host):
        return False  # a name, not an address (and parsing raises, which is slow at 10k nodes)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_unspecified)


def address_map(snapshot: Snapshot) -> Dict[str, str]:
    """IP address -> node name; addresses seen on more than one node (bridges, NAT) are left out."""
    seen: Dict[str, set] = {}
    for n in snapshot.nodes:
        if _routable(n.address):
            seen.setdefault(n.address, set()).add(n.name)
    for r in snapshot.ranks:
        for s in r.sockets:
            h = s.local_host
            if _routable(h):
                seen.setdefault(h, set()).add(r.node)
    out = {h: next(iter(nodes)) for h, nodes in seen.items() if len(nodes) == 1}
    master = next((r for r in snapshot.ranks if r.rank == 0), None)
    if master is not None and _routable(master.master_addr) and master.master_addr not in seen:
        out[master.master_addr] = master.node
    return out


def _reasons(s: TcpSocket) -> Tuple[str, ...]:
    why = []
    if s.backoff > 0:
        why.append(f"RTO backoff {s.backoff}")
    if s.retransmits > 0:
        why.append(f"{s.retransmits} retransmission{'s' if s.retransmits != 1 else ''} in flight")
    if s.send_q > 0 and s.state == "ESTABLISHED" and (s.last_ack_ms is None or s.last_ack_ms >= UNACKED_MS):
        age = f" for {s.last_ack_ms / 1000:.1f} s" if s.last_ack_ms is not None else ""
        why.append(f"{s.send_q:,} bytes unacknowledged{age}")
    if s.state == "SYN_SENT":
        why.append("still connecting (SYN_SENT)")
    return tuple(why)


def _retransmitting(s: StalledSocket) -> bool:
    return any(r.startswith("RTO") or "retransmission" in r for r in s.reasons)


def stalled_sockets(snapshot: Snapshot, addresses: Optional[Dict[str, str]] = None) -> List[StalledSocket]:
    """Sockets with retransmissions, backoff, bytes unacknowledged or still connecting. `addresses`: the
    snapshot's address_map() when the caller has made it (a pass over every socket: ~0.15 s at 100k ranks)."""
    addresses = address_map(snapshot) if addresses is None else addresses
    out = []
    for r in snapshot.ranks:
        for s in r.sockets:
            why = _reasons(s)
            if why:
                out.append(_stalled(r, s, why, addresses))
    return out


def _stalled(r: RankSnapshot, s: TcpSocket, why: Tuple[str, ...], addresses: Dict[str, str]) -> StalledSocket:
    peer = s.peer_host
    peer_node = r.node if not _routable(peer) and peer else addresses.get(peer)
    return StalledSocket(r.node, r.pid, r.rank, s.local, s.peer, peer_node, s.state, why)


def silent_peers(snapshot: Snapshot, addresses: Optional[Dict[str, str]] = None) -> List[StalledSocket]:
    """Established sockets to a node that has been silent far longer than every other peer."""
    addresses = address_map(snapshot) if addresses is None else addresses
    quiet: Dict[str, List[Tuple[RankSnapshot, TcpSocket]]] = {}
    for r in snapshot.ranks:
        for s in r.sockets:
            peer_node = addresses.get(s.peer_host)
            if s.state == "ESTABLISHED" and s.last_recv_ms is not None and peer_node and peer_node != r.node:
                quiet.setdefault(peer_node, []).append((r, s))
    if len(quiet) < 3:
        return []  # with two peers there is no "far longer than the others"
    freshest = {n: min(s.last_recv_ms or 0 for _, s in pairs) for n, pairs in quiet.items()}
    ordered = sorted(freshest.values())  # the others' median for each node from one sorted list: linear in nodes
    out = []
    for n, ms in freshest.items():
        rest = _median_without(ordered, ms)
        if ms >= SILENT_MS and ms >= 5 * max(rest, 1):
            for r, s in quiet[n]:
                why = (f"nothing received for {ms / 1000:.0f} s (other peers: {rest / 1000:.0f} s)",)
                out.append(_stalled(r, s, why, addresses))
    return out


@dataclass(frozen=True)
class NetworkEvidence(Evidence):
    """Stalled sockets and the node or link they lead to."""

    stalls: Tuple[StalledSocket, ...]  # retransmitting first
    shape: Literal["outgoing", "incoming", "involves", "link", "spread"]
    suspect: Tuple[str, ...]  # the node, or the link's two nodes, or the most involved node
    top_count: int
    nodes: Tuple[str, ...]  # every node the stalls touch
    silent: bool  # no retransmissions, only a peer silent much longer than the others
    unacked_only: bool  # the evidence is unacknowledged bytes only
    case: str  # why the strength: silent, same_place, same_stack, one_place, single, spread


def _median_without(ordered: Sequence[float], value: float) -> float:
    """The median of a sorted list with one occurrence of `value` left out, in O(log n)."""
    i = bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(j: int) -> float:  # the j-th element of the list without position i
        return ordered[j if j < i else j + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def network_findings(snapshot: Snapshot, *, same_place: bool, same_stack: bool = False,
                     sockets: Optional[Sequence[Tuple[TcpSocket, ...]]] = None,
                     addresses: Optional[Dict[str, str]] = None) -> List[Fact]:
    """Name the node or link whose sockets stall, with the sockets as evidence. `same_place`: every rank on one
    stack in one iteration; `same_stack`: on one stack, perhaps in different iterations. `sockets`: each
    rank's sockets when the caller has read them already (columns.Facts); `addresses`: the snapshot's
    address_map() when the caller has made it."""
    if not any(map(_sockets, snapshot.ranks) if sockets is None else sockets):
        return []
    addresses = address_map(snapshot) if addresses is None else addresses
    stalls = stalled_sockets(snapshot, addresses)
    silent = not stalls
    if silent:
        stalls = silent_peers(snapshot, addresses)
    if not stalls:
        return []
    score: Counter = Counter()
    for s in stalls:
        score[s.node] += 1
        if s.peer_node and s.peer_node != s.node:
            score[s.peer_node] += 1
    top, top_n = score.most_common(1)[0]
    everywhere = [n for n, c in score.items() if c == len(stalls)]
    # retransmitting sockets first: they are the strongest evidence
    stalls.sort(key=lambda s: (-sum(("RTO" in r) + ("retransmission" in r) for r in s.reasons), s.node, s.local))
    nodes = tuple(sorted({s.node for s in stalls} | {s.peer_node for s in stalls if s.peer_node}))
    shape: Literal["outgoing", "incoming", "involves", "link", "spread"]
    if len(everywhere) == 1:
        suspect: Tuple[str, ...] = (everywhere[0],)
        if all(s.node == everywhere[0] for s in stalls):
            shape = "outgoing"
        elif all(s.peer_node == everywhere[0] for s in stalls):
            shape = "incoming"
        else:
            shape = "involves"
    elif len(everywhere) == 2:
        suspect, shape = tuple(sorted(everywhere)), "link"
    else:
        suspect, shape = (top,), "spread"
    conf: Confidence
    if silent:
        conf, case = "low", "silent"
    elif same_place and len(everywhere) in (1, 2) and len(stalls) >= 2:
        conf, case = "high", "same_place"
    elif same_stack and len(everywhere) == 1 and len(stalls) >= 2 and all(map(_retransmitting, stalls)):
        # A node cut off in the middle of a ring all_reduce leaves the ranks that got their data one step ahead
        # on the same line: the iterations differ, but sockets that all retransmit towards one node name it.
        conf, case = "high", "same_stack"
    elif len(everywhere) in (1, 2):
        conf, case = "medium", ("one_place" if len(stalls) >= 2 else "single")
    else:
        conf, case = "low", "spread"
    unacked_only = all(not any(r.startswith(("RTO", "still")) or "retransmission" in r for r in s.reasons)
                       for s in stalls)
    if unacked_only:
        conf = "low" if conf != "high" else "medium"
    return [Fact("network_stall", nodes_who(suspect), conf,
                 NetworkEvidence(tuple(stalls), shape, suspect, top_n, nodes, silent, unacked_only, case))]
