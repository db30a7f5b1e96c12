"""RankGrid: every rank one cell (nodes are rows, local ranks columns), drawn with the Line API.

One ScrollView renders only the visible lines (`render_line` -> Strip); a cursor move refreshes the two rows
it touches, so 4,096 ranks cost what 40 do (see bench/tui_grid.py). The header and node names stay put when
the cells scroll. Colour tells classes apart at a glance and a glyph per class does the same without colour.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Offset, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from app.ui.grid_model import Cell, GridModel, RankKey, class_color, column_labels
from app.ui.safe import clean

CELL_W = 3  # " ● ", "[▲]" for a suspect, "*●*" when marked
LABEL_MAX = 18


class RankGrid(ScrollView, can_focus=True):
    """The grid. Posts Highlighted when the cursor or the mouse moves onto a cell, Selected on Enter/click."""

    BINDINGS = [
        Binding("up", "move(0, -1)", "up", show=False),
        Binding("down", "move(0, 1)", "down", show=False),
        Binding("left", "move(-1, 0)", "left", show=False),
        Binding("right", "move(1, 0)", "right", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("home", "edge(-1)", show=False),
        Binding("end", "edge(1)", show=False),
        Binding("enter", "select", "drill in"),
    ]
    COMPONENT_CLASSES = {"rank-grid--header", "rank-grid--label", "rank-grid--cursor", "rank-grid--note"}

    class Highlighted(Message):
        """The cursor or the mouse is on `cell` (None when it left the cells)."""

        def __init__(self, grid: RankGrid, cell: Optional[Cell]) -> None:
            super().__init__()
            self.grid = grid
            self.cell = cell

        def can_replace(self, message: Message) -> bool:
            # Mouse moves and held-down arrows arrive in bursts: only the latest position matters.
            return isinstance(message, RankGrid.Highlighted) and message.grid is self.grid

    class Selected(Message):
        """Enter (or a click on the cursor's cell) on a rank: drill into it."""

        def __init__(self, grid: RankGrid, cell: Cell) -> None:
            super().__init__()
            self.grid = grid
            self.cell = cell

    def __init__(self, *, name: Optional[str] = None, id: Optional[str] = None,
                 classes: Optional[str] = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.model = GridModel()
        self.cursor: Tuple[int, int] = (0, 0)
        self.marked: FrozenSet[RankKey] = frozenset()
        self.focus_class: Optional[int] = None  # the class selected in the classes panel
        self.user_moved = False  # until the user moves, each new snapshot puts the cursor on its suspect
        self._labels: Sequence[str] = ()
        self._label_w = 6
        self._row_cache: Dict[int, Strip] = {}
        self._styles: Dict[tuple, Style] = {}  # cell style by (kind, class, suspect, cursor), per model

    # -- data in ---------------------------------------------------------------------------------------

    def set_model(self, model: GridModel, *, keep: Optional[RankKey] = None) -> None:
        """Show a new layout; the cursor stays on rank `keep` when it is still there."""
        self.model = model
        self._labels = column_labels(model)
        names = [len(clean(r.name, LABEL_MAX)) for r in model.rows]
        self._label_w = max([4] + names) + 1
        self._row_cache.clear()
        pos = model.position(keep) if keep is not None else None
        row, col = pos if pos is not None else self.cursor
        row = min(row, max(len(model.rows) - 1, 0))
        col = min(col, max(self._row_len(row) - 1, 0))
        self.cursor = (row, col)
        width = self._label_w + model.columns * CELL_W + self._note_width()
        self.virtual_size = Size(width, len(model.rows) + 1)
        self.refresh()
        # After the layout pass: the widget may not have its size yet when the first model arrives.
        self.call_after_refresh(self._scroll_cursor_into_view)
        self._announce()

    def set_marked(self, marked: Set[RankKey]) -> None:
        self.marked = frozenset(marked)
        self._row_cache.clear()
        self.refresh()

    def set_focus_class(self, klass: Optional[int]) -> None:
        self.focus_class = klass
        self._restyle()

    @property
    def current(self) -> Optional[Cell]:
        return self.model.cell(*self.cursor)

    def move_to(self, key: RankKey) -> bool:
        pos = self.model.position(key)
        if pos is None:
            return False
        self.user_moved = True
        self._set_cursor(*pos)
        return True

    # -- cursor --------------------------------------------------------------------------------------

    def _row_len(self, row: int) -> int:
        return len(self.model.rows[row].cells) if 0 <= row < len(self.model.rows) else 0

    def _set_cursor(self, row: int, col: int) -> None:
        if not self.model.rows:
            return
        row = max(0, min(row, len(self.model.rows) - 1))
        col = max(0, min(col, self._row_len(row) - 1))
        old = self.cursor
        if (row, col) == old:
            return
        self.cursor = (row, col)
        self._row_cache.pop(old[0], None)
        self._row_cache.pop(row, None)
        self.refresh_line(old[0] + 1)
        self.refresh_line(row + 1)
        self._scroll_cursor_into_view()
        self._announce()

    def _scroll_cursor_into_view(self) -> None:
        """Scroll the least needed to show the cursor below the header and right of the node names,
        horizontally by whole cells so that no cell is drawn cut in half."""
        row, col = self.cursor
        width, height = self.scrollable_content_region.size
        if width <= 0 or height <= 0:
            return
        sx, sy = round(self.scroll_offset.x), round(self.scroll_offset.y)
        body = max(width - self._label_w, CELL_W)
        left = col * CELL_W
        if left < sx:
            sx = left
        elif left + CELL_W > sx + body:
            sx = -(-(left + CELL_W - body) // CELL_W) * CELL_W
        rows = max(height - 1, 1)  # the header takes the first line
        if row < sy:
            sy = row
        elif row >= sy + rows:
            sy = row - rows + 1
        if (sx, sy) != (round(self.scroll_offset.x), round(self.scroll_offset.y)):
            self.scroll_to(sx, sy, animate=False, immediate=True, force=True)

    def _announce(self) -> None:
        self.post_message(self.Highlighted(self, self.current))

    def action_move(self, dx: int, dy: int) -> None:
        self.user_moved = True
        row, col = self.cursor
        self._set_cursor(row + dy, col + dx)

    def action_page(self, direction: int) -> None:
        self.user_moved = True
        row, col = self.cursor
        self._set_cursor(row + direction * max(self.size.height - 2, 1), col)

    def action_edge(self, direction: int) -> None:
        self.user_moved = True
        row, _ = self.cursor
        self._set_cursor(row, 0 if direction < 0 else self._row_len(row) - 1)

    def action_select(self) -> None:
        cell = self.current
        if cell is not None and cell.rank is not None:
            self.post_message(self.Selected(self, cell))

    # -- mouse ---------------------------------------------------------------------------------------

    def _cell_at(self, offset: Optional[Offset]) -> Optional[Tuple[int, int]]:
        """The (row, column) under a point of the content region (the border and scrollbars excluded)."""
        if offset is None:
            return None
        x, y = offset
        if y < 1 or x < self._label_w:
            return None
        row = y - 1 + round(self.scroll_offset.y)
        col = (x - self._label_w + round(self.scroll_offset.x)) // CELL_W
        if self.model.cell(row, col) is None:
            return None
        return row, col

    def on_mouse_move(self, event: events.MouseMove) -> None:
        pos = self._cell_at(event.get_content_offset(self))
        self.post_message(self.Highlighted(self, self.model.cell(*pos) if pos else self.current))

    def on_leave(self, event: events.Leave) -> None:
        self._announce()

    def on_click(self, event: events.Click) -> None:
        pos = self._cell_at(event.get_content_offset(self))
        if pos is None:
            return
        if pos == self.cursor or event.chain > 1:
            self.action_select()
        else:
            self.user_moved = True
            self._set_cursor(*pos)

    # -- drawing -------------------------------------------------------------------------------------

    def _note_width(self) -> int:
        return max([0] + [len(self._note(r)) + 2 for r in range(len(self.model.rows))])

    def _note(self, row: int) -> str:
        node = self.model.rows[row].node
        if node.state in ("failed", "partial") and node.error is not None:
            # The code only: the nodes panel has the full reason and the remedy.
            return f"✗ {node.state}: {node.error.code.replace('_', ' ')}"
        if node.state in ("pending", "connecting", "discovering", "collecting"):
            return node.state + "…"
        return ""

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y == 0:
            return self._header(width, base)
        row = y - 1 + round(self.scroll_offset.y)
        if row >= len(self.model.rows):
            return Strip.blank(width, base)
        strip = self._row_cache.get(row)
        if strip is None:
            strip = self._render_row(row, base)
            if row != self.cursor[0]:
                self._row_cache[row] = strip
        label = self._label(self.model.rows[row].name, base)
        x = round(self.scroll_offset.x)
        body = strip.crop(x, x + max(width - self._label_w, 0))
        return Strip.join([label, body]).adjust_cell_length(width, base)

    def _label(self, name: str, base: Style) -> Strip:
        style = base + self.get_component_rich_style("rank-grid--label")
        text = clean(name, LABEL_MAX).ljust(self._label_w)
        return Strip([Segment(text, style)], self._label_w)

    def _header(self, width: int, base: Style) -> Strip:
        style = base + self.get_component_rich_style("rank-grid--header")
        cells = "".join(label[-CELL_W:].rjust(CELL_W) for label in self._labels)
        x = round(self.scroll_offset.x)
        body = cells[x: x + max(width - self._label_w, 0)]
        return Strip([Segment("node".ljust(self._label_w) + body, style)]).adjust_cell_length(width, base)

    def _render_row(self, row: int, base: Style) -> Strip:
        cursor_col = self.cursor[1] if row == self.cursor[0] else -1
        marked = self.marked
        styles = self._styles
        segments: List[Segment] = []
        run_text: List[str] = []
        run_style: Optional[Style] = None
        for col, cell in enumerate(self.model.rows[row].cells):
            at_cursor = col == cursor_col
            key = (cell.kind, cell.klass, cell.suspect, at_cursor)
            style = styles.get(key)
            if style is None:
                style = styles[key] = self._compose_style(cell, at_cursor, base)
            text = self._cell_text(cell, cell.rank is not None and (cell.rank.node, cell.rank.pid) in marked)
            # Neighbouring cells of one class share a style: one segment for the run keeps a row of 64
            # cells to a handful of segments.
            if style is run_style:
                run_text.append(text)
            else:
                if run_text:
                    segments.append(Segment("".join(run_text), run_style))
                run_text, run_style = [text], style
        if run_text:
            segments.append(Segment("".join(run_text), run_style))
        note = self._note(row)
        if note:
            segments.append(Segment("  " + note, base + self.get_component_rich_style("rank-grid--note")))
        return Strip(segments)

    def _compose_style(self, cell: Cell, at_cursor: bool, base: Style) -> Style:
        style = base + self._cell_style(cell)
        if at_cursor:
            style += self.get_component_rich_style("rank-grid--cursor") if self.has_focus else Style(underline=True)
        return style

    @staticmethod
    def _cell_text(cell: Cell, marked: bool) -> str:
        left = "*" if marked else ("[" if cell.suspect else " ")
        right = "*" if marked else ("]" if cell.suspect else " ")
        return left + cell.symbol + right

    def _cell_style(self, cell: Cell) -> Style:
        if cell.kind == "class":
            style = Style(color=class_color(cell.klass), bold=cell.suspect)
            if self.focus_class is not None:
                style += Style(bold=True) if cell.klass == self.focus_class else Style(dim=True)
            return style
        if cell.kind in ("error", "failed"):
            return Style(color="#ff5f5f", bold=True)
        return Style(dim=True)

    def _restyle(self) -> None:
        """Styles depend on the theme, focus and class highlight: drop every cached row and style."""
        self._row_cache.clear()
        self._styles.clear()
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._row_cache.clear()

    def on_focus(self) -> None:
        self._restyle()

    def on_blur(self) -> None:
        self._restyle()
