"""Where the TUI's data comes from: the SessionSource protocol, the live one (app.session.Session), a replay.

The App is handed a source and never builds one (memray's pattern): tests give it a ReplaySource that emits
the very events the real Session emits (NodeUpdate, RankUpdate, SnapshotDone), so the UI is tested without
I/O, and a loaded snapshot file is just a replay with nothing more to collect. Only a live source can run
the GPU tests (gpu_access()): they need the nodes themselves, not a recording of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from app.gpu.options import GpuTestOptions
from app.hosts import HostSpec
from app.model import CollectOptions, RankKey, RankSnapshot, Snapshot, rank_key
from app.session import NodeUpdate, RankUpdate, SessionEvent, SessionOptions, SnapshotDone

Listener = Callable[[SessionEvent], None]

NEEDS_LIVE_NODES = ("the GPU tests need live nodes: this view replays a recording. Run `hangscope hosts.txt` "
                    "to test from here, or `hangscope hosts.txt --test sanity|bench|pairs|net` headless.")


@dataclass(frozen=True)
class GpuAccess:
    """How the GPU tests reach the nodes: the session's hosts (None: this machine) and its SSH settings; the
    tests open workers of their own with them (app.gpu.connect), so they never disturb a collection."""

    hosts: Optional[Sequence[HostSpec]]
    session_options: SessionOptions
    options: GpuTestOptions = GpuTestOptions()


class SessionSource(Protocol):
    """What the TUI needs from a session. `live` False means there is nothing to collect (a loaded file)."""

    live: bool
    options: CollectOptions

    def subscribe(self, listener: Listener) -> None: ...

    async def snapshot(self, options: Optional[CollectOptions] = None) -> Snapshot: ...

    async def refresh(self, ranks: Optional[Sequence[RankKey]] = None,
                      options: Optional[CollectOptions] = None) -> Snapshot: ...

    async def strace(self, ranks: Sequence[RankKey], seconds: float) -> Snapshot: ...

    async def gdb(self, ranks: Sequence[RankKey]) -> Snapshot: ...

    def locals_trimmed(self) -> bool:
        """Whether the ranks carry only the locals the analysis reads (a large job): detail() has the rest."""
        ...

    async def detail(self, ranks: Sequence[RankKey]) -> List[RankSnapshot]:
        """These ranks with every local of their last dump, read from their nodes (the rank view's Locals)."""
        ...

    def cancel(self) -> None: ...

    async def close(self) -> None: ...

    def gpu_access(self) -> Optional[GpuAccess]:
        """Where the GPU tests may run; None when there are no live nodes (NEEDS_LIVE_NODES says why)."""
        ...


class LiveSource:
    """The real source: an app.session.Session, whose events are forwarded to the subscribed listener."""

    live = True

    def __init__(self, hosts: Optional[Sequence[HostSpec]], options: SessionOptions, *,
                 gpu_options: Optional[GpuTestOptions] = None) -> None:
        from app.session import Session

        self._listener: Optional[Listener] = None
        self.session = Session(hosts, options, on_event=self._emit)
        self._hosts = list(hosts) if hosts is not None else None
        # The tests' interpreter defaults to the session's --python; otherwise each node's is taken from the
        # job's ranks (/proc/PID/exe) by the runner.
        self._gpu_options = gpu_options or GpuTestOptions(python=options.python)

    @property
    def options(self) -> CollectOptions:
        return self.session.options.collect

    def subscribe(self, listener: Listener) -> None:
        self._listener = listener

    def _emit(self, event: SessionEvent) -> None:
        if self._listener is not None:
            self._listener(event)

    def _use(self, options: Optional[CollectOptions]) -> None:
        # The session reads its collect options at the start of each pass; this is how the TUI's "collect
        # with native frames / locals" and the watch mode's non-blocking sampling reach it.
        if options is not None:
            self.session.use(options)

    async def snapshot(self, options: Optional[CollectOptions] = None) -> Snapshot:
        self._use(options)
        return await self.session.snapshot()

    async def refresh(self, ranks: Optional[Sequence[RankKey]] = None,
                      options: Optional[CollectOptions] = None) -> Snapshot:
        # `ranks`: only those are dumped again (and paused, when the options pause), as the palette and the
        # consent dialog say; every other rank keeps what the last pass took. None: a pass over every node.
        self._use(options)
        if ranks:
            return await self.session.dump(list(ranks))
        return await self.session.refresh()

    async def strace(self, ranks: Sequence[RankKey], seconds: float) -> Snapshot:
        await self.session.strace(list(ranks), seconds)
        return self.session.current()

    async def gdb(self, ranks: Sequence[RankKey]) -> Snapshot:
        await self.session.gdb(list(ranks))
        return self.session.current()

    def locals_trimmed(self) -> bool:
        return self.session.locals_trimmed()

    async def detail(self, ranks: Sequence[RankKey]) -> List[RankSnapshot]:
        return await self.session.detail(list(ranks))

    def cancel(self) -> None:
        self.session.cancel()

    async def close(self) -> None:
        await self.session.close()

    def gpu_access(self) -> Optional[GpuAccess]:
        return GpuAccess(self._hosts, self.session.options, self._gpu_options)


class ReplaySource:
    """Replays recorded snapshots through the Session's events: each snapshot()/refresh() emits the next one
    (nodes, then ranks, then SnapshotDone); the last one repeats. strace/gdb answer from the recording."""

    def __init__(self, snapshots: Sequence[Snapshot], *, live: bool = True,
                 details: Optional[Dict[RankKey, RankSnapshot]] = None) -> None:
        if not snapshots:
            raise ValueError("ReplaySource needs at least one snapshot")
        self.snapshots: List[Snapshot] = list(snapshots)
        self.live = live
        # what detail() answers: ranks with every local, as a node keeps them for a large job (trimmed then)
        self.details: Dict[RankKey, RankSnapshot] = dict(details or {})
        self.trimmed = bool(self.details)
        self.options = snapshots[0].options
        self.calls: List[Tuple[str, object]] = []  # what the UI asked for, in order (tests read it)
        self.cancelled = 0
        self.closed = False
        self._next = 0
        self._current: Optional[Snapshot] = None
        self._listener: Optional[Listener] = None

    def subscribe(self, listener: Listener) -> None:
        self._listener = listener

    def _emit(self, event: SessionEvent) -> None:
        if self._listener is not None:
            self._listener(event)

    def _play(self, snap: Snapshot) -> Snapshot:
        for node in snap.nodes:
            self._emit(NodeUpdate(node))
        for rank in snap.ranks:
            self._emit(RankUpdate(rank))
        self._current = snap
        self._emit(SnapshotDone(snap))
        return snap

    def _take(self, options: Optional[CollectOptions]) -> Snapshot:
        snap = self.snapshots[min(self._next, len(self.snapshots) - 1)]
        self._next += 1
        if options is not None:
            self.options = options
            snap = dataclasses.replace(snap, options=options)
        return snap

    async def snapshot(self, options: Optional[CollectOptions] = None) -> Snapshot:
        self.calls.append(("snapshot", options))
        return self._play(self._take(options))

    async def refresh(self, ranks: Optional[Sequence[RankKey]] = None,
                      options: Optional[CollectOptions] = None) -> Snapshot:
        self.calls.append(("refresh", tuple(ranks) if ranks is not None else None))
        return self._play(self._take(options))

    async def _tool(self, op: str, ranks: Sequence[RankKey], change: Callable[[RankSnapshot], RankSnapshot]
                    ) -> Snapshot:
        assert self._current is not None, f"{op} before any snapshot"
        wanted = set(ranks)
        updated = []
        for r in self._current.ranks:
            if rank_key(r) in wanted:
                r = change(r)
                self._emit(RankUpdate(r))
            updated.append(r)
        self._current = dataclasses.replace(self._current, ranks=tuple(updated))
        return self._current

    async def strace(self, ranks: Sequence[RankKey], seconds: float) -> Snapshot:
        self.calls.append(("strace", (tuple(ranks), seconds)))
        recorded = {rank_key(r): r for s in self.snapshots for r in s.ranks if r.strace is not None}
        return await self._tool("strace", ranks, lambda r: dataclasses.replace(
            r, strace=recorded[rank_key(r)].strace) if rank_key(r) in recorded else r)

    async def gdb(self, ranks: Sequence[RankKey]) -> Snapshot:
        self.calls.append(("gdb", tuple(ranks)))
        recorded = {rank_key(r): r for s in self.snapshots for r in s.ranks if r.gdb is not None}
        return await self._tool("gdb", ranks, lambda r: dataclasses.replace(
            r, gdb=recorded[rank_key(r)].gdb) if rank_key(r) in recorded else r)

    def locals_trimmed(self) -> bool:
        return self.trimmed

    async def detail(self, ranks: Sequence[RankKey]) -> List[RankSnapshot]:
        """The recorded full ranks (`details`) for those asked about, else the rank as the last snapshot has it."""
        self.calls.append(("detail", tuple(ranks)))
        current = {rank_key(r): r for r in self._current.ranks} if self._current is not None else {}
        out = []
        for key in ranks:
            rank = self.details.get(key) or current.get(key)
            if rank is not None:
                if key in self.details:
                    self._emit(RankUpdate(rank))
                out.append(rank)
        return out

    def cancel(self) -> None:
        self.cancelled += 1

    async def close(self) -> None:
        self.closed = True

    def gpu_access(self) -> Optional[GpuAccess]:
        return None  # a recording has no nodes to test (NEEDS_LIVE_NODES)


def loaded_source(snapshot: Snapshot) -> ReplaySource:
    """A saved snapshot (--load FILE): shown as it is, with nothing to collect."""
    return ReplaySource([snapshot], live=False)
