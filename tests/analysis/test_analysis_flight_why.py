"""The Flight Recorder says why, not only who: a rank that waits in another group's collective (no other rank
issued it), and a rank whose GPU has not started a collective every rank issued (the others' GPUs have).

Both classes were first seen on an H100 (bench/gpu_hang_job.py's `cycle` and `kernel` hangs; the recordings are in
tests/data/gpu and analysed in tests/gpu/test_gpu_recorded_h100.py). Here: synthetic records of 8 ranks, one
rule at a time, with the cases each rule must not fire on."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence

from analysis_snapshots import ALL_REDUCE, job, snapshot
from app.analysis import Analysis, analyze
from app.analysis.flight import FlightEvidence
from app.model import FlightEntry, FlightGroup, FlightRecord


def record(groups: Sequence[FlightGroup], entries: Sequence[FlightEntry] = ()) -> FlightRecord:
    return FlightRecord("worker_server", "/s", groups=tuple(groups), entries=tuple(entries))


def analysed(records: Dict[int, Optional[FlightRecord]], n: int = 8) -> Analysis:
    ranks = [dataclasses.replace(r, flight=records.get(r.rank)) for r in job(n, 4, frames=ALL_REDUCE)]
    return analyze(snapshot(ranks))


def lag(a: Analysis) -> list:
    """(the finding as shown, its fact's evidence) for each Flight Recorder finding."""
    return [(f, fact.data) for f, fact in zip(a.findings, a.facts) if f.kind == "collective_lag"]


# --- a GPU that has not started the collective ------------------------------------------------------------------

def timed(started: int, enqueued: int = 5, completed: int = 4) -> FlightRecord:
    return record([FlightGroup("0", "default_pg", enqueued, started, completed, "nccl:all_reduce")])


def test_a_rank_whose_gpu_has_not_started_the_collective_the_others_started_is_named_with_why() -> None:
    """Every rank issued #5; the GPUs of 7 began it, rank 3's did not: its stream still runs earlier work. The
    hosts all wait in the same place, so the stacks cannot tell; the recorder's start marks can."""
    a = analysed({r: timed(4 if r == 3 else 5) for r in range(8)})
    ((f, e),) = lag(a)
    assert f.ranks == (("node01", 1003),) and f.confidence == "high"
    assert isinstance(e, FlightEvidence) and (e.stage, e.issued, e.usual, e.others) == ("started", 4, 5, 7)
    assert f.title == ("rank 3's GPU has not started collective #5 of process group 0 (nccl:all_reduce), which the "
                       "GPUs of 7 others started")
    assert "still runs work queued before the collective (a kernel that does not end" in f.detail
    assert a.verdict.startswith("Rank 3's GPU has not started collective #5"), a.verdict
    assert "Next: find what rank 3's GPU runs before that collective: `nvidia-smi` on node01" in a.verdict


def test_no_start_marks_or_a_finished_collective_say_nothing_of_the_gpu() -> None:
    # gloo (and NCCL without TORCH_NCCL_ENABLE_TIMING) never marks a start: nothing to compare
    assert not lag(analysed({r: timed(None, 5) for r in range(8)}))  # type: ignore[arg-type]
    # one rank without start marks among timed ones: the comparison is not made on part of the group
    assert not lag(analysed({r: timed(None if r == 0 else 4 if r == 3 else 5) for r in range(8)}))  # type: ignore[arg-type]
    # someone completed #5: the group is not stuck in it
    assert not lag(analysed({r: timed(4 if r == 3 else 5, completed=5 if r == 0 else 4) for r in range(8)}))
    # all started: nothing singles a rank out
    assert not lag(analysed({r: timed(5) for r in range(8)}))
    # as many not started as started: no side is the odd one
    assert not lag(analysed({r: timed(4 if r < 4 else 5) for r in range(8)}))


def test_a_rank_behind_by_issue_count_is_not_also_said_to_have_a_slow_gpu() -> None:
    a = analysed({r: timed(4, enqueued=4) if r == 6 else timed(5) for r in range(8)})
    ((f, e),) = lag(a)
    assert isinstance(e, FlightEvidence) and e.stage == "issued" and f.ranks == (("node02", 1006),)


# --- a collective of another group -------------------------------------------------------------------------

def world(seq: int) -> FlightGroup:
    return FlightGroup("0", "default_pg", seq, None, min(seq, 4), "gloo:all_reduce")


def test_a_rank_in_a_collective_of_another_group_that_no_one_else_issued_waits_there() -> None:
    """Rank 6 entered pg 1's all_reduce (a group of ranks 0 and 6) where the others are in the world's #5: its
    own record says where it is, so one rank against seven is no longer a vote."""
    pair = FlightGroup("1", "", 1, None, None, "gloo:all_reduce")
    a = analysed({r: record([world(4), pair]) if r == 6 else record([world(5)]) for r in range(8)})
    ((f, e),) = lag(a)
    assert isinstance(e, FlightEvidence) and e.elsewhere == (("1", 1, "gloo:all_reduce"),) and e.complete
    assert f.ranks == (("node02", 1006),) and f.confidence == "high"
    assert f.title == ("rank 6 is behind in process group 0: last collective issued #4 where 7 others are at #5, and "
                       "waits in process group 1's collective #1 (gloo:all_reduce) instead, which no other rank has "
                       "issued")
    assert "the ranks call collectives of different groups" in f.detail and "(a cycle)" in f.detail
    assert "Next: make every rank call each group's collectives in one order: rank 6 calls process group 1's " \
           "where the others call group 0's" in a.verdict


def test_the_other_group_is_read_from_the_entries_where_its_status_line_has_no_count() -> None:
    """NCCL's own recorder (the H100 run): pg 1's status line had no count, its entry had the collective."""
    entries = [FlightEntry("0", 4, "nccl:all_reduce", "completed"), FlightEntry("1", 1, "nccl:all_reduce", "scheduled")]
    a = analysed({r: record([world(4), FlightGroup("1", "undefined")], entries) if r == 6 else record([world(5)])
                  for r in range(8)})
    ((f, e),) = lag(a)
    assert isinstance(e, FlightEvidence) and e.elsewhere == (("1", 1, "nccl:all_reduce"),)


def test_another_group_is_not_claimed_where_other_ranks_are_in_it_or_records_are_missing() -> None:
    pair = FlightGroup("1", "", 1, None, None, "gloo:all_reduce")
    # rank 0 issued pg 1's #1 too: rank 6 is not alone in it (both lag in pg 0 then? no: rank 0 is at #5)
    a = analysed({r: record([world(4), pair]) if r == 6 else record([world(5), pair]) if r == 0
                  else record([world(5)]) for r in range(8)})
    ((f, e),) = lag(a)
    assert isinstance(e, FlightEvidence) and e.elsewhere == ()
    # rank 5's record was not read: "no other rank issued it" is said of the records read, and is no longer enough
    # for [high] on its own (one against six is still a vote)
    a = analysed({r: None if r == 5 else record([world(4), pair]) if r == 6 else record([world(5)])
                  for r in range(8)})
    ((f, e),) = lag(a)
    assert isinstance(e, FlightEvidence) and e.elsewhere and not e.complete
    assert "none of the 6 other records read hold" in f.detail


# --- ahead of the rest, and another collective at the same number ---------------------------------------------

def named(seq: int, name: str, completed: int = 4) -> FlightRecord:
    return record([FlightGroup("0", "default_pg", seq, None, completed, name)],
                  [FlightEntry("0", seq, name, "scheduled")])


def test_a_rank_that_issued_one_collective_more_than_the_rest_is_ahead_and_never_high() -> None:
    """Rank 0 issued #6 (an extra all_reduce on a branch only it takes) and waits in it; the rest wait at #5."""
    a = analysed({r: named(6 if r == 0 else 5, "gloo:all_reduce") for r in range(8)})
    ((f, e),) = lag(a)
    assert isinstance(e, FlightEvidence) and (e.stage, e.issued, e.usual, e.others) == ("ahead", 6, 5, 7)
    assert f.ranks == (("node01", 1000),) and f.confidence == "medium"
    assert f.title == ("rank 0 is ahead in process group 0: it issued collective #6 (gloo:all_reduce), which 7 "
                       "others have not (at #5)")
    assert "an extra collective on a branch only it takes" in f.detail
    # it completed #6: not waiting in it (a snapshot of a job in motion), and half ahead is no minority
    assert not lag(analysed({r: named(6, "gloo:all_reduce", completed=6) if r == 0 else named(5, "gloo:all_reduce")
                             for r in range(8)}))
    half = lag(analysed({r: named(6 if r < 4 else 5, "gloo:all_reduce") for r in range(8)}))
    assert [(f.confidence, e.stage) for f, e in half] == [("low", "issued")]  # the tie's rule: either side


def test_a_rank_that_issued_another_collective_at_the_same_number_is_named_with_both() -> None:
    """Every rank issued #5 of pg 0; rank 5's is a barrier, the others' an all_reduce: they never match."""
    a = analysed({r: named(5, "gloo:barrier" if r == 5 else "gloo:all_reduce") for r in range(8)})
    ((f, e),) = lag(a)
    assert isinstance(e, FlightEvidence) and (e.stage, e.op, e.others) == ("op", "gloo:barrier", 7)
    assert f.ranks == (("node02", 1005),) and f.confidence == "high"
    assert f.title == ("rank 5 issued `gloo:barrier` as collective #5 of process group 0, where 7 others issued "
                       "`gloo:all_reduce`")
    assert a.verdict.startswith("Rank 5 issued `gloo:barrier` as collective #5"), a.verdict
    assert "Next: make every rank issue the same collectives in one order: find where rank 5 calls gloo:barrier " \
           "where the others call gloo:all_reduce" in a.verdict
    # one of them completed #5: what they issued there matched; the same collective everywhere: nothing odd
    done = {r: named(5, "gloo:barrier" if r == 5 else "gloo:all_reduce", completed=5 if r == 1 else 4)
            for r in range(8)}
    assert not lag(analysed(done))
    assert not lag(analysed({r: named(5, "gloo:all_reduce") for r in range(8)}))
    # four against four: no side is the odd one
    assert not lag(analysed({r: named(5, "gloo:barrier" if r < 4 else "gloo:all_reduce") for r in range(8)}))


# --- one group across ranks ---------------------------------------------------------------------------------

def member(pg_id: str, name: str, members: range, seq: int, completed: int) -> FlightGroup:
    return FlightGroup(pg_id, "", seq, None, completed, "gloo:all_reduce", global_name=name, members=tuple(members))


def test_groups_are_compared_by_torchs_name_and_members_not_by_each_ranks_own_id() -> None:
    """Two tensor-parallel groups, ranks 0-3 and 4-7: each rank calls its own "pg 1" (the recorder numbers only
    the groups a rank is a member of). Group 4-7 is at #12 but rank 7 at #11; group 0-3 is at #10. Compared by
    id, the eight "pg 1" counts mix the two groups."""
    def rec(r: int) -> FlightRecord:
        tp = member("1", "1", range(4), 10, 9) if r < 4 else member("1", "2", range(4, 8), 11 if r == 7 else 12, 10)
        return record([member("0", "0", range(8), 5, 5), tp])
    a = analysed({r: rec(r) for r in range(8)})
    ((f, e),) = lag(a)
    assert f.ranks == (("node02", 1007),) and isinstance(e, FlightEvidence) and (e.issued, e.usual) == (11, 12)
    assert f.title == ("rank 7 is behind in process group 2 (ranks 4-7): last collective issued #11 where 3 others "
                       "are at #12")


def test_two_ranks_that_call_two_groups_collectives_in_opposite_orders_are_one_crossed_pair() -> None:
    """Ranks 4 and 5 are in both tp_a (ranks 2-5) and tp_b (ranks 4-7); rank 5 called tp_b's collective first.
    Rank 4 waits in tp_a's #4, which rank 5 has not issued; rank 5 waits in tp_b's #4, which rank 4 has not. Said
    as one cycle of both, in rank order: the records do not say which order was meant."""
    def grp(name: str, seq: int, done: int) -> FlightGroup:
        return FlightGroup(name, "", seq, None, done, "gloo:all_reduce", global_name=name)

    def rec(r: int) -> FlightRecord:
        world = grp("0", 3, 3) if r > 1 else grp("0", 4, 3)
        tp_a, tp_b = grp("tp_a", 4 if r in (2, 3, 4) else 3, 3), grp("tp_b", 4 if r in (5, 6, 7) else 3, 3)
        return record([world] + ([tp_a] if 2 <= r <= 5 else []) + ([tp_b] if r >= 4 else []))
    a = analysed({r: rec(r) for r in range(8)})
    crossed = [(f, e) for f, e in lag(a) if isinstance(e, FlightEvidence) and e.stage == "crossed"]
    assert len(crossed) == 1 and not [f for f, e in lag(a) if e.stage == "issued" and f.ranks[0][1] in (1004, 1005)]
    f, e = crossed[0]
    assert f.confidence == "high" and set(f.ranks) == {("node02", 1004), ("node02", 1005)}
    assert f.title == ("rank 4 and rank 5 call the collectives of process groups tp_b and tp_a in opposite orders: "
                       "rank 4 waits in tp_a's #4, which rank 5 has not issued, and rank 5 in tp_b's #4, which rank 4 "
                       "has not issued")
    assert "Next: call the collectives of process groups tp_b and tp_a in one order on every rank" in a.verdict
