"""The one culprit of a job, computed once from the calibrated wait graph; every screen and report reads it.

`Culprit.who` is who the rest of the job waits for: the rank processes at the end of the graph's chain (a thread's
or a child's rank when the root is a thread or a process of theirs), else the root itself (ranks not found, a
node, an address outside the snapshot). `links` is that rank's own chain of waits (blocking operation, resource,
who can release it, to the root), `fact` the evidence the headline speaks of, and `others` where the rest of the
job waits. A job that progresses, or one where nothing names a culprit, has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from app.analysis.facts import Confidence, Fact, Who
from app.analysis.fold import RankKey
from app.analysis.graph import WaitGraph
from app.analysis.release import Link
from app.analysis.tree import StackClass
from app.model import RankSnapshot


@dataclass(frozen=True)
class Culprit:
    who: Who
    fact: Fact  # the root's best evidence, calibrated
    strength: Confidence
    root: Tuple[str, ...] = ()  # the wait graph's root vertices (several: a deadlock)
    chain: Tuple[str, ...] = ()
    deadlock: bool = False
    links: Tuple[Link, ...] = ()  # the culprit rank's main thread's chain of waits
    rank: Optional[RankSnapshot] = None  # the culprit, when it is one rank process
    others: Optional[StackClass] = None  # the class the rest of the job waits in, when it is not the culprit's

    @property
    def ranks(self) -> Tuple[RankKey, ...]:
        """The rank processes to mark and start the cursor on."""
        return self.who.keys


def _round(links: Tuple[Link, ...]) -> bool:
    """Whether a chain of waits ends back at another rank's wait for its first (release.chain's "cycle")."""
    return bool(links) and bool(links[-1].release.parties) and links[-1].release.parties[0].role == "cycle" \
        and links[-1].release.parties[0].kind == "rank"


def find(graph: WaitGraph, best: Optional[Fact], chains: Dict[RankKey, Tuple[Link, ...]],
         by_key: Dict[RankKey, RankSnapshot], classes: Sequence[StackClass]) -> Optional[Culprit]:
    """The culprit from the calibrated graph (None when the job progresses or nothing names one)."""
    if best is None or graph.progressing or not best.culprit:
        return None
    vertices = {v.id: v for v in graph.vertices}
    path = list(graph.chain) + [v for v in graph.root if v not in graph.chain]
    ranked = [vertices[v] for v in path if v in vertices and vertices[v].kind in ("ranks", "thread") and
              vertices[v].ranks]
    if ranked:
        keys: Tuple[RankKey, ...] = tuple(dict.fromkeys(k for v in ranked[-1:] for k in v.ranks))
        if graph.deadlock:
            keys = tuple(dict.fromkeys(k for v in ranked for k in v.ranks))
        rs = [by_key.get(k) for k in keys]
        who = Who(keys, tuple(r.rank if r is not None else None for r in rs), tuple(dict.fromkeys(k[0] for k in keys)))
    elif graph.root and graph.root[0] in vertices:
        who = vertices[graph.root[0]].who
    else:
        who = best.who
    # one rank, or several that share one stack (a class): its first rank's wait speaks for them
    alike = len(who.keys) == 1 or any(set(who.keys) <= set(c.ranks) for c in classes[1:]) or (
        bool(classes) and len(who.keys) < classes[0].size and set(who.keys) <= set(classes[0].ranks[:4096]))
    first = who.keys[0] if who.keys and alike else None
    rank = by_key.get(first) if first is not None else None
    links = chains.get(first, ()) if first is not None else ()
    if graph.deadlock and first is None:
        # ranks that wait for each other (one holds what the other waits for, and waits in a collective for it): the
        # chain that goes round the cycle speaks for them, from the rank it starts at
        first = next((k for k in who.keys if _round(chains.get(k, ()))), None) or \
            next((k for k in who.keys if chains.get(k)), None)
        rank = by_key.get(first) if first is not None else None
        links = chains.get(first, ()) if first is not None else ()
    others = classes[0] if classes and not (set(who.keys) & set(classes[0].ranks[:4096])) else None
    return Culprit(who, best, best.strength, graph.root, graph.chain, graph.deadlock, links, rank, others)
