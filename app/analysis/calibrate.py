"""One calibration step: the facts weighed against progress, process state and the wait graph, and the culprit.

In order, each rule a class of evidence against another, never a case:

1. A rank held by its state (stopped, frozen: the kernel's word) means the job as a whole is not progressing,
   whatever other ranks do.
2. When the samples show the job progressing, a position read off one sample's stacks is no lead (a running
   job's ranks are caught anywhere) and a stall read into one sample is contradicted.
3. A network stall named on nodes whose ranks' sockets moved bytes to their peers between samples is
   contradicted by them.
4. A held rank silences its sockets and holds the others by itself: "the network" and "all at one place" are
   its consequences, not evidence of their own.
5. A slow node in a job where nothing moves between samples is no lead (it would slow the job, not stop it); a
   slow node whose ranks were launched with other flags: the flags are the likely reason (attached); a slow
   node where a rank spins: the spin takes the node's CPU, the node is not slow by itself.
6. GPU evidence is weighed against the other surest suspects: agreeing evidence is said, a [high] GPU fact
   naming other ranks drops to [medium].
7. The wait graph: when the job progresses there is no root and no [high] suspect; else the root is the terminal
   component that the strongest evidence leads to (confidence first, then process state before locks and
   sequence numbers, before stacks, before the network), then the most kinds of evidence agreeing; a [high]
   fact whose suspect neither leads to the root nor overlaps it is contradicted and becomes [medium], and two
   equally strong roots that disagree are both [medium]. The kernel's word on a process is never weakened.

The result is the calibrated facts, the graph with its root and chain, and the fact the headline speaks of.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Set, Tuple

from app.analysis.facts import KINDS, OBSERVED_TIER, STRENGTH, Caveat, Fact, Who, position, rank_of_fact
from app.analysis.graph import Builder, Vertex, WaitGraph
from app.analysis.launch import LaunchEvidence
from app.analysis.progress import RankProgress, SlowEvidence
from app.analysis.suspects import WaitEvidence

__all__ = ["Calibrated", "calibrate", "before_graph"]


@dataclass(frozen=True)
class Calibrated:
    facts: Tuple[Fact, ...]
    graph: WaitGraph
    best: Optional[Fact]  # the fact the headline speaks of (None: nothing names a culprit)
    best_index: int = -1


def before_graph(facts: Sequence[Fact], progress: Sequence[RankProgress]) -> List[Fact]:
    """Rules 2-6: the facts weighed against progress, held states, launch flags and each other."""
    out = list(facts)
    moving = any(f.kind == "progressing" for f in out)
    if moving:  # 2
        out = [f.weakened("low", Caveat("progressing")) if f.info.one_sample and f.culprit
               else f.weakened("low", Caveat("progressing_stall")) if f.info.stall else f for f in out]
    if moving and progress:  # 2b
        # a rank that moved between the last two samples went on after the D state it was caught in (a page
        # fault, a disk read): a process state is the kernel's word, but of one moment
        passed = {(p.node, p.pid) for p in progress if p.status == "progressing"}
        out = [f.weakened("low", Caveat("passing", f.who)) if f.kind == "uninterruptible" and f.culprit
               and f.who.keys and set(f.who.keys) <= passed else f for f in out]
    if progress:  # 3
        moved = {p.node for p in progress if p.net_bytes}
        out = [f.weakened("medium", Caveat("sockets_moved", Who(nodes=f.who.nodes)))
               if f.kind == "network_stall" and f.strength == "high" and f.who.nodes and set(f.who.nodes) <= moved
               else f for f in out]
    held = [f for f in out if f.kind in ("stopped", "frozen") and f.culprit]
    if held:  # 4
        out = [f.weakened("low", Caveat("held", held[0].who, held[0].kind), culprit=False)
               if f.info.explained_by_state else f for f in out]
    if progress and not moving and not any(p.status in ("progressing", "waiting", "slow") for p in progress):
        # nothing moves between samples: a node short of CPU does not stop a job, it slows it (its ranks' wait
        # for a CPU is the machine's load then, not the cause)
        out = [f.weakened("low", Caveat("not_moving")) if f.kind == "slow_node" else f for f in out]
    spinning = {k[0]: f for f in out if f.kind == "blocked" and f.culprit and isinstance(f.data, WaitEvidence)
                and f.data.wait.state == "spinning" for k in f.who.keys}
    if spinning:  # a rank spinning on a node takes that node's CPU: the node's shortage is the spin's doing
        out = [f.weakened("low", Caveat("spinning", spinning[f.who.nodes[0]].who))
               if f.kind == "slow_node" and f.who.nodes and f.who.nodes[0] in spinning else f for f in out]
    launched = [f for f in out if f.kind == "launch_differs" and isinstance(f.data, LaunchEvidence)]
    if launched:  # 5
        out = [_with_flags(f, launched) if f.kind == "slow_node" else f for f in out]
    return [_against(f, out) if f.kind in ("gpu_fault", "nccl_ras") else f for f in out]  # 6


def _with_flags(f: Fact, launched: Sequence[Fact]) -> Fact:
    match = next((m for m in launched if f.who.keys and set(f.who.keys) <= set(m.who.keys)), None)
    if match is None or not isinstance(f.data, SlowEvidence):
        return f
    return replace(f, data=replace(f.data, flags=match.data))


def _against(g: Fact, facts: Sequence[Fact]) -> Fact:
    if not g.culprit or not g.who.keys:
        return g
    mine = set(g.who.keys)
    others = [f for f in facts if f.culprit and f.strength == "high" and f.who.keys
              and f.kind not in ("gpu_fault", "nccl_ras", "progressing")]
    if not others:
        return g
    if any(mine & set(f.who.keys) for f in others):
        return g.noted(Caveat("agrees", others[0].who, others[0].kind))
    if g.strength != "high":
        return g
    return g.weakened("medium", Caveat("disagrees", others[0].who, others[0].kind))


def _reach(adj: Dict[str, List[str]], start: str) -> Set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for nxt in adj.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _path(adj: Dict[str, List[str]], start: str, goal: Set[str]) -> List[str]:
    prev: Dict[str, Optional[str]] = {start: None}
    todo = [start]
    while todo:
        at = todo.pop(0)
        if at in goal:
            out = [at]
            while prev[out[-1]] is not None:
                out.append(prev[out[-1]])  # type: ignore[arg-type]
            return out[::-1]
        for nxt in adj.get(at, ()):
            if nxt not in prev:
                prev[nxt] = at
                todo.append(nxt)
    return [start]


def _agree(a: Vertex, b: Vertex) -> bool:
    """Two suspects that speak of the same processes (or, for a host, the same node): by their typed subjects,
    node names one by one."""
    if a.id == b.id:
        return True
    if a.ranks and b.ranks and not set(a.ranks).isdisjoint(b.ranks):
        return True
    if a.numbers and b.numbers and not set(a.numbers).isdisjoint(b.numbers):
        return True
    host = a.kind in ("host", "missing") or b.kind in ("host", "missing")
    return host and bool(a.nodes) and bool(b.nodes) and not set(a.nodes).isdisjoint(b.nodes)


def calibrate(facts: Sequence[Fact], b: Builder) -> Calibrated:
    """Rules 1 and 7 over the graph `b` (its facts' edges already added): the calibrated facts, the graph with
    its root, and the fact the headline speaks of."""
    facts = list(facts)
    progressing = next((i for i, f in enumerate(facts) if f.kind == "progressing" and f.strength != "low"), None)
    held = [f for f in facts if f.culprit and f.kind in ("stopped", "frozen") and f.strength == "high"]
    if progressing is not None and held:  # 1
        facts[progressing] = facts[progressing].weakened("low", Caveat("not_progressing", held[0].who, held[0].kind))
        progressing = None
    edges = list(b.edges)
    vertices = dict(b.vertices)

    if progressing is not None:  # 7, a moving job
        eased = [f.weakened("medium", Caveat("eased")) if f.culprit and f.strength == "high" and not f.info.moving
                 else f for f in facts]
        graph = WaitGraph(tuple(vertices.values()), tuple(edges), progressing=True)
        return Calibrated(tuple(eased), graph, eased[progressing], progressing)

    adj: Dict[str, List[str]] = {}
    for e in edges:
        if e.strength != "low":  # a weak edge is shown, but does not move the blame
            adj.setdefault(e.waiter, []).append(e.waited)
    suspects = [(i, vid) for i, vid in b.of_fact.items()]
    if not suspects:
        return Calibrated(tuple(facts), WaitGraph(tuple(vertices.values()), tuple(edges)), None)
    reach = {vid: _reach(adj, vid) for vid in set(vertices)}
    terminal: Dict[str, Tuple[str, ...]] = {}  # vertex -> its terminal component (sorted ids)
    for vid, r in reach.items():
        if all(vid in reach[w] for w in r):
            terminal[vid] = tuple(sorted(w for w in r if vid in reach[w]))
    components = sorted(set(terminal.values()))
    support: Dict[Tuple[str, ...], List[int]] = {c: [] for c in components}
    for i, vid in suspects:
        for c in components:
            if not reach[vid].isdisjoint(c):
                support[c].append(i)

    def key(i: int) -> Tuple[int, int]:
        return rank_of_fact(facts[i])

    # among equally strong facts, the kinds' order (the more specific cause first), then the order they were made in
    ranked = sorted((c for c in components if support[c]),
                    key=lambda c: (min(map(key, support[c])), -len({facts[i].kind for i in support[c]}),
                                   min((position(facts[i].kind), i) for i in support[c]
                                       if key(i) == min(map(key, support[c]))),
                                   c))
    root = ranked[0]
    # a root of other ranks (not a rank's own thread or child): a fact about a rank that only leads there speaks
    # of one that waits for the root (a send to a peer that receives from someone else), not of its cause
    of_ranks = all(vertices[v].kind == "ranks" for v in root)

    def inside(i: int) -> bool:
        return any(_agree(vertices[b.of_fact[i]], vertices[v]) for v in root)

    best_i = min(support[root], key=lambda i: (of_ranks and not inside(i), key(i), i))
    best = facts[best_i]
    start = b.of_fact[best_i]
    chain = tuple(_path(adj, start, set(root)))
    on_root = [vertices[v] for v in set(chain) | set(root)]
    rivals = [c for c in ranked[1:] if min(map(key, support[c])) == key(best_i) and best.strength == "high"
              and key(best_i)[1] > OBSERVED_TIER and not any(_agree(vertices[v], w) for v in c for w in on_root)]
    root_who = _who_of(vertices, root)
    out: List[Fact] = []
    for i, f in enumerate(facts):
        fvid = b.of_fact.get(i)
        if fvid is None or f.strength != "high" or KINDS[f.kind].tier <= OBSERVED_TIER:
            out.append(f)  # the kernel's word on a process: another root does not make it less true
            continue
        mine = vertices[fvid]
        leads = not reach[fvid].isdisjoint(root) or any(_agree(mine, w) for w in on_root)
        if leads and of_ranks and f.culprit and not inside(i) and inside(best_i):
            out.append(f.weakened("medium", Caveat("upstream", root_who, best.kind)))
        elif not leads and any(not reach[fvid].isdisjoint(c) for c in rivals):
            out.append(f.weakened("medium", Caveat("rival", root_who, best.kind)))
        elif not leads:
            out.append(f.weakened("medium", Caveat("root_elsewhere", root_who, best.kind)))
        elif rivals:
            out.append(f.weakened("medium", Caveat("rival", _who_of(vertices, rivals[0]))))
        else:
            out.append(f)
    best = out[best_i]
    graph = WaitGraph(tuple(vertices.values()), tuple(edges), root, chain, len(root) > 1, best.strength)
    return Calibrated(tuple(out), graph, best, best_i)


def _who_of(vertices: Dict[str, Vertex], component: Sequence[str]) -> Who:
    whos = [vertices[v].who for v in component]
    if len(whos) == 1:
        return whos[0]
    keys = tuple(k for w in whos for k in w.keys)
    return Who(keys, tuple(n for w in whos for n in w.numbers[:len(w.keys)] if w.keys),
               tuple(dict.fromkeys(n for w in whos for n in w.nodes)))


def strongest(facts: Sequence[Fact]) -> int:
    return min((STRENGTH[f.strength] for f in facts), default=3)
