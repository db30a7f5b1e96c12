"""Small modal screens: confirm an action that stops ranks (showing the command), ask for a path, help."""

from __future__ import annotations

from typing import Optional, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from app.ui.safe import literal


class ConfirmScreen(ModalScreen[bool]):
    """Ask before running something that stops or traces ranks; shows exactly what will run where."""

    BINDINGS = [Binding("escape", "dismiss(False)", "cancel"), Binding("y", "dismiss(True)", "yes"),
                Binding("n", "dismiss(False)", "no")]

    def __init__(self, title: str, effect: str, commands: Sequence[str]) -> None:
        super().__init__()
        self.title_text = title
        self.effect = effect
        self.commands = list(commands)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(Text(self.title_text, style="bold"), id="dialog-title")
            yield Static(Text(self.effect), classes="dialog-text")
            shown = Text(end="")
            for i, cmd in enumerate(self.commands[:8]):
                if i:
                    shown.append("\n")
                shown.append_text(literal(cmd, 300))
            if len(self.commands) > 8:
                shown.append(f"\n… and {len(self.commands) - 8} more ranks", style="dim")
            yield Static(shown, id="dialog-commands")
            with Horizontal(id="dialog-buttons"):
                yield Button("Run (y)", variant="warning", id="yes")
                yield Button("Cancel (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class PathScreen(ModalScreen[Optional[str]]):
    """Ask for a file path (the export destination); Esc cancels."""

    BINDINGS = [Binding("escape", "dismiss(None)", "cancel")]

    def __init__(self, title: str, default: str, note: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.default = default
        self.note = note

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(Text(self.title_text, style="bold"), id="dialog-title")
            if self.note:
                yield Static(Text(self.note), classes="dialog-text")
            yield Input(value=self.default, id="path")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        self.dismiss(value or None)


HELP = """\
hangscope shows every rank of the job as one cell: rows are nodes, columns local ranks.
Ranks with the same stack share a colour and a symbol (a class); brackets mark a suspect: [●] is a
suspect of the ● class. The cursor starts on the first suspect.

  arrows, mouse   move over the ranks (the status line names rank, node, pid, class, top frame)
  Enter           drill into a rank, in tabs: 1 Threads  2 Locals  3 Source  4 strace  5 gdb  6 /proc
                  7 Env & cmdline; there ←/→ or Tab/Shift+Tab switch tabs, ↑/↓ PgUp/PgDn scroll
  space           mark a rank (mark two, then d diffs them)
  d               diff: the two marked ranks, or this rank against its class majority
  t               merged stack tree of all ranks (or of the selected class)
  W               who waits for whom: the culprit at the root, each wait with its evidence (Enter: go to it)
  c / f / n       focus the classes, findings or nodes panel; Enter on a class highlights it
  /               filter: rank (3, 0-7), pid 4242, node (node02, node[01-04]) or frame text; Esc clears it
  r / R           refresh this rank / all ranks        w  watch: refresh every interval
  [ / ]           step back / forward through the snapshots taken so far
  N / L           collect again with native frames / with locals
  s / g           strace / gdb the marked ranks (or this one): asks first, shows the command
  e               export a report         G  GPU tests         ctrl+p  every action by name
  Esc             back          q  quit          ctrl+c  cancel the collection (twice: abort)
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):
            yield Label(Text("hangscope: keys", style="bold"), id="dialog-title")
            yield Static(Text(HELP), id="help-text")
