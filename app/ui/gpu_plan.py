"""Which nodes a GPU test runs on by default, and the progress of a running test as text. No Textual here.

The defaults follow what a user looking at the grid means: the job's nodes; the nodes of the ranks they
marked; for pair isolation, the suspect's node with a few nodes that look healthy, so the pairs tell "this
node" from "this link" without testing every node of a large job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from rich.text import Text

from app.gpu import events as ev
from app.gpu.model import PHASES, GpuTestResults, TestKind
from app.ui.grid_model import RankKey
from app.ui.safe import clean, literal
from app.ui.view import View

KINDS: Tuple[Tuple[TestKind, str, str], ...] = (
    ("sanity", "s", "every GPU allocates memory, then all_reduce + barrier; the sum is checked (per-rank OK/broken)"),
    ("bench", "b", "all_reduce bandwidth over a sweep of sizes: algbw and busbw as nccl-tests reports them"),
    ("pairs", "p", "each node alone, then node pairs in rounds, until the bad node or link is named"),
    ("net", "n", "interfaces, InfiniBand ports and whether every node reaches the job's MASTER_ADDR:PORT"),
)
GOOD_PARTNERS = 3  # healthy nodes paired with the suspect's: enough for a median and to tell node from link
RUNS_SHOWN = 8  # runs listed while a test progresses (the running ones first)


@dataclass(frozen=True)
class Plan:
    kind: TestKind
    nodes: Tuple[str, ...]


def default_nodes(kind: TestKind, all_nodes: Sequence[str], view: Optional[View], marked: Set[RankKey]
                  ) -> List[str]:
    """The nodes a test starts with, in `all_nodes` order (the hosts file's)."""
    if view is None:
        return list(all_nodes)
    job = {r.node for r in view.snapshot.ranks}
    failed = {n.name for n in view.snapshot.nodes if n.state == "failed"}
    if marked:
        chosen = {node for node, _ in marked}
    elif kind == "pairs":
        bad = {node for node, _ in view.suspects}
        if not bad:
            chosen = job or set(all_nodes)
        else:
            good = [n for n in all_nodes if n in job and n not in bad and n not in failed]
            chosen = bad | set(good[:GOOD_PARTNERS])
    else:
        chosen = job
    ordered = [n for n in all_nodes if n in chosen]
    return ordered or list(all_nodes)


def plan_text(plan: Plan, *, gpus_checked: bool = True) -> Text:
    """What will run where, in words, before the user confirms."""
    out = Text(end="")
    desc = next(d for k, _, d in KINDS if k == plan.kind)
    out.append(f"{plan.kind}", style="bold")
    out.append(f" on {len(plan.nodes)} node{'s' if len(plan.nodes) != 1 else ''}: ")
    out.append_text(literal(", ".join(plan.nodes), 400))
    out.append(f"\n{desc}.\n")
    if plan.kind == "net":
        out.append("Only looks at the nodes (interfaces, one TCP connect per target): nothing is launched.")
    else:
        out.append("Runs its own small torch.distributed job (torchrun, the job's python) on these nodes, with a "
                   "deadline: a hung test is stopped and all its processes killed. ")
        if gpus_checked:
            out.append("Never starts on GPUs the hung job still holds without asking first.", style="bold")
    if plan.kind == "pairs" and len(plan.nodes) < 3:
        out.append("\nWith fewer than 3 nodes a slow pair cannot be told from a slow node.", style="#ffaf00")
    return out


@dataclass
class RunState:
    run_id: str
    kind: str
    nodes: Tuple[str, ...]
    master: str
    port: int
    phases: Dict[Tuple[str, int], Tuple[int, str]] = field(default_factory=dict)  # (node, rank) -> (local, phase)
    status: str = "running"
    message: str = ""
    elapsed: float = 0.0


@dataclass
class Progress:
    """A running test, as its events arrive: runs (with each rank's phase), rounds of pairs, notes."""

    plan: Plan
    started: float = field(default_factory=time.monotonic)
    runs: Dict[str, RunState] = field(default_factory=dict)
    rounds: List[ev.RoundStarted] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    results: Optional[GpuTestResults] = None
    stage: str = "connecting to the nodes"
    cancelled: bool = False

    def apply(self, event: ev.GpuEvent) -> None:
        if isinstance(event, ev.RunStarted):
            self.stage = "running"
            self.runs[event.run_id] = RunState(event.run_id, event.kind, event.nodes, event.master, event.port)
        elif isinstance(event, ev.RankProgress):
            run = self.runs.get(event.run_id)
            if run is not None:
                run.phases[(event.node, event.rank)] = (event.local_rank, event.phase)
        elif isinstance(event, ev.RunFinished):
            run = self.runs.get(event.run.id)
            if run is not None:
                run.status, run.message, run.elapsed = event.run.status, event.run.message, event.run.elapsed
        elif isinstance(event, ev.RoundStarted):
            self.rounds.append(event)
        elif isinstance(event, ev.Note):
            self.notes.append(event.text)
        elif isinstance(event, ev.Finished):
            self.results = event.results
            self.stage = "finished"

    def text(self, now: Optional[float] = None) -> Text:
        now = time.monotonic() if now is None else now
        out = Text(end="")
        out.append(f"{self.plan.kind}", style="bold")
        out.append(" on ")
        out.append_text(literal(", ".join(self.plan.nodes), 200))
        state = "cancelling" if self.cancelled and self.results is None else self.stage
        out.append(f"  {state}, {now - self.started:.0f} s", style="bold #5fafff")
        for r in self.rounds[-4:]:
            tests = "  ".join("+".join(clean(u, 40) for u in t) for t in r.tests)
            what = "each alone" if all(len(t) == 1 for t in r.tests) else f"round {r.index}"
            out.append(f"\n{clean(r.scope, 40)}: {what}: ", style="bold")
            out.append(tests)
        runs = sorted(self.runs.values(), key=lambda r: r.status != "running")[:RUNS_SHOWN]
        for run in runs:
            out.append("\n\n")
            style = {"running": "bold #5fafff", "ok": "bold #5fd75f"}.get(run.status, "bold #ff5f87")
            out.append(f"{run.run_id}", style="bold")
            out.append(f"  {run.status}", style=style)
            out.append(f"  master {clean(run.master, 60)}:{run.port}")
            if run.status != "running":
                out.append(f"  {run.elapsed:.1f} s  ")
                out.append_text(literal(run.message, 160))
            for (node, rank), (local, phase) in sorted(run.phases.items(), key=lambda kv: kv[0][1]):
                out.append("\n  ")
                out.append_text(literal(node, 24))
                out.append(f"  rank {rank:<4} local {local:<3} ")
                out.append_text(phase_bar(phase))
        hidden = len(self.runs) - len(runs)
        if hidden > 0:
            out.append(f"\n\n… and {hidden} earlier runs", style="dim")
        for note in self.notes[-5:]:
            out.append("\nnote: ", style="dim")
            out.append_text(literal(note, 300))
        return out


def phase_bar(phase: str) -> Text:
    """`■■■■□□□□□□ init_pg`: how far a rank got through PHASES, readable without colour."""
    done = PHASES.index(phase) + 1 if phase in PHASES else 0
    total = len(PHASES)
    out = Text(end="")
    out.append("■" * done, style="#5fd75f")
    out.append("□" * (total - done), style="dim")
    out.append(" ")
    out.append_text(literal(phase or "?", 30))
    return out
