"""One request in flight: its arguments, its replies (items, then exactly one done or error) and its cancel."""

from __future__ import annotations

import threading

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from workers import children
from workers.collect.tools import Tools
from workers.protocol import error as error_msg


class OpError(Exception):
    """Ends a request with an error reply: a code from protocol.ERROR_HINTS and a message."""

    def __init__(self, code: str, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint


class Cancelled(Exception):
    """Raised inside an op once its request was cancelled; the cancelled reply has already been sent."""


class Worker:
    """What every op shares: the child registry, the tools, the options, and the send function."""

    def __init__(self, send: Callable[[Dict[str, Any]], None], options: Dict[str, Any]) -> None:
        self.send = send
        self.options = options
        self.children = children.Children()
        self.tools = Tools()
        self.lock = threading.Lock()
        self.scan_lock = threading.Lock()
        self.proc_cache: Any = None  # discover.ProcCache, made by the first discover
        self.proc_source: Any = None  # procinfo's psutil or /proc reader, chosen once


class Request:
    def __init__(self, worker: Worker, req_id: int, op: str, args: Dict[str, Any]) -> None:
        self.worker = worker
        self.id = req_id
        self.op = op
        self.args = args
        self.cancelled = threading.Event()
        # set by a `go` request (or a cancel): a collect asked to hold its dumps until every node discovered
        self.released = threading.Event()
        self._lock = threading.Lock()
        self._finished = False
        # what the dumps of every target of this request share, built once when first needed: the scan of
        # /proc/*/fd and the network tables (workers/collect/fdindex.py, kwait_net.py)
        self.shared: Dict[str, Any] = {}

    # -- replies ------------------------------------------------------------------------------------------

    def item(self, data: Mapping[str, Any]) -> None:
        with self._lock:
            if not self._finished:
                self.worker.send({"type": "item", "id": self.id, "data": data})

    def done(self, data: Mapping[str, Any]) -> None:
        self._finish({"type": "done", "id": self.id, "data": data})

    def error(self, code: str, message: str, hint: Optional[str] = None) -> None:
        self._finish(error_msg(self.id, code, message, hint))

    def _finish(self, msg: Dict[str, Any]) -> bool:
        with self._lock:
            if self._finished:
                return False
            self._finished = True
            self.worker.send(msg)
            return True

    @property
    def finished(self) -> bool:
        return self._finished

    def cancel(self) -> bool:
        """Answer this request with `cancelled` now and kill its tools; its thread winds down by itself
        (still checking and resuming targets, but sending nothing more)."""
        if not self._finish(error_msg(self.id, "cancelled", "request %d was cancelled" % self.id)):
            return False
        self.cancelled.set()
        self.released.set()
        self.worker.children.kill_owner(self)
        return True

    def check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled()

    # -- running tools --------------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], timeout: float, **kw: Any) -> children.Result:
        """Run a child owned by this request (so cancel kills it); raises Cancelled if already cancelled."""
        self.check()
        return children.run(self.worker.children, argv, timeout, owner=self, **kw)

    @property
    def sudo(self) -> bool:
        return bool(self.args.get("sudo") or self.worker.options.get("sudo"))

    # -- argument access (a wrong argument is a bad_request for this request only) ----------------------------

    def arg_int(self, name: str, default: Optional[int] = None, required: bool = False) -> Optional[int]:
        value = self.args.get(name, default)
        if value is None and not required:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise OpError("bad_request", "argument %r must be an integer, got %r" % (name, value))
        return value

    def arg_float(self, name: str, default: float) -> float:
        value = self.args.get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
            raise OpError("bad_request", "argument %r must be a non-negative number, got %r" % (name, value))
        return float(value)

    def arg_bool(self, name: str, default: bool = False) -> bool:
        value = self.args.get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise OpError("bad_request", "argument %r must be true or false, got %r" % (name, value))
        return value

    def arg_str(self, name: str) -> str:
        value = self.args.get(name)
        if not isinstance(value, str):
            raise OpError("bad_request", "argument %r must be a string, got %r" % (name, type(value).__name__))
        return value

    def arg_list(self, name: str) -> Optional[List[Any]]:
        value = self.args.get(name)
        if value is None:
            return None
        if not isinstance(value, list):
            raise OpError("bad_request", "argument %r must be a list, got %r" % (name, type(value).__name__))
        return value
