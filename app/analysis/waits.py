"""Who waits for whom: the wait graph of one job, whose root is the culprit and whose description is the headline.

Vertices are what can be waited for: sets of ranks (the rest of the job, a suspect rank or group), threads of
a rank, processes beside the ranks (children, launchers), hosts outside the snapshot and ranks that were not
found. An edge A -> B says "A waits for B", with its evidence and how strong it is:

- process state (stopped, frozen, exited, D with its wait channel): the others wait for that rank;
- a lock: a thread blocked entering a `with` block waits for the thread inside it (app/analysis/locks.py);
- point-to-point calls: a rank in recv(src=3) waits for rank 3 unless rank 3 is in the matching send
  (app/analysis/p2p.py); the peer, waiting in a collective the first has not joined, waits for it back;
- collectives: Flight Recorder sequence numbers, loop iterations and stacks put the rest of a group in a
  collective that a few ranks have not reached (app/analysis/flight.py, iterations.py, findings.py);
- ranks not found, hosts the ranks talk to that the snapshot does not hold, stalled links, slow nodes;
- any other detector's culprit finding: the rest of the job waits for the ranks (or nodes) it names.

Every edge that comes from a finding keeps the finding's kind, so the findings stay the evidence list. The
culprit is the root: following strong edges from each suspect leads to a vertex that waits for nobody (or to
a cycle: a deadlock, said as such). Roots are ranked by their best evidence (confidence first, then process
state before locks and sequence numbers, before stacks, before the network), then by how many kinds of
evidence agree. Calibration: a [high] finding whose suspect neither leads to the chosen root nor overlaps it
is contradicted and becomes [medium]; two equally strong roots that disagree are both [medium]; when the
samples show the job progressing there is no root and no [high] suspect, and a job with a rank held by its
state is not called progressing.

The graph is small (one vertex per suspect, not per rank): the rest of the job is one vertex, so 100k ranks
cost what 8 do, beyond the findings themselves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from app.analysis.findings import KINDS, Confidence, Finding, where
from app.analysis.fold import RankKey, count_phrase, describe_keys, fold_nodes
from app.analysis.frames import clean
from app.analysis.locks import _label as thread_label
from app.analysis.locks import _where as thread_where
from app.analysis.locks import lock_edges
from app.analysis.p2p import P2P, P2PCall, matched
from app.analysis.tree import StackClass
from app.model import RankSnapshot

_CONF = {"high": 0, "medium": 1, "low": 2}
# Evidence strength beyond confidence: process state outranks stack position.
TIER: Dict[str, int] = {
    "stopped": 0, "frozen": 0, "exited": 0, "uninterruptible": 1,
    "lock_wait": 2, "p2p_wait": 2, "collective_lag": 2, "missing_ranks": 2,
    # /proc and py-spy on the culprit's own threads, and the GPU's own reports: more than a stack's position
    "gil_held": 2, "pipe_write": 2, "native_call": 2, "gpu_fault": 2, "nccl_ras": 2,
    "different_collective": 3, "minority_stack": 3, "iteration_split": 3, "launch_differs": 3,
    "outside_peer": 4, "network_stall": 4, "slow_node": 4, "still_running": 4,
    "node_failed": 5, "thread_count": 5,
}
OBSERVED = 1  # tiers up to this one are the kernel's own report on a process (state), not an inference
DEFAULT_TIER = 3  # a detector this module does not know: as strong as stacks, its confidence decides
_STATE = {"stopped": "stopped", "frozen": "frozen", "exited": "exited", "uninterruptible": "in D state"}
_EDGE_KIND = {"stopped": "state", "frozen": "state", "exited": "state", "uninterruptible": "state",
              "lock_wait": "lock", "p2p_wait": "p2p", "collective_lag": "flight", "missing_ranks": "missing",
              "different_collective": "stacks", "minority_stack": "stacks", "iteration_split": "iteration",
              "launch_differs": "launch", "outside_peer": "outside", "network_stall": "network",
              "node_failed": "node", "slow_node": "slow", "still_running": "progress", "thread_count": "threads"}
# Findings that a progressing job does not contradict: they say how it runs (slowly, with other flags), not that
# it is held
MOVING_KINDS = frozenset({"progressing", "slow_node", "launch_differs"})
MAX_LINES = 12
SMALL_JOB = 512  # up to this many ranks the rest of the job is labelled rank by rank; beyond, counted
_RANKS_IN_LABEL = re.compile(r"\branks? ((?:\d+(?:-\d+)?)(?:,\d+(?:-\d+)?)*)")
_MAX_NUMBERS = 1 << 16


@dataclass(frozen=True)
class Vertex:
    """Something that can be waited for. `ranks`: the rank processes it stands for (a thread: its rank's)."""

    id: str
    kind: str  # job (the rest of the job), ranks, thread, process, host, missing
    label: str
    ranks: Tuple[RankKey, ...] = ()
    numbers: Tuple[int, ...] = ()
    nodes: Tuple[str, ...] = ()
    state: str = ""  # stopped, frozen, exited, in D state: what holds it, whatever its stack shows
    doing: str = ""  # where it is: "in `next_batch` (loader.py:31)"


@dataclass(frozen=True)
class Edge:
    """`waiter` waits for `waited` (vertex ids), because of `evidence`."""

    waiter: str
    waited: str
    kind: str  # state, lock, p2p, collective, flight, iteration, stacks, missing, outside, network, ...
    evidence: str  # short: "all_reduce vs `next_batch`", "step=4 vs 3", "recv(src=3)", "`_metrics_lock`"
    strength: Confidence
    finding: str = ""  # the kind of the finding it rests on; "" when the graph read it from the stacks itself


@dataclass(frozen=True)
class WaitGraph:
    vertices: Tuple[Vertex, ...] = ()
    edges: Tuple[Edge, ...] = ()
    root: Tuple[str, ...] = ()  # the culprit: one vertex, or the vertices of a cycle (a deadlock)
    chain: Tuple[str, ...] = ()  # from the best-supported suspect to the root
    deadlock: bool = False
    confidence: Optional[Confidence] = None  # the root's, after calibration
    progressing: bool = False  # the samples show the job moving: no culprit
    headline: str = ""  # who, what it is doing, why the others wait
    next: str = ""  # what to run or change next
    job: str = ""  # which job, when the snapshot holds several

    def vertex(self, vid: str) -> Optional[Vertex]:
        return next((v for v in self.vertices if v.id == vid), None)

    def lines(self, limit: int = MAX_LINES) -> List[str]:
        """`ranks 0-6 -> rank 7 (flight: pg 0: seq #40 vs #41; high)`, the root's chain first, then
        `culprit (high): ...` and `next: ...`."""
        if self.progressing:
            return ["nobody: the job is progressing between samples"]
        names = display_names(self.vertices)
        on_chain = set(self.chain) | set(self.root)
        pairs: Dict[Tuple[str, str], List[Edge]] = {}
        for e in self.edges:  # one line per pair of vertices, its kinds of evidence together
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
        if self.headline:
            out.append(f"culprit ({self.confidence}): {self.headline}")
        if self.next:
            out.append(f"next: {self.next}")
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {"job": self.job, "root": list(self.root), "chain": list(self.chain), "deadlock": self.deadlock,
                "confidence": self.confidence, "progressing": self.progressing, "headline": self.headline,
                "next": self.next,
                "vertices": [{"id": v.id, "kind": v.kind, "label": v.label, "ranks": [list(k) for k in v.ranks[:64]],
                              "ranks_total": len(v.ranks), "numbers": list(v.numbers[:64]), "nodes": list(v.nodes),
                              "state": v.state, "doing": v.doing} for v in self.vertices],
                "edges": [{"waiter": e.waiter, "waited": e.waited, "kind": e.kind, "evidence": e.evidence,
                           "strength": e.strength, "finding": e.finding} for e in self.edges]}


# ---------------------------------------------------------------------------------------------------------
# Building


class _Builder:
    def __init__(self, ranks: Sequence[RankSnapshot], keys: Sequence[RankKey], numbers: Sequence[Optional[int]],
                 classes: Sequence[StackClass], by_key: Optional[Dict[RankKey, RankSnapshot]]) -> None:
        self.ranks, self.keys, self.numbers_col, self.classes = ranks, keys, numbers, classes
        self._by_key = by_key
        self._number: Optional[Dict[RankKey, Optional[int]]] = None
        self.vertices: Dict[str, Vertex] = {}
        self.ids: Dict[Tuple[Any, ...], str] = {}
        self.edges: List[Edge] = []
        self.of_finding: Dict[int, str] = {}  # id(finding) -> its suspect vertex
        self.vertices["job"] = Vertex("job", "job", "the rest of the job")

    def by_key(self) -> Dict[RankKey, RankSnapshot]:
        if self._by_key is None:
            self._by_key = dict(zip(self.keys, self.ranks))
        return self._by_key

    def number(self, k: RankKey) -> Optional[int]:
        if self._by_key is not None:  # analyze() made it already: no new table of every rank
            r = self._by_key.get(k)
            return r.rank if r is not None else None
        if self._number is None:
            self._number = dict(zip(self.keys, self.numbers_col))
        return self._number.get(k)

    def _id(self, ident: Tuple[Any, ...]) -> str:
        vid = self.ids.get(ident)
        if vid is None:
            vid = self.ids[ident] = f"v{len(self.ids) + 1}"
        return vid

    def rank_vertex(self, keys: Sequence[RankKey], label: str = "", state: str = "", doing: str = "") -> str:
        keys = tuple(sorted(set(keys)))
        vid = self._id(("ranks", keys))
        old = self.vertices.get(vid)
        if old is None:
            numbers = tuple(n for n in map(self.number, keys) if n is not None)
            self.vertices[vid] = Vertex(vid, "ranks", label or describe_keys(keys, [self.number(k) for k in keys]),
                                        keys, numbers, tuple(sorted({k[0] for k in keys})), state,
                                        doing or self._doing(keys))
        elif state and not old.state:
            self.vertices[vid] = replace(old, state=state)
        return vid

    def _doing(self, keys: Sequence[RankKey]) -> str:
        """Where these ranks are: their class's place (minority classes first: they are small)."""
        if not keys:
            return ""
        first = keys[0]
        for c in self.classes[1:]:
            if first in c.ranks:
                return where(c)
        if self.classes and len(keys) <= self.classes[0].size and first in self.classes[0].ranks:
            return where(self.classes[0])
        return ""

    def thread_vertex(self, r: RankSnapshot, tid: int) -> str:
        key = (r.node, r.pid)
        rank_id = self.rank_vertex([key])
        t = next((t for t in r.threads if t.tid == tid), None)
        if t is None or t is r.main_thread:
            return rank_id  # a rank's main thread is the rank
        vid = self._id(("thread", key, tid))
        if vid not in self.vertices:
            who = f"rank {r.rank}" if r.rank is not None else f"pid {r.pid}"
            self.vertices[vid] = Vertex(vid, "thread", f"{who}'s {thread_label(t)}", (key,),
                                        (r.rank,) if r.rank is not None else (), (r.node,), "",
                                        f"in {thread_where(t)}")
        return vid

    def other_vertex(self, kind: str, label: str, numbers: Tuple[int, ...], nodes: Tuple[str, ...]) -> str:
        vid = self._id((kind, label))
        if vid not in self.vertices:
            self.vertices[vid] = Vertex(vid, kind, label, (), numbers, nodes)
        return vid

    def edge(self, waiter: str, waited: str, kind: str, evidence: str, strength: Confidence,
             finding: str = "") -> None:
        if waiter == waited:
            return
        for e in self.edges:
            if e.waiter == waiter and e.waited == waited and e.kind == kind:
                return
        self.edges.append(Edge(waiter, waited, kind, evidence, strength, finding))

    # --- evidence ------------------------------------------------------------------------------------

    def finding(self, f: Finding) -> None:
        if not f.culprit or f.kind in ("progressing", "several_jobs"):
            return
        vid = self.suspect(f)
        if vid is None:
            return
        self.of_finding[id(f)] = vid
        kind = _EDGE_KIND.get(f.kind, f.kind)
        self.edge("job", vid, kind, _evidence(f, self.classes), f.confidence, f.kind)
        if f.kind == "lock_wait" and len(f.ranks) == 1:
            self.locks(f)

    def suspect(self, f: Finding) -> Optional[str]:
        state = _STATE.get(f.kind, "")
        if f.kind == "p2p_wait" and f.ranks:
            return self.rank_vertex(f.ranks[:1])  # the calls' own edges (p2p()) lead on from its first rank
        if f.ranks:
            label = f.ranks_label if f.ranks_label and len(f.ranks_label) <= 160 else ""
            doing = where(self.classes[f.class_index]) if (
                f.class_index is not None and f.class_index < len(self.classes)
                and self.classes[f.class_index].index == f.class_index) else ""
            return self.rank_vertex(f.ranks, label, state, doing)
        nodes = tuple(n for n in re.split(r",(?![^\[]*\])", f.nodes) if n) if f.nodes else ()
        if f.ranks_label:
            numbers = rank_numbers(f.ranks_label)
            place = f" on {f.nodes}" if f.nodes else ""
            return self.other_vertex("missing", f"{f.ranks_label} (not found{place})", numbers, nodes)
        if f.nodes:
            if f.kind == "outside_peer":
                numbers = rank_numbers(f.title.split(" are not in", 1)[0].split(" is not in", 1)[0])
                return self.other_vertex("host", f"{f.nodes} (outside the hosts list)", numbers, nodes)
            return self.other_vertex("host", f.nodes, (), nodes)
        return None

    def locks(self, f: Finding) -> None:
        r = self.by_key().get(f.ranks[0])
        if r is None:
            return
        for e in lock_edges(r):
            if e.holder is None:
                continue
            a = self.thread_vertex(r, e.waiter.thread.tid)
            b = self.thread_vertex(r, e.holder.tid)
            self.edge(a, b, "lock", f"`{clean(e.waiter.key[1], 60)}` at {e.waiter.frame.location}", f.confidence,
                      f.kind)

    def processes(self, processes: Sequence[Any]) -> None:
        """A suspect rank that waits on its children (a DataLoader queue, a subprocess, a pool) waits for them;
        a child held by its state is what it waits for. A launcher with no rank below it waits for a rendezvous
        that nodes never joined. `processes`: Snapshot.processes (discovery's JobProcess: node, pid, role, kind,
        of, state, hold, threads), read by attribute so that snapshots without them cost nothing."""
        suspects = {v.ranks[0]: v.id for v in list(self.vertices.values()) if v.kind == "ranks" and len(v.ranks) == 1}
        for p in processes[:4096]:
            role = getattr(p, "role", "")
            if role == "child" and suspects:
                for rank_pid in getattr(p, "of", ()):
                    owner = suspects.get((p.node, rank_pid))
                    r = self.by_key().get((p.node, rank_pid)) if owner else None
                    if owner is None or r is None or not waits_on_children(r):
                        continue
                    state = _process_state(p)
                    who = f"rank {r.rank}" if r.rank is not None else f"pid {r.pid}"
                    vid = self._id(("process", p.node, p.pid))
                    main = next((t for t in getattr(p, "threads", ()) if t.is_main), None)
                    self.vertices[vid] = Vertex(vid, "process", clean(f"{who}'s {p.kind or 'child'} pid {p.pid}", 160),
                                                (), (), (p.node,), state,
                                                f"in {thread_where(main)}" if main is not None and main.frames else "")
                    self.edge(owner, vid, "child", f"{'held: ' + state if state else 'waits on its child'}",
                              "high" if state else "low")
            elif role == "launcher" and not getattr(p, "of", ()):
                vid = self._id(("process", p.node, p.pid))
                self.vertices[vid] = Vertex(vid, "process", clean(f"{p.kind or 'launcher'} pid {p.pid} on {p.node}",
                                                                  160), (), (), (p.node,), _process_state(p))
                gone = self.other_vertex("missing", "nodes that have not joined its rendezvous", (), ())
                self.edge(vid, gone, "rendezvous", "no rank started below it", "medium")

    def p2p(self, calls: Sequence[P2PCall]) -> None:
        """Unmatched point-to-point calls: the caller waits for its peer; a peer that waits in a collective the
        caller has not joined waits for it back (a mismatch: both wait)."""
        if not calls:
            return
        by_number = {c.rank: c for c in calls if c.rank is not None}
        peers = {c.peer for c in calls if c.peer is not None}
        where_key: Dict[int, RankKey] = {}
        for k, n in zip(self.keys, self.numbers_col):
            if n in peers and n not in where_key:
                where_key[n] = k
        for c in calls:
            if c.peer is None or matched(c, by_number.get(c.peer)):
                continue
            peer_key = where_key.get(c.peer)
            if peer_key is None:
                continue
            a, b = self.rank_vertex([c.key]), self.rank_vertex([peer_key])
            both = c.peer in by_number
            self.edge(a, b, "p2p", c.text(), "high" if both else "medium", "p2p_wait")
            if not both:
                peer_class = next((x for x in self.classes if peer_key in x.ranks[:SMALL_JOB] or
                                   (x.size > SMALL_JOB and peer_key in x.ranks)), None)
                if peer_class is not None and peer_class.collective and peer_class.collective not in P2P:
                    self.edge(b, a, "collective", f"in `{peer_class.collective}`, which {self.label(a)} has not "
                              "joined", "medium", "p2p_wait")

    def label(self, vid: str) -> str:
        v = self.vertices.get(vid)
        return v.label.split(" on ", 1)[0] if v is not None else vid

    def finish_job_label(self) -> None:
        named: Set[RankKey] = set()
        for v in self.vertices.values():
            if v.kind in ("ranks", "thread"):
                named.update(v.ranks)
        total = len(self.keys)
        rest = total - len(named & set(self.keys)) if total <= SMALL_JOB else total - len(named)
        if rest <= 0:
            label = "the other ranks"
        elif total <= SMALL_JOB:
            others = [(k, n) for k, n in zip(self.keys, self.numbers_col) if k not in named]
            label = describe_keys([k for k, _ in others], [n for _, n in others])
        else:
            label = f"the other {count_phrase(rest)}"
        self.vertices["job"] = replace(self.vertices["job"], label=label)


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


def _process_state(p: Any) -> str:
    hold = getattr(p, "hold", None)
    kind = getattr(hold, "kind", "") if hold is not None else ""
    if kind in ("stopped", "traced", "frozen"):
        return kind
    if kind == "disk_sleep":
        return "in D state"
    if kind in ("zombie", "exiting", "gone"):
        return "exited"
    state = getattr(p, "state", "")
    return {"T": "stopped", "t": "stopped", "Z": "exited", "X": "exited", "D": "in D state"}.get(state, "")


def rank_numbers(text: str) -> Tuple[int, ...]:
    """Rank numbers in a label: `ranks 6-7,9` -> (6, 7, 9); bounded, whatever the text says."""
    m = _RANKS_IN_LABEL.search(text)
    if m is None:
        return ()
    out: List[int] = []
    for part in m.group(1).split(","):
        a, _, b = part.partition("-")
        lo, hi = int(a), int(b) if b else int(a)
        if hi < lo or len(out) + hi - lo >= _MAX_NUMBERS:
            break
        out.extend(range(lo, hi + 1))
    return tuple(out)


_PAREN = re.compile(r"\(([^()]*\bvs\b[^()]*)\)")
_SEQ = re.compile(r"process group (\S+): last collective issued #(\d+) where .* at #(\d+)")


def _evidence(f: Finding, classes: Sequence[StackClass]) -> str:
    """The finding in a few words, for an edge."""
    k = f.kind
    if k in _STATE:
        return _STATE[k] + (": " + f.title.split("(", 1)[1].split(")", 1)[0] if k == "stopped" and "(" in f.title
                            else "")
    if k == "collective_lag":
        m = _SEQ.search(f.title)
        return f"pg {m.group(1)}: seq #{m.group(2)} vs #{m.group(3)}" if m else "behind in the Flight Recorder"
    if k == "iteration_split":
        if "another order" in f.title:
            return "iteration order differs"
        m = _PAREN.search(f.title)
        return m.group(1) if m else "another loop iteration"
    if k in ("minority_stack", "different_collective") and f.class_index is not None and classes:
        c = next((x for x in classes if x.index == f.class_index), None)
        d = classes[0]
        if c is not None:
            theirs = f"`{d.collective}`" if d.collective else where(d).replace("in ", "", 1)
            mine = f"`{c.collective}`" if c.collective else where(c).replace("in ", "", 1)
            left = " (it left the loop)" if "left the loop" in f.title else ""
            return clean(f"{theirs} vs {mine}{left}", 160)
    if k == "lock_wait":
        if "deadlocked" in f.title:
            return "its threads are deadlocked on locks"
        m = re.search(r"waits (?:for|to enter) `([^`]+)`", f.title)
        return f"blocked on `{m.group(1)}`" if m else "blocked on a lock"
    if k == "missing_ranks":
        return "not found"
    if k == "outside_peer":
        return "connections to addresses no inspected node has"
    if k == "network_stall":
        return "sockets stall"
    if k == "p2p_wait":
        m = re.search(r"\(((?:src|dst|peer|group_src|group_dst)=[^)]*)\)", f.title)
        return m.group(1) if m else "point-to-point"
    if ": " in f.title:
        return clean(f.title.split(": ", 1)[1], 100)
    return k.replace("_", " ")


# ---------------------------------------------------------------------------------------------------------
# Root selection and calibration


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
    """Two suspects that speak of the same processes (or, for a host, the same node)."""
    if a.id == b.id:
        return True
    if a.ranks and b.ranks and not set(a.ranks).isdisjoint(b.ranks):
        return True
    if a.numbers and b.numbers and not set(a.numbers).isdisjoint(b.numbers):
        return True
    host = a.kind in ("host", "missing") or b.kind in ("host", "missing")
    return host and bool(a.nodes) and bool(b.nodes) and not set(a.nodes).isdisjoint(b.nodes)


def _kind_index(kind: str) -> int:
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


def _key(f: Finding) -> Tuple[int, int]:
    return _CONF[f.confidence], TIER.get(f.kind, DEFAULT_TIER)


def wait_graph(findings: Sequence[Finding], ranks: Sequence[RankSnapshot], keys: Sequence[RankKey],
               numbers: Sequence[Optional[int]], classes: Sequence[StackClass],
               by_key: Optional[Dict[RankKey, RankSnapshot]] = None, calls: Sequence[P2PCall] = (),
               processes: Sequence[Any] = ()) -> Tuple[WaitGraph, List[Finding], Optional[Finding]]:
    """The wait graph of one job, the findings calibrated against it, and the finding the headline speaks of
    (the root's best evidence; "progressing" when the job moves; None when nothing names a culprit)."""
    b = _Builder(ranks, keys, numbers, classes, by_key)
    findings = list(findings)
    progressing = next((f for f in findings if f.kind == "progressing" and f.confidence != "low"), None)
    held = [f for f in findings if f.culprit and f.kind in ("stopped", "frozen") and f.confidence == "high"]
    if progressing is not None and held:
        # a rank held by its state cannot move: the job is not progressing as a whole
        who = held[0].ranks_label or held[0].title
        findings = [replace(f, confidence="low", reason=f"{f.reason}; but {clean(who, 120)} is {held[0].kind}, "
                            "so the job as a whole is not progressing") if f is progressing else f
                    for f in findings]
        progressing = None
    for f in findings:
        b.finding(f)
    b.p2p(calls)
    if processes:
        b.processes(processes)
    b.finish_job_label()

    if progressing is not None:
        eased = [replace(f, confidence="medium", reason=f"{f.reason}; but the job progresses between samples")
                 if f.culprit and f.confidence == "high" and f.kind not in MOVING_KINDS else f for f in findings]
        graph = WaitGraph(tuple(b.vertices.values()), tuple(b.edges), progressing=True,
                          headline="nobody: the job is progressing between samples")
        return graph, eased, next(f for f in eased if f.kind == "progressing")

    adj: Dict[str, List[str]] = {}
    for e in b.edges:
        if e.strength != "low":  # a weak edge is shown, but does not move the blame
            adj.setdefault(e.waiter, []).append(e.waited)
    suspects = [(f, b.of_finding[id(f)]) for f in findings if id(f) in b.of_finding]
    if not suspects:
        return WaitGraph(tuple(b.vertices.values()), tuple(b.edges)), findings, None
    reach = {vid: _reach(adj, vid) for vid in set(b.vertices)}
    terminal: Dict[str, Tuple[str, ...]] = {}  # vertex -> its terminal component (sorted ids)
    for vid, r in reach.items():
        if all(vid in reach[w] for w in r):
            terminal[vid] = tuple(sorted(w for w in r if vid in reach[w]))
    components = sorted(set(terminal.values()))
    support: Dict[Tuple[str, ...], List[Finding]] = {c: [] for c in components}
    for f, vid in suspects:
        for c in components:
            if not reach[vid].isdisjoint(c):
                support[c].append(f)
    # among equally strong findings, the kinds' order (findings.KINDS: the more specific cause first), then
    # the order the findings were made in
    position = {id(f): (_kind_index(f.kind), i) for i, f in enumerate(findings)}
    ranked = sorted((c for c in components if support[c]),
                    key=lambda c: (min(map(_key, support[c])), -len({f.kind for f in support[c]}),
                                   min(position[id(f)] for f in support[c] if _key(f) == min(map(_key, support[c]))),
                                   c))
    root = ranked[0]
    best = min(support[root], key=lambda f: (_key(f), position[id(f)]))
    start = b.of_finding[id(best)]
    chain = tuple(_path(adj, start, set(root)))
    on_root = [b.vertices[v] for v in set(chain) | set(root)]

    # calibration: evidence as strong as the root's that points elsewhere contradicts it; weaker evidence that
    # points elsewhere is contradicted by it
    rivals = [c for c in ranked[1:] if min(map(_key, support[c])) == _key(best) and best.confidence == "high"
              and _key(best)[1] > OBSERVED and not any(_agree(b.vertices[v], w) for v in c for w in on_root)]
    out: List[Finding] = []
    root_label = _label_of(b, root)
    for f in findings:
        fvid = b.of_finding.get(id(f))
        if fvid is None or f.confidence != "high":
            out.append(f)
            continue
        if TIER.get(f.kind, DEFAULT_TIER) <= OBSERVED:
            out.append(f)  # the kernel's word on a process: another root does not make it less true
            continue
        mine = b.vertices[fvid]
        leads_to_root = not reach[fvid].isdisjoint(root) or any(_agree(mine, w) for w in on_root)
        if not leads_to_root and any(not reach[fvid].isdisjoint(c) for c in rivals):
            out.append(replace(f, confidence="medium", reason=f"{f.reason}; but evidence as strong points at "
                               f"{clean(root_label, 120)}"))
        elif not leads_to_root:
            out.append(replace(f, confidence="medium", reason=f"{f.reason}; but the wait graph's root is "
                               f"{clean(root_label, 120)} ({clean(_evidence(best, classes), 100)})"))
        elif rivals:
            other = _label_of(b, rivals[0])
            out.append(replace(f, confidence="medium", reason=f"{f.reason}; but evidence as strong points at "
                               f"{clean(other, 120)}"))
        else:
            out.append(f)
    best = out[position[id(best)][1]]
    deadlock = len(root) > 1
    graph = WaitGraph(tuple(b.vertices.values()), tuple(b.edges), root, chain, deadlock, best.confidence,
                      False, _headline(b, root, chain, deadlock), _next(best, b.vertices[root[0]], b, deadlock))
    return graph, out, best


def _label_of(b: _Builder, component: Sequence[str]) -> str:
    return " and ".join(b.vertices[v].label for v in component)


def shown(graphs: Sequence[WaitGraph]) -> List[WaitGraph]:
    """The graphs a report shows a block for: those with a wait in them, or a job seen progressing."""
    return [g for g in graphs if g.edges or g.progressing]


def display_names(vertices: Sequence[Vertex]) -> Dict[str, str]:
    """Vertex id -> its short name; in a wait among a rank's threads, the rank's own vertex is its main thread."""
    threads = {v.ranks for v in vertices if v.kind == "thread"}
    return {v.id: f"{short(v)}'s main thread" if v.kind == "ranks" and v.ranks in threads else short(v)
            for v in vertices}


def _headline(b: _Builder, root: Tuple[str, ...], chain: Tuple[str, ...], deadlock: bool) -> str:
    """Who, what it is doing, and why the others wait."""
    vs = b.vertices
    names = display_names(list(vs.values()))

    def name(vid: str) -> str:
        return names[vid]

    if deadlock:
        ring = [e for e in b.edges if e.waiter in root and e.waited in root and e.strength != "low"]
        who = "a deadlock: " + "; ".join(f"{name(e.waiter)} waits for {name(e.waited)} ({e.evidence})" for e in ring)
    else:
        v = vs[root[0]]
        what = v.state or v.doing
        who = f"{v.label}{' is ' + what if v.state else (', ' + what if what else '')}"
    first = chain[0] if chain else root[0]
    evidence: Dict[str, List[str]] = {}
    for e in b.edges:
        if e.waited == first and e.waiter not in chain and e.waiter not in root:
            evidence.setdefault(e.waiter, []).append(e.evidence)
    it = "it" if len(chain) <= 1 and not deadlock else short(vs[first])
    why = "; ".join(f"{short(vs[w])} wait{'s' if _one(vs[w]) else ''} for {it} ({'; '.join(ev[:3])})"
                    for w, ev in list(evidence.items())[:3])
    steps = "" if deadlock else "; ".join(
        f"{name(e.waiter)} waits for {name(e.waited)} ({e.evidence})"
        for a, z in zip(chain, chain[1:]) for e in b.edges if e.waiter == a and e.waited == z)
    return clean("; ".join(p for p in (who, why, steps) if p), 600)


def short(v: Vertex) -> str:
    """A vertex's label without its nodes: `rank 7`, `ranks 0-6`, `rank 3` (missing), `node02`."""
    if v.kind == "missing":
        return v.label.split(" (", 1)[0]
    if v.kind in ("ranks", "job"):
        return v.label.split(" on ", 1)[0]
    return v.label


def _one(v: Vertex) -> bool:
    return len(v.ranks) == 1 or v.label.startswith(("rank ", "pid "))


def _next(f: Finding, v: Vertex, b: _Builder, deadlock: bool) -> str:
    """What to run or change next, for the root's kind of evidence."""
    k = f.kind
    key = v.ranks[0] if len(v.ranks) == 1 else None
    at = f" on {clean(key[0], 60)}" if key else ""
    pid = str(key[1]) if key else "PID"
    who = short(v)
    if v.kind == "process":  # a child process the culprit waits on: its own pid, not its rank's
        m = re.search(r"pid (\d+)", v.label)
        ppid, node = (m.group(1) if m else "PID"), (v.nodes[0] if v.nodes else "its node")
        if v.state == "stopped":
            return f"`kill -CONT {ppid}` on {clean(node, 60)} resumes it; hangscope left it as it was"
        return f"see what it does: `py-spy dump --pid {ppid}` on {clean(node, 60)}"
    if deadlock and k == "lock_wait":
        return "take the locks in one order on every thread (or never wait while holding one)"
    if deadlock or k == "p2p_wait":
        return ("make each send meet its recv: order the pairs by rank (the lower rank sends first) or post them "
                "together with batch_isend_irecv")
    if k in ("stopped", "frozen"):
        todo = f.title.rsplit("; ", 1)[-1] if "`" in f.title.rsplit("; ", 1)[-1] else ""
        return clean(todo or "resume it (SIGCONT, or thaw its cgroup)", 300) + "; hangscope left it as it was"
    if k == "exited":
        return f"find why {who} exited: its log, and `dmesg` on its node for the OOM killer; then restart the job"
    if k == "uninterruptible":
        return (f"look at what it waits on: `cat /proc/{pid}/stack`{at}; the file system or driver named there "
                "is what to fix")
    if k == "lock_wait":
        lock = re.search(r"`([^`]+)`", f.title)
        holder = f"{short(v)} ({v.doing[3:] if v.doing.startswith('in ') else v.doing})"
        return clean(f"see why {holder} does not finish; do not hold "
                     f"{'`' + lock.group(1) + '`' if lock else 'the lock'} while waiting", 300)
    if k == "collective_lag":
        return f"see what {who} does instead of that collective: `py-spy dump --locals --pid {pid}`{at}"
    if k == "iteration_split":
        if "another order" in f.title:
            return "iterate in one order on every rank (sorted(), not a set's or a dict's order)"
        return (f"find the branch under which {who} skipped or repeated a collective (one that depends on the "
                "rank, its data or the clock)")
    if k == "different_collective" and "left the loop" not in f.title:
        return (f"make every rank issue the same collectives in one order: find where {who} calls one the others "
                "do not (or where they call one it skipped)")
    if k in ("minority_stack", "different_collective"):
        if "left the loop" in f.title:
            return ("give every rank the same number of batches (DistributedSampler(drop_last=True), equal "
                    "shards) or let DDP's join() cover the ranks that finish first")
        return f"see why {who} does not return from there: `py-spy dump --locals --pid {pid}`{at}"
    if k == "launch_differs":
        return "start every rank with the same training flags"
    if k == "missing_ranks":
        return (f"find why {who} exited: its log, and `dmesg` on its node for the OOM killer; then restart the "
                "job")
    if k == "outside_peer":
        return "add that node to the hosts list and run hangscope again to see what its ranks do"
    if k == "network_stall":
        nodes = fold_nodes(v.nodes) or "that node"
        return f"check {nodes}'s link: `ss -tinpo` there, and `ping` it from the other nodes"
    if k == "slow_node":
        return f"look at {fold_nodes(v.nodes) or 'that node'}'s CPU limit (cgroup cpu.max) and load"
    if k == "still_running":
        return f"see what {who} keeps doing: take more samples (--samples 5) with --locals"
    if k == "node_failed":
        return "fix access to the failed node(s) and run again: the culprit may be there"
    return "see the first finding's detail"

