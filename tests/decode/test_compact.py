"""The compact collect form (workers/compact.py, issue 27): each distinct stack once per connection, per rank only
what is its own. What the login side reads back from it must be what it read from the full dump item: the same
threads, frames, source lines, loops and iterations; every local when the session asked for all of them, and the
locals the analysis reads when it did not."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Dict, List, Set

from app.decode import replies
from app.model import ThreadStack
from workers import compact

DATA = Path(__file__).resolve().parents[1] / "data"


def items(name: str) -> List[Dict[str, Any]]:
    return json.loads((DATA / name).read_text())["items"]


def shape(threads: tuple[ThreadStack, ...]) -> list:
    return [(t.tid, t.name, t.active, t.is_main, [(f.function, f.filename, f.line, f.module, f.native, f.loops,
                                                   f.source, f.withs) for f in t.frames]) for t in threads]


def read_compact(dump_items: List[Dict[str, Any]], all_locals: bool, sent: Set[str], table: dict
                 ) -> List[replies.Dumped]:
    out = []
    for item in dump_items:
        small, new = compact.split(copy.deepcopy(item), sent, all_locals)
        if new:
            # the stack table item travels as JSON, before the dumps that use it
            replies.decode_stacks(json.loads(json.dumps(new)), table)
        out.append(replies.decode_compact_dump(json.loads(json.dumps(small)), table))
    return out


def test_compact_dumps_read_back_as_the_full_ones_with_every_local_when_asked() -> None:
    full_items = items("worker_dump_torch_locals.json")
    assert any(f.get("locals") for i in full_items for t in i["pyspy"] for f in t["frames"])  # the data has some
    compact_read = read_compact(full_items, True, set(), {})
    for item, got in zip(full_items, compact_read):
        want = replies.decode_dump(copy.deepcopy(item))
        assert shape(got.threads) == shape(want.threads)
        assert [[(f.locals, f.iteration) for f in t.frames] for t in got.threads] == \
            [[(f.locals, f.iteration) for f in t.frames] for t in want.threads]
        assert (got.pid, got.collected, got.error, got.elapsed, got.state) == \
            (want.pid, want.collected, want.error, want.elapsed, want.state)
        assert not any("did not send" in n for n in got.notes)


def test_without_all_locals_a_rank_keeps_the_locals_the_analysis_reads_and_the_same_iteration() -> None:
    full_items = items("worker_dump_torch_locals.json")
    for item, got in zip(full_items, read_compact(full_items, False, set(), {})):
        want = replies.decode_dump(copy.deepcopy(item))
        assert shape(got.threads) == shape(want.threads)  # frames, source and loops: all of them
        kept = sum(len(f.locals) for t in got.threads for f in t.frames)
        every = sum(len(f.locals) for t in want.threads for f in t.frames)
        assert 0 < kept < every
        # the loop coordinates (which iteration each rank is in) read the same
        assert [[f.iteration for f in t.frames] for t in got.threads] == \
            [[f.iteration for f in t.frames] for t in want.threads]
        for t_got, t_want in zip(got.threads, want.threads):
            for f_got, f_want in zip(t_got.frames, t_want.frames):
                assert set(f_got.locals) <= set(f_want.locals)  # kept as they were, never altered


def test_a_stack_travels_once_per_connection_and_has_the_same_id_on_every_node() -> None:
    full_items = items("worker_dump_torch_locals.json")
    sent: Set[str] = set()
    first = [compact.split(copy.deepcopy(i), sent)[1] for i in full_items]
    assert any(first)
    again = [compact.split(copy.deepcopy(i), sent)[1] for i in full_items]  # a refresh on the same worker
    assert again == [{} for _ in full_items]
    assert not first[1]  # the node's second rank stands on the first one's stacks: nothing new to send
    other: Set[str] = set()
    other_node = [compact.split(copy.deepcopy(i), other)[1] for i in full_items]
    assert other_node == first  # another connection: the same ids for the same stacks


def test_a_thread_naming_a_stack_its_connection_never_sent_is_shown_without_frames_and_said_so() -> None:
    item = items("worker_dump_torch_locals.json")[0]
    small, _ = compact.split(copy.deepcopy(item), set())
    got = replies.decode_compact_dump(small, {})  # the table item was lost
    assert got.threads and all(t.frames == () for t in got.threads if t.tid in {x["os_thread_id"] for x in
                                                                                  small["threads"]})
    assert any("did not send" in n for n in got.notes)


def test_a_dump_py_spy_could_not_take_stays_uncollected() -> None:
    item = dict(items("worker_dump_torch_locals.json")[0], pyspy=None, ok=False)
    small, new = compact.split(item, set())
    assert small["threads"] is None and new == {}
    assert replies.decode_compact_dump(small, {}).collected is False


def test_a_stack_another_connection_sent_is_decoded_once_but_an_id_is_never_taken_on_trust() -> None:
    """Every node of a job sends the same few stack entries (the id is the hash of the content): the second
    connection's equal entry reuses the frames decoded for the first (at 12,500 nodes a 60-frame entry was
    decoded 12,500 times). A node that sends other content under a known id (a hostile or broken worker) gets
    its own content decoded, and the next node's equal entry still reads as the first one did."""
    full_items = items("worker_dump_torch_locals.json")
    _, entries = compact.split(copy.deepcopy(full_items[0]), set())
    sid, entry = next(iter(entries.items()))
    first: dict = {}
    replies.decode_stacks(json.loads(json.dumps({sid: entry})), first)
    second: dict = {}
    replies.decode_stacks(json.loads(json.dumps({sid: entry})), second)  # parsed apart, equal
    assert second[sid] is first[sid]
    forged = copy.deepcopy(entry)
    forged["frames"][0]["name"] = "not_what_the_id_says"
    hostile: dict = {}
    replies.decode_stacks(json.loads(json.dumps({sid: forged})), hostile)
    assert hostile[sid] is not first[sid] and hostile[sid][0].function == "not_what_the_id_says"
    assert first[sid][0].function != "not_what_the_id_says"
    third: dict = {}
    replies.decode_stacks(json.loads(json.dumps({sid: entry})), third)
    assert third[sid] is first[sid]


# -- deep stacks whose ranks keep other locals (issue 27: 12,500 x 8 with a rank passed down 60 frames) ----------

def _deep_entry(depth: int) -> Dict[str, Any]:
    """A stack table entry of `depth` Python frames (a recursion, as a model's layers are), innermost first."""
    return {"frames": [{"name": "layer", "filename": "/job/model.py", "line": 40 + n % 3, "module": None}
                       for n in range(depth)], "loops": {}, "source": {}, "context": 0}


def _deep_dump(pid: int, sid: str, depth: int, rank: int, own_frames: range) -> Dict[str, Any]:
    """A compact dump whose one thread keeps `depth` and `step` in every frame (the same on every rank) and its
    rank in the frames of `own_frames` (an argument passed down)."""
    kept: List[List[Any]] = []
    for n in range(depth):
        kept += [[n, "depth", str(n), True], [n, "step", "6", True]]
        if n in own_frames:
            kept.append([n, "rank", str(rank), True])
    return {"pid": pid, "ok": True, "threads": [{"thread_id": pid, "os_thread_id": pid, "thread_name": "MainThread",
                                                  "active": False, "owns_gil": False, "stack": sid,
                                                  "locals": kept}]}


def _decode_deep(ranks: int, depth: int, own_frames: range) -> List[replies.Dumped]:
    table: dict = {}
    replies.decode_stacks(json.loads(json.dumps({"deepstack": _deep_entry(depth)})), table)
    return [replies.decode_compact_dump(json.loads(json.dumps(_deep_dump(100 + r, "deepstack", depth, r,
                                                                         own_frames))), table)
            for r in range(ranks)]


def test_ranks_whose_locals_differ_in_a_few_frames_share_every_other_frame_and_local() -> None:
    """A job passes its rank down a few of its 60 frames: each rank's dump holds its own frames only where its
    rank is, and the same frame objects everywhere else (and one object per distinct local): the login side's
    memory per rank stays in kilobytes (it was 60 frames and 180 locals of its own, ~65 KB)."""
    a, b = (d.threads[0].frames for d in _decode_deep(2, 60, range(2)))
    assert [f.function for f in a] == ["layer"] * 60
    for n in range(60):
        names = [(lc.name, lc.repr) for lc in a[n].locals]
        assert names[:2] == [("depth", str(n)), ("step", "6")]
        if n < 2:
            assert names[2:] == [("rank", "0")] and [(lc.name, lc.repr) for lc in b[n].locals][2:] == [("rank", "1")]
            assert a[n] is not b[n] and a[n] != b[n]
            assert a[n].locals[0] is b[n].locals[0] and a[n].locals[1] is b[n].locals[1]  # the shared ones once
        else:
            assert a[n] is b[n]  # equal frames: one object
    assert a != b


def test_a_rank_passed_down_every_frame_still_shares_the_locals_that_are_equal() -> None:
    """The worst case: the rank is a local of every frame, so no frame is shared; every `depth`/`step` local is
    still one object for all ranks, and each rank's own value one object for all its frames."""
    dumps = _decode_deep(3, 60, range(60))
    frames = [d.threads[0].frames for d in dumps]
    for n in range(60):
        assert len({id(f[n]) for f in frames}) == 3
        assert len({id(f[n].locals[0]) for f in frames}) == 1 and len({id(f[n].locals[1]) for f in frames}) == 1
    for f in frames:
        assert len({id(fr.locals[2]) for fr in f}) == 1  # its rank: one Local for its 60 frames


def test_the_locals_the_decode_tables_keep_stay_under_their_limit(monkeypatch: Any) -> None:
    """Ranks whose locals all differ fill the decode's tables with nothing any other rank reuses: what they hold
    is bounded by the locals they keep (a count of entries let 65,536 keys of 180 locals each live on: over a GB
    at 12,500 x 8), so a long TUI session or a huge job cannot grow them without end."""
    limit = 2000
    for memo in (replies._WITH_LOCALS, replies._FRAMES_WITH, replies._LOCALS):
        monkeypatch.setattr(memo, "limit", limit)
        memo.clear()
    _decode_deep(40, 60, range(60))  # 40 ranks x 180 locals: 7,200 kept locals, none shared between ranks
    held = sum(len(kept) for _, kept in replies._WITH_LOCALS._table)
    assert 0 < held <= limit
    assert sum((len(key) - 1) // 3 for key in replies._FRAMES_WITH._table) <= limit
    assert 0 < len(replies._LOCALS) <= limit
    for memo in (replies._WITH_LOCALS, replies._FRAMES_WITH, replies._LOCALS):
        memo.clear()


def test_a_node_that_sends_other_frames_under_a_known_id_never_gets_nor_gives_another_nodes_frames() -> None:
    """Two connections, one stack id: the honest node's table holds the job's stack, the hostile one's other
    frames under the same id; ranks with the same kept locals on both read each their own node's frames."""
    honest: dict = {}
    replies.decode_stacks(json.loads(json.dumps({"sameid": _deep_entry(3)})), honest)
    forged = _deep_entry(3)
    forged["frames"][0]["name"] = "not_what_the_id_says"
    hostile: dict = {}
    replies.decode_stacks(json.loads(json.dumps({"sameid": forged})), hostile)
    item = _deep_dump(7, "sameid", 3, 0, range(3))
    got_hostile = replies.decode_compact_dump(json.loads(json.dumps(item)), hostile).threads[0].frames
    got_honest = replies.decode_compact_dump(json.loads(json.dumps(item)), honest).threads[0].frames
    assert got_hostile[0].function == "not_what_the_id_says"
    assert [f.function for f in got_honest] == ["layer"] * 3


def test_a_thread_whose_frames_and_locals_did_not_change_keeps_its_frames_from_the_last_pass() -> None:
    """The TUI holds its last snapshot while it takes the next: a rank with locals of its own (no table holds
    them at 100k ranks) keeps its frame objects from one pass to the next while its stack and its locals stay
    the same, and gets new ones, with the new values, as soon as one local changes."""
    table: dict = {}
    replies.decode_stacks(json.loads(json.dumps({"deepstack": _deep_entry(60)})), table)
    for memo in (replies._WITH_LOCALS, replies._FRAMES_WITH):
        memo.clear()  # as after a table started over: nothing but the last pass can give the frames back
    first: tuple = ({}, {})
    item = _deep_dump(100, "deepstack", 60, 3, range(60))
    one = replies.decode_compact_dump(json.loads(json.dumps(item)), table, first).threads[0].frames
    for memo in (replies._WITH_LOCALS, replies._FRAMES_WITH):
        memo.clear()
    second: tuple = (first[1], {})
    two = replies.decode_compact_dump(json.loads(json.dumps(item)), table, second).threads[0].frames
    assert two is one
    for memo in (replies._WITH_LOCALS, replies._FRAMES_WITH):
        memo.clear()
    moved = copy.deepcopy(item)
    moved["threads"][0]["locals"][-1][2] = "4"  # one value changed (the innermost... outermost frame's rank)
    three = replies.decode_compact_dump(json.loads(json.dumps(moved)), table, (second[1], {})).threads[0].frames
    assert three is not one and three[:59] == one[:59] and three[59] != one[59]
    assert [(lc.name, lc.repr) for lc in three[59].locals][-1] == ("rank", "4")
    other = _deep_dump(100, "deepstack", 60, 3, range(59))  # the same values, one local fewer
    four = replies.decode_compact_dump(json.loads(json.dumps(other)), table, (second[1], {})).threads[0].frames
    assert four is not one and [lc.name for lc in four[59].locals] == ["depth", "step"]


def test_ranks_whose_locals_all_differ_turn_the_locals_tables_sparse_and_decode_the_same_frames(
        monkeypatch: Any) -> None:
    """A rank passed down every frame: no rank's kept locals, nor any of its frames with them, come back, so the
    two tables stop being asked by every rank (BoundedMemo.use); what each rank decodes is what it decodes with
    the tables whole, and when ranks share their locals again, the tables are whole again and the ranks share
    one tuple of frames."""
    from app.model import memo as memo_mod

    monkeypatch.setattr(memo_mod, "JUDGE_EVERY", 16)
    for memo in (replies._WITH_LOCALS, replies._FRAMES_WITH):
        monkeypatch.setattr(memo, "every", 1)
        monkeypatch.setattr(memo, "hits", 0)
        monkeypatch.setattr(memo, "asked", 0)
        memo.clear()
    own = _decode_deep(40, 20, range(20))
    assert replies._WITH_LOCALS.every == memo_mod.SPARSE and replies._FRAMES_WITH.every == memo_mod.SPARSE
    for memo in (replies._WITH_LOCALS, replies._FRAMES_WITH):
        monkeypatch.setattr(memo, "every", 1)
        memo.clear()
    whole = _decode_deep(40, 20, range(20))
    assert [d.threads[0].frames for d in own] == [d.threads[0].frames for d in whole]
    assert [[lc.repr for lc in d.threads[0].frames[-1].locals] for d in own][:3] == [["19", "6", str(r)]
                                                                                  for r in range(3)]
    # ranks on the same stack with the same locals (no rank among them) keep the tables whole and share frames
    for memo in (replies._WITH_LOCALS, replies._FRAMES_WITH):
        memo.clear()
    shared = _decode_deep(32 * memo_mod.SPARSE, 20, range(0))  # two judgements of the calls let through
    assert replies._WITH_LOCALS.every == 1
    assert len({id(d.threads[0].frames) for d in shared[-8:]}) == 1  # every rank since: one tuple
    assert len({d.threads[0].frames for d in shared}) == 1  # and before, equal ones
