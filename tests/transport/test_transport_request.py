"""A request's deadline counts from its node's own activity, taking a message that waits costs no loop turn, the
reader stops reading while the consumer is behind (backpressure), and items are decoded in the reader (issue 27).

In-memory streams stand in for a worker: what is tested is WorkerConnection and Request themselves."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any, Deque, Optional

import pytest

from app.errors import TransportError
from app.transport import request as request_mod
from app.transport.base import ExitInfo, WorkerConnection
from workers import protocol


class Stream:
    """A ByteReader fed by the test, counting what the connection took from it."""

    def __init__(self) -> None:
        self.chunks: Deque[bytes] = deque()
        self.waiter: Optional[asyncio.Future[None]] = None
        self.eof = False
        self.taken = 0

    def feed(self, data: bytes) -> None:
        self.chunks.append(data)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def end(self) -> None:
        self.eof = True
        self.feed(b"")

    async def read(self, n: int = -1) -> bytes:
        while not self.chunks or self.chunks[0] == b"":
            if self.chunks and self.eof:
                return b""
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        data = self.chunks.popleft()
        self.taken += 1
        return data


class Sink:
    """A ByteWriter that remembers the requests written to it."""

    def __init__(self) -> None:
        self.lines: list[dict] = []

    def write(self, data: bytes) -> None:
        for line in data.splitlines():
            if line.strip():
                self.lines.append(json.loads(line))

    async def drain(self) -> None:
        return None

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        pass


async def _connected(hello: Optional[bytes] = None) -> tuple[WorkerConnection, Stream, Sink]:
    out, sink = Stream(), Sink()
    exited: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()

    async def wait_exit() -> ExitInfo:
        return await exited

    conn = WorkerConnection("node01", out, sink, None, wait_exit)
    out.feed(hello or protocol.encode({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "pid": 1}))
    await conn.start(b"", 5.0)
    return conn, out, sink


def _item(req_id: int, n: int) -> bytes:
    return protocol.encode({"type": "item", "id": req_id, "data": {"n": n}})


def _done(req_id: int) -> bytes:
    return protocol.encode({"type": "done", "id": req_id, "data": {}})


async def test_items_that_arrived_are_taken_however_late_the_consumer_comes() -> None:
    """The loop was busy (a pass decoding thousands of nodes) for longer than the deadline, but the node had
    answered: its answer is taken, not a timeout."""
    conn, out, _ = await _connected()
    req = conn.request(protocol.PING({}), timeout=0.2)
    out.feed(_item(req.id, 1) + _item(req.id, 2) + _done(req.id))
    await asyncio.sleep(0.01)  # the reader takes the bytes
    time.sleep(0.4)  # the loop is busy elsewhere, past the deadline
    items, _ = await req.collect()
    assert [i["n"] for i in items] == [1, 2]


async def test_the_deadline_counts_from_the_last_message() -> None:
    conn, out, _ = await _connected()
    req = conn.request(protocol.PING({}), timeout=0.3)
    got = []

    async def consume() -> None:
        async for item in req:
            got.append(item["n"])

    task = asyncio.create_task(consume())
    for n in range(6):  # 1.2 s in all, four times the deadline, never 0.3 s of silence
        out.feed(_item(req.id, n))
        await asyncio.sleep(0.2)
    out.feed(_done(req.id))
    await asyncio.wait_for(task, 5.0)
    assert got == list(range(6))


async def test_silence_past_the_deadline_times_out_and_cancels_on_the_worker() -> None:
    conn, out, sink = await _connected()
    req = conn.request(protocol.PING({}), timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(TransportError) as err:
        await req.collect()
    assert err.value.code == "timeout" and 0.15 < time.monotonic() - t0 < 3.0
    assert any(m.get("op") == "cancel" and m["args"]["target"] == req.id for m in sink.lines)


async def test_data_already_read_is_not_a_timeout_when_the_timer_fires_first() -> None:
    """The deadline's timer and the data come due in the same loop turn: the turns SETTLE_TURNS gives let the
    data through."""
    conn, out, _ = await _connected()
    req = conn.request(protocol.PING({}), timeout=0.05)
    time.sleep(0.1)  # the deadline has passed by the time the loop looks at the timer
    out.feed(_item(req.id, 1) + _done(req.id))
    items, _ = await req.collect()
    assert [i["n"] for i in items] == [1]


async def test_the_reader_stops_reading_while_the_consumer_is_behind() -> None:
    conn, out, _ = await _connected()
    req = conn.request(protocol.PING({}), timeout=30.0)
    total = request_mod.HIGH_WATER * 4
    for n in range(total):  # one chunk per message: what the reader took is what it let in
        out.feed(_item(req.id, n))
    out.feed(_done(req.id))
    for _ in range(50):
        await asyncio.sleep(0)
    assert out.taken <= request_mod.HIGH_WATER + 2, out.taken  # + hello, and the chunk that filled it
    items, _ = await req.collect()  # taking the items lets the reader go on
    assert [i["n"] for i in items] == list(range(total))


async def test_items_are_decoded_in_the_reader_as_they_arrive() -> None:
    conn, out, _ = await _connected()
    decoded: list[Any] = []

    def decode(data: dict) -> Any:
        decoded.append(data["n"])
        return ("decoded", data["n"])

    req = conn.request(protocol.PING({}), timeout=5.0, decode=decode)
    out.feed(_item(req.id, 7) + _item(req.id, 8) + _done(req.id))
    for _ in range(10):
        await asyncio.sleep(0)
    assert decoded == [7, 8]  # before anyone iterated
    items, _ = await req.collect()
    assert items == [("decoded", 7), ("decoded", 8)]


async def test_a_decoder_that_fails_ends_that_request_only() -> None:
    conn, out, _ = await _connected()
    req = conn.request(protocol.PING({}), timeout=5.0, decode=lambda data: 1 / 0)
    out.feed(_item(req.id, 1))
    with pytest.raises(TransportError) as err:
        await req.collect()
    assert err.value.code == "internal" and "ZeroDivisionError" in err.value.message
    other = conn.request(protocol.PING({}), timeout=5.0)
    out.feed(_done(other.id))
    assert await other.collect() == ([], {})


# -- zlib frames (workers/protocol.py: after the hello, `z <n>` and n bytes of one zlib stream) -------------------

def _real_worker_bytes(requests: list[dict], **options: Any) -> tuple[bytes, bytes]:
    """(hello line, everything after it) as the real worker's Server writes them when the login side asks for
    compression (and `options`), answering `requests` (its stdin ends once each has answered)."""
    import io
    import os
    import threading
    import zlib

    from workers.ops import HANDLERS
    from workers.server import Server

    read_end, write_end = os.pipe()
    stdout = io.BytesIO()
    stdin = os.fdopen(read_end, "rb")
    server = Server(stdin, stdout, {"compress": "zlib", **options}, HANDLERS)
    hello: Any = {"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "pid": 1}
    thread = threading.Thread(target=server.serve, args=(hello,), daemon=True)
    thread.start()
    os.write(write_end, b"".join(protocol.encode(r) for r in requests))

    def answered() -> int:  # the done messages the frames written so far unpack to
        data = stdout.getvalue()
        data = data[data.index(b"\n") + 1:] if b"\n" in data else b""
        unzip, text = zlib.decompressobj(0), b""
        while data.startswith(b"z "):
            header, _, data = data.partition(b"\n")
            n = int(header[2:])
            text += unzip.decompress(data[:n])
            data = data[n:]
        return text.count(b'"type":"done"')

    deadline = time.monotonic() + 30
    while answered() < len(requests) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.close(write_end)
    thread.join(10)
    assert not thread.is_alive()
    stdin.close()
    data = stdout.getvalue()
    nl = data.index(b"\n") + 1
    return data[:nl], data[nl:]


async def test_the_real_workers_zlib_frames_are_read_whatever_the_chunking() -> None:
    hello, rest = _real_worker_bytes([{"id": 41, "op": "ping", "args": {}}, {"id": 42, "op": "ping", "args": {}}])
    assert json.loads(hello).get("compress") == "zlib"
    assert rest.startswith(b"z ") and b'"type"' not in rest  # nothing after the hello travels as plain JSON
    for size in (1, 3, 7, 64, len(rest)):
        conn, out, _ = await _connected(hello)
        first = conn.request(protocol.PING({}), timeout=5.0, req_id=41)
        second = conn.request(protocol.PING({}), timeout=5.0, req_id=42)
        plain = conn.request(protocol.PING({}), timeout=5.0, req_id=44)
        # a plain JSON line between two frames is read too (a reader handles both: frames start with "z ")
        header = rest[:rest.index(b"\n") + 1]
        cut = len(header) + int(header[2:])
        stream = rest[:cut] + _done(44) + rest[cut:]
        for i in range(0, len(stream), size):
            out.feed(stream[i:i + size])
        (_, done1), (_, done2), (_, done3) = await first.collect(), await second.collect(), await plain.collect()
        assert done1.get("pong") is True and done2.get("pong") is True and done3 == {}, (size, done1, done2)


@pytest.mark.parametrize("asked, window", [(None, 15), (14, 14), (12, 12), (9, 9), (3, 9), (40, 15), ("12", 15),
                                           (True, 15)])
def test_the_worker_compresses_with_the_window_the_login_side_asks_for(asked: Any, window: int) -> None:
    """compress_window (workers/protocol.py): zlib's range 9-15, 15 when absent or not a number; the stream's
    header says which (its CINFO is log2(window) - 8)."""
    _, rest = _real_worker_bytes([{"id": 45, "op": "ping", "args": {}}],
                                 **({} if asked is None else {"compress_window": asked}))
    header, _, body = rest.partition(b"\n")
    assert (body[0] >> 4) + 8 == window, (asked, body[:2])


async def test_the_login_side_keeps_only_the_window_the_stream_names() -> None:
    """At 12,500 nodes a stream per connection is the login side's largest per-node cost (issue 27): the reader
    holds the window the stream's header names (plus zlib's ~7 KB), not zlib's largest whatever the worker used."""
    import tracemalloc

    held = {}
    for window in (15, 12):
        hello, rest = _real_worker_bytes([{"id": 46, "op": "ping", "args": {}}], compress_window=window)
        tracemalloc.start()
        try:
            conn, out, _ = await _connected(hello)
            req = conn.request(protocol.PING({}), timeout=5.0, req_id=46)
            out.feed(rest)
            (_, done) = await req.collect()
            assert done.get("pong") is True
            held[window] = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    # 32 KB against 4 KB of window; the rest of a connection is the same for both
    assert held[15] - held[12] > 24_000, held


async def test_a_corrupt_zlib_frame_is_a_protocol_error_naming_the_node() -> None:
    hello, rest = _real_worker_bytes([{"id": 43, "op": "ping", "args": {}}])
    header, _, body = rest.partition(b"\n")
    bad = bytes(b ^ 0x55 for b in body[:int(header[2:])])
    conn, out, _ = await _connected(hello)
    req = conn.request(protocol.PING({}), timeout=5.0, req_id=43)
    out.feed(header + b"\n" + bad)
    with pytest.raises(TransportError) as err:
        await req.collect()
    assert err.value.code == "protocol" and "node01" in str(err.value) and "compressed frame" in str(err.value)


def _zlib_frames(messages: list[bytes]) -> bytes:
    """The messages as a worker sends them after its hello: one zlib stream, a `z <n>` frame per message, each
    flushed (workers/server.py)."""
    import zlib

    z = zlib.compressobj(6, zlib.DEFLATED, 15)
    out = []
    for msg in messages:
        packed = z.compress(msg) + z.flush(zlib.Z_SYNC_FLUSH)
        out.append(b"z %d\n" % len(packed) + packed)
    return b"".join(out)


@pytest.mark.parametrize("chunk", [1, 5, 4096, 1 << 30])
async def test_a_run_of_frames_read_at_once_is_unpacked_into_every_message_in_order(chunk: int) -> None:
    """The reader inflates the whole frames it holds in one call (base.BATCH_BYTES at most): every message of
    them reaches its request, in order, whatever the chunking; a frame larger than the batch (random, so it does
    not compress) is still read whole, and the plain lines after the frames are read too (a plain line between
    two frames: test_the_real_workers_zlib_frames_are_read_whatever_the_chunking)."""
    import base64
    import random

    big = base64.b64encode(random.Random(7).randbytes(300_000)).decode()  # > BATCH_BYTES compressed
    hello = protocol.encode({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "pid": 1, "compress": "zlib"})
    conn, out, _ = await _connected(hello)
    reqs = [conn.request(protocol.PING({}), timeout=5.0, req_id=100 + i) for i in range(60)]
    first = [protocol.encode({"type": "item", "id": 100 + i % 30, "data": {"n": i}}) for i in range(90)]
    first.insert(40, protocol.encode({"type": "item", "id": 105, "data": {"big": big}}))
    stream = (_zlib_frames(first + [_done(100 + i) for i in range(30)])
              + b"".join(_done(130 + i) for i in range(30)))  # then plain lines (a reader takes both)
    for i in range(0, len(stream), chunk):
        out.feed(stream[i:i + chunk])
    got = [await r.collect() for r in reqs]
    for i, (items, done) in enumerate(got):
        assert done == {}
        if i >= 30:
            assert items == []
            continue
        want: list[Any] = [{"n": n} for n in range(i, 90, 30)]
        if i == 5:
            want.insert(2, {"big": big})  # the 41st message: after n=5 and n=35, before n=65
        assert items == want, i


async def test_a_malformed_header_after_whole_frames_is_a_protocol_error_once_those_frames_are_read() -> None:
    hello = protocol.encode({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "pid": 1, "compress": "zlib"})
    conn, out, _ = await _connected(hello)
    good = conn.request(protocol.PING({}), timeout=5.0, req_id=150)
    bad = conn.request(protocol.PING({}), timeout=5.0, req_id=151)
    out.feed(_zlib_frames([_item(150, 1), _done(150)]) + b"z 12x\n" + b"\0" * 12)
    assert await good.collect() == ([{"n": 1}], {})
    with pytest.raises(TransportError) as err:
        await bad.collect()
    assert err.value.code == "protocol" and "malformed frame header" in str(err.value)
