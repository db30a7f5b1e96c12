"""The overlay shown while the terminal is smaller than the layout needs: the size it needs, nothing else."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

MIN_WIDTH = 60
MIN_HEIGHT = 16


class WatchesSize:
    """For every full screen: a resize may need (or end) the too-small overlay."""

    def on_resize(self) -> None:
        self.app.check_size()  # type: ignore[attr-defined]


class TooSmallScreen(ModalScreen[None]):
    """Covers everything below it; the app pops it once the terminal is large enough again."""

    BINDINGS = [Binding("q", "app.quit_app", "quit")]

    def compose(self) -> ComposeResult:
        yield Static(id="too-small")

    def on_mount(self) -> None:
        self.refresh_text()

    def on_resize(self) -> None:
        self.app.check_size()  # type: ignore[attr-defined]

    def refresh_text(self) -> None:
        found = self.query("#too-small")
        if not found:
            return  # a Resize can arrive before the screen composed its widget; on_mount fills it in
        w, h = self.app.size
        found.first(Static).update(Text(
            f"terminal {w}x{h}: hangscope needs at least {MIN_WIDTH}x{MIN_HEIGHT}\nenlarge the window (q quits)",
            justify="center"))
