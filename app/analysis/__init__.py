"""The analysis core: pure functions from snapshots to classes, a merged tree, findings and a verdict.

Import contract: nothing under app/analysis imports textual, asyncssh, app.transport, app.session or app.ui
(a test checks it in a subprocess). `analyze` is the entry point; everything it returns is frozen and
`Analysis.to_dict()` is what the snapshot file stores under "analysis".
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter
from typing import Any, Dict, List, Optional, Sequence, Tuple

from app.analysis.columns import facts
from app.analysis.findings import Finding, identical_finding, lead, order, stack_findings
from app.analysis.flight import FlightSummary, flight_analysis
from app.analysis.frames import clean
from app.analysis.gpu_evidence import gpu_findings
from app.analysis.health import dump_failures, failed_nodes, jobs, missing_ranks, process_states
from app.analysis.health import held_ranks, several_jobs, thread_counts
from app.analysis.iterations import IterationSplit, iteration_findings, locals_missing_finding, split_iterations
from app.analysis.launch import launch_findings, slow_by_flags
from app.analysis.locks import lock_findings
from app.analysis.native import native_findings
from app.analysis.network import network_findings
from app.analysis.peers import outside_peer_findings, outside_peers
from app.analysis.processes import launchers_without_ranks
from app.analysis.options import AnalysisOptions
from app.analysis.p2p import p2p_calls, p2p_findings
from app.analysis.progress import RankProgress, ddp_backward_wait, held_back, progress_findings, slow_nodes, track
from app.analysis.progress import contradicted_stalls, while_progressing
from app.analysis.tree import StackClass, StackTree, TreeNode, build_tree, group_stacks
from app.analysis.waits import WaitGraph, wait_graph
from app.model import Frame, RankSnapshot, Snapshot, rank_key
from app.model.codec import to_dict

__all__ = ["Analysis", "AnalysisOptions", "Finding", "StackClass", "StackTree", "TreeNode", "IterationSplit",
           "RankProgress", "WaitGraph", "analyze"]


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
        }


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
    keys = job_keys(snapshot)
    if len(keys) > 1:
        return _analyze_jobs(snapshot, history, options, keys)
    return _analyze_one(snapshot, history, options)


def _analyze_jobs(snapshot: Snapshot, history: Sequence[Snapshot], options: AnalysisOptions,
                  keys: Sequence[str]) -> Analysis:
    started = time.perf_counter()
    whole = _analyze_one(snapshot, history, options)  # the picture of the node: classes and tree over every rank
    per_job = [(key, _analyze_one(only_job(snapshot, key), [only_job(h, key) for h in history], options))
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
    findings += [f for f in whole.findings if f.kind in ("several_jobs", "node_failed")]
    graphs = tuple(dataclasses.replace(g, job=_job_label(snapshot, key)) for key, a in stuck + progressing
                   for g in a.waits)
    return dataclasses.replace(whole, verdict=" ".join(parts), findings=tuple(findings), waits=graphs,
                               progress=tuple(p for _, a in per_job for p in a.progress),
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


def _analyze_one(snapshot: Snapshot, history: Sequence[Snapshot], options: AnalysisOptions) -> Analysis:
    started = time.perf_counter()
    ranks = snapshot.ranks
    rank_facts = facts(ranks)  # the one read of every rank (columns.py)
    grouping = group_stacks(ranks, options, rank_facts)
    classes = grouping.classes
    tree = build_tree(classes, options)
    splits = split_iterations(grouping)
    if snapshot.options.locals:
        splits = tuple(dataclasses.replace(s, locals_collected=True) if s.locals_missing else s for s in splits)

    # the ranks by key, when something compares a rank's own frames (loops, locals) with its class's path
    by_key = dict(zip(rank_facts.key, ranks)) if len(classes) > 1 or any(s.split for s in splits) else None
    findings: List[Finding] = stack_findings(classes, by_key)
    calls = p2p_calls(ranks, classes, by_key)
    if calls:
        findings += p2p_findings(calls, _where_of(classes, {c.peer for c in calls if c.peer is not None}))
    odd = {k for c in classes[1:] for k in c.ranks}  # the ranks the stacks single out
    findings += lock_findings(ranks, odd, rank_facts.enters_with)
    findings += native_findings(ranks, odd)
    findings += launch_findings(ranks)
    for split in splits:
        findings.extend(iteration_findings(split, by_key))
    dominant_split = next((s for s in splits if classes and s.class_index == classes[0].index), None)
    locals_missing = dominant_split is not None and dominant_split.locals_missing
    if locals_missing and dominant_split is not None:
        findings.append(locals_missing_finding(dominant_split, snapshot.options.locals, classes[0].label))

    by_job = jobs(rank_facts)
    findings += several_jobs(by_job)
    missing = missing_ranks(snapshot, by_job)
    findings += missing
    # Ranks not found while every node answered, and the ranks that are here talk to addresses no inspected node
    # has: the missing ranks are there (a hosts list that leaves out a node of the job).
    peers = outside_peers(snapshot)
    unexplained = [f for f in missing if f.kind == "missing_ranks" and not f.culprit and f.ranks_label]
    failed_any = any(n.state in ("failed", "partial") for n in snapshot.nodes)
    gap = (unexplained[0].ranks_label, "") if unexplained and not failed_any else None
    findings += outside_peer_findings(snapshot, peers, gap)
    findings += failed_nodes(snapshot)
    findings += dump_failures(grouping.no_stack, options.thread if isinstance(options.thread, str) else "custom")
    states = process_states(rank_facts)
    findings += states
    findings += thread_counts(rank_facts)
    flight, lagging = flight_analysis(ranks, rank_facts)
    findings += lagging

    same_place = len(classes) == 1 and not (dominant_split is not None and dominant_split.split)
    network = network_findings(snapshot, same_place=same_place, same_stack=len(classes) == 1,
                               sockets=rank_facts.sockets)
    held = held_ranks(states)
    findings += network

    progress: Tuple[RankProgress, ...] = ()
    if history:
        progress = track(list(history) + [snapshot], options)
        slow = slow_nodes(progress)
        progress = held_back(progress, slow)  # ranks a slow node holds back are not stuck
        findings += progress_findings(progress)
        findings += slow
        findings = slow_by_flags(findings)  # a slow node launched with other flags: the flags say why
    findings += gpu_findings(snapshot, findings, history)  # GPU-side evidence: Xid, ECC, nvidia-smi, NCCL RAS
    if same_place and (gap is None or not peers):
        # (with ranks missing on a node the hosts list leaves out, the ranks here wait for those: no puzzle)
        findings.append(identical_finding(classes[0], locals_missing=locals_missing, network=bool(network),
                                          history=bool(history), incomplete=bool(grouping.no_stack),
                                          sockets=any(rank_facts.sockets), locals_collected=snapshot.options.locals,
                                          moving=any(p.net_bytes for p in progress),
                                          explained=any(f.culprit and f.confidence == "high" for f in findings),
                                          ddp=classes[0].collective is None and _ddp_wait(ranks, classes[0],
                                                                                          options)))
    if history:
        findings = contradicted_stalls(while_progressing(findings), progress)
    if held:
        findings = _explained_by_state(findings, held[0])
    if not classes:
        findings += launchers_without_ranks(snapshot) or [_no_data(snapshot)]
    graph, findings, top = wait_graph(findings, ranks, rank_facts.key, rank_facts.rank, classes, by_key, calls,
                                      _processes(snapshot))
    ordered = order(findings, first=[top] if top is not None else ())
    return Analysis(_verdict(ordered, top), ordered, classes, tree, splits, progress, len(ranks),
                    len(ranks) - len(grouping.no_stack), options, time.perf_counter() - started, flight, (graph,))


def _processes(snapshot: Snapshot) -> list:
    """The launchers and children of this snapshot's job(s) (Snapshot.processes, from discovery)."""
    if not snapshot.processes:
        return []
    jobs_here = {r.job for r in snapshot.ranks}
    return [p for p in snapshot.processes if p.job in jobs_here or not p.job]


def _where_of(classes: Sequence[StackClass], wanted: set) -> Dict[int, str]:
    """Rank number -> where its class is, for the ranks named as peers of point-to-point calls."""
    from app.analysis.findings import where

    out: Dict[int, str] = {}
    for c in classes:
        if c.collective in ("send", "recv", "send/recv"):
            continue
        for n in c.numbers:
            if n is not None and n in wanted and n not in out:
                out[n] = f"in `{c.collective}`" if c.collective else where(c)
    return out


def _ddp_wait(ranks: Sequence[RankSnapshot], c: StackClass, options: AnalysisOptions) -> bool:
    """Whether the class waits for DDP's gradient all_reduce inside backward (judged on a few members)."""
    members = set(c.ranks[:8])
    return ddp_backward_wait(list(islice((r for r in ranks if rank_key(r) in members), 8)), options)


def _explained_by_state(findings: List[Finding], held: Finding) -> List[Finding]:
    """A stopped or frozen rank goes silent on every socket and the others wait for it in the same place: the
    network and "all at the same place" leads are its consequences, not evidence of their own."""
    who = held.ranks_label or held.title
    one = len(held.ranks) == 1
    note = (f"; but {clean(who, 120)} {'is' if one else 'are'} {held.kind}, which silences "
            f"{'its' if one else 'their'} sockets and holds the others by itself")
    return [dataclasses.replace(f, confidence="low", culprit=False, reason=f.reason + note)
            if f.kind in ("network_stall", "all_identical") else f for f in findings]


def _no_data(snapshot: Snapshot) -> Finding:
    if not snapshot.ranks:
        failed = sum(1 for n in snapshot.nodes if n.state == "failed")
        why = f"; {failed} of {len(snapshot.nodes)} nodes failed" if failed else ""
        return Finding("no_data", f"no rank processes were found{why}",
                       "hangscope looks for processes with RANK/LOCAL_RANK in their environment and for "
                       "multiprocessing spawn children with torch loaded; check the hosts list, that the job runs as "
                       "a user whose processes you can read, and the nodes' notes, which list python processes with "
                       "torch loaded: pick ranks with --match REGEX (their command line, on every node) or --pid", "high",
                       "nothing to analyse", culprit=False)
    return Finding("no_data", f"no stacks were collected from any of the {len(snapshot.ranks)} ranks",
                   "see why in the dump failures above", "high", "nothing to merge", culprit=False)


def _verdict(findings: Sequence[Finding], top: Optional[Finding] = None) -> str:
    """The headline: what the finding at the wait graph's root says (`top`), else the lead finding's."""
    if top is None or top not in findings:
        top = lead(findings)
    if top is None:
        return "Nothing stands out."
    title = top.title[:1].upper() + top.title[1:]
    if top.kind == "progressing":
        slow = [f for f in findings if f.kind == "slow_node"]
        return f"{title}; " + "; ".join(f.title for f in slow) + "." if slow else f"{title}."
    if not top.culprit:
        if top.kind == "dump_failed":
            return f"No culprit found, and the picture is incomplete: {top.title}."
        return f"{title}."
    if top.confidence == "high":
        return f"{title}."
    if top.confidence == "medium":
        return f"Likely lead: {top.title}."
    return f"No clear culprit; the best lead: {top.title}."
