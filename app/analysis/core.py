"""The analysis core: pure functions from snapshots to classes, a merged tree, findings and a verdict.

`analyze` is the entry point (imported as app.analysis.analyze); everything it returns is frozen and
`Analysis.to_dict()` is what the snapshot file stores under "analysis". It imports every room of the analysis.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Set, Tuple

from app.analysis.blocking import Motion, innermost_own
from app.analysis.calibrate import before_graph, calibrate
from app.analysis.columns import facts as columns
from app.analysis.culprit import Culprit, find
from app.analysis.divergence import identical_fact, stack_facts
from app.analysis.facts import Fact, lead, ordered
from app.analysis.findings import Finding
from app.analysis.flight import FlightSummary, flight_analysis
from app.analysis.frames import clean
from app.analysis.gpu_evidence import gpu_facts
from app.analysis.graph import Builder, WaitGraph
from app.analysis.health import dump_failures, failed_nodes, jobs, missing_ranks, process_states
from app.analysis.health import several_jobs, thread_counts
from app.analysis.iterations import IterationSplit, iteration_facts, locals_missing_fact, split_iterations
from app.analysis.launch import launch_facts, split_store_facts, store_facts
from app.analysis.locks import lock_facts
from app.analysis.native import native_facts
from app.analysis.network import address_map, network_findings
from app.analysis.options import AnalysisOptions
from app.analysis.p2p import p2p_calls, p2p_facts
from app.analysis.peers import known_addresses, outside_peer_findings, outside_peers
from app.analysis.processes import launchers_without_ranks, no_data, one_rendezvous
from app.analysis.progress import RankProgress, ddp_backward_wait, held_back, progress_facts, slow_nodes, track
from app.analysis.prose import render
from app.analysis.prose.graph import name_graph
from app.analysis.prose.headline import graph_headline, next_step, verdict
from app.analysis.suspects import suspect_facts
from app.analysis.tree import StackClass, StackTree, TreeNode, build_tree, group_stacks
from app.model import Frame, RankKey, RankSnapshot, Snapshot, ThreadStack, rank_key
from app.model.codec import to_dict

__all__ = ["Analysis", "AnalysisOptions", "Culprit", "Fact", "Finding", "StackClass", "StackTree", "TreeNode",
           "IterationSplit", "RankProgress", "WaitGraph", "analyze"]


@dataclass(frozen=True)
class Analysis:
    verdict: str  # one plain sentence: the answer
    findings: Tuple[Finding, ...]  # most likely culprit first
    classes: Tuple[StackClass, ...]  # largest first
    tree: StackTree
    iteration_splits: Tuple[IterationSplit, ...] = ()
    progress: Tuple[RankProgress, ...] = ()  # when history was given
    ranks_total: int = 0
    ranks_with_stacks: int = 0
    options: AnalysisOptions = field(default_factory=AnalysisOptions)
    elapsed: float = 0.0  # seconds the analysis took
    flight: Optional[FlightSummary] = None  # PyTorch's Flight Recorder: used or not, and each rank's numbers
    waits: Tuple[WaitGraph, ...] = ()  # who waits for whom, one graph per job: its root is the culprit
    culprit: Optional[Culprit] = None  # the one culprit every screen and report reads (None: none, or progressing)
    culprits: Tuple[Culprit, ...] = ()  # one per hung job, when the snapshot holds several (the first is `culprit`)
    facts: Tuple[Fact, ...] = ()  # the typed facts the findings say, in the same order

    @property
    def culprit_finding(self) -> Optional[Finding]:
        """The finding that says the culprit's evidence (the fact at the wait graph's root), when there is one."""
        if self.culprit is None:
            return None
        i = next((i for i, f in enumerate(self.facts) if f is self.culprit.fact), None)
        return self.findings[i] if i is not None and i < len(self.findings) else None

    def marked(self) -> Set[RankKey]:
        """The ranks to mark as culprits on every screen and report: each hung job's culprit, unless it is most of
        the job (marking then tells nothing)."""
        keys = {k for c in self.culprits for k in c.ranks}
        return keys if len(keys) * 2 <= max(self.ranks_total, 1) else set()

    def to_dict(self) -> Dict[str, Any]:
        """JSON-able: stored as the snapshot file's "analysis". Frames are shortened to their identity (the
        snapshot holds them in full)."""
        opts = self.options
        return {
            "verdict": self.verdict,
            "ranks_total": self.ranks_total,
            "ranks_with_stacks": self.ranks_with_stacks,
            "elapsed": round(self.elapsed, 4),
            "options": {"thread": opts.thread if isinstance(opts.thread, str) else "custom",
                        "identity": opts.identity, "native": opts.native, "fold_machinery": opts.fold_machinery},
            "findings": [to_dict(f) for f in self.findings],
            "classes": [_class_dict(c) for c in self.classes],
            "tree": _tree_dict(self.tree),
            "iteration_splits": [_split_dict(s) for s in self.iteration_splits],
            "progress": [to_dict(p) for p in self.progress],
            "flight": to_dict(self.flight) if self.flight is not None else None,
            "waits": [g.to_dict() for g in self.waits],
            "culprit": _culprit_dict(self.culprit),
        }


def _culprit_dict(c: Optional[Culprit]) -> Optional[Dict[str, Any]]:
    """The culprit as the snapshot file stores it: who, how sure, the kind of its evidence, and its chain of
    waits (each step's blocking operation, resource and who can release it)."""
    if c is None:
        return None
    return {"ranks": [list(k) for k in c.who.keys[:64]], "numbers": [n for n in c.who.numbers[:64] if n is not None],
            "nodes": list(c.who.nodes[:64]), "confidence": c.strength, "kind": c.fact.kind,
            "deadlock": c.deadlock, "root": list(c.root),
            "waits": [{"state": link.wait.state, "operation": link.wait.operation, "resource": link.wait.resource,
                       "release": link.wait.release, "syscall": link.wait.syscall, "wchan": link.wait.wchan,
                       "where": link.wait.caller.location if link.wait.caller is not None else "",
                       "releasers": [{"kind": p.kind, "role": p.role, "pid": p.pid, "tid": p.tid, "rank": p.rank,
                                      "state": p.state} for p in link.release.parties[:6]],
                       "nobody": link.release.nobody} for link in c.links]}


def _frame_dict(f: Frame) -> Dict[str, Any]:
    return {"function": f.function, "filename": f.filename, "line": f.line, "native": f.native}


def _class_dict(c: StackClass) -> Dict[str, Any]:
    return {"index": c.index, "size": c.size, "label": c.label, "collective": c.collective,
            "ranks": [list(k) for k in c.ranks], "numbers": list(c.numbers),
            "frames": [_frame_dict(f) for f in c.frames]}


def _tree_dict(tree: StackTree) -> Dict[str, Any]:
    """The tree as a flat node list, depth first, root first, children by index: nested JSON would hit the
    JSON encoder's recursion limit on a rank thousands of frames deep in a recursive function."""
    nodes = tree.walk()
    index = {id(n): i for i, n in enumerate(nodes)}
    return {"nodes": [{"frame": _frame_dict(n.frame) if n.frame is not None else None, "depth": n.depth,
                       "count": n.count, "label": tree.label(n), "classes": list(n.classes), "ends": list(n.ends),
                       "children": [index[id(c)] for c in n.children]} for n in nodes]}


def _split_dict(s: IterationSplit) -> Dict[str, Any]:
    return {"class_index": s.class_index, "text": s.text(), "varying": list(s.varying),
            "locals_missing": s.locals_missing, "loops": [_frame_dict(f) for f in s.loops],
            "groups": [{"coordinate": [list(p) for p in g.coordinate], "label": g.label,
                        "ranks": [list(k) for k in g.ranks]} for g in s.groups],
            **({"unknown": {"label": s.unknown.label, "ranks": [list(k) for k in s.unknown.ranks]}}
               if s.unknown is not None else {})}


_job = attrgetter("job")


def job_keys(snapshot: Snapshot) -> List[str]:
    """The jobs of the snapshot, by the identity parse gave each rank (RankSnapshot.job), largest first; one
    entry "" when no rank tells (old snapshot files) or all tell the same."""
    distinct = set(map(_job, snapshot.ranks))  # in C: the usual case is one job
    # a job with launchers and no rank yet is a job too (issue 16.3)
    lone = {p.job for p in snapshot.processes if p.role == "launcher" and p.job} - distinct if snapshot.processes \
        else set()
    if len(distinct) + len(lone) <= 1:
        return list(distinct | lone) or [""]
    counts: Dict[str, int] = dict.fromkeys(lone, 0)
    for r in snapshot.ranks:
        counts[r.job] = counts.get(r.job, 0) + 1
    return sorted(counts, key=lambda k: (-counts[k], k))


def only_job(snapshot: Snapshot, job: str) -> Snapshot:
    """The snapshot with the ranks (and launchers and children) of one job only (nodes stay: a node failure
    concerns every job on it)."""
    return dataclasses.replace(snapshot, ranks=tuple(r for r in snapshot.ranks if r.job == job),
                               processes=tuple(p for p in snapshot.processes if p.job == job))


def analyze(snapshot: Snapshot, *, history: Sequence[Snapshot] = (),
            options: AnalysisOptions = AnalysisOptions()) -> Analysis:
    """Everything hangscope concludes from one snapshot (and earlier samples of the same job, oldest first).
    A snapshot that holds several jobs is analysed job by job: ranks of one job are never compared with
    another's, and the verdict says which job is hung and which progresses."""
    snapshot = one_rendezvous(snapshot)
    keys = job_keys(snapshot)
    if len(keys) > 1:
        return _analyze_jobs(snapshot, history, options, keys)
    return _analyze_one(snapshot, history, options)


def _analyze_jobs(snapshot: Snapshot, history: Sequence[Snapshot], options: AnalysisOptions,
                  keys: Sequence[str]) -> Analysis:
    started = time.perf_counter()
    whole = _analyze_one(snapshot, history, options)  # the picture of the node: classes and tree over every rank
    context = whole_of(snapshot)
    per_job = [(key, _analyze_one(only_job(snapshot, key), [only_job(h, key) for h in history], options, context))
               for key in keys]
    progressing = [(k, a) for k, a in per_job if a.findings and a.findings[0].kind == "progressing"]
    # the job with the strongest lead first
    stuck = sorted(((k, a) for k, a in per_job if (k, a) not in progressing),
                   key=lambda ka: _lead_rank(ka[1]))
    parts = []
    for key, a in stuck:
        label = _job_label(snapshot, key)
        verdict = a.verdict[:1].lower() + a.verdict[1:]
        parts.append(f"Job {label} is hung: {verdict}" if history else f"Job {label}: {verdict}")
    for key, _ in progressing:
        parts.append(f"Job {_job_label(snapshot, key)} is progressing, not hung.")
    findings: List[Finding] = []
    for key, a in stuck + progressing:
        tag = f"job {clean(key or 'unidentified', 120)}: "
        findings += [dataclasses.replace(f, title=tag + f.title) for f in a.findings]
    facts: List[Fact] = [f for _, a in stuck + progressing for f in a.facts]
    kept = [(f, x) for f, x in zip(whole.findings, whole.facts) if f.kind in ("several_jobs", "node_failed")]
    findings += [f for f, _ in kept]
    facts += [x for _, x in kept]
    graphs = tuple(dataclasses.replace(g, job=_job_label(snapshot, key)) for key, a in stuck + progressing
                   for g in a.waits)
    culprits = tuple(a.culprit for _, a in stuck if a.culprit is not None)
    return dataclasses.replace(whole, verdict=" ".join(parts), findings=tuple(findings), waits=graphs,
                               progress=tuple(p for _, a in per_job for p in a.progress), facts=tuple(facts),
                               culprit=culprits[0] if culprits else None, culprits=culprits,
                               elapsed=time.perf_counter() - started)


def _lead_rank(a: Analysis) -> Tuple[int, int]:
    top = a.findings[0] if a.findings else None
    if top is None or not top.culprit:
        return (1, 3)
    return (0, {"high": 0, "medium": 1, "low": 2}[top.confidence])


def _job_label(snapshot: Snapshot, key: str) -> str:
    from app.analysis.fold import describe

    ranks = [r for r in snapshot.ranks if r.job == key]
    return f"{clean(key or 'unidentified', 120)} ({describe(ranks)})"


@dataclass(frozen=True)
class Whole:
    """What the whole snapshot says that one job's analysis needs when it holds several jobs: every inspected
    node's addresses (a job's ranks talk to the nodes of another job's ranks too), and who listens on which node's
    port (ranks that joined another job's store)."""

    addresses: FrozenSet[str]
    nodes_of: Mapping[str, str]  # address -> node
    listeners: Mapping[Tuple[str, int], str]  # (node, port) -> who listens there, said


def whole_of(snapshot: Snapshot) -> Whole:
    from app.analysis.network import address_map

    listeners: Dict[Tuple[str, int], str] = {}
    for r in snapshot.ranks:
        for s in r.sockets:
            port = s.local.rsplit(":", 1)[-1]
            if s.state == "LISTEN" and port.isdigit():
                what = f"rank {r.rank} of job {clean(r.job, 80)}" if r.rank is not None and r.job else "a rank"
                listeners.setdefault((r.node, int(port)), f"pid {r.pid} on {clean(r.node, 60)} ({what})")
    return Whole(frozenset(known_addresses(snapshot)), address_map(snapshot), listeners)


def _analyze_one(snapshot: Snapshot, history: Sequence[Snapshot], options: AnalysisOptions,
                 whole: Optional[Whole] = None) -> Analysis:
    """Facts (each detector's), then the wait graph built from them, one calibration, the culprit, and last the
    sentences (app/analysis/prose). `whole`: the whole snapshot's addresses and listeners, for one job of several."""
    started = time.perf_counter()
    ranks = snapshot.ranks
    rank_facts = columns(ranks)  # the one read of every rank (columns.py)
    grouping = group_stacks(ranks, options, rank_facts)
    classes = grouping.classes
    tree = build_tree(classes, options)
    splits = split_iterations(grouping)
    if snapshot.options.locals:
        splits = tuple(dataclasses.replace(s, locals_collected=True) if s.locals_missing else s for s in splits)

    # the ranks by key, when something compares a rank's own frames (loops, locals) with its class's path
    by_key = dict(zip(rank_facts.key, ranks)) if len(classes) > 1 or any(s.split for s in splits) else None
    facts: List[Fact] = stack_facts(classes, by_key)
    calls = p2p_calls(ranks, classes, by_key)
    if calls:
        facts += p2p_facts(calls, _class_of(classes, {c.peer for c in calls if c.peer is not None}))
    odd = {k for c in classes[1:] for k in c.ranks}  # the ranks the stacks single out
    facts += lock_facts(ranks, odd, rank_facts.enters_with)
    facts += native_facts(ranks, odd)
    facts += launch_facts(ranks)
    facts += store_facts(ranks)
    if whole is not None:  # ranks of one job in another's store: only a snapshot of several jobs can show it
        facts += split_store_facts(ranks, whole.nodes_of, whole.listeners)
    collective_of = {c.index: c.collective for c in classes}
    for split in splits:
        facts.extend(iteration_facts(split, by_key, collective_of.get(split.class_index)))
    dominant_split = next((s for s in splits if classes and s.class_index == classes[0].index), None)
    locals_missing = dominant_split is not None and dominant_split.locals_missing
    if locals_missing and dominant_split is not None:
        facts.append(locals_missing_fact(dominant_split, snapshot.options.locals, classes[0].label))

    by_job = jobs(rank_facts)
    facts += several_jobs(by_job)
    missing = missing_ranks(snapshot, by_job)
    facts += missing
    # Ranks not found while every node answered, and the ranks that are here talk to addresses no inspected node
    # has: the missing ranks are there (a hosts list that leaves out a node of the job).
    peers = outside_peers(snapshot, whole.addresses if whole is not None else frozenset())
    unexplained = [f for f in missing if f.kind == "missing_ranks" and not f.culprit and f.who.missing]
    failed_any = any(n.state in ("failed", "partial") for n in snapshot.nodes)
    gap = None
    if unexplained and not failed_any:
        from app.analysis.prose.state import missing_label  # a label for the sentence, carried as display text
        evidence = unexplained[0].data
        gap = (tuple(n for n in unexplained[0].who.numbers if n is not None),
               missing_label(evidence) if hasattr(evidence, "gaps") else "", "")  # type: ignore[arg-type]
    facts += outside_peer_findings(snapshot, peers, gap)
    facts += failed_nodes(snapshot)
    facts += dump_failures(grouping.no_stack, options.thread if isinstance(options.thread, str) else "custom")
    states = process_states(rank_facts)
    facts += states
    facts += thread_counts(rank_facts)
    flight, lagging = flight_analysis(ranks, rank_facts)
    facts += lagging

    same_place = len(classes) == 1 and not (dominant_split is not None and dominant_split.split)
    addresses = address_map(snapshot)  # a pass over every socket (~0.1 s at 100k ranks): made once, used twice
    network = network_findings(snapshot, same_place=same_place, same_stack=len(classes) == 1,
                               sockets=rank_facts.sockets, addresses=addresses)
    facts += network

    progress: Tuple[RankProgress, ...] = ()
    if history:
        progress = track(list(history) + [snapshot], options)
        slow = slow_nodes(progress)
        progress = held_back(progress, slow)  # ranks a slow node holds back are not stuck
        facts += progress_facts(progress)
        facts += slow
    stuck = (not any(f.kind == "progressing" for f in facts)) if history else None
    facts += gpu_facts(snapshot, stuck, history)  # GPU-side evidence: Xid, ECC, nvidia-smi, NCCL RAS

    # The wait model on the suspects: what their threads are blocked in, and who can release it
    keys_by = by_key if by_key is not None else dict(zip(rank_facts.key, ranks))
    suspects = [k for f in sorted((f for f in facts if f.culprit and f.who.keys and f.kind not in (
        "progressing", "launch_differs", "slow_node", "gpu_fault", "nccl_ras", "thread_count")),
        key=lambda f: f.strength != "high") for k in f.who.keys[:8]]
    motion = _motion(history, options)
    said = [k for f in facts if f.kind in ("lock_wait", "gil_held", "native_call", "pipe_write") for k in f.who.keys]
    blocked, chains = suspect_facts(ranks, suspects, tuple(odd)[:4096], snapshot.processes, classes, motion, keys_by,
                                    _rank_addresses(ranks), addresses, said)
    facts += blocked

    if same_place and (gap is None or not peers):
        # (with ranks missing on a node the hosts list leaves out, the ranks here wait for those: no puzzle)
        facts.append(identical_fact(classes[0], locals_missing=locals_missing, network=bool(network),
                                    history=bool(history), incomplete=bool(grouping.no_stack),
                                    sockets=any(rank_facts.sockets), locals_collected=snapshot.options.locals,
                                    moving=any(p.net_bytes for p in progress),
                                    progressing=len({p.node for p in progress if p.status == "progressing"}) > 1,
                                    explained=any(f.culprit and f.strength == "high" for f in facts),
                                    ddp=classes[0].collective is None and _ddp_wait(ranks, classes[0], options)))
    if not classes:
        facts += launchers_without_ranks(snapshot) or [no_data(snapshot)]

    facts = before_graph(facts, progress)
    b = Builder(ranks, rank_facts.key, rank_facts.rank, classes, by_key)
    for i, f in enumerate(facts):
        b.fact(i, f)
    fact_of = {f.who.keys[0]: i for i, f in enumerate(facts) if f.kind == "p2p_wait" and f.who.keys}
    b.p2p(calls, fact_of)
    for i, f in enumerate(facts):
        if f.kind == "blocked" and f.who.keys:
            links = chains.get((f.data.rank.node, f.data.rank.pid), ())  # type: ignore[attr-defined]
            b.waits(f.data.rank, links, i)  # type: ignore[attr-defined]
    if snapshot.processes:
        b.processes(_processes(snapshot))
    b.finish()
    result = calibrate(facts, b)
    culprit = find(result.graph, result.best, chains, keys_by, classes)

    # prose, last
    top = result.best
    facts_out = ordered(result.facts, first=(top,) if top is not None else ())
    findings = tuple(render(f) for f in facts_out)
    lead_fact = top if top is not None and top in facts_out else lead(facts_out)
    lead_finding = findings[facts_out.index(lead_fact)] if lead_fact is not None else None
    graph = name_graph(result.graph, result.facts, classes, keys_by, len(ranks))
    next_text = next_step(culprit, lead_fact, graph, classes) if lead_fact is not None and lead_fact.culprit else ""
    slow_found = [x for x, f in zip(findings, facts_out) if f.kind == "slow_node"]
    text = verdict(culprit, lead_fact, lead_finding, slow_found, len(ranks), next_text, facts_out)
    headline = graph_headline(culprit, graph, result.facts, classes, lead_finding.title if lead_finding else "",
                              len(ranks))
    graph = dataclasses.replace(graph, headline=headline, next=next_text if culprit is not None else "")
    return Analysis(text, findings, classes, tree, splits, progress, len(ranks), len(ranks) - len(grouping.no_stack),
                    options, time.perf_counter() - started, flight, (graph,), culprit,
                    (culprit,) if culprit is not None else (), facts_out)


def _motion(history: Sequence[Snapshot], options: AnalysisOptions) -> Callable[[RankSnapshot, ThreadStack],
                                                                             Optional[Motion]]:
    """How a rank's thread moved since the previous sample: its process's CPU share (the thread's own when the
    worker read it), and whether its stack changed."""
    if not history:
        return lambda r, t: None
    older = [{(r.node, r.pid, r.start_time): r for r in h.ranks} for h in reversed(history)]  # newest first
    before = older[0]

    def place(f: Optional[Frame]) -> Optional[Tuple[str, str, int]]:
        return (f.function, f.filename, f.line) if f is not None else None

    def stayed(r: RankSnapshot, t: ThreadStack) -> float:
        """Seconds the thread's innermost own frame has stood where it is now, back over the samples."""
        own = innermost_own(t.frames)
        if own is None or r.counters is None:
            return 0.0
        where, since = place(own), r.counters.at
        for snap in older:
            old = snap.get((r.node, r.pid, r.start_time))
            prev = next((x for x in old.threads if x.tid == t.tid), None) if old is not None else None
            was = innermost_own(prev.frames) if prev is not None else None
            if old is None or old.counters is None or was is None or place(was) != where:
                break
            since = old.counters.at
        return max(0.0, r.counters.at - since)

    def motion(r: RankSnapshot, t: ThreadStack) -> Optional[Motion]:
        old = before.get((r.node, r.pid, r.start_time))
        if old is None or old.counters is None or r.counters is None or r.counters.at <= old.counters.at:
            return None
        dt = r.counters.at - old.counters.at
        cpu: Optional[float] = None
        mine = getattr(t, "cpu_time", None)
        prev = next((x for x in old.threads if x.tid == t.tid), None)
        theirs = getattr(prev, "cpu_time", None) if prev is not None else None
        if mine is not None and theirs is not None:
            cpu = max(0.0, mine - theirs) / dt
        elif None not in (r.counters.utime, r.counters.stime, old.counters.utime, old.counters.stime):
            cpu = max(0.0, (r.counters.utime or 0) + (r.counters.stime or 0) - (old.counters.utime or 0)
                      - (old.counters.stime or 0)) / dt
        moved = prev is not None and prev.path != t.path
        own, own_before = innermost_own(t.frames), innermost_own(prev.frames) if prev is not None else None
        moved_own = prev is not None and (own is None or own_before is None or place(own) != place(own_before))
        return Motion(cpu, moved, moved_own, running_before=prev is not None and prev.state == "R",
                      stayed_s=0.0 if moved_own else stayed(r, t))

    return motion


def _rank_addresses(ranks: Sequence[RankSnapshot]) -> Dict[str, RankSnapshot]:
    """"ip:port" of each rank's own socket ends -> the rank (a socket peer that is another rank of the job)."""
    out: Dict[str, RankSnapshot] = {}
    for r in ranks[:65536]:
        for s in r.sockets:
            out.setdefault(s.local, r)
    return out


def _class_of(classes: Sequence[StackClass], wanted: set) -> Dict[int, StackClass]:
    """Rank number -> its class, for the ranks named as peers of point-to-point calls."""
    out: Dict[int, StackClass] = {}
    for c in classes:
        if c.collective in ("send", "recv", "send/recv"):
            continue
        for n in c.numbers:
            if n is not None and n in wanted and n not in out:
                out[n] = c
    return out


def _processes(snapshot: Snapshot) -> list:
    """The launchers and children of this snapshot's job(s) (Snapshot.processes, from discovery)."""
    if not snapshot.processes:
        return []
    jobs_here = {r.job for r in snapshot.ranks}
    return [p for p in snapshot.processes if p.job in jobs_here or not p.job]


def _ddp_wait(ranks: Sequence[RankSnapshot], c: StackClass, options: AnalysisOptions) -> bool:
    """Whether the class waits for DDP's gradient all_reduce inside backward (judged on a few members)."""
    members = set(c.ranks[:8])
    return ddp_backward_wait(list(islice((r for r in ranks if rank_key(r) in members), 8)), options)


