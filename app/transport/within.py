"""Awaiting something under a deadline without a task of its own.

asyncio.wait_for runs the awaited coroutine in a new task, with its own future, timer and callbacks (~12 us of
CPU here; ~20 us when the caller is itself a task started to drain). A pass over 12,500 nodes awaits ~5 such
per node (the worker's start and hello, the drains of its requests, the gate of a cold pass): ~1 s of one
core. From Python 3.11, asyncio.timeout() cancels the waiting task itself at the deadline (~4.5 us), and
Python 3.12's wait_for is built on it; 3.9 and 3.10 keep wait_for. Either way the caller gets the awaited
result, or asyncio.TimeoutError at the deadline, and a cancellation from outside stays a cancellation.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Awaitable, TypeVar

T = TypeVar("T")

if sys.version_info >= (3, 11):
    async def within(aw: Awaitable[T], timeout: float) -> T:
        """`await aw`, raising asyncio.TimeoutError after `timeout` seconds (wait_for's contract)."""
        async with asyncio.timeout(timeout):
            return await aw
else:  # pragma: no cover - exercised on 3.9/3.10 only
    async def within(aw: Awaitable[T], timeout: float) -> T:
        return await asyncio.wait_for(aw, timeout)
