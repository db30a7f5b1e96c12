"""The watcher: a cheap sample of every node every --every seconds, the tracker's verdicts, a capture when a
job stalls or runs slow, --on-hang after it, until every job it follows has ended (or the first capture with
--once). Knows no UI: the CLI prints its events, the TUI shows them and reads its state.

Every wait has a deadline: a sample is bounded by the session's (connect, discovery), a capture by
capture.DEADLINE, a hook by --on-hang-timeout, the wait for a first job by --wait-start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from app.model import CollectOptions, Snapshot
from app.watch import hook
from app.watch.capture import DEADLINE, CaptureError, capture
from app.watch.events import (Captured, CaptureFailed, Event, HookDone, Note, Sampled, SlowDetected, Stalled,
                              duration)
from app.watch.options import WatchOptions
from app.watch.outdir import OutDir
from app.watch.tracker import POINTS, TrackOptions, Tracker

EXIT_OK, EXIT_PARTIAL, EXIT_NOTHING = 0, 1, 3
HEARTBEAT = 600.0  # seconds between the sample lines printed without --verbose (a log shows the watch is alive)
MIN_SLEEP = 0.2  # seconds between two samples at least


class Watcher:
    def __init__(self, session: Any, options: WatchOptions, collect: CollectOptions, out: OutDir,
                 on_event: Callable[[Event], None], *, env: Optional[Dict[str, str]] = None,
                 capture_deadline: float = DEADLINE, hook_output: Optional[int] = None) -> None:
        self.session = session
        self.options = options
        self.collect = collect
        self.out = out
        self.on_event = on_event
        self.env = dict(env or {})
        self.capture_deadline = capture_deadline
        self.hook_output = hook_output  # where --on-hang's output goes (None: ours; the TUI: /dev/null)
        self.tracker = Tracker(TrackOptions(options.stall, options.stall_start, options.slow, options.job))
        self.captures: Deque[Captured] = deque(maxlen=max(options.keep, 1))
        self.costs: Dict[str, Deque[Tuple[float, float]]] = {}  # node -> (time, share of a core) per sample
        self.samples = 0
        self.failed_captures = 0
        self._cpu: Dict[str, Tuple[Optional[int], float, float]] = {}  # node -> (worker pid, cpu s, at)
        self._hooks: Set["asyncio.Task[None]"] = set()
        self._last_beat = 0.0
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """End the watch after the current step (the TUI's quit)."""
        self._stop.set()

    async def run(self) -> int:
        """Watch until every followed job has ended; returns the exit code."""
        started = time.monotonic()
        self._emit(Note(time.time(), f"watching: a cheap sample (/proc and counters, no ptrace) every "
                                     f"{self.options.every:g} s; capture after {duration(self.options.stall)} "
                                     f"without progress" + (f" or below {self.options.slow:.0%} of a job's recent "
                                                            "rate" if self.options.slow > 0 else "")
                                     + f"; captures in {self.out.path}"))
        try:
            while not self._stop.is_set():
                t0 = time.monotonic()
                snap = await self.session.sample()
                events = self.tracker.update(snap, self.session.pg_timeouts())
                self.samples += 1
                sampled = self._sampled(snap, time.monotonic() - t0)
                for event in events:
                    self._emit(event)
                self._record(snap, sampled)
                shown = self.options.verbose or time.monotonic() - self._last_beat >= HEARTBEAT
                if shown:
                    self._last_beat = time.monotonic()
                self._emit(dataclasses.replace(sampled, shown=shown))
                for event in events:
                    if isinstance(event, (Stalled, SlowDetected)):
                        await self._capture(event)
                        if self.options.once:
                            return EXIT_PARTIAL if self.failed_captures else EXIT_OK
                if self.tracker.all_ended():
                    return EXIT_PARTIAL if self.failed_captures else EXIT_OK
                if not self.tracker.jobs and time.monotonic() - started >= self.options.wait_start:
                    self._emit(Note(time.time(), f"no job was found in {duration(self.options.wait_start)} "
                                                 "(--wait-start): nothing to watch"))
                    return EXIT_NOTHING
                await self._sleep(t0)
            return EXIT_PARTIAL if self.failed_captures else EXIT_OK
        finally:
            await self._finish_hooks()

    async def _sleep(self, t0: float) -> None:
        delay = t0 + self.options.every - time.monotonic()
        deadline = self.tracker.next_deadline()
        if deadline is not None:  # a job reaches its limit before the interval ends: look at it then
            delay = min(delay, deadline - time.time())
        try:
            await asyncio.wait_for(self._stop.wait(), max(MIN_SLEEP, delay))
        except asyncio.TimeoutError:
            pass

    # -- captures and hooks ------------------------------------------------------------------------------

    async def _capture(self, event: Any) -> None:
        job = self.tracker.jobs.get(event.job)
        if job is None:
            return
        kind = "slow" if isinstance(event, SlowDetected) else "hang"
        try:
            result = await capture(self.session, self.out, job, kind, self.collect, context=event.text(),
                                   deadline=self.capture_deadline)
        except CaptureError as exc:
            self.failed_captures += 1
            self._emit(CaptureFailed(time.time(), event.job, kind, str(exc)))
            return
        except Exception as exc:  # a write error, a bug below: said, and the watch goes on
            self.failed_captures += 1
            self._emit(CaptureFailed(time.time(), event.job, kind, f"{type(exc).__name__}: {exc}"))
            return
        self.tracker.captured(event.job)
        done = Captured(time.time(), event.job, kind, result.path, result.headline, result.took, result.partial,
                        event.text())
        self.captures.append(done)
        self._emit(done)
        if self.options.on_hang:
            env = hook.environment(self.env, bundle=result.path, snapshot=result.snapshot,
                                   headline=result.headline, job=event.job, kind=kind)
            task = asyncio.get_running_loop().create_task(self._hook(event.job, env))
            self._hooks.add(task)
            task.add_done_callback(self._hooks.discard)

    async def _hook(self, job: str, env: Dict[str, str]) -> None:
        argv = self.options.on_hang
        result = await hook.run(argv, env, self.options.on_hang_timeout, output=self.hook_output)
        self._emit(HookDone(time.time(), job, argv[0], result.code, result.took, result.error))

    async def _finish_hooks(self) -> None:
        """Hooks still running get their own deadline to finish (they kill themselves at it)."""
        if self._hooks:
            await asyncio.gather(*self._hooks, return_exceptions=True)

    def cancel_hooks(self) -> None:
        for task in list(self._hooks):
            task.cancel()

    # -- what each sample cost, and the history --------------------------------------------------------

    def _sampled(self, snap: Snapshot, took: float) -> Sampled:
        cost: List[Tuple[str, float]] = []
        now = time.monotonic()
        for node, c in self.session.worker_costs().items():
            if c.worker_cpu is None:
                continue
            spent = c.worker_cpu + (c.sshd_cpu or 0.0)
            prev = self._cpu.get(node)
            self._cpu[node] = (c.pid, spent, now)
            if prev is None or prev[0] != c.pid or now <= prev[2] or spent < prev[1]:
                continue  # a new worker: its count started again
            share = (spent - prev[1]) / (now - prev[2])
            cost.append((node, share))
            self.costs.setdefault(node, deque(maxlen=POINTS)).append((snap.taken_at, share))
        jobs = tuple((k, j.status, j.rate, j.unit) for k, j in self.tracker.jobs.items() if j.status != "ended")
        return Sampled(snap.taken_at, took, jobs, tuple(cost))

    def _record(self, snap: Snapshot, sampled: Sampled) -> None:
        jobs = {}
        for key, j in self.tracker.jobs.items():
            if j.status == "ended" and (j.ended_at or 0) < snap.taken_at:
                continue
            jobs[key] = {"status": j.status, "ranks": j.ranks, "rate": _round(j.rate), "unit": j.unit,
                         "nodes": {n: _round(v[-1][1]) for n, v in j.node_rates.items()
                                   if v and v[-1][0] == j.last_sample},
                         "no_progress_s": round(j.stalled_for, 1)}
        self.out.record({"t": round(snap.taken_at, 3), "took": round(sampled.took, 3), "jobs": jobs,
                         "down": sorted(self.tracker.down), "cost": {n: round(s, 6) for n, s in sampled.cost}})

    def _emit(self, event: Event) -> None:
        try:
            self.on_event(event)
        except Exception as exc:  # a listener's bug must not stop the watch
            import sys

            print(f"hangscope watch: event handler failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def _round(value: Optional[float]) -> Optional[float]:
    return round(value, 3) if value is not None else None
