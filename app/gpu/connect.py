"""Open one worker per node for the GPU tests (SSH or the session's opener, or this machine), and close them.

The tests use workers of their own rather than an investigation session's: closing them (EOF) kills
whatever test processes are left on the nodes, without touching the session's collection.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Mapping, Optional, Sequence

from app.errors import TransportError
from app.hosts import HostSpec
from app.session import SessionOptions
from app.transport import bootstrap
from app.transport.base import WorkerConnection
from app.transport.local import start_local
from app.transport.ssh import SshOptions, SshTransport


async def open_workers(hosts: Optional[Sequence[HostSpec]], options: SessionOptions = SessionOptions()
                       ) -> tuple[dict[str, WorkerConnection], dict[str, str]]:
    """({node: worker} in hosts order, {node: why it could not be reached}); hosts None: this machine."""
    if hosts is None:
        name = socket.gethostname()
        try:
            return {name: await start_local(options.python, name=name)}, {}
        except TransportError as exc:
            return {}, {name: exc.message}
    ssh = SshTransport(SshOptions(
        config_paths=options.ssh_config, known_hosts=options.known_hosts, identity=options.identity,
        python=options.python or bootstrap.DEFAULT_PYTHON, connect_timeout=options.connect_timeout,
        accept_new_host_keys=options.accept_new_host_keys, fanout=options.fanout, push_pyspy=False))
    conns: dict[str, WorkerConnection] = {}
    errors: dict[str, str] = {}

    async def one(h: HostSpec) -> None:
        try:
            if options.opener is not None:  # --slurm: srun (or SSH, then srun) into the job's allocation
                conns[h.name] = await options.opener(
                    h, {}, lambda: ssh.open(h.host, name=h.name, user=h.user, port=h.port))
            else:
                conns[h.name] = await ssh.open(h.host, name=h.name, user=h.user, port=h.port)
        except TransportError as exc:
            errors[h.name] = exc.message

    await asyncio.gather(*(one(h) for h in hosts))
    return {h.name: conns[h.name] for h in hosts if h.name in conns}, errors


async def close_workers(conns: Mapping[str, WorkerConnection]) -> None:
    """EOF to every worker: each kills what it still runs (test processes included) and exits."""
    await asyncio.gather(*(c.close() for c in conns.values()), return_exceptions=True)
