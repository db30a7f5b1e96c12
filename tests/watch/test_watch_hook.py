"""--on-hang: the user's command is split once and executed without a shell; what the capture found reaches it
only through its environment, so text from the nodes (a rank named with shell metacharacters) runs nothing; a
hook that overruns its deadline is killed with its whole process group."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from app.errors import InputError
from app.watch import hook
from waiting import wait_until

HOSTILE = "rank `touch {p}/backtick` $(touch {p}/dollar); touch {p}/semicolon | touch {p}/pipe\n&& touch {p}/and\x00\x1b]0;x\x07"


def test_the_command_is_split_once_like_a_shell_would() -> None:
    assert hook.parse_command("notify-send 'job hung' --urgency=critical") == (
        "notify-send", "job hung", "--urgency=critical")
    for bad in ("", "   ", "'unbalanced"):
        with pytest.raises(InputError):
            hook.parse_command(bad)


def test_remote_text_reaches_the_hook_only_as_plain_environment_values(tmp_path: Path) -> None:
    hostile = HOSTILE.format(p=tmp_path)
    script = tmp_path / "hook.py"
    script.write_text("import os, json, sys\n"
                      "json.dump({k: v for k, v in os.environ.items() if k.startswith('HANGSCOPE_')},"
                      " open(sys.argv[1], 'w'))\n")
    out = tmp_path / "seen.json"
    argv = hook.parse_command(f"{sys.executable} {script} {out}")
    env = hook.environment({"PATH": os.environ.get("PATH", "")}, bundle=str(tmp_path / "b"),
                           snapshot=str(tmp_path / "b" / "snapshot.json"), headline=hostile, job=hostile, kind="hang")
    result = asyncio.run(hook.run(argv, env, 30))
    assert result.code == 0 and not result.error
    seen = __import__("json").loads(out.read_text())
    assert seen["HANGSCOPE_BUNDLE"] == str(tmp_path / "b") and seen["HANGSCOPE_KIND"] == "hang"
    assert "touch" in seen["HANGSCOPE_HEADLINE"] and "\n" not in seen["HANGSCOPE_HEADLINE"]
    assert "\x1b" not in seen["HANGSCOPE_HEADLINE"] and "\x00" not in seen["HANGSCOPE_HEADLINE"]
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == ["hook.py", "seen.json"], f"a command in remote text ran: {made}"


def test_a_hook_past_its_deadline_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = (f"import subprocess, sys, time\n"
            f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(c.pid))\ntime.sleep(60)\n")
    t0 = time.monotonic()
    result = asyncio.run(hook.run([sys.executable, "-c", code], dict(os.environ), 2.0))
    assert result.code is None and time.monotonic() - t0 < 20
    child = int(pidfile.read_text())

    def dead() -> bool:
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
        except FileNotFoundError:
            return True

    wait_until(dead, 10, "the hook's child to be killed with it")


def test_what_a_hook_leaves_running_in_its_group_ends_with_it(tmp_path: Path) -> None:
    """`sh -c 'sleep 300 & echo started'` exits at once and left its child running: ended when the hook exits
    (the blind inputs-w set found it still running after the watch)."""
    pidfile = tmp_path / "child.pid"
    result = asyncio.run(hook.run(["/bin/sh", "-c", f"sleep 300 & echo $! > {pidfile}"], dict(os.environ), 30))
    assert result.code == 0
    child = int(pidfile.read_text())

    def dead() -> bool:
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
        except FileNotFoundError:
            return True

    wait_until(dead, 10, "the hook's background child to end with it")


def test_a_hook_that_cannot_start_says_why() -> None:
    result = asyncio.run(hook.run(["/nonexistent/hook"], {}, 5))
    assert result.error and result.code is None
