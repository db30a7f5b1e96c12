"""The process-group timeout a rank's script sets, read from its source on the node (never run): timedelta
literals, a name bound once to one, the shortest of several; an expression that needs the script to run is
'set but unreadable'; the script found from a real process's command line and cwd; FIFOs never opened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from workers.collect import pgtimeout


def test_literal_timeouts_are_read_and_the_shortest_wins() -> None:
    src = ("import datetime as dt\nfrom datetime import timedelta\nT = timedelta(minutes=5)\n"
           "dist.init_process_group('nccl', timeout=T)\n"
           "g = dist.new_group([0, 1], timeout=dt.timedelta(seconds=60 * 3))\n"
           "h = dist.new_group([0, 1], timeout=timedelta(hours=args.h))\n")
    assert pgtimeout.parse(src) == {"seconds": 180.0, "line": 5, "text": "dt.timedelta(seconds=60 * 3)"}
    assert pgtimeout.parse("init_process_group(timeout=timedelta(0, 90))")["seconds"] == 90.0


def test_an_expression_that_needs_the_script_to_run_is_set_but_unreadable() -> None:
    found = pgtimeout.parse("import torch.distributed as dist\ndist.init_process_group('gloo', "
                            "timeout=timedelta(hours=args.timeout_hours))\n")
    assert found == {"seconds": None, "line": 2, "text": "timedelta(hours=args.timeout_hours)"}
    assert pgtimeout.parse("T = timedelta(minutes=1)\nT = timedelta(minutes=2)\n"
                           "init_process_group(timeout=T)")["seconds"] is None  # bound twice: which one?
    assert pgtimeout.parse("dist.init_process_group('gloo')\n") is None
    assert pgtimeout.parse("init_process_group(timeout=timedelta(seconds=-5))")["seconds"] is None


def test_the_script_is_found_from_the_command_line() -> None:
    assert pgtimeout.script_of(["python3", "-u", "-X", "dev", "-W", "ignore", "train.py", "--lr", "1"]) == "train.py"
    assert pgtimeout.script_of(["python", "-m", "torch.distributed.run", "x.py"]) is None
    assert pgtimeout.script_of(["python", "-c", "print(1)"]) is None


def test_a_real_process_is_read_through_its_cwd(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import time, datetime\n"
                      "def init_process_group(*a, **k): pass\n"
                      "init_process_group('gloo', timeout=datetime.timedelta(minutes=7))\n"
                      "print('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "train.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        found = pgtimeout.for_pid(proc.pid, in_container=False)
        assert found is not None and found["seconds"] == 420.0 and found["where"] == "train.py:3"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_fifo_in_place_of_the_script_is_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)
    assert pgtimeout.read(str(fifo)) is None  # returns at once: an open would wait for a writer
