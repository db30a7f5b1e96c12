"""Results of the GPU tests as frozen dataclasses (JSON via app.model's to_dict/from_dict); no I/O, no UI.

Every string that came from a node (errors, tracebacks, NCCL lines, interface names) is remote text: show it
literally, never as markup or shell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Tuple

from app.model import GpuHealth, GpuProcess, GpuXid

TestKind = Literal["sanity", "bench", "pairs", "net"]
RankStatus = Literal["ok", "broken", "hung", "not_started"]
RunStatus = Literal["ok", "failed", "hung"]
CellStatus = Literal["ok", "slow", "failed", "hung", "untested"]
PortState = Literal["open", "closed", "filtered", "unreachable", "unresolvable", "error"]

PHASES = ("start", "import", "store_connect", "join", "alloc", "init_pg", "all_reduce", "barrier", "bench",
          "destroy", "done")


@dataclass(frozen=True)
class RankResult:
    """One rank of one test run: how far it got, and why it stopped there."""

    node: str
    rank: Optional[int]
    local_rank: Optional[int]
    status: RankStatus
    phase: str = ""  # the last phase it reported (see PHASES)
    pid: Optional[int] = None
    error: str = ""  # its own exception, or why hangscope calls it hung
    value: Optional[float] = None  # the all_reduce sum
    device: str = ""
    gpu_name: str = ""
    waiting_for: Tuple[int, ...] = ()  # ranks it was still waiting for at the rendezvous
    stack: Tuple[str, ...] = ()  # where it was stuck (faulthandler, innermost first), when it hung
    culprit: bool = False  # failed or stuck on its own, not merely waiting for another rank


@dataclass(frozen=True)
class BenchRow:
    """One message size of the all_reduce sweep, in nccl-tests' units (bytes, microseconds, GB/s = 1e9 B/s)."""

    size: int
    count: int
    time_us: float  # per iteration, averaged over iterations and ranks
    algbw: float  # size / time
    busbw: float  # algbw * 2(n-1)/n
    time_max_us: float = 0.0  # the slowest rank's average
    dtype: str = "float32"
    iters: int = 0


@dataclass(frozen=True)
class NcclNetDevice:
    """An interface or HCA that NCCL listed: `[0]eth0:10.0.0.34<0>` or `[0]mlx5_0:1/IB`."""

    index: int
    name: str
    address: str = ""  # socket interfaces: the IP; IB devices: the port number
    kind: str = ""  # "IB", "RoCE", or "" for a socket interface


@dataclass(frozen=True)
class NcclWarning:
    host: str
    pid: int
    source: str  # "transport/net_ib.cc:1296", or "" when NCCL did not say
    message: str


@dataclass(frozen=True)
class NcclNode:
    """What NCCL_DEBUG=INFO said on one host: which network and interfaces it chose, and its warnings."""

    host: str
    version: str = ""
    network: str = ""  # "Socket", "IB", or a plugin's name ("Using network ...")
    socket_devices: Tuple[NcclNetDevice, ...] = ()  # NET/Socket : Using ...
    ib_devices: Tuple[NcclNetDevice, ...] = ()  # NET/IB : Using ...
    oob: str = ""  # NET/IB's out-of-band interface, "eno1np0:172.18.62.6"
    bootstrap: Tuple[NcclNetDevice, ...] = ()
    transports: Tuple[str, ...] = ()  # "NET/Socket", "NET/IB", "P2P/IPC", "SHM", ... seen in channel lines
    env: Tuple[Tuple[str, str], ...] = ()  # "NCCL_SOCKET_IFNAME set by environment to bond0"
    init_complete: Tuple[int, ...] = ()  # ranks whose communicator finished initialising
    no_ib: bool = False  # "NET/IB : No device found."
    warnings: Tuple[NcclWarning, ...] = ()

    @property
    def summary(self) -> str:
        if self.network == "IB" or self.ib_devices:
            devs = " ".join(f"{d.name}:{d.address}/{d.kind}" for d in self.ib_devices)
            return f"NET/IB {devs}".strip() + (f" (OOB {self.oob})" if self.oob else "")
        if self.socket_devices:
            return "NET/Socket " + " ".join(f"{d.name}:{d.address}" for d in self.socket_devices)
        return self.network and f"network {self.network}"


@dataclass(frozen=True)
class TestRun:
    """One launch of the test program on a set of nodes (one torchrun per node), and what came of it."""

    id: str
    kind: str  # "sanity", "bench", "pair", "single", "gpu-pair", "gpu-single"
    nodes: Tuple[str, ...]
    status: RunStatus
    master: str = ""
    port: int = 0
    backend: str = ""
    world_size: int = 0
    cuda_visible_devices: str = ""  # GPU pair tests inside a node
    ranks: Tuple[RankResult, ...] = ()
    bench: Tuple[BenchRow, ...] = ()
    nccl: Tuple[NcclNode, ...] = ()
    message: str = ""  # one sentence: what happened
    not_finished: Tuple[str, ...] = ()  # nodes whose ranks did not all finish (hung, failed or stopped)
    leftovers: Tuple[Tuple[str, int], ...] = ()  # (node, processes of the test that outlived it; killed)
    node_errors: Tuple[Tuple[str, str], ...] = ()  # (node, why its launch failed)
    log: Tuple[str, ...] = ()  # the last lines, each "[host:local_rank] text"
    elapsed: float = 0.0

    @property
    def busbw(self) -> Optional[float]:
        """The peak bus bandwidth of the sweep (GB/s), or None without bench rows."""
        return max((r.busbw for r in self.bench), default=None)

    @property
    def culprits(self) -> Tuple[RankResult, ...]:
        return tuple(r for r in self.ranks if r.culprit)


@dataclass(frozen=True)
class PairCell:
    """One tested pair (a == b for a unit tested alone)."""

    a: str
    b: str
    status: CellStatus
    busbw: Optional[float] = None
    run_id: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Fault:
    kind: Literal["node", "link"]
    units: Tuple[str, ...]  # one node, or the two ends of a link
    how: Literal["slow", "failed", "hung"]
    evidence: str


@dataclass(frozen=True)
class PairReport:
    """Node-pair (or GPU-pair) isolation: the matrix, the faults it names, and a verdict in words."""

    scope: str  # "nodes", or the node whose GPUs were paired
    units: Tuple[str, ...]
    cells: Tuple[PairCell, ...]  # the latest result per tested pair, singles included (a == b)
    faults: Tuple[Fault, ...] = ()
    verdict: str = ""
    reference_busbw: Optional[float] = None  # the median a pair is compared with
    slow_ratio: float = 0.5
    rounds: Tuple[Tuple[str, ...], ...] = ()  # run ids per round
    untested_links: int = 0
    inconclusive: Tuple[str, ...] = ()

    def cell(self, a: str, b: str) -> Optional[PairCell]:
        for c in self.cells:
            if (c.a, c.b) in ((a, b), (b, a)):
                return c
        return None


@dataclass(frozen=True)
class NetAddress:
    family: str  # "ipv4", "ipv6"
    address: str
    prefix: Optional[int] = None


@dataclass(frozen=True)
class NetInterface:
    name: str
    up: bool
    kind: str = ""  # ethernet, infiniband, loopback, tunnel, other
    mtu: Optional[int] = None
    speed_mbps: Optional[int] = None
    addresses: Tuple[NetAddress, ...] = ()


@dataclass(frozen=True)
class IbPort:
    device: str
    port: Optional[int]
    state: str = ""
    rate: str = ""
    link_layer: str = ""


@dataclass(frozen=True)
class PortCheck:
    node: str
    host: str
    port: int
    state: PortState
    address: str = ""
    ms: Optional[float] = None
    error: str = ""


@dataclass(frozen=True)
class NodeNet:
    node: str
    hostname: str = ""
    hostname_addresses: Tuple[str, ...] = ()
    interfaces: Tuple[NetInterface, ...] = ()
    infiniband: Tuple[IbPort, ...] = ()
    nccl_pick: str = ""  # the interface NCCL would choose by default here
    env: Tuple[Tuple[str, str], ...] = ()
    error: str = ""


@dataclass(frozen=True)
class NetReport:
    nodes: Tuple[NodeNet, ...]
    checks: Tuple[PortCheck, ...] = ()
    findings: Tuple[str, ...] = ()  # problems found, one sentence each
    suggestion: str = ""  # e.g. "NCCL_SOCKET_IFNAME=eth0", when nodes disagree


@dataclass(frozen=True)
class NodeInventory:
    """A node's GPUs before a test, in the one GPU model (app/model/gpu.py), as the gpu_inventory op read them."""

    node: str
    source: str = ""  # "nvidia-smi", "nvml" (the driver's library), or "" when the node has no NVIDIA tooling
    gpus: Tuple[GpuHealth, ...] = ()
    holders: Tuple[GpuProcess, ...] = ()  # the processes holding GPUs: the tests' rule for "GPU busy" reads them
    xids: Tuple[GpuXid, ...] = ()
    notes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuTestResults:
    """Everything one `--test` produced; `ok` is what the exit code reports."""

    kind: TestKind
    started_at: float
    duration: float = 0.0
    nodes: Tuple[str, ...] = ()
    ok: bool = False
    verdict: str = ""
    runs: Tuple[TestRun, ...] = ()
    pairs: Optional[PairReport] = None
    gpu_pairs: Tuple[PairReport, ...] = ()
    net: Optional[NetReport] = None
    inventory: Tuple[NodeInventory, ...] = ()
    node_errors: Tuple[Tuple[str, str], ...] = ()  # (node, why it could not take part)
    notes: Tuple[str, ...] = ()
    interrupted: bool = False
