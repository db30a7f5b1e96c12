"""--on-hang CMD: the user's command, run after each capture with what it captured in its environment.

CMD is split once, when the watch starts, like a shell would split it (shlex) and never again: the program and
its arguments are the user's own text. What the capture found (the bundle's path, the headline, the job, all
text from the nodes and so hostile) goes only into environment variables, and the argv is executed directly
(no shell), so nothing a rank is named or launched with can become a command. A hook that quotes the variables
in a shell of its own is the user's to write (`sh -c 'notify "$HANGSCOPE_HEADLINE"'`).

The command runs in its own process group with stdin from /dev/null and at most `timeout` seconds: then its
whole group is killed. Its output goes where hangscope's goes.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import time
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

from app.errors import InputError
from app.printable import clean

ENV_BUNDLE = "HANGSCOPE_BUNDLE"  # the capture's bundle directory
ENV_SNAPSHOT = "HANGSCOPE_SNAPSHOT"  # its snapshot.json (hangscope --load)
ENV_HEADLINE = "HANGSCOPE_HEADLINE"  # the diagnosis, one line
ENV_JOB = "HANGSCOPE_JOB"
ENV_KIND = "HANGSCOPE_KIND"  # hang | slow
HEADLINE_LIMIT = 4000  # characters: an environment is not a place for megabytes
KILL_WAIT = 5.0  # seconds to reap the group after SIGKILL


def parse_command(text: str) -> Tuple[str, ...]:
    """The --on-hang argv; InputError (exit 2) for an empty command or unbalanced quotes."""
    try:
        argv = tuple(shlex.split(text))
    except ValueError as exc:
        raise InputError(f"--on-hang {text!r} cannot be split into a command: {exc}") from None
    if not argv:
        raise InputError("--on-hang needs a command")
    if any("\0" in a for a in argv):
        raise InputError("--on-hang: a command cannot hold a NUL character")
    return argv


def environment(base: Mapping[str, str], *, bundle: str, snapshot: str, headline: str, job: str, kind: str
                ) -> Dict[str, str]:
    """The hook's environment: hangscope's own, and the capture's facts as plain, printable one-line values."""
    env = dict(base)
    env[ENV_BUNDLE] = bundle
    env[ENV_SNAPSHOT] = snapshot
    env[ENV_HEADLINE] = clean(headline, HEADLINE_LIMIT)
    env[ENV_JOB] = clean(job, 300)
    env[ENV_KIND] = kind
    return env


@dataclass(frozen=True)
class HookResult:
    code: Optional[int]  # None: killed at the deadline
    took: float
    error: str = ""  # it could not be started


async def run(argv: Sequence[str], env: Mapping[str, str], timeout: float, *, output: Optional[int] = None
              ) -> HookResult:
    """Execute argv (no shell) with env; at the deadline its process group is killed. `output`: where its
    stdout and stderr go (None: hangscope's own; the TUI gives /dev/null)."""
    t0 = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(*argv, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=output, stderr=output, start_new_session=True)
    except OSError as exc:
        return HookResult(None, time.monotonic() - t0, exc.strerror or str(exc))
    try:
        code = await asyncio.wait_for(proc.wait(), timeout)
        # what it left running in its process group (a child started with `&`) ends with it: nothing of ours
        # outlives what it was started for (Linux does not reuse a pid while a group still bears it)
        _kill(proc.pid)
        return HookResult(code, time.monotonic() - t0)
    except asyncio.TimeoutError:
        _kill(proc.pid)
        try:
            await asyncio.wait_for(proc.wait(), KILL_WAIT)
        except asyncio.TimeoutError:
            pass
        return HookResult(None, time.monotonic() - t0)
    except asyncio.CancelledError:
        _kill(proc.pid)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), KILL_WAIT)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
        raise


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # its own session: the group is the command and whatever it started
    except (ProcessLookupError, PermissionError):
        pass
