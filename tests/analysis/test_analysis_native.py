"""Threads held in native code (app/analysis/native.py), built in code from what the worker reports: py-spy's
GIL flag and innermost Python frame, /proc's state, system call and wchan. The live versions are
tests/live/test_scenarios.py's gil, native and pipe cases, and their goldens."""

from __future__ import annotations

import dataclasses

from analysis_snapshots import ALL_REDUCE, rank, snapshot
from app.analysis import analyze
from app.model import Frame, KernelWait, OtherEnd, ThreadStack, WaitFd

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


def test_the_gil_kept_in_a_socket_read_says_who_is_at_the_socket_s_other_end() -> None:
    """The node read the call's fd: a unix socket whose peer is a local agent (a ctypes.PyDLL recv on it)."""
    sock = WaitFd(15, "socket:[6308864]", "socket", "read", "unix", peer="/run/node-agent.sock",
                  others=(OtherEnd("peer", 303, "python", "S", cmdline=("node-agent", "--socket", "/run/node-agent.sock")),))
    reading = dataclasses.replace(main_thread(CALL, Frame("train", F, 90), syscall="recvfrom", gil=True),
                                  wchan="unix_stream_read_generic",
                                  waits=KernelWait("recvfrom", "fd", fd=15, fds=(sock,)))
    # the main thread's own call: what it waits for leads (the node read it), the GIL kept is said beside it, and
    # the next step is about the peer, not the C frames
    a = analyze(snapshot(job_with(reading, helper())))
    top = a.findings[0]
    assert top.kind == "blocked", top
    assert "waiting for data from `/run/node-agent.sock`; its peer is pid 303 `node-agent --socket " \
           "/run/node-agent.sock`; it holds the GIL in that call (native code that did not release it), so the " \
           "rank's other Python thread cannot run until it returns" in top.title, top.title
    assert "`py-spy dump --pid 303`" in a.verdict.split("Next:")[1], a.verdict
    # a helper thread keeping the GIL in the same call stops the main thread: that is the cause, said as such
    helping = dataclasses.replace(reading, tid=1501, name="host-stats", is_main=False)
    top = analyze(snapshot(job_with(main_thread(Frame("wait", T, 320), Frame("train", F, 90), syscall="futex"),
                                    helping))).findings[0]
    assert top.kind == "gil_held", top
    assert "it sleeps in `recvfrom`, waiting for data from `/run/node-agent.sock`; its peer is pid 303 " \
           "`node-agent --socket /run/node-agent.sock`; its other Python thread" in top.title, top.title


def test_a_native_call_without_the_gil_that_sleeps_for_ever_is_named() -> None:
    a = analyze(snapshot(job_with(main_thread(CALL, Frame("train", F, 90), syscall="futex"), helper())))
    top = a.findings[0]
    assert top.kind == "native_call" and top.confidence == "high"
    assert top.title.startswith("rank 1's main thread is inside a native call that does not return, made at "
                                "`compress` (train.py:50): it sleeps in `futex` with the GIL released")


def test_python_waits_are_not_native_calls() -> None:
    """time.sleep (nanosleep), a socket read, a threading wait (a library frame innermost) and a running thread
    holding the GIL are Python's own: no native finding; the stack finding leads, or, where the wait model names
    the wait (threading's Condition.wait), its "blocked" finding does."""
    cases = [main_thread(CALL, syscall="clock_nanosleep"), main_thread(CALL, syscall="recvfrom"),
             main_thread(Frame("wait", T, 320), Frame("train", F, 90), syscall="futex"),
             main_thread(CALL, syscall="running", gil=True, state="R")]
    for t in cases:
        kinds = [f.kind for f in analyze(snapshot(job_with(t))).findings]
        found = analyze(snapshot(job_with(t))).findings
        assert not {"gil_held", "native_call", "pipe_write"} & set(kinds), (t, kinds)
        if t.frames[0].function == "wait":
            assert kinds[0] == "blocked" and "blocked in `Condition.wait`" in found[0].title, (t, kinds)
        else:
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


def _piped(readers: list, complete: bool = True) -> tuple:
    """The job, rank 1 blocked writing to pipe:[77], with the node's reading of the pipe decoded as it arrives."""
    import dataclasses

    from app.decode.replies import process_hold

    log = Frame("log", F, 70, source=((70, "        self.pipe.write(text)"),))
    ranks = job_with(main_thread(log, Frame("train", F, 90), syscall="write", wchan="pipe_write"))
    hold = process_hold({"kind": "sleeping", "state": "S", "pipe": {"tid": 1, "syscall": "write", "pipe": "pipe:[77]",
                                                                    "readers": readers, "complete": complete}})
    assert hold is not None and not hold.held  # a pipe does not hold the process: its write blocks it
    return tuple(dataclasses.replace(r, hold=hold) if r.rank == 1 else r for r in ranks)


def test_the_process_holding_the_full_pipes_read_end_is_named_with_what_it_does() -> None:
    ranks = _piped([{"pid": 4242, "comm": "sleep", "state": "S", "ppid": ranks_pid(1), "wchan": "hrtimer_nanosleep",
                     "cmdline": ["sleep", "86400"], "fd": 0}])
    top = analyze(snapshot(ranks)).findings[0]
    assert top.kind == "pipe_write" and top.confidence == "high"
    assert top.title == ("rank 1's main thread is blocked writing to a full pipe in `log` (train.py:70): pid 4242 "
                         "`sleep 86400` (its child), which holds its read end, does not read")
    assert ("pid 4242 `sleep 86400` (its child) holds the read end of pipe:[77] and is asleep in hrtimer_nanosleep"
            in top.detail)
    stopped = _piped([{"pid": 4242, "comm": "tee", "state": "T", "ppid": 1, "cmdline": ["tee", "log\x1b[2J"]}])
    top = analyze(snapshot(stopped)).findings[0]
    # every reader stopped (a `| tee` stopped with Ctrl-Z): the title says so, and resuming it is the next step
    assert "pid 4242 `tee log\u241b[2J`, which holds its read end, is stopped: it does not read" in top.title
    assert "\x1b" not in top.title + top.detail  # ESC shown, inert
    assert "is stopped" in top.detail
    verdict = analyze(snapshot(stopped)).verdict
    assert "Next: `kill -CONT 4242` on node01 resumes the pipe's reader" in verdict, verdict


def test_a_pipe_with_no_reader_or_the_rank_itself_as_reader_says_so() -> None:
    alone = analyze(snapshot(_piped([]))).findings[0]
    assert alone.title.endswith("the process reading the other end has stopped reading")
    assert "No process holds pipe:[77] open for reading" in alone.detail
    partial = analyze(snapshot(_piped([], complete=False))).findings[0]
    assert "searched for the other end of pipe:[77] within its limits" in partial.detail
    itself = analyze(snapshot(_piped([{"pid": ranks_pid(1), "comm": "python3", "state": "S", "ppid": 1}])))
    assert itself.findings[0].title.endswith(": rank 1 itself, which holds its read end, does not read")


def test_a_child_reading_the_full_pipe_that_is_itself_blocked_writing_its_output_is_a_two_way_pipe() -> None:
    """The rank feeds a filter child (`zstd -c`) through its stdin while the child's stdout, piped back to the rank,
    is full: the child does not read because its own output is not read."""
    ranks = _piped([{"pid": 5150, "comm": "zstd", "state": "S", "ppid": ranks_pid(1), "wchan": "anon_pipe_write",
                     "cmdline": ["zstd", "-q", "-c"], "fd": 0}])
    a = analyze(snapshot(ranks))
    assert a.findings[0].title.endswith("pid 5150 `zstd -q -c` (its child), which holds its read end, does not read: "
                                        "it is itself blocked writing to a full pipe (its own output is not read)")
    assert ("Next: its child waits for its output to be read while the rank waits for it to read its input" in
            a.verdict and "`communicate()`" in a.verdict), a.verdict
    # a reader that is not the rank's child, blocked writing elsewhere: said, but no Popen reading
    other = analyze(snapshot(_piped([{"pid": 5151, "comm": "logger", "state": "S", "ppid": 1,
                                      "wchan": "pipe_write", "cmdline": ["logger", "-t", "job"], "fd": 0}])))
    assert other.findings[0].title.endswith("it is itself blocked writing to a full pipe (its own output is not read)")
    assert "communicate()" not in other.verdict and "make the pipe's reader read" in other.verdict


def ranks_pid(number: int) -> int:
    return next(r.pid for r in job_with() if r.rank == number)


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


def test_a_fifo_opened_by_native_code_that_keeps_the_gil_is_the_fifo_s_wait_not_the_c_frames() -> None:
    """A C extension opens its output path with the GIL held (a serializer's writer), and the path is a FIFO that no
    process reads: the node read the open; what it waits for leads, not "see the C frames"."""
    path = "/scratch/export/shard-3.bin"
    opening = dataclasses.replace(
        main_thread(Frame("Writer.__init__", "/opt/venv/lib/python3.11/site-packages/fastio/writer.py", 40,
                          source=((40, "        self._h = _C.open_writer(path)"),)),
                    Frame("export", F, 77), syscall="openat", gil=True),
        wchan="wait_for_partner", waits=KernelWait("openat", "open", fds=(WaitFd(None, path, "fifo", "write"),),
                                                    path=path))
    a = analyze(snapshot(job_with(opening, helper())))
    assert a.findings[0].kind == "blocked", a.findings[0]
    assert f"waiting for a process to open the FIFO (`{path}`) for reading" in a.verdict, a.verdict
    assert "so the rank's other Python thread cannot run until it returns" in a.verdict, a.verdict
    assert "C frames" not in a.verdict.split("Next:")[1] and "O_NONBLOCK" in a.verdict, a.verdict
