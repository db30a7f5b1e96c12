"""What ranks share: identical frames without locals are one object (from a snapshot file and from the
worker's dumps), and threads at the same place share one interned path (ThreadStack.path) even when every
frame carries the rank's own locals.

The analysis groups ranks by path object: a 100k-rank snapshot with per-rank locals analyses in a fraction of
the time it took to compare frames (bench/analysis.py). Sharing must change nothing else: frames are frozen,
the path is derived and never stored, and every rank, analysis and round trip comes out equal to the unshared
ones.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Tuple

from pytest import MonkeyPatch

from analysis_snapshots import ALL_REDUCE, LOADING, frame, in_step, rank, snapshot
from app.model import frames as model_frames
from app.decode import replies as parse
from app.analysis import analyze
from app.model import Frame, Local, Snapshot, ThreadStack
from app.model.codec import from_dict, snapshot_from_json, snapshot_to_json, to_dict
from app.report.schema import schema_text

DATA = Path(__file__).resolve().parents[1] / "data"
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


# --- interned paths -----------------------------------------------------------------------------------------


def _copy(s: str) -> str:
    return (s + "\0")[:-1]  # another string object with the same text, as json.loads gives every rank


def own(frames: Tuple[Frame, ...], rank_number: int) -> Tuple[Frame, ...]:
    """The frames as one rank's dump has them: its own objects and strings, and locals naming its own objects."""
    return tuple(Frame(_copy(f.function), _copy(f.filename), f.line, f.module, f.native,
                       locals=(Local("self", f"<Model at 0x7f{rank_number:04x}{i:02x}0>", True),
                               Local("x", f"<Tensor at 0x7f{rank_number:04x}{i:02x}8>")),
                       loops=f.loops, iteration=tuple((_copy(n), _copy(v)) for n, v in f.iteration),
                       source=f.source)
                 for i, f in enumerate(frames))


def described(path: Tuple[Frame, ...]) -> list:
    return [(f.function, f.filename, f.line, f.iteration) for f in path]


def test_threads_with_their_own_locals_share_one_path() -> None:
    frames = in_step(ALL_REDUCE, 1203)
    a, b = (ThreadStack(tid=100 + r, frames=own(frames, r)) for r in (0, 1))
    assert a.frames != b.frames and a.frames[0].function is not b.frames[0].function
    assert a.path is b.path, "built separately, the same place: one path object"
    assert described(a.path) == described(frames)
    assert not any(f.locals or f.loops or f.source for f in a.path)
    assert ThreadStack(tid=7, frames=frames).path is a.path  # shared frames without locals: the same path


def test_paths_differ_where_ranks_do_not_stand_together() -> None:
    here = ThreadStack(tid=1, frames=own(in_step(ALL_REDUCE, 1203), 0)).path
    other_line = ALL_REDUCE[:2] + (frame("train (job.py:58)"),) + ALL_REDUCE[3:]
    elsewhere = ThreadStack(tid=2, frames=own(in_step(other_line, 1203), 1)).path
    ahead = ThreadStack(tid=3, frames=own(in_step(ALL_REDUCE, 1204), 2)).path
    assert elsewhere is not here and elsewhere != here
    assert ahead is not here and ahead != here  # another loop iteration: the analysis splits on it
    assert ThreadStack(tid=4).path == ()


def test_the_path_is_derived_and_never_stored() -> None:
    t = ThreadStack(tid=1, name="MainThread", frames=own(in_step(ALL_REDUCE, 1203), 0), is_main=True)
    assert dataclasses.replace(t, name="worker").path is t.path
    moved = dataclasses.replace(t, frames=LOADING)
    assert moved.path is ThreadStack(tid=9, frames=LOADING).path and moved.path != t.path
    assert dataclasses.replace(t) == t and hash(dataclasses.replace(t)) == hash(t)
    assert "path" not in repr(t) and "path" not in to_dict(t)
    assert "path" not in {f.name for f in dataclasses.fields(ThreadStack)}
    assert "path" not in json.loads(schema_text())["$defs"]["ThreadStack"]["properties"]
    # a snapshot file holds no path, and the threads read back from it are on the same paths again
    snap = snapshot([rank(r, "n1", own(in_step(ALL_REDUCE, 1203), r)) for r in range(3)], locals=True)
    text = snapshot_to_json(snap)
    doc = json.loads(text)
    assert all("path" not in t for r in doc["snapshot"]["ranks"] for t in r["threads"])
    again, _ = snapshot_from_json(text)
    assert again == snap and snapshot_to_json(again) == text
    assert {id(r.threads[0].path) for r in again.ranks} == {id(snap.ranks[0].threads[0].path)}


def test_the_intern_tables_are_bounded_and_starting_over_changes_no_conclusion(monkeypatch: MonkeyPatch) -> None:
    def ranks():  # type: ignore[no-untyped-def]
        # alternating places, and one rank an iteration ahead: every new path fills the small tables again
        return [rank(r, f"n{r // 4}", own(in_step(LOADING if r % 2 else ALL_REDUCE, 1204 if r == 5 else 1203),
                                           r), world=9) for r in range(8)]
    usual = analyze(snapshot(ranks(), locals=True)).to_dict()
    from app.model.memo import BoundedMemo

    for name in ("_PATHS", "_BARE"):
        monkeypatch.setattr(model_frames, name, BoundedMemo(6))
    tight = snapshot(ranks(), locals=True)
    assert len(model_frames._PATHS) <= 2 and len(model_frames._BARE) <= 6
    on_all_reduce = [r.threads[0].path for r in tight.ranks if r.rank in (0, 2, 4, 6)]
    assert len({id(p) for p in on_all_reduce}) > 1 and len(set(on_all_reduce)) == 1  # equal, not shared
    again = analyze(tight).to_dict()
    usual.pop("elapsed"), again.pop("elapsed")
    assert again == usual


def test_a_bounded_memo_keeps_the_first_value_and_starts_over_at_its_limit() -> None:
    from app.model.memo import BoundedMemo

    memo: BoundedMemo[str, object] = BoundedMemo(3)
    get = memo.get
    first = memo.add("a", object())
    assert memo.add("a", object()) is first and get("a") is first  # concurrent builders agree on the first
    memo.add("path", object(), weight=2)
    assert len(memo) == 2 and memo.weight == 3
    memo.add("b", 1)  # over the limit: the table starts over, then holds the new entry
    assert len(memo) == 1 and get("a") is None and get("b") == 1  # the bound `get` still reads the table


def test_a_memo_that_never_finds_its_keys_is_used_one_call_in_sparse_until_they_come_back() -> None:
    """Keys that never come back (each rank's own locals) cost a hash to miss and a store nobody reads: after a
    judgement with fewer than one hit in PAYS, only one call in SPARSE uses the memo; when the calls that do
    find their keys again, it is used by every call from the next judgement on."""
    from app.model import memo as memo_mod

    memo: memo_mod.BoundedMemo[int, int] = memo_mod.BoundedMemo(1 << 20)
    for k in range(memo_mod.JUDGE_EVERY):
        assert memo.use()
        memo.add(k, k)  # every call a miss
    uses = [memo.use() for _ in range(10 * memo_mod.SPARSE)]
    assert uses.count(True) == 10 and uses[memo_mod.SPARSE - 1] and not any(uses[:memo_mod.SPARSE - 1])
    calls = 0
    while memo.every != 1:  # the same key again and again: each call that uses the memo finds it
        calls += 1
        assert calls <= memo_mod.SPARSE * memo_mod.JUDGE_EVERY * 2
        if memo.use():
            if memo.get(7) is not None:
                memo.hits += 1
            else:
                memo.add(7, 7)
    assert calls <= memo_mod.SPARSE * (memo_mod.JUDGE_EVERY + 1)  # within the judgement after they came back
    assert all(memo.use() for _ in range(100))


def test_a_memo_whose_callers_do_not_ask_is_whole_whatever_it_finds() -> None:
    from app.model.memo import JUDGE_EVERY, BoundedMemo

    memo: BoundedMemo[int, int] = BoundedMemo(1 << 20)
    for k in range(3 * JUDGE_EVERY):
        memo.add(k, k)
    assert memo.every == 1
