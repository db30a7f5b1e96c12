"""Who waits for whom: the wait graph of one job, built from typed facts and the threads' waits, never from text.

Vertices are what can be waited for: the rest of the job, sets of ranks, threads of a rank, processes beside the
ranks (children, launchers), hosts outside the snapshot, ranks that were not found. An edge A -> B says "A
waits for B", with its kind of evidence and how strong it is:

- every culprit fact: the rest of the job waits for its subject (KINDS[kind].edge names the edge);
- a lock: a thread blocked entering a `with` block waits for the thread inside it (locks.py);
- point-to-point calls: a rank in recv(src=3) waits for rank 3 unless rank 3 is in the matching send; the peer,
  waiting in a collective the first has not joined, waits for it back (p2p.py);
- the wait model (blocking.py, release.py): a suspect's thread waits for whoever can release it: a thread of its
  process, a child process, a host at a socket's other end, a person at a terminal. Edges whose releaser is
  certain (a lock's holder, a joined thread, a pipe's writer, a file lock's holder, a socket's peer, a waited
  child) are strong; candidates (which thread would set an event) are weak and never move the blame;
- children a suspect waits on (a DataLoader queue, a subprocess), held by their state; launchers with no rank
  below them wait for the nodes that have not joined their rendezvous.

The graph is small (one vertex per suspect, not per rank): the rest of the job is one vertex, so 100k ranks cost
what 8 do. Root selection and calibration are app/analysis/calibrate.py's; labels and sentences are the text
layer's (prose.graph).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from app.analysis.blocking import ThreadWait
from app.analysis.facts import KINDS, NOBODY, Confidence, Fact, Who
from app.analysis.fold import RankKey
from app.analysis.locks import LockEvidence, lock_edges
from app.analysis.p2p import P2P, P2PCall, matched
from app.analysis.processes import HeldLauncherEvidence, held_state
from app.analysis.release import Link, Party, certain
from app.analysis.tree import StackClass
from app.model import JobProcess, RankSnapshot

SMALL_JOB = 512  # up to this many ranks the rest of the job is labelled rank by rank; beyond, counted


@dataclass(frozen=True)
class Vertex:
    """Something that can be waited for. `ranks`: the rank processes it stands for (a thread: its rank's)."""

    id: str
    kind: str  # job (the rest of the job), ranks, thread, process, host, missing, person
    label: str = ""  # written by the text layer
    ranks: Tuple[RankKey, ...] = ()
    numbers: Tuple[int, ...] = ()
    nodes: Tuple[str, ...] = ()
    state: str = ""  # stopped, frozen, exited, in D state: what holds it, whatever its stack shows
    doing: str = ""  # where it is, written by the text layer: "in `next_batch` (loader.py:31)"
    who: Who = field(default_factory=Who)
    tid: Optional[int] = None  # a thread
    pid: Optional[int] = None  # a process that is not a rank
    name: str = ""  # a thread's name, a process's command (remote text)
    class_index: Optional[int] = None
    address: str = ""  # a host
    owner: Optional[int] = None  # a child process: the rank number of the rank it belongs to


@dataclass(frozen=True)
class Edge:
    """`waiter` waits for `waited` (vertex ids), because of a fact (`fact`: its index) or a link of the wait
    model (`link`); `evidence` is the text layer's short account of it."""

    waiter: str
    waited: str
    kind: str  # state, lock, p2p, collective, flight, iteration, stacks, missing, outside, network, blocked, ...
    strength: Confidence
    finding: str = ""  # the kind of the fact it rests on; "" when the graph read it from the stacks itself
    evidence: str = ""
    fact: int = -1
    link: Optional[Link] = None
    p2p: Optional[P2PCall] = None
    lock: Any = None  # locks.LockEdge
    collective: str = ""  # a collective the waiter is in (a p2p peer waiting back)


@dataclass(frozen=True)
class WaitGraph:
    vertices: Tuple[Vertex, ...] = ()
    edges: Tuple[Edge, ...] = ()
    root: Tuple[str, ...] = ()  # the culprit: one vertex, or the vertices of a cycle (a deadlock)
    chain: Tuple[str, ...] = ()  # from the best-supported suspect to the root
    deadlock: bool = False
    confidence: Optional[Confidence] = None  # the root's, after calibration
    progressing: bool = False  # the samples show the job moving: no culprit
    headline: str = ""  # who, what it is doing, why the others wait (the text layer's)
    next: str = ""  # what to run or change next (the text layer's)
    job: str = ""  # which job, when the snapshot holds several

    def vertex(self, vid: str) -> Optional[Vertex]:
        return next((v for v in self.vertices if v.id == vid), None)

    def to_dict(self) -> Dict[str, Any]:
        return {"job": self.job, "root": list(self.root), "chain": list(self.chain), "deadlock": self.deadlock,
                "confidence": self.confidence, "progressing": self.progressing, "headline": self.headline,
                "next": self.next,
                "vertices": [{"id": v.id, "kind": v.kind, "label": v.label, "ranks": [list(k) for k in v.ranks[:64]],
                              "ranks_total": len(v.ranks), "numbers": list(v.numbers[:64]), "nodes": list(v.nodes),
                              "state": v.state, "doing": v.doing} for v in self.vertices],
                "edges": [{"waiter": e.waiter, "waited": e.waited, "kind": e.kind, "evidence": e.evidence,
                           "strength": e.strength, "finding": e.finding} for e in self.edges]}


@dataclass
class Builder:
    """Accumulates vertices and edges; `of_fact` maps a fact's index to its suspect vertex."""

    ranks: Sequence[RankSnapshot]
    keys: Sequence[RankKey]
    numbers: Sequence[Optional[int]]
    classes: Sequence[StackClass]
    by_key: Optional[Dict[RankKey, RankSnapshot]] = None
    vertices: Dict[str, Vertex] = field(default_factory=dict)
    ids: Dict[Tuple[Any, ...], str] = field(default_factory=dict)
    edges: List[Edge] = field(default_factory=list)
    of_fact: Dict[int, str] = field(default_factory=dict)
    _number: Optional[Dict[RankKey, Optional[int]]] = None

    def __post_init__(self) -> None:
        self.vertices["job"] = Vertex("job", "job")

    def rank_of(self, k: RankKey) -> Optional[RankSnapshot]:
        if self.by_key is None:
            self.by_key = dict(zip(self.keys, self.ranks))
        return self.by_key.get(k)

    def number(self, k: RankKey) -> Optional[int]:
        if self.by_key is not None:  # analyze() made it already: no new table of every rank
            r = self.by_key.get(k)
            return r.rank if r is not None else None
        if self._number is None:
            self._number = dict(zip(self.keys, self.numbers))
        return self._number.get(k)

    def _id(self, ident: Tuple[Any, ...]) -> str:
        vid = self.ids.get(ident)
        if vid is None:
            vid = self.ids[ident] = f"v{len(self.ids) + 1}"
        return vid

    def rank_vertex(self, keys: Sequence[RankKey], state: str = "", class_index: Optional[int] = None) -> str:
        keys = tuple(sorted(set(keys)))
        vid = self._id(("ranks", keys))
        old = self.vertices.get(vid)
        if old is None:
            numbers = tuple(map(self.number, keys))
            self.vertices[vid] = Vertex(vid, "ranks", ranks=keys, numbers=tuple(n for n in numbers if n is not None),
                                        nodes=tuple(sorted({k[0] for k in keys})), state=state,
                                        who=Who(keys, numbers, tuple(dict.fromkeys(k[0] for k in keys))),
                                        class_index=class_index if class_index is not None else self._class(keys))
        elif state and not old.state:
            self.vertices[vid] = replace(old, state=state)
        return vid

    def _class(self, keys: Sequence[RankKey]) -> Optional[int]:
        """The class these ranks are in (minority classes first: they are small)."""
        if not keys:
            return None
        first = keys[0]
        for c in self.classes[1:]:
            if first in c.ranks:
                return c.index
        if self.classes and len(keys) <= self.classes[0].size and first in self.classes[0].ranks:
            return self.classes[0].index
        return None

    def thread_vertex(self, r: RankSnapshot, tid: Optional[int]) -> str:
        key = (r.node, r.pid)
        rank_id = self.rank_vertex([key])
        t = next((t for t in r.threads if t.tid == tid), None)
        if t is None or t is r.main_thread:
            return rank_id  # a rank's main thread is the rank
        vid = self._id(("thread", key, tid))
        if vid not in self.vertices:
            self.vertices[vid] = Vertex(vid, "thread", ranks=(key,), numbers=(r.rank,) if r.rank is not None else (),
                                        nodes=(r.node,), who=Who((key,), (r.rank,), (r.node,), tid=tid), tid=tid,
                                        name=t.name)
        return vid

    def other_vertex(self, kind: str, ident: Tuple[Any, ...], who: Who = NOBODY, **kw: Any) -> str:
        vid = self._id((kind,) + ident)
        if vid not in self.vertices:
            self.vertices[vid] = Vertex(vid, kind, numbers=tuple(n for n in who.numbers if n is not None),
                                        nodes=who.nodes, who=who, **kw)
        return vid

    def edge(self, waiter: str, waited: str, kind: str, strength: Confidence, finding: str = "", fact: int = -1,
             **kw: Any) -> None:
        if waiter == waited:
            return
        for e in self.edges:
            if e.waiter == waiter and e.waited == waited and e.kind == kind:
                return
        self.edges.append(Edge(waiter, waited, kind, strength, finding, fact=fact, **kw))

    # --- evidence ---------------------------------------------------------------------------------------

    def fact(self, i: int, f: Fact) -> None:
        """A culprit fact: the rest of the job waits for its subject."""
        if not f.culprit or f.kind in ("progressing", "several_jobs"):
            return
        vid = self.suspect(f)
        if vid is None:
            return
        self.of_fact[i] = vid
        self.edge("job", vid, KINDS[f.kind].edge, f.strength, f.kind, i)
        if f.kind == "lock_wait" and isinstance(f.data, LockEvidence) and len(f.who.keys) == 1:
            self.locks(f, i)

    def suspect(self, f: Fact) -> Optional[str]:
        state = KINDS[f.kind].state
        who = f.who
        if f.kind == "p2p_wait" and who.keys:
            return self.rank_vertex(who.keys[:1])  # the calls' own edges (p2p()) lead on from its first rank
        if who.keys:
            return self.rank_vertex(who.keys, state, f.class_index)
        if who.missing and who.numbers:
            return self.other_vertex("missing", ("numbers", who.numbers[:64]), who)
        if who.pid is not None and who.nodes:  # a process beside the ranks (a launcher), as processes() names it
            return self.other_vertex("process", (who.nodes[0], who.pid), who, pid=who.pid,
                                     name=f.data.launcher.kind if isinstance(f.data, HeldLauncherEvidence)
                                     else "process", state=state)
        if who.nodes or who.addresses:
            return self.other_vertex("host", ("nodes", who.nodes, who.addresses), who)
        return None

    def locks(self, f: Fact, i: int) -> None:
        r = self.rank_of(f.who.keys[0])
        if r is None:
            return
        for e in lock_edges(r):
            if e.holder is None:
                continue
            a = self.thread_vertex(r, e.waiter.thread.tid)
            b = self.thread_vertex(r, e.holder.tid)
            self.edge(a, b, "lock", f.strength, f.kind, i, lock=e)

    def waits(self, r: RankSnapshot, links: Sequence[Link], i: int) -> None:
        """A suspect rank's chain of waits (release.chain): each step waits for the party that can release it.
        Certain releasers make strong edges; candidates weak ones, shown but not moving the blame."""
        prev = self.rank_vertex([(r.node, r.pid)])
        for link in links:
            at = self._party_vertex(r, link.who) or prev
            sure = certain(link.wait, link.release)
            parties = link.release.parties[:3]
            for n, p in enumerate(parties):
                if p.same:
                    continue
                target = self._party_vertex(r, p)
                if target is None:
                    continue
                self.edge(at, target, "blocked", _strength(sure, n, p), "blocked", i, link=link)
            prev = at

    def _party_vertex(self, r: RankSnapshot, p: Party) -> Optional[str]:
        if p.kind == "thread" and p.pid == r.pid and p.node == r.node:
            return self.thread_vertex(r, p.tid)
        if p.kind == "thread" or p.kind == "rank":
            other = next((x for x in self.ranks if x.node == p.node and x.pid == p.pid), None) if p.pid else None
            if other is not None:
                return self.rank_vertex([(other.node, other.pid)])
            return None
        if p.kind == "process":
            mine = p.node == r.node and p.role in ("child", "worker", "producer")
            return self.other_vertex("process", (p.node, p.pid), Who(nodes=(p.node,) if p.node else (), pid=p.pid),
                                     pid=p.pid, name=p.what or p.name, state=p.state,
                                     owner=r.rank if mine and r.rank is not None else None)
        if p.kind == "host":
            return self.other_vertex("host", ("address", p.address), Who(nodes=(p.node,) if p.node else (),
                                                                          addresses=(p.address,)), address=p.address)
        if p.kind == "person":
            return self.other_vertex("person", ("person",), NOBODY)
        return None

    def p2p(self, calls: Sequence[P2PCall], fact_of: Dict[RankKey, int]) -> None:
        """Unmatched point-to-point calls: the caller waits for its peer; a peer that waits in a collective the
        caller has not joined waits for it back (a mismatch: both wait)."""
        if not calls:
            return
        by_number = {c.rank: c for c in calls if c.rank is not None}
        peers = {c.peer for c in calls if c.peer is not None}
        where_key: Dict[int, RankKey] = {}
        for k, n in zip(self.keys, self.numbers):
            if n in peers and n is not None and n not in where_key:
                where_key[n] = k
        for c in calls:
            if c.peer is None or matched(c, by_number.get(c.peer)):
                continue
            peer_key = where_key.get(c.peer)
            if peer_key is None:
                continue
            a, b = self.rank_vertex([c.key]), self.rank_vertex([peer_key])
            both = c.peer in by_number
            i = fact_of.get(c.key, -1)
            self.edge(a, b, "p2p", "high" if both else "medium", "p2p_wait", i, p2p=c)
            if not both:
                peer_class = next((x for x in self.classes if peer_key in x.ranks[:SMALL_JOB] or
                                   (x.size > SMALL_JOB and peer_key in x.ranks)), None)
                if peer_class is not None and peer_class.collective and peer_class.collective not in P2P:
                    self.edge(b, a, "collective", "medium", "p2p_wait", i, p2p=c, collective=peer_class.collective)

    def processes(self, processes: Sequence[JobProcess]) -> None:
        """A suspect rank that waits on its children (a DataLoader queue, a subprocess, a pool) waits for them;
        a child held by its state is what it waits for. A launcher with no rank below it waits for a rendezvous
        that nodes never joined."""
        suspects = {v.ranks[0]: v.id for v in list(self.vertices.values()) if v.kind == "ranks" and len(v.ranks) == 1}
        held: Dict[str, List[JobProcess]] = defaultdict(list)  # per job, its launchers without ranks that cannot run
        for p in processes[:4096]:
            if p.role == "launcher" and not p.of and held_state(p):
                held[p.job].append(p)
        for p in processes[:4096]:
            if p.role == "child" and suspects:
                for rank_pid in p.of:
                    owner = suspects.get((p.node, rank_pid))
                    r = self.rank_of((p.node, rank_pid)) if owner else None
                    if owner is None or r is None or not waits_on_children(r):
                        continue
                    state = process_state(p)
                    vid = self.other_vertex("process", (p.node, p.pid), Who(nodes=(p.node,), pid=p.pid), pid=p.pid,
                                            name=p.kind or "child", state=state,
                                            owner=r.rank if r.rank is not None else None)
                    self.edge(owner, vid, "child", "high" if state else "low")
            elif p.role == "launcher" and not p.of:
                vid = self.other_vertex("process", (p.node, p.pid), Who(nodes=(p.node,), pid=p.pid), pid=p.pid,
                                        name=p.kind or "launcher", state=process_state(p))
                if held_state(p):
                    continue  # what the rendezvous waits for, not a waiter
                for q in held.get(p.job, ())[:8]:  # a launcher of the job that cannot run: the rendezvous waits for it
                    self.edge(vid, self.other_vertex("process", (q.node, q.pid), Who(nodes=(q.node,), pid=q.pid),
                                                     pid=q.pid, name=q.kind or "launcher", state=process_state(q)),
                              "rendezvous", "high")
                if p.job not in held:
                    gone = self.other_vertex("missing", ("rendezvous",), NOBODY)
                    self.edge(vid, gone, "rendezvous", "medium")

    def finish(self) -> None:
        """The rest of the job: the ranks no other vertex names."""
        named: Set[RankKey] = set()
        for v in self.vertices.values():
            if v.kind in ("ranks", "thread"):
                named.update(v.ranks)
        total = len(self.keys)
        if total <= SMALL_JOB:
            rest = [(k, n) for k, n in zip(self.keys, self.numbers) if k not in named]
            who = Who(tuple(k for k, _ in rest), tuple(n for _, n in rest),
                      tuple(dict.fromkeys(k[0] for k, _ in rest)))
        else:
            who = Who(numbers=(), nodes=())
        self.vertices["job"] = replace(self.vertices["job"], who=who, ranks=who.keys,
                                       numbers=tuple(n for n in who.numbers if n is not None))


def _strength(sure: bool, n: int, p: Party) -> Confidence:
    """How strongly a wait leads to a party: only a releaser known for sure moves the blame, and a process only
    when something holds it (stopped, a zombie) or its own stack says what it waits for; a process that may just
    be working is shown, weakly."""
    if not sure or n > 0:
        return "low"
    if p.kind == "process" and not p.state and not (p.wait is not None and p.wait.known):
        return "low"
    return "high"


# Where a rank's main thread waits on processes of its own: multiprocessing pipes and queues (DataLoader
# workers), subprocess waits, pools. (file suffix, function names)
_ON_CHILDREN = (("multiprocessing/connection.py", {"_recv", "_recv_bytes", "recv", "recv_bytes", "poll", "_poll",
                                                   "wait"}),
                ("multiprocessing/queues.py", {"get"}), ("multiprocessing/pool.py", {"get", "wait"}),
                ("torch/utils/data/dataloader.py", {"_try_get_data", "_get_data", "_next_data"}),
                ("subprocess.py", {"wait", "_wait", "communicate", "_communicate"}))


def waits_on_children(r: RankSnapshot) -> bool:
    t = r.main_thread
    if t is None:
        return False
    for f in t.frames[:12]:
        name = f.filename.replace("\\", "/")
        fn = f.function.rsplit(".", 1)[-1]
        if any(name.endswith(suffix) and fn in fns for suffix, fns in _ON_CHILDREN):
            return True
    return False


def process_state(p: JobProcess) -> str:
    hold = p.hold
    kind = hold.kind if hold is not None else ""
    if kind in ("stopped", "traced", "frozen"):
        return kind
    if kind == "disk_sleep":
        return "in D state"
    if kind in ("zombie", "exiting", "gone"):
        return "exited"
    return {"T": "stopped", "t": "stopped", "Z": "exited", "X": "exited", "D": "in D state"}.get(p.state, "")


def thread_wait_of(link: Link) -> ThreadWait:
    return link.wait
