"""Pair isolation as a schedule: one bad node or one bad link is named, for any node count.

Never its innocent neighbours; each round's tests are disjoint, and no pair is tested twice. The outcomes
come from a fault model (which pairs a broken node or link would fail): the schedule is pure logic, the
real runs are in tests/gpu/test_gpu_cluster.py.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.gpu.schedule import Outcome, PairIsolation

FAST, SLOW = 10.0, 0.4


def simulate(n: int, fault: tuple[str, object], **kw) -> tuple[PairIsolation, list[list[tuple[str, ...]]]]:
    units = [f"node{i:02d}" for i in range(1, n + 1)]
    sched = PairIsolation(units, **kw)
    rounds = []
    while tests := sched.next_round():
        rounds.append(tests)
        for t in tests:
            kind, who = fault
            status, bw = "ok", FAST if len(t) == 2 else 0.0
            if len(t) == 1 and kind == "dead" and t[0] == who:
                status = "failed"
            if len(t) == 2:
                if kind == "slow" and who in t:
                    bw = SLOW
                if kind == "fail" and who in t:
                    status = "failed"
                if kind == "link" and set(t) == set(who):  # type: ignore[arg-type]
                    status = "hung"
            sched.record(t, Outcome(status, bw if status == "ok" else None, run_id="-".join(t)))
    return sched, rounds


def check_rounds(rounds: list[list[tuple[str, ...]]], retested: frozenset = frozenset()) -> None:
    seen: set[frozenset[str]] = set()
    for tests in rounds:
        used = [u for t in tests for u in t]
        assert len(used) == len(set(used)), f"a unit appears twice in one round: {tests}"
        for t in tests:
            if len(t) == 2:
                if frozenset(t) in seen:
                    assert frozenset(t) in retested, f"pair {t} tested twice"
                    retested = retested - {frozenset(t)}  # a slow link is confirmed once, never more
                seen.add(frozenset(t))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(4, 12), data=st.data())
def test_one_slow_or_failing_node_is_named_and_nobody_else(n: int, data: st.DataObject) -> None:
    bad = f"node{data.draw(st.integers(1, n)):02d}"
    kind = data.draw(st.sampled_from(["slow", "fail"]))
    sched, rounds = simulate(n, (kind, bad), singles=False)
    check_rounds(rounds, retested=frozenset(sched.retested))
    report = sched.report()
    assert [(f.kind, f.units) for f in report.faults] == [("node", (bad,))], report.verdict
    assert report.faults[0].how == ("slow" if kind == "slow" else "failed")
    assert bad in report.verdict and not report.inconclusive
    # one pair round, then one round of re-pairing with known-good nodes; a slow result is measured twice,
    # which adds a confirming round after each of those
    assert len(rounds) <= (3 if kind == "fail" else 5)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(3, 12), data=st.data())
def test_a_blocked_link_is_named_as_the_link_when_its_pair_is_tested(n: int, data: st.DataObject) -> None:
    a = data.draw(st.integers(1, n))
    b = data.draw(st.integers(1, n).filter(lambda x: x != a))
    link = (f"node{a:02d}", f"node{b:02d}")
    sched, rounds = simulate(n, ("link", link), all_pairs=True, singles=False)
    check_rounds(rounds, retested=frozenset(sched.retested))
    report = sched.report()
    assert [(f.kind, set(f.units), f.how) for f in report.faults] == [("link", set(link), "hung")], report.verdict
    assert f"{link[0]}<->{link[1]}" in report.verdict or f"{link[1]}<->{link[0]}" in report.verdict
    assert report.untested_links == 0


def test_first_round_pairs_neighbours_and_a_blocked_link_there_is_resolved_by_re_pairing() -> None:
    sched, rounds = simulate(6, ("link", ("node01", "node02")), singles=False)
    assert rounds[0] == [("node01", "node02"), ("node03", "node04"), ("node05", "node06")]
    assert sorted(map(sorted, rounds[1])) == [["node01", "node03"], ["node02", "node04"]]  # known-good partners
    report = sched.report()
    assert report.verdict.startswith("the link node01<->node02 is broken (hangs)")
    assert report.cell("node02", "node01").status == "hung"
    assert report.cell("node05", "node06").status == "ok" and report.cell("node01", "node06") is None


def test_a_node_that_fails_alone_is_named_broken_and_never_paired() -> None:
    sched, rounds = simulate(4, ("dead", "node02"))
    assert rounds[0] == [("node01",), ("node02",), ("node03",), ("node04",)]
    assert all("node02" not in t for r in rounds[1:] for t in r)
    report = sched.report()
    assert [(f.kind, f.units, f.how) for f in report.faults] == [("node", ("node02",), "failed")]
    assert report.verdict.startswith("node node02 is broken")


def test_healthy_nodes_give_no_fault_and_say_how_many_links_were_not_tested() -> None:
    sched, rounds = simulate(6, ("none", None), singles=False)
    assert len(rounds) == 1
    report = sched.report()
    assert not report.faults and not report.inconclusive
    assert report.verdict == ("no fault found: 3 pair(s) ok (busbw 10-10 GB/s); 12 pair(s) not tested "
                              "(all-pairs mode tests every link)")


def test_two_nodes_cannot_tell_which_end_is_at_fault() -> None:
    sched, _ = simulate(2, ("fail", "node02"), singles=False)
    report = sched.report()
    assert not report.faults and report.inconclusive == ("node01-node02 failed",)
    assert "cannot tell which end" in report.verdict


def test_slow_is_relative_to_the_median_or_an_absolute_floor() -> None:
    sched = PairIsolation(["a", "b", "c", "d"], singles=False)
    assert sched.next_round() == [("a", "b"), ("c", "d")]
    sched.record(("a", "b"), Outcome("ok", 9.0))
    sched.record(("c", "d"), Outcome("ok", 8.0))
    assert sched.next_round() == []  # both pairs within 50% of the median: nothing to resolve
    assert [c.status for c in sched.report().cells] == ["ok", "ok"]
    floor = PairIsolation(["a", "b"], singles=False, min_busbw=20.0)
    floor.record(floor.next_round()[0], Outcome("ok", 9.0))
    assert floor.report().cells[0].status == "slow"


def test_gpu_scope_verdicts_name_the_node() -> None:
    sched = PairIsolation(["0", "1", "2", "3"], scope="node03", singles=False)
    for t in sched.next_round():
        sched.record(t, Outcome("failed" if "2" in t else "ok", None if "2" in t else 5.0))
    for t in sched.next_round():
        sched.record(t, Outcome("failed" if "2" in t else "ok", None if "2" in t else 5.0))
    report = sched.report()
    assert report.verdict.startswith("node03: GPU 2's link is broken")


def test_a_slow_link_is_confirmed_by_a_retest_and_a_noisy_one_is_cleared() -> None:
    """A slow pair is measured again; the link is named only if it is slow again."""
    for second, named in ((SLOW, True), (FAST, False)):
        sched = PairIsolation(["a", "b", "c", "d"], singles=False)
        measured: dict = {}
        rounds = []
        while tests := sched.next_round():
            rounds.append(tests)
            for t in tests:
                key = frozenset(t)
                bw = FAST if key != {"a", "b"} else (SLOW if key not in measured else second)
                measured[key] = measured.get(key, 0) + 1
                sched.record(t, Outcome("ok", bw))
        check_rounds(rounds, retested=frozenset(sched.retested))
        assert measured[frozenset("ab")] == 2, rounds
        report = sched.report()
        if named:
            assert [(f.kind, f.units) for f in report.faults] == [("link", ("a", "b"))], report.verdict
            assert "again when retested" in report.faults[0].evidence
        else:
            assert not report.faults and not report.inconclusive, report.verdict
