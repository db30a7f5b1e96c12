"""One collection pass: the nodes (what their worker said, how far collection got), the ranks and the options;
the snapshot file's name and version."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Tuple

from app.model.gpu import NodeGpuEvidence
from app.model.process import ErrorInfo
from app.model.rank import JobProcess, RankSnapshot

SCHEMA_NAME = "hangscope.snapshot"
SCHEMA_VERSION = 1

NodeState = Literal["pending", "connecting", "discovering", "collecting", "done", "partial", "failed"]


@dataclass(frozen=True)
class ToolInfo:
    name: str
    path: str
    version: str = ""


@dataclass(frozen=True)
class NodeInfo:
    """What the worker's hello said about the node."""

    hostname: str = ""
    python: str = ""
    python_exe: str = ""
    kernel: str = ""
    uid: Optional[int] = None
    user: str = ""
    ptrace_scope: Optional[int] = None
    cpus: int = 0
    psutil: bool = False
    tools: Tuple[ToolInfo, ...] = ()
    searched: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()  # tool -> paths searched when missing

    def tool(self, name: str) -> Optional[ToolInfo]:
        for t in self.tools:
            if t.name == name:
                return t
        return None


@dataclass(frozen=True)
class NodeStatus:
    """One node of the investigation: where it is, how far collection got, and why it failed if it did."""

    name: str  # as in the hosts input
    address: str = ""
    user: str = ""
    port: Optional[int] = None
    slots: Optional[int] = None  # expected ranks on this node
    state: NodeState = "pending"
    error: Optional[ErrorInfo] = None
    info: Optional[NodeInfo] = None
    ranks_found: int = 0
    timings: Tuple[Tuple[str, float], ...] = ()  # (phase, seconds)
    warnings: Tuple[str, ...] = ()
    gpu: Optional[NodeGpuEvidence] = None  # GPU-side evidence, for NCCL/CUDA jobs


@dataclass(frozen=True)
class CollectOptions:
    native: bool = False
    locals: bool = False
    nonblocking: bool = False
    strace_seconds: float = 0.0
    gdb: bool = False
    sudo: bool = False
    gpu_evidence: str = "auto"  # auto (NCCL/CUDA jobs), on, off


@dataclass(frozen=True)
class Snapshot:
    """Everything one collection pass produced: per-node status and per-rank data."""

    taken_at: float  # epoch seconds when collection started
    duration: float = 0.0
    hangscope_version: str = ""
    options: CollectOptions = field(default_factory=CollectOptions)
    nodes: Tuple[NodeStatus, ...] = ()
    ranks: Tuple[RankSnapshot, ...] = ()
    interrupted: bool = False
    # (address, name, how) for addresses the ranks talk to that no inspected node has, named on the login side
    # (ssh config, reverse DNS, the SLURM job's node list); see app/analysis/peers.py
    peer_names: Tuple[Tuple[str, str, str], ...] = ()
    processes: Tuple[JobProcess, ...] = ()  # the jobs' launchers and ranks' children (never ranks)
    # seconds between the first and the last start of a rank's dump in this pass (login clock); None: < 2 dumps
    dump_skew: Optional[float] = None

    @property
    def complete(self) -> bool:
        """All nodes done and every found rank collected."""
        return (not self.interrupted and all(n.state == "done" for n in self.nodes)
                and all(r.collected and not r.partial for r in self.ranks))

    def rank_by_number(self, rank: int) -> Optional[RankSnapshot]:
        for r in self.ranks:
            if r.rank == rank:
                return r
        return None
