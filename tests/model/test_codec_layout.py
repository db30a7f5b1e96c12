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
from app.model.codec import dumps_lines, inert, snapshot_from_json, snapshot_to_json

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
    assert dumps_lines(doc, 99) == inert(json.dumps(doc, indent=1, ensure_ascii=False))


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


def test_a_snapshot_file_is_written_as_it_is_made_never_held_whole(tmp_path: Any) -> None:
    """--snapshot writes the text as it is produced (at 12,500 nodes x 8 ranks it is ~600 MB, and the text and its
    bytes held together were over a GB beside the snapshot): the temporary file already holds the first runs
    while the last ranks are still being converted; the file is the same bytes as the whole text's, its lone
    surrogates escaped as before wherever the pieces are cut."""
    import os

    from app.cli.run import write_private
    from app.model import codec

    ranks = [dataclasses.replace(rank(r, f"node{r // 4 + 1:02d}", ALL_REDUCE), cmdline=("python", "y" * 60_000))
             for r in range(64)]  # ~4 MB of text
    ranks[5] = dataclasses.replace(ranks[5], cmdline=("python", "bad\ud800name"))
    snap = snapshot(ranks)
    whole = snapshot_to_json(snap)
    seen: list = []

    def watched() -> Any:
        for i, piece in enumerate(codec.snapshot_json_parts(snap)):
            if i % 16 == 0:  # what is already on disk under the temporary name while pieces are still made
                seen.append(sum(os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path) if n.endswith(".tmp")))
            yield piece

    out = tmp_path / "out.json"
    write_private(str(out), watched())
    assert out.read_bytes() == whole.encode("utf-8", "backslashreplace")
    assert b"\\ud800" in out.read_bytes() and snapshot_from_json(out.read_text())[0].ranks[5].pid == ranks[5].pid
    assert len(whole) > 3 << 20 and 1 << 20 <= max(seen) < len(whole)  # runs written while the rest was still being made
    assert os.listdir(tmp_path) == ["out.json"] and out.stat().st_mode & 0o777 == 0o600


def test_a_write_that_fails_part_way_leaves_the_earlier_file_and_no_temporary(tmp_path: Any) -> None:
    from app.cli.run import write_private

    out = tmp_path / "out.json"
    out.write_text("old")

    def broken() -> Any:
        yield "x" * (3 << 20)  # three runs on disk first
        raise RuntimeError("the analysis failed half-way")

    with pytest.raises(RuntimeError):
        write_private(str(out), broken(), force=True)
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


@pytest.mark.parametrize("size", [1, 7, 1 << 20])
def test_the_bytes_do_not_depend_on_where_the_pieces_are_cut(size: int) -> None:
    from app.model.codec import encode_pieces, snapshot_json_bytes

    text = "a\ud800b\U0001f600\udfffé" * 5
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    assert b"".join(encode_pieces(pieces, "backslashreplace", size)) == text.encode("utf-8", "backslashreplace")
    snap = snapshot([rank(r, f"nöde{r // 4 + 1:02d}", ALL_REDUCE) for r in range(8)])
    doc = analyze(snap).to_dict()
    assert snapshot_json_bytes(snap, doc) == snapshot_to_json(snap, doc).encode()


def test_characters_a_terminal_acts_on_are_written_as_escapes_the_same_value() -> None:
    """A snapshot file is shared and `cat`: DEL, the C1 controls (U+009B is an 8-bit CSI), the line separators and
    the bidirectional controls a node's names may hold are written as \\uXXXX escapes, which read back the same;
    other text stays as it is (ensure_ascii=False)."""
    name = "w\x9b2J\x7fx\u202egnp.exe\u2028y\u2066z é 漢"
    snap = snapshot([dataclasses.replace(rank(r, "node01", ALL_REDUCE), cmdline=("python", name)) for r in range(2)])
    text = snapshot_to_json(snap)
    assert not any(c in text for c in "\x9b\x7f\u202e\u2028\u2066")
    assert "\\u009b2J\\u007fx\\u202egnp.exe\\u2028y\\u2066z é 漢" in text
    assert snapshot_from_json(text)[0].ranks[0].cmdline == ("python", name)
