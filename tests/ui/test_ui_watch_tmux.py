"""`hangscope watch --tui` in a real terminal (tmux), on this machine: a 'rank' that makes no progress is
captured, Enter on the capture opens it as `hangscope --load` does (the watch steps aside and comes back when
the viewer quits), and q quits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_ui_tmux import hangscope, terminal, wait_exit  # noqa: F401 (terminal: the fixture)

pytestmark = [pytest.mark.timeout(240)]

STILL_RANK = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"


def test_enter_on_a_capture_opens_it_and_the_watch_comes_back(terminal, tmp_path: Path) -> None:  # noqa: F811
    rank = subprocess.Popen([sys.executable, "-c", STILL_RANK], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                                     MASTER_PORT="29997"))
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == b"ready"
        exit_file = tmp_path / "exit"
        term = terminal(hangscope("watch", "--pid", rank.pid, "--every", "0.5", "--stall", "2", "--stall-start", "2",
                                  "--tui", "--out", tmp_path / "out", "--fps", 20, exit_file=exit_file),
                        size="140x44")
        term.wait_for(lambda s: "1 capture" in s and "hang" in s and "hangscope watch" in s and "127.0.0.1:29997" in s,
                      "the capture, under the watch's header with the job's store", timeout=120)
        term.keys("c")
        term.keys("Enter")
        term.wait_for(lambda s: "(loaded file)" in s and "snapshot.json" in s, "the capture opened as --load does")
        term.keys("q")
        term.wait_for(lambda s: "hangscope watch" in s and "captures (Enter opens)" in s, "the watch again")
        term.keys("q")
        assert wait_exit(exit_file) == 0
        assert rank.poll() is None, "the rank was left running"
    finally:
        rank.kill()
        rank.wait(timeout=10)
