"""What the screens show, derived from a snapshot and its analysis. Pure: no Textual, no analysis of its own.

Everything analytical (classes, findings, suspects' evidence, progress, diffs) comes from app.analysis; this
module only assigns glyphs and colours, aggregates node states for display and matches the `/` filter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from app.analysis import Analysis, Finding, RankProgress, analyze
from app.analysis.prose.words import where
from app.analysis.fold import fold_nodes
from app.analysis.prose.gpu import evidence_lines
from app.model import Frame, NodeStatus, RankSnapshot, Snapshot, rank_key
from app.ui.grid_model import RankKey, class_color, class_symbol

FindingView = Finding


@dataclass(frozen=True)
class ClassView:
    index: int
    symbol: str
    color: str
    size: int
    label: str  # `ranks 0-6,8-15 on node[01-04]`
    where: str  # `in `all_reduce` (distributed_c10d.py:2501)`
    suspect: bool  # every rank of the class is a suspect
    keys: FrozenSet[RankKey]
    suspects: int = 0  # how many of its ranks are suspects (one rank a step ahead inside a big class)


@dataclass(frozen=True)
class NodeGroup:
    """Nodes in the same state for the same reason: `node[03-07]: failed: ptrace denied (ptrace_scope=1)`."""

    nodes: str
    state: str
    reason: str = ""
    hint: str = ""
    count: int = 1
    ranks: int = 0
    gpu: Tuple[str, ...] = ()  # GPU evidence of its nodes (NCCL/CUDA jobs): `node02: Xid 79 on 0000:5d:00 ...`


@dataclass
class View:
    snapshot: Snapshot
    analysis: Analysis
    classes: Tuple[ClassView, ...] = ()
    class_of: Dict[RankKey, int] = field(default_factory=dict)
    suspects: Set[RankKey] = field(default_factory=set)
    nodes: Tuple[NodeGroup, ...] = ()
    progress: Dict[RankKey, RankProgress] = field(default_factory=dict)
    ranks: Dict[RankKey, RankSnapshot] = field(default_factory=dict)

    @property
    def findings(self) -> Tuple[Finding, ...]:
        return self.analysis.findings

    def class_view(self, key: RankKey) -> Optional[ClassView]:
        i = self.class_of.get(key)
        return self.classes[i] if i is not None and i < len(self.classes) else None


def build_view(snapshot: Snapshot, history: Sequence[Snapshot] = ()) -> View:
    analysis = analyze(snapshot, history=history)
    suspects = analysis.marked()  # the analysis's own culprit(s): one rule for every screen and report
    classes = []
    class_of: Dict[RankKey, int] = {}
    for pos, c in enumerate(analysis.classes):
        keys = frozenset(c.ranks)
        for k in c.ranks:
            class_of[k] = pos
        among = len(keys & suspects)
        classes.append(ClassView(pos, class_symbol(pos), class_color(pos), c.size, c.label, where(c),
                                 bool(keys) and among == len(keys), keys, among))
    progress = {rank_key(p): p for p in analysis.progress}
    return View(snapshot, analysis, tuple(classes), class_of, suspects, node_groups(snapshot.nodes, snapshot.ranks),
                progress, {rank_key(r): r for r in snapshot.ranks})


_STATE_ORDER = {"failed": 0, "partial": 1, "pending": 2, "connecting": 3, "discovering": 4, "collecting": 5,
                "done": 6}


def node_groups(nodes: Sequence[NodeStatus], ranks: Sequence[RankSnapshot] = ()) -> Tuple[NodeGroup, ...]:
    """Nodes grouped by state and reason (the node's own name taken out of the message), names folded."""
    per_node: Dict[str, int] = {}
    for r in ranks:
        per_node[r.node] = per_node.get(r.node, 0) + 1
    groups: Dict[Tuple[str, str, str], List[NodeStatus]] = {}
    for n in nodes:
        reason = code = ""
        if n.error is not None and n.state in ("failed", "partial"):
            code = n.error.code
            reason = _without_name(n.error.message, n.name) or code.replace("_", " ")
        groups.setdefault((n.state, code, reason), []).append(n)
    out = []
    for (state, _code, reason), members in sorted(groups.items(), key=lambda kv: (_STATE_ORDER.get(kv[0][0], 9),
                                                                                   kv[0])):
        hint = next((m.error.hint for m in members if m.error is not None and m.error.hint), "") if reason else ""
        out.append(NodeGroup(fold_nodes(m.name for m in members), state, reason, hint, len(members),
                             sum(per_node.get(m.name, 0) for m in members),
                             tuple(f"{m.name}: {line}" for m in members for line in evidence_lines(m))[:16]))
    return tuple(out)


def _without_name(message: str, name: str) -> str:
    """`node04: ptrace denied` -> `ptrace denied`, so the same failure on many nodes reads as one line."""
    text = message.strip()
    for prefix in (f"{name}: ", f"{name} "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text


def duration_text(seconds: float) -> str:
    """4m12s, 1h03m, 42s."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def progress_text(p: Optional[RankProgress]) -> str:
    if p is None:
        return ""
    if p.status == "stuck":
        text = f"stuck for {duration_text(p.duration)}"
        return f"{text} ({p.activity})" if p.activity in ("spinning", "polling", "sleeping") else text
    if p.status == "progressing":
        return "progressing"
    if p.status == "gone":
        return f"gone for {duration_text(p.duration)}"
    if p.status == "waiting":
        return "waiting for a slow node"
    if p.status == "slow":
        return "slow node"
    return ""


def top_frame(rank: RankSnapshot) -> Optional[Frame]:
    t = rank.main_thread
    return t.frames[0] if t is not None and t.frames else None


# -- the `/` filter ---------------------------------------------------------------------------------------

_RANKS = re.compile(r"^(?:rank\s*)?(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)$", re.IGNORECASE)
_PIDS = re.compile(r"^pids?\s*(\d+(?:\s*,\s*\d+)*)$", re.IGNORECASE)


def parse_ranks(query: str) -> Optional[Set[int]]:
    """`5`, `rank 5`, `0-3,7` -> rank numbers; None when the query is not a rank list."""
    m = _RANKS.match(query.strip())
    if m is None:
        return None
    out: Set[int] = set()
    for part in m.group(1).split(","):
        a, _, b = part.partition("-")
        lo, hi = int(a), int(b or a)
        if hi - lo > 1_000_000:
            return None
        out.update(range(lo, hi + 1))
    return out


def filter_keys(snapshot: Snapshot, query: str) -> Optional[Set[RankKey]]:
    """Ranks matching a filter: rank numbers (`5`, `0-7`), pids (`pid 4242,4243`), node names (a NodeSet
    like node[01-04], or part of a name), or text in any frame's function or file. None: no filter."""
    q = query.strip()
    if not q:
        return None
    pids = _PIDS.match(q)
    if pids is not None:
        wanted = {int(p) for p in pids.group(1).replace(" ", "").split(",")}
        return {rank_key(r) for r in snapshot.ranks if r.pid in wanted}
    numbers = parse_ranks(q)
    if numbers is not None:
        return {rank_key(r) for r in snapshot.ranks if r.rank in numbers}
    nodes = _expand_nodes(q)
    low = q.lower()
    out = set()
    for r in snapshot.ranks:
        if r.node in nodes or low in r.node.lower() or _frames_contain(r, low):
            out.add(rank_key(r))
    return out


def _expand_nodes(query: str) -> Set[str]:
    if "[" not in query:
        return set()
    try:
        from ClusterShell.NodeSet import NodeSet, NodeSetException

        return set(NodeSet(query))
    except (NodeSetException, ValueError, TypeError, IndexError):
        return set()


def _frames_contain(rank: RankSnapshot, low: str) -> bool:
    for t in rank.threads:
        for f in t.frames:
            if low in f.function.lower() or low in f.filename.lower():
                return True
    return False
