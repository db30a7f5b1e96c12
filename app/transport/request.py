"""One request in flight on a worker connection: its items as an async iterator, its deadline, its end.

Typed by its op (workers/protocol.py Op): a collect request yields CollectItems and ends with CollectDone. The
data is remote: the types say which keys the worker sends, and app/decode checks each value as it is taken.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Generic, Optional, Protocol, TypeVar, Union, cast

from app.errors import TransportError, hint_for, remote_code


class _Connection(Protocol):
    """What a request needs from its connection (base.WorkerConnection)."""

    name: str

    def forget(self, req_id: int) -> None: ...

    def send_cancel(self, req_id: int) -> None: ...


class WorkerRequestError(TransportError):
    """The worker answered a request with an error (a code from protocol.ERROR_HINTS)."""

    title = "request failed"


ItemT = TypeVar("ItemT")  # the op's items
DoneT = TypeVar("DoneT")  # its done data


class Request(Generic[ItemT, DoneT]):
    """One request in flight: iterate it for its items; `done` holds the final data once iteration ends."""

    def __init__(self, conn: _Connection, req_id: int, op: str, deadline: Optional[float]) -> None:
        self.conn = conn
        self.id = req_id
        self.op = op
        self.deadline = deadline  # loop time
        self.timeout = None if deadline is None else deadline - asyncio.get_running_loop().time()
        self.done: Optional[DoneT] = None
        self.finished = False
        self.queue: asyncio.Queue[Union[dict, TransportError]] = asyncio.Queue()

    def __aiter__(self) -> AsyncIterator[ItemT]:
        return self

    async def __anext__(self) -> ItemT:
        if self.finished:
            raise StopAsyncIteration
        try:
            msg = await self._get()
        except BaseException:
            # Timed out, cancelled by our caller, or the iteration was abandoned: the worker must stop too.
            self.abandon()
            raise
        if isinstance(msg, TransportError):
            self._finish()
            raise msg
        kind = msg.get("type")
        if kind == "item":
            data = msg.get("data")
            return cast(ItemT, data if isinstance(data, dict) else {"value": data})
        self._finish()
        if kind == "done":
            data = msg.get("data")
            self.done = cast(DoneT, data if isinstance(data, dict) else {})
            raise StopAsyncIteration
        code = remote_code(msg.get("code"))
        raise WorkerRequestError(code, f"{self.conn.name}: {self.op}: {msg.get('message', '')}",
                                 hint=str(msg.get("hint") or hint_for(code)))

    async def _get(self) -> dict | TransportError:
        if self.deadline is None:
            return await self.queue.get()
        remaining = self.deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(self.queue.get(), max(remaining, 0.0))
        except asyncio.TimeoutError:
            raise TransportError("timeout", f"{self.conn.name}: no answer to {self.op} within its "
                                 f"{self.timeout or 0:.1f} s deadline",
                                 hint="the worker or the node is overloaded or stuck; try again") from None

    def set_deadline(self, timeout: float) -> None:
        """From now on, wait at most `timeout` seconds more (a request whose size is known only midway)."""
        self.deadline = asyncio.get_running_loop().time() + timeout
        self.timeout = timeout

    def _finish(self) -> None:
        self.finished = True
        self.conn.forget(self.id)

    def abandon(self) -> None:
        """Stop waiting; tell the worker to stop (best effort, nothing awaited)."""
        if self.finished:
            return
        self._finish()
        self.conn.send_cancel(self.id)

    async def collect(self) -> tuple[list[ItemT], DoneT]:
        items = [item async for item in self]
        return items, self.done if self.done is not None else cast(DoneT, {})
