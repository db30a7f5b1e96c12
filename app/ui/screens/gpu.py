"""GPU tests from the TUI: choose the test and the nodes, confirm, watch the progress, read the results.

GpuTests (one per app, behind the `G` key and the palette) runs app.gpu's GpuTestRunner in a Textual worker
on workers of its own (app.gpu.connect), so a test never disturbs the investigation's collection, and closing
those workers (cancel, the test's end, or quitting) kills every process of the test on the nodes.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, ClassVar, List, Optional, Sequence, Set

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Label, SelectionList, Static
from textual.widgets.selection_list import Selection

from app.errors import HangscopeError
from app.gpu.inventory import GpusBusyError
from app.gpu.model import GpuTestResults, TestKind
from app.model import RankKey
from app.ui.gpu_plan import KINDS, Plan, Progress, default_nodes, plan_text
from app.ui.safe import clean, literal
from app.ui.screens.dialogs import ConfirmScreen
from app.ui.screens.gpu_results import GpuResultsScreen
from app.ui.source import NEEDS_LIVE_NODES, GpuAccess
from app.ui.view import View

if TYPE_CHECKING:
    from app.gpu.connect import GpuWorkers
    from app.gpu.runner import GpuTestRunner
    from app.ui.core import HangscopeCore

CLOSE_TIMEOUT = 30.0  # closing the test's workers: each kills what it still runs, then exits
HEADLESS = """\
From a shell on this login node, with the same hosts file:

  hangscope hosts.txt --test sanity    all_reduce and barrier on every GPU of every node
  hangscope hosts.txt --test pairs     find the bad node or link: all_reduce on node pairs
  hangscope hosts.txt --test bench     all_reduce bandwidth sweep
  hangscope hosts.txt --test net       network interfaces and port reachability between nodes"""


class GpuUnavailableScreen(ModalScreen[None]):
    """Shown instead of the test setup when the source has no live nodes (a loaded file, a recording)."""

    BINDINGS = [Binding("escape,q", "dismiss", "close")]
    DEFAULT_CSS = "GpuUnavailableScreen { align: center middle; }"

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):
            yield Label(Text("GPU tests", style="bold"), id="dialog-title")
            yield Static(Text(NEEDS_LIVE_NODES + "\n\n" + HEADLESS), id="gpu-text")


class GpuSetupScreen(ModalScreen[Optional[Plan]]):
    """Pick the test (s/b/p/n) and the nodes (space toggles); the plan below says what runs where. Enter runs."""

    BINDINGS: ClassVar[List[BindingType]] = [
        Binding("escape", "dismiss(None)", "cancel"), Binding("enter", "run", "run", priority=True),
        *(Binding(key, f"kind('{kind}')", kind, priority=True) for kind, key, _ in KINDS)]
    DEFAULT_CSS = """
    GpuSetupScreen { align: center middle; }
    GpuSetupScreen #gpu-nodes { height: auto; max-height: 12; border: round $primary-darken-2; }
    GpuSetupScreen #gpu-plan { background: $panel; padding: 0 1; margin: 1 0 0 0; }
    """

    def __init__(self, nodes: Sequence[str], defaults: Callable[[TestKind], List[str]], notes: dict,
                 kind: TestKind = "sanity") -> None:
        super().__init__()
        self.nodes = list(nodes)
        self.defaults = defaults
        self.notes = notes  # node -> "suspect", "marked", ...: why it is (or is not) chosen
        self.kind: TestKind = kind

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):  # scrolls in a small terminal: Enter runs even with the buttons hidden
            yield Label(Text("Run a GPU test", style="bold"), id="dialog-title")
            yield Static(self._kinds_text(), id="gpu-kinds")
            chosen = set(self.defaults(self.kind))
            nodes = SelectionList[str](*(Selection(self._label(n), n, n in chosen) for n in self.nodes), id="gpu-nodes")
            nodes.border_title = "nodes (space toggles)"
            yield nodes
            yield Static(id="gpu-plan")
            with Horizontal(id="dialog-buttons"):
                yield Button("Run (enter)", variant="warning", id="run")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self._update_plan()
        self.query_one(SelectionList).focus()

    def _label(self, node: str) -> Text:
        out = literal(node, 60)
        note = self.notes.get(node)
        if note:
            out.append(f"  {note}", style="dim")
        return out

    def _kinds_text(self) -> Text:
        out = Text(end="")
        for kind, key, _ in KINDS:
            style = "bold reverse" if kind == self.kind else ""
            out.append(f" [{key}] {kind} ", style=style)
            out.append(" ")
        return out

    @property
    def chosen(self) -> List[str]:
        picked = set(self.query_one(SelectionList).selected)
        return [n for n in self.nodes if n in picked]

    def _update_plan(self) -> None:
        self.query_one("#gpu-plan", Static).update(plan_text(Plan(self.kind, tuple(self.chosen))))

    def action_kind(self, kind: TestKind) -> None:
        self.kind = kind
        self.query_one("#gpu-kinds", Static).update(self._kinds_text())
        nodes = self.query_one(SelectionList)
        wanted = set(self.defaults(kind))
        nodes.deselect_all()
        for n in self.nodes:
            if n in wanted:
                nodes.select(n)
        self._update_plan()

    def on_selection_list_selected_changed(self) -> None:
        self._update_plan()

    def action_run(self) -> None:
        if not self.chosen:
            self.notify("choose at least one node (space)", severity="warning")
            return
        self.dismiss(Plan(self.kind, tuple(self.chosen)))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "run":
            self.action_run()
        else:
            self.dismiss(None)


class GpuProgressScreen(Screen[None]):
    """The running test: each run's ranks and their phase, the rounds of pairs. c cancels; Esc leaves it
    running in the background (G comes back here)."""

    BINDINGS = [Binding("escape", "back", "back (the test goes on)"), Binding("c", "cancel_test", "cancel the test")]
    DEFAULT_CSS = """
    GpuProgressScreen #gpu-progress-title { height: 1; background: $boost; padding: 0 1; text-style: bold; }
    GpuProgressScreen #gpu-progress-body { height: 1fr; padding: 0 1; }
    """

    def __init__(self, tests: "GpuTests") -> None:
        super().__init__()
        self.tests = tests

    def compose(self) -> ComposeResult:
        yield Static(Text("GPU test running", end=""), id="gpu-progress-title")
        with VerticalScroll(id="gpu-progress-body"):
            yield Static(id="gpu-progress")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(1.0, self.redraw)  # the elapsed time moves even when no event arrives

    def redraw(self) -> None:
        if self.tests.progress is not None:
            self.query_one("#gpu-progress", Static).update(self.tests.progress.text())

    def action_cancel_test(self) -> None:
        self.tests.cancel()

    def action_back(self) -> None:
        self.app.pop_screen()
        if self.tests.running:
            self.app.notify("the GPU test goes on: G shows its progress, its results come when it ends", timeout=5)


class GpuTests:
    """The app's GPU tests: at most one running, the last results kept for the palette. Data down: open() is
    given what it plans from (the access, the view, the marks); results up: `on_results` gets each test's."""

    def __init__(self, app: "HangscopeCore", on_results: Callable[[GpuTestResults], None]) -> None:
        self.app = app
        self.on_results = on_results
        self.progress: Optional[Progress] = None
        self.results: Optional[GpuTestResults] = None
        self.runner: Optional["GpuTestRunner"] = None
        self.running = False
        self._workers: Optional["GpuWorkers"] = None  # the running test's workers, for close()

    # -- opening ---------------------------------------------------------------------------------------

    def open(self, access: Optional[GpuAccess], view: Optional[View], marked: Set[RankKey]) -> None:
        """G: the setup of a new test on the nodes `access` reaches (None: GPU tests are not available here),
        with the view's suspects and the marked ranks as the default choice; the running test's progress while
        one runs."""
        if self.running:
            self.show_progress()
            return
        if access is None:
            self.app.push_screen(GpuUnavailableScreen())
            return
        names = [h.name for h in access.hosts] if access.hosts is not None else [socket.gethostname()]
        notes = {}
        if view is not None:
            job = {r.node for r in view.snapshot.ranks}
            for n in names:
                if n not in job:
                    notes[n] = "no ranks of the job"
            for node, _ in view.suspects:
                notes[node] = "suspect"
        for node, _ in marked:
            notes[node] = (notes.get(node, "") + " marked").strip()
        kind: TestKind = "pairs" if view is not None and view.suspects and not marked and len(names) > 1 else "sanity"
        screen = GpuSetupScreen(names, lambda k: default_nodes(k, names, view, marked), notes, kind)
        self.app.push_screen(screen, lambda plan: self.start(plan, access) if plan is not None else None)

    def show_progress(self) -> None:
        if not isinstance(self.app.screen, GpuProgressScreen):
            self.app.push_screen(GpuProgressScreen(self))

    def show_results(self) -> None:
        """The palette's "GPU test results": the last results (or the progress while a test runs)."""
        if self.running:
            self.show_progress()
        elif self.results is None:
            self.app.notify("no GPU test has run yet: G runs one", severity="warning")
        else:
            self.app.push_screen(GpuResultsScreen(self.results))

    # -- running ---------------------------------------------------------------------------------------

    def start(self, plan: Plan, access: GpuAccess) -> None:
        self.running = True
        self.progress = Progress(plan)
        self.show_progress()
        self.app.run_worker(self._run(plan, access), group="gpu-tests", exclusive=True, exit_on_error=False)

    def cancel(self) -> None:
        """Stop the test: its runs end, then closing the test's workers kills every process of it."""
        if not self.running or self.progress is None:
            return
        self.progress.cancelled = True
        if self.runner is not None:
            self.runner.cancel()
        else:
            self.app.workers.cancel_group(self.app, "gpu-tests")  # still connecting: nothing started yet
        self._redraw()

    async def _run(self, plan: Plan, access: GpuAccess) -> None:
        from app.gpu.connect import GpuWorkers
        from app.gpu.runner import GpuTestRunner

        progress = self.progress
        assert progress is not None
        hosts = None if access.hosts is None else [h for h in access.hosts if h.name in plan.nodes]
        workers = self._workers = GpuWorkers(hosts, access.session_options)
        try:
            await workers.open()
            progress.stage = "checking the nodes (GPUs and who holds them, the job's python)"
            self._redraw()
            options = access.options
            while not progress.cancelled:
                self.runner = GpuTestRunner(workers.conns, options, node_errors=workers.errors)
                try:
                    async for event in self.runner.events(plan.kind):
                        progress.apply(event)
                        self._redraw()
                    break
                except GpusBusyError as exc:
                    if options.allow_busy_gpus or not await self._confirm_busy(exc):
                        progress.stage = "not started: the GPUs are still held"
                        break
                    options = replace(options, allow_busy_gpus=True)
        except HangscopeError as exc:
            progress.stage = f"failed: {exc.title}"
            self.app.show_error(exc, timeout=20)
        except asyncio.CancelledError:
            progress.stage = "cancelled before it started"
            raise
        finally:
            self.runner = None
            await workers.close(CLOSE_TIMEOUT)
            self._workers = None
            self.running = False
            if self.app.is_running:  # not when the app is quitting: nothing is left to show it on
                self._finished(progress)

    async def close(self) -> None:
        """The app is quitting: stop the test and wait until its workers are closed (which kills every process
        of it on the nodes): Textual only cancels the worker running it, and would not wait for that."""
        if self.runner is not None:
            self.runner.cancel()
        if self._workers is not None:
            await self._workers.close(CLOSE_TIMEOUT)

    async def _confirm_busy(self, exc: GpusBusyError) -> bool:
        lines = [f"{clean(node, 60)}: pid {h.pid} {clean(h.process, 80)} holds {clean(h.uuid, 60)} "
                 f"({h.used_mib if h.used_mib is not None else '?'} MiB)" for node, h in exc.busy]
        confirm = ConfirmScreen(f"{len(exc.busy)} GPU(s) are still held",
                                "These processes (the hung job, most likely) still hold GPUs the test would use. "
                                "Testing next to them may be slow or fail for that reason; stopping the job "
                                "first gives clean results. Run anyway?", lines)
        answer: Optional[bool] = await self.app.push_screen_wait(confirm)
        return bool(answer)

    def _redraw(self) -> None:
        screen = self.app.screen
        if isinstance(screen, GpuProgressScreen):
            screen.redraw()

    def _finished(self, progress: Progress) -> None:
        results = progress.results
        if results is None:
            self._redraw()
            if isinstance(self.app.screen, GpuProgressScreen):
                self.app.pop_screen()
            self.app.notify(f"GPU test {progress.plan.kind}: {progress.stage}", severity="warning", markup=False)
            return
        self.results = results
        self.on_results(results)
        if isinstance(self.app.screen, GpuProgressScreen):
            self.app.switch_screen(GpuResultsScreen(results))
        else:
            word = "interrupted" if results.interrupted else ("passed" if results.ok else "found a problem")
            self.app.notify(f"{clean(results.verdict, 300)}\n(Ctrl+P, GPU test results)",
                            title=f"GPU test {results.kind} {word}", markup=False, timeout=20)

