"""Issue 25, bad input that must not hurt, as a user meets it: the real command in a subprocess, where stdin,
signals and time are real. Ctrl+C ends it within a second wherever it waits (reading hosts from a pipe, between
samples), stdin closed is a message, and a --match pattern is bounded on the node (refused by name before it
gets there, and matching stops at the worker's budget)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cli import main
from waiting import wait_until
from workers import discover, patterns, procinfo

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)


def _hangscope(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), **kw)


def _reading_stdin(pid: int) -> bool:
    """Whether the process sleeps in read(2) on fd 0 (x86-64 and arm64 read are 0 and 63)."""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] in ("0", "63") and int(fields[1], 16) == 0


def _interrupt_within(proc: subprocess.Popen, seconds: float) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc.returncode, err, time.monotonic() - t0


def test_ctrl_c_while_hosts_are_read_from_a_silent_pipe_exits_130_at_once() -> None:
    proc = _hangscope("-", "--print", stdin=subprocess.PIPE)
    try:
        wait_until(lambda: _reading_stdin(proc.pid), 60, "hangscope to read its stdin")
        code, err, took = _interrupt_within(proc, 1.0)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
    assert code == 130 and "Traceback" not in err and took < 1.5, (code, err, took)


def test_a_closed_stdin_is_a_one_line_refusal() -> None:
    proc = _hangscope("-", "--print", stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(0))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err.count("\n") == 1 and "stdin is closed" in err, err


def test_ctrl_c_anywhere_in_the_command_line_is_130_without_a_traceback(capsys, monkeypatch) -> None:
    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("app.cli.build_parser", interrupted)  # as if Ctrl+C came while 5000 --pid are parsed
    assert main(["--pid", "1"] * 5000) == 130
    assert capsys.readouterr().err == "hangscope: interrupted\n"


def test_ctrl_c_between_samples_ends_the_wait_at_once(tmp_path: Path) -> None:
    """A local collection of one python process, then a 3600 s wait for the second sample: Ctrl+C there
    reports what the first sample found, at once."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    proc = None
    try:
        proc = _hangscope("--pid", str(target.pid), "--print", "--samples", "2", "--interval", "3600",
                          "--no-locals", stdin=subprocess.DEVNULL)
        assert proc.stderr is not None
        seen = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not re.search(r": (done|partial|failed)", seen):
            seen += proc.stderr.readline()  # the node's progress line: the first sample is over
        assert re.search(r": (done|partial|failed)", seen), seen
        time.sleep(0.5)  # into the wait
        code, err, took = _interrupt_within(proc, 1.0)
        assert code == 130 and "Traceback" not in err and took < 3.0, (code, err, took)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        target.kill()
        target.wait()


@pytest.mark.parametrize("pattern,why", [("(a+)+$", "a repeat inside a repeat"), ("(a|a)+$", "alternation"),
                                         ("(\\w+\\s?)*$", "a repeat inside a repeat"), ("(a)\\1", "back-reference"),
                                         (".*a.*b.*c.*d", "unbounded repeats"), ("a++", "Python 3.11"),
                                         ("a{99999999999}", "too large"), ("(", "not a regular expression")])
def test_a_pattern_that_cannot_be_searched_in_bounded_time_is_refused_by_name(capsys, pattern: str,
                                                                              why: str) -> None:
    assert main(["--print", "--match", pattern]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and repr(pattern) in err and why in err, err


@pytest.mark.parametrize("pattern", ["train\\.py", "python.*train.*--lr", "(foo|bar)+", "(\\w|\\d)+", "[a-z]+\\d+",
                                     "^python3? -m torch\\.distributed\\.run", "(?:--rank[= ]\\d+)"])
def test_ordinary_patterns_pass(pattern: str) -> None:
    assert patterns.problem(pattern) is None


def test_the_worker_refuses_such_a_pattern_at_its_trust_boundary() -> None:
    from workers import ops
    from workers.request import OpError, Request

    req = Request.__new__(Request)  # the request's own argument readers; refused before it touches its worker
    req.args = {"match": "(a+)+$"}
    with pytest.raises(OpError) as caught:
        ops._discover(req, lambda item: None)
    assert "(a+)+$" in str(caught.value) and "repeat inside a repeat" in str(caught.value)


class _Only(procinfo.ProcfsSource):
    def __init__(self, pids: list) -> None:
        self.only = pids

    def pids(self) -> list:
        return list(self.only)


def test_matching_on_a_node_stops_at_its_budget_and_says_which_pattern(monkeypatch) -> None:
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        monkeypatch.setattr(discover, "MATCH_BUDGET", -1.0)  # spent before the first command line
        scan = discover.Scan(_Only([target.pid]), me=-1)
        ranks = scan.ranks(match=re.compile("sleep"))
        assert ranks == []
        assert any("--match sleep: stopped after" in n for n in scan.notes), scan.notes
    finally:
        target.kill()
        target.wait()
