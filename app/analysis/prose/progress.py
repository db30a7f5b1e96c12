"""Sentences for what moved between samples (progress.py's facts): a job progressing, a few ranks still running
among stuck ones, and a slow node."""

from __future__ import annotations

from typing import Sequence, Tuple

from app.analysis.facts import Fact
from app.analysis.fold import count_phrase, short_keys
from app.analysis.frames import clean
from app.analysis.launch import LaunchEvidence
from app.analysis.progress import ProgressEvidence, RankProgress, SlowEvidence, SlowReason, size_text
from app.analysis.prose.jobs import flags_shown
from app.analysis.prose.words import who_short
from app.model import rank_key

Text = Tuple[str, str, str]


def _short(ps: Sequence[RankProgress]) -> str:
    return short_keys(tuple(rank_key(p) for p in ps), tuple(p.rank for p in ps))


def behind_phrase(behind: Sequence[RankProgress]) -> str:
    """`ranks 0-1 waited in the collective for the slow node's ranks; ranks 6-7 computed slowly there`."""
    parts = []
    for status, words in (("waiting", "waited in the collective for the slow node's ranks"),
                          ("slow", "computed slowly on the slow node")):
        ps = [p for p in behind if p.status == status]
        if ps:
            parts.append(f"{_short(ps)} {words} (unchanged between samples)")
    return "; ".join(parts)


def moved_text(moving: Sequence[RankProgress]) -> str:
    """`sockets moved 2.1 MB on 8 ranks, 3 changed stack` for the progressing headline."""
    net = [p.net_bytes for p in moving if p.net_bytes and p.sockets_moved]
    parts = []
    if net:
        parts.append(f"sockets moved {size_text(sum(net))} on {len(net)}")
    out = sum(1 for p in moving if any(m.startswith(("output", "storage")) for m in p.moved))
    if out:
        parts.append(f"{out} wrote output")
    issued = sum(1 for p in moving if any(m.endswith("(Flight Recorder)") for m in p.moved))
    if issued:
        parts.append(f"{issued} issued collectives (Flight Recorder)")
    stack = sum(1 for p in moving if "stack" in p.moved)
    if stack:
        parts.append(f"{stack} changed stack")
    return ", ".join(parts) or "counters moved"


def progress_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, ProgressEvidence)
    moving, stuck, behind = e.moving, e.stuck, e.behind
    if f.kind == "progressing":
        total = len(moving) + len(stuck) + len(behind)
        if e.counted:
            title = (f"the job is progressing: {len(moving)} of {total} ranks moved between samples "
                     f"({moved_text(moving)}); it is not hung")
            detail = "bytes moved on the ranks' sockets, output was written, or stacks changed between samples"
        else:
            title = (f"the job is progressing: {len(moving)} of {total} ranks changed stack or iteration between "
                     "samples; it is not hung")
            detail = "stacks or loop iterations differ from one sample to the next"
        if behind:
            detail += "; " + behind_phrase(behind)
        return title, detail + (f"; {count_phrase(len(stuck))} did not change" if stuck else ""), \
            "ranks were seen moving"
    reason = "seen moving between samples"
    if e.working:
        reason += (f"; but {e.working} of the {len(stuck)} ranks called stuck used CPU between samples (they work, "
                   "if not on the same step)")
    return (f"{who_short(f.who)} still {'changes' if len(moving) == 1 else 'change'} between samples while "
            f"{len(stuck)} others are stuck",
            "a rank that keeps running while the rest wait is usually the one they wait for (a slow data loader, an "
            "extra iteration, an endless loop)", reason)


def _slow_words(r: SlowReason) -> Tuple[str, str]:
    """(short, long) for one kind of slow-node evidence."""
    if r.code == "throttled":
        limit = f" {r.cgroup}" if r.cgroup else ""
        return ("its ranks are CPU-throttled by their cgroup",
                f"its ranks' cgroup{clean(limit, 200)} was CPU-throttled {r.share:.0%} of the time between samples "
                "(cpu.stat)")
    if r.code == "run_wait":
        return ("its ranks wait for a CPU", f"its ranks waited for a CPU {r.share:.0%} of the time, the other "
                f"nodes' {r.other:.0%} (schedstat)")
    if r.code == "starved":
        return ("its ranks get a fraction of a CPU while they want one",
                f"its ranks were runnable (state R) in every sample yet ran {r.share:.0%} of a CPU between them, "
                f"while the other nodes' ranks were runnable in {r.other:.0%} of samples: a CPU limit or contention "
                "holds them back (/proc stat and CPU time; the node's cgroup counters were not available)")
    if r.code == "outside":
        return ("its ranks compute while the others wait for them",
                f"its ranks were caught outside the collective in {r.share:.0%} of samples while the others waited "
                f"in it in {r.other:.0%}")
    return ("its ranks are busy while the others sleep",
            f"its ranks were running (state R) in {r.share:.0%} of samples, the others' in {r.other:.0%}")


def slow_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, SlowEvidence)
    first, _ = _slow_words(e.reasons[0])
    title = f"{e.node} is slow: {first}"
    detail = "; ".join(_slow_words(r)[1] for r in e.reasons) + (
        ". The other ranks wait for its ranks at every collective, so the whole job runs at its pace.")
    if isinstance(e.flags, LaunchEvidence):
        shown = flags_shown(e.flags)
        title = clean(f"{title}; its ranks run with other flags than the rest: {shown}", 400)
        detail += (f" Its ranks were launched with other flags than the rest ({shown}): more work per step there is "
                   "the likely reason; launch every node with the same flags.")
    return (title, detail, "counters read on the node between samples" + ("" if f.strength == "high" else
                                                                          "; one kind of evidence"))
