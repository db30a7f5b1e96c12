"""Workers on nodes over SSH (asyncssh): one connection per node, a fan-out window, deadlines per phase.

The only module that knows asyncssh's and the OS's connection errors: each is translated here into a
TransportError with a code from workers.protocol.ERROR_HINTS and a sentence naming the node and the phase.
Never prompts (no passwords, no passphrases) and never weakens host key checking.
"""

from __future__ import annotations

import asyncio
import errno
import getpass
import os
import random
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, cast

from app.errors import TransportError
from app.transport import bootstrap
from app.transport.auth import auth_failure
from app.transport.base import ExitInfo, WorkerConnection
from app.transport.files import DEFAULT_CONFIGS, usable
from app.transport.hostkeys import HostKeyCheck, KnownHostsCache, known_hosts_paths
from app.transport.push import lend_pyspy
from app.transport.sshconfig import HostConfig
from app.transport.sshlib import asyncssh

THROTTLE_BACKOFF = 0.25  # seconds before the first retry; doubled each time, with jitter


@dataclass(frozen=True)
class SshOptions:
    user: Optional[str] = None  # default: the hosts entry's user, then ssh config, then the local user
    port: Optional[int] = None
    config_paths: Optional[tuple[str, ...]] = None  # None: ~/.ssh/config then /etc/ssh/ssh_config
    known_hosts: Optional[tuple[str, ...]] = None  # None: UserKnownHostsFile + GlobalKnownHostsFile
    identity: tuple[str, ...] = ()
    python: str = bootstrap.DEFAULT_PYTHON
    # The whole of a node's connect and login: TCP (through any ProxyJump), sshd's banner, key exchange,
    # authentication and any retries after MaxStartups drops. One deadline, the user's --connect-timeout.
    connect_timeout: float = 10.0
    start_timeout: float = 30.0  # the command starts and the worker says hello
    keepalive_interval: float = 10.0
    keepalive_count_max: int = 3
    accept_new_host_keys: bool = False
    fanout: int = 64
    throttle_retries: int = 4
    push_pyspy: bool = True
    worker_options: Mapping[str, Any] = field(default_factory=dict)


class _Throttled(Exception):
    """sshd closed the connection before its banner: MaxStartups is dropping new connections."""


LOGIN_TIMER_REASON = "Login timeout expired"  # asyncssh's own login timer ends the connection with this


def cipher_preference(cfg: Any) -> Any:
    """asyncssh's default ciphers with AES-GCM first, unless the ssh config names its own (then those).

    The server takes the client's first choice it supports. asyncssh runs chacha20-poly1305 as three cipher
    contexts and a Poly1305 per packet from Python (~16-25 us), AES-GCM as one call (~3-6 us); a refresh
    moves ~30 packets per node, so at hundreds of nodes on one event loop that is the difference of a
    whole core's milliseconds. Both are what OpenSSH offers by default."""
    if cfg is not None and cfg.get("Ciphers"):
        return ()  # the config's list applies
    algs = [a.decode("ascii") for a in asyncssh.encryption.get_default_encryption_algs()]
    return sorted(algs, key=lambda a: 0 if "-gcm@" in a else 1)


def reuse_config(cfg: Any) -> Optional[asyncssh.SSHClientConnectionOptions]:
    """Options that hand the host config parsed for this connection to asyncssh.connect, which would parse
    the files again (asyncssh's parser costs ~15 us a line in Python: 2 ms per node for a 130-line config, and
    a config with a block per node grows with the cluster). None where asyncssh must read the files itself:
    a ProxyJump (the jump host gets its own lookup), CanonicalizeHostname or `Match final` (a second pass)."""
    if cfg is None or cfg.get("ProxyJump") or cfg.get("CanonicalizeHostname") or cfg.has_match_final():
        return None
    # asyncssh bases a connection's config on `options.config` (its last_config) and reads no file when
    # given no paths; an options object carrying only that config is what it builds for a reconnect.
    opts = asyncssh.SSHClientConnectionOptions.__new__(asyncssh.SSHClientConnectionOptions)
    opts.kwargs = {}
    opts.config = cfg
    return opts


class _Client(asyncssh.SSHClient):
    """Watches one connection: when TCP came up, the host key offered, and why the connection ended."""

    def __init__(self, check: HostKeyCheck) -> None:
        self.check = check
        self.made = asyncio.Event()
        self.conn: Optional[asyncssh.SSHClientConnection] = None
        self.lost: Optional[Exception] = None
        self.ended = False

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn
        self.made.set()

    @property
    def banner_seen(self) -> bool:
        return bool(self.conn is not None and self.conn.get_extra_info("server_version"))

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.ended = True
        self.lost = exc

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        return self.check.decide(host, addr, port, key)


class SshTransport:
    """Opens workers on nodes; at most `fanout` nodes are between connect and hello at any time."""

    def __init__(self, options: SshOptions = SshOptions()) -> None:
        self.options = options
        self._sem: Optional[asyncio.Semaphore] = None
        self._known = KnownHostsCache()
        paths = DEFAULT_CONFIGS if options.config_paths is None else options.config_paths
        # regular files only: a FIFO or a device here would block or never end (the CLI refused them already)
        self.config_paths = [p for p in (os.path.expanduser(x) for x in paths) if usable(p)]

    def host_config(self, host: str, user: Optional[str], port: Optional[int]) -> asyncssh.config.SSHClientConfig:
        """The ssh config as it applies to this host (first value wins across files, as in OpenSSH)."""
        # load() is typed as returning the base class; called on HostConfig it builds one. HostConfig tokenizes
        # each file once per process: a config with a block per node is not read again for every node.
        return cast(asyncssh.config.SSHClientConfig, HostConfig.load(
            None, self.config_paths, False, False, False, getpass.getuser(),
            user if user else (), host, port if port else ()))

    async def open(self, host: str, *, name: Optional[str] = None, user: Optional[str] = None,
                   port: Optional[int] = None) -> WorkerConnection:
        """Connect, log in, start the worker and wait for its hello; raises TransportError."""
        name = name or host
        user = user or self.options.user
        port = port or self.options.port
        if self._sem is None:
            self._sem = asyncio.Semaphore(max(1, self.options.fanout))
        async with self._sem:
            t0 = time.monotonic()
            conn, client, timings, warnings = await self._connect(host, name, user, port)
            try:
                worker = await self._start(conn, client, name)
            except BaseException:
                conn.abort()
                raise
            worker.timings.update(timings)
            worker.warnings[:0] = warnings
            if self.options.push_pyspy:
                await lend_pyspy(worker)
            worker.timings["total"] = time.monotonic() - t0
            return worker

    # -- connecting ----------------------------------------------------------------------------------------

    async def _connect(self, host: str, name: str, user: Optional[str], port: Optional[int]
                       ) -> tuple[asyncssh.SSHClientConnection, _Client, dict[str, float], list[str]]:
        """Connect and log in, retrying MaxStartups drops with backoff; all of it within connect_timeout."""
        deadline = time.monotonic() + self.options.connect_timeout
        try:
            cfg = self.host_config(host, user, port)
        except (OSError, ValueError) as exc:
            raise TransportError("ssh_error", f"{name}: cannot read ssh config: {exc}", phase="connect") from None
        except RecursionError:
            raise TransportError("ssh_error", f"{name}: cannot read ssh config: its Includes loop",
                                 phase="connect") from None
        known = self._known.get(known_hosts_paths(cfg, self.options.known_hosts))
        warnings = list(self._known.warnings)
        delay = THROTTLE_BACKOFF
        attempt = 0
        while True:
            client = _Client(HostKeyCheck(known, self.options.accept_new_host_keys))
            try:
                conn, timings = await self._connect_once(host, name, user, port, client, known, cfg, deadline)
            except TransportError as exc:
                if attempt and exc.code == "connect_timeout":
                    # sshd dropped this node's earlier attempts, and a retry then ran out of the deadline (an
                    # overloaded sshd: slow to answer, or still at MaxStartups): the cause seen first is the one to
                    # act on, whatever the last attempt's symptom
                    detail = exc.message[len(name) + 2:] if exc.message.startswith(name + ": ") else exc.message
                    raise TransportError(
                        "throttled", f"{name}: sshd closed the connection before its banner {attempt} time(s) "
                        f"(MaxStartups), then a retry ran out of the deadline: {detail}", phase=exc.phase) from None
                raise
            except _Throttled:
                pause = delay * (0.5 + random.random())
                if attempt >= self.options.throttle_retries or time.monotonic() + pause >= deadline:
                    raise TransportError(
                        "throttled", f"{name}: sshd closed the connection before its banner {attempt + 1} "
                        f"time(s) within the {self.options.connect_timeout:g} s connect deadline (MaxStartups)",
                        phase="connect") from None
                await asyncio.sleep(pause)  # backoff: sshd is overloaded
                delay *= 2
                attempt += 1
                continue
            if attempt:
                warnings.append(f"sshd dropped {attempt} connection attempt(s) (MaxStartups); retried")
            if client.check.accepted:
                written = client.check.append_accepted()
                warnings.append(f"accepted the new host key {client.check.fingerprint} and added it to {written}")
            return conn, client, timings, warnings

    async def _connect_once(self, host: str, name: str, user: Optional[str], port: Optional[int],
                            client: _Client, known: asyncssh.SSHKnownHosts, cfg: Any, deadline: float
                            ) -> tuple[asyncssh.SSHClientConnection, dict[str, float]]:
        o = self.options
        t0 = time.monotonic()
        parsed = reuse_config(cfg)
        task = asyncio.ensure_future(asyncssh.connect(
            host, port if port else (), username=user if user else (),
            config=() if parsed is not None else self.config_paths, options=parsed,
            known_hosts=known, client_factory=lambda: client, connect_timeout=None,
            # a backstop only: our own deadline below ends the attempt first and names the phase
            login_timeout=max(1.0, deadline - t0) + 5.0, keepalive_interval=o.keepalive_interval,
            keepalive_count_max=o.keepalive_count_max, client_keys=list(o.identity) if o.identity else (),
            ignore_encrypted=True, password_auth=False, kbdint_auth=False,
            encryption_algs=cipher_preference(cfg),
            # the worker needs none of the user's agent, X11 or environment on the node, whatever the config
            agent_forwarding=False, x11_forwarding=False))
        made = asyncio.ensure_future(client.made.wait())
        phase = "connect"
        timings: dict[str, float] = {}
        try:
            await asyncio.wait({task, made}, timeout=max(0.0, deadline - time.monotonic()),
                               return_when=asyncio.FIRST_COMPLETED)
            if not made.done() and not task.done():
                raise asyncio.TimeoutError
            timings["connect"] = time.monotonic() - t0
            phase = "login"
            conn = await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - time.monotonic()))
            timings["login"] = time.monotonic() - t0 - timings["connect"]
            return conn, timings
        except BaseException as exc:
            task.cancel()
            made.cancel()
            await asyncio.gather(task, made, return_exceptions=True)
            if isinstance(exc, asyncio.CancelledError):
                raise
            if isinstance(exc, asyncssh.PermissionDenied) and client.check.accepted:
                client.check.append_accepted()  # the key exchange proved the key before auth failed
            raise self._translate(exc, name, host, port, phase, client, cfg) from None

    def _translate(self, exc: BaseException, name: str, host: str, port: Optional[int], phase: str,
                   client: _Client, cfg: Any) -> BaseException:
        o = self.options
        where = f"{host}:{port or cfg.get('Port', 22)}"
        login_timer = isinstance(exc, asyncssh.ConnectionLost) and exc.reason == LOGIN_TIMER_REASON
        if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or login_timer:
            # asyncssh's own timeouts carry an empty message: always say which node and which phase. Its login
            # timer ends the connection like a drop before the banner would: a deadline, never MaxStartups.
            limit = f"the {o.connect_timeout:g} s connect deadline (--connect-timeout)"
            if phase == "connect":
                return TransportError("connect_timeout", f"{name}: no TCP connection to {where} within {limit}",
                                      phase="connect")
            if not client.banner_seen:
                return TransportError("connect_timeout", f"{name}: {where} accepted the TCP connection but sshd "
                                      f"sent no SSH banner within {limit}", phase="login")
            return TransportError("connect_timeout", f"{name}: connected to {where}, but the SSH key exchange "
                                  f"and login did not finish within {limit}", phase="login")
        if isinstance(exc, socket.gaierror):
            return TransportError("dns", f"{name}: cannot resolve {host!r}: {exc.strerror or exc}", phase="connect")
        if isinstance(exc, ConnectionRefusedError):
            return TransportError("refused", f"{name}: connection to {where} refused", phase="connect")
        if isinstance(exc, asyncssh.HostKeyNotVerifiable):
            return client.check.error(name, exc.reason)
        if isinstance(exc, asyncssh.PermissionDenied):
            return auth_failure(name, cfg, o.identity, exc.reason)
        pre_banner = phase == "login" and not client.banner_seen
        if isinstance(exc, (asyncssh.ConnectionLost, ConnectionResetError, BrokenPipeError)) and pre_banner:
            return _Throttled()
        if isinstance(exc, asyncssh.DisconnectError):
            return TransportError("ssh_error", f"{name}: {where} ended the SSH session during {phase}: "
                                  f"{exc.reason or type(exc).__name__}", phase=phase)
        if isinstance(exc, OSError):
            if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN):
                return TransportError("unreachable", f"{name}: {where} is unreachable: {exc.strerror}",
                                      phase="connect")
            if exc.filename:
                return TransportError("auth_failed", f"{name}: cannot read {exc.filename}: {exc.strerror}",
                                      phase="login")
            return TransportError("ssh_error", f"{name}: {where}: {exc.strerror or exc}", phase=phase)
        if isinstance(exc, asyncssh.KeyImportError):
            return TransportError("auth_failed", f"{name}: cannot use an identity file: {exc}", phase="login")
        if isinstance(exc, (asyncssh.Error, ValueError)):
            return TransportError("ssh_error", f"{name}: {where}: {exc}", phase=phase)
        return TransportError("ssh_error", f"{name}: {where}: {type(exc).__name__}: {exc}", phase=phase)

    # -- starting the worker -------------------------------------------------------------------------------

    async def start_command(self, host: str, command: str, *, name: Optional[str] = None,
                            user: Optional[str] = None, port: Optional[int] = None) -> "SshProcess":
        """Connect and log in as open() does (fan-out window, host key checks, deadlines, the same errors) and
        start `command` instead of the worker: a relay (app/transport/relay) runs over this."""
        name = name or host
        user = user or self.options.user
        port = port or self.options.port
        if self._sem is None:
            self._sem = asyncio.Semaphore(max(1, self.options.fanout))
        async with self._sem:
            conn, client, timings, warnings = await self._connect(host, name, user, port)
            try:
                process = await self._process(conn, client, name, command)
            except BaseException:
                conn.abort()
                raise
        return SshProcess(conn, client, process, timings, warnings)

    async def _process(self, conn: asyncssh.SSHClientConnection, client: _Client, name: str,
                       command: str) -> "asyncssh.SSHClientProcess[bytes]":
        try:
            # never a pty (RequestTTY in a config would mangle the binary protocol) and no SendEnv
            return await asyncio.wait_for(conn.create_process(command, encoding=None, request_pty=False,
                                                              term_type=None, send_env=None),
                                          self.options.start_timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise TransportError("ssh_error", f"{name}: the node did not start a session within "
                                 f"{self.options.start_timeout:g} s", phase="start") from None
        except (asyncssh.Error, OSError) as exc:
            if client.ended:
                raise TransportError("lost", f"{name}: connection lost while starting the worker: "
                                     f"{client.lost or exc}", phase="start") from None
            raise TransportError("ssh_error", f"{name}: cannot start a session: {exc}", phase="start") from None

    async def _start(self, conn: asyncssh.SSHClientConnection, client: _Client, name: str) -> WorkerConnection:
        payload = bootstrap.build_payload()
        command = bootstrap.remote_command(self.options.python, payload.stage(self.options.worker_options))
        t0 = time.monotonic()
        proc = SshProcess(conn, client, await self._process(conn, client, name, command), {}, [])
        worker = WorkerConnection(name, proc.process.stdout, proc.process.stdin, proc.process.stderr,
                                  proc.wait_exit, kill=proc.kill, on_close=proc.close, python=self.options.python)
        try:
            await worker.start(payload.data, max(0.1, self.options.start_timeout - (time.monotonic() - t0)))
        except BaseException:
            await worker.close(kill=True, timeout=1.0)
            raise
        worker.timings["start"] = time.monotonic() - t0
        return worker


class SshProcess:
    """A command started on a node over its own SSH connection: its streams, how it ended, how to end it."""

    def __init__(self, conn: asyncssh.SSHClientConnection, client: _Client,
                 process: "asyncssh.SSHClientProcess[bytes]", timings: dict[str, float], warnings: list[str]) -> None:
        self.conn = conn
        self.client = client
        self.process = process
        self.timings = timings
        self.warnings = warnings

    async def wait_exit(self) -> ExitInfo:
        process, client = self.process, self.client
        await process.wait_closed()
        status, sig = process.exit_status, process.exit_signal
        if sig:
            return ExitInfo(None, signal=str(sig[0]))
        if status is None or client.lost is not None:
            reason = str(client.lost) if client.lost else "the channel closed without an exit status"
            return ExitInfo(None, lost=reason or type(client.lost).__name__)
        return ExitInfo(status)

    def kill(self) -> None:
        # Closing the channel makes sshd close the command's stdin: it kills what it started and exits.
        self.process.close()

    async def close(self) -> None:
        self.conn.close()
        try:
            await asyncio.wait_for(self.conn.wait_closed(), 5.0)
        except (asyncio.TimeoutError, TimeoutError, asyncssh.Error, OSError):
            self.conn.abort()
