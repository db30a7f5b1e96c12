"""Progress over time: from samples of the same job, each rank is stuck, progressing or gone.

A rank is keyed by (node, pid, start_time) so that a reused pid is a new rank. Its signature in a sample is
its selected thread's frames (function, file, line) with their loop iteration values; `stuck` means the
signature has not changed for `stuck_samples` samples in a row. CPU time consumed between the last two
samples tells a stuck rank that spins from one that sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Dict, List, Literal, Optional, Sequence, Tuple

from app.analysis.findings import Finding
from app.analysis.fold import count_phrase, describe_keys, fold_nodes, short_keys
from app.analysis.options import AnalysisOptions, selector
from app.model import RankSnapshot, Snapshot

Status = Literal["stuck", "progressing", "gone", "unknown"]
Activity = Literal["spinning", "sleeping", "busy", "unknown"]
ProgressKey = Tuple[str, int, int]  # (node, pid, start_time)

_signature_part = attrgetter("function", "filename", "line", "iteration")


@dataclass(frozen=True)
class RankProgress:
    node: str
    pid: int
    start_time: int
    rank: Optional[int]
    status: Status
    since: Optional[float] = None  # epoch seconds of the first sample of the current unchanged run
    duration: float = 0.0  # seconds from `since` to the latest sample
    samples: int = 0  # samples in the current unchanged run
    cpu: Optional[float] = None  # share of one core used between the last two samples
    activity: Activity = "unknown"


def _signature(rank: RankSnapshot, options: AnalysisOptions) -> Optional[tuple]:
    t = selector(options)(rank)
    if t is None or not t.frames:
        return None
    return tuple(map(_signature_part, t.frames))


def track(samples: Sequence[Snapshot], options: AnalysisOptions = AnalysisOptions()) -> Tuple[RankProgress, ...]:
    """Per rank status over `samples` (oldest first; the last one is the current snapshot)."""
    if not samples:
        return ()
    # one sample per moment: the current snapshot passed again in the history is not a second sample
    ordered = sorted({s.taken_at: s for s in samples}.values(), key=attrgetter("taken_at"))
    seen: Dict[ProgressKey, List[Tuple[float, Optional[tuple], float, RankSnapshot]]] = {}
    for snap in ordered:
        for r in snap.ranks:
            seen.setdefault((r.node, r.pid, r.start_time), []).append(
                (snap.taken_at, _signature(r, options), r.cpu_time, r))
    latest = ordered[-1].taken_at
    out = []
    for key, history in seen.items():
        when, sig, _, rank = history[-1]
        if when != latest:
            out.append(RankProgress(*key, rank.rank, "gone", since=when, duration=latest - when,
                                    samples=len(history)))
            continue
        run = 1
        while run < len(history) and sig is not None and history[-1 - run][1] == sig:
            run += 1
        since = history[-run][0]
        cpu: Optional[float] = None
        if len(history) >= 2 and history[-1][0] > history[-2][0]:
            cpu = max(0.0, (history[-1][2] - history[-2][2]) / (history[-1][0] - history[-2][0]))
        if sig is None:
            status: Status = "unknown"
        elif run >= options.stuck_samples:
            status = "stuck"
        elif len(history) > run and history[-1 - run][1] is not None:
            status = "progressing"  # the stack or iteration changed since the previous sample
        else:
            status = "unknown"  # not enough samples yet
        out.append(RankProgress(*key, rank.rank, status, since, latest - since, run, cpu, _activity(cpu, options)))
    out.sort(key=lambda p: (p.rank is None, p.rank or 0, p.node, p.pid, p.start_time))
    return tuple(out)


def _activity(cpu: Optional[float], options: AnalysisOptions) -> Activity:
    if cpu is None:
        return "unknown"
    if cpu >= options.spinning_cpu:
        return "spinning"
    if cpu <= options.sleeping_cpu:
        return "sleeping"
    return "busy"


def progress_findings(progress: Sequence[RankProgress]) -> List[Finding]:
    """Progressing job (not hung), a few ranks still moving among stuck ones, ranks gone between samples."""
    by: Dict[str, List[RankProgress]] = {"stuck": [], "progressing": [], "gone": [], "unknown": []}
    for p in progress:
        by[p.status].append(p)
    out = []
    moving, stuck, gone = by["progressing"], by["stuck"], by["gone"]
    if gone:
        keys, numbers = _keys(gone)
        out.append(Finding("exited", f"{short_keys(keys, numbers)} {'is' if len(gone) == 1 else 'are'} gone "
                           "since an earlier sample", "a rank that exits leaves the others waiting for it forever",
                           "high", "the process was seen before and is no longer there", keys,
                           describe_keys(keys, numbers), fold_nodes(k[0] for k in keys)))
    if moving and (not stuck or len(moving) > len(stuck)):
        keys, numbers = _keys(moving)
        out.append(Finding("progressing", f"the job is progressing: {len(moving)} of {len(moving) + len(stuck)} "
                           "ranks changed stack or iteration between samples; it is not hung",
                           "stacks or loop iterations differ from one sample to the next"
                           + (f"; {count_phrase(len(stuck))} did not change" if stuck else ""), "high" if not stuck else
                           "medium", "ranks were seen moving", keys, describe_keys(keys, numbers),
                           fold_nodes(k[0] for k in keys), culprit=False))
    elif moving and stuck:
        keys, numbers = _keys(moving)
        out.append(Finding("still_running", f"{short_keys(keys, numbers)} still {'changes' if len(moving) == 1 else 'change'}"
                           f" between samples while {len(stuck)} others are stuck",
                           "a rank that keeps running while the rest wait is usually the one they wait for "
                           "(a slow data loader, an extra iteration, an endless loop)", "high"
                           if len(moving) * 3 <= len(stuck) else "medium", "seen moving between samples",
                           keys, describe_keys(keys, numbers), fold_nodes(k[0] for k in keys)))
    return out


# Culprit findings read off one sample's stacks: in a job that moves, ranks caught at different places (one in
# its data loader, the rest in all_reduce; one a step ahead) are the normal state of a running job, not a lead.
_SNAPSHOT_KINDS = frozenset({"minority_stack", "different_collective", "iteration_split", "collective_lag"})


def while_progressing(findings: Sequence[Finding]) -> List[Finding]:
    """When the samples show the job progressing, findings from one sample's stacks become low-confidence."""
    if not any(f.kind == "progressing" for f in findings):
        return list(findings)
    return [replace(f, confidence="low", reason=f"{f.reason}; but the job is progressing, and ranks of a running "
                    "job are caught at different places") if f.kind in _SNAPSHOT_KINDS and f.culprit else f
            for f in findings]


def _keys(ps: Sequence[RankProgress]) -> Tuple[tuple, tuple]:
    return tuple((p.node, p.pid) for p in ps), tuple(p.rank for p in ps)


def stuck_summary(progress: Sequence[RankProgress]) -> str:
    """`8 ranks stuck for 42 s (since the first of 3 samples); 7 sleeping, 1 spinning`, or ""."""
    stuck = [p for p in progress if p.status == "stuck"]
    if not stuck:
        return ""
    longest = max(p.duration for p in stuck)
    acts: Dict[str, int] = {}
    for p in stuck:
        acts[p.activity] = acts.get(p.activity, 0) + 1
    shown = ", ".join(f"{n} {a}" for a, n in sorted(acts.items()) if a != "unknown")
    return f"{count_phrase(len(stuck))} stuck for up to {longest:.0f} s" + (f"; {shown}" if shown else "")
