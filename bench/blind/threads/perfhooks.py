"""A small sampling profiler for training steps (bench/blind/threads/train.py's step profiler).

Importing it starts the sampler: a thread (`perf-sampler`) that samples the training thread's stack every few
milliseconds; the import returns once the sampler runs. `report(top=N)` gives the most sampled frames.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Counter, List, Tuple

INTERVAL = 0.005  # seconds between samples


class Sampler:
    def __init__(self, target: int, interval: float) -> None:
        self.target, self.interval = target, interval
        self.counts: Counter[Tuple[str, int]] = collections.Counter()
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perf-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self.started.wait()  # sampling from here on: the step that imported us is measured too

    def _run(self) -> None:
        from stepstats import frame_key  # its statistics imports are slow: loaded here, off the training thread

        self.key = frame_key
        self.started.set()
        while True:
            frame = sys._current_frames().get(self.target)
            if frame is not None:
                self.counts[self.key(frame)] += 1
            time.sleep(self.interval)


def report(top: int = 5) -> List[Tuple[str, int]]:
    return [(f"{name}:{line}", n) for (name, line), n in SAMPLER.counts.most_common(top)]


SAMPLER = Sampler(threading.main_thread().ident or 0, INTERVAL)
SAMPLER.start()
