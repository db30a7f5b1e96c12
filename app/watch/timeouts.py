"""How long a hung job has before its own watchdog ends it (and the evidence with it), and the stall limit that
keeps hangscope watch's capture well ahead of that (pure).

What ends a hung torch job, from what hangscope can read without touching a rank: the process-group timeout
its script gives `init_process_group`/`new_group` (read from the script's source on the node,
workers/collect/pgtimeout.py), else torch's default for the backend (NCCL 10 min, gloo and the rest 30 min:
torch.distributed.constants); for NCCL, the heartbeat monitor that kills a rank whose watchdog thread is stuck
(TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC, 8 min by default, unless TORCH_NCCL_ENABLE_MONITORING=0); and any other
NCCL_*/TORCH_NCCL_* variable in the ranks' environment whose name says it is a timeout in seconds or
milliseconds. The shortest is the job's watchdog. The stall limit is at most a quarter of it: after the limit a
capture still takes up to one sample interval and the snapshot's own time, and three quarters of the watchdog
leave room for both with a margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

from app.decode.replies import PgTimeout
from app.model import RankSnapshot

NCCL_DEFAULT = 600.0  # torch's default process-group timeout with NCCL (default_pg_nccl_timeout)
OTHER_DEFAULT = 1800.0  # ... with gloo and the other backends (default_pg_timeout)
HEARTBEAT_DEFAULT = 480.0  # TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC's default
SHARE = 0.25  # the stall limit's share of the watchdog at most
MIN_LIMIT = 1.0  # seconds: a stall limit below this would capture a job between two of its steps

# Variables named like a timeout that are not a deadline for a hung rank, and why.
NOT_DEADLINES = {
    "NCCL_IB_TIMEOUT": "an exponent for InfiniBand's retransmission timer (4.096 us x 2^N), not a deadline for a "
                       "rank that never reaches the collective",
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "an extra wait for the Flight Recorder dump after a timeout",
}


@dataclass(frozen=True)
class Watchdog:
    """The job's own deadline for a hang: seconds (None: not known) and what it comes from, in words."""

    seconds: Optional[float]
    source: str
    notes: Tuple[str, ...] = ()


def job_watchdog(ranks: Sequence[RankSnapshot], timeouts: Mapping[Tuple[str, int, int], PgTimeout] = {}
                 ) -> Watchdog:
    """The shortest deadline that would end this job's hang, from its ranks' environment and scripts."""
    env: dict[str, str] = {}
    for r in ranks[:64]:  # the ranks of a job share their launch environment
        for name, value in r.env:
            env.setdefault(name, value)
    # NCCL: its variables in the environment, or GPUs (CUDA_VISIBLE_DEVICES; a capture's nvidia-smi): the shorter
    # defaults are assumed where it may be NCCL
    nccl = any(r.gpus for r in ranks) or any(n.startswith(("NCCL_", "TORCH_NCCL_")) or n == "CUDA_VISIBLE_DEVICES"
                                             for n in env)
    found: list[Tuple[float, str]] = []
    notes: list[str] = []
    script = [t for t in (timeouts.get((r.node, r.pid, r.start_time)) for r in ranks) if t is not None]
    readable = [t for t in script if t.seconds is not None]
    if readable:
        best = min(readable, key=lambda t: t.seconds or 0.0)
        assert best.seconds is not None
        found.append((best.seconds, f"its script's process-group timeout ({_short(best.text)} at {best.where})"))
    elif script:
        notes.append(f"its script sets a process-group timeout hangscope cannot read without running it "
                     f"({_short(script[0].text)} at {script[0].where}); torch's default is assumed")
    if not readable:
        found.append((NCCL_DEFAULT, "NCCL's default process-group timeout (10 min)") if nccl else
                     (OTHER_DEFAULT, "torch's default process-group timeout for gloo (30 min)"))
    if nccl and env.get("TORCH_NCCL_ENABLE_MONITORING", "1").strip() not in ("0", "false", "False"):
        beat = _number(env.get("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"))
        if beat is not None:
            found.append((beat, f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={_short(env['TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC'])} "
                                "in the ranks' environment"))
        else:
            found.append((HEARTBEAT_DEFAULT, "NCCL's heartbeat monitor (8 min by default)"))
    for name, value in sorted(env.items()):
        if not name.startswith(("NCCL_", "TORCH_NCCL_")) or "TIMEOUT" not in name \
                or name == "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC":
            continue
        if name in NOT_DEADLINES:
            continue
        number = _number(value)
        scale = 1.0 if name.endswith(("_SEC", "_SECONDS", "_S")) else \
            0.001 if name.endswith(("_MSEC", "_MILSEC", "_MS")) else None
        if number is None or scale is None:
            notes.append(f"{name}={_short(value)} is not read as a deadline (its unit is not known)")
            continue
        found.append((number * scale, f"{name}={_short(value)} in the ranks' environment"))
    seconds, source = min(found)
    return Watchdog(seconds, source, tuple(notes))


def stall_limit(stall: float, dog: Watchdog) -> Tuple[float, str]:
    """The stall limit for a job: --stall, lowered to a quarter of its watchdog when that is shorter; with the
    reason in words ("" when --stall stands)."""
    if dog.seconds is None or stall <= dog.seconds * SHARE:
        return stall, ""
    limit = max(MIN_LIMIT, round(dog.seconds * SHARE, 1))
    return limit, (f"--stall {stall:g} s lowered to {limit:g} s for this job: a quarter of its watchdog, "
                   f"{dog.seconds:g} s ({dog.source})")


def _number(value: Optional[str]) -> Optional[float]:
    try:
        number = float((value or "").strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:79] + "…"
