"""How a session collects: the collection options, SSH and SLURM settings, deadlines (SessionOptions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from app.model import CollectOptions
from app.transport import bootstrap
from app.transport.connect import Connector
from app.transport.relay import RelayOptions
from app.transport.srun import SrunOptions
from app.transport.ssh import SshOptions


@dataclass(frozen=True)
class SessionOptions:
    collect: CollectOptions = CollectOptions()
    fanout: int = 64
    connect_timeout: float = 10.0
    dump_timeout: float = 30.0  # per rank, on the node (py-spy --native on torch takes ~0.5 s; plain ~10 ms)
    python: Optional[str] = None  # None: python3 on nodes, this interpreter locally
    accept_new_host_keys: bool = False
    ssh_config: Optional[tuple[str, ...]] = None  # None = defaults (~/.ssh/config, /etc/ssh/ssh_config)
    known_hosts: Optional[tuple[str, ...]] = None
    identity: tuple[str, ...] = ()
    loops: bool = True
    pids: Optional[tuple[int, ...]] = None  # only these processes (rank environment or not); None = discover
    match: Optional[str] = None  # only python processes whose command line matches this regex (on every node)
    store: bool = True  # ask the job's store for the numbers of ranks whose process says none (app/session/store.py)
    strace_data: bool = False  # strace keeps the (redacted) bytes calls read/wrote; else syscall, fd, size, result
    srun: Optional[SrunOptions] = field(default=None, compare=False)  # the SLURM job for hosts over srun/auto
    # SSH nodes through relays (app/transport/relay): the default groups nodes opened together past a threshold;
    # None: every node direct (--relay off)
    relay: Optional[RelayOptions] = field(default_factory=RelayOptions, compare=False)

    def connector(self, worker_options: Mapping[str, Any], *, push_pyspy: bool = True) -> Connector:
        """How this run opens workers (app.transport.connect): SSH settings, the SLURM job, the interpreter."""
        return Connector(SshOptions(
            config_paths=self.ssh_config, known_hosts=self.known_hosts, identity=self.identity,
            python=self.python or bootstrap.DEFAULT_PYTHON, connect_timeout=self.connect_timeout,
            accept_new_host_keys=self.accept_new_host_keys, fanout=self.fanout, push_pyspy=push_pyspy),
            srun=self.srun, python=self.python, worker_options=worker_options, relay=self.relay)
