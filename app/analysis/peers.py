"""Peers outside the snapshot: addresses the ranks hold connections to that no inspected node has.

A job's ranks talk to each other (gloo/NCCL pairs, the store on MASTER_ADDR). When the hosts list leaves out
a node of the job, its ranks are missing from the snapshot, and the ranks that are there hold connections to
its address: that address, named where the login side could resolve it (ssh config, reverse DNS, the SLURM
job's node list: Snapshot.peer_names), is where the missing ranks are. An outside address that only one
rank talks to once (a metrics or data server) is not the job's: it takes two connections, or rank 0's store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from app.analysis.findings import Confidence, Finding
from app.analysis.fold import RankKey, fold_ints, fold_nodes
from app.analysis.frames import clean
from app.analysis.network import _routable, host_of
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


def _known_addresses(snapshot: Snapshot) -> Set[str]:
    known = {n.address for n in snapshot.nodes if n.address}
    for r in snapshot.ranks:
        for s in r.sockets:
            known.add(host_of(s.local))
    return known


def outside_peers(snapshot: Snapshot) -> List[OutsidePeer]:
    """Addresses that inspected ranks talk to and that belong to no inspected node, the job's own first."""
    known = _known_addresses(snapshot)
    masters = {r.master_addr for r in snapshot.ranks if r.master_addr}
    talking: Dict[str, Dict[RankKey, int]] = {}
    numbers: Dict[str, Set[int]] = {}
    for r in snapshot.ranks:
        for s in r.sockets:
            if s.state not in TALKING:
                continue
            peer = host_of(s.peer)
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


def outside_peer_findings(snapshot: Snapshot, peers: Sequence[OutsidePeer],
                          missing: Optional[Tuple[str, str]] = None) -> List[Finding]:
    """One finding naming the outside addresses the job's ranks talk to. `missing`: (label, job) of the ranks
    not found, when some are: then those ranks are, most likely, on these addresses."""
    if not peers:
        return []
    shown = list(peers[:MAX_PEERS])
    where = ", ".join(p.text() for p in shown) + (f" and {len(peers) - len(shown)} more" if len(peers) > len(shown)
                                                  else "")
    ranks = tuple(sorted({k for p in peers for k in p.ranks}))
    numbers = sorted({n for p in peers for n in p.rank_numbers})
    connections = sum(p.connections for p in peers)
    who = (f"rank{'s' if len(numbers) != 1 else ''} {fold_ints(numbers)}" if numbers
           else f"{len(ranks)} process{'es' if len(ranks) != 1 else ''}")
    hold = f"{who} on {fold_nodes(k[0] for k in ranks)} hold {connections} connection{'s' if connections != 1 else ''}"
    named = [p for p in shown if p.name]
    how = "; ".join(f"{clean(p.address, 60)} is {clean(p.name, 80)} by the {p.how}" for p in named)
    add = fold_nodes(p.name for p in named) if named and len(named) == len(shown) else ""
    hint = (f"add {add} to the hosts list" if add else
            "add the node(s) at these addresses to the hosts list (`getent hosts ADDRESS` names them)")
    conf: Confidence
    if missing is not None:
        label, job = missing
        title = (f"{label} {'is' if label.startswith('rank ') else 'are'} not in the snapshot: the job runs on "
                 f"{where} too, which the hosts list leaves out")
        detail = (f"{hold} to {where}, which no inspected node has: that is where {label} run"
                  f"{'s' if label.startswith('rank ') else ''}, and the inspected ranks wait for them. "
                  f"{hint[:1].upper() + hint[1:]} to see what they do{job}.")
        conf, reason = "medium", ("ranks are missing and the inspected ranks talk to addresses no inspected node "
                                  "has; which of the missing ranks holds the others up is not known")
    else:
        title = f"the job's ranks talk to {where}, which the hosts list leaves out"
        detail = (f"{hold} to {where}, which no inspected node has: if the job runs there too, {hint} "
                  f"(every rank was found, so this may also be a service the ranks use).")
        conf, reason = "low", "every expected rank was found; the address may be a service, not a node of the job"
    if how:
        detail += f" Names: {how}."
    # no ranks: the ones holding the connections are not the culprit; the ones that may be are not inspected
    return [Finding("outside_peer", clean(title, 300), detail, conf, reason, (), "",
                    fold_nodes(p.name or p.address for p in shown), culprit=missing is not None)]
