"""Following jobs from cheap samples (pure, no I/O): per job, whether it progresses, when it has stalled or run
slow for long enough to capture, when it resumes or ends; per node, when it drops and comes back.

A job's ranks are compared with their own previous sample (app.analysis.progress.movement, the rule the
analysis applies): the job progressed in an interval when any of its ranks moved bytes to its peers, wrote
output or storage. Its rate is what those moves carry per second (bytes to peers where its sockets carry its
steps, else output and storage): a training step moves about the same every time, so the rate follows the step
rate without reading the job's memory. The rate compared with the job's own recent rate is the mean per rank,
so a node that cannot be sampled for a while does not make the job look slow; the rate shown is the job's
total (the mean times the ranks it has).

Times are the samples' own (Snapshot.taken_at, the login side's clock), so tests feed built snapshots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from app.analysis.fold import describe
from app.analysis.progress import Movement, movement
from app.decode.replies import PgTimeout
from app.model import RankSnapshot, Snapshot
from app.watch.events import (Ended, Event, JobFound, NodeBack, NodeLost, Recovered, Resumed, SlowDetected,
                              Stalled)
from app.watch.timeouts import Watchdog, job_watchdog, stall_limit

POINTS = 720  # rate points kept per job and per node for the sparklines (6 hours at the default 30 s)
REFERENCE = 20  # the slow reference is the median of this many recent intervals at the job's normal rate
MIN_REFERENCE = 3  # ... and there is none before this many
ABSENT_SAMPLES = 2  # a job is over when none of its ranks is found in this many samples in a row
RECHECK = 5.0  # seconds to the next sample when a job has just gone missing (did it end, or restart?)
START_FACTOR = 4.0  # a job not yet seen progressing may stand still this many times --stall ...
START_MIN = 300.0  # ... and at least this long (seconds): start-up (imports, rendezvous, loading) is quiet
START_STREAK = 3  # samples in a row that a job must progress in to count as past its start-up
STARTUP_CPU = 0.2  # share of a core per rank: a job not yet seen moving that uses this much is starting up
MAX_JOBS = 256  # jobs remembered; ended ones are forgotten first

Unit = str  # "sockets": bytes to peers per second; "io": output and storage bytes per second; "": none yet


@dataclass(frozen=True)
class TrackOptions:
    stall: float = 120.0
    stall_start: Optional[float] = None  # before a job is first seen progressing; None: start_limit(stall)
    slow: float = 0.5  # 0: never capture a slow job
    job: Optional[str] = None  # follow only the job whose key is this or contains it


@dataclass
class JobState:
    """What the watch knows of one job."""

    key: str
    label: str  # `ranks 0-7 on node[01-04]`
    first_seen: float
    watchdog: Watchdog
    limit: float  # the stall limit for this job (seconds)
    limit_why: str = ""  # why it is lower than --stall
    start_limit: float = 0.0  # ... before it is first seen progressing (start-up is quiet: imports, rendezvous)
    nodes: Tuple[str, ...] = ()
    ranks: int = 0
    status: str = "starting"  # starting | progressing | idle (no progress, under its limit) | stalled | slow | ended
    last_progress: float = 0.0  # the sample that last saw it move (first_seen until one does)
    last_sample: float = 0.0
    stalled_at: Optional[float] = None  # when a stall was declared (and captured)
    slow_since: Optional[float] = None
    slow_declared: bool = False
    slow_start: Optional[Snapshot] = None  # the job's sample where the slow stretch began (evidence over it)
    unit: Unit = ""
    rate: Optional[float] = None  # the job's rate over the last interval
    reference: Deque[float] = field(default_factory=lambda: deque(maxlen=REFERENCE))
    rates: Deque[Tuple[float, float]] = field(default_factory=lambda: deque(maxlen=POINTS))
    node_rates: Dict[str, Deque[Tuple[float, float]]] = field(default_factory=dict)
    absent: int = 0  # samples in a row without any of its ranks
    missing_at: float = 0.0  # the last of those
    ended_at: Optional[float] = None
    captures: int = 0
    moved_once: bool = False  # seen progressing in START_STREAK samples in a row: past its start-up
    streak: int = 0  # samples in a row in which it progressed

    @property
    def stalled_for(self) -> float:
        return max(0.0, self.last_sample - self.last_progress)

    @property
    def stall_limit(self) -> float:
        """The limit that applies now: the start-up one until the job has been seen progressing."""
        return self.limit if self.moved_once else max(self.limit, self.start_limit)

    @property
    def ref_rate(self) -> Optional[float]:
        return median(self.reference) if len(self.reference) >= MIN_REFERENCE else None

    def deadline(self) -> Optional[float]:
        """When this job's stall or slow stretch reaches its limit, if nothing changes (None: not pending)."""
        out = []
        if self.absent:
            return None  # nothing of it to judge: Tracker.next_deadline looks again soon
        if self.status != "ended" and self.stalled_at is None:
            out.append(self.last_progress + self.stall_limit)
        if self.slow_since is not None and not self.slow_declared:
            out.append(self.slow_since + self.limit)
        return min(out) if out else None


class Tracker:
    def __init__(self, options: TrackOptions = TrackOptions()) -> None:
        self.options = options
        self.jobs: Dict[str, JobState] = {}
        self._last: Dict[Tuple[str, int, int], RankSnapshot] = {}  # each live rank's latest sample
        self._down: Dict[str, float] = {}  # node -> since when it could not be sampled
        self._node_errors: Dict[str, str] = {}
        self._latest: Optional[Snapshot] = None

    # -- one sample --------------------------------------------------------------------------------------

    def update(self, snap: Snapshot, timeouts: Mapping[Tuple[str, int, int], PgTimeout] = {}) -> List[Event]:
        t = snap.taken_at
        events: List[Event] = list(self._nodes(snap))
        down = set(self._down)
        by_job: Dict[str, List[RankSnapshot]] = {}
        for r in snap.ranks:
            key = r.job or "unidentified"
            if self.options.job is not None and not _wanted(key, self.options.job):
                continue
            by_job.setdefault(key, []).append(r)
        for key, ranks in by_job.items():
            job = self.jobs.get(key)
            if job is None or job.status == "ended":
                job = self._new_job(key, ranks, t, timeouts)
                events.append(JobFound(t, key, job.label, job.watchdog, job.limit, job.limit_why,
                                       job.stall_limit))
            events += self._judge(job, ranks, t)
        for key, job in self.jobs.items():
            if job.status == "ended" or key in by_job:
                continue
            if set(job.nodes) & down:
                continue  # its nodes could not all be sampled: it may still run there
            job.absent += 1
            job.missing_at = t
            if job.absent >= ABSENT_SAMPLES:
                job.status, job.ended_at = "ended", t
                events.append(Ended(t, key, job.label, t - job.first_seen, job.captures))
        seen = {(r.node, r.pid, r.start_time) for r in snap.ranks}
        for k in [k for k in self._last if k not in seen and k[0] not in down]:
            del self._last[k]  # gone from a node that answered: it exited
        for r in snap.ranks:
            self._last[(r.node, r.pid, r.start_time)] = r
        self._forget()
        self._latest = snap
        return events

    def _new_job(self, key: str, ranks: Sequence[RankSnapshot], t: float,
                 timeouts: Mapping[Tuple[str, int, int], PgTimeout]) -> JobState:
        dog = job_watchdog(ranks, timeouts)
        limit, why = stall_limit(self.options.stall, dog)
        start = self.options.stall_start if self.options.stall_start is not None else start_limit(limit)
        start = min(start, stall_limit(start, dog)[0])  # under the watchdog too
        job = JobState(key, describe(ranks), t, dog, limit, why, start, last_progress=t, last_sample=t)
        self.jobs[key] = job
        return job

    def _judge(self, job: JobState, ranks: Sequence[RankSnapshot], t: float) -> List[Event]:
        events: List[Event] = []
        job.nodes = tuple(sorted({r.node for r in ranks}))
        job.ranks, job.absent = len(ranks), 0
        job.label = describe(ranks)
        pairs: List[Tuple[RankSnapshot, RankSnapshot, Movement]] = []
        for r in ranks:
            before = self._last.get((r.node, r.pid, r.start_time))
            m = movement(before, r) if before is not None else None
            if before is not None and m is not None and m.seconds > 0:
                pairs.append((before, r, m))
        prev_sample = job.last_sample
        job.last_sample = t
        if not pairs:
            return events  # nothing to compare yet (its first sample, or its ranks' nodes could not be sampled)
        progressed = any(m.moved for _, _, m in pairs)
        rate, per_node = self._rates(job, pairs, len(ranks))
        job.streak = job.streak + 1 if progressed else 0
        if job.streak >= START_STREAK:
            job.moved_once = True  # a blip of bytes while the job sets itself up is not yet training
        if progressed:
            if job.stalled_at is not None:
                events.append(Resumed(t, job.key, job.label, t - job.last_progress, "stall"))
            job.last_progress, job.stalled_at = t, None
            job.status = "progressing"
        elif not job.moved_once and _busy(pairs):
            # not yet seen moving, but working: importing torch, loading a checkpoint from the page cache. Its
            # stall clock starts when it goes quiet (a job hung from the start sleeps), not when the watch began.
            job.last_progress, job.status = t, "starting"
        elif job.stalled_at is None and t - job.last_progress >= job.stall_limit:
            job.stalled_at, job.status = t, "stalled"
            job.slow_declared = job.slow_since is not None or job.slow_declared  # one capture for the episode
            events.append(Stalled(t, job.key, job.label, t - job.last_progress, job.last_progress, job.stall_limit,
                                  since_start=not job.moved_once))
        elif job.stalled_at is None:
            job.status = "idle"  # no progress in this interval, not yet for its stall limit
        if rate is not None:
            events += self._slow(job, rate, t, prev_sample, progressed, ranks)
        return events

    def _rates(self, job: JobState, pairs: Sequence[Tuple[RankSnapshot, RankSnapshot, Movement]], count: int
               ) -> Tuple[Optional[float], Dict[str, float]]:
        """The job's rate (mean per rank) over the interval, in its unit, and each node's total; recorded."""
        if any(m.net_bytes for _, _, m in pairs):
            unit = "sockets"
        elif job.unit == "sockets":
            unit = "sockets"  # a stall: zero bytes to peers, not a switch to output bytes
        elif any(m.io_bytes for _, _, m in pairs) or job.unit == "io":
            unit = "io"
        else:
            unit = job.unit
        if unit != job.unit:
            job.unit = unit
            job.reference.clear()  # another measure: the old reference says nothing of the new one
        if not unit:
            return None, {}
        per_node: Dict[str, float] = {}
        total = 0.0
        for _, r, m in pairs:
            moved = (m.net_bytes if unit == "sockets" else m.io_bytes) or 0
            per_second = moved / m.seconds
            total += per_second
            per_node[r.node] = per_node.get(r.node, 0.0) + per_second
        mean = total / len(pairs)
        job.rate = mean * count
        stamp = job.last_sample
        job.rates.append((stamp, job.rate))
        for node, value in per_node.items():
            job.node_rates.setdefault(node, deque(maxlen=POINTS)).append((stamp, value))
        return mean, per_node

    def _slow(self, job: JobState, rate: float, t: float, prev_sample: float, progressed: bool,
              ranks: Sequence[RankSnapshot]) -> List[Event]:
        """A stretch below --slow of the job's own recent rate, for its stall limit, is captured once."""
        events: List[Event] = []
        ref = job.ref_rate
        if self.options.slow <= 0 or ref is None or ref <= 0:
            if progressed:
                job.reference.append(rate)
            return events
        if rate < self.options.slow * ref:
            if job.slow_since is None and progressed:
                job.slow_since = prev_sample  # the interval that fell short began there
                job.slow_start = self._job_sample(job.key, prev_sample)
            # declared on a sample that moved: a stretch that ends in no progress at all is a stall, said as one
            if job.slow_since is not None and not job.slow_declared and progressed and t - job.slow_since >= job.limit:
                job.slow_declared = True
                job.status = "slow" if job.stalled_at is None else job.status
                events.append(SlowDetected(t, job.key, job.label, rate, ref, t - job.slow_since, job.slow_since,
                                           job.limit))
            elif job.slow_declared and job.stalled_at is None:
                job.status = "slow"
        elif progressed:
            if job.slow_declared and job.slow_since is not None:
                events.append(Recovered(t, job.key, job.label, t - job.slow_since, rate, ref))
            job.slow_since, job.slow_declared, job.slow_start = None, False, None
            job.reference.append(rate)
        return events

    def _job_sample(self, key: str, at: float) -> Optional[Snapshot]:
        """The previous sample of this job's ranks (where a slow stretch began), for the evidence over it."""
        prev = self._latest
        if prev is None:
            return None
        ranks = tuple(r for r in prev.ranks if (r.job or "unidentified") == key)
        return Snapshot(taken_at=prev.taken_at, options=prev.options, nodes=prev.nodes, ranks=ranks)

    # -- nodes -------------------------------------------------------------------------------------------

    def _nodes(self, snap: Snapshot) -> List[Event]:
        out: List[Event] = []
        t = snap.taken_at
        for n in snap.nodes:
            failed = n.state == "failed" or (n.state == "partial" and n.error is not None)
            if failed and n.name not in self._down:
                self._down[n.name] = t
                why = n.error.message if n.error is not None else "no answer"
                self._node_errors[n.name] = why
                out.append(NodeLost(t, n.name, why))
            elif not failed and n.name in self._down:
                since = self._down.pop(n.name)
                self._node_errors.pop(n.name, None)
                out.append(NodeBack(t, n.name, t - since))
        return out

    @property
    def down(self) -> Dict[str, float]:
        return dict(self._down)

    # -- the schedule and the end ------------------------------------------------------------------------

    def next_deadline(self) -> Optional[float]:
        """The earliest moment a job reaches its stall or slow limit, or should be looked at again because it has
        just gone missing: the next sample is taken then if that comes before the interval's end."""
        times = [d for d in (j.deadline() for j in self.jobs.values()) if d is not None]
        times += [j.missing_at + RECHECK for j in self.jobs.values() if j.status != "ended" and j.absent]
        # a deadline already passed could not be decided (its nodes did not answer): the interval decides next
        latest = self._latest.taken_at if self._latest is not None else float("-inf")
        future = [d for d in times if d > latest]
        return min(future) if future else None

    def all_ended(self) -> bool:
        return bool(self.jobs) and all(j.status == "ended" for j in self.jobs.values())

    def captured(self, key: str) -> None:
        job = self.jobs.get(key)
        if job is not None:
            job.captures += 1

    def _forget(self) -> None:
        if len(self.jobs) <= MAX_JOBS:
            return
        ended = sorted((j for j in self.jobs.values() if j.status == "ended"), key=lambda j: j.ended_at or 0.0)
        for j in ended[:len(self.jobs) - MAX_JOBS]:
            del self.jobs[j.key]


def start_limit(limit: float) -> float:
    """The default stall limit before a job is first seen progressing."""
    return max(limit * START_FACTOR, START_MIN)


def _busy(pairs: Sequence[Tuple[RankSnapshot, RankSnapshot, Movement]]) -> bool:
    """The job's ranks use a CPU between samples (mean share per rank at least STARTUP_CPU): starting up."""
    shares = [m.cpu for _, _, m in pairs if m.cpu is not None]
    return bool(shares) and sum(shares) / len(shares) >= STARTUP_CPU


def _wanted(key: str, wanted: str) -> bool:
    return key == wanted or wanted in key
