"""The main screen: the rank grid, the classes/findings/nodes panels, the status line and the filter box.

It owns its widgets and their messages; the app owns the data and hands it down through show_view/show_live.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, Static

from app.model import Snapshot
from app.ui.grid_model import Cell, RankKey, build_grid, rank_key
from app.ui.safe import literal
from app.ui.screens.too_small import WatchesSize
from app.ui.view import View, filter_keys, node_groups, progress_text, top_frame
from app.ui.widgets.panels import ClassesPanel, FindingsPanel, NodesPanel, node_summary
from app.ui.widgets.rank_grid import RankGrid

if TYPE_CHECKING:
    from app.ui.app import HangscopeApp


class MainScreen(WatchesSize, Screen[None]):
    BINDINGS = [
        Binding("slash", "filter", "filter"),
        Binding("escape", "back", "back", show=False),
        Binding("space", "app.toggle_mark", "mark"),
        Binding("d", "app.diff", "diff"),
        Binding("t", "app.tree", "tree"),
        Binding("r", "app.refresh_rank", "refresh", show=False),
        Binding("R", "app.refresh_all", "refresh all"),
        Binding("w", "app.toggle_watch", "watch", show=False),
        Binding("left_square_bracket", "app.history(-1)", "older", show=False),
        Binding("right_square_bracket", "app.history(1)", "newer", show=False),
        Binding("N", "app.collect_native", "native", show=False),
        Binding("L", "app.collect_locals", "locals", show=False),
        Binding("s", "app.strace", "strace", show=False),
        Binding("g", "app.gdb", "gdb", show=False),
        Binding("c", "focus_panel('classes')", show=False),
        Binding("f", "focus_panel('findings')", show=False),
        Binding("n", "focus_panel('nodes')", show=False),
    ]

    @property
    def hs(self) -> "HangscopeApp":
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Static(id="topbar")
        yield Static(id="verdict")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield RankGrid(id="grid")
            with Vertical(id="side"):
                yield Label("classes", classes="panel-title")
                yield ClassesPanel(id="classes")
                yield Label("findings", classes="panel-title")
                yield FindingsPanel(id="findings")
                yield Label("nodes", classes="panel-title", id="nodes-title")
                with VerticalScroll(id="nodes-scroll"):
                    yield NodesPanel(id="nodes")
        yield Static(id="status")
        yield Input(placeholder="filter: 3, 0-7, pid 4242, node02, node[01-04] or frame text; Enter applies, "
                    "Esc clears", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self.grid.focus()
        self.hs.main_ready()

    def on_screen_resume(self) -> None:
        self.hs.check_size()  # the terminal may have shrunk while another screen was on top

    @property
    def grid(self) -> RankGrid:
        return self.query_one(RankGrid)

    @property
    def classes_panel(self) -> ClassesPanel:
        return self.query_one(ClassesPanel)

    # -- data down -------------------------------------------------------------------------------------

    def show_view(self, view: View, marked: set, keep: Optional[RankKey]) -> None:
        grid = self.grid
        current = grid.current
        if grid.user_moved and current is not None and current.key is not None:
            keep = current.key  # stay where the user is; until then, follow the suspect
        visible = filter_keys(view.snapshot, self.hs.query_text)
        grid.set_model(build_grid(view.snapshot, view.class_of, view.suspects, visible), keep=keep)
        grid.set_marked(marked)
        self.classes_panel.show(view.classes)
        grid.set_focus_class(self.classes_panel.chosen)
        self.query_one(FindingsPanel).show(view.findings)
        self._show_nodes(view.nodes)
        self.query_one("#verdict", Static).update(literal(view.analysis.verdict, 400, "bold"))

    def show_live(self, snap: Snapshot, class_of: dict) -> None:
        """Ranks as they stream in, with the last snapshot's classes (new ranks show as pending)."""
        grid = self.grid
        current = grid.current
        grid.set_model(build_grid(snap, class_of, set(), filter_keys(snap, self.hs.query_text)),
                       keep=current.key if current else None)
        self._show_nodes(node_groups(snap.nodes, snap.ranks))

    def _show_nodes(self, groups) -> None:
        self.query_one(NodesPanel).show(groups)
        self.query_one("#nodes-title", Label).update(node_summary(groups))

    def set_topbar(self, text: Text) -> None:
        self.query_one("#topbar", Static).update(text, layout=False)

    # -- widgets' messages up --------------------------------------------------------------------------

    @on(RankGrid.Highlighted)
    def show_status(self, message: RankGrid.Highlighted) -> None:
        # Fixed height: no layout pass, so a cursor move repaints two grid lines and this line only.
        self.query_one("#status", Static).update(self.status_text(message.cell), layout=False)

    def status_text(self, cell: Optional[Cell]) -> Text:
        out = Text(end="")
        if cell is None or cell.rank is None:
            if cell is not None and cell.kind == "missing":
                out.append("an expected rank was not found on this node", style="dim")
            elif cell is not None and cell.kind == "failed":
                out.append("this node could not be inspected: see the nodes panel", style="dim")
            return out
        r = cell.rank
        view = self.hs.current_view
        out.append(r.label, style="bold")
        out.append("  ")
        out.append_text(literal(r.node, 40))
        out.append(f"  pid {r.pid}")
        cv = view.class_view(rank_key(r)) if view is not None else None
        if cv is not None:
            out.append(f"  {cv.symbol} class {cv.index + 1} ({cv.size} rank{'s' if cv.size != 1 else ''})",
                       style=f"bold {cv.color}")
        if cell.suspect:
            out.append("  suspect", style="bold #ff5f87")
        progress = progress_text(view.progress.get(rank_key(r))) if view is not None else ""
        if progress:
            out.append(f"  {progress}", style="italic")
        frame = top_frame(r)
        if frame is not None:
            out.append("  ")
            out.append_text(literal(frame.function, 60, "bold"))
            out.append(" ")
            out.append_text(literal(frame.location, 60, "dim"))
        elif r.error is not None:
            out.append("  ")
            out.append_text(literal(f"{r.error.code}: {r.error.message}", 120, "#ff5f5f"))
        return out

    @on(RankGrid.Selected)
    def drill_into(self, message: RankGrid.Selected) -> None:
        if message.cell.rank is not None:
            self.hs.open_drill(message.cell.rank)

    @on(ClassesPanel.ClassChosen)
    def focus_class(self, message: ClassesPanel.ClassChosen) -> None:
        grid = self.grid
        grid.set_focus_class(message.index)
        view = self.hs.current_view
        if message.index is not None and view is not None and message.index < len(view.classes):
            members = view.classes[message.index].keys
            current = grid.current
            if current is None or current.key not in members:
                placed = [grid.model.position(k) for k in members]
                first = min((p for p in placed if p is not None), default=None)
                if first is not None:
                    grid.move_to(grid.model.rows[first[0]].cells[first[1]].key)  # type: ignore[arg-type]

    @on(FindingsPanel.FindingChosen)
    def go_to_finding(self, message: FindingsPanel.FindingChosen) -> None:
        for key in message.finding.ranks:
            if self.grid.move_to(key):
                self.grid.focus()
                return
        self.notify("this finding names no rank in the grid", timeout=3)

    def action_focus_panel(self, name: str) -> None:
        target = {"classes": "#classes", "findings": "#findings", "nodes": "#nodes-scroll", "grid": "#grid"}[name]
        self.query_one(target).focus()

    # -- filter and Esc --------------------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("-shown")
        box.value = self.hs.query_text
        box.focus()

    @on(Input.Submitted, "#filter")
    def apply_filter(self, message: Input.Submitted) -> None:
        self.hs.set_filter(message.value)

    def close_filter(self) -> None:
        self.query_one("#filter", Input).remove_class("-shown")
        self.grid.focus()

    def action_back(self) -> None:
        """Esc undoes the innermost thing: the open filter box, the filter, the class highlight, panel focus."""
        if self.query_one("#filter", Input).has_class("-shown"):
            self.close_filter()
        elif self.hs.query_text:
            self.hs.set_filter("")
        elif self.classes_panel.chosen is not None:
            self.classes_panel.chosen = None
            self.grid.set_focus_class(None)
        else:
            self.grid.focus()
