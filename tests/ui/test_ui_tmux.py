"""The TUI in a real terminal (tmux): the real `hangscope --load FILE` and `hangscope hosts.txt` (over SSH, on
the hung torch job of the test cluster) with keys, resizing and exit codes; the screen is read back with
`tmux capture-pane`."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

import pytest

from app.model.codec import snapshot_to_json
from test_ui_support import build_snapshot
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]

def hangscope(*args: object, exit_file: Path) -> str:
    """The shell command that runs the real CLI in the pane and leaves its exit code in exit_file."""
    argv = " ".join(shlex.quote(str(a)) for a in (sys.executable, "-m", "app", *args))
    return f"cd {shlex.quote(str(REPO))} && {argv}; echo $? > {shlex.quote(str(exit_file))}"


class Terminal:
    """One tmux server of our own (its own socket, no user config) running one command in a window."""

    def __init__(self, command: str, env: Optional[Dict[str, str]] = None, size: str = "110x34") -> None:
        self.socket = f"hangscope-test-{uuid.uuid4().hex[:8]}"
        width, height = size.split("x")
        # The window gets its size after its first command started (which then sees 80x24 until a
        # SIGWINCH): start an idle command, then respawn the pane with ours at the final size.
        self.tmux("new-session", "-d", "-s", "t", "-x", width, "-y", height, "cat")
        argv = ["respawn-pane", "-k", "-t", "t"]
        for k, v in (env or {}).items():
            argv += ["-e", f"{k}={v}"]
        self.tmux(*argv, command)

    def tmux(self, *args: str) -> str:
        # An explicit environment: under pytest the C-level environ carries COLUMNS=80 (set with putenv
        # behind os.environ's back), which the tmux server would hand to the app as its terminal width.
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True,
                              text=True, check=True, timeout=20, env=env).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def wait_for(self, check: Callable[[str], bool], what: str, timeout: float = 60) -> str:
        """Poll the screen until check(screen) holds, with a deadline: never a fixed sleep."""
        last = [""]

        def shown() -> str:
            try:
                last[0] = self.screen()
            except subprocess.CalledProcessError:
                last[0] = "(the tmux session is gone)"
            return last[0] if check(last[0]) else ""

        try:
            return wait_until(shown, timeout, what, interval=0.05)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}; the screen shows:\n{last[0]}") from None

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=20)
        try:
            os.unlink(f"/tmp/tmux-{os.getuid()}/{self.socket}")  # kill-server leaves the socket file behind
        except OSError:
            pass


@pytest.fixture
def terminal() -> Iterator[Callable[..., Terminal]]:
    opened = []

    def start(command: str, **kw) -> Terminal:
        opened.append(Terminal(command, **kw))
        return opened[-1]

    try:
        yield start
    finally:
        for t in opened:
            t.close()


def wait_exit(path: Path, timeout: float = 30) -> int:
    wait_until(lambda: path.exists() and path.read_text(), timeout, "the TUI to exit", interval=0.05)
    return int(path.read_text())


def loaded_command(tmp_path: Path, snap) -> tuple:
    snap_file = tmp_path / "snap.json"
    snap_file.write_text(snapshot_to_json(snap))
    exit_file = tmp_path / "exit"
    return hangscope("--load", snap_file, "--fps", 20, exit_file=exit_file), exit_file


def test_keys_resize_and_quit_in_a_real_terminal(terminal, tmp_path):
    command, exit_file = loaded_command(tmp_path, build_snapshot(nodes=4, per_node=2, scenario="barrier",
                                                                 culprit=5))
    term = terminal(command)
    # each picture is one predicate: a capture can fall while tmux is still drawing a frame
    term.wait_for(lambda s: "Rank 5 has left the loop" in s and "node03  ● [▲]" in s and "(loaded file)" in s
                  and "snap.json" in s, "the verdict, the suspect's glyph on node03 and the loaded file's name")
    term.keys("Enter")
    term.wait_for(lambda s: "rank 5  on node03" in s and "barrier  distributed_c10d.py:4159" in s,
                  "the drill-down, with the frame it waits in")
    term.keys("Escape")
    term.wait_for(lambda s: "classes" in s and "findings" in s, "the main screen again")
    term.tmux("resize-window", "-t", "t", "-x", "50", "-y", "12")
    term.wait_for(lambda s: "hangscope needs at least 60x16" in s, "the too-small notice")
    term.tmux("resize-window", "-t", "t", "-x", "110", "-y", "34")
    term.wait_for(lambda s: "Rank 5 has left the loop" in s, "the main screen after growing")
    term.keys("q")
    assert wait_exit(exit_file) == 0


def test_second_ctrl_c_aborts_with_130(terminal, tmp_path):
    command, exit_file = loaded_command(tmp_path, build_snapshot(nodes=2, per_node=2, failed=(1,)))
    term = terminal(command)
    term.wait_for(lambda s: "node02" in s and "failed" in s, "the main screen")
    term.keys("C-c")
    term.wait_for(lambda s: "Ctrl+C again aborts" in s, "the first Ctrl+C's notice")
    term.keys("C-c")
    assert wait_exit(exit_file) == 130


@pytest.mark.parametrize("size", ["160x50", "80x24"])
def test_the_first_screen_of_a_recorded_job_gives_the_answer(terminal, tmp_path, size):
    """The recorded skip job (4 ranks, rank 2 a step ahead) in the real CLI: a grid as small as its ranks, the
    verdict, the first finding, the cursor on the culprit and its loop counter beside the majority's; the
    footer keeps `? help`; the rank view names its tab keys."""
    exit_file = tmp_path / "exit"
    term = terminal(hangscope("--load", REPO / "tests/data/scenarios/skip.json", "--fps", 20, exit_file=exit_file),
                    size=size)
    def first_screen(s: str) -> bool:  # one picture, one predicate: every part the asserts below read is drawn
        lines = s.rstrip("\n").splitlines()
        return ("evidence: rank 2 against the majority" in s and len(lines) > 2 and "palette" in lines[-1]
                and "? help" in lines[-1] and lines[1].startswith(" Rank 2 is")
                and any(line.startswith("│node02 [●]") for line in lines) and "step = 4" in s)

    screen = term.wait_for(first_screen, "the verdict, the culprit's cell under the cursor, the evidence, the footer")
    lines = screen.rstrip("\n").splitlines()
    assert lines[1].startswith(" Rank 2 is 1 iteration ahead (step=4 vs 3)")  # the verdict, under the top bar
    assert any(line.startswith("│node02 [●] ●") for line in lines)  # the culprit's cell, the cursor on it
    box = [line for line in lines if line.startswith(("╭", "│node", "╰"))]
    assert len(box) == 5 and len(box[0].split("╮")[0]) <= int(size.split("x")[0]) * 0.35  # 2 nodes x 2 ranks
    assert any("1. rank 2 is 1 iteration ahead" in line for line in lines)
    evidence = next(line for line in lines if "step = 4" in line)
    assert evidence.index("step = 4") < evidence.index("step = 3")
    assert "? help" in lines[-1]
    term.keys("Enter")
    # one picture, one predicate: the rank view's footer is drawn after its header (a CI run caught the header
    # with the main screen's footer still under it)
    screen = term.wait_for(lambda s: "rank 2  on node02" in s and "1-7 tab" in s.rstrip("\n").splitlines()[-1],
                           "the rank view, its footer naming the tab keys")
    assert "? help" in screen.rstrip("\n").splitlines()[-1]
    term.keys("Tab")
    term.wait_for(lambda s: ")  thread 14" in s, "the Locals tab (a frame, then its thread), by Tab")
    term.keys("Escape")
    term.wait_for(lambda s: "evidence:" in s, "the main screen again")
    term.keys("q")
    assert wait_exit(exit_file) == 0


@pytest.mark.cluster
def test_tui_finds_the_culprit_of_the_hung_job(terminal, cluster, hung_job, tmp_path):
    """The hung torch job (dataloader scenario, culprit rank 5 on node03) over real SSH, from the TUI alone."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("".join(f"{n} slots=2\n" for n in cluster.names))
    exit_file = tmp_path / "exit"
    env = {k: v for k, v in cluster.env().items() if k in ("HOME", "PATH")}
    term = terminal(hangscope(hosts, "--fps", 20, exit_file=exit_file), env=env, size="150x44")
    culprit = f"rank {hung_job.culprit}"
    # one predicate for the whole first picture: a capture can fall while tmux is still drawing a frame, its top
    # (the snapshot's header) new and the panels below it not yet
    screen = term.wait_for(lambda s: "snapshot 1/1" in s and culprit in s and "nodes: 4 done" in s,
                           "the first snapshot, every node done", timeout=120)
    row = next(line for line in screen.splitlines() if line.startswith("│node03 "))
    assert row.split("│")[1].split() == ["node03", "●", "[▲]"], screen  # local rank 1: the suspect's glyph
    term.keys("Enter")  # the cursor starts on the first suspect
    # the drill-down opens on the rank's class at once; its stack, with the loop's iteration values, is drawn when
    # the rank's detail arrives from its node: wait for the whole picture, as for the first one
    term.wait_for(lambda s: f"{culprit}  on node03" in s and "_recv_exact" in s and f"[step={hung_job.step}]" in s,
                  "the culprit's drill-down: its stack, in `_recv_exact`, at its loop's step")
    term.keys("Escape")  # alone: ESC and q sent together read as Alt+q
    term.wait_for(lambda s: "findings" in s, "the main screen again")
    term.keys("q")
    assert wait_exit(exit_file) == 0
