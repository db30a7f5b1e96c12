"""Who waits for whom inside a rank: a thread blocked entering `with X:` while another thread of the rank is
inside a `with X:` block; a cycle of such waits is a deadlock. Built in code from the shapes the worker reports
(the live versions are tests/live/test_scenarios.py's lock and deadlock cases)."""

from __future__ import annotations

from analysis_snapshots import ALL_REDUCE, rank, snapshot
from app.analysis import analyze
from app.analysis.locks import held, waiting
from app.model import Frame, Local, ThreadStack, WithInfo

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


# A lock used as a hand-off between threads: taken with acquire() by one, given back by another's release() (no
# `with` block to read). Other names, files and lines than any recorded job.
E = "/srv/exporter/export.py"
OWNER = "<Exporter at 0x7f00c0de1000>"


def _exporter_frame(fn: str, line: int, source: tuple, owner: str = OWNER) -> Frame:
    return Frame(fn, E, line, locals=(Local("self", owner, arg=True),), source=source)


def _acquiring() -> ThreadStack:
    at = _exporter_frame("Exporter.push", 212, ((211, "    def push(self, batch):"),
                                                (212, "        self._turn.acquire()  # one batch in flight"),
                                                (213, "        self.pending = batch")))
    return ThreadStack(tid=1, name="MainThread", frames=(at, Frame("train_step", F, 77)), state="S", is_main=True,
                       syscall="futex", wchan="futex_wait_queue")


def _flusher(owner: str = OWNER) -> ThreadStack:
    at = _exporter_frame("Exporter._drain", 240, ((239, "        try:"),
                                                  (240, "            reply = self.conn.recv(4)"),
                                                  (241, "        finally:"),
                                                  (242, "            self._turn.release()  # the next batch may go")),
                         owner)
    return ThreadStack(tid=2, name="drain", frames=(at, Frame("run", T, 982)), state="S",
                       syscall="recvfrom", wchan="unix_stream_read_generic")


def test_a_lock_taken_with_acquire_is_given_back_by_the_thread_whose_code_releases_that_object() -> None:
    a = analyze(snapshot(job_with((_acquiring(), _flusher()))))
    top = a.findings[0]
    assert top.kind != "native_call", top.title  # the line names its wait: a lock's, not unknown C code
    assert "blocked in `Lock.acquire`" in top.title and "waiting for the lock `self._turn`" in top.title, top.title
    assert ("which its thread `drain` gives back (`self._turn.release()` in `Exporter._drain`, export.py:242); "
            "that one is blocked in `socket.recv`") in top.title, top.title
    assert not any(f.kind == "native_call" for f in a.findings)


def test_a_release_of_another_object_of_the_same_name_does_not_make_its_thread_the_releaser() -> None:
    a = analyze(snapshot(job_with((_acquiring(), _flusher(owner="<Exporter at 0x7f00c0de2000>")))))
    top = a.findings[0]
    assert "gives back" not in top.title and "drain" not in top.title, top.title
    assert "no thread is inside a block of that lock" in top.title, top.title


def test_a_with_header_whose_own_call_waits_in_another_system_call_is_not_a_lock() -> None:
    """`with open(path) as f:` blocked in openat (a FIFO nobody reads) waits in the open, not for a lock; the same
    header asleep in futex, or with nothing read from the kernel, stays a lock's wait."""
    header = Frame("write_state", F, 88, withs=(WithInfo(88, 90, "with open(path, 'wb') as f:", ("open(path, 'wb')",),
                                                         True),),
                   source=((88, "        with open(path, 'wb') as f:"),))
    assert waiting(ThreadStack(tid=5, name="saver", frames=(header,), state="S", syscall="openat")) is None
    assert waiting(ThreadStack(tid=5, name="saver", frames=(header,), state="S", syscall="futex")) is not None
    assert waiting(ThreadStack(tid=5, name="saver", frames=(header,), state="S")) is not None


def test_a_lock_whose_futex_other_processes_share_names_the_file_and_who_to_look_for() -> None:
    """A semaphore shared between processes (the node read its futex as not private, in a file under /dev/shm): no
    thread of the rank holds it, and the holder is another process, or one that ended holding it; the next step
    says how to find who maps it and what to do when nobody does."""
    from app.model import KernelWait

    shared = ThreadStack(tid=1, name="MainThread", frames=_acquiring().frames, state="S", is_main=True,
                         syscall="futex", wchan="futex_do_wait",
                         waits=KernelWait(syscall="futex", family="futex", address="0x7f33aa000000",
                                          path="/dev/shm/sem.batch-turn",
                                          notes=("a futex shared between processes (not private to this one), in "
                                                 "/dev/shm/sem.batch-turn",)))
    text = analyze(snapshot(job_with((shared,)))).verdict
    assert "waiting for the lock `self._turn`; no thread of this process holds it, and it is shared between " \
        "processes" in text, text
    assert "Next: find who maps /dev/shm/sem.batch-turn (`grep -l /dev/shm/sem.batch-turn /proc/[0-9]*/maps` on " \
        "node01)" in text, text
    assert "remove it (`rm /dev/shm/sem.batch-turn`) and restart" in text
