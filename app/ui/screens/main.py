"""The main screen: the answer first. The verdict on top; the rank grid, as large as its ranks need, with the
classes under it; the findings, the evidence (the culprit's stack beside the majority's from where they part, the
loop values that differ) and the nodes' states take the rest. The status line and the filter box at the bottom.

It owns its widgets and their messages; the app owns the data and hands it down (show_view, show_live and the
`query_text` attribute); what the user asks for goes up as messages (Ready, Resumed, RankChosen,
FilterSubmitted). The screen never calls into the app.
"""

from __future__ import annotations

from typing import Optional

from rich.console import Group
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, Static

from app.analysis.diff import diff_vs_majority
from app.analysis.processes import LARGE_SKEW, skew_line, tree_lines
from app.model import RankSnapshot, Snapshot
from app.ui.grid_model import Cell, RankKey, build_grid, rank_key
from app.ui.safe import literal
from app.ui.screens.diff import evidence_summary, evidence_table
from app.ui.screens.too_small import WatchesSize
from app.ui.view import View, filter_keys, node_groups, progress_text, top_frame
from app.ui.widgets.panels import ClassesPanel, FindingsPanel, NodesPanel, node_summary
from app.ui.widgets.rank_grid import RankGrid

LEFT_MIN = 28  # the grid column's least width: the classes under the grid stay readable ...
LEFT_WIDE = 50  # ... up to this on a wide screen (30% of it) ...
LEFT_SHARE = 45  # ... and at most this share (%) of the screen, however many ranks: the rest is the answer's
GRID_SHARE = 60  # the grid's largest share (%) of the height

class MainScreen(WatchesSize, Screen[None]):
    BINDINGS = [
        # Help first: the footer drops its last keys on a narrow terminal, and `?` leads to all the others.
        Binding("question_mark", "app.help", "help"),
        Binding("slash", "filter", "filter"),
        Binding("escape", "back", "back", show=False),
        Binding("space", "app.toggle_mark", "mark"),
        Binding("d", "app.diff", "diff"),
        Binding("t", "app.tree", "tree"),
        Binding("W", "app.waits", "who waits"),
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

    class Ready(Message):
        """The screen's widgets exist: show what there is (and start collecting)."""

    class Resumed(Message):
        """Back on top of the screen stack: the terminal may have shrunk while another screen was."""

    class RankChosen(Message):
        """Enter on a rank: drill into it."""

        def __init__(self, rank: RankSnapshot) -> None:
            super().__init__()
            self.rank = rank

    class FilterSubmitted(Message):
        """The filter box's text, applied ("" clears the filter)."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self) -> None:
        super().__init__()
        self.view: Optional[View] = None  # the view shown (show_view)
        self.suspect: Optional[RankKey] = None  # the rank the evidence is about: the view's first suspect
        self.query_text = ""  # the filter the app applies

    def compose(self) -> ComposeResult:
        yield Static(id="topbar")
        yield Static(id="verdict")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield RankGrid(id="grid")
                yield Label("classes", classes="panel-title")
                yield ClassesPanel(id="classes")
            with Vertical(id="side"):
                yield Label("findings, most likely culprit first", classes="panel-title")
                yield FindingsPanel(id="findings")
                yield Label("evidence", classes="panel-title", id="evidence-title")
                with VerticalScroll(id="evidence-scroll"):
                    yield Static(id="evidence")
                yield Label("nodes", classes="panel-title", id="nodes-title")
                with VerticalScroll(id="nodes-scroll"):
                    yield NodesPanel(id="nodes")
        yield Static(id="status")
        yield Input(placeholder="filter: 3, 0-7, pid 4242, node02, node[01-04] or frame text; Enter applies, "
                    "Esc clears", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self.grid.focus()
        self.post_message(self.Ready())

    def on_screen_resume(self) -> None:
        self.post_message(self.Resumed())

    @property
    def grid(self) -> RankGrid:
        return self.query_one(RankGrid)

    @property
    def classes_panel(self) -> ClassesPanel:
        return self.query_one(ClassesPanel)

    # -- data down -------------------------------------------------------------------------------------

    def show_view(self, view: View, marked: set, keep: Optional[RankKey]) -> None:
        """Show an analysed snapshot; `keep` is its first suspect, where the grid's cursor goes until the user
        moves it and what the evidence is about."""
        self.view, self.suspect = view, keep
        grid = self.grid
        current = grid.current
        if grid.user_moved and current is not None and current.key is not None:
            keep = current.key  # stay where the user is; until then, follow the suspect
        visible = filter_keys(view.snapshot, self.query_text)
        grid.set_model(build_grid(view.snapshot, view.class_of, view.suspects, visible), keep=keep)
        grid.set_marked(marked)
        self.fit_grid()
        self.classes_panel.show(view.classes)
        grid.set_focus_class(self.classes_panel.chosen)
        self.query_one(FindingsPanel).show(view.findings)
        self._show_nodes(view.nodes)
        self._show_evidence(view)
        self.query_one("#verdict", Static).update(literal(view.analysis.verdict, 400, "bold"))

    def show_live(self, snap: Snapshot, class_of: dict) -> None:
        """Ranks as they stream in, with the last snapshot's classes (new ranks show as pending)."""
        grid = self.grid
        current = grid.current
        grid.set_model(build_grid(snap, class_of, set(), filter_keys(snap, self.query_text)),
                       keep=current.key if current else None)
        self.fit_grid()
        self._show_nodes(node_groups(snap.nodes, snap.ranks))

    def fit_grid(self) -> None:
        """The grid column as wide and the grid as high as the ranks need (a few ranks: a few lines), within a
        share of the screen; the findings and the evidence get the rest. A large job's grid scrolls."""
        grid = self.grid
        width, height = self.size
        if width <= 0 or height <= 0:
            return
        need_w = grid.virtual_size.width + 2  # the border
        need_h = grid.virtual_size.height + 2
        least = max(LEFT_MIN, min(LEFT_WIDE, width * 30 // 100))
        most = max(least, width * LEFT_SHARE // 100)
        w = min(max(need_w, least), most)
        if need_w > w:
            need_h += 1  # the horizontal scrollbar
        main_h = max(height - 6, 8)  # top bar, verdict, status, footer
        h = min(need_h, max(5, main_h * GRID_SHARE // 100))
        if need_h > h and w < most:
            w = min(max(need_w + 1, least), most)  # the vertical scrollbar
        left = self.query_one("#left")
        if left.styles.width is None or left.styles.width.value != w:
            left.styles.width = w
        if grid.styles.height is None or grid.styles.height.value != h:
            grid.styles.height = h

    def on_resize(self) -> None:
        super().on_resize()
        self.fit_grid()

    def _show_evidence(self, view: View) -> None:
        """The culprit against the majority, or, with no culprit, where the ranks wait."""
        title = self.query_one("#evidence-title", Label)
        body = self.query_one("#evidence", Static)
        key = self.suspect
        diff = None
        if key is not None and key in view.suspects:
            try:
                diff = diff_vs_majority(view.snapshot, view.analysis, key)
            except KeyError:
                diff = None
        if diff is None or key is None:
            title.update("evidence")
            if view.classes:
                c = view.classes[0]
                body.update(Text.assemble(("no rank stands out on its stack: ", "dim"), literal(c.label, 200), " ",
                                          literal(c.where, 200),
                                          ("\nt: the merged stack tree; d: this rank against its class", "dim"),
                                          _skew(view)))
            elif view.snapshot.processes:  # a job with launchers and no rank yet: what its processes do
                body.update(Text.assemble(("no rank yet; the job's processes:\n", "dim"),
                                          Text("\n").join(literal(line, 200)
                                                           for line in tree_lines(view.snapshot, 40))))
            else:
                body.update(Text("no stacks yet", style="dim"))
            return
        title.update(Text.assemble("evidence: ", literal(view.ranks[key].label, 40), " against the majority  ",
                                   ("d: the whole diff", "dim")))
        body.update(Group(evidence_summary(diff), evidence_table(diff), _skew(view)))

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
        view = self.view
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
            self.post_message(self.RankChosen(message.cell.rank))

    @on(ClassesPanel.ClassChosen)
    def focus_class(self, message: ClassesPanel.ClassChosen) -> None:
        grid = self.grid
        grid.set_focus_class(message.index)
        view = self.view
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
        box.value = self.query_text
        box.focus()

    @on(Input.Submitted, "#filter")
    def apply_filter(self, message: Input.Submitted) -> None:
        self.post_message(self.FilterSubmitted(message.value))

    def close_filter(self) -> None:
        self.query_one("#filter", Input).remove_class("-shown")
        self.grid.focus()

    def action_back(self) -> None:
        """Esc undoes the innermost thing: the filter (with its box, as the box's placeholder says), the class
        highlight, panel focus."""
        if self.query_one("#filter", Input).has_class("-shown"):
            if self.query_text:
                self.post_message(self.FilterSubmitted(""))  # closes the box too
            else:
                self.close_filter()
        elif self.query_text:
            self.post_message(self.FilterSubmitted(""))
        elif self.classes_panel.chosen is not None:
            self.classes_panel.chosen = None
            self.grid.set_focus_class(None)
        else:
            self.grid.focus()


def _skew(view: View) -> Text:
    """How close together in time the pass's dumps were; bold when large (issue 16.8)."""
    line = skew_line(view.snapshot)
    if not line:
        return Text(end="")
    large = (view.snapshot.dump_skew or 0.0) > LARGE_SKEW
    return Text.assemble("\n", Text(line, style="bold #ffaf00" if large else "dim"))  # our own text
