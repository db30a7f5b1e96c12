"""Run the GPU test program on this node under `python -m torch.distributed.run`, streaming its output.

One request = one torchrun on this node (`--standalone`: local ranks only; the program joins the global
world itself, see program.py). Every process of the test carries HANGSCOPE_GPUTEST=<token>; whatever way
the request ends (finished, deadline, `gpu_stop`, cancel, worker exit) every marked process is killed and
torchrun's log directory removed before the request answers. A stop first sends SIGUSR1 to the ranks so
that faulthandler prints where each one is stuck, and gives them `dump_wait` seconds to do so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from workers import children
from workers.gputest.marked import MARK_ENV, LogTails, clean, kill_marked, signal_marked
from workers.request import OpError, Request

CONFIG_ENV = "HANGSCOPE_GPUTEST_CONFIG"
MAX_PROCS = 256
FLUSH_EVERY = 0.2  # seconds between item messages while output flows
_TOKEN = re.compile(r"^[0-9a-f]{8,64}$")
_ENV_NAME = re.compile(r"^(NCCL|GLOO|TORCH|CUDA|UCX|FI|OMP|MASTER|TP|NVIDIA)_[A-Z0-9_]{1,64}$")
_DEVICES = re.compile(r"^[A-Za-z0-9,:-]{0,512}$")

_stops: Dict[str, threading.Event] = {}
_stops_lock = threading.Lock()


def request_stop(token: str) -> bool:
    """Ask the running launch with this token to dump stacks and stop; False when none runs."""
    with _stops_lock:
        event = _stops.get(token)
    if event is None:
        return False
    event.set()
    return True


def program_source() -> str:
    spec = importlib.util.find_spec("workers.gputest.program")
    loader = spec.loader if spec is not None else None
    source = loader.get_source("workers.gputest.program") if loader is not None else None  # type: ignore[attr-defined]
    if not source:
        raise OpError("internal", "the test program's source is not available in this worker")
    return source


def resolve_python(python: str) -> str:
    """An absolute, executable interpreter path; never run through a shell."""
    path = python if "/" in python else (shutil.which(python) or "")
    if not path or not os.path.isabs(path) or not os.access(path, os.X_OK) or os.path.isdir(path):
        raise OpError("tool_missing", "%r is not an executable python on this node" % python,
                      hint="pass --python with the job's interpreter (the one that has torch)")
    return path


class Launch:
    def __init__(self, req: Request) -> None:
        self.req = req
        self.token = req.arg_str("token")
        if not _TOKEN.match(self.token):
            raise OpError("bad_request", "token must be 8-64 lowercase hex digits")
        self.python = resolve_python(req.arg_str("python"))
        self.nproc = req.arg_int("nproc", 1) or 1
        if not 1 <= self.nproc <= MAX_PROCS:
            raise OpError("bad_request", "nproc must be 1..%d" % MAX_PROCS)
        config = req.args.get("config")
        if not isinstance(config, dict) or len(json.dumps(config)) > 65536:
            raise OpError("bad_request", "config must be an object (at most 64 KiB as JSON)")
        self.config = config
        self.timeout = req.arg_float("timeout", 600.0)
        self.dump_wait = min(req.arg_float("dump_wait", 1.5), 10.0)
        self.max_lines = req.arg_int("max_lines", 50000) or 50000
        self.env = self._env(req)

    def _env(self, req: Request) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANGSCOPE_")}
        env.update({MARK_ENV: self.token, CONFIG_ENV: json.dumps(self.config), "PYTHONUNBUFFERED": "1"})
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # a collective timeout ends the rank
        if req.arg_bool("nccl_debug", True):
            env["NCCL_DEBUG"] = "INFO"
            env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET,ENV")
        devices = req.args.get("cuda_visible_devices")
        if devices is not None:
            if not isinstance(devices, str) or not _DEVICES.match(devices):
                raise OpError("bad_request", "cuda_visible_devices must be a device list")
            env["CUDA_VISIBLE_DEVICES"] = devices
        extra = req.args.get("env") or {}
        if not isinstance(extra, dict):
            raise OpError("bad_request", "env must be an object")
        for name, value in extra.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name) or not isinstance(value, str) \
                    or "\0" in value or len(value) > 4096:
                raise OpError("bad_request", "env %r is not a setting hangscope passes "
                                             "(NCCL_*, GLOO_*, TORCH_*, CUDA_*, ...)" % (name,))
            env[name] = value
        return env

    def argv(self, log_dir: str) -> List[str]:
        return [self.python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                "--nproc_per_node", str(self.nproc), "--max_restarts", "0", "--redirects", "3",
                "--log_dir", log_dir, "--no_python", self.python, "-u", "-c", program_source()]

    def run(self) -> Dict[str, Any]:
        started = time.monotonic()
        stop = threading.Event()
        with _stops_lock:
            if self.token in _stops:
                raise OpError("bad_request", "token %s is already running" % self.token)
            _stops[self.token] = stop
        log_dir = tempfile.mkdtemp(prefix="hangscope-gputest-")
        out = _Output(self.req, self.max_lines)
        result: Dict[str, Any] = {"timed_out": False, "stopped": False, "cancelled": False}
        proc: Optional["subprocess.Popen[bytes]"] = None
        try:
            try:
                proc = self.req.worker.children.spawn(self.argv(log_dir), owner=self.req, env=self.env)
            except OSError as exc:
                raise OpError("tool_failed", "cannot start %s: %s" % (self.python, exc))
            tails = LogTails(log_dir)
            self._pump(proc, tails, out, stop, result, started)
            _, left = self._finish(proc, tails, out, result)
        finally:
            with _stops_lock:
                _stops.pop(self.token, None)
            if proc is not None and proc.poll() is None:
                children.kill_group(proc)
                proc.wait()
            kill_marked(self.token)
            if proc is not None:
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
                self.req.worker.children.forget(proc)
            shutil.rmtree(log_dir, ignore_errors=True)
        out.flush()
        result.update({"returncode": proc.returncode if proc is not None else None, "survivors": left,
                       "lines": out.count, "dropped": out.dropped, "elapsed": round(time.monotonic() - started, 3)})
        return result

    def _pump(self, proc: "subprocess.Popen[bytes]", tails: LogTails, out: "_Output", stop: threading.Event,
              result: Dict[str, Any], started: float) -> None:
        """Forward output until torchrun exits, or until a stop/deadline/cancel (then dump, then return)."""
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        sel.register(proc.stdout, selectors.EVENT_READ, "agent")
        sel.register(proc.stderr, selectors.EVENT_READ, "agent")
        partial: Dict[int, bytes] = {}
        dump_until: Optional[float] = None
        try:
            while True:
                now = time.monotonic()
                if self.req.cancelled.is_set():
                    result["cancelled"] = True
                    return
                if dump_until is None and (stop.is_set() or now - started >= self.timeout):
                    result["stopped" if stop.is_set() else "timed_out"] = True
                    # where is each rank stuck? faulthandler answers SIGUSR1 without needing the GIL
                    signal_marked(self.token, signal.SIGUSR1, skip=(proc.pid,))
                    dump_until = now + self.dump_wait
                if dump_until is not None and now >= dump_until:
                    out.add(tails.poll())
                    return
                if not sel.get_map() and proc.poll() is not None:
                    return
                for key, _ in sel.select(0.1):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    lines = (partial.pop(key.fd, b"") + data).split(b"\n")
                    partial[key.fd] = lines.pop()[-65536:]
                    out.add([("agent", None, clean(line)) for line in lines])
                out.add(tails.poll())
                out.maybe_flush()
        finally:
            sel.close()
            for rest in partial.values():
                if rest:
                    out.add([("agent", None, clean(rest))])

    def _finish(self, proc: "subprocess.Popen[bytes]", tails: LogTails, out: "_Output",
                result: Dict[str, Any]) -> Tuple[List[int], List[int]]:
        """Kill whatever of the test still runs, collect the last output; (killed pids, survivors)."""
        killed, left = kill_marked(self.token)
        children.kill_group(proc)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        out.add(tails.poll(final=True))
        # processes of a test that ended by itself must all have exited with it: count any that had not
        result["leftovers"] = 0 if (result["timed_out"] or result["stopped"] or result["cancelled"]) \
            else len([p for p in killed if p != proc.pid])
        result["killed"] = len(killed)
        return killed, left


class _Output:
    """Batches (stream, local rank, text) lines into item messages; caps the total, never event lines."""

    def __init__(self, req: Request, max_lines: int) -> None:
        self.req = req
        self.max_lines = max_lines
        self.batch: List[List[Any]] = []
        self.count = 0
        self.dropped = 0
        self.last = time.monotonic()

    def add(self, lines: List[Tuple[str, Optional[int], str]]) -> None:
        for stream, local_rank, text in lines:
            self.count += 1
            # past the cap only the program's own event lines still go (they are few per rank), and past
            # four times the cap nothing does: a flood must not fill the login node's memory
            if self.count > self.max_lines and (not text.startswith("HANGSCOPE-GPUTEST ")
                                                or self.count > 4 * self.max_lines):
                self.dropped += 1
                continue
            self.batch.append([stream, local_rank, text])

    def maybe_flush(self) -> None:
        if self.batch and (len(self.batch) >= 500 or time.monotonic() - self.last >= FLUSH_EVERY):
            self.flush()

    def flush(self) -> None:
        if self.batch:
            self.req.item({"lines": self.batch})
            self.batch = []
        self.last = time.monotonic()
