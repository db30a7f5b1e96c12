"""Statistics over perfhooks' samples (bench/blind/threads/train.py's step profiler): frame keys, per-frame
summaries."""

from __future__ import annotations

import statistics
from types import FrameType
from typing import Dict, List, Tuple

from perfhooks import INTERVAL


def frame_key(frame: FrameType) -> Tuple[str, int]:
    return frame.f_code.co_name, frame.f_lineno


def summary(durations: List[float]) -> Dict[str, float]:
    """Mean, median and spread of the sampled step times, in sampling intervals."""
    if not durations:
        return {}
    return {"mean": statistics.fmean(durations) / INTERVAL, "median": statistics.median(durations) / INTERVAL,
            "stdev": statistics.pstdev(durations) / INTERVAL}
