"""The request loop: a reader thread feeds a queue, each request runs in its own thread, replies are
serialised under one lock and flushed per message; EOF or shutdown kills every child and returns."""

from __future__ import annotations

import fcntl
import os
import queue
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import IO, Any, Callable, Dict, Mapping, Optional

    from workers.protocol import CancelDone, GoDone, Hello

from workers.protocol import CANCEL, GO, SHUTDOWN, ProtocolError, decode, encode, error
from workers.redact import redact_message
from workers.request import Cancelled, OpError, Request, Worker

Z_SYNC_FLUSH = 2  # zlib.Z_SYNC_FLUSH: zlib is imported only when a login side asks for compression
# the zlib window (log2 bytes) the login side may ask for with "compress_window" (workers/protocol.py); zlib's own
# range, its largest (32 KB) when the login side names none
Z_WINDOW_MIN, Z_WINDOW_MAX = 9, 15

if TYPE_CHECKING:
    Handler = Callable[[Request], Mapping[str, Any]]

# How long exiting waits for request threads to finish their after-tool checks (resume a stopped target).
_WIND_DOWN = 3.0


def _take_buffered(stdin: IO[bytes], fd: int) -> bytes:
    """Bytes the bootstrap's buffered reader already pulled from the fd, taken without blocking."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        out = b""
        while True:
            # read1 serves the buffer first; with an empty buffer its one raw read returns b"" (EAGAIN).
            chunk = stdin.read1(1 << 20)  # type: ignore[attr-defined]
            if not chunk:
                return out
            out += chunk
    except BlockingIOError:
        return out
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)


def log(options: Dict[str, Any], text: str) -> None:
    if options.get("log"):
        sys.stderr.write("hangscope-worker: %s\n" % text)
        sys.stderr.flush()


class Server:
    def __init__(self, stdin: IO[bytes], stdout: IO[bytes], options: Dict[str, Any],
                 handlers: Dict[str, Handler]) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self._out_lock = threading.Lock()
        self._lines: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self._handlers = handlers
        self._active: Dict[int, Request] = {}
        self._active_lock = threading.Lock()
        self._threads: "list[threading.Thread]" = []
        self._closed = False
        self.options = options
        self.worker = Worker(self.send, options)
        self._zip: Any = None  # a zlib stream for every message after the hello, when the options ask for it

    def send(self, msg: Mapping[str, Any]) -> None:
        # every string of every reply, redacted here: nothing secret leaves the node, whichever op produced it
        data = encode(redact_message(msg))
        with self._out_lock:
            if self._closed:
                return
            if self._zip is not None:
                # one frame per message, flushed: it leaves now, and the stream's window still spans the
                # messages before it (a node's ranks repeat each other's paths and names)
                packed = self._zip.compress(data) + self._zip.flush(Z_SYNC_FLUSH)
                data = b"z %d\n" % len(packed) + packed
            try:
                self._stdout.write(data)
                self._stdout.flush()
            except (OSError, ValueError):
                # The login side is gone: nobody reads replies any more, so stop as if stdin hit EOF.
                self._closed = True
                self._lines.put(None)

    def _read(self) -> None:
        try:
            fd = self._stdin.fileno()
            pending = bytearray(_take_buffered(self._stdin, fd))
            scanned = 0  # bytes of pending known to hold no newline: a 7 MB push_tool line is scanned once
            while True:
                nl = pending.find(b"\n", scanned)
                if nl >= 0:
                    self._lines.put(bytes(pending[:nl + 1]))
                    del pending[:nl + 1]
                    scanned = 0
                    continue
                scanned = len(pending)
                # The raw fd, not the buffered object: a daemon thread blocked inside BufferedReader holds
                # its lock, and interpreter shutdown then aborts trying to take it.
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                pending += chunk
            if pending.strip():
                self._lines.put(bytes(pending))
        except (OSError, ValueError) as exc:
            log(self.options, "stdin: %s" % exc)
        self._lines.put(None)

    def serve(self, hello: Hello) -> int:
        """Send hello, answer requests until EOF, shutdown or a malformed line; return the exit status."""
        compress = self.options.get("compress") == "zlib"
        if compress:
            hello = dict(hello, compress="zlib")  # type: ignore[assignment]
        self.send(hello)
        if compress:
            import zlib

            window = self.options.get("compress_window")
            if not isinstance(window, int) or isinstance(window, bool):
                window = Z_WINDOW_MAX
            with self._out_lock:
                self._zip = zlib.compressobj(6, zlib.DEFLATED, min(max(window, Z_WINDOW_MIN), Z_WINDOW_MAX))
        threading.Thread(target=self._read, name="stdin", daemon=True).start()
        status = 0
        try:
            while True:
                line = self._lines.get()
                if line is None:
                    log(self.options, "stdin closed")
                    break
                if not line.strip():
                    continue
                try:
                    req = self._parse(line)
                except ProtocolError as exc:
                    self.send(error(None, "bad_request", str(exc)))
                    status = 2
                    break
                if req.op == SHUTDOWN.name:
                    with self._active_lock:
                        pending = list(self._active.values())
                    for other in pending:  # each still gets its one final reply
                        other.cancel()
                    req.done({})
                    break
                self._start(req)
        finally:
            self._exit()
        return status

    def _parse(self, line: bytes) -> Request:
        msg = decode(line)
        req_id, op, args = msg.get("id"), msg.get("op"), msg.get("args", {})
        if isinstance(req_id, bool) or not isinstance(req_id, int):
            raise ProtocolError("request without an integer id: %r" % (line[:200],))
        if not isinstance(op, str):
            raise ProtocolError("request %d without an op" % req_id)
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ProtocolError("request %d: args must be an object" % req_id)
        with self._active_lock:
            if req_id in self._active:
                raise ProtocolError("request id %d is already in use" % req_id)
        return Request(self.worker, req_id, op, args)

    def _start(self, req: Request) -> None:
        handler = self._handlers.get(req.op)
        if handler is None and req.op not in (CANCEL.name, GO.name):
            req.error("unknown_op", "unknown op %r; this worker knows %s"
                      % (req.op, ", ".join(sorted(list(self._handlers) + [CANCEL.name, GO.name, SHUTDOWN.name]))))
            return
        with self._active_lock:
            self._active[req.id] = req
        t = threading.Thread(target=self._run, args=(req, handler), name="req-%d" % req.id, daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _run(self, req: Request, handler: Optional[Handler]) -> None:
        started = time.monotonic()
        try:
            if handler is None:
                req.done(self._cancel(req) if req.op == CANCEL.name else self._go(req))
            else:
                req.done(handler(req))
        except OpError as exc:
            req.error(exc.code, exc.message, exc.hint)
        except Cancelled:
            pass
        except Exception as exc:  # a bug must not take the other requests down: report it as internal
            import traceback  # only for a bug's report

            log(self.options, traceback.format_exc())
            req.error("internal", "%s: %s" % (type(exc).__name__, exc))
        finally:
            with self._active_lock:
                self._active.pop(req.id, None)
            log(self.options, "%s %d took %.3fs" % (req.op, req.id, time.monotonic() - started))

    def _cancel(self, req: Request) -> CancelDone:
        target = req.arg_int("target", required=True)
        assert target is not None
        with self._active_lock:
            victim = self._active.get(target) if target != req.id else None
        return {"cancelled": bool(victim is not None and victim.cancel())}

    def _go(self, req: Request) -> GoDone:
        """Release a collect that holds its dumps (its "hold" argument) until every node has discovered."""
        target = req.arg_int("target", required=True)
        assert target is not None
        with self._active_lock:
            held = self._active.get(target) if target != req.id else None
        # a request that has answered is over, though its thread may not have left _active yet: nothing to release
        if held is not None and held.finished:
            held = None
        if held is not None:
            held.released.set()
        return {"released": held is not None}

    def _exit(self) -> None:
        with self._active_lock:
            pending = list(self._active.values())
        for req in pending:
            req.cancelled.set()
        self.worker.children.kill_all()
        deadline = time.monotonic() + _WIND_DOWN
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._out_lock:
            self._closed = True
        self.worker.tools.cleanup()
