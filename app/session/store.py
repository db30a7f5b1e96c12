"""Rank numbers from the job's store, for ranks whose process says none (issue 16.1).

A rank started by torch.multiprocessing.spawn or plain multiprocessing has no RANK in its environment; the spawn
target's `rank` argument (py-spy --locals) is the best the process itself shows, and it is only the local index
on a multi-node spawn, or absent (`def main_worker(gpu, args)`). The process group knows: gloo's rendezvous
published every rank's listening address in the job's TCPStore under the default group's key for that rank.

Which endpoint is the store is read from the connections, not guessed: every rank of a job holds a connection to
its store, while a rank's gloo listener is connected to by the other ranks only, never by itself. So the store is
the endpoint that the most of these ranks hold, at least two, and more than any other they hold. A worker on the
node of a rank holding that connection asks the store (workers/collect/pgstore.py: read-only queries) which of
the ranks' listening addresses it names as which rank; values never leave the node. A number is taken only when
the rank's listeners name one rank and no other rank got the same number; otherwise the rank keeps what it had.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from app.model import RankSnapshot

# rank_evidence of a number the store may replace: none, or the spawn target's argument (--locals)
_WEAK_EVIDENCE = ("", "unknown:", "the spawn target's", "the multiprocessing target's")
_WILDCARD = ("0.0.0.0:", "[::]:", ":::", "*:")
_LOOPBACK = ("127.", "[::1]", "::1", "localhost")
MAX_STORE_RANKS = 4096


def needs_number(r: RankSnapshot) -> bool:
    """A rank whose number the store should give: none yet, or only the spawn target's argument."""
    return r.rank_evidence == "" or r.rank_evidence.startswith(_WEAK_EVIDENCE[1:])


@dataclass(frozen=True)
class StoreAsk:
    """One store to ask: its endpoint, the rank (node, pid) whose node asks it, and what is asked."""

    store: str  # "addr:port" as the ranks' sockets show it
    node: str
    pid: int  # a rank there holding a connection to it (its network namespace is the one to ask from)
    ranks: tuple[RankSnapshot, ...]  # the ranks that hold a connection to it and need a number
    listeners: tuple[str, ...]  # their listening addresses, each held by one of them
    host: Optional[RankSnapshot]  # the rank that serves the store, when it is one of the snapshot's


def store_key(node: str, endpoint: str) -> tuple[str, str]:
    """A loopback endpoint is one per node; any other is one cluster-wide."""
    return (node if endpoint.startswith(_LOOPBACK) else "", endpoint)


def _listeners(r: RankSnapshot) -> list[str]:
    return [s.local for s in r.sockets if s.state == "LISTEN" and not s.local.startswith(_WILDCARD)]


def plan(ranks: Iterable[RankSnapshot], skip: Iterable[tuple[str, str]] = ()) -> list[StoreAsk]:
    """The stores to ask for these ranks' numbers (those that need one), one ask per store; `skip`: (node or "",
    endpoint) keys of stores that already failed in this session."""
    skipped = set(skip)
    need = [r for r in ranks if needs_number(r)][:MAX_STORE_RANKS]
    held: dict[int, set[tuple[str, str]]] = {}
    count: Counter[tuple[str, str]] = Counter()
    for i, r in enumerate(need):
        peers = {store_key(r.node, s.peer) for s in r.sockets if s.state == "ESTABLISHED" and s.peer}
        held[i] = peers
        count.update(peers)
    asks: dict[tuple[str, str], list[int]] = {}
    for i, peers in held.items():
        best = sorted(((count[p], p) for p in peers if count[p] >= 2), reverse=True)
        if not best or (len(best) > 1 and best[1][0] == best[0][0]):
            continue  # no endpoint shared with another rank, or two equally shared: not told apart
        asks.setdefault(best[0][1], []).append(i)
    out = []
    for key, members in sorted(asks.items()):
        if key in skipped or len(members) < 2:
            continue
        group = [need[i] for i in members]
        owners: dict[str, list[RankSnapshot]] = {}
        for r in group:
            for listener in _listeners(r):
                owners.setdefault(listener, []).append(r)
        listeners = tuple(sorted(lst for lst, who in owners.items() if len(who) == 1))
        if not listeners:
            continue
        port = key[1].rpartition(":")[2]
        host = next((r for r in group for s in r.sockets if s.state == "LISTEN"
                     and s.local.rpartition(":")[2] == port and (s.local == key[1] or s.local.startswith(_WILDCARD))),
                    None)
        asker = host if host is not None else group[0]
        out.append(StoreAsk(store=key[1], node=asker.node, pid=asker.pid, ranks=tuple(group), listeners=listeners,
                            host=host))
    return out


def job_name(ask: StoreAsk) -> str:
    """The job the store's ranks are, named like a job found by MASTER_ADDR:MASTER_PORT (loopback: per node)."""
    return ask.store[:100] + (f" on {ask.node}" if ask.store.startswith(_LOOPBACK) else "")


Known = Mapping[tuple[str, int, int], tuple[int, str, str]]  # (node, pid, start) -> (rank, evidence, job)


def numbers(ask: StoreAsk, named: Mapping[str, object], how: str) -> dict[tuple[str, int, int], tuple[int, str, str]]:
    """(node, pid, start_time) -> (rank, evidence, job) for the ask's ranks that the store's answer names, each
    number once."""
    out: dict[tuple[str, int, int], tuple[int, str, str]] = {}
    for r in ask.ranks:
        got = {(n, lst) for lst in _listeners(r) for n in [named.get(lst)]
               if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 24}
        values = {n for n, _ in got}
        if len(values) != 1:
            continue
        number = values.pop()
        listener = min(lst for _, lst in got)
        out[(r.node, r.pid, r.start_time)] = (number, (
            f"the process group's store ({ask.store[:100]}, {how}): the default group's key for rank {number} "
            f"holds this process's gloo address {listener[:100]}"), job_name(ask))
    taken = Counter(v[0] for v in out.values())
    return {k: v for k, v in out.items() if taken[v[0]] == 1}


def apply(ranks: Sequence[RankSnapshot], known: Known) -> list[RankSnapshot]:
    """The ranks with the store's numbers where it gave one (the spawn argument's number, if it differed, said),
    and the store as their job: what ties ranks that different launchers on different nodes started."""
    out = []
    for r in ranks:
        got = known.get((r.node, r.pid, r.start_time))
        if got is None or not needs_number(r):
            out.append(r)
            continue
        number, evidence, job = got
        if r.rank is not None and r.rank != number:
            evidence += f"; the spawn target's `rank` argument said {r.rank}"
        out.append(dataclasses.replace(r, rank=number, rank_evidence=evidence, job=job,
                                       job_evidence="the store its ranks connect to"))
    return out
