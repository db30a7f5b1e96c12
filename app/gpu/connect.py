"""The GPU tests' own workers on the chosen nodes, opened the way the session opens its own (app.transport.connect:
SSH, srun into a SLURM job's allocation, or this machine), and closed.

The tests use workers of their own rather than an investigation session's: closing them (EOF) kills
whatever test processes are left on the nodes, without touching the session's collection.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Mapping, Optional, Sequence

from app.errors import HangscopeError, TransportError
from app.hosts import HostSpec
from app.session import SessionOptions
from app.transport.base import WorkerConnection


async def open_workers(hosts: Optional[Sequence[HostSpec]], options: SessionOptions = SessionOptions()
                       ) -> tuple[dict[str, WorkerConnection], dict[str, str]]:
    """({node: worker} in hosts order, {node: why it could not be reached}); hosts None: this machine."""
    if hosts is None:
        hosts = [HostSpec(name=socket.gethostname(), host="localhost", transport="local")]
    connector = options.connector({}, push_pyspy=False)
    conns: dict[str, WorkerConnection] = {}
    errors: dict[str, str] = {}

    async def one(h: HostSpec) -> None:
        try:
            conns[h.name] = await connector.open(h)
        except TransportError as exc:
            errors[h.name] = exc.message

    await asyncio.gather(*(one(h) for h in hosts))
    return {h.name: conns[h.name] for h in hosts if h.name in conns}, errors


async def close_workers(conns: Mapping[str, WorkerConnection]) -> None:
    """EOF to every worker: each kills what it still runs (test processes included) and exits."""
    await asyncio.gather(*(c.close() for c in conns.values()), return_exceptions=True)


class GpuWorkers:
    """The workers one GPU test runs on (the TUI's and the command line's): `open()` them on the chosen nodes
    (hosts None: this machine), hand `conns` and `errors` to the GpuTestRunner, `close()` them at the end, which
    kills every process of the test on the nodes."""

    def __init__(self, hosts: Optional[Sequence[HostSpec]], options: SessionOptions = SessionOptions()) -> None:
        self.hosts = hosts
        self.options = options
        self.conns: dict[str, WorkerConnection] = {}
        self.errors: dict[str, str] = {}  # node -> why it could not be reached

    async def open(self) -> None:
        self.conns, self.errors = await open_workers(self.hosts, self.options)

    async def close(self, timeout: Optional[float] = None) -> None:
        """Close every worker; with a timeout, a node that does not answer is left to its worker, which still
        exits on EOF when its channel closes."""
        try:
            await asyncio.wait_for(close_workers(self.conns), timeout)
        except (asyncio.TimeoutError, HangscopeError, OSError):
            if timeout is None:
                raise
