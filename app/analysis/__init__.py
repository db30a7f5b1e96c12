"""The analysis core: pure functions from snapshots to classes, a merged tree, findings and a verdict.

Import contract: nothing under app/analysis imports textual, asyncssh, app.transport, app.session or app.ui
(a test checks it in a subprocess). `analyze` is the entry point; everything it returns is frozen and
`Analysis.to_dict()` is what the snapshot file stores under "analysis".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from app.analysis.columns import facts
from app.analysis.findings import Finding, identical_finding, lead, order, stack_findings
from app.analysis.flight import FlightSummary, flight_analysis
from app.analysis.health import dump_failures, failed_nodes, jobs, missing_ranks, process_states
from app.analysis.health import several_jobs, thread_counts
from app.analysis.iterations import IterationSplit, iteration_findings, locals_missing_finding, split_iterations
from app.analysis.network import network_findings
from app.analysis.options import AnalysisOptions
from app.analysis.progress import RankProgress, progress_findings, track, while_progressing
from app.analysis.tree import StackClass, StackTree, TreeNode, build_tree, group_stacks  # noqa: F401 (API)
from app.model import Frame, Snapshot, to_dict

__all__ = ["Analysis", "AnalysisOptions", "Finding", "StackClass", "StackTree", "TreeNode", "IterationSplit",
           "RankProgress", "analyze"]


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
                        "ranks": [list(k) for k in g.ranks]} for g in s.groups]}


def analyze(snapshot: Snapshot, *, history: Sequence[Snapshot] = (),
            options: AnalysisOptions = AnalysisOptions()) -> Analysis:
    """Everything hangscope concludes from one snapshot (and earlier samples of the same job, oldest first)."""
    started = time.perf_counter()
    ranks = snapshot.ranks
    rank_facts = facts(ranks)  # the one read of every rank (columns.py)
    grouping = group_stacks(ranks, options, rank_facts)
    classes = grouping.classes
    tree = build_tree(classes, options)
    splits = split_iterations(grouping)

    findings: List[Finding] = stack_findings(classes)
    for split in splits:
        findings.extend(iteration_findings(split))
    dominant_split = next((s for s in splits if classes and s.class_index == classes[0].index), None)
    locals_missing = dominant_split is not None and dominant_split.locals_missing
    if locals_missing and dominant_split is not None:
        findings.append(locals_missing_finding(dominant_split, snapshot.options.locals, classes[0].label))

    by_job = jobs(rank_facts)
    findings += several_jobs(by_job)
    findings += missing_ranks(snapshot, by_job)
    findings += failed_nodes(snapshot)
    findings += dump_failures(grouping.no_stack, options.thread if isinstance(options.thread, str) else "custom")
    findings += process_states(rank_facts)
    findings += thread_counts(rank_facts)
    flight, lagging = flight_analysis(ranks, rank_facts)
    findings += lagging

    same_place = len(classes) == 1 and not (dominant_split is not None and dominant_split.split)
    network = network_findings(snapshot, same_place=same_place, same_stack=len(classes) == 1,
                               sockets=rank_facts.sockets)
    findings += network

    progress: Tuple[RankProgress, ...] = ()
    if history:
        progress = track(list(history) + [snapshot], options)
        findings += progress_findings(progress)
        findings = while_progressing(findings)
    if same_place:
        findings.append(identical_finding(classes[0], locals_missing=locals_missing and not snapshot.options.locals,
                                          network=bool(network),
                                          history=bool(history), incomplete=bool(grouping.no_stack),
                                          sockets=any(rank_facts.sockets)))
    if not classes:
        findings.append(_no_data(snapshot))
    ordered = order(findings)
    return Analysis(_verdict(ordered), ordered, classes, tree, splits, progress, len(ranks),
                    len(ranks) - len(grouping.no_stack), options, time.perf_counter() - started, flight)


def _no_data(snapshot: Snapshot) -> Finding:
    if not snapshot.ranks:
        failed = sum(1 for n in snapshot.nodes if n.state == "failed")
        why = f"; {failed} of {len(snapshot.nodes)} nodes failed" if failed else ""
        return Finding("no_data", f"no rank processes were found{why}",
                       "hangscope looks for processes with RANK/LOCAL_RANK in their environment; check the hosts "
                       "list, and that the job runs as a user whose processes you can read", "high",
                       "nothing to analyse", culprit=False)
    return Finding("no_data", f"no stacks were collected from any of the {len(snapshot.ranks)} ranks",
                   "see why in the dump failures above", "high", "nothing to merge", culprit=False)


def _verdict(findings: Sequence[Finding]) -> str:
    top = lead(findings)
    if top is None:
        return "Nothing stands out."
    title = top.title[:1].upper() + top.title[1:]
    if top.kind == "progressing" or not top.culprit:
        if top.kind == "dump_failed":
            return f"No culprit found, and the picture is incomplete: {top.title}."
        return f"{title}."
    if top.confidence == "high":
        return f"{title}."
    if top.confidence == "medium":
        return f"Likely lead: {top.title}."
    return f"No clear culprit; the best lead: {top.title}."
