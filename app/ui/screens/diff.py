"""The diff screen: two ranks' stacks side by side, aligned outermost first, the first divergence marked,
lines, loop iterations and locals that differ called out. The rows come from app.analysis.diff."""

from __future__ import annotations

from typing import Optional, Union

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, OverflowMethod, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.analysis.diff import StackDiff
from app.model import Frame
from app.ui.safe import clean, literal
from app.ui.screens.too_small import WatchesSize

DIVERGE = "bold #ff5f87"
CHANGED = "bold #ffaf00"


def _frame(f: Optional[Frame], style: str = "") -> Text:
    """`function file.py:line` on one line: cut with an ellipsis when narrow, never broken inside a name."""
    if f is None:
        return Text("—", style="dim")
    out = literal(f.function, 80, style or ("#87afd7" if f.native else "bold"))
    out.append(" ")
    out.append_text(literal(f.location, 80, "dim"))
    out.no_wrap = True
    out.overflow = "ellipsis"
    return out


def diff_table(diff: StackDiff) -> Table:
    """Every row, outermost first; a value that differs gets a row of its own, each side in its own column,
    wrapped between words (a frame is one line, cut with an ellipsis: never broken inside a name)."""
    return _side_by_side(diff, diff.rows, wrap=True)


def _side_by_side(diff: StackDiff, rows, *, wrap: bool) -> Table:
    table = Table(expand=True, box=None, show_edge=False, pad_edge=False, padding=(0, 1))
    table.add_column("", width=1, no_wrap=True)
    overflow: OverflowMethod = "fold" if wrap else "ellipsis"
    table.add_column(Text(clean(diff.left, 120), style="bold #ff5f87", no_wrap=True, overflow="ellipsis"),
                     ratio=1, no_wrap=not wrap, overflow=overflow)
    table.add_column(Text(clean(diff.right, 120), style="bold", no_wrap=True, overflow="ellipsis"), ratio=1,
                     no_wrap=not wrap, overflow=overflow)
    for row in rows:
        if row.first_divergence:
            mark, style = Text("≠", style=DIVERGE), DIVERGE
        elif not row.same:
            mark, style = Text("·", style="dim"), ""
        elif row.line_differs or row.iteration or row.locals:
            mark, style = Text("~", style=CHANGED), ""
        else:
            mark, style = Text(" "), ""
        table.add_row(mark, _frame(row.left, style), _frame(row.right, style))
        for d in row.iteration + tuple(v for v in row.locals if v not in row.iteration):  # `step`: once
            table.add_row(Text(""), _value(d.name, d.left, wrap), _value(d.name, d.right, wrap))
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


# -- the main screen's evidence: the culprit's stack beside the majority's, from where they part --------------

EVIDENCE_ROWS = 40


def evidence_rows(diff: StackDiff) -> list:
    """The rows that show the difference: from the last frame both share down, when the paths part; else the
    frames whose loop iteration, locals or line differ, and the innermost frame for where they wait."""
    rows = list(diff.rows)
    if diff.divergence is not None:
        shown = rows[max(diff.divergence - 1, 0):]
    else:
        shown = [r for r in rows if r.iteration or r.locals or r.line_differs]
        if rows and (not shown or shown[-1] is not rows[-1]):
            shown.append(rows[-1])
    return shown[:EVIDENCE_ROWS]


def evidence_table(diff: StackDiff) -> Table:
    """The main screen's: only the rows that show the difference, one line each."""
    return _side_by_side(diff, evidence_rows(diff), wrap=False)


def _value(name: str, value: Optional[str], wrap: bool) -> Union[Text, "BetweenWords"]:
    out = Text("  ", end="", no_wrap=not wrap, overflow="ellipsis")
    out.append_text(literal(name, 40, CHANGED))
    out.append(" = ")
    out.append_text(literal("(absent)" if value is None else value, 120))
    return BetweenWords(out) if wrap else out


_BREAK_AFTER = frozenset(" .,([{/:=")


class BetweenWords:
    """Text wrapped only where a reader expects a break: after a space or a separator (`torch._C.` /
    `ProcessGroup`), never inside a name; only a name longer than the whole width is cut, and only there."""

    def __init__(self, text: Text) -> None:
        self.text = text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        pieces = self._pieces()
        return Measurement(max((cell_len(p) for p in pieces), default=1), max(cell_len(self.text.plain), 1))

    def _pieces(self) -> list:
        plain = self.text.plain
        out, start = [], 0
        for i, ch in enumerate(plain):
            if ch in _BREAK_AFTER:
                out.append(plain[start:i + 1])
                start = i + 1
        if start < len(plain):
            out.append(plain[start:])
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 1)
        cuts: list = []
        line = at = 0  # cells on the line so far; characters of the text so far
        for piece in self._pieces():
            if line and line + cell_len(piece) > width:
                cuts.append(at)
                line = 0
            while cell_len(piece) > width:  # one name wider than the column: cut it, there is no better place
                at += width
                cuts.append(at)
                piece = piece[width:]
            line += cell_len(piece)
            at += len(piece)
        lines = self.text.divide(cuts)
        for part in lines:
            part.rstrip()
            part.end = "\n"
            part.no_wrap = True
            part.overflow = "crop"
            yield part


def evidence_summary(diff: StackDiff) -> Text:
    """One line over the table: the iteration note, or where the paths part."""
    out = _evidence_line(diff)
    out.end = "\n"
    return out


def _evidence_line(diff: StackDiff) -> Text:
    if diff.iteration_note:
        return literal(diff.iteration_note, 300, CHANGED)
    if diff.divergence is not None:
        out = Text("paths part ", style=DIVERGE, end="")
        before = diff.rows[diff.divergence - 1].left if diff.divergence else None
        out.append("at the outermost frame" if before is None else "after ")
        if before is not None:
            out.append_text(_frame(before))
        return out
    if diff.identical:
        return Text("same stack, iteration and locals as the majority", style="dim")
    return Text("same path as the majority; the values below differ", style="dim")
