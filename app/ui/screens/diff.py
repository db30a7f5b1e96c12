"""The diff screen: two ranks' stacks side by side, aligned outermost first, the first divergence marked,
lines, loop iterations and locals that differ called out. The rows come from app.analysis.diff."""

from __future__ import annotations

from typing import Optional

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.analysis.diff import StackDiff, ValueDiff
from app.model import Frame
from app.ui.safe import clean, literal
from app.ui.screens.too_small import WatchesSize

DIVERGE = "bold #ff5f87"
CHANGED = "bold #ffaf00"


def _frame(f: Optional[Frame], style: str = "") -> Text:
    if f is None:
        return Text("—", style="dim")
    out = literal(f.function, 80, style or ("#87afd7" if f.native else "bold"))
    out.append(" ")
    out.append_text(literal(f.location, 80, "dim"))
    return out


def _values(kind: str, diffs: tuple) -> Text:
    out = Text(end="")
    for i, d in enumerate(diffs):
        assert isinstance(d, ValueDiff)
        if i:
            out.append("\n")
        out.append(f"  {kind} ", style="dim")
        out.append_text(literal(d.name, 40, CHANGED))
        out.append(" = ")
        out.append_text(literal("(absent)" if d.left is None else d.left, 120))
        out.append("  ≠  ", style=CHANGED)
        out.append_text(literal("(absent)" if d.right is None else d.right, 120))
    return out


def diff_table(diff: StackDiff) -> Table:
    table = Table(expand=True, box=None, show_edge=False, pad_edge=False)
    table.add_column("", width=2, no_wrap=True)
    table.add_column(Text(clean(diff.left, 120), style="bold"), ratio=1, overflow="fold")
    table.add_column(Text(clean(diff.right, 120), style="bold"), ratio=1, overflow="fold")
    for row in diff.rows:
        if row.first_divergence:
            mark, style = Text("≠", style=DIVERGE), DIVERGE
        elif not row.same:
            mark, style = Text("·", style="dim"), ""
        elif row.line_differs or row.iteration or row.locals:
            mark, style = Text("~", style=CHANGED), ""
        else:
            mark, style = Text(" "), ""
        table.add_row(mark, _frame(row.left, style), _frame(row.right, style))
        if row.iteration:
            table.add_row(Text(""), _values("iteration", row.iteration), Text(""))
        if row.locals:
            table.add_row(Text(""), _values("local", row.locals), Text(""))
    return table


def diff_summary(diff: StackDiff) -> Text:
    out = Text(end="")
    if diff.divergence is not None:
        row = diff.rows[diff.divergence]
        out.append("first divergence ", style=DIVERGE)
        out.append(f"at depth {diff.divergence}: ")
        out.append_text(_frame(row.left))
        out.append("  vs  ")
        out.append_text(_frame(row.right))
    else:
        out.append("same path", style="bold")
    if diff.iteration_note:
        out.append("\n")
        out.append_text(literal(diff.iteration_note, 300, CHANGED))
    elif diff.identical:
        out.append("  — identical stacks, iterations and locals", style="dim")
    return out


class DiffScreen(WatchesSize, Screen[None]):
    BINDINGS = [Binding("escape", "app.pop_screen", "back")]

    def __init__(self, diff: StackDiff) -> None:
        super().__init__()
        self.diff = diff

    def compose(self) -> ComposeResult:
        title = Text.assemble(("diff  ", "bold"), literal(self.diff.left, 100), ("  vs  ", "dim"),
                              literal(self.diff.right, 100))
        yield Static(title, id="diff-title")
        yield Static(diff_summary(self.diff), id="diff-summary")
        with VerticalScroll(id="diff-body"):
            yield Static(diff_table(self.diff), id="diff-table")
        yield Footer()
