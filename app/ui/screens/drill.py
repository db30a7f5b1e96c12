"""Drill-down screen for one rank: threads, locals, source, strace, gdb, /proc and env in tabs."""

from __future__ import annotations

from typing import Callable, ClassVar, List, Optional, Sequence, Tuple

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane

from app.model import RankSnapshot
from app.ui import rank_text
from app.ui.screens.too_small import WatchesSize

TABS: List[Tuple[str, str, Callable[[RankSnapshot], Text]]] = [
    ("threads", "Threads", rank_text.threads_text),
    ("locals", "Locals", rank_text.locals_text),
    ("source", "Source", rank_text.source_text),
    ("strace", "strace", rank_text.strace_text),
    ("gdb", "gdb", rank_text.gdb_text),
    ("proc", "/proc", rank_text.proc_text),
    ("env", "Env & cmdline", rank_text.env_text),
]


class DrillScreen(WatchesSize, Screen[None]):
    """Everything about one rank. The app calls update() when a newer snapshot of the rank arrives.

    The tab bar keeps the focus: ←/→ and Tab/Shift+Tab step through the tabs, 1-7 jump to one, ↑/↓, PgUp/PgDn,
    Home/End scroll the tab shown (a click in it gives it the focus, as anywhere)."""

    BINDINGS: ClassVar[List[BindingType]] = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("question_mark", "app.help", "help"),  # early: a narrow footer drops its last keys
        # The first digit stands for all of them in the footer: `1-7 tab`.
        *(Binding(str(i + 1), f"show_tab('{tab_id}')", "tab", show=i == 0, key_display=f"1-{len(TABS)}")
          for i, (tab_id, _, _) in enumerate(TABS)),
        Binding("d", "app.diff", "diff"),
        Binding("s", "app.strace", "strace"),
        Binding("g", "app.gdb", "gdb"),
        Binding("r", "app.refresh_rank", "refresh"),
        Binding("tab,right", "step_tab(1)", "next tab", show=False),
        Binding("shift+tab,left", "step_tab(-1)", "previous tab", show=False),
        Binding("up", "scroll_tab('up')", show=False),
        Binding("down", "scroll_tab('down')", show=False),
        Binding("pageup", "scroll_tab('page_up')", show=False),
        Binding("pagedown", "scroll_tab('page_down')", show=False),
        Binding("home", "scroll_tab('home')", show=False),
        Binding("end", "scroll_tab('end')", show=False),
    ]

    def __init__(self, rank: RankSnapshot, summary: Text, locals_collected: bool = False,
                 family: Sequence[str] = ()) -> None:
        super().__init__()
        self.rank = rank
        self.summary = summary
        self.locals_collected = locals_collected  # the Locals tab says so rather than advise collecting them
        self.family = tuple(family)  # the Process tab's "place in the job": launchers above, children below
        self.locals_note = ""  # a large job: the Locals tab says it shows only some while the rest are read

    def set_locals_note(self, note: str) -> None:
        self.locals_note = note
        try:
            self.query_one("#body-locals", Static).update(self._tab_text("locals", rank_text.locals_text, self.rank))
        except NoMatches:  # not mounted yet: on_mount() shows it
            pass

    def _tab_text(self, tab_id: str, render: Callable[[RankSnapshot], Text], rank: RankSnapshot) -> Text:
        if tab_id == "locals":
            text = rank_text.locals_text(rank, self.locals_collected)
            if self.locals_note:
                text = Text.assemble(Text(self.locals_note + "\n\n", style="italic dim"), text)
            return text
        if tab_id == "proc":
            return rank_text.proc_text(rank, self.family)
        return render(rank)

    @property
    def key(self) -> Tuple[str, int]:
        return (self.rank.node, self.rank.pid)

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="drill-title")
        with TabbedContent(id="drill-tabs"):
            for tab_id, label, render in TABS:
                with TabPane(label, id=f"tab-{tab_id}"):
                    with VerticalScroll():
                        yield Static(self._tab_text(tab_id, render, self.rank), id=f"body-{tab_id}",
                                     classes="drill-body")
        yield Footer()

    def on_mount(self) -> None:
        # what changed between compose() and the widgets' mounting (a rank's locals read from its node)
        self._show()

    def _title(self) -> Text:
        title = rank_text.rank_title(self.rank)
        if self.summary:
            title.append("\n")
            title.append_text(self.summary)
        return title

    def update(self, rank: RankSnapshot, summary: Text, locals_collected: Optional[bool] = None,
               family: Optional[Sequence[str]] = None) -> None:
        self.rank = rank
        self.summary = summary
        if family is not None:
            self.family = tuple(family)
        if locals_collected is not None:
            self.locals_collected = locals_collected
        self._show()

    def _show(self) -> None:
        """Every tab from the state above; before the widgets are mounted, on_mount() does it."""
        try:
            self.query_one("#drill-title", Static).update(self._title())
            for tab_id, _, render in TABS:
                self.query_one(f"#body-{tab_id}", Static).update(self._tab_text(tab_id, render, self.rank))
        except NoMatches:
            pass

    def action_show_tab(self, tab_id: str) -> None:
        self.query_one(TabbedContent).active = f"tab-{tab_id}"

    def action_step_tab(self, step: int) -> None:
        ids = [f"tab-{tab_id}" for tab_id, _, _ in TABS]
        tabs = self.query_one(TabbedContent)
        at = ids.index(tabs.active) if tabs.active in ids else 0
        tabs.active = ids[(at + step) % len(ids)]

    def action_scroll_tab(self, how: str) -> None:
        tabs = self.query_one(TabbedContent)
        pane = tabs.get_pane(tabs.active) if tabs.active else None
        if pane is not None:
            scroll = pane.query_one(VerticalScroll)
            getattr(scroll, f"scroll_{how}")(animate=False)
