"""Threads held in native code (app/analysis/native.py), built in code from what the worker reports: py-spy's
GIL flag and innermost Python frame, /proc's state, system call and wchan. The live versions are
tests/live/test_scenarios.py's gil, native and pipe cases, and their goldens."""

from __future__ import annotations

from analysis_snapshots import ALL_REDUCE, rank, snapshot
from app.analysis import analyze
from app.model import Frame, ThreadStack

F = "/job/train.py"
T = "/usr/lib/python3.11/threading.py"


def main_thread(*frames: Frame, syscall: str, wchan: str = "", gil: bool = False, state: str = "S") -> ThreadStack:
    return ThreadStack(tid=1, name="MainThread", frames=frames, state=state, syscall=syscall, wchan=wchan,
                       owns_gil=gil, is_main=True)


def helper() -> ThreadStack:
    return ThreadStack(tid=2, name="shard-reader", frames=(Frame("read_shards", F, 30),), state="S",
                       syscall="futex", wchan="futex_do_wait")


def job_with(*threads: ThreadStack) -> tuple:
    ranks = [rank(r, "node01" if r < 2 else "node02", ALL_REDUCE, world=4) for r in (0, 2, 3)]
    odd = rank(1, "node01", (), world=4, threads=threads)
    return tuple(sorted([*ranks, odd], key=lambda r: r.rank))


CALL = Frame("compress", F, 50, source=((50, "    lib.compress_all()"),))


def test_the_gil_kept_in_a_sleeping_native_call_is_the_headline() -> None:
    a = analyze(snapshot(job_with(main_thread(CALL, Frame("train", F, 90), syscall="pause", gil=True), helper())))
    top = a.findings[0]
    assert top.kind == "gil_held" and top.confidence == "high"
    assert top.title == ("rank 1's main thread holds the GIL while blocked in native code called from `compress` "
                         "(train.py:50): it sleeps in `pause`; its other Python thread, thread `shard-reader`, "
                         "cannot run")
    assert "`lib.compress_all()`" in top.detail and "py-spy dump --native" in top.detail


def test_a_native_call_without_the_gil_that_sleeps_for_ever_is_named() -> None:
    a = analyze(snapshot(job_with(main_thread(CALL, Frame("train", F, 90), syscall="futex"), helper())))
    top = a.findings[0]
    assert top.kind == "native_call" and top.confidence == "high"
    assert top.title.startswith("rank 1's main thread is inside a native call that does not return, made at "
                                "`compress` (train.py:50): it sleeps in `futex` with the GIL released")


def test_python_waits_are_not_native_calls() -> None:
    """time.sleep (nanosleep), a socket read, a threading wait (a library frame innermost) and a running thread
    holding the GIL are Python's own: no native finding, the stack finding leads."""
    cases = [main_thread(CALL, syscall="clock_nanosleep"), main_thread(CALL, syscall="recvfrom"),
             main_thread(Frame("wait", T, 320), Frame("train", F, 90), syscall="futex"),
             main_thread(CALL, syscall="running", gil=True, state="R")]
    for t in cases:
        kinds = [f.kind for f in analyze(snapshot(job_with(t))).findings]
        assert not {"gil_held", "native_call", "pipe_write"} & set(kinds), (t, kinds)
        assert kinds[0] == "minority_stack", (t, kinds)


def test_a_write_to_a_full_pipe_is_named() -> None:
    log = Frame("log", F, 70, source=((70, "        self.pipe.write(text)"),))
    for wchan in ("pipe_write", "anon_pipe_write"):  # the kernel's name before and after 6.x
        a = analyze(snapshot(job_with(main_thread(log, Frame("train", F, 90), syscall="write", wchan=wchan))))
        top = a.findings[0]
        assert top.kind == "pipe_write" and top.confidence == "high", wchan
        assert top.title == ("rank 1's main thread is blocked writing to a full pipe in `log` (train.py:70): the "
                             "process reading the other end has stopped reading")
    # a write to a socket is not a pipe
    a = analyze(snapshot(job_with(main_thread(log, syscall="write", wchan="sk_stream_wait_memory"))))
    assert a.findings[0].kind != "pipe_write"


def test_a_rank_the_stacks_do_not_single_out_is_not_high() -> None:
    """Every rank in the same native call: it is named, but not [high] (nothing says the others wait for it)."""
    threads = (main_thread(CALL, Frame("train", F, 90), syscall="pause"),)
    ranks = tuple(rank(r, "node01", (), world=2, threads=threads) for r in (0, 1))
    found = [f for f in analyze(snapshot(ranks)).findings if f.kind == "native_call"]
    assert found and all(f.confidence == "medium" for f in found)


def test_a_library_waiting_for_its_thread_pool_with_the_gil_is_not_named() -> None:
    """torch's CPU ops hold the GIL and wait (futex) for their intra-op workers: seen on a running, throttled
    job. Not a native call that never returns."""
    torch_call = Frame("_wrapped_call_impl", "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1778)
    t = main_thread(torch_call, Frame("train", F, 90), syscall="futex", gil=True)
    kinds = [f.kind for f in analyze(snapshot(job_with(t, helper()))).findings]
    assert "gil_held" not in kinds and "native_call" not in kinds, kinds


def test_a_futex_wait_with_the_gil_in_a_single_threaded_rank_is_not_named() -> None:
    """`x = torch.randn(...)` at module level: the job's own line, a torch op holding the GIL that waits for its
    pool; with no other Python thread there is nothing the GIL holds up, and it is a moment of a running job."""
    t = main_thread(Frame("<module>", F, 61), syscall="futex", gil=True)
    kinds = [f.kind for f in analyze(snapshot(job_with(t))).findings]
    assert "gil_held" not in kinds and "native_call" not in kinds, kinds
    # the same wait with a Python thread it holds up is named
    kinds = [f.kind for f in analyze(snapshot(job_with(t, helper()))).findings]
    assert kinds[0] == "gil_held", kinds
