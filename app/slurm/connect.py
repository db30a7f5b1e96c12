"""Session openers for a SLURM job: `srun` (every node through srun) and `auto` (SSH first, srun for the rest).

`auto` falls back per node, and only when SSH could not get in (no route, refused, timed out, login refused,
sshd said no): a node where SSH worked but the worker failed is reported as it is, not retried over srun.
Fallbacks that arrive close together share one srun step (a short batch window).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal, Mapping, Optional

from app.errors import TransportError
from app.slurm.srun import SrunOptions, SrunTransport
from app.transport.base import WorkerConnection

if TYPE_CHECKING:
    from app.hosts import HostSpec
    from app.session import Opener, SshOpen

TransportChoice = Literal["ssh", "srun", "auto"]
FALLBACK_WINDOW = 0.3  # seconds: SSH failures of a job's nodes arrive within this of each other, then one step
# SSH could not get into the node at all: worth trying srun (clusters that block SSH to compute nodes)
NO_SSH = frozenset({"unreachable", "dns", "refused", "connect_timeout", "host_key_unknown", "auth_failed",
                    "throttled", "ssh_error"})


class _SrunOpener:
    """Creates the SrunTransport on first use: the session's worker options are known only then."""

    def __init__(self, options: SrunOptions, fallback: bool) -> None:
        self.options = options
        self.fallback = fallback
        self.transport: Optional[SrunTransport] = None
        self.fell_back: list[str] = []  # nodes reached over srun after SSH failed (auto)

    def _srun(self, worker_options: Mapping[str, Any]) -> SrunTransport:
        if self.transport is None:
            self.transport = SrunTransport(dataclasses.replace(self.options, worker_options=dict(worker_options)))
        return self.transport

    async def __call__(self, spec: "HostSpec", worker_options: Mapping[str, Any], ssh: "SshOpen") -> WorkerConnection:
        if not self.fallback:
            return await self._srun(worker_options).open(spec.host, name=spec.name)
        try:
            return await ssh()
        except TransportError as exc:
            if exc.code not in NO_SSH:
                raise
            ssh_error = exc
        try:
            conn = await self._srun(worker_options).open(spec.host, name=spec.name)
        except TransportError as exc:
            raise TransportError(exc.code, f"{exc.message}; SSH failed before: {ssh_error.message}",
                                 phase=exc.phase, hint=exc.hint) from None
        self.fell_back.append(spec.name)
        conn.warnings.append(f"reached over srun (job {self.options.job_id}): SSH failed: {ssh_error.message}")
        return conn


def slurm_opener(choice: TransportChoice, options: SrunOptions) -> Optional["Opener"]:
    """The session opener for `--transport`: None for plain SSH."""
    if choice == "ssh":
        return None
    if choice == "auto":
        return _SrunOpener(dataclasses.replace(options, batch_window=max(options.batch_window, FALLBACK_WINDOW)),
                           fallback=True)
    return _SrunOpener(options, fallback=False)
