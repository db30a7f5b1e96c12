"""What every command-line mode shares: running the async part under Ctrl+C, and writing result files.

A module of its own so that the modes (headless.py, gpu.py, demo.py) and the command line (__init__.py) do not
import each other.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import List, NoReturn, Sequence

from app.errors import InputError
from app.inputs.paths import WriteError, write_file

__all__ = ["OneLineParser", "WriteError", "write_private", "run_interruptible"]


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its complaints as one line (InputError: exit 2), not a usage block and a second line."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} ({self.prog} --help lists the options)", title="usage")

EXIT_INTERRUPTED = 130


def write_private(path: str, text: str, *, force: bool = False, inputs: Sequence[str] = (), flag: str = "") -> None:
    """Write a file 0600 by create-and-rename (app.inputs.paths: never through a symlink, FIFO or device,
    never over one of `inputs`); lone surrogates a snapshot may carry are written as \\uXXXX escapes."""
    write_file(path, text.encode("utf-8", "backslashreplace"), flag=flag, force=force, inputs=inputs)


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
