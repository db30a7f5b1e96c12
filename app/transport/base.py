"""One connection to one worker over a byte reader/writer pair: hello, requests routed by id, deadlines.

Shared by the local and SSH transports. It never imports asyncssh: a transport hands over its streams and a
coroutine that says how the worker ended (ExitInfo); the transport alone translates its library's errors.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, Protocol, TypeVar, cast

from app.errors import TransportError, remote_code

if TYPE_CHECKING:
    from workers.protocol import Call, Hello
from app.transport import bootstrap, lines
from app.transport.request import Request, WorkerRequestError
from app.transport.within import within
from workers import protocol

__all__ = ["ByteReader", "ByteWriter", "ExitInfo", "Request", "WorkerConnection", "WorkerRequestError"]

MAX_LINE = 256 * 1024 * 1024  # a dump with locals of many threads is large; anything bigger is broken
MAX_NOISE_LINES = 200  # lines a chatty login shell may print before the worker's hello
STDERR_TAIL = 4000  # characters of the worker's stderr kept for error messages
EXIT_WAIT = 5.0  # seconds to wait for the worker's exit status once its output ended
ROOM_WAIT = 5.0  # seconds the reader waits at most for a consumer that is behind before it reads a chunk more

# Request ids come from one counter for every connection of the process: unique on each connection as the
# protocol wants, and a caller that sends the same request to many nodes (a pass) can give them all one id
# (next_request_id), so that the srun transport sends it once for every node (app/transport/srun/step.py).
_REQUEST_IDS = itertools.count(1)


def next_request_id() -> int:
    """A request id no connection of this process has used."""
    return next(_REQUEST_IDS)


ItemT = TypeVar("ItemT")  # a request's items, as its op (workers/protocol.py) says
DoneT = TypeVar("DoneT")  # its done data


BATCH_BYTES = 128 * 1024  # compressed bytes inflated in one call at most: deflate expands at most ~1,032 x, so a
# batch cannot unpack to MAX_LINE, and the limit still applies to one frame as before (a single frame is never cut)


def _frames(buf: bytearray, end: int, total: int) -> tuple[int, list[tuple[int, int]]]:
    """The zlib frames (`z <n>` header, n bytes) that follow a frame of `total` bytes ending at `end`, as far as
    they are whole in buf and all of them together under BATCH_BYTES: (where the last one ends, their [start, end)
    spans). Stops at anything else (a plain line, a malformed header: the reader's own loop takes those as
    before). A corrupt frame in a run still ends the connection as a protocol error; the messages of the run's
    earlier frames then go with it (a stream that broke is not trusted, and its node fails as "protocol")."""
    spans: list[tuple[int, int]] = []
    size_at = len(buf)
    while end + 2 < size_at and buf[end] == 0x7A and buf[end + 1] == 0x20:  # "z "
        nl = buf.find(b"\n", end + 2, end + 16)
        digits = buf[end + 2:nl] if nl > 0 else b""
        if not digits.isdigit():
            break
        size = int(digits)
        if size > MAX_LINE or nl + 1 + size > size_at or total + size > BATCH_BYTES:
            break
        spans.append((nl + 1, nl + 1 + size))
        total += size
        end = nl + 1 + size
    return end, spans


class ByteReader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class ByteWriter(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def write_eof(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ExitInfo:
    """How a worker ended, as its transport saw it."""

    returncode: Optional[int] = None  # None: unknown (killed by a signal, or the connection dropped)
    signal: Optional[str] = None
    lost: Optional[str] = None  # set when the connection dropped: why


class DemuxedChannel:
    """One node's worker streams, demultiplexed from a process that carries several nodes' (an srun step, a
    relay): its stdout/stderr as stream readers and how its worker ended. A subclass is the ByteWriter that
    WorkerConnection writes to (write, drain, write_eof, kill), sending back through that process."""

    def __init__(self) -> None:
        self.stdout = asyncio.StreamReader(limit=1 << 30)
        self.stderr = asyncio.StreamReader()
        self.exit: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()
        self.closed = False

    def finish(self, info: ExitInfo) -> None:
        if not self.exit.done():
            self.exit.set_result(info)
            self.stdout.feed_eof()
            self.stderr.feed_eof()

    def close(self) -> None:
        pass  # the carrying process ends when its last node is closed

    async def wait_exit(self) -> ExitInfo:
        return await asyncio.shield(self.exit)


class WorkerConnection:
    """A started worker: `start()` sends the payload and waits for hello, then `request()`/`call()`."""

    def __init__(self, name: str, stdout: ByteReader, stdin: ByteWriter, stderr: Optional[ByteReader],
                 wait_exit: Callable[[], Awaitable[ExitInfo]], *,
                 kill: Optional[Callable[[], None]] = None,
                 on_close: Optional[Callable[[], Awaitable[None]]] = None, python: str = "") -> None:
        self.name = name
        self.python = python  # the interpreter command, for messages that tell the user what to change
        self._stdout = stdout
        self._stdin = stdin
        self._stderr = stderr
        self._wait_exit = wait_exit
        self._kill = kill
        self._on_close = on_close
        self._ids = _REQUEST_IDS
        self._requests: dict[int, Request[Any, Any]] = {}
        self._pressure: list[asyncio.Future[None]] = []  # requests whose consumer is behind (backpressure)
        self._stderr_tail: deque[str] = deque()
        self._stderr_len = 0
        self._hello: asyncio.Future[Hello] = asyncio.get_running_loop().create_future()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.hello: Hello = {}
        self.error: Optional[TransportError] = None  # why the worker is gone, once it is
        self.exit: Optional[ExitInfo] = None
        self.noise: list[str] = []  # what the login shell printed before hello
        self.warnings: list[str] = []
        self.timings: dict[str, float] = {}
        self.pid: Optional[int] = None  # the worker's pid on its node, from hello
        # what the decoders of this connection's requests keep between them (app/session: the stack table the
        # compact protocol refers to); a relay's nodes share their relay's
        self.shared: dict[str, Any] = {}

    @property
    def closed(self) -> bool:
        return self.exit is not None or self._closing

    @property
    def stderr_tail(self) -> str:
        return "".join(self._stderr_tail)[-STDERR_TAIL:]

    async def start(self, payload: bytes, timeout: float) -> Hello:
        """Send the payload, wait for hello and check its protocol version."""
        t0 = time.monotonic()
        self._tasks.append(asyncio.create_task(self._read_stdout(), name=f"hangscope-stdout-{self.name}"))
        if self._stderr is not None:
            self._tasks.append(asyncio.create_task(self._read_stderr(), name=f"hangscope-stderr-{self.name}"))
        try:
            try:
                self._stdin.write(payload)
                await within(self._stdin.drain(), timeout)
            except asyncio.TimeoutError:
                raise
            except Exception:
                pass  # the channel is already gone: the stdout reader finds out why and fails the hello
            hello = await within(asyncio.shield(self._hello), max(0.0, t0 + timeout - time.monotonic()))
        except asyncio.TimeoutError:
            err = TransportError("timeout", f"{self.name}: the worker did not start within {timeout:.1f} s"
                                 f"{self._stderr_note()}", phase="start",
                                 hint="the node is overloaded or its login shell is slow; retry or raise the deadline")
            await self.close(kill=True)
            raise err from None
        if hello.get("protocol") != protocol.PROTOCOL_VERSION:
            err = TransportError("protocol", f"{self.name}: the worker speaks protocol {hello.get('protocol')!r}, "
                                 f"this hangscope speaks {protocol.PROTOCOL_VERSION}", phase="start")
            await self.close(kill=True)
            raise err
        if self.noise:
            shown = "; ".join(line[:120] for line in self.noise[:3])
            self.warnings.append(f"the login shell printed {len(self.noise)} line(s) before the worker "
                                 f"started: {shown!r}")
        self.hello = hello
        self.pid = hello.get("pid") if isinstance(hello.get("pid"), int) else None
        self.timings["start"] = time.monotonic() - t0
        return hello

    # -- requests ------------------------------------------------------------------------------------------

    def request(self, call: Call[Any, ItemT, DoneT], *, timeout: Optional[float] = None,
                decode: Optional[Callable[[Any], Any]] = None, req_id: Optional[int] = None) -> Request[ItemT, DoneT]:
        """Send one request (`protocol.COLLECT({...})`: its arguments checked by mypy against the op's); iterate
        the result for its items (each passed through `decode` in the reader when given: Request). `timeout`
        is how long the request may go without a message; `req_id`, one from next_request_id() (the same for
        a request sent to many nodes), else a new one. Raises at once if the worker is gone."""
        if self.error is not None:
            raise self.error
        if self.closed:
            raise TransportError("lost", f"{self.name}: the worker connection is closed")
        loop = asyncio.get_running_loop()
        if req_id is None or req_id in self._requests:
            req_id = next(self._ids)
        req: Request[ItemT, DoneT] = Request(self, req_id, call.op, None if timeout is None else loop.time() + timeout,
                                             decode)
        self._requests[req_id] = req
        self.send_nowait(call.message(req_id))
        return req

    async def call(self, call: Call[Any, ItemT, DoneT], *, timeout: Optional[float] = None) -> DoneT:
        """A request whose items do not matter: returns the `done` data."""
        _, done = await self.request(call, timeout=timeout).collect()
        return done

    async def cancel(self, req_id: int) -> None:
        """Ask the worker to end request `req_id`; it then ends with error code "cancelled"."""
        self.send_cancel(req_id)
        await self._drain(EXIT_WAIT)

    def send_nowait(self, msg: dict) -> None:
        if self.closed:
            return
        try:
            # Written, not drained: the channel sends what it buffers as the peer's window or pipe allows, and a
            # drain would only make this caller wait for that. request() stays synchronous, and a pass sends
            # ~2 messages a node: a drain task beside each (a task, a deadline timer, a coroutine; ~15 us) was
            # waited for by nobody (what a request sends is small; a node that stops reading fails its request
            # by its deadline, which counts from the node's own activity: request.py).
            self._stdin.write(protocol.encode(msg))
        except Exception:  # the channel is already gone; the stdout reader reports why
            return

    async def _drain(self, timeout: float) -> None:
        try:
            await within(self._stdin.drain(), timeout)
        except Exception:  # a dead channel or a node that stopped reading: the reader task decides
            pass

    # -- reading -------------------------------------------------------------------------------------------

    async def _read_stdout(self) -> None:
        buf = bytearray()
        scanned = 0  # bytes of buf known to hold no newline: a multi-MB dump line is scanned once, not per chunk
        need = -1  # bytes still to come of a zlib frame whose `z <n>` header was read (protocol.py)
        unzip: Any = None
        try:
            while True:
                chunk = await self._stdout.read(1 << 16)
                if not chunk:
                    break
                buf += chunk
                pos = 0  # what is consumed of buf: cut once per chunk, not once per line
                while True:
                    if need >= 0:
                        if len(buf) - pos < need:
                            break
                        # the whole frames that follow go into the same inflate call (a node's ~19 messages
                        # a pass arrive together: one call and one split for them, not one each)
                        end, spans = _frames(buf, pos + need, need)
                        if spans:
                            with memoryview(buf) as view:
                                packed = b"".join([view[pos:pos + need], *(view[a:b] for a, b in spans)])
                        else:
                            packed = bytes(buf[pos:end])
                        pos = end
                        need = -1
                        if unzip is None:  # with the window the stream's header names (memory: that, ~7 KB)
                            unzip = zlib.decompressobj(0)
                        try:
                            text = unzip.decompress(packed, MAX_LINE)
                        except zlib.error as exc:
                            return await self._violation(TransportError(
                                "protocol", f"{self.name}: a compressed frame from the worker is corrupt: {exc}"))
                        if unzip.unconsumed_tail:
                            return await self._violation(TransportError(
                                "protocol", f"{self.name}: a compressed frame unpacks to more than {MAX_LINE} bytes"))
                        for line in text.split(b"\n"):
                            if line and not self._on_line(line):
                                return await self._violation(None)
                        # not kept while this reader waits for the next chunk: a node's whole pass (~35 KB) held
                        # by every suspended reader was ~400 MB at 12,500 nodes
                        text = packed = line = b""
                        continue
                    nl = buf.find(b"\n", max(pos, scanned))
                    if nl < 0:
                        scanned = len(buf)
                        break
                    line = bytes(buf[pos:nl])
                    pos = nl + 1
                    if line[:2] == b"z " and self._hello.done():
                        size = line[2:]
                        if not size.isdigit() or int(size) > MAX_LINE:
                            return await self._violation(TransportError(
                                "protocol", f"{self.name}: a malformed frame header from the worker: {line[:40]!r}"))
                        need = int(size)
                        continue
                    if not self._on_line(line):
                        return await self._violation(None)
                if pos:
                    del buf[:pos]
                    scanned = max(0, scanned - pos)
                while self._pressure:  # a consumer is behind: stop reading until it catches up (Request.room)
                    room = self._pressure.pop()
                    # bounded: a consumer that went away without abandoning its request must not stop the
                    # connection for good; it then reads on, a chunk per ROOM_WAIT
                    await asyncio.wait([room], timeout=ROOM_WAIT)
                if len(buf) > MAX_LINE + 64:
                    return await self._violation(TransportError(
                        "protocol", f"{self.name}: a line from the worker exceeds {MAX_LINE} bytes"))
        except Exception:
            pass  # the transport's wait_exit says what happened to the channel
        await self._ended(None)

    def _on_line(self, line: bytes) -> bool:
        """Handle one line; False ends the connection (a protocol violation)."""
        if not line.strip():
            return True
        if not self._hello.done():
            try:
                msg = lines.decode(line)
            except protocol.ProtocolError:
                msg = {}
            if msg.get("type") == "hello":
                self._hello.set_result(cast("Hello", msg))  # remote: app/decode checks each value it takes
                return True
            # A login shell's rc file may print to stdout before exec; tolerate a little of it.
            self.noise.append(line.decode("utf-8", errors="replace"))
            if len(self.noise) > MAX_NOISE_LINES:
                self._fail(TransportError("protocol", f"{self.name}: no hello from the worker after "
                                          f"{MAX_NOISE_LINES} lines of other output", phase="start"))
                return False
            return True
        try:
            msg = lines.decode(line)
        except protocol.ProtocolError as exc:
            self._fail(TransportError("protocol", f"{self.name}: malformed line from the worker: {exc}"))
            return False
        req_id = msg.get("id")
        if msg.get("type") == "error" and req_id is None:
            self._fail(WorkerRequestError(remote_code(msg.get("code")), f"{self.name}: the worker gave up: {msg.get('message', '')}"))
            return False
        req = self._requests.get(req_id) if isinstance(req_id, int) else None
        if req is not None:  # replies to abandoned requests are dropped
            req.put(msg)
            room = req.room()
            if room is not None:
                self._pressure.append(room)
        return True

    def forget(self, req_id: int) -> None:
        self._requests.pop(req_id, None)

    def send_go(self, req_id: int, go_id: Optional[int] = None) -> None:
        """Release a collect request that holds its dumps (its "hold" argument) until this go (`go_id`: one id
        from next_request_id() for every node's go, as for the request)."""
        self.send_nowait(protocol.GO({"target": req_id}).message(go_id if go_id is not None else next(self._ids)))

    def send_cancel(self, req_id: int) -> None:
        self.send_nowait(protocol.CANCEL({"target": req_id}).message(next(self._ids)))

    async def _read_stderr(self) -> None:
        assert self._stderr is not None
        try:
            while True:
                chunk = await self._stderr.read(1 << 14)
                if not chunk:
                    return
                text = chunk.decode("utf-8", errors="replace")
                self._stderr_tail.append(text)
                self._stderr_len += len(text)
                while self._stderr_len > 2 * STDERR_TAIL and len(self._stderr_tail) > 1:
                    self._stderr_len -= len(self._stderr_tail.popleft())
        except Exception:
            return

    def _stderr_note(self) -> str:
        tail = self.stderr_tail.strip()
        return f"; its stderr ends with: {tail[-1500:]}" if tail else ""

    async def _violation(self, error: Optional[TransportError]) -> None:
        """The worker broke the protocol: nothing it says can be trusted any more, so stop it now."""
        if error is not None:
            self._fail(error)
        self._closing = True
        try:
            self._stdin.write_eof()
        except Exception:
            pass
        if self._kill is not None:
            self._kill()
        await self._ended(None)

    async def _ended(self, error: Optional[TransportError]) -> None:
        """The worker's output is over: find out how it ended and fail whatever still waits."""
        if len(self._tasks) > 1:  # let stderr drain so that the message can quote it
            await asyncio.wait(self._tasks[1:], timeout=1.0)
        try:
            info = await within(self._wait_exit(), EXIT_WAIT)
        except Exception:
            if self._kill is not None:
                self._kill()
            info = ExitInfo(lost="the worker closed its output but did not exit")
        self.exit = info
        if error is None and not self._closing:
            error = self._classify(info)
        if error is not None:
            self._fail(error)
        elif self._requests:
            self._fail(TransportError("lost", f"{self.name}: the worker connection was closed"))

    def _classify(self, info: ExitInfo) -> Optional[TransportError]:
        phase = "" if self._hello.done() else "start"
        if info.lost:
            return TransportError("lost", f"{self.name}: connection lost: {info.lost}", phase=phase)
        tail = self.stderr_tail
        if not self._hello.done():
            if info.returncode == bootstrap.EXIT_OLD_PYTHON or bootstrap.MARK_OLD_PYTHON in tail:
                found = tail.split(bootstrap.MARK_OLD_PYTHON, 1)[-1].strip().splitlines()[0:1]
                return TransportError("no_python", f"{self.name}: {self.python or 'python'} is too old: "
                                      f"{''.join(found)}", phase="start")
            if info.returncode in (126, 127):
                return TransportError("no_python", f"{self.name}: could not run {self.python or 'python'} "
                                      f"(exit {info.returncode}){self._stderr_note()}", phase="start")
        if info.returncode == 0 and not self._requests and self._hello.done():
            return None  # a clean exit after shutdown
        how = f"exit status {info.returncode}" if info.returncode is not None else f"signal {info.signal or '?'}"
        return TransportError("worker_crashed", f"{self.name}: the worker ended ({how}){self._stderr_note()}",
                              phase=phase)

    def _fail(self, error: TransportError) -> None:
        if self.error is None:
            self.error = error
        if not self._hello.done():
            self._hello.set_exception(error)
            self._hello.exception()  # mark retrieved: start() may already have given up waiting
        for req in list(self._requests.values()):
            req.put(error)
        self._requests.clear()

    # -- closing -------------------------------------------------------------------------------------------

    def end_input(self, *, kill: bool = False) -> None:
        """The first half of close(), at once and without waiting: pending requests fail as cancelled and the
        worker gets EOF on its stdin (it stops its tools and exits), so that it ends while the caller does other
        work; close() then waits for the exit. Idempotent."""
        if self._closing:
            return
        self._closing = True
        for req in list(self._requests.values()):
            req.put(TransportError("cancelled", f"{self.name}: the session closed"))
        self._requests.clear()
        try:
            if kill and self._kill is not None:
                self._kill()
            self._stdin.write_eof()
        except Exception:
            pass

    async def close(self, *, kill: bool = False, timeout: float = EXIT_WAIT) -> None:
        """EOF on the worker's stdin (it stops everything and exits); kill it if it does not go in time."""
        self.end_input(kill=kill)
        if self._tasks:
            done, pending = await asyncio.wait(self._tasks, timeout=timeout)
            if pending and self._kill is not None:
                self._kill()
                await asyncio.wait(pending, timeout=timeout)
            for task in pending:
                task.cancel()
        try:
            self._stdin.close()
        except Exception:
            pass
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            await on_close()
