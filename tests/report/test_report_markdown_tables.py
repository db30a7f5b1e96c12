"""Issue 19 item 5: text put into summary.md is escaped for where it goes. A `|` in a frame name, a file name, a
local's value or a node name must neither split a table cell nor show a stray backslash; checked by parsing
summary.md with a CommonMark parser with GitHub's table extension (markdown-it-py, which Textual brings)."""

from __future__ import annotations

import dataclasses
from typing import List

from markdown_it import MarkdownIt

from app.analysis import analyze
from app.model import Local, Snapshot
from app.report import build_bundle
from test_report_build import make_snapshot

PIPE_FUNC = "wait|here"
PIPE_FILE = "/srv/job/tr|ain.py"
PIPE_VALUE = "'a|b'"


def _piped(snap: Snapshot) -> Snapshot:
    """Rank 5 (the culprit) with `|` in its innermost frame's function and file, and in a local's value."""
    ranks = []
    for r in snap.ranks:
        if r.rank == 5:
            t = r.threads[0]
            frames = [dataclasses.replace(f, locals=f.locals + (Local("sep", PIPE_VALUE),))
                      if f.function == "main" else f for f in t.frames]  # same frame: the diff shows its locals
            frames[0] = dataclasses.replace(frames[0], function=PIPE_FUNC, filename=PIPE_FILE)
            r = dataclasses.replace(r, threads=(dataclasses.replace(t, frames=tuple(frames)),) + r.threads[1:])
        ranks.append(r)
    return dataclasses.replace(snap, ranks=tuple(ranks))


def _tables(md: str) -> List[List[List[str]]]:
    """Each table as rows of cell texts (inline content as a reader sees it, code spans included)."""
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    tables: List[List[List[str]]] = []
    row: List[str] = []
    for i, tok in enumerate(tokens):
        if tok.type == "table_open":
            tables.append([])
        elif tok.type == "tr_open":
            row = []
        elif tok.type == "inline" and tokens[i - 1].type in ("th_open", "td_open"):
            row.append("".join(c.content for c in tok.children or ()))
        elif tok.type == "tr_close":
            tables[-1].append(row)
    return tables


def test_pipes_in_frames_and_values_stay_inside_their_table_cells() -> None:
    snap = _piped(make_snapshot("barrier"))
    bundle = build_bundle(snap, analyze(snap), now=1.0)
    md = bundle.files["summary.md"]
    md = md.decode() if isinstance(md, bytes) else md
    tables = _tables(md)
    assert len(tables) >= 2, md  # the classes table and the culprit-vs-majority diff
    cells = []
    for table in tables:
        width = len(table[0])
        for row in table:
            assert len(row) == width, f"a row of {len(row)} cells in a table of {width}: {row}"
            cells += row
    shown = "\n".join(cells)
    assert f"{PIPE_FUNC} (tr|ain.py:" in shown, shown  # whole, in one cell, with no backslash before `|`
    assert PIPE_VALUE in shown
    assert "\\|" not in shown
