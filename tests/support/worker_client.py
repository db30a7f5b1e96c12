"""Test helper (engineer B's worker tests): drive `python3 -m workers` as a subprocess over the real protocol.

An isolated worker (isolated=True) is shipped the way hangscope ships it to a node (app/transport/bootstrap.py):
the first stage as `python -I -S -c`, the payload of workers/**.py on its stdin, nothing read from this checkout.
So a worker started as another user (`setpriv --reuid=65534 ...`) runs from a checkout that user cannot read (a
clone in a 0700 folder, root's home), as hangscope's worker runs on a node that has no checkout at all."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from app.transport.bootstrap import build_payload

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/support/ -> repo

# An isolated worker's options, as the session's bootstrap passes them to workers.__main__.main().
ISOLATED_OPTIONS = {"log": True}


class WorkerProc:
    """One worker subprocess; replies are read by a thread so every wait has a deadline."""

    def __init__(self, python: str = sys.executable, isolated: bool = False,
                 env: Optional[Dict[str, str]] = None, args: Sequence[str] = ("--log",),
                 prefix: Sequence[str] = ()) -> None:
        payload = build_payload() if isolated else None
        if payload is not None:
            argv = [python, "-I", "-S", "-c", payload.stage(ISOLATED_OPTIONS)]
        else:
            argv = [python, "-m", "workers", *args]
        argv = [*prefix, *argv]
        full_env = dict(os.environ, PYTHONPATH=REPO)
        full_env.update(env or {})
        # an isolated worker starts in / (as on a node, nothing of the checkout is its business); the other
        # imports `workers` from the checkout, its working directory
        self.proc = subprocess.Popen(argv, cwd="/" if isolated else REPO, env=full_env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._lines: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self._stderr: List[bytes] = []
        self._pumps = [threading.Thread(target=self._pump, daemon=True),
                       threading.Thread(target=self._pump_err, daemon=True)]
        for t in self._pumps:
            t.start()
        self._next_id = 1
        self._pending: List[Dict[str, Any]] = []
        try:
            if payload is not None:
                with contextlib.suppress(BrokenPipeError):  # a stage that exits at once: read() says why
                    self.send_raw(payload.data)
            self.hello = self.read(timeout=20)
        except BaseException:
            self.kill()  # a worker that never said hello: no process, thread or pipe outlives the failure
            raise

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self._lines.put(line)
        self._lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in iter(self.proc.stderr.readline, b""):
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        return b"".join(self._stderr).decode("utf-8", "replace")

    def read(self, timeout: float = 30) -> Dict[str, Any]:
        """The next message; raises EOFError at end of stream, TimeoutError at the deadline."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no message from the worker within %ss; stderr: %s" % (timeout, self.stderr))
        if line is None:
            raise EOFError("worker closed stdout; stderr: %s" % self.stderr)
        return json.loads(line)

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, op: str, args: Optional[Dict[str, Any]] = None) -> int:
        req_id = self._next_id
        self._next_id += 1
        self.send_raw(json.dumps({"id": req_id, "op": op, "args": args or {}}).encode() + b"\n")
        return req_id

    def wait(self, req_id: int, timeout: float = 60) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        """Items and the final done/error of one request (other requests' messages are kept for later)."""
        deadline = time.monotonic() + timeout
        items: List[Dict[str, Any]] = []
        while True:
            for msg in list(self._pending):
                if msg.get("id") == req_id:
                    self._pending.remove(msg)
                    if msg["type"] == "item":
                        items.append(msg["data"])
                    else:
                        return items, msg
            msg = self.read(timeout=max(0.01, deadline - time.monotonic()))
            self._pending.append(msg)

    def call(self, op: str, args: Optional[Dict[str, Any]] = None,
             timeout: float = 60) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        return self.wait(self.send(op, args), timeout)

    def close(self, timeout: float = 10) -> int:
        """Close stdin (EOF) and wait for the worker to exit; returns its status."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """Kill the worker, then let the reader threads see the end of its output and close the pipes (a
        failed test's traceback keeps this object, and with it the pipes, alive otherwise)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for t in self._pumps:
            t.join(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError, ValueError):
                    f.close()

    def __enter__(self) -> "WorkerProc":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
