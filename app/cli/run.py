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
import threading
from typing import Awaitable, Callable, Iterable, List, NoReturn, Optional, Sequence, Union

from app.errors import InputError
from app.inputs.paths import WriteError, write_file

__all__ = ["OneLineParser", "WriteError", "write_private", "run_interruptible"]


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its complaints as one line (InputError: exit 2), not a usage block and a second line."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} ({self.prog} --help lists the options)", title="usage")

EXIT_INTERRUPTED = 130


def write_private(path: str, text: Union[str, Iterable[str]], *, force: bool = False, inputs: Sequence[str] = (),
                  flag: str = "") -> None:
    """Write a file 0600 by create-and-rename (app.inputs.paths: never through a symlink, FIFO or device,
    never over one of `inputs`); lone surrogates a snapshot may carry are written as \\uXXXX escapes. Text given
    as pieces is written as it comes, ~1 MB at a time, never held whole."""
    if isinstance(text, str):
        write_file(path, text.encode("utf-8", "backslashreplace"), flag=flag, force=force, inputs=inputs)
    else:
        from app.model.codec import encode_pieces  # the model is loaded by whoever hands pieces of a snapshot

        write_file(path, encode_pieces(text, "backslashreplace"), flag=flag, force=force, inputs=inputs)


def sigint_ignored() -> bool:
    """This process was started with SIGINT ignored, so Ctrl+C at the terminal is not meant for it."""
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def _abort() -> NoReturn:
    print("\nhangscope: aborted", file=sys.stderr)
    os._exit(EXIT_INTERRUPTED)


def _arm_abort(remove_loop_handler: Callable[[], object]) -> None:
    """Once a first Ctrl+C has cancelled the collection, every later one aborts at once (exit 130, "aborted"),
    wherever it lands: this takes the loop's handler away and puts the abort in its place with SIGINT blocked
    between the two, so a Ctrl+C that arrives in between waits for the abort instead of meeting Python's default
    handler (a KeyboardInterrupt, "interrupted", after closing whatever the finish awaits). It stays installed to
    the process's end. Main thread only (signal handlers are the main thread's)."""
    if threading.current_thread() is not threading.main_thread():
        remove_loop_handler()
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        remove_loop_handler()
        signal.signal(signal.SIGINT, lambda _signum, _frame: _abort())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def run_interruptible(coro_factory, on_first_interrupt, after=None, finish: Optional[Sequence[Awaitable]] = None) -> object:
    """Run an asyncio coroutine; the first Ctrl+C calls on_first_interrupt (cancel, keep partial data),
    a second one aborts at once with exit code 130.

    `after(result)`, when given, runs once the coroutine returned, outside the loop (Ctrl+C there is a
    KeyboardInterrupt, as anywhere outside a collection; after a first Ctrl+C, the next one aborts at once), and
    its value is returned; `finish` holds what the coroutine left running for after it (closing the connections
    while the summary is printed): awaited before this returns or raises, whatever `after` did, under the same
    Ctrl+C rule."""
    loop = asyncio.new_event_loop()
    interrupts: List[int] = []
    # Started with SIGINT ignored (a background job of a shell without job control, nohup): the Ctrl+C typed at
    # the terminal is for the foreground command, not for this one, so it stays ignored here too (as Python
    # leaves it outside the loop), and is never turned into the default handler when the loop lets go of it.
    ignored = sigint_ignored()

    def handler() -> None:
        interrupts.append(1)
        if len(interrupts) == 1:
            print("\nhangscope: cancelling collection (Ctrl+C again to abort)", file=sys.stderr)
            on_first_interrupt()
        else:
            _abort()

    def listen(on: bool) -> None:
        if ignored:
            return
        try:
            if on:
                loop.add_signal_handler(signal.SIGINT, handler)
            elif interrupts:  # outside the loop from here on, a next Ctrl+C still aborts at once
                _arm_abort(lambda: loop.remove_signal_handler(signal.SIGINT))
            else:
                loop.remove_signal_handler(signal.SIGINT)
        except (NotImplementedError, RuntimeError):
            pass

    def wait_finish() -> None:
        if finish:
            listen(True)
            try:
                loop.run_until_complete(asyncio.gather(*finish, return_exceptions=True))
            finally:
                listen(False)

    listen(True)
    try:
        try:
            result = loop.run_until_complete(coro_factory())
        finally:
            listen(False)
        if after is not None:
            result = after(result)  # after a first Ctrl+C the abort is armed (listen): a next one ends it at once
        return result
    finally:
        try:
            wait_finish()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
