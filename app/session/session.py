"""The session: connect -> hello -> discover -> dump on every node at once, streaming events; no UI imports.

The TUI and the CLI both drive it (through the package root, app.session). One broken node never stops the
others and one slow node never delays the others' results: each node runs in its own task and every result is
emitted as it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import resource
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, TypeVar, cast

from app import __version__
from app.decode import gpu as parse_gpu
from app.decode import replies
from app.decode.build import Builder
from app.errors import HangscopeError, TransportError, hint_for
from app.model import CollectOptions, ErrorInfo, JobProcess, NodeStatus, RankKey, RankSnapshot, Snapshot
from app.hosts import HostSpec
from app.session import store as pgstore
from app.session.events import NodeUpdate, RankUpdate, SessionEvent, SnapshotDone
from app.session.options import SessionOptions
from app.session.peer_names import PeerNamer
from app.transport import bootstrap
from app.transport.base import WorkerConnection, next_request_id
from app.transport.connect import Connector
from app.transport.within import within
from workers import protocol

if TYPE_CHECKING:  # what the worker sends (app.decode reads every value with a check)
    from app.transport.request import Request
    from workers.protocol import (CollectArgs, CollectDone, CollectItemKey, DiscoverArgs, DiscoverDone, DumpItem,
                                  DumpOptions, GdbArgs, GdbDone, RankInfo, StraceArgs, StraceDone)

DISCOVER_TIMEOUT = 30.0
RETIRE_TIMEOUT = 5.0  # the new worker ending the one of a lost connection (workers/ops.py retire)
SOURCE_CONTEXT = 3  # source lines shown either side of a frame's current line
STRACE_MAX_LINES = 20000
KEEP_WORKER_ENV = "HANGSCOPE_KEEP_WORKER"  # debug: a directory on each node to keep the worker's sources in
WORKER_LOG_ENV = "HANGSCOPE_WORKER_LOG"  # debug: "1" makes workers log to their stderr
STORE_TIMEOUT = 2.0  # seconds a worker has to read a job's store (workers/collect/pgstore.py)
# Up to this many nodes every rank's reply carries every local of its threads (--locals shows them all in the
# TUI, --print and the exported files); past it only the locals the analysis reads travel, the rest stay on the
# node for `detail` (Session.detail): at thousands of nodes they were most of a deep stack's bytes (issue 27).
ALL_LOCALS_NODES = 64
# The zlib window (log2 bytes) each worker compresses its replies with (workers/protocol.py: compress_window): the
# login side keeps a stream per connection, the window plus ~7 KB (at 12,500 nodes: 290 MB at 14, 490 MB at
# zlib's default 15). Measured on the recorded replies (docs/performance.md): against 15, a first pass is 2-7 %
# larger and a refresh 1.3-2.2x (it refers back to the first pass less); at 13 a deep stack's reply doubles.
COMPRESS_WINDOW = 14
GATE_WAIT = 3.0  # seconds a node that has discovered waits for the others before its dumps are released (go)
ArgsT = TypeVar("ArgsT")  # a per-rank op's arguments (strace, gdb)
DoneT = TypeVar("DoneT")  # its done data
_CONNECTION_GONE = frozenset({"lost", "worker_crashed"})  # codes after which a node's worker is no more


@dataclass
class _Node:
    """One node's mutable state across passes."""

    spec: HostSpec
    status: NodeStatus
    conn: Optional[WorkerConnection] = None
    ranks: dict[int, RankSnapshot] = field(default_factory=dict)  # by pid, from the latest pass
    processes: dict[int, JobProcess] = field(default_factory=dict)  # launchers and ranks' children, by pid
    # the node's clock minus the login side's, estimated when discovery answered (within the link's one-way
    # latency): dump times are given on the login clock so that nodes compare
    clock_offset: float = 0.0
    # the worker of a connection that was lost (a cut link never delivers its EOF): the next worker ends it
    orphan: Optional[int] = None

    @property
    def name(self) -> str:
        return self.status.name


MAX_PG_TIMEOUTS = 1 << 16  # process-group timeouts remembered (one per rank)


@dataclass(frozen=True)
class WorkerCost:
    """What a node's worker has cost it so far, as the worker last said: CPU seconds of the worker (and the tools
    it reaped) and of the sshd that carries its channel (None where not readable), and the worker's pid: a new
    pid is a new worker, whose count started again."""

    worker_cpu: Optional[float]
    sshd_cpu: Optional[float]
    pid: Optional[int] = None


def _seconds(value: object) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def dump_skew(ranks: Sequence[RankSnapshot]) -> Optional[float]:
    """Seconds between the first and the last start of a rank dump (login clock); None with fewer than two."""
    starts = [r.dump_started for r in ranks if r.dump_started is not None]
    return round(max(starts) - min(starts), 6) if len(starts) > 1 else None


def _collect_decoder(node: str, shared: dict[str, Any]) -> Callable[[Any], tuple[Optional[CollectItemKey], Any]]:
    """How a node's collect items are read in the connection's reader: (the item's key, its value in the model:
    a RankSnapshot, a decoded dump, the GPU evidence; discovery's summary as it came, with the time it was read;
    None when malformed). `shared` is what the connection's decoders keep between requests: its stack table
    (compact dumps refer to it: read in the reader too, in the order the node sent, before the dumps that use
    it), and per node the threads of its last pass (replies.decode_compact_dump)."""
    stacks: replies.StackTable = shared.setdefault("stacks", {})
    mine = "threads " + node  # whose they are, should a connection ever read several nodes
    threads: tuple[replies.ThreadsBefore, replies.ThreadsBefore] = (shared.pop(mine, None) or {}, {})
    shared[mine] = threads[1]
    def decode(item: dict) -> tuple[Optional[CollectItemKey], Any]:
        # each item carries one key (protocol.CollectItem); app.decode checks each value it takes
        key = protocol.collect_item_key(item)
        if key is None:
            return None, None
        value = item[key]
        if key == "discovered":  # with when it was read: the node's clock offset (a consumer may be behind)
            return key, (value, time.time())
        if key == "gpu_evidence":
            return key, parse_gpu.gpu_evidence(value)
        if not isinstance(value, dict):
            return key, None
        if key == "stacks":
            replies.decode_stacks(value, stacks)
            return key, None
        if key == "rank":
            return key, replies.rank_from_discover(node, cast("RankInfo", value))
        if "threads" in value and "pyspy" not in value:  # compact (workers/compact.py)
            return key, replies.decode_compact_dump(cast("DumpItem", value), stacks, threads)
        return key, replies.decode_dump(cast("DumpItem", value))  # dump, process_dump
    return decode


class _Gate:
    """Opens when every node task of a cold pass has arrived (discovered, or failed or ended before it)."""

    def __init__(self, count: int) -> None:
        self.go_id = next_request_id()  # every node's go is the same message (srun sends it once for all)
        self._left = count
        self._open = asyncio.Event()
        if count <= 0:
            self._open.set()

    def arrive(self) -> None:
        self._left -= 1
        if self._left <= 0:
            self._open.set()

    async def wait(self, at_most: float) -> None:
        try:
            await within(self._open.wait(), at_most)
        except asyncio.TimeoutError:
            pass


class GcPause:
    """What a pass tells gc_paused at its end: `clean` when no node failed and nothing was cancelled."""

    clean = False


# A node's status is replaced ~6 times a pass (connecting ... done): built field by field, ~0.8 us against
# dataclasses.replace's ~3.4 (~0.2 s a pass at 12,500 nodes)
_STATUS = Builder(NodeStatus)

# Every this many passes the collector runs over everything, frozen or not (below), whatever the passes were.
FULL_COLLECT_EVERY = 16
_passes_since_full = [0]


@contextlib.contextmanager
def gc_paused() -> Iterator[GcPause]:
    """No garbage collection while a pass builds its snapshot; then its survivors frozen (gc.freeze).

    A pass allocates millions of objects that live on (the ranks, their threads and frames); each automatic
    full collection walks every one of them again, so that at 1,000 nodes half a pass's CPU was the collector
    (bench/scale.py). Paused, and frozen at the end, the snapshot is not walked again by the collections the TUI
    triggers between passes. What is frozen is still freed by reference counting when dropped (the model has no
    cycles).

    A pass that failed somewhere (a node's error, a cancellation: exceptions kept in tasks and futures make
    cycles) is collected before it is frozen (the young generations: that pass's own objects). A clean pass is
    frozen as it is: it leaves no cyclic garbage (0 objects in every measured pass, over SSH and at 2,000
    simulated nodes), and that collection walked the whole new snapshot to find nothing, ~7 % of a pass's login
    CPU before its first headline (0.32 s at 2,000 nodes; issue 27). Whatever a clean pass might still leave is
    bounded: every FULL_COLLECT_EVERY passes, everything is unfrozen and collected once."""
    pause = GcPause()
    if not gc.isenabled():  # nested, or the caller manages the collector itself
        yield pause
        return
    gc.disable()
    try:
        yield pause
    finally:
        gc.enable()
        _passes_since_full[0] += 1
        if _passes_since_full[0] >= FULL_COLLECT_EVERY:
            _passes_since_full[0] = 0
            gc.unfreeze()
            gc.collect()
        elif not pause.clean:
            gc.collect(1)
        gc.freeze()


def raise_nofile_limit() -> None:
    """One socket per node and three pipes per local worker: lift the soft fd limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass  # keep the old limit: only very large node counts would notice


class Session:
    """Collects snapshots from nodes (hosts None = this machine, no SSH) and keeps workers warm between them."""

    def __init__(self, hosts: Optional[Sequence[HostSpec]], options: SessionOptions = SessionOptions(),
                 on_event: Optional[Callable[[SessionEvent], None]] = None) -> None:
        self.options = options
        self._on_event = on_event
        if hosts is None:
            hosts = [HostSpec(name=socket.gethostname(), host="localhost", transport="local")]
        self._nodes = [_Node(h, NodeStatus(name=h.name, address=h.host, user=h.user or "", port=h.port,
                                           slots=h.slots)) for h in hosts]
        self._connector: Optional[Connector] = None  # made on the first open: the worker options are known then
        self._tasks: list[asyncio.Task[None]] = []
        self._cancelled = False
        self._closed = False
        self._lock: Optional[asyncio.Lock] = None
        self._last: Optional[Snapshot] = None
        self._namer = PeerNamer(options.ssh_config)
        # rank numbers the jobs' stores gave, (node, pid, start time) -> (rank, evidence, job), and the stores that
        # could not be read ((node or "", endpoint)): asked once a session, not on every pass
        self._store_known: dict[tuple[str, int, int], tuple[int, str, str]] = {}
        self._store_failed: set[tuple[str, str]] = set()
        self._store_actions: dict[tuple[str, int, int], str] = {}  # a store's host rank -> what was read from it
        self._closing: set[asyncio.Task[None]] = set()
        # what each node's worker reported of its own cost (CPU seconds so far: the worker, its sshd), and the
        # process-group timeouts the ranks' scripts set, from the cheap samples (sample())
        self._costs: dict[str, WorkerCost] = {}
        self._pg_timeouts: dict[tuple[str, int, int], replies.PgTimeout] = {}
        raise_nofile_limit()

    # -- public API ----------------------------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """Collect from every node: connects (cold) where no worker runs yet, reuses workers (warm) otherwise."""
        return await self._pass()

    async def refresh(self, *, reconnect: bool = True) -> Snapshot:
        """Collect again over the open connections and workers; ranks are rediscovered. A node whose worker
        is gone is connected again; with reconnect=False a node that failed without giving any data (it could
        not be reached, logged into or started) keeps its failure instead, so that a run costs each such node
        one connect deadline, not one per sample."""
        return await self._pass(reconnect=reconnect)

    async def sample(self) -> Snapshot:
        """A cheap sample of every node (hangscope watch): discovery only, from /proc and the cgroup and socket
        counters; no py-spy, no ptrace (the ranks are never paused), no nvidia-smi (it costs more than the rest). Reuses the open workers and connects again
        to a node whose worker is gone. The ranks come back uncollected (no stacks), with their counters."""
        return await self._pass(cheap=True)

    def worker_costs(self) -> dict[str, "WorkerCost"]:
        """Per node, what its worker last said it has cost so far (CPU seconds; sample() asks)."""
        return dict(self._costs)

    def pg_timeouts(self) -> dict[tuple[str, int, int], replies.PgTimeout]:
        """(node, pid, start time) -> the process-group timeout the rank's script sets, where it could be read."""
        return dict(self._pg_timeouts)

    async def dump(self, ranks: Sequence[RankKey]) -> Snapshot:
        """Dump these ranks again over their nodes' open workers, with the current options, and only them:
        every other rank keeps what the last pass took (and is not paused). A rank no longer in the snapshot,
        or on a node without a worker, keeps its data with an error saying so."""
        async with self._exclusive():
            by_node: dict[str, list[int]] = {}
            for name, pid in ranks:
                by_node.setdefault(name, []).append(pid)

            async def one(node: _Node, pids: list[int]) -> None:
                known = [node.ranks[p] for p in pids if p in node.ranks]
                if not known:
                    return
                try:
                    if node.conn is None or node.conn.closed:
                        raise TransportError("lost", f"{node.name}: no worker connection; refresh first")
                    call = protocol.DUMP({**self._dump_options(),
                                          "targets": [{"pid": r.pid, "start_time": r.start_time} for r in known]})
                    req = node.conn.request(call, timeout=self.options.dump_timeout * len(known) + 15.0)
                    async for item in req:
                        self._apply_dump(node, item)
                except TransportError as exc:
                    error = exc.info("dump")
                    for r in known:
                        node.ranks[r.pid] = dataclasses.replace(node.ranks.get(r.pid, r), error=error)
                        self._emit(RankUpdate(node.ranks[r.pid]))

            await asyncio.gather(*(one(n, by_node[n.name]) for n in self._nodes if n.name in by_node))
            return self.current()

    def locals_trimmed(self) -> bool:
        """Whether a pass keeps per rank only the locals the analysis reads (collected with locals, past
        ALL_LOCALS_NODES nodes): then detail() fetches a rank's others from its node."""
        return self.options.collect.locals and not self._all_locals()

    def _all_locals(self) -> bool:
        """A small job (up to ALL_LOCALS_NODES nodes): every local of each thread travels with the pass."""
        return len(self._nodes) <= ALL_LOCALS_NODES

    async def detail(self, ranks: Sequence[RankKey]) -> list[RankSnapshot]:
        """These ranks with every local of their last dump: a pass keeps per rank only the locals the analysis
        reads (the compact protocol), the node keeps the rest for this (the TUI's rank view). A rank whose node
        has no such dump (or no worker) is returned as it was."""
        out: list[RankSnapshot] = []
        for name, pid in ranks:
            node = next((n for n in self._nodes if n.name == name), None)
            rank = node.ranks.get(pid) if node is not None else None
            if node is None or rank is None:
                continue
            if node.conn is not None and not node.conn.closed:
                try:
                    done = await node.conn.call(protocol.DETAIL({"pid": pid, "start_time": rank.start_time}),
                                                timeout=15.0)
                except TransportError:
                    done = {}
                if isinstance(done.get("dump"), dict):
                    full = replies.decode_dump(done["dump"])
                    if full.collected:
                        rank = dataclasses.replace(rank, threads=full.threads)
                        node.ranks[pid] = rank
                        self._emit(RankUpdate(rank))
            out.append(rank)
        return out

    def use(self, collect: CollectOptions) -> None:
        """Collect with these options from the next pass on (native frames, locals, non-blocking sampling)."""
        if collect != self.options.collect:
            self.options = dataclasses.replace(self.options, collect=collect)

    def current(self) -> Snapshot:
        """The latest snapshot, including strace/gdb results added since."""
        if self._last is None:
            return self._build(time.time(), 0.0, interrupted=False)
        # a strace/gdb round cancelled since (Ctrl+C) makes the picture an interrupted one, as a cancelled pass does
        return dataclasses.replace(self._last, nodes=tuple(n.status for n in self._nodes), ranks=self._ranks(),
                                   interrupted=self._last.interrupted or self._cancelled)

    async def strace(self, ranks: Sequence[RankKey], seconds: float) -> list[RankSnapshot]:
        """strace each rank for `seconds` (all at once); failures are recorded on the rank, never raised."""
        sudo = self.options.collect.sudo

        def args(r: RankSnapshot) -> StraceArgs:
            return {"pid": r.pid, "start_time": r.start_time, "seconds": seconds, "max_lines": STRACE_MAX_LINES,
                    "sudo": sudo, "data": self.options.strace_data}

        def apply(r: RankSnapshot, done: StraceDone) -> RankSnapshot:
            return dataclasses.replace(r, strace=replies.strace_result(done), resumed=r.resumed or
                                       bool(done.get("resumed")),
                                       actions=r.actions + (f"strace for {seconds:g} s: attached with ptrace, then "
                                                            "detached" + ("; SIGCONT: it was left stopped, and runs "
                                                                          "again" if done.get("resumed") else ""),))

        return await self._per_rank(ranks, protocol.STRACE, args, apply, seconds + self.options.dump_timeout,
                                    serial=False)

    async def gdb(self, ranks: Sequence[RankKey]) -> list[RankSnapshot]:
        """A gdb backtrace of each rank; one rank at a time per node (gdb stops the rank and costs seconds of CPU)."""
        def args(r: RankSnapshot) -> GdbArgs:
            return {"pid": r.pid, "start_time": r.start_time, "timeout": self.options.dump_timeout,
                    "sudo": self.options.collect.sudo}

        def apply(r: RankSnapshot, done: GdbDone) -> RankSnapshot:
            return dataclasses.replace(r, gdb=replies.gdb_text(done), resumed=r.resumed or bool(done.get("resumed")),
                                       actions=r.actions + ("gdb backtrace: attached with ptrace, then detached"
                                                            + ("; SIGCONT: it was left stopped, and runs again"
                                                               if done.get("resumed") else ""),))

        return await self._per_rank(ranks, protocol.GDB, args, apply, self.options.dump_timeout + 10.0, serial=True)

    def cancel(self) -> None:
        """Stop what is in flight; the running snapshot() returns what arrived, marked partial/interrupted."""
        self._cancelled = True
        for task in self._tasks:
            task.cancel()

    def end_workers(self) -> None:
        """Send every worker its EOF now (it stops its tools and exits) without waiting: the caller can print
        while the nodes shut down, then close() waits for each exit and closes the connections. After this the
        session takes no more passes."""
        self._closed = True
        self.cancel()
        for node in self._nodes:
            if node.conn is not None:
                node.conn.end_input()

    async def close(self) -> None:
        """Close every worker (EOF on its stdin: it stops its tools and exits) and every connection."""
        self.end_workers()
        conns = [n.conn for n in self._nodes if n.conn is not None]
        for node in self._nodes:
            node.conn = None
        await asyncio.gather(*(c.close() for c in conns), *self._closing, return_exceptions=True)

    # -- one pass ------------------------------------------------------------------------------------------

    async def _pass(self, *, reconnect: bool = True, cheap: bool = False) -> Snapshot:
        async with self._exclusive():
            with gc_paused() as pause:
                snap = await self._pass_unlocked(reconnect, cheap)
                pause.clean = not snap.interrupted and all(n.error is None for n in snap.nodes)
                return snap

    async def _pass_unlocked(self, reconnect: bool, cheap: bool = False) -> Snapshot:
        self._cancelled = False
        taken_at, t0 = time.time(), time.monotonic()
        nodes = [n for n in self._nodes
                 if reconnect or n.conn is not None or n.status.state != "failed"]
        for node in nodes:
            node.ranks, node.processes = {}, {}
        # A cold pass: each node's collect request goes out as soon as it is connected, and discovers at
        # once, but holds its dumps until every node has discovered (or failed): the dumps of a pass then
        # start as close together as the transport allows (issue 16.8), not each as soon as its own node
        # connected, while discovery still overlaps the other nodes' connections. A node waits at most
        # GATE_WAIT for the others, so one that cannot be reached does not hold the rest back for its whole
        # connect deadline. A warm pass sends every request at once: nothing to wait for.
        cold = not cheap and len(nodes) > 1 and any(n.conn is None or n.conn.closed for n in nodes)
        gate = _Gate(len(nodes)) if cold else None
        # one request id for the pass: every node's collect is then the same message (but for the nodes that
        # ask NCCL's RAS), which the srun transport sends once for all of them
        pass_id = next_request_id()
        self._tasks = [asyncio.create_task(self._run_node(n, gate, pass_id, cheap), name=f"hangscope-node-{n.name}")
                       for n in nodes]
        try:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            self._tasks = []
        if self.options.store and not self._cancelled:
            await self._store_numbers(nodes)
        snap = self._build(taken_at, time.monotonic() - t0, interrupted=self._cancelled)
        if not cheap:  # addresses the ranks talk to that no inspected node has, named (bounded: PeerNamer's deadline)
            snap = await self._namer.name(snap)
        self._last = snap
        self._emit(SnapshotDone(snap))
        return snap

    async def _store_numbers(self, nodes: Sequence[_Node]) -> None:
        """Ranks whose process says no number get the one their job's store gives (app/session/store.py); each
        store is asked once a session, from a node that holds a connection to it."""
        ranks = [r for n in nodes for r in n.ranks.values()]
        asks = pgstore.plan([r for r in ranks if (r.node, r.pid, r.start_time) not in self._store_known],
                            skip=self._store_failed)
        by_name = {n.name: n for n in nodes}

        async def one(ask: pgstore.StoreAsk) -> None:
            node = by_name[ask.node]
            if node.conn is None or node.conn.closed:
                return
            call = protocol.STORE_RANKS({"store": ask.store, "listeners": list(ask.listeners), "pid": ask.pid,
                                         "timeout": STORE_TIMEOUT})
            try:
                done = await node.conn.call(call, timeout=STORE_TIMEOUT + 10.0)
            except TransportError as exc:
                self._store_failed.add(pgstore.store_key(ask.node, ask.store))
                note = f"the job's store at {ask.store} could not be read for rank numbers: {exc}"
                self._update(node, warnings=node.status.warnings + (note[:1000],))
                return
            raw = done.get("ranks")
            named: dict = raw if isinstance(raw, dict) else {}
            how = "LIST_KEYS" if done.get("how") == "LIST_KEYS" else "CHECK"
            self._store_known.update(pgstore.numbers(ask, named, how))
            read = done.get("read") if isinstance(done.get("read"), int) else 0
            if ask.host is not None:  # said on every later snapshot too, with when it was done
                at = time.strftime("%H:%M:%S")
                self._store_actions[(ask.host.node, ask.host.pid, ask.host.start_time)] = (
                    f"at {at} hangscope read the rank numbers from the store it serves ({ask.store[:100]}): "
                    f"{how} and {read} GET, read-only, one connection")

        if asks:
            await asyncio.gather(*(one(a) for a in asks))
        if not self._store_known:
            return
        for n in nodes:
            for r in pgstore.apply(list(n.ranks.values()), self._store_known):
                done = self._store_actions.get((r.node, r.pid, r.start_time))
                if done is not None:
                    r = dataclasses.replace(r, actions=r.actions + (done,))
                if r is not n.ranks.get(r.pid):
                    n.ranks[r.pid] = r
                    self._emit(RankUpdate(r))

    def _exclusive(self) -> asyncio.Lock:
        """One pass or strace/gdb round at a time: they share the workers and the cancel flag."""
        if self._closed:
            raise HangscopeError("the session is closed")
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _run_node(self, node: _Node, gate: Optional["_Gate"] = None, pass_id: Optional[int] = None,
                        cheap: bool = False) -> None:
        phase = "connect"
        timings: dict[str, float] = {}
        arrived = gate is None

        def arrive() -> None:
            nonlocal arrived
            if not arrived:
                arrived = True
                assert gate is not None
                gate.arrive()

        try:
            await self._connect(node, timings)
            conn = node.conn
            assert conn is not None
            phase = "discover"
            self._update(node, state="discovering", error=None, timings=tuple(timings.items()), gpu=None)
            t = time.monotonic()
            if cheap:
                await self._discover(node, conn)
                timings["discover"] = time.monotonic() - t
                self._update(node, state="done", ranks_found=len(node.ranks), timings=tuple(timings.items()))
                return
            # One request: the worker discovers and dumps what it found at once (workers/ops.py collect).
            # NCCL's RAS view is job-wide: the first two nodes of the list ask it (two: one may be down).
            args: CollectArgs = {**self._collect_args(), "ras": any(node is n for n in self._nodes[:2]),
                                 "hold": 0.0 if gate is None else GATE_WAIT + 1.0}
            # each item is read into the model in the connection's reader as it arrives (_collect_decoder)
            req = cast("Request[tuple[Optional[CollectItemKey], Any], CollectDone]",
                       conn.request(protocol.COLLECT(args), timeout=DISCOVER_TIMEOUT,
                                    decode=_collect_decoder(node.name, conn.shared),
                                    req_id=pass_id))
            async for key, value in req:
                if key == "gpu_evidence":  # GPU-side evidence (workers/collect/gpu_evidence.py)
                    self._update(node, gpu=value)
                elif key == "dump" and value is not None:
                    self._apply_dump(node, value)
                elif key == "process_dump" and value is not None:
                    self._apply_process_dump(node, value)
                elif key == "rank" and value is not None:
                    node.ranks[value.pid] = value
                    self._emit(RankUpdate(value))
                elif key == "discovered":
                    timings["discover"] = time.monotonic() - t
                    phase, t = "collect", time.monotonic()
                    # what discovery says about the node (spawn ranks taken, candidates when none): remote text
                    found, read_at = value
                    found = found if isinstance(found, dict) else {}
                    node_time = found.get("time")
                    if isinstance(node_time, (int, float)) and not isinstance(node_time, bool):
                        node.clock_offset = float(node_time) - read_at
                    for raw in (found.get("processes") or [])[:1024]:
                        proc = replies.process_from_discover(node.name, raw) if isinstance(raw, dict) else None
                        if proc is not None:
                            node.processes[proc.pid] = proc
                    notes = tuple(n[:1000] for n in (found.get("notes") or [])[:10] if isinstance(n, str))
                    self._update(node, state="collecting", ranks_found=len(node.ranks),
                                 timings=tuple(timings.items()),
                                 warnings=node.status.warnings + tuple(n for n in notes
                                                                       if n not in node.status.warnings))
                    # A backstop only (the worker enforces each rank's deadline): as if every rank ran into
                    # it, one by one (and the launchers or children it dumps after them).
                    req.set_deadline(self.options.dump_timeout * (len(node.ranks) + min(len(node.processes), 32))
                                     + 15.0 + (0.0 if gate is None else GATE_WAIT))
                    if gate is not None and not arrived:
                        arrive()
                        await gate.wait(GATE_WAIT)
                        conn.send_go(req.id, gate.go_id)
                        t = time.monotonic()  # the dumps start now: the wait for the others is not theirs
            if node.ranks:
                timings["dump"] = time.monotonic() - t
            self._update(node, state="done", timings=tuple(timings.items()))
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            self._node_failed(node, TransportError("cancelled", f"{node.name}: cancelled during {phase}",
                                                   phase=phase), timings)
        except TransportError as exc:
            if phase == "discover" and exc.code == "timeout" and self.options.match:
                # the pattern's own search is the likelier cause than the node (workers/patterns.py)
                exc = TransportError("timeout", f"{exc.message}; searching the command lines for --match "
                                     f"{self.options.match!r} may be what took so long: simplify the pattern",
                                     phase=phase)
            self._node_failed(node, exc, timings, phase)
        except Exception as exc:  # a bug must not take the other nodes down: report it on this node
            self._node_failed(node, TransportError("internal", f"{node.name}: {type(exc).__name__}: {exc}",
                                                   phase=phase), timings)
        finally:
            arrive()  # a node that failed, or ended before discovering, holds nobody back

    async def _discover(self, node: _Node, conn: WorkerConnection) -> None:
        """The cheap sample of one node: its ranks with their counters and sockets, its worker's cost."""
        o = self.options
        args: DiscoverArgs = {"pids": list(o.pids) if o.pids is not None else None, "match": o.match,
                              "sudo": o.collect.sudo, "timeouts": True, "gpus": False}
        req = conn.request(protocol.DISCOVER(args), timeout=DISCOVER_TIMEOUT)
        async for item in req:
            if not isinstance(item, dict):
                continue
            rank = replies.rank_from_discover(node.name, item)
            node.ranks[rank.pid] = rank
            timeout = replies.pg_timeout(item.get("pg_timeout"))
            if timeout is not None:
                if len(self._pg_timeouts) >= MAX_PG_TIMEOUTS:
                    self._pg_timeouts.clear()  # bounded over days of samples: the live ranks' come back next time
                self._pg_timeouts[(node.name, rank.pid, rank.start_time)] = timeout
            self._emit(RankUpdate(rank))
        done: DiscoverDone = req.done or {}
        node_time = done.get("time")
        if isinstance(node_time, (int, float)) and not isinstance(node_time, bool):
            node.clock_offset = float(node_time) - time.time()
        for raw in (done.get("processes") or [])[:1024]:
            proc = replies.process_from_discover(node.name, raw) if isinstance(raw, dict) else None
            if proc is not None:
                node.processes[proc.pid] = proc
        self._costs[node.name] = WorkerCost(_seconds(done.get("worker_cpu")), _seconds(done.get("sshd_cpu")),
                                            conn.pid)

    async def _connect(self, node: _Node, timings: dict[str, float]) -> None:
        if node.conn is None or node.conn.closed:
            node.conn = None
            self._update(node, state="connecting", error=None, timings=(), warnings=(), ranks_found=0)
            conn = await self._open(node)
            node.conn = conn
            timings.update({k: v for k, v in conn.timings.items() if k != "total"})
            self._update(node, info=replies.node_info(conn.hello), warnings=tuple(conn.warnings))
            if node.orphan is not None:
                await self._retire(node, conn, node.orphan)

    async def _retire(self, node: _Node, conn: WorkerConnection, pid: int) -> None:
        """End the worker of the node's lost connection through the new one (workers/ops.py retire: only that
        worker, by its pid, user and command line); bounded, and never a reason to fail the pass."""
        node.orphan = None
        try:
            await conn.request(protocol.RETIRE({"pid": pid}), timeout=RETIRE_TIMEOUT).collect()
        except TransportError:
            pass  # the lost worker ends when its sshd notices, as before

    async def _open(self, node: _Node) -> WorkerConnection:
        if self._connector is None:
            # every transport ships the same payload: packed meanwhile, it is ready when a node first logs in
            bootstrap.prebuild_payload()
            self._connector = self.options.connector(self._worker_options())
        return await self._connector.open(node.spec)

    def _worker_options(self) -> dict:
        # zlib frames (workers/protocol.py): a node's reply compresses 7-13x
        opts: dict = {"sudo": self.options.collect.sudo, "compress": "zlib", "compress_window": COMPRESS_WINDOW}
        if os.environ.get(WORKER_LOG_ENV) == "1":
            opts["log"] = True
        if os.environ.get(KEEP_WORKER_ENV):
            opts["keep_dir"] = os.environ[KEEP_WORKER_ENV]
        return opts

    def _dump_options(self) -> DumpOptions:
        c, o = self.options.collect, self.options
        return {"native": c.native, "locals": c.locals, "nonblocking": c.nonblocking, "timeout": o.dump_timeout,
                "concurrency": None, "loops": o.loops, "source_context": SOURCE_CONTEXT, "sudo": c.sudo}

    def _collect_args(self) -> CollectArgs:
        c, o = self.options.collect, self.options
        # compact: each distinct stack once per connection, per rank only what is its own (workers/compact.py);
        # a small job keeps every local in every rank's reply, a large one only those the analysis reads
        return {**self._dump_options(), "pids": list(o.pids) if o.pids is not None else None, "match": o.match,
                "gpu_evidence": c.gpu_evidence, "compact": True,
                "all_locals": self._all_locals()}

    def _apply_dump(self, node: _Node, item: DumpItem | replies.Dumped) -> None:
        dumped = item if isinstance(item, replies.Dumped) else replies.decode_dump(item)
        rank = node.ranks.get(dumped.pid)  # type: ignore[arg-type]
        if rank is None:
            return
        started, ended = dumped.started_at, dumped.ended_at
        times = {} if started is None or ended is None else {
            "dump_started": round(started - node.clock_offset, 6), "dump_ended": round(ended - node.clock_offset, 6)}
        rank = replies.apply_decoded(rank, dumped, **times)
        node.ranks[rank.pid] = rank
        self._emit(RankUpdate(rank))

    def _apply_process_dump(self, node: _Node, item: replies.Dumped) -> None:
        proc = node.processes.get(item.pid)  # type: ignore[arg-type]
        if proc is None:
            return
        why = "its rank waits on it" if proc.role == "child" else "no rank of it exists yet"
        node.processes[proc.pid] = replies.apply_process_dump(proc, item, why)

    def _node_failed(self, node: _Node, exc: TransportError, timings: dict[str, float],
                     phase: str = "") -> None:
        error = exc.info(exc.phase or phase)
        conn = node.conn
        if conn is not None and (conn.closed or conn.error is not None):
            node.conn = None  # the worker is gone: the next pass starts a new one
            if conn.pid is not None and exc.code == "lost":  # unreachable, maybe still running there
                node.orphan = conn.pid
            self._spawn_close(conn)
        # Ranks found but not dumped keep what arrived, marked partial with the node's reason.
        for pid, rank in list(node.ranks.items()):
            if not rank.collected or rank.partial:
                node.ranks[pid] = dataclasses.replace(rank, partial=True, error=rank.error or error)
                self._emit(RankUpdate(node.ranks[pid]))
        state = "partial" if node.ranks else "failed"
        self._update(node, state=state, error=error, timings=tuple(timings.items()))

    def _spawn_close(self, conn: WorkerConnection) -> None:
        # in the background: a dead node must not hold up the pass; close() waits for these
        task = asyncio.get_running_loop().create_task(conn.close(kill=True, timeout=2.0))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # -- strace / gdb --------------------------------------------------------------------------------------

    async def _per_rank(self, keys: Sequence[RankKey], op: protocol.Op[ArgsT, Any, DoneT], args: Callable[[RankSnapshot], ArgsT],
                        apply: Callable[[RankSnapshot, DoneT], RankSnapshot], timeout: float,
                        serial: bool) -> list[RankSnapshot]:
        by_node: dict[str, list[RankKey]] = {}
        for key in keys:
            by_node.setdefault(key[0], []).append(key)
        results: dict[RankKey, RankSnapshot] = {}

        async def one(node: Optional[_Node], key: RankKey) -> None:
            rank = node.ranks.get(key[1]) if node is not None else None
            if node is None or rank is None:
                results[key] = RankSnapshot(node=key[0], pid=key[1], start_time=0, error=ErrorInfo(
                    "target_exited", f"{key[0]} pid {key[1]} is not in the current snapshot; take a new one",
                    hint_for("target_exited")))
                return
            try:
                if node.conn is None or node.conn.closed:
                    raise TransportError("lost", f"{node.name}: no worker connection; refresh first")
                done = await node.conn.call(op(args(rank)), timeout=timeout)
                rank = apply(node.ranks.get(rank.pid, rank), done)
            except asyncio.CancelledError:
                if not self._cancelled:
                    raise
                rank = dataclasses.replace(rank, error=ErrorInfo("cancelled", f"{op.name} cancelled",
                                                                 hint_for("cancelled"), op.name))
            except TransportError as exc:
                if exc.code == "target_held":  # stopped, frozen or D: the tool was not run, nothing is wrong
                    current = node.ranks.get(rank.pid, rank)
                    rank = dataclasses.replace(current, actions=current.actions + (exc.message[:300],))
                    node.ranks[rank.pid] = rank
                    results[key] = rank
                    self._emit(RankUpdate(rank))
                    return
                error = exc.info(op.name)
                # The worker is gone (connection lost, worker died): the stacks already taken stay, but the
                # rank and its node say the picture is partial, as a loss during the dump pass does.
                gone = exc.code in _CONNECTION_GONE
                rank = dataclasses.replace(node.ranks.get(rank.pid, rank), error=error,
                                           partial=rank.partial or gone)
                if gone and node.status.state == "done":
                    self._update(node, state="partial", error=error)
            node.ranks[rank.pid] = rank
            results[key] = rank
            self._emit(RankUpdate(rank))

        async def per_node(name: str, node_keys: list[RankKey]) -> None:
            node = next((n for n in self._nodes if n.name == name), None)
            if serial:
                for key in node_keys:
                    await one(node, key)
            else:
                await asyncio.gather(*(one(node, key) for key in node_keys))

        async with self._exclusive():
            self._cancelled = False
            self._tasks = [asyncio.create_task(per_node(name, ks)) for name, ks in by_node.items()]
            try:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            finally:
                self._tasks = []
        return [results[k] for k in keys if k in results]

    # -- state ---------------------------------------------------------------------------------------------

    def _update(self, node: _Node, **changes: object) -> None:
        node.status = _STATUS.replace(node.status, **changes)
        self._emit(NodeUpdate(node.status))

    def _emit(self, event: SessionEvent) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception as exc:  # a UI bug must not stop collection; say so once on stderr
            print(f"hangscope: event handler failed: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _ranks(self) -> tuple[RankSnapshot, ...]:
        order = {n.name: i for i, n in enumerate(self._nodes)}
        ranks = [r for n in self._nodes for r in n.ranks.values()]
        ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, order.get(r.node, 0), r.pid))
        return tuple(ranks)

    def _processes(self, ranks: Sequence[RankSnapshot]) -> tuple[JobProcess, ...]:
        """The jobs' other processes, each with the job of the ranks it serves (its command line's otherwise)."""
        procs = [p for n in self._nodes for p in n.processes.values()]
        return tuple(dataclasses.replace(p, job=job, job_evidence=evidence)
                     for p, (job, evidence) in zip(procs, replies.process_jobs(procs, ranks)))

    def _build(self, taken_at: float, duration: float, *, interrupted: bool) -> Snapshot:
        ranks = self._ranks()
        return Snapshot(taken_at=taken_at, duration=duration, hangscope_version=__version__,
                        options=self.options.collect, nodes=tuple(n.status for n in self._nodes),
                        ranks=ranks, interrupted=interrupted, processes=self._processes(ranks),
                        dump_skew=dump_skew(ranks))
