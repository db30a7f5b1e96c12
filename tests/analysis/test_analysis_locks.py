"""Who waits for whom inside a rank: a thread blocked entering `with X:` while another thread of the rank is
inside a `with X:` block; a cycle of such waits is a deadlock. Built in code from the shapes the worker reports
(the live versions are tests/live/test_scenarios.py's lock and deadlock cases)."""

from __future__ import annotations

from analysis_snapshots import ALL_REDUCE, rank, snapshot
from app.analysis import analyze
from app.analysis.locks import held, waiting
from app.model import Frame, ThreadStack, WithInfo

F = "/job/train.py"
T = "/usr/lib/python3.11/threading.py"


def at_with(fn: str, line: int, lock: str, entering: bool, *, outer: tuple = ()) -> Frame:
    return Frame(fn, F, line, withs=(*outer, WithInfo(line if entering else line - 2, line + 5, f"with {lock}:",
                                                      (lock,), entering)),
                 source=((line, f"    with {lock}:" if entering else "    upload.wait()"),))


def thread(tid: int, name: str, *frames: Frame, active: bool = False, main: bool = False) -> ThreadStack:
    return ThreadStack(tid=tid, name=name, frames=frames, state="R" if active else "S", active=active, is_main=main)


def waiter() -> ThreadStack:
    return thread(1, "MainThread", at_with("log_metrics", 40, "_metrics_lock", True), Frame("train", F, 90),
                  main=True)


def holder(active: bool = False) -> ThreadStack:
    return thread(2, "checkpoint-writer", Frame("wait", T, 320), Frame("wait", T, 600),
                  at_with("save", 60, "_metrics_lock", False), Frame("run", F, 55), active=active)


def job_with(threads: tuple) -> tuple:
    ranks = [rank(r, "node01" if r < 2 else "node02", ALL_REDUCE, world=4) for r in (0, 2, 3)]
    odd = rank(1, "node01", (), world=4, threads=threads)
    return tuple(sorted([*ranks, odd], key=lambda r: r.rank))


def test_a_thread_entering_a_with_block_waits_and_one_inside_it_holds() -> None:
    w = waiting(waiter())
    assert w is not None and w.key == (F, "_metrics_lock") and w.header == "with _metrics_lock:"
    assert held(holder()) == {(F, "_metrics_lock")}
    assert waiting(thread(3, "busy", at_with("log_metrics", 40, "_metrics_lock", True), active=True)) is None


def test_a_condition_being_waited_on_is_released_not_held() -> None:
    cond = Frame("get", F, 70, withs=(WithInfo(68, 75, "with self.not_empty:", ("self.not_empty",)),),
                 source=((70, "        self.not_empty.wait()"),))
    assert held(thread(4, "reader", Frame("wait", T, 320), cond)) == set()


def test_the_culprits_lock_and_its_holder_are_the_headline() -> None:
    a = analyze(snapshot(job_with((waiter(), holder()))))
    top = a.findings[0]
    assert top.kind == "lock_wait" and top.confidence == "high"
    assert top.title == ("rank 1's main thread waits for `_metrics_lock`, which its thread `checkpoint-writer` "
                         "holds while it is in `save` (train.py:60), in `wait`")
    assert a.findings[1].kind == "minority_stack"  # the stacks' own lead stays, second


def test_a_holder_that_is_running_may_let_go_soon_so_the_finding_is_low() -> None:
    f = next(f for f in analyze(snapshot(job_with((waiter(), holder(active=True))))).findings
             if f.kind == "lock_wait")
    assert f.confidence == "low" and "runs in" in f.detail


def test_a_waiter_with_no_visible_holder_says_so_with_low_confidence() -> None:
    f = next(f for f in analyze(snapshot(job_with((waiter(), thread(2, "idle", Frame("sleep", F, 10)))))).findings
             if f.kind == "lock_wait")
    assert f.confidence == "low" and "no thread of it is in that block" in f.title
    assert "acquire() elsewhere, or by a thread that is gone" in f.detail


def test_two_threads_each_holding_what_the_other_needs_are_a_deadlock() -> None:
    outer_m = WithInfo(30, 45, "with _metrics_lock:", ("_metrics_lock",))
    outer_w = WithInfo(50, 60, "with _weights_lock:", ("_weights_lock",))
    main = thread(1, "MainThread", at_with("log", 35, "_weights_lock", True, outer=(outer_m,)), main=True)
    other = thread(2, "checkpoint-writer", at_with("run", 55, "_metrics_lock", True, outer=(outer_w,)))
    top = analyze(snapshot(job_with((main, other)))).findings[0]
    assert top.kind == "lock_wait" and top.confidence == "high"
    assert top.title == "rank 1 is deadlocked: its main thread and thread `checkpoint-writer` wait for each other's locks"


def test_ranks_with_no_with_blocks_cost_no_holds_reading() -> None:
    # the common case at scale: no waiting thread, so nothing else is read (and nothing is found)
    assert [f for f in analyze(snapshot(job_with((thread(1, "MainThread", Frame("x", F, 1), main=True),)))).findings
            if f.kind == "lock_wait"] == []
