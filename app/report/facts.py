"""What both summary.md and report.html show, picked from the analysis (never recomputed here): the culprit
finding and rank, its diff against the majority, rank -> class, progress rows and node failures.

Every sentence taken from the analysis passes through the bundle's redactor here, once, so the renderers
only ever see redacted text.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from app.analysis.diff import StackDiff, diff_vs_majority
from app.analysis.fold import describe_keys, fold_nodes
from app.model import Frame, RankKey, RankSnapshot, Snapshot, rank_key
from app.report.redact import Redactor

if TYPE_CHECKING:
    from app.analysis import Analysis
    from app.analysis.findings import Finding



@dataclass(frozen=True)
class FindingView:
    kind: str
    title: str
    detail: str
    confidence: str
    reason: str
    ranks_label: str
    culprit: bool
    ranks: Tuple[RankKey, ...] = ()


@dataclass(frozen=True)
class ProgressRow:
    """Ranks that share a status and a stuck-since time, folded into one row."""

    status: str
    activity: str
    label: str
    since: Optional[float]
    duration: float
    count: int


@dataclass
class Facts:
    snapshot: Snapshot  # the redacted snapshot
    verdict: str = "No analysis was available for this snapshot."
    findings: List[FindingView] = field(default_factory=list)
    culprit: Optional[FindingView] = None
    culprit_rank: Optional[RankSnapshot] = None
    diff: Optional[StackDiff] = None
    class_of: Dict[RankKey, int] = field(default_factory=dict)
    suspects: set = field(default_factory=set)
    iterations: List[Tuple[int, str]] = field(default_factory=list)  # (class index, split text)
    progress: List[ProgressRow] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)


def gather(snapshot: Snapshot, analysis: Optional["Analysis"], red: Redactor) -> Facts:
    """snapshot: already redacted. analysis: computed on the unredacted snapshot, keyed by (node, pid)."""
    facts = Facts(snapshot, failures=[red.text(line) for line in node_failures(snapshot)])
    if analysis is None:
        return facts
    facts.verdict = red.text(analysis.verdict)
    facts.findings = [_view(f, red) for f in analysis.findings]
    for c in analysis.classes:
        for k in c.ranks:
            facts.class_of[k] = c.index
    found = analysis.culprit_finding  # the analysis's one culprit: the report never picks its own
    facts.culprit = _view(found, red) if found is not None else None
    if facts.culprit is not None and analysis.culprit is not None:
        facts.suspects = analysis.marked()
        lookup = {rank_key(r): r for r in snapshot.ranks}
        facts.culprit_rank = next((lookup[k] for k in analysis.culprit.ranks if k in lookup), None)
        if facts.culprit_rank is not None and analysis.classes:
            try:
                facts.diff = diff_vs_majority(snapshot, analysis, (facts.culprit_rank.node, facts.culprit_rank.pid))
            except KeyError:
                facts.diff = None  # the culprit is the whole majority, or has no stack: nothing to compare
    facts.iterations = [(s.class_index, red.text(s.text(snapshot.options.locals))) for s in analysis.iteration_splits
                        if s.split or s.locals_missing]
    facts.progress = _progress_rows(analysis)
    return facts


def _view(f: "Finding", red: Redactor) -> FindingView:
    return FindingView(f.kind, red.text(f.title), red.text(f.detail), f.confidence, red.text(f.reason),
                       red.text(f.ranks_label), f.culprit, tuple(f.ranks))


def _progress_rows(analysis: "Analysis") -> List[ProgressRow]:
    groups: Dict[Tuple[str, str, Optional[float]], List[Any]] = defaultdict(list)
    for p in analysis.progress:
        groups[(p.status, p.activity, p.since)].append(p)
    rows = []
    for (status, activity, since), ps in groups.items():
        label = describe_keys([rank_key(p) for p in ps], [p.rank for p in ps])
        rows.append(ProgressRow(status, activity, label, since, max(p.duration for p in ps), len(ps)))
    order = {"progressing": 0, "slow": 1, "waiting": 2, "gone": 3, "stuck": 4, "unknown": 5}
    rows.sort(key=lambda r: (order.get(r.status, 9), r.count, r.label))
    return rows


def node_failures(snapshot: Snapshot) -> List[str]:
    """`node[03-07]: failed at login: ssh_auth — remedy`, nodes aggregated by what went wrong."""
    by: Dict[Tuple[str, str, str, str], List[str]] = defaultdict(list)
    for n in snapshot.nodes:
        if n.state in ("failed", "partial"):
            e = n.error
            by[(n.state, e.code if e else "unknown", e.phase if e else "", e.hint if e else "")].append(n.name)
    lines = []
    for (state, code, phase, hint), names in sorted(by.items(), key=lambda kv: -len(kv[1])):
        where = f" at {phase}" if phase else ""
        text = f"{fold_nodes(names)}: {state}{where}: {code.replace('_', ' ')}"
        if len(names) == 1:
            n = next(n for n in snapshot.nodes if n.name == names[0])
            if n.error is not None and n.error.message:
                text += f" ({n.error.message})"
        lines.append(text + (f". What to do: {hint}" if hint else ""))
    failed_ranks: Dict[str, List[RankSnapshot]] = defaultdict(list)
    for r in snapshot.ranks:
        if r.error is not None:
            failed_ranks[r.error.code].append(r)
    for code, ranks in sorted(failed_ranks.items(), key=lambda kv: -len(kv[1])):
        label = describe_keys([rank_key(r) for r in ranks], [r.rank for r in ranks])
        hint = ranks[0].error.hint if ranks[0].error else ""
        remedy = f". What to do: {hint}" if hint else ""
        lines.append(f"{label}: stacks not collected: {code.replace('_', ' ')}{remedy}")
    return lines


def frame_line(f: Frame) -> str:
    """`all_reduce (distributed_c10d.py:2501)` plus the loop iteration when known."""
    it = ", ".join(f"{n}={v}" for n, v in f.iteration)
    return f"{f.function} ({f.location})" + (f"  [{it}]" if it else "")


def main_frames(r: RankSnapshot) -> Sequence[Frame]:
    t = r.main_thread
    return t.frames if t is not None else ()


def top_frames(analysis: Optional["Analysis"], red: Redactor) -> Dict[int, str]:
    """Class index -> its innermost frame, for tooltips and legends."""
    if analysis is None:
        return {}
    return {c.index: red.text(f"{c.frames[-1].function} ({c.frames[-1].location})") if c.frames else ""
            for c in analysis.classes}
