"""`hangscope watch --tui`: the jobs a watch follows, their rate over time (a sparkline per job and, for the job
under the cursor, per node), the captures, and what the watch said; Enter on a capture opens it as `--load`
does.

The watcher (app.watch.Watcher) is made by the CLI and handed in through a factory that takes the listener
(memray's injected source): it runs in this app's event loop and its events arrive as messages, so the UI is
tested with a fake watcher that emits the very events the real one does. Opening a capture suspends this app
and runs `hangscope --load SNAPSHOT` in the terminal; the watch goes on sampling meanwhile (its screen updates
are held until the viewer exits). The opener is injected too.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from typing import Any, Awaitable, Callable, Deque, List, Optional

from rich.text import Text
from textual.app import App, ComposeResult, SuspendNotSupported
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable, Footer, RichLog, Static

from app.ui.safe import clean, counted, literal
from app.watch.events import Captured, Event, Sampled, duration, rate_text, sparkline

SPARK_WIDTH = 32
NODE_ROWS = 200  # nodes listed for the job under the cursor (the busiest first)
LOG_LINES = 1000
CLOSE_TIMEOUT = 10.0  # seconds to close the workers on quit

Opener = Callable[[str], Awaitable[None]]


class WatchEvent(Message):
    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class WatchApp(App[int]):
    CSS = """
    #topbar { height: 1; background: $boost; padding: 0 1; }
    #jobs { height: 1fr; min-height: 5; border: round $primary-darken-2; }
    #nodes { height: 1fr; min-height: 5; border: round $primary-darken-2; }
    #captures { height: 1fr; min-height: 4; border: round $primary-darken-2; }
    #log { height: 10; border: round $primary-darken-2; }
    """
    TITLE = "hangscope watch"
    # Ctrl+C quits as q does (Textual's own Ctrl+C only says "press ctrl+q to quit"): in raw mode it is a key,
    # and a watch must end on it within a moment, hooks killed and workers closed
    BINDINGS = [Binding("q", "quit_watch", "quit"), Binding("ctrl+c", "quit_watch", "quit", show=False, priority=True),
                Binding("enter", "open_capture", "open capture", show=True),
                Binding("c", "focus_captures", "captures"), Binding("j", "focus_jobs", "jobs")]

    def __init__(self, make_watcher: Callable[[Callable[[Event], None]], Any], *, title: str = "",
                 opener: Optional[Opener] = None) -> None:
        super().__init__()
        self.make_watcher = make_watcher
        self.watcher: Any = None
        self.title_text = title
        self.opener = opener
        self.code: Optional[int] = None
        self.last_sample: Optional[Sampled] = None
        self.opened: List[str] = []  # captures opened (tests read it)
        self.said: Deque[str] = deque(maxlen=LOG_LINES)  # the log's lines, as text (tests read it)

    def compose(self) -> ComposeResult:
        yield Static(id="topbar")
        jobs: DataTable = DataTable(id="jobs", cursor_type="row", zebra_stripes=True)
        jobs.border_title = "jobs"
        yield jobs
        nodes: DataTable = DataTable(id="nodes", cursor_type="row")
        nodes.border_title = "nodes of the job"
        yield nodes
        captures: DataTable = DataTable(id="captures", cursor_type="row")
        captures.border_title = "captures (Enter opens)"
        yield captures
        log = RichLog(id="log", max_lines=LOG_LINES, wrap=True)
        log.border_title = "what the watch said"
        yield log
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#jobs", DataTable).add_columns("job", "status", "ranks", "rate now", "rate over time",
                                                       "no progress")
        self.query_one("#nodes", DataTable).add_columns("node", "rate over time", "rate now", "watch CPU")
        self.query_one("#captures", DataTable).add_columns("when", "kind", "job", "headline")
        self.watcher = self.make_watcher(self._post)
        self.run_worker(self._run(), group="watch", exclusive=True, exit_on_error=False)
        self._draw()

    def _post(self, event: Event) -> None:
        self.post_message(WatchEvent(event))

    async def _run(self) -> None:
        try:
            self.code = await self.watcher.run()
            self._say(Text(f"the watch has ended (exit {self.code}); q quits", style="bold"))
        except Exception as exc:  # a bug below must leave the screen usable and say what happened
            self.code = 1
            self._say(Text(f"the watch failed: {type(exc).__name__}: {clean(exc, 300)}", style="bold red"))
        self._draw()

    # -- events in ---------------------------------------------------------------------------------------

    def on_watch_event(self, message: WatchEvent) -> None:
        event = message.event
        if isinstance(event, Sampled):
            self.last_sample = event
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(getattr(event, "at", time.time())))
            style = "bold #ff5f87" if type(event).__name__ in ("Stalled", "SlowDetected", "CaptureFailed") else \
                "bold #5fd75f" if type(event).__name__ in ("Resumed", "Recovered", "NodeBack") else ""
            for i, line in enumerate(event.text().split("\n")):
                self._say(Text(clean(f"{stamp if i == 0 else '        '} {line}", 2000), style=style))
        self._draw()

    def _say(self, text: Text) -> None:
        self.said.append(text.plain)
        self.query_one("#log", RichLog).write(text, width=max(40, self.size.width - 4))

    # -- drawing -----------------------------------------------------------------------------------------

    def _draw(self) -> None:
        watcher = self.watcher
        if watcher is None:
            return
        jobs = watcher.tracker.jobs
        top = Text(end="")
        top.append("hangscope watch", style="bold")
        if self.title_text:
            top.append("  ")
            top.append_text(literal(self.title_text, 40))
        top.append(f"  every {watcher.options.every:g} s  {counted(len(jobs), 'job')}  "
                   f"{counted(len(watcher.captures), 'capture')}  {counted(watcher.samples, 'sample')}")
        if self.last_sample is not None and self.last_sample.cost:
            worst = max(share for _, share in self.last_sample.cost)
            top.append(f"  watch CPU ≤ {worst:.2%} of a core per node", style="dim")
        down = watcher.tracker.down
        if down:
            top.append(f"  {counted(len(down), 'node')} down", style="bold #ffaf00")
        if self.code is not None:
            top.append(f"  ended (exit {self.code})", style="bold")
        self.query_one("#topbar", Static).update(top)
        self._draw_jobs(jobs)
        self._draw_nodes(jobs)
        self._draw_captures()

    def _draw_jobs(self, jobs: Any) -> None:
        table = self.query_one("#jobs", DataTable)
        keep = table.cursor_row
        table.clear()
        for key, j in jobs.items():
            status = j.status
            colour = {"stalled": "bold #ff5f87", "slow": "bold #ffaf00", "progressing": "#5fd75f",
                      "ended": "dim"}.get(status, "")
            table.add_row(literal(key or "unidentified", 48), Text(status, style=colour), str(j.ranks),
                          rate_text(j.rate, j.unit), sparkline([v for _, v in j.rates], SPARK_WIDTH),
                          duration(j.stalled_for) if status in ("idle", "stalled") else "", key=key)
        if table.row_count:
            table.move_cursor(row=min(max(keep, 0), table.row_count - 1))

    def _selected_job(self, jobs: Any) -> Any:
        table = self.query_one("#jobs", DataTable)
        if not table.row_count:
            return None
        keys = list(jobs)
        row = table.cursor_row
        return jobs.get(keys[row]) if 0 <= row < len(keys) else None

    def _draw_nodes(self, jobs: Any) -> None:
        table = self.query_one("#nodes", DataTable)
        table.clear()
        job = self._selected_job(jobs)
        if job is None:
            return
        costs = self.watcher.costs
        ordered = sorted(job.node_rates.items(), key=lambda kv: -(kv[1][-1][1] if kv[1] else 0.0))
        for node, points in ordered[:NODE_ROWS]:
            cost = costs.get(node)
            table.add_row(literal(node, 40), sparkline([v for _, v in points], SPARK_WIDTH),
                          rate_text(points[-1][1] if points else None, job.unit),
                          f"{cost[-1][1]:.2%}" if cost else "", key=node)

    def _draw_captures(self) -> None:
        table = self.query_one("#captures", DataTable)
        keep = table.cursor_row
        table.clear()
        for i, c in enumerate(self.watcher.captures):
            table.add_row(time.strftime("%H:%M:%S", time.localtime(c.at)), c.kind, literal(c.job, 40),
                          literal(c.headline, 300), key=str(i))
        if table.row_count:
            table.move_cursor(row=min(max(keep, 0), table.row_count - 1))

    def on_data_table_row_highlighted(self, message: DataTable.RowHighlighted) -> None:
        if message.data_table.id == "jobs" and self.watcher is not None:
            self._draw_nodes(self.watcher.tracker.jobs)

    # -- actions -----------------------------------------------------------------------------------------

    def action_focus_captures(self) -> None:
        self.query_one("#captures", DataTable).focus()

    def action_focus_jobs(self) -> None:
        self.query_one("#jobs", DataTable).focus()

    def on_data_table_row_selected(self, message: DataTable.RowSelected) -> None:
        if message.data_table.id == "captures":
            self.action_open_capture()

    def action_open_capture(self) -> None:
        table = self.query_one("#captures", DataTable)
        captures = list(self.watcher.captures) if self.watcher is not None else []
        if not captures:
            self.notify("no capture yet", severity="warning")
            return
        row = table.cursor_row if 0 <= table.cursor_row < len(captures) else len(captures) - 1
        chosen: Captured = captures[row]
        self.run_worker(self._open(chosen.path), group="open", exclusive=True, exit_on_error=False)

    async def _open(self, bundle: str) -> None:
        snapshot = f"{bundle}/snapshot.json"
        self.opened.append(snapshot)
        if self.opener is not None:
            await self.opener(snapshot)
            return
        # as `hangscope --load SNAPSHOT` runs: this app steps aside (its repaints held) while the watch samples on;
        # the other program has the terminal, so what it said is gone when this one comes back: a failure is said
        # here, with the command that shows why
        again = f"`hangscope --load {snapshot}`"
        try:
            with self.suspend(), self.batch_update():
                proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "app", "--load", snapshot)
                code = await proc.wait()
        except SuspendNotSupported:
            self._cannot_open(f"this terminal cannot be handed to another program; open it with {again}")
            return
        except OSError as exc:
            self._cannot_open(f"{clean(exc, 200)}; open it with {again}")
            return
        if code != 0:
            self._cannot_open(f"the viewer exited with status {code}; {again} says why")

    def _cannot_open(self, why: str) -> None:
        self._say(Text(clean(f"could not open the capture: {why}", 2000), style="bold #ffaf00"))
        self.notify(clean(f"could not open the capture: {why}", 400), severity="warning", timeout=10)

    async def action_quit_watch(self) -> None:
        """Quit: a capture in flight is cancelled (what arrived is dropped), the hooks killed, the workers closed."""
        watcher = self.watcher
        if watcher is not None:
            watcher.cancel_hooks()
            watcher.stop()
            self.workers.cancel_group(self, "watch")
            try:
                await asyncio.wait_for(watcher.session.close(), CLOSE_TIMEOUT)
            except (asyncio.TimeoutError, Exception):
                pass
            watcher.out.close()
        self.exit(self.code if self.code is not None else 0)


def run_watch_tui(make_watcher: Callable[[Callable[[Event], None]], Any], *, fps: Optional[int] = None,
                  title: str = "") -> int:
    from app.ui.run import configure

    configure(fps, animations=fps is None or fps >= 30)
    app = WatchApp(make_watcher, title=title)
    code = app.run()
    return int(code) if code is not None else (app.code if app.code is not None else 1)
