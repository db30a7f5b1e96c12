"""The one GPU model: a node's GPUs (GpuHealth), the processes holding them (GpuProcess), the kernel's Xid lines
(GpuXid), NCCL's RAS view, and the whole of a node's GPU evidence (NodeGpuEvidence).

The investigation (a snapshot's NodeStatus.gpu) and the GPU tests (app/gpu: a node before a test) read the same
types, decoded by the same decoder (app/decode/gpu.py) from the same node-side reader (workers/collect/nvidia.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


def bus_key(bus_id: str) -> str:
    """A PCI address in one form for comparing nvidia-smi's `00000000:3B:00.0` with the kernel's `0000:3b:00`:
    domain, bus and device, lower case, without leading zeros in the domain."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) < 3:
        return bus_id.strip().lower()
    domain = parts[-3].lstrip("0") or "0"
    return f"{domain}:{parts[-2]}:{parts[-1].split('.')[0]}"


@dataclass(frozen=True)
class GpuXid:
    """One `NVRM: Xid` line of a node's kernel log (app/decode/gpu.py says which shapes are read)."""

    xid: int
    bus_id: str = ""  # the PCI address as the driver writes it, e.g. "0000:3b:00"
    text: str = ""  # the rest of the line (pid, process name, message): remote text
    at: Optional[float] = None  # epoch seconds, when the log gave a wall-clock time
    age_s: Optional[float] = None  # seconds before the evidence was collected
    mig: str = ""  # on a MIG GPU, the instance the driver names: "GPU-I:01" or "GPU-I:01 GPU-CI:00"


@dataclass(frozen=True)
class GpuHealth:
    """One GPU as nvidia-smi (or NVML) reports it: identity, error counters, memory and load; None: not reported
    (the GPU or driver lacks the field, or the report it came from does not carry it)."""

    index: Optional[int] = None
    bus_id: str = ""  # nvidia-smi's form, e.g. "00000000:3B:00.0"
    uuid: str = ""
    name: str = ""
    ecc_uncorrected_volatile: Optional[int] = None  # since the driver loaded
    ecc_uncorrected_aggregate: Optional[int] = None  # over the GPU's life
    ecc_corrected_volatile: Optional[int] = None
    retired_pending: Optional[bool] = None  # a page waits to be retired (reset to apply)
    remap_correctable: Optional[int] = None  # rows remapped for correctable / uncorrectable errors
    remap_uncorrectable: Optional[int] = None
    remap_pending: Optional[bool] = None  # a remap waits for a GPU reset
    remap_failure: Optional[bool] = None  # a remap failed: the GPU needs service
    memory_used_mib: Optional[int] = None
    memory_total_mib: Optional[int] = None
    utilization_pct: Optional[int] = None  # of the last sample period, as the driver measures it
    temperature_c: Optional[int] = None


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a GPU (nvidia-smi --query-compute-apps), asked for by the GPU tests."""

    pid: int
    uuid: str = ""  # the GPU's
    used_mib: Optional[int] = None
    process: str = ""  # its name or path as the driver gives it: remote text


@dataclass(frozen=True)
class RasRank:
    """A rank of an NCCL communicator as NCCL's RAS service reports it."""

    rank: int  # the rank within the communicator
    host: str = ""
    pid: Optional[int] = None
    gpu: Optional[int] = None  # NVML index when known, else CUDA device
    ops: Tuple[Tuple[str, int], ...] = ()  # collective operations launched, by type (AllReduce, ...)
    missing: bool = False  # no data from it for this communicator
    unresponsive: bool = False
    dead: bool = False
    error: str = ""  # an init or asynchronous NCCL error, when nonzero


@dataclass(frozen=True)
class RasComm:
    """One communicator in RAS's answer: its ranks (all, from JSON; the outliers the text names, from text)."""

    hash: str
    size: Optional[int] = None
    ranks: Tuple[RasRank, ...] = ()
    missing: Tuple[int, ...] = ()  # ranks with no data
    # text form: (collective type or "", launched up to, how many ranks, the ranks named) per group
    op_groups: Tuple[Tuple[str, int, int, Tuple[int, ...]], ...] = ()
    status: str = ""  # RUNNING, INIT, FINALIZE... when the text says it
    errors: str = ""  # OK, MISMATCH, INCOMPLETE, ERROR...


@dataclass(frozen=True)
class RasView:
    """NCCL's RAS service (NCCL >= 2.24) asked on one node: the job's communicators as RAS sees them."""

    status: str = ""  # ok, refused (no RAS listening), timeout, failed, disabled, skipped, unreachable
    via: str = ""  # ncclras (the client) or socket
    address: str = ""
    format: str = ""  # json (NCCL >= 2.28.7) or text
    nccl_version: str = ""
    comms: Tuple[RasComm, ...] = ()
    dead: Tuple[str, ...] = ()  # processes RAS considers dead or unreachable, as it names them
    timeouts: int = 0  # communication timeouts while RAS gathered its data
    error: str = ""


@dataclass(frozen=True)
class NodeGpuEvidence:
    """GPU-side evidence of one node: its GPUs as nvidia-smi reports them (or that it did not answer), kernel Xid
    lines, NCCL RAS. Collected once per snapshot for NCCL/CUDA jobs (the collect op, workers/collect/
    gpu_evidence.py), and by the GPU tests before they run (the gpu_inventory op: with the GPUs' holders, no RAS)."""

    why: str = ""  # why it was collected: a rank maps libnccl, or --gpu-evidence on; "" for the GPU tests
    at: float = 0.0  # the node's epoch seconds when collected
    smi: str = ""  # ok, timeout (did not answer within smi_timeout), failed, missing
    smi_via: str = ""  # nvidia-smi, or nvml (the driver's library, where nvidia-smi is missing)
    smi_timeout: float = 0.0
    smi_stuck: bool = False  # it did not even end after SIGKILL: stuck in the driver
    smi_error: str = ""
    gpus: Tuple[GpuHealth, ...] = ()
    processes: Tuple[GpuProcess, ...] = ()  # the processes holding GPUs, when asked (the GPU tests)
    xid_source: str = ""  # dmesg, /dev/kmsg, journalctl -k, a syslog file
    xids: Tuple[GpuXid, ...] = ()  # newest last
    ras: Optional[RasView] = None
    notes: Tuple[str, ...] = ()
