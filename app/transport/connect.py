"""The one way to open a worker on a node, chosen by its HostSpec's `transport`: ssh, srun, auto or local.

The investigation session and the GPU tests both open their workers here. `auto` (a SLURM job's nodes)
tries SSH and falls back to srun per node, and only when SSH could not get in (no route, refused, timed out,
login refused, sshd said no): a node where SSH worked but the worker failed is reported as it is, not retried
over srun. Fallbacks that arrive close together share one srun step (a short batch window).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping, Optional

from app.errors import TransportError
from app.transport.base import WorkerConnection
from app.transport.local import start_local
from app.transport.relay import RelayOptions, RelayTransport
from app.transport.srun import SrunOptions, SrunTransport
from app.transport.ssh import SshOptions, SshTransport

if TYPE_CHECKING:
    from app.hosts import HostSpec

FALLBACK_WINDOW = 0.3  # seconds: SSH failures of a job's nodes arrive within this of each other, then one step
# SSH could not get into the node at all: worth trying srun (clusters that block SSH to compute nodes)
NO_SSH = frozenset({"unreachable", "dns", "refused", "connect_timeout", "host_key_unknown", "auth_failed",
                    "throttled", "ssh_error"})


class Connector:
    """Opens workers on nodes, each the way its HostSpec says; one SSH transport (its fan-out limit and host key
    cache) and one srun transport (its steps) for all of them, made on first use."""

    def __init__(self, ssh: SshOptions, *, srun: Optional[SrunOptions] = None, python: Optional[str] = None,
                 worker_options: Optional[Mapping[str, Any]] = None, relay: Optional[RelayOptions] = None) -> None:
        self.worker_options = dict(worker_options or {})
        self.ssh_options = dataclasses.replace(ssh, worker_options=self.worker_options)
        self.srun_options = srun
        self.python = python  # local workers: None is this interpreter
        self._ssh: Optional[SshTransport] = None
        self._srun: Optional[SrunTransport] = None
        self.relay_options = relay  # None: every SSH node direct
        self._relay: Optional[RelayTransport] = None

    async def open(self, spec: "HostSpec") -> WorkerConnection:
        """Start the node's worker and wait for its hello; raises TransportError."""
        if spec.transport == "local":
            return await start_local(self.python, name=spec.name, options=self.worker_options or None)
        if spec.transport == "srun":
            return await self.srun(spec, 0.0).open(spec.host, name=spec.name)
        if spec.transport != "auto":
            if self.relay_options is not None:
                return await self.relayed(spec)
            return await self.ssh(spec)
        try:
            return await self.ssh(spec)
        except TransportError as exc:
            if exc.code not in NO_SSH:
                raise
            ssh_error = exc
        srun = self.srun(spec, FALLBACK_WINDOW)
        try:
            conn = await srun.open(spec.host, name=spec.name)
        except TransportError as exc:
            raise TransportError(exc.code, f"{exc.message}; SSH failed before: {ssh_error.message}",
                                 phase=exc.phase, hint=exc.hint) from None
        conn.warnings.append(f"reached over srun (job {srun.options.job_id}): SSH failed: {ssh_error.message}")
        return conn

    async def ssh(self, spec: "HostSpec") -> WorkerConnection:
        if self._ssh is None:
            self._ssh = SshTransport(self.ssh_options)
        return await self._ssh.open(spec.host, name=spec.name, user=spec.user, port=spec.port)

    async def relayed(self, spec: "HostSpec") -> WorkerConnection:
        """Over SSH, through a relay when enough nodes are opened together (app/transport/relay)."""
        if self._relay is None:
            if self._ssh is None:
                self._ssh = SshTransport(self.ssh_options)
            assert self.relay_options is not None
            self._relay = RelayTransport(self._ssh, self.relay_options)
        return await self._relay.open(spec)

    def srun(self, spec: "HostSpec", batch_window: float) -> SrunTransport:
        if self._srun is None:
            if self.srun_options is None:
                raise TransportError("internal", f"{spec.name}: transport {spec.transport} needs a SLURM job "
                                     "(--slurm)", phase="connect")
            self._srun = SrunTransport(dataclasses.replace(
                self.srun_options, worker_options=self.worker_options,
                batch_window=max(self.srun_options.batch_window, batch_window)))
        return self._srun
