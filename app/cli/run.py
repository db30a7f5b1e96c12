"""What every command-line mode shares: running the async part under Ctrl+C, and writing result files.

A module of its own so that the modes (headless.py, gpu.py, demo.py) and the command line (__init__.py) do not
import each other.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
from typing import List

from app.errors import HangscopeError, InputError

EXIT_INTERRUPTED = 130


class WriteError(HangscopeError):
    title = "could not write"
    hint = "choose another path (the data is still printed above)"


def write_private(path: str, text: str, *, force: bool = False) -> None:
    """Write a file 0600 atomically (temp file + rename); never follow a symlink at the destination."""
    if os.path.islink(path):
        raise WriteError(f"{path} is a symlink; refusing to write through it")
    if os.path.exists(path) and not force:
        raise InputError(f"{path} exists; pass --force to overwrite it")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".hangscope-", dir=directory)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from exc


def run_interruptible(coro_factory, on_first_interrupt) -> object:
    """Run an asyncio coroutine; the first Ctrl+C calls on_first_interrupt (cancel, keep partial data),
    a second one aborts at once with exit code 130."""
    loop = asyncio.new_event_loop()
    interrupts: List[int] = []

    def handler() -> None:
        interrupts.append(1)
        if len(interrupts) == 1:
            print("\nhangscope: cancelling collection (Ctrl+C again to abort)", file=sys.stderr)
            on_first_interrupt()
        else:
            print("\nhangscope: aborted", file=sys.stderr)
            os._exit(EXIT_INTERRUPTED)

    try:
        loop.add_signal_handler(signal.SIGINT, handler)
    except (NotImplementedError, RuntimeError):
        pass
    try:
        return loop.run_until_complete(coro_factory())
    finally:
        try:
            loop.remove_signal_handler(signal.SIGINT)
        except (NotImplementedError, RuntimeError):
            pass
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
