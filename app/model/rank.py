"""A rank process at one moment (RankSnapshot), a job's other processes (JobProcess), and a rank's key."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal, Optional, Protocol, Tuple

from app.model.flight import FlightRecord
from app.model.frames import SLOTS, ThreadStack
from app.model.process import (
    ErrorInfo,
    ErrorOutput,
    GpuUse,
    ProcessHold,
    ProcState,
    ProgressCounters,
    StraceResult,
    TcpSocket,
)

RankKey = Tuple[str, int]  # (node name, pid): unique among a snapshot's ranks, stable across refreshes of a rank


class _OnNode(Protocol):
    @property
    def node(self) -> str: ...

    @property
    def pid(self) -> int: ...


def rank_key(r: _OnNode) -> RankKey:
    """A rank's (node, pid): a RankSnapshot's, or anything else about one rank (its progress, its finding)."""
    return (r.node, r.pid)


# A rank's ~50 attributes are more than CPython shares a key table for (30), so each RankSnapshot carried a dict
# of its own (~1.5 KB; 100k ranks a pass at 12,500 nodes, issue 27): slots hold them in ~0.4 KB (python >= 3.10;
# on 3.9 a rank keeps its dict: frames.SLOTS).


class _Derived:
    """The slot of what a RankSnapshot derives from its fields in __post_init__ (not a field: not in the file)."""

    __slots__ = ("enters_with",)


@dataclass(frozen=True, **SLOTS)
class RankSnapshot(_Derived):
    """One rank process at one moment: identity, /proc facts, and its stacks when collected."""

    node: str  # the node's name as given in the hosts input
    pid: int
    start_time: int  # clock ticks after boot (/proc/PID/stat field 22): detects pid reuse
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    group_rank: Optional[int] = None
    found_by: str = ""  # how discovery found it: rank environment, multiprocessing spawn child with torch loaded, --pid, --match
    job: str = ""  # which job it belongs to, e.g. "10.0.0.1:29500" (its store), "SLURM job 42.0"; "" when unknown
    job_evidence: str = ""  # what that rests on: MASTER_ADDR:MASTER_PORT, TORCHELASTIC_RUN_ID, SLURM ids, launcher
    rank_evidence: str = ""  # where the rank number comes from, e.g. "environment (RANK)"; "" when unknown
    local_world_size: Optional[int] = None
    master_addr: str = ""
    master_port: Optional[int] = None
    launcher: str = ""  # torchrun, deepspeed, accelerate, srun, mpirun, python, ...
    launcher_pid: Optional[int] = None
    ppid: Optional[int] = None
    cmdline: Tuple[str, ...] = ()  # redacted on the node
    exe: str = ""
    uid: Optional[int] = None
    user: str = ""
    state: ProcState = ""
    wchan: str = ""
    num_threads: int = 0
    cpu_time: float = 0.0  # user + system seconds consumed so far
    rss: int = 0  # bytes
    gpus: Tuple[GpuUse, ...] = ()
    env: Tuple[Tuple[str, str], ...] = ()  # allowlisted names only
    nspid: Optional[int] = None  # pid inside its own PID namespace, when it differs
    in_container: bool = False  # PID or mount namespace differs from the worker's
    children: Tuple[int, ...] = ()  # helper processes (data-loader workers) of this rank
    threads: Tuple[ThreadStack, ...] = ()
    sockets: Tuple[TcpSocket, ...] = ()
    output: Tuple[ErrorOutput, ...] = ()  # its recent error output, where its node could read it
    collected: bool = False  # stacks were dumped
    partial: bool = False  # only part of the data arrived (connection lost, cancelled)
    error: Optional[ErrorInfo] = None
    resumed: bool = False  # hangscope found the rank stopped after a tool and resumed it
    strace: Optional[StraceResult] = None
    gdb: Optional[str] = None
    elapsed: float = 0.0  # seconds the dump took on the node
    flight: Optional[FlightRecord] = None  # PyTorch's Flight Recorder, when the rank enables it
    counters: Optional[ProgressCounters] = None  # what moves between samples, read at discovery
    hold: Optional[ProcessHold] = None  # what holds the process (stopped, traced, frozen, D, exiting), read before any tool ran; None when nothing does, and in old files
    actions: Tuple[str, ...] = ()  # what hangscope did to the process, in order (tools run, signals sent)
    notes: Tuple[str, ...] = ()  # what the worker left undone or did otherwise than asked, and why (the dump's notes)
    dump_started: Optional[float] = None  # when its dump began and ended (epoch seconds, login clock; issue 16.8)
    dump_ended: Optional[float] = None

    @property
    def main_thread(self) -> Optional[ThreadStack]:
        for t in self.threads:
            if t.is_main:
                return t
        return self.threads[0] if self.threads else None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    # Derived, like ThreadStack.path (not a field): one of its threads stands at a `with` header. Read by the
    # analysis in its one pass over the ranks (columns.py), so 100k ranks cost no visit to their threads.
    if typing.TYPE_CHECKING:
        @property
        def enters_with(self) -> bool: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "enters_with", any(t.enters_with for t in self.threads))

    def __reduce__(self) -> tuple:
        """Pickled and copied as __init__ takes it, so what __post_init__ derives is derived again."""
        return (type(self), tuple(getattr(self, name) for name in self.__dataclass_fields__))

    def env_value(self, name: str) -> Optional[str]:
        for k, v in self.env:
            if k == name:
                return v
        return None


@dataclass(frozen=True)
class JobProcess:
    """A process of a job that is not a rank: a launcher above ranks (or with none yet), or a rank's child
    (data-loader worker, compile worker, subprocess). Never counted as a rank; dumped when what it does matters
    (no rank exists yet, or a rank waits on it)."""

    node: str
    pid: int
    start_time: int
    role: Literal["launcher", "child"]
    kind: str  # launcher: torchrun, deepspeed, accelerate, srun, mpirun, python; child: data-loader worker, ...
    ppid: Optional[int] = None
    of: Tuple[int, ...] = ()  # rank pids on its node: those below a launcher, the rank a child belongs to
    job: str = ""  # as on its ranks, or from its own command line when it has none
    job_evidence: str = ""
    cmdline: Tuple[str, ...] = ()  # redacted on the node
    exe: str = ""
    state: ProcState = ""
    wchan: str = ""
    num_threads: int = 0
    cpu_time: float = 0.0
    env: Tuple[Tuple[str, str], ...] = ()  # allowlisted names only (launchers)
    nspid: Optional[int] = None
    threads: Tuple[ThreadStack, ...] = ()  # when dumped
    collected: bool = False
    hold: Optional[ProcessHold] = None
    error: Optional[ErrorInfo] = None
    actions: Tuple[str, ...] = ()
    why_dumped: str = ""  # "no rank yet", "its rank waits on it"; "" when not dumped

    @property
    def label(self) -> str:
        return f"{self.kind} pid {self.pid}"
