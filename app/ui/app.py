"""HangscopeApp: the Textual application the CLI runs (through app.ui.run_tui) on an injected SessionSource.

The state and drawing live in core.py, the collection actions in collect.py, moving around in navigate.py;
this module puts them together with the app-wide keys, the stylesheet and the command palette.
"""

from __future__ import annotations

from typing import Optional

from textual.app import App
from textual.binding import Binding

from app.ui.collect import CollectMixin
from app.ui.commands import HangscopeCommands
from app.ui.navigate import NavigateMixin
from app.ui.screens.main import MainScreen
from app.ui.source import SessionSource


class HangscopeApp(CollectMixin, NavigateMixin):
    """The TUI. `source` supplies snapshots; `interval` (seconds) starts watch mode when given; `start`
    False waits for the user's first refresh instead of collecting at once."""

    CSS_PATH = "hangscope.tcss"
    TITLE = "hangscope"
    COMMANDS = App.COMMANDS | {HangscopeCommands}
    BINDINGS = [
        Binding("ctrl+c", "interrupt", "cancel", show=False, priority=True),
        Binding("q", "quit_app", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("e", "export", "export", show=False),
        Binding("G", "gpu_tests", "GPU tests", show=False),
    ]

    def __init__(self, source: SessionSource, *, interval: Optional[float] = None, title: str = "",
                 start: bool = True) -> None:
        super().__init__(source, interval=interval, title=title, start=start)
        self.init_collect()

    def on_mount(self) -> None:
        self.source.subscribe(self._on_source_event)

    # -- the main screen's messages --------------------------------------------------------------------

    def on_main_screen_ready(self, message: MainScreen.Ready) -> None:
        self.main_ready()

    def on_main_screen_resumed(self, message: MainScreen.Resumed) -> None:
        self.check_size()  # the terminal may have shrunk while another screen was on top

    def on_main_screen_rank_chosen(self, message: MainScreen.RankChosen) -> None:
        self.open_drill(message.rank)

    def on_main_screen_filter_submitted(self, message: MainScreen.FilterSubmitted) -> None:
        self.set_filter(message.text)

    def main_ready(self) -> None:
        """The main screen's widgets exist: show what there is and start collecting."""
        self._update_topbar()
        self.check_size()
        if self.start:
            self.start_collection("snapshot")
        if self.interval and self.source.live:
            self.set_watch(True)
