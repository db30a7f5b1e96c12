"""Relays: the login side opens one SSH connection per group of nodes; the relay on the group's first node
starts the worker on every node of its group (its own locally, the others with the node's own ssh) and
multiplexes their streams up its one channel (framing.py; the node side is stage.py).

Each node still gets an ordinary WorkerConnection (hello, requests, deadlines, errors), over streams
demultiplexed from its relay's channel, as the srun transport does: Session, decode and the analysis do not
know. Opens that arrive together (a session's first pass opens every node at once) are grouped; below the
threshold they go direct over SSH. A child's failure arrives as the code a direct connection would give
(refused, unreachable, auth_failed, the worker's exit...), named "via relay NODE"; a relay that cannot be
reached or dies before its children said hello has its children retried direct, within their deadline.
Closing a node's connection sends EOF (then kill) to its worker through the relay; closing the last one
closes the relay's stdin: the relay ends every child (EOF, kill after a grace period) and exits.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, cast

from app.errors import TransportError
from app.transport import bootstrap
from app.transport.base import DemuxedChannel, ExitInfo, WorkerConnection
from app.transport.push import lend_pyspy
from app.transport.relay.framing import FramingError, UpReader, down_to, relay_stage
from app.transport.ssh import SshProcess, SshTransport

if TYPE_CHECKING:
    from app.hosts import HostSpec
    from workers.protocol import ErrorCode

# Measured on the fake cluster (docs/performance.md, bench/relay.py): relays pay off from this many nodes opened
# together; below it every node is reached direct.
AUTO_THRESHOLD = 64
MIN_WIDTH, MAX_WIDTH = 8, 128
KILL_GRACE = 3.0  # seconds a child's worker has after EOF before its relay kills it
START_PARALLEL = 32  # children of one relay between ssh start and their first output at once
STDERR_KEEP = 4000
# a child's ssh failure that says the relay's node cannot ssh to it (nodes without shared keys or known host
# keys), not that the child is down: such a child is retried direct, within its deadline
NODE_SSH_MISSING = frozenset({"auth_failed", "host_key_unknown", "host_key_changed"})
MARK_NO_SSH = "relay: cannot run"  # stage.py's message when the node has no ssh client
RELAY_EXIT_WAIT = KILL_GRACE + 5.0


def auto_width(n: int) -> int:
    """Nodes per relay for n nodes: ~sqrt(n), so that the login side's connections (n/W) and each relay's
    (W) grow alike: 200 nodes -> 15, 12,500 -> 112."""
    return max(MIN_WIDTH, min(MAX_WIDTH, math.ceil(math.sqrt(n))))


@dataclass(frozen=True)
class RelayOptions:
    width: Optional[int] = None  # nodes per relay, the relay's own included; None: auto_width
    threshold: int = AUTO_THRESHOLD  # fewer nodes opened together go direct
    parallel: int = START_PARALLEL
    grace: float = KILL_GRACE
    batch_window: float = 0.05  # seconds opens wait to be grouped with others

    @classmethod
    def from_flag(cls, value: str) -> Optional["RelayOptions"]:
        """`--relay auto|off|WIDTH`: None for off; a WIDTH relays any two or more nodes opened together."""
        if value == "off":
            return None
        if value == "auto":
            return cls()
        width = int(value)
        if width < 2:
            raise ValueError("a relay width is 2 or more nodes (--relay off: no relays)")
        return cls(width=width, threshold=2)


def groups(n: int, width: int) -> list[range]:
    """n nodes in ceil(n / width) groups of sizes that differ by one at most."""
    count = max(1, math.ceil(n / max(1, width)))
    size, extra = divmod(n, count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        out.append(range(start, end))
        start = end
    return out


# What the node's OpenSSH client prints when it cannot get in, and the code a direct connection would give.
_SSH_FAILURES = (
    (re.compile(r"Could not resolve hostname|Name or service not known"), "dns", "connect"),
    (re.compile(r"Connection refused"), "refused", "connect"),
    (re.compile(r"No route to host|Network is unreachable|Host is down"), "unreachable", "connect"),
    (re.compile(r"timed out|Connection timeout"), "connect_timeout", "connect"),
    (re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED"), "host_key_changed", "connect"),
    (re.compile(r"Host key verification failed|No \w+ host key is known"), "host_key_unknown", "connect"),
    (re.compile(r"Permission denied"), "auth_failed", "login"),
    (re.compile(r"kex_exchange_identification|Connection closed by .* port"), "throttled", "login"),
)


def ssh_failure(stderr: str) -> tuple["ErrorCode", str, str]:
    """(code, phase, the line that says it) for the stderr of an `ssh` that exited 255 before the worker ran."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    for pattern, code, phase in _SSH_FAILURES:
        for line in reversed(lines):
            if pattern.search(line):
                return cast("ErrorCode", code), phase, line
    return "ssh_error", "connect", lines[-1] if lines else "ssh exited 255"


class Channel(DemuxedChannel):
    """One child's side of a relay: its stdout/stderr as stream readers, how its worker ended (ByteWriter)."""

    def __init__(self, relay: "Relay", index: int, spec: "HostSpec") -> None:
        super().__init__()
        self.relay = relay
        self.index = index
        self.spec = spec

    def write(self, data: bytes) -> None:
        if data:
            self.relay.put(self.index, "D", data)

    async def drain(self) -> None:
        await self.relay.drain()

    def write_eof(self) -> None:
        self.relay.put(self.index, "E")

    def kill(self) -> None:
        self.relay.put(self.index, "K")


class Relay:
    """One relay: its SSH process on specs[0]'s node and the children it serves (specs[0] itself is child 0)."""

    def __init__(self, transport: "RelayTransport", specs: Sequence["HostSpec"]) -> None:
        self.transport = transport
        self.name = specs[0].name
        self.channels = [Channel(self, i, s) for i, s in enumerate(specs)]
        self.proc: Optional[SshProcess] = None
        self.error: Optional[TransportError] = None  # the relay itself could not be reached
        self.lost: Optional[str] = None  # the relay's stream ended: why
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stderr = bytearray()
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping: Optional[asyncio.Task[None]] = None
        self._out: list[tuple[int, str, bytes]] = []
        self._early: list[bytes] = []  # frames put before the relay's channel was open
        self.bytes_up = 0
        self.up_after = 0.0  # seconds from the start to the relay's channel being open
        self.bytes_down = 0

    # -- starting --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        t = self.transport
        o = t.ssh.options
        payload = bootstrap.build_payload()
        stage = payload.stage(o.worker_options)
        children = [None] + [(c.spec.host, c.spec.port or o.port, c.spec.user or o.user) for c in self.channels[1:]]
        code = relay_stage(len(payload.data), [*bootstrap.python_argv(o.python), "-c", stage],
                           bootstrap.remote_command(o.python, stage), children,
                           connect_timeout=o.connect_timeout, grace=t.options.grace, parallel=t.options.parallel,
                           start_deadline=o.connect_timeout + o.start_timeout)
        command = bootstrap.remote_command(o.python, code)
        spec = self.channels[0].spec
        t0 = time.monotonic()
        try:
            self.proc = await t.ssh.start_command(spec.host, command, name=spec.name, user=spec.user,
                                                  port=spec.port)
        except TransportError as exc:
            self.error = exc
            self._fail_all(ExitInfo(lost=f"relay {self.name} could not be reached: {exc.message}"))
            self.ready.set_result(None)
            return
        except BaseException as exc:
            self.error = TransportError("ssh_error", f"{self.name}: cannot start the relay: {exc}", phase="connect")
            self._fail_all(ExitInfo(lost=self.error.message))
            self.ready.set_result(None)
            raise
        process = self.proc.process
        try:
            process.stdin.write(payload.data)
            for data in self._early:
                process.stdin.write(data)
        except Exception:
            pass  # the reader finds out why
        self._early.clear()
        self.up_after = time.monotonic() - t0
        self.tasks = [asyncio.create_task(self._read_stdout(), name=f"hangscope-relay-{self.name}"),
                      asyncio.create_task(self._read_stderr(), name=f"hangscope-relay-err-{self.name}")]
        self.ready.set_result(None)

    # -- downward: coalesced frames ----------------------------------------------------------------------------

    def put(self, index: int, kind: str, data: bytes = b"") -> None:
        """A frame for one child, sent at the end of this loop turn with the others of the turn: the same bytes
        for many children (a pass's request to every node) go down once, addressed to all of them."""
        if self.lost is not None or self.error is not None:
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append((index, kind, data))

    def _flush(self) -> None:
        out, self._out = self._out, []
        group: dict[bytes, list[int]] = {}  # data -> children, while no child has a second frame (order)
        every = len(self.channels)

        def emit() -> None:
            for data, kids in group.items():
                self.send(down_to(kids, every, "D", data))
            group.clear()
            grouped.clear()

        grouped: set[int] = set()
        for index, kind, data in out:
            if index in grouped or kind != "D":
                emit()
            if kind == "D":
                group.setdefault(data, []).append(index)
                grouped.add(index)
            else:
                self.send(down_to([index], every, kind))
        emit()

    def send(self, data: bytes) -> None:
        self.bytes_down += len(data)
        if self.proc is None:
            self._early.append(data)
            return
        try:
            self.proc.process.stdin.write(data)
        except Exception:
            pass  # the relay is gone: its reader ends every child with the reason

    async def drain(self) -> None:
        if self.proc is not None:
            try:
                await self.proc.process.stdin.drain()
            except Exception:
                pass

    # -- upward: demultiplexing ----------------------------------------------------------------------------

    async def _read_stdout(self) -> None:
        assert self.proc is not None
        reader = UpReader()
        why = ""
        try:
            while True:
                chunk = await self.proc.process.stdout.read(1 << 16)
                if not chunk:
                    break
                self.bytes_up += len(chunk)
                for kind, index, data in reader.feed(chunk):
                    self._on_frame(kind, index, data)
        except FramingError as exc:
            why = f"it broke the relay protocol ({exc})"
            self.proc.kill()
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        try:
            info = await asyncio.wait_for(self.proc.wait_exit(), 5.0)
        except Exception:
            info = ExitInfo(lost="no exit status")
        await asyncio.wait(self.tasks[1:], timeout=1.0)
        if not why:
            why = (info.lost or (f"exit status {info.returncode}" if info.returncode is not None
                                 else f"signal {info.signal}"))
        tail = self.stderr.decode("utf-8", "replace").strip()[-1500:]
        self.lost = f"relay {self.name} ended ({why})" + (f": {tail}" if tail else "")
        self._fail_all(ExitInfo(lost=self.lost))
        # nothing more can come through it: close its SSH connection now, not when every child is closed (a
        # session drops a lost connection without closing it, and a relay's node may see none of it)
        await self.proc.close()

    def _on_frame(self, kind: str, index: int, data: bytes) -> None:
        if index >= len(self.channels):
            return
        chan = self.channels[index]
        if kind == "O":
            chan.stdout.feed_data(data)
        elif kind == "E":
            chan.stderr.feed_data(data)
        else:
            text = data.decode("ascii", "replace")
            code = int(text) if text.lstrip("-").isdigit() else None
            if code is not None and code < 0:
                chan.finish(ExitInfo(None, signal=_signal_name(-code)))
            else:
                chan.finish(ExitInfo(code))

    async def _read_stderr(self) -> None:
        assert self.proc is not None
        try:
            while True:
                chunk = await self.proc.process.stderr.read(1 << 14)
                if not chunk:
                    return
                self.stderr += chunk
                del self.stderr[:-STDERR_KEEP]
        except Exception:
            return

    def _fail_all(self, info: ExitInfo) -> None:
        for chan in self.channels:
            chan.finish(info)

    # -- ending ----------------------------------------------------------------------------------------------

    def child_closed(self, chan: Channel) -> None:
        chan.closed = True
        if all(c.closed for c in self.channels) and self.stopping is None:
            self.stopping = asyncio.get_running_loop().create_task(self.stop())

    async def stop(self) -> None:
        """EOF on the relay's stdin (it ends every child: EOF, then kill after the grace), wait for it to exit,
        then close its SSH connection (sshd then ends whatever is left of it)."""
        if not self.ready.done():
            await asyncio.shield(self.ready)
        proc = self.proc
        if proc is None:
            return
        try:
            proc.process.stdin.write_eof()
        except Exception:
            pass
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=RELAY_EXIT_WAIT)
        await proc.close()
        for task in self.tasks:
            task.cancel()


class RelayTransport:
    """Opens workers on SSH nodes through relays when enough are opened together (app.transport.connect)."""

    def __init__(self, ssh: SshTransport, options: RelayOptions) -> None:
        self.ssh = ssh
        self.options = options
        self._batch: list["HostSpec"] = []
        self._batch_fut: Optional[asyncio.Future[list[Optional[Channel]]]] = None
        self.relays: list[Relay] = []

    async def open(self, spec: "HostSpec") -> WorkerConnection:
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        if self._batch_fut is None:
            self._batch_fut = loop.create_future()
            loop.call_later(self.options.batch_window, self._flush)
        fut = self._batch_fut
        pos = len(self._batch)
        self._batch.append(spec)
        try:
            chan = (await asyncio.shield(fut))[pos]
        except asyncio.CancelledError:
            def abandon(f: asyncio.Future[list[Optional[Channel]]]) -> None:
                got = f.result()[pos]
                if got is not None:
                    got.kill()
                    got.relay.child_closed(got)
            fut.add_done_callback(abandon)
            raise
        if chan is None:
            return await self.ssh.open(spec.host, name=spec.name, user=spec.user, port=spec.port)
        return await self._open_child(chan, t0)

    def _flush(self) -> None:
        specs, fut = self._batch, self._batch_fut
        self._batch, self._batch_fut = [], None
        assert fut is not None
        n = len(specs)
        if n < max(2, self.options.threshold):
            fut.set_result([None] * n)
            return
        width = self.options.width or auto_width(n)
        assigned: list[Optional[Channel]] = [None] * n
        for group in groups(n, width):
            if len(group) < 2:
                continue  # a relay for itself alone is a direct connection with extra steps
            relay = Relay(self, [specs[i] for i in group])
            self.relays.append(relay)
            for i, chan in zip(group, relay.channels):
                assigned[i] = chan
            task = asyncio.get_running_loop().create_task(relay.start())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        fut.set_result(assigned)

    async def _open_child(self, chan: Channel, t0: float) -> WorkerConnection:
        relay, spec, o = chan.relay, chan.spec, self.ssh.options
        deadline = t0 + o.connect_timeout + o.start_timeout
        try:
            await asyncio.shield(relay.ready)
        except BaseException:  # cancelled while its relay connects: the relay must still end with its children
            chan.kill()
            relay.child_closed(chan)
            raise
        if relay.error is not None:
            chan.relay.child_closed(chan)
            if chan.index == 0:
                raise relay.error  # the relay's node is this node: its own SSH error is its error
            return await self._direct(spec, f"relay {relay.name} could not be reached ({relay.error.message})")

        async def on_close() -> None:
            relay.child_closed(chan)
            if relay.stopping is not None:
                await asyncio.shield(relay.stopping)

        conn = WorkerConnection(spec.name, chan.stdout, chan, chan.stderr, chan.wait_exit, kill=chan.kill,
                                on_close=on_close, python=o.python)
        conn.timings["relay"] = relay.up_after  # how long its relay took to connect: the node came through one
        conn.timings["connect"] = time.monotonic() - t0
        try:
            await conn.start(b"", max(0.1, deadline - time.monotonic()))  # the payload went to the relay once
        except TransportError as exc:
            await conn.close(kill=True, timeout=1.0)
            error = self._translate(exc, conn, chan)
            if chan.index > 0 and deadline - time.monotonic() > 1.0:
                if relay.lost is not None:
                    return await self._direct(spec, relay.lost)
                if error.code in NODE_SSH_MISSING or MARK_NO_SSH in conn.stderr_tail:
                    # the relay's node could not ssh to this one (no shared key, no known host key, no ssh):
                    # a setup the login node need not share; the login node's own SSH decides
                    return await self._direct(spec, error.message)
            raise error from None
        except BaseException:
            await conn.close(kill=True, timeout=1.0)
            raise
        if o.push_pyspy:
            await lend_pyspy(conn)
        conn.timings["total"] = time.monotonic() - t0
        return conn

    async def _direct(self, spec: "HostSpec", why: str) -> WorkerConnection:
        conn = await self.ssh.open(spec.host, name=spec.name, user=spec.user, port=spec.port)
        conn.warnings.append(f"reached directly: {why}")
        return conn

    def _translate(self, exc: TransportError, conn: WorkerConnection, chan: Channel) -> TransportError:
        via = f"via relay {chan.relay.name}"
        if chan.index == 0:
            return TransportError(exc.code, f"{exc.message} (relay node)", phase=exc.phase, hint=exc.hint)
        info = conn.exit
        if info is not None and info.returncode == 255 and not conn.hello and exc.code == "worker_crashed":
            code, phase, line = ssh_failure(conn.stderr_tail)
            return TransportError(code, f"{chan.spec.name}: {line} ({via})", phase=phase)
        if chan.relay.lost is not None and exc.code in ("lost", "worker_crashed", "timeout"):
            return TransportError("lost", f"{chan.spec.name}: {chan.relay.lost} ({via})", phase=exc.phase)
        return TransportError(exc.code, f"{exc.message} ({via})", phase=exc.phase, hint=exc.hint)


def _signal_name(num: int) -> str:
    import signal

    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)
