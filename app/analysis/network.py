"""Network stalls from the ranks' TCP sockets: which node or link retransmits, or went silent.

When every rank waits in the same collective at the same iteration, the stacks cannot point at anyone; a
node cut off from the others still shows in its sockets (RTO backoff, retransmissions, unacknowledged
bytes), and in its peers' sockets towards it. Peers are mapped to nodes through the addresses the ranks'
own sockets use locally, NodeStatus.address, and MASTER_ADDR (the node of rank 0).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass
from operator import attrgetter
from statistics import median
from typing import Dict, List, Optional, Sequence, Tuple

from app.analysis.findings import Confidence, Finding
from app.analysis.fold import fold_nodes
from app.analysis.frames import clean
from app.model import RankSnapshot, Snapshot, TcpSocket

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


def host_of(endpoint: str) -> str:
    """The address part of "addr:port", "[v6]:port"; IPv4-mapped IPv6 addresses as IPv4."""
    host = endpoint.rsplit(":", 1)[0] if ":" in endpoint else endpoint
    host = host.strip("[]")
    if host.lower().startswith("::ffff:") and "." in host:
        host = host[7:]
    return host


def _routable(host: str) -> bool:
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
            h = host_of(s.local)
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


def stalled_sockets(snapshot: Snapshot) -> List[StalledSocket]:
    addresses = address_map(snapshot)
    out = []
    for r in snapshot.ranks:
        for s in r.sockets:
            why = _reasons(s)
            if why:
                out.append(_stalled(r, s, why, addresses))
    return out


def _stalled(r: RankSnapshot, s: TcpSocket, why: Tuple[str, ...], addresses: Dict[str, str]) -> StalledSocket:
    peer = host_of(s.peer)
    peer_node = r.node if not _routable(peer) and peer else addresses.get(peer)
    return StalledSocket(r.node, r.pid, r.rank, s.local, s.peer, peer_node, s.state, why)


def silent_peers(snapshot: Snapshot) -> List[StalledSocket]:
    """Established sockets to a node that has been silent far longer than every other peer."""
    addresses = address_map(snapshot)
    quiet: Dict[str, List[Tuple[RankSnapshot, TcpSocket]]] = {}
    for r in snapshot.ranks:
        for s in r.sockets:
            peer_node = addresses.get(host_of(s.peer))
            if s.state == "ESTABLISHED" and s.last_recv_ms is not None and peer_node and peer_node != r.node:
                quiet.setdefault(peer_node, []).append((r, s))
    if len(quiet) < 3:
        return []  # with two peers there is no "far longer than the others"
    freshest = {n: min(s.last_recv_ms or 0 for _, s in pairs) for n, pairs in quiet.items()}
    out = []
    for n, ms in freshest.items():
        rest = median(v for m, v in freshest.items() if m != n)
        if ms >= SILENT_MS and ms >= 5 * max(rest, 1):
            for r, s in quiet[n]:
                why = (f"nothing received for {ms / 1000:.0f} s (other peers: {rest / 1000:.0f} s)",)
                out.append(_stalled(r, s, why, addresses))
    return out


def network_findings(snapshot: Snapshot, *, same_place: bool, same_stack: bool = False,
                     sockets: Optional[Sequence[Tuple[TcpSocket, ...]]] = None) -> List[Finding]:
    """Name the node or link whose sockets stall, with the sockets as evidence. `same_place`: every rank on one
    stack in one iteration; `same_stack`: on one stack, perhaps in different iterations. `sockets`: each
    rank's sockets when the caller has read them already (columns.Facts)."""
    if not any(map(_sockets, snapshot.ranks) if sockets is None else sockets):
        return []
    stalls = stalled_sockets(snapshot)
    silent = not stalls
    if silent:
        stalls = silent_peers(snapshot)
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
    evidence = "; ".join(s.text() for s in stalls[:MAX_EVIDENCE])
    if len(stalls) > MAX_EVIDENCE:
        evidence += f"; and {len(stalls) - MAX_EVIDENCE} more"
    nodes = sorted({s.node for s in stalls} | {s.peer_node for s in stalls if s.peer_node})
    if len(everywhere) == 1:
        suspect = everywhere[0]
        outgoing = all(s.node == suspect for s in stalls)
        incoming = all(s.peer_node == suspect for s in stalls)
        peers = fold_nodes({s.peer_node or host_of(s.peer) for s in stalls} if outgoing else {s.node for s in stalls})
        if outgoing:
            title = f"{suspect}'s sockets to {peers} stall: {suspect} (or its link) has lost the network"
        elif incoming:
            title = f"sockets on {peers} towards {suspect} stall: {suspect} (or the path to it) does not answer"
        else:
            title = f"every stalled socket involves {suspect}: {suspect} (or its link) is the problem"
        named = suspect
    elif len(everywhere) == 2:
        a, b = sorted(everywhere)
        title = f"the link between {a} and {b} stalls"
        named = f"{a},{b}"
    else:
        title = f"sockets stall on {fold_nodes(nodes)}; {top} is involved most ({top_n} of {len(stalls)})"
        named = top
    conf: Confidence
    if silent:
        conf, reason = "low", "no retransmissions, only a peer that has been silent much longer than the others"
    elif same_place and len(everywhere) in (1, 2) and len(stalls) >= 2:
        conf, reason = "high", "every rank waits at the same place and the stalled sockets all lead to one place"
    elif same_stack and len(everywhere) == 1 and len(stalls) >= 2 and all(map(_retransmitting, stalls)):
        # A node cut off in the middle of a ring all_reduce leaves the ranks that got their data one step ahead
        # on the same line: the iterations differ, but sockets that all retransmit towards one node name it.
        conf, reason = "high", ("every rank waits on the same line, and every stalled socket retransmits towards "
                                "one node")
    elif len(everywhere) in (1, 2):
        conf, reason = "medium", ("the stalled sockets lead to one place" if len(stalls) >= 2 else
                                  "a single stalled socket")
    else:
        conf, reason = "low", "stalls are spread over several nodes"
    if all(not any(r.startswith(("RTO", "still")) or "retransmission" in r for r in s.reasons) for s in stalls):
        conf = "low" if conf != "high" else "medium"
        reason += "; the evidence is unacknowledged bytes only"
    return [Finding("network_stall", clean(title, 300), f"evidence: {evidence}.", conf, reason, (), "",
                    fold_nodes(named.split(",")) if "," in named else named)]
