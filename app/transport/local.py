"""The worker on this machine: the same payload and stage as over SSH, run as a local subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any, Mapping, Optional, Sequence

from app.errors import TransportError
from app.transport import bootstrap
from app.transport.base import ExitInfo, WorkerConnection

START_TIMEOUT = 30.0


async def start_local(python: Optional[str] = None, *, name: str = "localhost",
                      options: Optional[Mapping[str, Any]] = None,
                      timeout: float = START_TIMEOUT) -> WorkerConnection:
    """Start a worker under `python` (default: this interpreter; flags allowed, e.g. "python3 -I -S")."""
    argv = bootstrap.python_argv(python) if python else [sys.executable]
    payload = bootstrap.build_payload()
    return await spawn_worker([*argv, "-c", payload.stage(options)], payload.data, name=name, timeout=timeout,
                              python=python or sys.executable)


async def spawn_worker(argv: Sequence[str], payload: bytes, *, name: str = "localhost",
                       timeout: float = START_TIMEOUT, python: str = "",
                       env: Optional[Mapping[str, str]] = None) -> WorkerConnection:
    """Run argv as a worker process (in `env`, default this process's), send it `payload`, wait for its hello."""
    t0 = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            # its own session: a Ctrl-C meant for the TUI must not kill the worker mid-dump (it resumes ranks)
            start_new_session=True, env=None if env is None else dict(env))
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise TransportError("no_python", f"{name}: cannot run {argv[0]!r}: {exc.strerror or exc}",
                             phase="start") from None
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def wait_exit() -> ExitInfo:
        code = await proc.wait()
        if code < 0:
            try:
                return ExitInfo(None, signal=signal.Signals(-code).name)
            except ValueError:
                return ExitInfo(None, signal=str(-code))
        return ExitInfo(code)

    def kill() -> None:
        if proc.returncode is None:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    conn = WorkerConnection(name, proc.stdout, proc.stdin, proc.stderr, wait_exit, kill=kill, python=python)
    conn.timings["connect"] = time.monotonic() - t0
    try:
        await conn.start(payload, timeout)
    except BaseException:
        await conn.close(kill=True)
        raise
    return conn
