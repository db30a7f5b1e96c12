"""Identical frames without locals are one shared object, from a snapshot file and from the worker's dumps.

The analysis keys frames by identity: a 100k-rank snapshot whose few hundred distinct frames are shared
analyses ~4x faster (bench/analysis.py --interned). Sharing must change nothing else: frames are frozen, and
every rank, analysis and round trip comes out equal to the unshared ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from app import parse
from app.analysis import analyze
from app.model import Snapshot, from_dict, snapshot_from_json, snapshot_to_json, to_dict

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = DATA / "scenarios" / "dataloader.json"  # 4 ranks of a real job, recorded with locals


def frames_of(snap: Snapshot) -> list:
    return [f for r in snap.ranks for t in r.threads for f in t.frames]


def test_a_snapshot_file_shares_frames_without_locals_and_only_those() -> None:
    snap, _ = snapshot_from_json(GOLDEN.read_text(encoding="utf-8"))
    frames = frames_of(snap)
    plain = [f for f in frames if not f.locals]
    with_locals = [f for f in frames if f.locals]
    assert len(plain) > len({id(f) for f in plain}), "ranks of one job share their plain frames"
    assert len({id(f) for f in with_locals}) == len(with_locals), "frames with locals are never shared"
    # the shared objects are exactly the equal ones: one object per distinct plain frame
    assert len({id(f) for f in plain}) == len(set(plain))


def test_sharing_changes_no_value_and_no_conclusion() -> None:
    text = GOLDEN.read_text(encoding="utf-8")
    snap, _ = snapshot_from_json(text)
    doc = json.loads(text)
    again = from_dict(Snapshot, doc["snapshot"])
    assert again == snap and snapshot_to_json(snap) == snapshot_to_json(again)
    assert to_dict(snap) == doc["snapshot"]
    for a, b in zip(frames_of(snap), frames_of(again)):
        assert a is not b, "the cache lives for one call, not across calls"
    assert analyze(snap).to_dict()["findings"] == analyze(again).to_dict()["findings"]


def test_the_parser_shares_frames_across_ranks_of_a_dump() -> None:
    disc = json.loads((DATA / "worker_discover_torch.json").read_text())["items"]
    items = {i["pid"]: i for i in json.loads((DATA / "worker_dump_torch_plain.json").read_text())["items"]}
    r0, r1 = (parse.apply_dump(parse.rank_from_discover("node01", d), items[d["pid"]]) for d in disc)
    m0, m1 = r0.main_thread, r1.main_thread
    assert m0 is not None and m1 is not None
    shared = [a for a, b in zip(reversed(m0.frames), reversed(m1.frames)) if a == b]
    assert shared and all(any(a is b for b in m1.frames) for a in shared), "equal plain frames are one object"
    with_locals = json.loads((DATA / "worker_dump_torch_locals.json").read_text())["items"]
    again = [parse.apply_dump(parse.rank_from_discover("node01", d), next(i for i in with_locals
                                                                         if i["pid"] == d["pid"])) for d in disc]
    kept = [f for r in again for t in r.threads for f in t.frames if f.locals]
    assert kept and len({id(f) for f in kept}) == len(kept)
