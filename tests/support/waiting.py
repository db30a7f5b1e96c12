"""The one way tests wait for something: poll a predicate under a deadline, never a fixed sleep.

wait_until(predicate, timeout, what) returns the predicate's first truthy value, or raises TimeoutError naming
`what` after `timeout` seconds (deadlines are the test's own, generous for a loaded 2-core machine);
wait_until_async is the same inside a coroutine, yielding to the event loop (or to a Textual pilot's pause)
between polls.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Optional, TypeVar

T = TypeVar("T")


def _timed_out(what: str, timeout: float) -> TimeoutError:
    return TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_until(predicate: Callable[[], T], timeout: float = 20.0, what: str = "a condition",
               interval: float = 0.02) -> T:
    """Poll predicate() until it returns something truthy (returned); TimeoutError naming `what` at the
    deadline. An exception from predicate() ends the wait (a process that died while waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout)
        time.sleep(interval)  # a poll interval, not a wait for an event: the deadline bounds the loop


async def wait_until_async(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.02,
                           pause: Optional[Callable[[], Awaitable[object]]] = None) -> T:
    """wait_until in a coroutine: between polls, `await pause()` (a Textual pilot's pause, so the app
    processes its messages) or else asyncio.sleep(interval)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout)
        await (pause() if pause is not None else asyncio.sleep(interval))
