"""The wait graph in words: each vertex's name and where it is, each edge's evidence in a few words, and the
graph's lines under the headline (`ranks 0-6 -> rank 7 (flight: pg 0: seq #40 vs #41; high)`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence

from app.analysis.facts import KINDS, Fact
from app.analysis.fold import RankKey, count_phrase, describe_keys
from app.analysis.frames import clean
from app.analysis.graph import SMALL_JOB, Edge, Vertex, WaitGraph
from app.analysis.p2p import P2PEvidence
from app.analysis.prose.threads import thread_label, thread_where
from app.analysis.prose.waits import operation
from app.analysis.prose.words import where as class_where
from app.analysis.prose.words import who_label, who_short
from app.analysis.tree import StackClass
from app.model import RankSnapshot

if TYPE_CHECKING:
    from app.analysis.divergence import StackEvidence

_CONF = {"high": 0, "medium": 1, "low": 2}
MAX_LINES = 12


def evidence(f: Fact, classes: Sequence[StackClass]) -> str:
    """A fact in a few words, for an edge."""
    from app.analysis.divergence import StackEvidence
    from app.analysis.flight import FlightEvidence
    from app.analysis.iterations import IterationEvidence
    from app.analysis.locks import LockEvidence
    from app.analysis.suspects import WaitEvidence

    k, e = f.kind, f.data
    state = KINDS[k].state
    if state:
        if k == "stopped":
            traced = getattr(e, "traced", ())
            return "stopped: " + ("by a tracer" if traced else "SIGSTOP or job control")
        return state
    if isinstance(e, FlightEvidence):
        if e.stage == "op":
            return f"pg {clean(e.pg, 40)}: #{e.usual} is {clean(e.op, 40)} vs {clean(dict(e.names).get(e.pg, '?'), 40)}"
        if e.stage == "started":
            return f"pg {clean(e.pg, 40)}: GPU started #{e.issued} vs #{e.usual}"
        return f"pg {clean(e.pg, 40)}: seq #{e.issued} vs #{e.usual}"
    if isinstance(e, IterationEvidence):
        if e.order is not None:
            return "iteration order differs"
        if e.name is not None:
            return f"{clean(e.name, 40)}={clean(e.mine, 40)} vs {clean(e.theirs, 40)}"
        return "another loop iteration"
    if isinstance(e, StackEvidence) and e.case != "many":
        c, d = e.mine, e.theirs
        theirs = f"`{d.collective}`" if d.collective else class_where(d).replace("in ", "", 1)
        mine = f"`{c.collective}`" if c.collective else class_where(c).replace("in ", "", 1)
        return clean(f"{theirs} vs {mine}{_past(e)}", 160)
    if isinstance(e, LockEvidence):
        if e.cycle:
            return "its threads are deadlocked on locks"
        return f"blocked on `{clean(e.edge.waiter.key[1], 60)}`" if e.edge is not None else "blocked on a lock"
    if isinstance(e, WaitEvidence):
        return clean(operation(e.wait), 100)
    if k == "p2p_wait":
        call = getattr(e, "call", None)
        if call is None and isinstance(e, P2PEvidence) and e.tags:
            return "send/recv tags differ"
        return call.text() if call is not None else "send/recv deadlock"
    return {"missing_ranks": "not found", "outside_peer": "connections to addresses no inspected node has",
            "network_stall": "sockets stall", "slow_node": "slow node", "launch_differs": "other launch flags",
            "gpu_fault": "GPU fault", "nccl_ras": "NCCL RAS", "native_call": "native call does not return",
            "gil_held": "holds the GIL in native code", "pipe_write": "blocked writing to a full pipe",
            "still_running": "still moving", "node_failed": "node not inspected", "thread_count": "thread count",
            "launch_incomplete": "node ranks without a launcher", "launcher_held": "launcher stopped",
            "rendezvous_differs": "other rendezvous flags", "store_differs": "connects to another store"}.get(k, k.replace("_", " "))


def _past(e: "StackEvidence") -> str:
    """How a class past the end of the others' loop stands to it, in a few words."""
    if e.case == "left_loop":
        return " (it left the loop)"
    if e.case == "left_or_behind":
        return " (left the loop or behind)"
    delta = e.past.delta if e.past is not None else None
    if e.case == "other_iteration" and delta is not None:
        return f" ({abs(delta)} iteration{'s' if abs(delta) != 1 else ''} {'behind' if delta < 0 else 'ahead'})"
    if e.case == "other_iteration":
        return " (another iteration)"
    return ""


def _edge_text(e: Edge, facts: Sequence[Fact], classes: Sequence[StackClass], names: Mapping[str, str],
               states: Mapping[str, str]) -> str:
    if e.lock is not None:
        return f"`{clean(e.lock.waiter.key[1], 60)}` at {e.lock.waiter.frame.location}"
    if e.p2p is not None:
        if e.kind == "collective":
            return f"in `{clean(e.collective, 40)}`, which {names.get(e.waited, e.waited)} has not joined"
        return e.p2p.text()
    if e.link is not None:
        return clean(operation(e.link.wait), 100)
    if e.kind == "child":
        return f"held: {states.get(e.waited, '')}" if e.strength == "high" else "waits on its child"
    if e.kind == "rendezvous":
        return "no rank started below it"
    if 0 <= e.fact < len(facts):
        return evidence(facts[e.fact], classes)
    return e.kind


def name_vertices(vertices: Sequence[Vertex], classes: Sequence[StackClass], by_key: Mapping[RankKey, RankSnapshot],
                  total: int) -> List[Vertex]:
    by_index = {c.index: c for c in classes}
    out = []
    for v in vertices:
        label, doing = v.label, v.doing
        if v.kind == "job":
            rest = len(v.who.keys) if total <= SMALL_JOB else total - sum(1 for x in vertices if x.kind == "ranks")
            if total <= SMALL_JOB:
                label = describe_keys(v.who.keys, v.who.numbers) if v.who.keys else "the other ranks"
            else:
                label = f"the other {count_phrase(max(rest, 0))}"
        elif v.kind == "ranks":
            label = who_label(v.who)
            c = by_index.get(v.class_index) if v.class_index is not None else None
            doing = class_where(c) if c is not None else ""
        elif v.kind == "thread":
            r = by_key.get(v.ranks[0]) if v.ranks else None
            who = (f"rank {r.rank}" if r.rank is not None else f"pid {r.pid}") if r is not None else "a rank"
            t = next((t for t in r.threads if t.tid == v.tid), None) if r is not None else None
            label = f"{who}'s {thread_label(t)}" if t is not None else f"{who}'s thread {v.tid}"
            doing = f"in {thread_where(t)}" if t is not None else ""
        elif v.kind == "process":
            if v.owner is not None:
                label = clean(f"rank {v.owner}'s {v.name or 'child'} pid {v.pid}", 160)
            elif v.name in ("torchrun", "deepspeed", "accelerate", "srun", "mpirun", "python", "launcher"):
                label = clean(f"{v.name} pid {v.pid}" + (f" on {v.nodes[0]}" if v.nodes else ""), 160)
            else:
                label = clean(f"pid {v.pid} `{v.name}`" + (f" on {v.nodes[0]}" if v.nodes else ""), 160)
        elif v.kind == "host":
            label = (clean(", ".join(v.who.nodes), 160) + " (outside the hosts list)" if v.who.nodes and v.who.addresses
                     else clean(", ".join(v.who.nodes), 160) if v.who.nodes
                     else clean(v.address or ", ".join(v.who.addresses), 120) + " (outside the job)")
        elif v.kind == "missing":
            label = (f"{who_short(v.who)} (not found" + (f" on {', '.join(v.who.nodes)}" if v.who.nodes else "") + ")"
                     if v.who.numbers else "nodes that have not joined its rendezvous")
        elif v.kind == "person":
            label = "someone at its terminal"
        out.append(replace(v, label=label, doing=doing))
    return out


def short(v: Vertex) -> str:
    """A vertex's label without its nodes: `rank 7`, `ranks 0-6`, `rank 3` (missing), `node02`."""
    if v.kind == "missing":
        return v.label.split(" (", 1)[0]
    if v.kind in ("ranks", "job"):
        return v.label.split(" on ", 1)[0]
    return v.label


def display_names(vertices: Sequence[Vertex]) -> Dict[str, str]:
    """Vertex id -> its short name; in a wait among a rank's threads, the rank's own vertex is its main thread."""
    threads = {v.ranks for v in vertices if v.kind == "thread"}
    return {v.id: f"{short(v)}'s main thread" if v.kind == "ranks" and v.ranks in threads else short(v)
            for v in vertices}


def name_graph(g: WaitGraph, facts: Sequence[Fact], classes: Sequence[StackClass],
               by_key: Mapping[RankKey, RankSnapshot], total: int) -> WaitGraph:
    vertices = name_vertices(g.vertices, classes, by_key, total)
    names = display_names(vertices)
    states = {v.id: v.state for v in vertices}
    edges = tuple(replace(e, evidence=_edge_text(e, facts, classes, names, states)) for e in g.edges)
    return replace(g, vertices=tuple(vertices), edges=edges)


def graph_lines(g: WaitGraph, limit: int = MAX_LINES) -> List[str]:
    if g.progressing:
        return ["nobody: the job is progressing between samples"]
    names = display_names(g.vertices)
    on_chain = set(g.chain) | set(g.root)
    pairs: Dict[tuple, List[Edge]] = {}
    for e in g.edges:  # one line per pair of vertices, its kinds of evidence together
        pairs.setdefault((e.waiter, e.waited), []).append(e)
    rows = sorted(pairs.values(), key=lambda es: (es[0].waited not in on_chain, es[0].waiter not in on_chain,
                                                  min(_CONF[e.strength] for e in es)))
    out = []
    for es in rows[:limit]:
        strength = min((e.strength for e in es), key=_CONF.__getitem__)
        why = "; ".join(f"{e.kind}: {clean(e.evidence, 120)}" for e in es)
        out.append(f"{clean(names.get(es[0].waiter, es[0].waiter), 120)} -> "
                   f"{clean(names.get(es[0].waited, es[0].waited), 120)} ({why}; {strength})")
    if len(rows) > limit:
        out.append(f"... {len(rows) - limit} more")
    if g.headline:
        out.append(f"culprit ({g.confidence}): {g.headline}")
    if g.next:
        out.append(f"next: {g.next}")
    return out


def shown(graphs: Sequence[WaitGraph]) -> List[WaitGraph]:
    """The graphs a report shows a block for: those with a wait in them, or a job seen progressing."""
    return [g for g in graphs if g.edges or g.progressing]


def vertex_of(g: WaitGraph, vid: str) -> Optional[Vertex]:
    return g.vertex(vid)
