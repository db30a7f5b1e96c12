#!/usr/bin/env python3
"""How right the diagnosis is: the analysis over every recorded scenario, against what really happened.

Every scenario in tests/data/scenarios/ is a real job hung (or not) in one way on the test cluster, recorded
by tests/support/record_scenarios.py: <name>.json (the second sample) and <name>.earlier.json (the first, as
history, as the CLI analyses it). TRUTH below says what happened in each, from the scenario's own set-up, not
from what hangscope said: the culprit (rank numbers, or a node) and the cause, as the words a right headline
must contain. A headline is right when the first finding names the culprit (its ranks, or its node), every word of the cause,
and the mechanism: the blocking operation (or the state that holds the rank) and what it waits for (one word of
each of the truth's alternatives); a [high] culprit finding that names another rank or node contradicts the truth, as does a
[high] culprit finding on a job that is not hung (but for the slow node a slow job's truth names).

    python3 bench/diagnose.py [--data DIR] [--json OUT]

Prints one row per scenario and the accuracy; exits 1 when a headline is wrong or a [high] finding is
contradicted (a recorded scenario with no TRUTH entry is an error too: every class must say what it is).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from app.analysis import Analysis, analyze  # noqa: E402
from app.model import Snapshot  # noqa: E402
from app.model.codec import snapshot_from_json  # noqa: E402

DATA = REPO / "tests" / "data" / "scenarios"


@dataclass(frozen=True)
class Truth:
    """What happened: the class of hang, its culprit, and the words a right headline says about the cause."""

    hang: str  # the class, in words
    culprit: Tuple[int, ...] = ()  # rank numbers the headline must name (none: a node, or no culprit)
    node: str = ""  # or the node it must name
    cause: Tuple[str, ...] = ()  # words the headline must contain
    hung: bool = True  # False: a healthy job, which must never be called hung
    # the mechanism: the blocking operation (or state) and what it waits for / who releases it, each as
    # alternatives (the headline must contain one of each); a location alone ("rank 4 is in `f`") names neither
    operation: Tuple[str, ...] = ()
    resource: Tuple[str, ...] = ()


TRUTH: Dict[str, Truth] = {
    "skip": Truth("one rank skipped a collective: one iteration ahead on the same line", (2,),
                  cause=("rank 2", "iteration ahead")),
    "dataloader": Truth("one rank blocked reading its next batch", (1,), cause=("rank 1", "_recv_exact")),
    "die": Truth("one rank exited, its sockets held open", (3,), cause=("rank 3 not found",)),
    "netcut": Truth("a node cut off from the network", node="node02", cause=("node02", "stall")),
    "healthy": Truth("a healthy job, training", hung=False, cause=("progressing",)),
    "lock": Truth("a lock held by another thread of the culprit", (1,),
                  cause=("rank 1", "_metrics_lock", "checkpoint-writer")),
    "deadlock": Truth("two threads of one rank take two locks in opposite orders", (2,),
                      cause=("rank 2", "deadlocked")),
    "order": Truth("one rank all_reduces its buckets (a group each) in another order", (1,),
                   cause=("rank 1", "another order")),
    "uneven": Truth("DDP with uneven inputs: one rank's data ran out, it left the loop for evaluate()", (2,),
                    cause=("rank 2", "left the loop", "backward")),
    "stopped": Truth("one rank stopped with SIGSTOP (ps state T)", (3,), cause=("rank 3", "stopped", "kill -CONT")),
    "frozen": Truth("one rank frozen by the cgroup freezer", (2,), cause=("rank 2", "frozen", "thaw")),
    "spawn": Truth("mp.spawn ranks (no RANK in the environment); one never reaches the 2nd all_reduce", (2,),
                   cause=("rank 2", "demo_basic")),
    "twojobs": Truth("two jobs on the same nodes: one hung in its data loader, one training", (3,),
                     cause=("is hung", "rank 3", "_recv_exact", "progressing, not hung")),
    "slow": Truth("a node's ranks capped to 10 % of a CPU: slow, not hung", node="node02", hung=False,
                  cause=("progressing", "node02 is slow")),
    "missing": Truth("the hosts list leaves out the culprit's node", (2, 3),
                     cause=("ranks 2-3", "not in the snapshot", "node02")),
    "mismatch": Truth("mismatched collectives: one rank in all_gather, the others in all_reduce", (1,),
                      cause=("rank 1", "all_gather", "all_reduce")),
    "gil": Truth("a native call that blocks holding the GIL", (2,), cause=("rank 2", "holds the GIL")),
    "native": Truth("a native call (GIL released) that never returns", (3,), cause=("rank 3", "native call")),
    "pipe": Truth("a rank blocked writing to a pipe nobody reads", (1,), cause=("rank 1", "full pipe")),
    "fsstall": Truth("a rank reading a file on a stalled file system (D state)", (2,),
                     cause=("rank 2", "uninterruptible")),
}
TRUTH["gpu_xid"] = Truth("a rank stuck in a CUDA call on a GPU that fell off the bus (a FAKE Xid 79 on its node)",
                         (3,), cause=("rank 3", "node02", "Xid 79", "fallen off the bus"))
# Real open-source training scripts, unmodified, 4 nodes x 2 ranks (tests/oss/README.md, tests/support/record_oss.py)
TRUTH["nanogpt-healthy"] = Truth("nanoGPT's train.py, DDP on CPU, training", hung=False, cause=("progressing",))
TRUTH["nanogpt-stopped"] = Truth("nanoGPT's train.py, rank 5 stopped with SIGSTOP", (5,),
                                 cause=("rank 5", "stopped", "kill -CONT"))
TRUTH["lightning-healthy"] = Truth("Lightning Fabric's language-model example, training", hung=False,
                                   cause=("progressing",))
TRUTH["lightning-frozen"] = Truth("Lightning Fabric's example, rank 5 frozen by a cgroup v2 freezer", (5,),
                                  cause=("rank 5", "frozen", "cgroup freezer"))


# What each recorded class blocks in and waits for, from its set-up (app/demo/job.py, tests/record_scenarios.py)
MECHANISM: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "skip": (("all_reduce",), ("iteration ahead", "step=4 vs 3")),
    "dataloader": (("socket.recv", "recv"), ("socket", "peer")),
    "die": (("not found",), ("exited", "OOM")),
    "netcut": (("stall",), ("node02",)),
    "lock": (("_metrics_lock",), ("checkpoint-writer",)),
    "deadlock": (("deadlock",), ("lock",)),
    "order": (("another order",), ("names", "iterate")),
    "uneven": (("left the loop",), ("backward", "all_reduce")),
    "stopped": (("stopped",), ("kill -CONT", "SIGSTOP")),
    "frozen": (("frozen",), ("thaw", "cgroup")),
    "spawn": (("Event.wait",), ("event",)),
    "twojobs": (("socket.recv", "recv"), ("socket", "peer")),
    "missing": (("not in the snapshot",), ("hosts list",)),
    "mismatch": (("all_gather",), ("all_reduce",)),
    "gil": (("GIL",), ("native code", "pause")),
    "native": (("native call",), ("pause",)),
    "pipe": (("full pipe",), ("read end", "does not read")),
    "fsstall": (("uninterruptible",), ("stall", "I/O")),
    "gpu_xid": (("Xid 79",), ("fallen off the bus",)),
    "nanogpt-stopped": (("stopped",), ("kill -CONT", "SIGSTOP")),
    "lightning-frozen": (("frozen",), ("thaw", "cgroup")),
}
for _name, (_op, _res) in MECHANISM.items():
    TRUTH[_name] = dataclasses.replace(TRUTH[_name], operation=_op, resource=_res)


@dataclass(frozen=True)
class Row:
    name: str
    truth: Truth
    headline: str
    right: bool
    contradicted: Tuple[str, ...]  # [high] findings the truth contradicts
    why: str  # what is wrong with the headline, when it is
    culprit_right: bool = True  # the first finding names the culprit (ranks or node), or a healthy job progresses
    operation: bool = True  # the headline names the blocking operation (or state)
    resource: bool = True  # ... and what it waits for / who releases it

    @property
    def mechanism(self) -> bool:
        return self.operation and self.resource


def load(data: Path, name: str) -> Tuple[Snapshot, List[Snapshot]]:
    snap, _ = snapshot_from_json((data / f"{name}.json").read_text(encoding="utf-8"))
    earlier = data / f"{name}.earlier.json"
    history = [snapshot_from_json(earlier.read_text(encoding="utf-8"))[0]] if earlier.exists() else []
    return snap, history


@dataclass(frozen=True)
class Said:
    """A finding as the judge reads it: from an Analysis, or from a snapshot file's stored analysis."""

    kind: str
    title: str
    confidence: str
    culprit: bool
    ranks: Tuple[Tuple[str, int], ...]
    nodes: str


def said(findings: List[Dict]) -> List[Said]:
    """Findings of a stored analysis (a snapshot file's "analysis"), for judge()."""
    return [Said(f["kind"], f["title"], f["confidence"], f["culprit"], tuple((k[0], k[1]) for k in f["ranks"]),
                 f.get("nodes", "")) for f in findings]


def judge(name: str, truth: Truth, snap: Snapshot, a: Analysis) -> Row:
    return judge_parts(name, truth, snap, a.verdict, a.findings)


def judge_parts(name: str, truth: Truth, snap: Snapshot, headline: str, findings: Sequence) -> Row:
    """The verdict and findings (Finding or Said) against the truth."""
    numbers = {(r.node, r.pid): r.rank for r in snap.ranks}
    low = headline.lower()
    problems = [f"does not say `{w}`" for w in truth.cause if w.lower() not in low]
    top = findings[0] if findings else None
    if top is None:
        problems.append("no finding")
    elif truth.hung:
        named = {numbers.get(k) for k in top.ranks}
        if truth.culprit and top.ranks and named != set(truth.culprit):
            problems.append(f"names rank(s) {sorted(n for n in named if n is not None)}")
        if truth.node and truth.node not in (top.nodes or top.title):
            problems.append(f"does not name {truth.node}")
        if top.kind == "progressing":
            problems.append("calls a hung job progressing")
    elif top.kind != "progressing":
        problems.append("calls a healthy job hung")
    contradicted = []
    for f in findings:
        if f.confidence != "high" or not f.culprit:
            continue
        if not truth.hung:
            if not (truth.node and f.kind == "slow_node" and f.nodes == truth.node):  # the slow node is the truth
                contradicted.append(f.title)
            continue
        named = {numbers.get(k) for k in f.ranks}
        if truth.culprit and f.ranks and not named <= set(truth.culprit):
            contradicted.append(f.title)
        elif truth.node and f.nodes and truth.node not in f.nodes:
            contradicted.append(f.title)
    culprit_right = not any(p.startswith(("names rank", "does not name", "calls a", "no finding")) for p in problems)
    op = not truth.operation or any(w.lower() in low for w in truth.operation)
    res = not truth.resource or any(w.lower() in low for w in truth.resource)
    if truth.hung and not (op and res):
        problems.append("the mechanism is not named: " + "; ".join(
            f"none of {list(ws)}" for ws, ok in ((truth.operation, op), (truth.resource, res)) if not ok))
    return Row(name, truth, headline, not problems, tuple(contradicted), "; ".join(problems), culprit_right, op, res)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--data", type=Path, default=DATA, help="folder of recorded scenarios (tests/data/scenarios)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    names = sorted(p.name[:-len(".json")] for p in args.data.glob("*.json") if not p.name.endswith(".earlier.json"))
    unknown = [n for n in names if n not in TRUTH]
    rows = []
    for name in names:
        if name in unknown:
            continue
        snap, history = load(args.data, name)
        rows.append(judge(name, TRUTH[name], snap, analyze(snap, history=history)))
    width = 100
    print(f"{'scenario':<11} {'right':<5} {'high?':<5} truth -> headline")
    for r in rows:
        print(f"{r.name:<11} {'yes' if r.right else 'NO':<5} {len(r.contradicted):<5} {r.truth.hang}")
        for line in textwrap.wrap(r.headline, width - 18):
            print(f"{'':<17} {line}")
        if not r.right:
            print(f"{'':<17} wrong: {r.why}")
        for title in r.contradicted:
            print(f"{'':<17} contradicted [high]: {title}")
    right = sum(r.right for r in rows)
    contradicted = sum(len(r.contradicted) for r in rows)
    hung = [r for r in rows if r.truth.hung]
    culprits = sum(r.culprit_right for r in rows)
    mechanisms = sum(r.mechanism for r in hung)
    print(f"\n{right} of {len(rows)} headlines right ({right / max(len(rows), 1):.0%}); "
          f"{contradicted} [high] finding(s) contradicted by the truth")
    print(f"culprit named: {culprits} of {len(rows)}; mechanism named (the blocking operation and what it waits "
          f"for) in {mechanisms} of {len(hung)} hung jobs (operation {sum(r.operation for r in hung)}, "
          f"resource {sum(r.resource for r in hung)})")
    for n in unknown:
        print(f"error: recorded scenario {n!r} has no TRUTH entry in bench/diagnose.py", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps([{"scenario": r.name, "hang": r.truth.hang, "headline": r.headline,
                                          "right": r.right, "culprit": r.culprit_right, "operation": r.operation,
                                          "resource": r.resource, "contradicted": list(r.contradicted),
                                          "why": r.why} for r in rows], indent=1))
    return 0 if right == len(rows) and not contradicted and not unknown else 1


if __name__ == "__main__":
    sys.exit(main())
