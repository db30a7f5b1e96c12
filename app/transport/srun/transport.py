"""The srun transport: one `srun --jobid ID --overlap` step runs a worker on every node of a job, no SSH.

Each node gets an ordinary WorkerConnection (same hello, requests, deadlines and errors as over SSH) whose
streams are demultiplexed from the one srun process (framing in mux.py). Opens that arrive together (a
session's first pass opens every node at once) share one step; a node reopened later (its worker died) gets
a step of its own. A step ends when the last of its nodes is closed: EOF on srun's stdin (each worker stops
its tools and exits), then SIGTERM to srun (it cancels the step) and SIGKILL, each after a deadline.
"""

from __future__ import annotations

import asyncio
import time
from typing import Optional

from app.errors import TransportError
from app.transport.srun.step import SrunOptions, Step, srun_argv
from app.transport.base import ExitInfo, WorkerConnection

__all__ = ["SrunOptions", "SrunTransport", "srun_argv"]


class _StepAborted(Exception):
    """The step died before this node's worker started, and srun blamed another node."""

    def __init__(self, error: TransportError) -> None:
        super().__init__(error.message)
        self.error = error


class SrunTransport:
    """Opens workers on the nodes of one SLURM job through srun steps (app.transport.connect, for srun and auto
    hosts)."""

    def __init__(self, options: SrunOptions) -> None:
        self.options = options
        self._batch: list[str] = []
        self._batch_steps: Optional[asyncio.Future[Step]] = None
        self._steps: list[Step] = []

    async def open(self, host: str, *, name: Optional[str] = None) -> WorkerConnection:
        """Start (or join) a step on `host` (a SLURM node name) and wait for its worker's hello.

        srun aborts a whole step when it cannot launch on one node; the nodes srun did not blame for that
        get one more try, in a step without the blamed node, within the same start deadline."""
        t0 = time.monotonic()
        try:
            return await self._open(host, name or host, self.options.start_timeout)
        except _StepAborted as aborted:
            remaining = self.options.start_timeout - (time.monotonic() - t0)
            if remaining <= 1.0:
                raise aborted.error from None
            return await self._open(host, name or host, remaining, retried=aborted.error)

    async def _open(self, host: str, name: str, timeout: float,
                    retried: Optional[TransportError] = None) -> WorkerConnection:
        t0 = time.monotonic()
        step = await self._join(host)
        chan = step.channels[host]

        async def on_close() -> None:
            step.node_closed(chan)
            if step.stopping is not None:
                await asyncio.shield(step.stopping)

        conn = WorkerConnection(name, chan.stdout, chan, chan.stderr, chan.wait_exit, kill=chan.kill,
                                on_close=on_close, python=self.options.python)
        conn.timings["connect"] = time.monotonic() - t0
        remaining = max(0.1, timeout - (time.monotonic() - t0))
        try:
            await conn.start(b"", remaining)  # the payload went to every node once, with the step
        except TransportError as exc:
            await conn.close(kill=True, timeout=1.0)
            srun_says = step.stderr_text()
            if exc.code == "timeout" and srun_says:
                exc = TransportError(exc.code, f"{exc.message}; srun says: {srun_says}", phase=exc.phase)
            error = TransportError(exc.code, f"{exc.message} (over srun, job {self.options.job_id})",
                                   phase=exc.phase, hint=exc.hint)
            if retried is None and exc.code == "lost" and len(step.channels) > 1 and not step.blames(host):
                raise _StepAborted(error) from None
            raise error from None
        except BaseException:
            await conn.close(kill=True, timeout=1.0)
            raise
        if retried is not None:
            conn.warnings.append(f"the first srun step failed because of another node; reached in a second "
                                 f"step ({retried.message})")
        conn.timings["total"] = time.monotonic() - t0
        return conn

    async def _join(self, host: str) -> Step:
        loop = asyncio.get_running_loop()
        if self._batch_steps is None:
            self._batch_steps = loop.create_future()
            if self.options.batch_window > 0:
                loop.call_later(self.options.batch_window, self._flush)
            else:
                loop.call_soon(self._flush)
        fut = self._batch_steps
        self._batch.append(host)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            # the node is in the step regardless: count it as closed, or the step would never stop
            fut.add_done_callback(lambda f: f.result().node_closed(f.result().channels[host]))
            raise

    def _flush(self) -> None:
        names = list(dict.fromkeys(self._batch))
        fut = self._batch_steps
        self._batch, self._batch_steps = [], None
        assert fut is not None
        step = Step(self.options, names)
        self._steps.append(step)
        task = asyncio.get_running_loop().create_task(step.start())

        def started(t: asyncio.Task[None]) -> None:
            if t.cancelled() or t.exception() is not None:
                exc = t.exception() if not t.cancelled() else None
                step._fail_all(ExitInfo(lost=f"cannot run {self.options.srun}: {exc}"))
            fut.set_result(step)

        task.add_done_callback(started)

    async def close(self) -> None:
        """Stop every step still running (normally each stops with its last node)."""
        await asyncio.gather(*(s.stop() for s in self._steps), return_exceptions=True)
