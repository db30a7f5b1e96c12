"""One request in flight on a worker connection: its items as an async iterator, its deadline, its end.

Typed by its op (workers/protocol.py Op): a collect request yields CollectItems and ends with CollectDone. The
data is remote: the types say which keys the worker sends, and app/decode checks each value as it is taken.

Built for thousands of requests in flight on one event loop (one per node and pass):
- The deadline counts from the node's own activity: a request fails only when nothing arrived for it for
  `timeout` seconds (from when it was sent, or from its last message), never while a message waits to be
  taken. A pass that keeps the loop busy for longer than the deadline (12,500 nodes' replies to decode) must
  not mark nodes as timed out that answered long ago (issue 27: past ~2,500 nodes the second sample did).
  Before a deadline is declared, the loop turns a few times more so that data already read by the channel
  but not yet handed over (a loop that was busy) reaches the request.
- Taking a message that is there costs no task, no timer and no loop turn (asyncio.wait_for on a queue did
  all three per item).
- Backpressure: past HIGH_WATER messages not yet taken, `room()` makes the connection's reader wait (it stops
  reading the channel, and SSH's or the pipe's flow control stops the worker) until the consumer is back
  under LOW_WATER.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, AsyncIterator, Callable, Generic, Optional, Protocol, TypeVar, Union, cast

from app.errors import TransportError, hint_for, remote_code

HIGH_WATER = 512  # messages queued for one request before its connection stops reading
LOW_WATER = 64
SETTLE_TURNS = 8  # loop turns a deadline waits, once expired, for data the channel already holds


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
Message = Union[dict, TransportError]


class Request(Generic[ItemT, DoneT]):
    """One request in flight: iterate it for its items; `done` holds the final data once iteration ends.

    `decode`, when given, turns each item's data into what the iteration yields, in the connection's reader
    as the item arrives (so raw replies do not pile up in memory while the consumer is behind)."""

    def __init__(self, conn: _Connection, req_id: int, op: str, deadline: Optional[float],
                 decode: Optional[Callable[[Any], Any]] = None) -> None:
        loop = asyncio.get_running_loop()
        self.conn = conn
        self.id = req_id
        self.op = op
        self._loop = loop
        self.timeout = None if deadline is None else max(0.0, deadline - loop.time())
        self.last_activity = loop.time()  # when the request was sent, then when its last message came
        self.done: Optional[DoneT] = None
        self.finished = False
        self.decode = decode
        self._messages: deque[Message] = deque()
        self._waiter: Optional[asyncio.Future[None]] = None
        self._room: Optional[asyncio.Future[None]] = None

    @property
    def deadline(self) -> Optional[float]:
        """Loop time at which the request fails if nothing more arrives for it."""
        return None if self.timeout is None else self.last_activity + self.timeout

    # -- the connection's side ---------------------------------------------------------------------------

    def put(self, msg: Message) -> None:
        """A message for this request (from the connection's reader), or the error that ends it."""
        if self.decode is not None and isinstance(msg, dict) and msg.get("type") == "item":
            data = msg.get("data")
            try:
                msg = {"type": "item", "data": self.decode(data if isinstance(data, dict) else {"value": data})}
            except Exception as exc:  # a decoder's bug on remote data ends this request, not the connection
                msg = TransportError("internal", f"{self.conn.name}: {self.op}: cannot decode an item: "
                                     f"{type(exc).__name__}: {exc}")
        self._messages.append(msg)
        self.last_activity = self._loop.time()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def room(self) -> Optional[asyncio.Future[None]]:
        """None while the consumer keeps up; else a future the reader awaits before reading more."""
        if len(self._messages) < HIGH_WATER or self.finished:
            return None
        if self._room is None or self._room.done():
            self._room = self._loop.create_future()
        return self._room

    def _taken(self) -> None:
        room = self._room
        if room is not None and not room.done() and (len(self._messages) <= LOW_WATER or self.finished):
            room.set_result(None)
        if room is not None and room.done():
            self._room = None

    # -- the consumer's side -----------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[ItemT]:
        return self

    async def __anext__(self) -> ItemT:
        if self.finished:
            raise StopAsyncIteration
        try:
            msg = self._messages.popleft() if self._messages else await self._get()
        except BaseException:
            # Timed out, cancelled by our caller, or the iteration was abandoned: the worker must stop too.
            self.abandon()
            raise
        self._taken()
        if isinstance(msg, TransportError):
            self._finish()
            raise msg
        kind = msg.get("type")
        if kind == "item":
            data = msg.get("data")
            if self.decode is not None:
                return cast(ItemT, data)
            return cast(ItemT, data if isinstance(data, dict) else {"value": data})
        self._finish()
        if kind == "done":
            data = msg.get("data")
            self.done = cast(DoneT, data if isinstance(data, dict) else {})
            raise StopAsyncIteration
        code = remote_code(msg.get("code"))
        raise WorkerRequestError(code, f"{self.conn.name}: {self.op}: {msg.get('message', '')}",
                                 hint=str(msg.get("hint") or hint_for(code)))

    async def _get(self) -> Message:
        settled = False
        while not self._messages:
            deadline = self.deadline
            remaining = None if deadline is None else deadline - self._loop.time()
            if remaining is not None and remaining <= 0:
                if not settled:  # data the channel holds may still be on its way through a busy loop
                    settled = True
                    for _ in range(SETTLE_TURNS):
                        await asyncio.sleep(0)
                    continue
                raise TransportError("timeout", f"{self.conn.name}: no answer to {self.op} within its "
                                     f"{self.timeout or 0:.1f} s deadline",
                                     hint="the worker or the node is overloaded or stuck; try again")
            waiter = self._waiter = self._loop.create_future()
            timer = None if remaining is None else self._loop.call_at(self._loop.time() + remaining, _wake, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        return self._messages.popleft()

    def set_deadline(self, timeout: float) -> None:
        """From now on, fail after `timeout` seconds without a message (a request whose size is known only
        midway)."""
        self.last_activity = self._loop.time()
        self.timeout = timeout

    def _finish(self) -> None:
        self.finished = True
        self.conn.forget(self.id)
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)

    def abandon(self) -> None:
        """Stop waiting; tell the worker to stop (best effort, nothing awaited)."""
        if self.finished:
            return
        self._finish()
        self.conn.send_cancel(self.id)

    async def collect(self) -> tuple[list[ItemT], DoneT]:
        items = [item async for item in self]
        return items, self.done if self.done is not None else cast(DoneT, {})


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
