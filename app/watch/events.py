"""What hangscope watch reports, as typed events (the tracker and the watcher make them; the CLI prints their
text(), the TUI shows them). Remote text (job keys, node names, errors, headlines) is cleaned here, once, by
app.printable before it reaches a sentence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

from app.printable import clean
from app.watch.timeouts import Watchdog


def duration(seconds: float) -> str:
    """`45 s`, `3 min 10 s`, `2 h 5 min`."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")
    return f"{s // 3600} h" + (f" {s % 3600 // 60} min" if s % 3600 // 60 else "")


def rate_text(rate: Optional[float], unit: str) -> str:
    """A job's or node's rate in its unit: `1.2 MB/s to peers`, `300 B/s of output`."""
    if rate is None:
        return "no rate yet"
    n, suffix = rate, "B/s"
    for s in ("B/s", "kB/s", "MB/s", "GB/s"):
        suffix = s
        if n < 1000 or s == "GB/s":
            break
        n /= 1000
    text = f"{n:.0f} {suffix}" if suffix == "B/s" else f"{n:.1f} {suffix}"
    return text + (" to peers" if unit == "sockets" else " of output and storage" if unit == "io" else "")


def _job(key: str) -> str:
    return f"job {clean(key or 'unidentified', 120)}"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


@dataclass(frozen=True)
class JobFound:
    at: float
    job: str
    label: str
    watchdog: Watchdog
    limit: float
    limit_why: str = ""
    start_limit: float = 0.0  # before it is first seen progressing

    def text(self) -> str:
        dog = (f"its watchdog: {self.watchdog.seconds:g} s ({clean(self.watchdog.source, 200)})"
               if self.watchdog.seconds is not None else "its watchdog is not known")
        out = f"following {_job(self.job)}: {clean(self.label, 200)}; {dog}; capture after {duration(self.limit)} " \
              "without progress"
        if self.start_limit > self.limit:
            out += f" ({duration(self.start_limit)} until it is first seen progressing: start-up is quiet)"
        if self.limit_why:
            out += f" ({clean(self.limit_why, 300)})"
        for note in self.watchdog.notes:
            out += f"; {clean(note, 300)}"
        return out


@dataclass(frozen=True)
class Stalled:
    at: float
    job: str
    label: str
    seconds: float  # without progress
    since: float  # the last sample that saw it move (or when the watch began)
    limit: float
    since_start: bool = False  # it has not been seen moving since the watch began

    def text(self) -> str:
        since = f"since {_clock(self.since)}" + ("; not seen moving since the watch began" if self.since_start else "")
        return f"{_job(self.job)} has made no progress for {duration(self.seconds)} ({since}): capturing"


@dataclass(frozen=True)
class SlowDetected:
    at: float
    job: str
    label: str
    rate: float  # mean per rank over the last interval
    reference: float  # its recent rate (mean per rank)
    seconds: float
    since: float
    limit: float

    def text(self) -> str:
        share = self.rate / self.reference if self.reference else 0.0
        return (f"{_job(self.job)} is slow: {share:.0%} of its recent rate for {duration(self.seconds)} "
                f"(since {_clock(self.since)}): capturing")


@dataclass(frozen=True)
class Resumed:
    at: float
    job: str
    label: str
    seconds: float  # how long it had made no progress
    after: str = "stall"

    def text(self) -> str:
        return f"{_job(self.job)} resumed: it progresses again after {duration(self.seconds)} without progress"


@dataclass(frozen=True)
class Recovered:
    at: float
    job: str
    label: str
    seconds: float  # how long it ran slow
    rate: float
    reference: float

    def text(self) -> str:
        return f"{_job(self.job)} is back to its usual rate after running slow for {duration(self.seconds)}"


@dataclass(frozen=True)
class Ended:
    at: float
    job: str
    label: str
    watched: float
    captures: int

    def text(self) -> str:
        caught = f"; {self.captures} capture(s)" if self.captures else "; no capture"
        return f"{_job(self.job)} has ended (none of its ranks is left); watched for {duration(self.watched)}{caught}"


@dataclass(frozen=True)
class NodeLost:
    at: float
    node: str
    why: str

    def text(self) -> str:
        return f"{clean(self.node, 100)}: lost ({clean(self.why, 300)}); reconnecting at every sample"


@dataclass(frozen=True)
class NodeBack:
    at: float
    node: str
    down: float

    def text(self) -> str:
        return f"{clean(self.node, 100)}: reconnected after {duration(self.down)}"


@dataclass(frozen=True)
class Captured:
    at: float
    job: str
    kind: str  # hang | slow
    path: str  # the bundle's directory
    headline: str
    took: float  # seconds the capture took (both samples, the analysis, the files)
    partial: str = ""  # why the capture is incomplete, "" when it is not
    context: str = ""  # what the watch saw: "no progress for 2 min 5 s"

    def text(self) -> str:
        out = f"{_job(self.job)}: captured ({self.kind}) in {self.took:.1f} s: {self.path}"
        if self.partial:
            out += f" (partial: {clean(self.partial, 300)})"
        return out + f"\nhangscope: {clean(self.headline, None)}"


@dataclass(frozen=True)
class CaptureFailed:
    at: float
    job: str
    kind: str
    why: str

    def text(self) -> str:
        return f"{_job(self.job)}: the {self.kind} capture failed: {clean(self.why, 500)}"


@dataclass(frozen=True)
class HookDone:
    at: float
    job: str
    argv0: str
    code: Optional[int]  # None: killed at its deadline
    took: float
    error: str = ""

    def text(self) -> str:
        what = f"--on-hang {clean(self.argv0, 100)}"
        if self.error:
            return f"{what} could not run: {clean(self.error, 300)}"
        if self.code is None:
            return f"{what} was killed at its deadline ({self.took:.0f} s)"
        return f"{what} exited {self.code} after {self.took:.1f} s"


@dataclass(frozen=True)
class Note:
    at: float
    message: str

    def text(self) -> str:
        return clean(self.message, 1000)


@dataclass(frozen=True)
class Sampled:
    """One cheap sample taken: how long it took and what the watch cost each node (CPU share of one core since
    the previous sample: the worker, and the sshd carrying it where readable)."""

    at: float
    took: float
    jobs: Tuple[Tuple[str, str, Optional[float], str], ...]  # (job, status, rate, unit)
    cost: Tuple[Tuple[str, float], ...] = field(default=())  # (node, share of one core)
    shown: bool = True  # False: the CLI prints only every HEARTBEAT seconds (without --verbose)

    def text(self) -> str:
        jobs = "; ".join(f"{_job(k)} {status}, {rate_text(rate, unit)}" for k, status, rate, unit in self.jobs) \
            or "no job"
        top = max(self.cost, key=lambda c: c[1], default=None)
        cost = f"; watch CPU per node up to {top[1]:.2%} of a core ({clean(top[0], 100)})" if top else ""
        return f"sample in {self.took:.2f} s: {jobs}{cost}"


Event = Union[JobFound, Stalled, SlowDetected, Resumed, Recovered, Ended, NodeLost, NodeBack, Captured,
              CaptureFailed, HookDone, Note, Sampled]


BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: "list[float] | tuple[float, ...]", width: int = 24) -> str:
    """The last `width` values as block characters scaled to their maximum (a flat line at zero: `▁`)."""
    shown = [max(0.0, v) for v in list(values)[-width:]]
    if not shown:
        return ""
    top = max(shown)
    if top <= 0:
        return BLOCKS[0] * len(shown)
    return "".join(BLOCKS[min(len(BLOCKS) - 1, int(v / top * (len(BLOCKS) - 1) + 0.5))] for v in shown)
