"""Peers outside the snapshot: addresses the ranks hold connections to that no inspected node has.

A job's ranks talk to each other (gloo/NCCL pairs, the store on MASTER_ADDR). When the hosts list leaves out
a node of the job, its ranks are missing from the snapshot, and the ranks that are there hold connections to
its address: that address, named where the login side could resolve it (ssh config, reverse DNS, the SLURM
job's node list: Snapshot.peer_names), is where the missing ranks are. An outside address that only one
rank talks to once (a metrics or data server) is not the job's: it takes two connections, or rank 0's store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Dict, List, Optional, Sequence, Set, Tuple

from app.analysis.facts import Evidence, Fact, Who
from app.analysis.fold import RankKey
from app.analysis.frames import clean
from app.analysis.network import _routable
from app.model import Snapshot, rank_key

TALKING = ("ESTABLISHED", "SYN_SENT", "SYN_RECV", "CLOSE_WAIT", "FIN_WAIT1", "FIN_WAIT2")
MAX_PEERS = 8  # outside addresses named in one finding; more are counted


@dataclass(frozen=True)
class OutsidePeer:
    address: str
    name: str  # resolved on the login side, "" when it could not be
    how: str  # how the name was found: "ssh config", "reverse DNS", "SLURM node list"
    ranks: Tuple[RankKey, ...]  # (node, pid) of the ranks holding connections to it
    rank_numbers: Tuple[int, ...]
    connections: int
    master: bool  # it is the job's MASTER_ADDR (the store, rank 0's node)

    def text(self) -> str:
        name = f"{clean(self.name, 80)} ({clean(self.address, 60)})" if self.name else clean(self.address, 60)
        return name


def known_addresses(snapshot: Snapshot) -> Set[str]:
    """The addresses of the inspected nodes: their own, and every local address their ranks' sockets have."""
    known = {n.address for n in snapshot.nodes if n.address}
    for r in snapshot.ranks:
        for s in r.sockets:
            known.add(s.local_host)
    return known


def outside_peers(snapshot: Snapshot, also: AbstractSet[str] = frozenset()) -> List[OutsidePeer]:
    """Addresses that inspected ranks talk to and that belong to no inspected node, the job's own first. `also`:
    addresses of inspected nodes beyond this snapshot's ranks (one job's analysis: the other jobs' ranks' nodes)."""
    known = known_addresses(snapshot) | set(also)
    masters = {r.master_addr for r in snapshot.ranks if r.master_addr}
    talking: Dict[str, Dict[RankKey, int]] = {}
    numbers: Dict[str, Set[int]] = {}
    for r in snapshot.ranks:
        for s in r.sockets:
            if s.state not in TALKING:
                continue
            peer = s.peer_host
            if not _routable(peer) or peer in known:
                continue
            per_rank = talking.setdefault(peer, {})
            per_rank[rank_key(r)] = per_rank.get(rank_key(r), 0) + 1
            if r.rank is not None:
                numbers.setdefault(peer, set()).add(r.rank)
    names = dict((a, (n, how)) for a, n, how in snapshot.peer_names)
    out = []
    for address, per_rank in talking.items():
        connections = sum(per_rank.values())
        master = address in masters
        if connections < 2 and not master:
            continue  # one connection of one rank: a service the rank uses, not a peer of the job
        name, how = names.get(address, ("", ""))
        out.append(OutsidePeer(address, name, how, tuple(sorted(per_rank)), tuple(sorted(numbers.get(address, ()))),
                               connections, master))
    out.sort(key=lambda p: (not p.master, -len(p.ranks), -p.connections, p.address))
    return out


@dataclass(frozen=True)
class OutsideEvidence(Evidence):
    """Addresses the job's ranks talk to that no inspected node has; `missing`: ranks are not found, and these
    addresses are most likely where they run."""

    peers: Tuple[OutsidePeer, ...]
    holders: Tuple[RankKey, ...]  # the ranks holding the connections
    numbers: Tuple[int, ...]
    connections: int
    missing: Optional[Tuple[int, ...]] = None  # the rank numbers not found, when some are
    missing_label: str = ""  # their label, for display
    job: str = ""


def outside_peer_findings(snapshot: Snapshot, peers: Sequence[OutsidePeer],
                          missing: Optional[Tuple[Tuple[int, ...], str, str]] = None) -> List[Fact]:
    """One fact naming the outside addresses the job's ranks talk to. `missing`: (numbers, label, job) of the
    ranks not found, when some are: then those ranks are, most likely, on these addresses."""
    if not peers:
        return []
    shown = tuple(peers[:MAX_PEERS])
    ranks = tuple(sorted({k for p in peers for k in p.ranks}))
    numbers = tuple(sorted({n for p in peers for n in p.rank_numbers}))
    connections = sum(p.connections for p in peers)
    nodes = tuple(p.name or p.address for p in shown)
    evidence = OutsideEvidence(tuple(peers), ranks, numbers, connections,
                               missing[0] if missing is not None else None,
                               missing[1] if missing is not None else "", missing[2] if missing is not None else "")
    # no ranks: the ones holding the connections are not the culprit; the ones that may be are not inspected
    if missing is not None:
        return [Fact("outside_peer", Who(numbers=missing[0], nodes=nodes, addresses=tuple(p.address for p in shown),
                                         missing=True), "medium", evidence)]
    return [Fact("outside_peer", Who(nodes=nodes, addresses=tuple(p.address for p in shown)), "low", evidence,
                 culprit=False)]
