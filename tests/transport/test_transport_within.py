"""`within` keeps asyncio.wait_for's contract (the awaited result; asyncio.TimeoutError at the deadline, with the
awaited work cancelled; a cancellation from outside stays a cancellation) without a task per wait: the worker's
start, its drains and a cold pass's gate wait under it, ~5 times a node and pass."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.transport.within import within


async def test_the_awaited_result_comes_back() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert await within(answer(), 5.0) == 42
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    done.set_result("hello")
    assert await within(asyncio.shield(done), 0.0) == "hello"  # already there: no deadline can miss it


async def test_at_the_deadline_the_wait_raises_timeout_and_the_awaited_work_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    t0 = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        await within(forever(), 0.05)
    assert 0.04 <= time.monotonic() - t0 < 2.0
    assert cancelled.is_set()
    # the task that waited is not left cancelled: it goes on awaiting
    await asyncio.sleep(0.01)


async def test_a_shielded_future_survives_the_deadline() -> None:
    hello: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    with pytest.raises(asyncio.TimeoutError):
        await within(asyncio.shield(hello), 0.02)
    assert not hello.cancelled()  # the hello may still come; only the wait gave up
    hello.set_result("late")
    assert await hello == "late"


async def test_a_cancellation_from_outside_is_not_turned_into_a_timeout() -> None:
    started = asyncio.Event()

    async def waiter() -> None:
        started.set()
        await within(asyncio.sleep(3600), 3600.0)

    task = asyncio.create_task(waiter())
    await started.wait()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
