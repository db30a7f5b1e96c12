"""When the headless CLI takes its next sample, and that it answers before its workers have finished closing
but never returns before they have."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.cli.headless import next_sample_delay
from app.cli.run import run_interruptible
from app.model import RankSnapshot, Snapshot
from procstate import describe


def _snap(*dump_started):
    ranks = tuple(RankSnapshot(node="n1", pid=100 + i, start_time=1, dump_started=t)
                  for i, t in enumerate(dump_started))
    return Snapshot(taken_at=0.0, duration=1.0, hangscope_version="t", ranks=ranks)


def test_the_interval_counts_from_when_the_pass_began_dumping():
    # dumps began 0.4 s ago (the earliest one), the pass ended now: 0.6 s more make the 1 s between samples
    assert next_sample_delay(_snap(1000.0, 1000.2, None), 1.0, 1000.4) == pytest.approx(0.6)


def test_no_wait_once_the_interval_has_passed_since_the_dumps():
    assert next_sample_delay(_snap(1000.0), 1.0, 1001.5) == 0.0


def test_without_a_dump_time_the_whole_interval_is_waited():
    assert next_sample_delay(_snap(None, None), 2.5, 1000.0) == 2.5
    assert next_sample_delay(_snap(), 2.5, 1000.0) == 2.5


def test_never_more_than_the_interval_whatever_the_node_clocks_say():
    # a dump time ahead of the login clock (a node clock estimated wrongly) cannot stretch the wait
    assert next_sample_delay(_snap(1005.0), 1.0, 1000.0) == 1.0


def _closing_run(after):
    """run_interruptible with a coroutine that leaves a 0.3 s 'closing' behind, as collect_and_report does."""
    events: list[tuple[str, float]] = []
    finish: list = []

    async def main() -> str:
        async def close() -> None:
            await asyncio.sleep(0.3)
            events.append(("closed", time.monotonic()))
        finish.append(asyncio.ensure_future(close()))
        return "snapshot"

    def answer(result: object) -> str:
        events.append(("answered", time.monotonic()))
        return after(result)

    return run_interruptible(main, lambda: None, after=answer, finish=finish), events


def test_the_answer_comes_before_the_closing_ends_and_the_command_returns_after_it():
    result, events = _closing_run(lambda r: f"report of {r}")
    assert result == "report of snapshot"
    assert [e for e, _ in events] == ["answered", "closed"]


def test_the_closing_is_waited_for_even_when_the_answer_fails():
    def fail(result: object) -> str:
        raise KeyboardInterrupt  # Ctrl+C while the summary is printed

    seen: list[str] = []
    finish: list = []

    async def main() -> None:
        async def close() -> None:
            await asyncio.sleep(0.2)
            seen.append("closed")
        finish.append(asyncio.ensure_future(close()))

    with pytest.raises(KeyboardInterrupt):
        run_interruptible(main, lambda: None, after=fail, finish=finish)
    assert seen == ["closed"]


_TWICE = r'''
import asyncio, sys, time
from app.cli.run import run_interruptible

stop = asyncio.Event()

async def main():
    print("collecting", flush=True)
    await stop.wait()  # until the first Ctrl+C cancels the collection
    return "partial"

def report(result):
    print("reporting", flush=True)
    # a long summary: the second Ctrl+C lands here. Python code that runs, as the summary is, not one 30 s
    # C-level sleep: CPython runs a signal's handler between bytecodes and checks for one only after a
    # sleep's system call is interrupted, so a signal that arrives after the last check and before
    # clock_nanosleep starts (a loaded machine's reader preempting this writer) waited for the whole sleep
    end = time.monotonic() + 30
    while time.monotonic() < end:
        time.sleep(0.05)
    return 0

run_interruptible(main, stop.set, after=report)
print("returned", flush=True)
'''


def test_a_second_ctrl_c_while_the_summary_is_written_aborts_at_once():
    """The promise 'Ctrl+C again to abort' holds once the collection has returned and the summary is being
    written (outside the event loop), not only inside the collection."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", _TWICE], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(repo)))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "collecting"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "reporting"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:  # say what the child was doing: stopped, traced, the signal masked...
            raise AssertionError(f"not aborted 20 s after the second Ctrl+C: {describe(proc.pid)}") from None
    finally:
        proc.kill()
        proc.communicate()  # its pipes closed, whatever happened
    assert proc.returncode == 130, err
    assert "aborted" in err and "returned" not in out and "Traceback" not in err, (out, err)
    assert time.monotonic() - t0 < 10, "aborted at once, not after the 30 s summary"


_IGNORED = r'''
import asyncio, signal, sys
from app.cli.run import run_interruptible

async def main():
    print("collecting", flush=True)
    await asyncio.sleep(2.0)  # the Ctrl+C lands here
    return "whole"

def report(result):
    print(f"reporting {result}", flush=True)
    return 0

run_interruptible(main, lambda: print("cancelled", flush=True), after=report)
print("still ignored" if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else "handler changed", flush=True)
'''


def test_started_with_sigint_ignored_a_ctrl_c_is_not_for_it_and_stays_ignored():
    """A shell without job control (a script's `cmd &`, nohup) starts background commands with SIGINT ignored, so
    the Ctrl+C typed for the foreground command does not reach them: the collection goes on to its end, and
    SIGINT is still ignored after it (the event loop's handler neither installed nor replaced by the default)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", _IGNORED], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(repo)),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "collecting"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.split("\n")[:2] == ["reporting whole", "still ignored"], (out, err)
    assert "cancel" not in out + err, (out, err)


_LATE = r'''
import asyncio, os, signal, sys, time
from app.cli.run import run_interruptible

async def main():
    os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl+C: cancels the collection
    await asyncio.sleep(0.2)
    return "partial"

def report(result):
    print("reporting", flush=True)
    return 0

run_interruptible(main, lambda: print("cancelled", flush=True), after=report)
print("returned", flush=True)
os.kill(os.getpid(), signal.SIGINT)  # a second one after the summary, on the way out (where the loop let go of it)
time.sleep(5)
print("survived", flush=True)
'''


def test_after_a_first_ctrl_c_a_second_one_aborts_wherever_it_lands():
    """Once a first Ctrl+C has cancelled the collection, every later one aborts at once (130, "aborted"), also
    where no event loop listens any more (the summary written, the command on its way out): Python's default
    handler never takes it back as a KeyboardInterrupt ("interrupted" after the closing is awaited: a loaded
    machine's second Ctrl+C landed between the loop's handler and the abort's)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _LATE], cwd=repo, capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, PYTHONPATH=str(repo)))
    assert proc.returncode == 130, (proc.stdout, proc.stderr)
    assert proc.stdout.split() == ["cancelled", "reporting", "returned"], proc.stdout
    assert "aborted" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
