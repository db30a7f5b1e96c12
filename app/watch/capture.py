"""The capture: the moment a watched job stalls (or runs slow), the same collection as `hangscope --snapshot`
(a full snapshot with the collection options given, --locals by default, then a second, non-blocking sample for
progress), analysed for that job, written as the export bundle (redacted, 0600 files in a 0700 directory) into
the watch's --out directory, with the watch's own context beside it (watch.json).

This is the only place hangscope watch touches a rank with py-spy (and so with ptrace, unless --nonblocking):
the cheap samples before it never do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List

from app.analysis import analyze, only_job
from app.model import CollectOptions, Snapshot
from app.report import Redactor, build_bundle, write_bundle
from app.report.bundle import Bundle
from app.watch.outdir import OutDir
from app.watch.tracker import JobState

if TYPE_CHECKING:
    from app.analysis import Analysis
    from app.session import Session

SECOND_SAMPLE = 1.0  # seconds between the capture's two samples (the CLI's --interval)
DEADLINE = 600.0  # seconds a capture may take in all before what arrived is kept (the session's own deadlines first)
WATCH_FILE = "watch.json"
POINTS_SAVED = 240  # rate points of the job (and of each node) written beside the capture


@dataclass(frozen=True)
class CaptureResult:
    path: str  # the bundle directory
    snapshot: str  # its snapshot.json
    headline: str
    took: float
    partial: str  # "" when every rank of the job was collected
    analysis: "Analysis"


class CaptureError(Exception):
    """The capture found nothing of the job to write (its ranks were gone by then)."""


async def capture(session: "Session", out: OutDir, job: JobState, kind: str, collect: CollectOptions, *,
                  context: str, deadline: float = DEADLINE) -> CaptureResult:
    """Collect, analyse and write one capture of `job`; the session's collect options are restored after."""
    t0 = time.monotonic()
    before = session.options.collect
    timer = asyncio.get_running_loop().call_later(deadline, session.cancel)  # keep what arrived by then
    try:
        session.use(collect)
        first = await session.snapshot()
        snap = first
        if not first.interrupted:
            if not collect.native:  # the second sample only tells stuck from progressing: it pauses nothing
                session.use(dataclasses.replace(collect, nonblocking=True))
            await asyncio.sleep(SECOND_SAMPLE)
            snap = await session.refresh(reconnect=False)
    finally:
        timer.cancel()
        session.use(before)
    key = job.key if job.key != "unidentified" else ""
    if not any(r.job == key for r in snap.ranks):
        raise CaptureError("none of its ranks was found by the time of the capture (it may have ended)")
    mine, history = only_job(snap, key), [only_job(first, key)] if first is not snap else []
    if kind == "slow" and job.slow_start is not None:
        # the counters over the whole slow stretch name the node that holds the job back (throttling, a CPU
        # it waits for), not only over the capture's second
        history.insert(0, job.slow_start)
    return await asyncio.to_thread(_write, out, job, kind, mine, history, context, t0)


def _write(out: OutDir, job: JobState, kind: str, snap: Snapshot, history: List[Snapshot], context: str,
           t0: float) -> CaptureResult:
    analysis = analyze(snap, history=history)
    bundle = build_bundle(snap, analysis, history=history)
    path = out.capture_path(kind, job.key, snap.taken_at)
    doc = _watch_doc(job, kind, context, analysis.verdict, snap.taken_at, time.monotonic() - t0)
    files = dict(bundle.files)
    files[WATCH_FILE] = (json.dumps(Redactor().tree(doc), indent=1, ensure_ascii=False) + "\n").encode()
    write_bundle(Bundle(files, bundle.redactions, bundle.skipped, bundle.taken_at), path)
    out.prune()
    return CaptureResult(path, os.path.join(path, "snapshot.json"), analysis.verdict, time.monotonic() - t0,
                         _partial(snap), analysis)


def _partial(snap: Snapshot) -> str:
    """Why the capture is incomplete, in a few words; "" when it is not."""
    reasons = []
    failed = [n.name for n in snap.nodes if n.state in ("failed", "partial")]
    if failed:
        reasons.append(f"{len(failed)} node(s) failed or were cut short")
    undumped = sum(1 for r in snap.ranks if not r.collected or r.partial)
    if undumped:
        reasons.append(f"{undumped} rank(s) not dumped")
    if snap.interrupted:
        reasons.append("the capture ran into its deadline")
    return "; ".join(reasons)


def _watch_doc(job: JobState, kind: str, context: str, headline: str, at: float, took: float) -> Dict[str, Any]:
    def points(values: Any) -> List[List[float]]:
        return [[round(t, 3), round(v, 3)] for t, v in list(values)[-POINTS_SAVED:]]

    return {"kind": kind, "job": job.key, "ranks": job.label, "context": context, "headline": headline,
            "captured_at": at, "took": round(took, 3),
            "watchdog": {"seconds": job.watchdog.seconds, "source": job.watchdog.source,
                         "notes": list(job.watchdog.notes)},
            "stall_limit": job.limit, "unit": job.unit,
            "rates": points(job.rates), "node_rates": {n: points(v) for n, v in sorted(job.node_rates.items())}}
