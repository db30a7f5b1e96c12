"""One test run across nodes: a port, one torchrun per node, progress watched, stopped when it hangs.

Books a free port on the master, starts one torchrun per node (gpu_launch), follows the ranks' progress.

Hung means: some rank has not started (imported torch and begun to rendezvous) within `startup_timeout`, or
no rank has made progress for `timeout` seconds since all started, or one node's launch ended early while
the others still wait for it. Then every node gets `gpu_stop` (its ranks print where they are stuck, then
everything of the test is killed there); a node that does not answer within STOP_GRACE is abandoned, which
cancels its request (its worker kills the test too, and the ranks' own watchdog is the last resort).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, Sequence

from app.errors import TransportError
from app.gpu import events as ev
from app.gpu.model import RunStatus, TestRun
from app.gpu.options import GpuTestOptions
from app.gpu.output import RunOutput, run_message
from app.transport.base import WorkerConnection
from workers import protocol

STOP_GRACE = 20.0  # seconds for nodes to dump stacks and kill the test after gpu_stop
EARLY_END_GRACE = 3.0  # after one node's launch ended early, before stopping the rest
TICK = 0.25


@dataclass(frozen=True)
class LaunchSpec:
    kind: str  # sanity, bench, single, pair, gpu-single, gpu-pair
    nodes: tuple[str, ...]
    nprocs: tuple[int, ...]
    mode: str = "sanity"  # "sanity", or "bench" (sanity first, then the sweep)
    sizes: tuple[int, ...] = ()
    iters: int = 20
    warmup: int = 5
    cuda_visible_devices: Optional[str] = None


_TAKEN: set[int] = set()  # ports of tests still running in this process, whichever runner started them
_TAKEN_LOCK = threading.Lock()


class PortBook:
    """Hands out master ports checked free on the master; a port is never given to two running tests, even
    on different masters or from different runners (their ranks take seconds to bind it)."""

    def __init__(self, port_range: tuple[int, int]) -> None:
        self.low, self.high = port_range

    async def take(self, conn: WorkerConnection) -> int:
        for _ in range(3):
            with _TAKEN_LOCK:
                exclude = sorted(_TAKEN)
            done = await conn.call(protocol.GPU_PORTS({"count": 4, "exclude": exclude, "low": self.low,
                                                       "high": self.high}), timeout=30.0)
            with _TAKEN_LOCK:
                for port in done.get("ports", []):
                    if isinstance(port, int) and port not in _TAKEN:
                        _TAKEN.add(port)
                        return port
        raise TransportError("tool_failed", f"{conn.name}: no free port in {self.low}-{self.high}",
                             hint="free a port in that range, or give the tests another range")

    def release(self, port: int) -> None:
        with _TAKEN_LOCK:
            _TAKEN.discard(port)


class Launcher:
    def __init__(self, conns: Mapping[str, WorkerConnection], options: GpuTestOptions, pythons: Mapping[str, str],
                 hostnames: Mapping[str, str], emit: Callable[[ev.GpuEvent], None]) -> None:
        self.conns = conns
        self.o = options
        self.pythons = pythons
        self.hostnames = hostnames
        self.emit = emit
        self.ports = PortBook(options.port_range)
        self._ids = itertools.count(1)

    async def run(self, spec: LaunchSpec) -> TestRun:
        run_id = f"{spec.kind}-{next(self._ids)}"
        t0 = time.monotonic()
        master = spec.nodes[0]
        try:
            port = await self.ports.take(self.conns[master])
        except TransportError as exc:
            return TestRun(id=run_id, kind=spec.kind, nodes=spec.nodes, status="failed", master=master,
                           message=f"failed: {exc.message}", node_errors=((master, exc.message),))
        try:
            return await self._run(run_id, spec, port, t0)
        finally:
            self.ports.release(port)

    def _config(self, spec: LaunchSpec, port: int, offset: int, world: int) -> dict:
        return {"mode": spec.mode, "master_addr": self.o.master_addr or self.hostnames[spec.nodes[0]],
                "master_port": port, "world_size": world, "rank_offset": offset, "backend": self.o.backend,
                "sizes": list(spec.sizes), "warmup": spec.warmup, "iters": spec.iters,
                # the login side decides when a run hangs; these only bound a rank nobody stops
                "join_timeout": self.o.startup_timeout + self.o.max_duration, "pg_timeout": self.o.max_duration,
                "watchdog": self.o.max_duration + 30.0, "alloc_mib": 64}

    async def _run(self, run_id: str, spec: LaunchSpec, port: int, t0: float) -> TestRun:
        out = RunOutput(spec.nodes, spec.nprocs)
        # one mark per node launch: two host entries that are the same machine must not kill each other's
        tokens = {node: secrets.token_hex(8) for node in spec.nodes}
        world = sum(spec.nprocs)
        self.emit(ev.RunStarted(run_id, spec.kind, spec.nodes, spec.nodes[0], port))
        offsets = list(itertools.accumulate((0,) + spec.nprocs[:-1]))
        dones: dict[str, protocol.GpuLaunchDone] = {}
        errors: dict[str, str] = {}

        async def one(node: str, offset: int, nproc: int) -> None:
            call = protocol.GPU_LAUNCH({"token": tokens[node], "python": self.pythons[node], "nproc": nproc,
                                        "config": self._config(spec, port, offset, world),
                                        "timeout": self.o.max_duration, "nccl_debug": self.o.nccl_debug,
                                        "env": dict(self.o.env), "cuda_visible_devices": spec.cuda_visible_devices})
            try:
                req = self.conns[node].request(call, timeout=self.o.max_duration + STOP_GRACE + 30)
                async for item in req:
                    for state in out.feed(node, item.get("lines") or []):
                        self.emit(ev.RankProgress(run_id, node, state.rank, state.local_rank, state.phase))
                dones[node] = req.done if req.done is not None else {}
            except TransportError as exc:
                errors[node] = exc.message

        tasks = {node: asyncio.create_task(one(node, off, n), name=f"hangscope-gputest-{run_id}-{node}")
                 for node, off, n in zip(spec.nodes, offsets, spec.nprocs)}
        stopped_nodes: set[str] = set()  # the nodes whose launch this side stopped (not ended on their own)
        stop = await self._supervise(tasks, out, tokens, t0, stopped_nodes)
        timed_out = any(d.get("timed_out") for d in dones.values())
        stopped = stop is not None or timed_out
        hung = (stop[0] if stop else "") or ("hung: past the hard deadline" if timed_out else "")
        for node in spec.nodes:
            if node not in dones and node not in errors:
                errors[node] = "did not answer after the stop; its worker was told to cancel the test"
        blame = stop is None or stop[1]
        for node in spec.nodes:  # a launcher that failed before any rank started says why on its own output,
            # unless this side stopped it because another node failed: then what it printed (torchrun's summary of
            # the killed ranks) is the stop's doing, and its ranks are victims, not culprits
            if not blame and node in stopped_nodes:
                continue
            if node not in errors and any(s.node == node and not s.phase for s in out.ranks.values()):
                why = out.agent_error(node)
                if why:
                    errors[node] = why
        ranks = tuple(out.results(stopped, errors, blame_unstarted=blame))
        status: RunStatus
        if stopped and blame:
            status = "hung"
        else:
            status = "ok" if ranks and all(r.status == "ok" for r in ranks) and not errors else "failed"
        backends = {s.backend for s in out.ranks.values() if s.backend}
        run = TestRun(id=run_id, kind=spec.kind, nodes=spec.nodes, status=status, master=spec.nodes[0], port=port,
                      backend=",".join(sorted(backends)), world_size=world,
                      cuda_visible_devices=spec.cuda_visible_devices or "", ranks=ranks,
                      bench=tuple(out.bench_rows()), nccl=out.nccl_nodes(),
                      not_finished=tuple(n for n in spec.nodes if status != "ok" and not out.node_done(n)),
                      leftovers=tuple((n, int(d.get("leftovers") or 0)) for n, d in dones.items()
                                      if d.get("leftovers")),
                      node_errors=tuple(sorted(errors.items())), log=tuple(out.log),
                      elapsed=round(time.monotonic() - t0, 3))
        run = replace(run, message=run_message(run, hung.split(": ", 1)[-1] if hung and status == "hung" else ""))
        self.emit(ev.RunFinished(run))
        return run

    async def _supervise(self, tasks: dict[str, "asyncio.Task[None]"], out: RunOutput, tokens: dict[str, str],
                         t0: float, stopped_nodes: set[str]) -> Optional[tuple[str, bool]]:
        """Wait for the nodes; returns (why the run was stopped, whether that means hung), or None. The nodes it
        stops go into `stopped_nodes`."""
        last_count, last_change = -1, time.monotonic()
        started_at: Optional[float] = None
        ended_early: Optional[float] = None
        reason: Optional[tuple[str, bool]] = None
        stop_deadline = 0.0
        while True:
            pending = [t for t in tasks.values() if not t.done()]
            if not pending:
                return reason
            await asyncio.wait(pending, timeout=TICK)
            now = time.monotonic()
            if reason is not None:
                if now > stop_deadline:
                    for t in pending:
                        t.cancel()  # abandons the request: the worker cancels it and kills the test
                    await asyncio.gather(*pending, return_exceptions=True)
                    return reason
                continue
            if out.progress_count != last_count:
                last_count, last_change = out.progress_count, now
            if started_at is None and out.all_started:
                started_at = now
            if ended_early is None and any(t.done() and not out.node_done(n) for n, t in tasks.items()):
                ended_early = now  # its ranks did not all finish: the others will wait for them forever
            if started_at is None and now - t0 > self.o.startup_timeout:
                late = out.not_started()
                names = ", ".join(f"rank {s.rank} ({s.node})" for s in late[:6])
                reason = (f"hung: {len(late)} rank(s) did not start within {self.o.startup_timeout:g} s "
                          f"({names})", True)
            elif started_at is not None and now - max(last_change, started_at) > self.o.timeout:
                reason = (f"hung: no progress for {self.o.timeout:g} s", True)
            elif ended_early is not None and now - ended_early > EARLY_END_GRACE:
                reason = ("stopped: a node's launch ended while the others still waited for it", False)
            if reason is not None:
                stop_deadline = now + STOP_GRACE
                stopped_nodes.update(node for node, t in tasks.items() if not t.done())
                await asyncio.gather(*(self._stop(node, tokens[node]) for node, t in tasks.items() if not t.done()))

    async def _stop(self, node: str, token: str) -> None:
        try:
            await self.conns[node].call(protocol.GPU_STOP({"token": token}), timeout=10.0)
        except TransportError:
            pass  # the node is unreachable: the abandon at stop_deadline cancels its request


def launch_specs_nprocs(nodes: Sequence[str], gpus: Mapping[str, int], procs: Optional[int]) -> tuple[int, ...]:
    """Ranks per node: --procs-per-node, else one per GPU, else one."""
    return tuple(procs or gpus.get(n) or 1 for n in nodes)
