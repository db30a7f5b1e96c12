"""The GPU tests over open worker connections: preflight, sanity, bench, node/GPU pair isolation, network.

No UI, no SSH of its own: it takes `{node name: WorkerConnection}` (app/gpu/connect.py opens them, or pass
a session's) and reports progress through `on_event` (or `events()`, an async iterator for the TUI whose
last item is Finished). One broken node never stops the others: it is reported in `node_errors`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Callable, Mapping, Optional

from app.decode import replies
from app.errors import HangscopeError, TransportError
from app.gpu import events as ev
from app.gpu import inventory as inv
from app.gpu import netcheck
from app.gpu.launch import LaunchSpec, Launcher, launch_specs_nprocs
from app.gpu.model import GpuTestResults, NetReport, NodeInventory, PairReport, TestKind, TestRun
from app.gpu.options import CPU_PAIR_SIZE, CPU_SIZES, GPU_PAIR_SIZE, GPU_SIZES, GpuTestOptions
from app.gpu.schedule import Outcome, PairIsolation
from app.transport.base import WorkerConnection
from workers import protocol


PYTHON_PROBE_S = 60.0  # per node: trying candidate interpreters for torch (importing it takes seconds)


class NoInterpreterError(HangscopeError):
    title = "no interpreter for the tests"
    hint = "pass --python with the job's interpreter (the python that has torch), the same path on every node"


@dataclass
class Preflight:
    """What every test needs to know about the nodes before launching anything."""

    pythons: dict[str, str] = field(default_factory=dict)
    hostnames: dict[str, str] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)
    inventories: list[NodeInventory] = field(default_factory=list)
    masters: list[tuple[str, int]] = field(default_factory=list)  # the job's MASTER_ADDR:PORT, from its ranks
    python_notes: dict[str, str] = field(default_factory=dict)  # node -> which interpreter, and why
    errors: dict[str, str] = field(default_factory=dict)


class GpuTestRunner:
    def __init__(self, conns: Mapping[str, WorkerConnection], options: GpuTestOptions = GpuTestOptions(),
                 on_event: Optional[Callable[[ev.GpuEvent], None]] = None,
                 node_errors: Optional[Mapping[str, str]] = None) -> None:
        self.conns = dict(conns)
        self.o = options
        self._on_event = on_event
        self._node_errors = dict(node_errors or {})  # nodes that could not even be connected
        self._tasks: list[asyncio.Task] = []
        self.cancelled = False

    def emit(self, event: ev.GpuEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)

    def cancel(self) -> None:
        """Stop what runs (its workers kill the test processes); run() returns what finished, interrupted."""
        self.cancelled = True
        for t in self._tasks:
            t.cancel()

    # -- preflight -------------------------------------------------------------------------------------------

    async def preflight(self, need_python: bool = True) -> Preflight:
        pre = Preflight()

        async def one(node: str, conn: WorkerConnection) -> None:
            pre.hostnames[node] = str(conn.hello.get("hostname") or node)
            try:
                data = await conn.call(protocol.GPU_INVENTORY({}), timeout=30.0)
                pre.inventories.append(inv.node_inventory(node, data))
                pre.gpus[node] = len(pre.inventories[-1].gpus)
                items, _ = await conn.request(protocol.DISCOVER({"pids": None}), timeout=30.0).collect()
            except TransportError as exc:
                pre.errors[node] = exc.message
                return
            ranks = [replies.rank_from_discover(node, item) for item in items]
            pre.masters += [(r.master_addr, r.master_port) for r in ranks if r.master_addr and r.master_port]
            if need_python:
                await self.choose_python(node, conn, [r.pid for r in ranks], pre)

        await asyncio.gather(*(one(n, c) for n, c in self.conns.items()))
        pre.masters = sorted(set(pre.masters))
        pre.inventories.sort(key=lambda i: list(self.conns).index(i.node))
        return pre

    async def choose_python(self, node: str, conn: WorkerConnection, pids: list[int], pre: Preflight) -> None:
        """The node's interpreter for the tests (workers/gputest/interpreters.py): --python, else the ranks'
        own as their command lines name it (a venv's python, not the base binary its symlink ends at), else
        the first candidate that imports torch; pre.python_notes says which and why."""
        try:
            got = await conn.call(protocol.GPU_PYTHON({"pids": pids, "python": self.o.python or "",
                                                       "timeout": PYTHON_PROBE_S}), timeout=PYTHON_PROBE_S + 15.0)
        except TransportError as exc:
            pre.errors[node] = exc.message
            return
        python = got.get("python") if isinstance(got, dict) else None
        if isinstance(python, str) and python:
            pre.pythons[node] = python
            if not self.o.python:  # chosen here, not named by the user: say which, and why
                pre.python_notes[node] = f"{node}: python {python} ({str(got.get('why') or '')[:300]})"
            return
        tried = [t for t in (got.get("tried") if isinstance(got, dict) else None) or [] if isinstance(t, dict)]
        detail = "; ".join(f"{str(t.get('python'))[:200]} ({str(t.get('why'))[:100]}): {str(t.get('detail'))[:200]}"
                           for t in tried[:6])
        pre.errors[node] = ("no job runs here and no python with torch was found"
                            + (f" (tried {detail})" if detail else " (no python3 on PATH)") + "; pass --python PATH")

    # -- running ---------------------------------------------------------------------------------------------

    async def events(self, kind: TestKind) -> AsyncIterator[ev.GpuEvent]:
        """run(kind) as a stream of events; the last one is Finished (even when a test raised)."""
        queue: asyncio.Queue = asyncio.Queue()
        previous = self._on_event
        self._on_event = queue.put_nowait
        task = asyncio.create_task(self.run(kind))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                yield item
            task.result()  # re-raise a setup error (no interpreter, busy GPUs) to the caller
        finally:
            self._on_event = previous
            if not task.done():
                self.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def run(self, kind: TestKind) -> GpuTestResults:
        started, t0 = time.time(), time.monotonic()
        results = GpuTestResults(kind=kind, started_at=started, nodes=tuple(self.conns))
        task = asyncio.create_task(self._run(kind, results))
        self._tasks.append(task)
        try:
            results = await task
        except asyncio.CancelledError:
            if not self.cancelled:
                raise
            results = GpuTestResults(kind=kind, started_at=started, nodes=tuple(self.conns), interrupted=True,
                                     verdict="interrupted")
        finally:
            self._tasks.remove(task)
        results = replace(results, duration=round(time.monotonic() - t0, 3),
                          node_errors=tuple(sorted({**dict(results.node_errors), **self._node_errors}.items())))
        if self._node_errors:
            results = replace(results, ok=False)
        self.emit(ev.Finished(results))
        return results

    async def _run(self, kind: TestKind, base: GpuTestResults) -> GpuTestResults:
        from app.gpu import verdicts

        if not self.conns:
            return replace(base, verdict="no node could be reached: nothing was tested")
        if kind == "net":
            pre = await self.preflight(need_python=False)
            return verdicts.net_results(base, pre, await self.net(pre))
        pre = await self.preflight()
        if not self.o.allow_busy_gpus and inv.busy(pre.inventories):
            raise inv.GpusBusyError(inv.busy(pre.inventories))
        usable = [n for n in self.conns if n not in pre.errors]
        if not usable:
            raise NoInterpreterError("; ".join(f"{n}: {e}" for n, e in pre.errors.items()))
        for node in usable:
            if node in pre.python_notes:
                self.emit(ev.Note(pre.python_notes[node]))
        base = replace(base, notes=base.notes + tuple(pre.python_notes[n] for n in usable if n in pre.python_notes))
        launcher = Launcher(self.conns, self.o, pre.pythons, pre.hostnames, self.emit)
        gpu = all(pre.gpus.get(n) for n in usable)
        if kind in ("sanity", "bench"):
            sizes = self.o.sizes or (GPU_SIZES if gpu else CPU_SIZES)
            spec = LaunchSpec(kind, tuple(usable), launch_specs_nprocs(usable, pre.gpus, self.o.procs_per_node),
                              mode="bench" if kind == "bench" else "sanity", sizes=sizes if kind == "bench" else (),
                              iters=self.o.iters, warmup=self.o.warmup)
            run = await launcher.run(spec)
            return verdicts.single_run(base, pre, run)
        report, runs = await self.pairs(launcher, usable, pre, gpu)
        gpu_reports, gpu_runs = await self.gpu_pairs(launcher, usable, pre, report)
        return verdicts.pair_results(base, pre, report, gpu_reports, runs + gpu_runs)

    async def pairs(self, launcher: Launcher, nodes: list[str], pre: Preflight, gpu: bool
                    ) -> tuple[PairReport, list[TestRun]]:
        nprocs = launch_specs_nprocs(nodes, pre.gpus, self.o.procs_per_node)
        # Alone, a node tests its own GPUs against each other; with one rank per node there is nothing to
        # test inside a node, and a node that cannot even start fails its pairs and is named from those.
        singles = any(n > 1 for n in nprocs)
        if not singles:
            self.emit(ev.Note("each node alone: skipped (one rank per node, nothing to test inside a node)"))
        sched = PairIsolation(nodes, slow_ratio=self.o.slow_ratio, min_busbw=self.o.min_busbw,
                              all_pairs=self.o.all_pairs, singles=singles)
        size = self.o.pair_size or (GPU_PAIR_SIZE if gpu else CPU_PAIR_SIZE)
        runs: list[TestRun] = []
        while tests := sched.next_round():
            self.emit(ev.RoundStarted("nodes", len(sched.rounds), tuple(tests)))
            specs = [LaunchSpec("single" if len(t) == 1 else "pair", t,
                                launch_specs_nprocs(t, pre.gpus, self.o.procs_per_node), mode="bench",
                                sizes=(size,), iters=self.o.pair_iters, warmup=2) for t in tests]
            done = await asyncio.gather(*(launcher.run(s) for s in specs))
            for t, run in zip(tests, done):
                sched.record(t, _outcome(run))
            runs += done
        return sched.report(), runs

    async def gpu_pairs(self, launcher: Launcher, nodes: list[str], pre: Preflight, report: PairReport
                        ) -> tuple[list[PairReport], list[TestRun]]:
        """Inside each node with 2+ GPUs, the same isolation over its GPUs (CUDA_VISIBLE_DEVICES=i,j)."""
        if not self.o.gpu_pairs:
            return [], []
        broken = {u for f in report.faults if f.kind == "node" for u in f.units}
        todo = [n for n in nodes if pre.gpus.get(n, 0) >= 2 and n not in broken]
        if not todo:
            if any(pre.gpus.get(n) for n in nodes) or nodes:
                self.emit(ev.Note("GPU pairs inside nodes skipped: no node has two GPUs or more"))
            return [], []
        size = self.o.pair_size or GPU_PAIR_SIZE

        async def one(node: str) -> tuple[PairReport, list[TestRun]]:
            sched = PairIsolation([str(i) for i in range(pre.gpus[node])], slow_ratio=self.o.slow_ratio,
                                  min_busbw=self.o.min_busbw, all_pairs=self.o.all_pairs, scope=node)
            runs: list[TestRun] = []
            while tests := sched.next_round():
                self.emit(ev.RoundStarted(node, len(sched.rounds), tuple(tests)))
                specs = [LaunchSpec("gpu-single" if len(t) == 1 else "gpu-pair", (node,), (len(t),), mode="bench",
                                    sizes=(size,), iters=self.o.pair_iters, warmup=2,
                                    cuda_visible_devices=",".join(t)) for t in tests]
                done = await asyncio.gather(*(launcher.run(s) for s in specs))
                for t, run in zip(tests, done):
                    sched.record(t, _outcome(run))
                runs += done
            return sched.report(), runs

        found = await asyncio.gather(*(one(n) for n in todo))
        return [r for r, _ in found], [run for _, rs in found for run in rs]

    async def net(self, pre: Preflight) -> NetReport:
        """Interfaces, IB ports, hostname resolution and reachability of the job's master from every node."""
        targets = list(self.o.targets) or pre.masters
        if not targets:
            self.emit(ev.Note("no job master found on the nodes and no --target given: reachability not checked"))
        replies: dict[str, object] = {}

        async def one(node: str, conn: WorkerConnection) -> None:
            try:
                probed = await conn.call(protocol.NET_PROBE({
                    "targets": [{"host": h, "port": p} for h, p in targets], "timeout": self.o.check_timeout}),
                    timeout=self.o.check_timeout + 30.0)
                replies[node] = probed
            except TransportError as exc:
                replies[node] = exc.message

        await asyncio.gather(*(one(n, c) for n, c in self.conns.items()))
        return netcheck.report({n: replies[n] for n in self.conns})


def _outcome(run: TestRun) -> Outcome:
    busbw = run.busbw if run.world_size > 1 else None
    detail = run.message if run.status != "ok" else ""
    return Outcome(status=run.status, busbw=busbw, run_id=run.id, detail=detail[:300])
