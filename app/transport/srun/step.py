"""One srun step of the srun transport: the srun process, and each node's demultiplexed worker streams.

See srun.py for how steps are used and mux.py for the framing on the wire.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from app.transport.srun.mux import frame, mux_stage, targets
from app.transport import bootstrap
from app.transport.base import DemuxedChannel, ExitInfo

STDERR_KEEP = 4000
STOP_WAIT = 10.0  # seconds for srun to end after EOF, then after SIGTERM


@dataclass(frozen=True)
class SrunOptions:
    job_id: str
    python: str = bootstrap.DEFAULT_PYTHON
    start_timeout: float = 60.0  # srun step creation plus worker start, per node
    gres_none: bool = True  # --gres=gpu:0: the step must not take (or wait for) the job's GPUs
    batch_window: float = 0.0  # seconds opens wait to share one step (0: the same event-loop turn)
    srun: str = "srun"
    extra_args: tuple[str, ...] = ()
    env: Optional[Mapping[str, str]] = None  # None: this process's environment
    worker_options: Mapping[str, Any] = field(default_factory=dict)


MAX_NODELIST = 16 * 1024  # characters of --nodelist; past them the nodes go in a file (--nodefile)


def node_list(nodes: Sequence[str]) -> str:
    """The nodes as SLURM reads a node list, folded where their names allow (gpu[0001-2048]): 12,500 names of
    10 characters, listed, pass Linux's 128 KiB limit on one argument (issue 27)."""
    try:
        from ClusterShell.NodeSet import NodeSet, NodeSetException

        return str(NodeSet.fromlist(nodes))
    except (ImportError, NodeSetException, ValueError, TypeError):
        return ",".join(nodes)


def srun_argv(options: SrunOptions, nodes: Sequence[str], command: Sequence[str],
              nodefile: Optional[str] = None) -> list[str]:
    """The step: one task per node on exactly these nodes, sharing the job's resources (--overlap). The nodes
    go in --nodelist, folded; or, when even that is long, in `nodefile` (one name a line: write_nodefile)."""
    listed = node_list(nodes)
    where = f"--nodefile={nodefile}" if nodefile is not None and len(listed) > MAX_NODELIST else f"--nodelist={listed}"
    argv = [options.srun, f"--jobid={options.job_id}", "--overlap", f"--nodes={len(nodes)}",
            "--ntasks-per-node=1", f"--ntasks={len(nodes)}", where,
            "--kill-on-bad-exit=0", "--wait=0", "--input=all", f"--job-name=hangscope-{os.getpid()}"]
    if options.gres_none:
        argv.append("--gres=gpu:0")
    return [*argv, *options.extra_args, *command]


class Channel(DemuxedChannel):
    """One node's side of a step: its stdout/stderr as stream readers, and how its worker ended."""

    def __init__(self, step: "Step", name: str) -> None:
        super().__init__()
        self.step = step
        self.name = name
        self.task: Optional[int] = None
        self.pending = bytearray()  # written before the node said which task it is

    # ByteWriter, as WorkerConnection uses it
    def write(self, data: bytes) -> None:
        if not data:
            return
        if self.task is None:
            self.pending += data
        else:
            self.step.put(self.task, "D", data)

    async def drain(self) -> None:
        await self.step.drain()

    def write_eof(self) -> None:
        if self.task is not None:
            self.step.put(self.task, "E")

    def kill(self) -> None:
        if self.task is not None:
            self.step.put(self.task, "K")


class Step:
    """One srun process and the nodes it serves."""

    def __init__(self, options: SrunOptions, names: Sequence[str]) -> None:
        self.options = options
        self.channels = {n: Channel(self, n) for n in names}
        self.by_task: dict[int, Channel] = {}
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.stderr = bytearray()
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping: Optional[asyncio.Task[None]] = None
        self._out: list[tuple[int, str, bytes]] = []  # frames of this loop turn, coalesced by _flush
        self.nodefile: Optional[str] = None

    def put(self, task: int, kind: str, data: bytes = b"") -> None:
        """A frame for one task's worker, sent at the end of this loop turn with the others of the turn: the
        same bytes for many tasks (a pass's request to every node) then go out once (mux.targets)."""
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append((task, kind, data))

    def _flush(self) -> None:
        out, self._out = self._out, []
        group: dict[bytes, list[int]] = {}  # data -> tasks, while no task has a second frame (order per task)
        grouped: set[int] = set()

        def emit() -> None:
            for data, tasks in group.items():
                # `*` only once every node of the step has said which task it is: one that has not would take it too
                every = len(self.by_task) if len(self.by_task) == len(self.channels) else -1
                self.send(frame(tasks[0] if len(tasks) == 1 else targets(tasks, every), "D", data))
            group.clear()
            grouped.clear()

        for task, kind, data in out:
            if task in grouped or kind != "D":
                emit()
            if kind == "D":
                group.setdefault(data, []).append(task)
                grouped.add(task)
            else:
                self.send(frame(task, kind))
        emit()

    async def start(self) -> None:
        o = self.options
        payload = bootstrap.build_payload()
        worker = [*bootstrap.python_argv(o.python), "-c", payload.stage(o.worker_options)]
        names = list(self.channels)
        if len(node_list(names)) > MAX_NODELIST:
            self.nodefile = write_nodefile(names)
        argv = srun_argv(o, names, [*bootstrap.python_argv(o.python), "-c", mux_stage(worker, len(payload.data))],
                         self.nodefile)
        env = dict(os.environ if o.env is None else o.env)
        if shutil.which(o.srun, path=env.get("PATH", os.defpath)) is None:
            self._fail_all(ExitInfo(lost=f"{o.srun} is not on PATH (no SLURM client here)"))
            return
        self.proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, start_new_session=True)  # a Ctrl-C meant for hangscope must not cancel the step mid-dump
        assert self.proc.stdin is not None
        self.proc.stdin.write(payload.data)
        self.tasks = [asyncio.create_task(self._read_stdout(), name="hangscope-srun-stdout"),
                      asyncio.create_task(self._read_stderr(), name="hangscope-srun-stderr")]

    def send(self, data: bytes) -> None:
        if self.proc is None or self.proc.stdin is None or self.proc.stdin.is_closing():
            return
        try:
            self.proc.stdin.write(data)
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            pass  # srun is gone: the stdout reader ends every channel with srun's reason

    async def drain(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            try:
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError, RuntimeError):
                pass

    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        reader = self.proc.stdout
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                self._on_frame(line)
        except (ValueError, asyncio.LimitOverrunError):
            pass  # a line that is no frame of ours and longer than 64 KB: srun's stream is unusable
        code = await self.proc.wait()
        await asyncio.wait(self.tasks[1:], timeout=1.0)
        why = self.stderr_text()
        self._fail_all(ExitInfo(lost=f"the srun step ended (exit status {code})" + (f": {why}" if why else "")))

    def _on_frame(self, line: bytes) -> None:
        parts = line.rstrip(b"\n").split(b" ")
        if len(parts) != 3 or not parts[0].isdigit():
            return  # not ours (srun itself writes only to stderr); never trust it
        task, kind = int(parts[0]), parts[1]
        try:
            data = base64.b64decode(parts[2], validate=True)
        except ValueError:
            return
        if kind == b"H":
            chan = self.channels.get(data.decode("utf-8", "replace"))
            if chan is not None and chan.task is None and task not in self.by_task:
                chan.task = task
                self.by_task[task] = chan
                if chan.pending:
                    self.send(frame(task, "D", bytes(chan.pending)))
                    chan.pending.clear()
            return
        chan = self.by_task.get(task)
        if chan is None:
            return
        if kind == b"O":
            chan.stdout.feed_data(data)
        elif kind == b"E":
            chan.stderr.feed_data(data)
        elif kind == b"X":
            code = int(data) if data.lstrip(b"-").isdigit() else None
            if code is not None and code < 0:
                chan.finish(ExitInfo(None, signal=_signal_name(-code)))
            else:
                chan.finish(ExitInfo(code))

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            chunk = await self.proc.stderr.read(1 << 14)
            if not chunk:
                return
            self.stderr += chunk
            del self.stderr[:-STDERR_KEEP]

    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()[-1500:]

    def blames(self, host: str) -> bool:
        """srun named this node as the one it could not launch on (it then aborts every node's task)."""
        return re.search(rf"\bon node {re.escape(host)}\b", self.stderr_text()) is not None

    def _fail_all(self, info: ExitInfo) -> None:
        for chan in self.channels.values():
            chan.finish(info)

    def node_closed(self, chan: Channel) -> None:
        chan.closed = True
        if all(c.closed for c in self.channels.values()) and self.stopping is None:
            self.stopping = asyncio.get_running_loop().create_task(self.stop())

    async def stop(self) -> None:
        """EOF to every worker, then SIGTERM, then SIGKILL to srun, each after STOP_WAIT."""
        proc = self.proc
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.write_eof()
            except (OSError, RuntimeError):
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                await asyncio.wait_for(proc.wait(), STOP_WAIT)
                break
            except asyncio.TimeoutError:
                if proc.returncode is None:
                    proc.send_signal(sig)
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.nodefile is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.nodefile)


def write_nodefile(nodes: Sequence[str]) -> str:
    """A private file naming the nodes one a line, for srun --nodefile (removed when the step stops)."""
    fd, path = tempfile.mkstemp(prefix="hangscope-nodes-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(nodes) + "\n")
    return path


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)
