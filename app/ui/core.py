"""HangscopeCore: the app's state and drawing. Session events come in as messages; history and views here.

HangscopeApp (app.py) adds the key bindings and the actions of collect.py and navigate.py on top of it; those
two build on this class, not on each other.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Dict, List, Optional, Set

from rich.text import Text
from textual.app import App
from textual.message import Message

from app.analysis.processes import rank_family
from app.errors import HangscopeError
from app.gpu.model import GpuTestResults
from app.model import NodeStatus, RankSnapshot, Snapshot
from app.printable import clock
from app.session import NodeUpdate, RankUpdate, SessionEvent, SnapshotDone
from app.ui.grid_model import RankKey, rank_key
from app.ui.safe import counted, literal
from app.ui.screens.drill import DrillScreen
from app.ui.screens.main import MainScreen
from app.ui.screens.too_small import MIN_HEIGHT, MIN_WIDTH, TooSmallScreen
from app.ui.source import SessionSource
from app.ui.view import View, build_view, filter_keys, progress_text

HISTORY_LIMIT = 100  # snapshots kept to step back through (and to tell stuck from progressing) ...
HISTORY_RANKS = 200_000  # ... but no more ranks than this in all of them: a watched 4,096-rank job keeps ~48
VIEWS_KEPT = 4  # analysed snapshots cached; stepping further back analyses again
EARLIER_SAMPLES = 10  # samples before a snapshot that its analysis reads to tell stuck from progressing
THREADED_VIEW_RANKS = 10_000  # a finished snapshot this large is analysed in a thread (~2-5 s at 100,000 ranks):
# meanwhile the app takes keys and shows the last picture; smaller ones are analysed at once, as they arrive
LIVE_REDRAW = 0.1  # seconds between redraws while ranks stream in, at least ...
LIVE_REDRAW_SHARE = 0.1  # ... and at most this share of the time spent redrawing: a redraw lays out every rank
# that has arrived (~0.3 s at 100,000 ranks here), and the pass it shows runs on the same event loop


class SessionMessage(Message):
    """A finished snapshot (SnapshotDone), posted to the app by the source's listener, after the batch of updates
    that came before it."""

    def __init__(self, event: SessionEvent) -> None:
        super().__init__()
        self.event = event


class SessionBatch(Message):
    """The node and rank updates that arrived since the last batch was posted, the newest of each node and rank
    in the order each first came: one message for many events, applied together (a 12,500-node pass emits
    ~260,000 of them; one Textual message each cost more than the redraws they fed)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: Dict[tuple, SessionEvent] = {}


class HangscopeCore(App[int]):
    """State shared by every action: the source, the snapshots taken, what is shown, marked and filtered."""

    def __init__(self, source: SessionSource, *, interval: Optional[float] = None, title: str = "",
                 start: bool = True) -> None:
        super().__init__()
        self.source = source
        self.interval = interval
        self.start = start
        if title:
            self.sub_title = title
        self.history: List[Snapshot] = []
        self.views: Dict[int, View] = {}
        self.position = -1  # index into history shown; -1 before the first snapshot
        self.follow = True  # show each new snapshot as it arrives (off while stepping back)
        self.marked: Set[RankKey] = set()
        self.query_text = ""
        self.live_nodes: Dict[str, NodeStatus] = {}
        self.live_ranks: Dict[RankKey, RankSnapshot] = {}
        self._redraw_pending = False
        self._redraw_cost = 0.0  # seconds the last live redraw took
        self._batch: Optional[SessionBatch] = None  # posted, not yet applied: later updates join it
        self.analysing: List[Snapshot] = []  # finished snapshots whose analysis runs in a thread, in order
        self.main = MainScreen()
        self.collecting = False
        self.collecting_what = ""
        self.watching = False
        self.gpu_results: Optional[GpuTestResults] = None  # the last GPU test's, exported with the report

    def get_default_screen(self) -> MainScreen:
        return self.main

    def check_size(self) -> None:
        """Called by every screen's Resize: the too-small overlay comes and goes with the terminal size."""
        w, h = self.size
        small = w < MIN_WIDTH or h < MIN_HEIGHT
        showing = isinstance(self.screen, TooSmallScreen)
        if small and not showing:
            self.push_screen(TooSmallScreen())
        elif showing:
            self.screen.refresh_text()  # type: ignore[attr-defined]
            if not small:
                self.pop_screen()

    # -- session events in -----------------------------------------------------------------------------

    def _on_source_event(self, event: SessionEvent) -> None:
        """The source's listener (on the app's event loop, where the session runs): node and rank updates join
        the batch posted last and not yet applied (the newest per node and rank, as a redraw shows only that); a
        finished snapshot is a message of its own, after that batch, and later updates go into a new one."""
        if isinstance(event, NodeUpdate):
            key: tuple = ("node", event.node.name)
        elif isinstance(event, RankUpdate):
            key = ("rank", rank_key(event.rank))
        else:
            self._batch = None
            self.post_message(SessionMessage(event))
            return
        batch = self._batch
        if batch is None:
            batch = self._batch = SessionBatch()
            self.post_message(batch)
        batch.events[key] = event

    def on_session_batch(self, message: SessionBatch) -> None:
        if message is self._batch:
            self._batch = None
        live_nodes, live_ranks = self.live_nodes, self.live_ranks
        for (_, key), event in message.events.items():
            if isinstance(event, NodeUpdate):
                live_nodes[key] = event.node
            elif isinstance(event, RankUpdate):
                live_ranks[key] = event.rank
        self._schedule_redraw()

    def on_session_message(self, message: SessionMessage) -> None:
        event = message.event
        if isinstance(event, SnapshotDone):
            if len(event.snapshot.ranks) < THREADED_VIEW_RANKS and not self.analysing:
                self.add_snapshot(event.snapshot)
                return
            self.analysing.append(event.snapshot)  # after the ones before it: history keeps the passes' order
            if len(self.analysing) == 1:
                self._analyse_next()

    def _analyse_next(self) -> None:
        """The analysis of the first snapshot waiting for one, in a thread, against the samples before it as
        the history will hold them when it is added (what current_view would analyse it with)."""
        snap = self.analysing[0]
        earlier = self.history[-min(self._history_limit(snap) - 1, EARLIER_SAMPLES):]  # the limit is at least 3
        self._update_topbar()
        # named: Textual describes a worker by repr() of its work otherwise, here of every rank of every sample
        self.run_worker(partial(self._analyse, snap, list(earlier)), thread=True, group="analysis",
                        exit_on_error=False, name="analysis", description="the analysis of a finished snapshot")

    def _analyse(self, snap: Snapshot, earlier: List[Snapshot]) -> None:
        try:
            view: Optional[View] = build_view(snap, earlier)
        except Exception:  # analysed again on the event loop, which reports it as it always did
            view = None
        self.call_from_thread(self._analysed, snap, view)

    def _analysed(self, snap: Snapshot, view: Optional[View]) -> None:
        self.analysing.pop(0)
        self.add_snapshot(snap, view=view)
        if self.analysing:
            self._analyse_next()
        else:
            self._update_topbar()

    def earlier_samples(self) -> List[Snapshot]:
        """The samples before the one shown that its analysis and its export read (stuck from progressing)."""
        return self.history[max(0, self.position - EARLIER_SAMPLES):self.position]

    @staticmethod
    def _history_limit(snap: Snapshot) -> int:
        return max(3, min(HISTORY_LIMIT, HISTORY_RANKS // max(len(snap.ranks), 1)))

    def _schedule_redraw(self) -> None:
        if not self._redraw_pending:
            self._redraw_pending = True
            self.set_timer(max(LIVE_REDRAW, self._redraw_cost / LIVE_REDRAW_SHARE), self._redraw_live)

    def _redraw_live(self) -> None:
        """While ranks stream in: show them (with the classes of the last snapshot) and the node states."""
        self._redraw_pending = False
        if not self.collecting or not self.follow:
            return
        started = time.perf_counter()
        view = self.current_view
        self.main.show_live(self.live_snapshot(), view.class_of if view is not None else {})
        self._update_topbar()
        self._redraw_cost = time.perf_counter() - started

    def live_snapshot(self) -> Snapshot:
        base = self.history[-1] if self.history else Snapshot(taken_at=time.time())
        nodes = {n.name: n for n in base.nodes}
        nodes.update(self.live_nodes)
        ranks = dict(self.live_ranks) if self.live_ranks else {rank_key(r): r for r in base.ranks}
        return Snapshot(taken_at=base.taken_at, options=base.options, nodes=tuple(nodes.values()),
                        ranks=tuple(ranks.values()))

    def add_snapshot(self, snap: Snapshot, *, replace: bool = False, view: Optional[View] = None) -> None:
        """A finished snapshot: a new history entry (or, for strace/gdb results, the latest one updated).
        `view`: its analysis, made already against the samples before it (_analyse_next)."""
        self.live_nodes.clear()
        self.live_ranks.clear()
        if replace and self.history:
            self.history[-1] = snap
            self.views.pop(len(self.history) - 1, None)
        else:
            self.history.append(snap)
            limit = self._history_limit(snap)
            while len(self.history) > limit:
                self.history.pop(0)
                self.views = {i - 1: v for i, v in self.views.items() if i > 0}
                self.position = max(self.position - 1, 0)
            if view is not None:
                self.views[len(self.history) - 1] = view
        if self.follow or self.position < 0:
            self.position = len(self.history) - 1
        self.show_position()

    @property
    def current_view(self) -> Optional[View]:
        if self.position < 0 or not self.history:
            return None
        view = self.views.get(self.position)
        if view is None:
            # Earlier samples of the same job tell stuck from progressing.
            view = build_view(self.history[self.position], self.earlier_samples())
            self.views[self.position] = view
            for old in sorted(self.views, key=lambda i: abs(i - self.position))[VIEWS_KEPT:]:
                del self.views[old]  # each view holds an analysis of every rank: keep the nearest few
        return view

    # -- errors ----------------------------------------------------------------------------------------

    def show_error(self, exc: BaseException, *, title: str = "collection failed", timeout: float = 15) -> None:
        """The one place the TUI shows an error: a HangscopeError with its title and remedy; anything else (a
        bug in a layer below) by its type, under `title`, so the screen stays usable."""
        if isinstance(exc, HangscopeError):
            self.notify(f"{exc}" + (f"\n{exc.hint}" if exc.hint else ""), title=exc.title, severity="error",
                        timeout=timeout, markup=False)
        else:
            self.notify(f"{type(exc).__name__}: {exc}", title=title, severity="error", timeout=timeout,
                        markup=False)

    # -- drawing ---------------------------------------------------------------------------------------

    def show_position(self) -> None:
        view = self.current_view
        if view is None:
            return
        self.main.show_view(view, self.marked, keep=self.first_suspect(view))
        self._update_topbar()
        self.refresh_drill()

    def first_suspect(self, view: View) -> Optional[RankKey]:
        """Where the cursor starts: the analysis's culprit (a rank of it with a stack), else the ranks of the first
        finding that names some (a note such as "all ranks at the same place")."""
        culprit = view.analysis.culprit
        keys = list(culprit.ranks) if culprit is not None else []
        keys += [k for f in view.findings for k in f.ranks]
        return next((k for k in keys if k in view.class_of), None)

    def _update_topbar(self) -> None:
        out = Text(end="")
        out.append("hangscope", style="bold")
        if self.sub_title:
            out.append("  ")
            title = self.sub_title
            if len(title) > 40:  # a long path: its end (the file name) says more than its start
                title = "…" + title[-39:]
            out.append_text(literal(title, 40))
        if not self.source.live:
            out.append("  (loaded file)", style="dim")
        view = self.current_view
        if view is not None:
            snap = view.snapshot
            taken = clock(snap.taken_at)
            out.append(f"  {counted(len(snap.nodes), 'node')}  {counted(len(snap.ranks), 'rank')}  "
                       f"snapshot {self.position + 1}/"
                       f"{len(self.history)} at {taken}")
            if snap.interrupted:
                out.append("  interrupted", style="bold #ffaf00")
            elif not snap.complete:
                out.append("  partial", style="bold #ffaf00")
        opts = self.source.options
        modes = [m for m, on in (("locals", opts.locals), ("native", opts.native), ("non-blocking", opts.nonblocking),
                                 ("sudo", opts.sudo)) if on]
        if modes and self.source.live:
            out.append(f"  [{' '.join(modes)}]", style="dim")
        if self.marked:
            out.append(f"  {len(self.marked)} marked", style="bold")
        if self.collecting:
            out.append(f"  {self.collecting_what}…", style="bold #5fafff")
        elif self.analysing:
            out.append(f"  analysing {counted(len(self.analysing[0].ranks), 'rank')}…", style="bold #5fafff")
        if self.watching:
            out.append(f"  watch {self.interval:g}s", style="bold #5fd75f")
        if self.query_text:
            out.append("  filter: ")
            out.append_text(literal(self.query_text, 40, "italic"))
        self.main.set_topbar(out)

    def set_filter(self, text: str) -> None:
        self.query_text = self.main.query_text = text.strip()
        self.main.close_filter()
        self.show_position()
        self._update_topbar()
        view = self.current_view
        if view is not None and self.query_text:
            found = filter_keys(view.snapshot, self.query_text) or set()
            self.notify(f"{counted(len(found), 'rank')} match{'es' if len(found) == 1 else ''}", timeout=3)

    # -- what actions apply to ---------------------------------------------------------------------------

    def current_rank(self) -> Optional[RankSnapshot]:
        screen = self.screen
        if isinstance(screen, DrillScreen):
            return screen.rank
        cell = self.main.grid.current
        return cell.rank if cell is not None else None

    def targets(self) -> List[RankKey]:
        """The ranks an action applies to: the marked ones, else the one under the cursor."""
        view = self.current_view
        if self.marked and view is not None:
            return [k for k in view.ranks if k in self.marked]
        rank = self.current_rank()
        return [rank_key(rank)] if rank is not None else []

    def drill_summary(self, rank: RankSnapshot) -> Text:
        view = self.current_view
        out = Text(end="")
        if view is None:
            return out
        key = rank_key(rank)
        cv = view.class_view(key)
        if cv is not None:
            out.append(f"{cv.symbol} class {cv.index + 1}: ", style=f"bold {cv.color}")
            out.append(f"{cv.size} rank{'s' if cv.size != 1 else ''} {cv.where}")
        if key in view.suspects:
            out.append("  suspect", style="bold #ff5f87")
        progress = progress_text(view.progress.get(key))
        if progress:
            out.append(f"  {progress}", style="italic")
        return out

    def refresh_drill(self) -> None:
        """A newer snapshot arrived: the open drill-down shows the same rank (by node and pid) from it."""
        view = self.current_view
        for screen in self.screen_stack:
            if isinstance(screen, DrillScreen) and view is not None:
                rank = view.ranks.get(screen.key)
                if rank is not None:
                    screen.update(rank, self.drill_summary(rank), view.snapshot.options.locals,
                                  rank_family(view.snapshot, rank))
                    self.fetch_detail(screen.key)

    def fetch_detail(self, key: RankKey) -> None:
        """A large job's pass carries only the locals the analysis reads; the rank view asks the rank's node for
        the rest of its last dump (Session.detail) and shows them when they come. Never during a collection."""
        if not self.source.live or self.collecting or not self.source.locals_trimmed():
            return
        for screen in self.screen_stack:
            if isinstance(screen, DrillScreen) and screen.key == key:
                screen.set_locals_note("only the locals the analysis reads so far; the rest are being read from "
                                       f"{screen.rank.node}")
        self.run_worker(self._detail(key), group=f"detail-{key[0]}-{key[1]}", exclusive=True, exit_on_error=False)

    async def _detail(self, key: RankKey) -> None:
        try:
            found = await self.source.detail([key])
        except Exception as exc:  # shown, never fatal: the trimmed locals stay on screen
            found = []
            self.show_error(exc, title="reading every local failed")
        full = next((r for r in found if rank_key(r) == key), None)
        view = self.current_view
        for screen in self.screen_stack:
            if isinstance(screen, DrillScreen) and screen.key == key:
                if full is None or full == screen.rank:
                    screen.set_locals_note("the node sent no other locals for this rank (it had none, or its dump "
                                           "was replaced by a newer pass): press r to dump it again")
                    continue
                screen.set_locals_note("")
                screen.update(full, self.drill_summary(full),
                              view.snapshot.options.locals if view is not None else None,
                              rank_family(view.snapshot, full) if view is not None else None)
