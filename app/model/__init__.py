"""The snapshot data model: frozen dataclasses for nodes, ranks, threads and frames, and their JSON form.

Pure data: no I/O beyond (de)serialising, never imports Textual. Every layer above (session, analysis, UI,
reports) reads these types; the worker's raw dicts are turned into them by app/decode/replies.py. This package
root only names them; each lives in its own module:

- frames.py: Frame, ThreadStack and what a frame carries (locals, loops, `with` blocks), the interned paths
- process.py: what the node read about one process (state, hold, counters, sockets, strace, error output)
- flight.py: PyTorch's Flight Recorder record of a rank
- rank.py: RankSnapshot, JobProcess, rank_key
- gpu.py: the one GPU model: a node's GPUs, their holders, Xid lines, NCCL RAS (the investigation's and the GPU
  tests')
- snapshot.py: Snapshot, NodeStatus, NodeInfo, CollectOptions, the file's schema name and version
- codec.py: the JSON form
"""

from __future__ import annotations

from app.model.flight import FlightEntry, FlightGroup, FlightRecord
from app.model.frames import MAX_INTERNED_FRAMES, Frame, Local, LoopInfo, ThreadStack, WithInfo, frame_path
from app.model.kwait import EndRole, FdKind, KernelWait, OtherEnd, WaitFamily, WaitFd
from app.model.gpu import GpuHealth, GpuProcess, GpuXid, NodeGpuEvidence, RasComm, RasRank, RasView, bus_key
from app.model.process import (
    CgroupCpu,
    ErrorInfo,
    ErrorOutput,
    GpuUse,
    PipeReader,
    ProcessHold,
    ProcState,
    ProgressCounters,
    StraceResult,
    StraceThread,
    TcpSocket,
)
from app.model.rank import JobProcess, RankKey, RankSnapshot, rank_key
from app.model.snapshot import (
    SCHEMA_NAME,
    SCHEMA_VERSION,
    CollectOptions,
    NodeInfo,
    NodeState,
    NodeStatus,
    Snapshot,
    ToolInfo,
)

__all__ = [
    "EndRole", "FdKind", "KernelWait", "OtherEnd", "WaitFamily", "WaitFd",
    "MAX_INTERNED_FRAMES", "SCHEMA_NAME", "SCHEMA_VERSION", "CgroupCpu", "CollectOptions", "ErrorInfo",
    "ErrorOutput", "FlightEntry", "FlightGroup", "FlightRecord", "Frame", "GpuHealth", "GpuProcess", "GpuUse", "GpuXid",
    "JobProcess", "Local", "LoopInfo", "NodeGpuEvidence", "NodeInfo", "NodeState", "NodeStatus", "PipeReader",
    "ProcState", "ProcessHold", "ProgressCounters", "RankKey", "RankSnapshot", "RasComm", "RasRank", "RasView",
    "Snapshot", "StraceResult", "StraceThread", "TcpSocket", "ThreadStack", "ToolInfo", "WithInfo", "bus_key",
    "frame_path", "rank_key",
]
