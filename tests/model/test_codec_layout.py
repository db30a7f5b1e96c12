"""The snapshot file's layout (app.model.codec.dumps_lines): the same JSON as before, its outer levels one entry a
line as indent=1 wrote them, each rank and node on one line of its own (written by the C encoder: at 12,500 nodes
x 8 ranks the pure-Python one that indent= selects took seconds)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from analysis_snapshots import ALL_REDUCE, rank, snapshot
from app.analysis import analyze
from app.model.codec import dumps_lines, snapshot_from_json, snapshot_to_json

ODD: list[Any] = [
    {}, [], "text", 1.5, None, {"a": []}, [[], {}],
    {"a": {"b": [1, {"c": 2}], "d": {}}, "e": [[1, 2], {"x": "é\n\u2028\"<b>"}], "f": None},
    {True: 1, None: 2, 3: 4, 1.5: 5, "k": {False: [float("inf"), float("nan")]}},
    [1, [2, [3, [4]]]],
]


@pytest.mark.parametrize("doc", ODD)
def test_every_level_reads_back_as_the_same_value_and_all_levels_are_indent_1(doc: Any) -> None:
    for levels in range(5):
        assert json.dumps(json.loads(dumps_lines(doc, levels))) == json.dumps(doc)
    assert dumps_lines(doc, 99) == json.dumps(doc, indent=1, ensure_ascii=False)


def test_a_snapshot_file_has_one_rank_a_line_and_loads_back_equal() -> None:
    snap = snapshot([rank(r, f"node{r // 4 + 1:02d}", ALL_REDUCE) for r in range(8)])
    text = snapshot_to_json(snap, analyze(snap).to_dict())
    lines = text.splitlines()
    assert lines[0] == "{" and lines[1].startswith(' "schema": ') and lines[-1] == "}"
    ranks = [line for line in lines if line.startswith("   {") and '"pid": ' in line]
    assert len(ranks) == 8 and all(json.loads(line.rstrip(","))["rank"] == i for i, line in enumerate(ranks))
    assert snapshot_from_json(text)[0] == snap


def test_to_dict_takes_plain_fields_as_they_are_and_converts_the_rest() -> None:
    from dataclasses import dataclass
    from typing import Literal, Optional, Tuple

    from app.model.codec import to_dict

    @dataclass(frozen=True)
    class Inner:
        xs: Tuple[int, ...]

    @dataclass(frozen=True)
    class Outer:
        name: str
        size: Optional[int]
        kind: Literal["a", "b"]
        inner: Optional[Inner]
        pairs: Tuple[Tuple[str, str], ...]
        later: "Unresolved"  # type: ignore[name-defined]  # noqa: F821 (a hint that never resolves)

    out = to_dict(Outer("n", None, "a", Inner((1, 2)), (("k", "v"),), (Inner((3,)),)))
    assert out == {"name": "n", "size": None, "kind": "a", "inner": {"xs": [1, 2]}, "pairs": [["k", "v"]],
                   "later": [{"xs": [3]}]}
    assert type(out["pairs"]) is list and type(out["inner"]["xs"]) is list


def test_frames_the_ranks_share_are_written_as_each_rank_holds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import copy

    from app.model import codec
    from app.model.codec import to_dict

    snap = snapshot([rank(r, f"node{r // 4 + 1:02d}", ALL_REDUCE) for r in range(8)])
    one_stack = snap.ranks[0].threads  # every rank on the same frame objects, as the decode interns them
    shared = dataclasses.replace(snap, ranks=tuple(dataclasses.replace(r, threads=one_stack) for r in snap.ranks))
    copied = dataclasses.replace(shared, ranks=tuple(dataclasses.replace(r, threads=copy.deepcopy(one_stack))
                                                     for r in shared.ranks))
    text = snapshot_to_json(copied)
    # the same text whether frames are shared or not, and whether the table of written frames is kept or given up
    assert snapshot_to_json(shared) == text
    monkeypatch.setattr(codec, "_FRAMES_TRIED", 1)
    assert snapshot_to_json(shared) == text
    # written a line at a time, the document is to_dict's
    assert json.loads(text)["snapshot"] == json.loads(json.dumps(to_dict(copied)))
