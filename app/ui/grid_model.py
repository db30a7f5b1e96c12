"""The rank grid's layout: one row per node, one cell per rank ordered by local rank. Pure: no Textual.

Built once per snapshot (O(ranks)); the widget then only looks cells up by (row, column), so moving the
cursor over thousands of ranks costs two line redraws and no rebuild.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Set, Tuple

from app.model import NodeStatus, RankKey, RankSnapshot, Snapshot, rank_key

CellKind = Literal["class", "pending", "error", "missing", "failed"]

# One narrow glyph per class so the grid reads without colour (NO_COLOR, monochrome terminals);
# past the glyphs, letters, then "?" for the long tail.
SYMBOLS = "●▲■◆★✚✖▼◀▶♠♣♥♦☼♪" + "abcdefghijklmnopqrstuvwxyz"
CLASS_COLORS = ("#5fd75f", "#ffaf00", "#ff5f87", "#5fafff", "#d787ff", "#00d7d7", "#d7d75f", "#ff875f",
                "#87afaf", "#afaf87")
STATE_SYMBOLS: Dict[CellKind, str] = {"pending": "·", "error": "✗", "missing": "?", "failed": "✗"}


def class_symbol(index: int) -> str:
    return SYMBOLS[index] if 0 <= index < len(SYMBOLS) else "?"


def class_color(index: int) -> str:
    return CLASS_COLORS[index % len(CLASS_COLORS)] if index >= 0 else "#808080"


MAX_EXPECTED_CELLS = 4096  # placeholder cells ("missing", "failed") drawn for a node's expected ranks

@dataclass(frozen=True)
class Cell:
    kind: CellKind
    rank: Optional[RankSnapshot] = None  # None for a missing slot or a failed node's stand-in cell
    klass: int = -1  # class index (largest class 0) when kind == "class"
    suspect: bool = False

    @property
    def key(self) -> Optional[RankKey]:
        return rank_key(self.rank) if self.rank is not None else None

    @property
    def symbol(self) -> str:
        return class_symbol(self.klass) if self.kind == "class" else STATE_SYMBOLS[self.kind]


@dataclass(frozen=True)
class Row:
    node: NodeStatus
    cells: Tuple[Cell, ...]

    @property
    def name(self) -> str:
        return self.node.name


@dataclass
class GridModel:
    """Rows of cells plus the reverse index from a rank to its (row, column)."""

    rows: List[Row] = field(default_factory=list)
    columns: int = 0
    index: Dict[RankKey, Tuple[int, int]] = field(default_factory=dict)

    def cell(self, row: int, col: int) -> Optional[Cell]:
        if 0 <= row < len(self.rows):
            cells = self.rows[row].cells
            if 0 <= col < len(cells):
                return cells[col]
        return None

    def position(self, key: RankKey) -> Optional[Tuple[int, int]]:
        return self.index.get(key)

    def ranks(self) -> Iterable[RankSnapshot]:
        for row in self.rows:
            for c in row.cells:
                if c.rank is not None:
                    yield c.rank


def _order(rank: RankSnapshot) -> Tuple[int, int, int]:
    big = 1 << 62
    return (rank.local_rank if rank.local_rank is not None else big,
            rank.rank if rank.rank is not None else big, rank.pid)


def build_grid(snapshot: Snapshot, class_of: Mapping[RankKey, int], suspects: Set[RankKey],
               visible: Optional[Set[RankKey]] = None) -> GridModel:
    """Lay the snapshot out: nodes in hosts order, then any node only the ranks name.

    `visible` (a filter's result) keeps only those ranks and drops nodes left without any; a failed node
    stays visible only when no filter is active, since it has no ranks to match.
    """
    by_node: Dict[str, List[RankSnapshot]] = {}
    for r in snapshot.ranks:
        by_node.setdefault(r.node, []).append(r)
    nodes: List[NodeStatus] = list(snapshot.nodes)
    known = {n.name for n in nodes}
    nodes += [NodeStatus(name=name, state="done") for name in by_node if name not in known]

    model = GridModel()
    for node in nodes:
        ranks = sorted(by_node.get(node.name, ()), key=_order)
        if visible is not None:
            ranks = [r for r in ranks if rank_key(r) in visible]
            if not ranks:
                continue
        cells = [_cell(r, class_of, suspects) for r in ranks]
        if visible is None:
            expected = min(node.slots or 0, MAX_EXPECTED_CELLS)  # slots from a loaded file may be any number
            if node.state == "failed" and not cells:
                cells = [Cell("failed")] * max(expected, 1)
            elif node.state in ("done", "partial", "failed") and len(cells) < expected:
                cells += [Cell("missing")] * (expected - len(cells))
        row_index = len(model.rows)
        for col, c in enumerate(cells):
            if c.rank is not None:
                model.index[rank_key(c.rank)] = (row_index, col)
        model.rows.append(Row(node, tuple(cells)))
        model.columns = max(model.columns, len(cells))
    return model


def _cell(rank: RankSnapshot, class_of: Mapping[RankKey, int], suspects: Set[RankKey]) -> Cell:
    key = rank_key(rank)
    klass = class_of.get(key, -1)
    if klass >= 0:
        kind: CellKind = "class"
    elif rank.error is not None:
        kind = "error"
    else:
        kind = "pending"
    return Cell(kind, rank, klass, key in suspects)


def column_labels(model: GridModel) -> Sequence[str]:
    """The header over each column: the local rank when every rank in that column agrees, else its index."""
    labels: List[str] = []
    for col in range(model.columns):
        seen = {c.rank.local_rank for row in model.rows if col < len(row.cells)
                for c in (row.cells[col],) if c.rank is not None}
        labels.append(str(seen.pop()) if len(seen) == 1 and None not in seen else str(col))
    return labels
