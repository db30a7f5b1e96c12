"""The snapshot data model: frozen dataclasses for nodes, ranks, threads and frames, and their JSON form.

Pure data: no I/O beyond (de)serialising, never imports Textual. Every layer above (session, analysis, UI,
reports) reads these types; the worker's raw dicts are turned into them by app/decode/replies.py.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal, Optional, Protocol, Tuple

from app.model.kwait import EndRole as EndRole
from app.model.kwait import FdKind as FdKind
from app.model.kwait import KernelWait as KernelWait
from app.model.kwait import OtherEnd as OtherEnd
from app.model.kwait import WaitFamily as WaitFamily
from app.model.kwait import WaitFd as WaitFd
from app.model.memo import BoundedMemo

SCHEMA_NAME = "hangscope.snapshot"
SCHEMA_VERSION = 1

NodeState = Literal["pending", "connecting", "discovering", "collecting", "done", "partial", "failed"]
ProcState = str  # one letter from /proc/PID/stat: R S D T t Z X I, or "" when unknown


@dataclass(frozen=True)
class Local:
    """One local variable as py-spy shows it (repr is remote text: display literally)."""

    name: str
    repr: str
    arg: bool = False
    # A `<module>` frame's locals are its module's globals: py-spy shows none there, and the worker reads the
    # module-level loop's variables and counters of __main__ from the rank's memory (workers/collect/pyglobals.py).


@dataclass(frozen=True)
class LoopInfo:
    """A loop that encloses a frame's current line, found by the worker from the frame's source (ast)."""

    kind: Literal["for", "async for", "while"]
    line: int  # the loop header's line
    end_line: int
    header: str  # the loop header as written, e.g. "for step, batch in enumerate(loader):"
    variables: Tuple[str, ...] = ()  # names bound by the loop target: ("step", "batch")
    counters: Tuple[str, ...] = ()  # names incremented in the body: i += 1


@dataclass(frozen=True)
class WithInfo:
    """A `with` block around a frame's current line (from the frame's source, like LoopInfo): the frame holds its
    context managers, or waits to enter it when the current line is the statement's header (`entering`)."""

    line: int
    end_line: int
    header: str  # as written, e.g. "with _metrics_lock:"
    items: Tuple[str, ...] = ()  # each context manager's expression: ("_metrics_lock",)
    entering: bool = False


@dataclass(frozen=True)
class Frame:
    """One stack frame. Python frames carry locals and loops when collected; native frames carry a module."""

    function: str
    filename: str
    line: int
    module: Optional[str] = None
    native: bool = False
    locals: Tuple[Local, ...] = ()
    loops: Tuple[LoopInfo, ...] = ()  # enclosing loops, outermost first
    # iteration coordinate: (name, value repr) for each loop variable/counter whose value is known,
    # outermost loop first, e.g. (("epoch", "0"), ("step", "1203"))
    iteration: Tuple[Tuple[str, str], ...] = ()
    source: Tuple[Tuple[int, str], ...] = ()  # (line number, text) around the current line, when readable
    withs: Tuple[WithInfo, ...] = ()  # enclosing `with` blocks, outermost first (locks held or being entered)

    @property
    def location(self) -> str:
        short = self.filename.rsplit("/", 1)[-1] if self.filename else "?"
        return f"{short}:{self.line}" if self.line else short


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a rank: py-spy's frames (innermost first) plus what /proc says about it."""

    tid: int
    name: str = ""
    active: bool = False
    owns_gil: bool = False
    frames: Tuple[Frame, ...] = ()  # innermost first, as py-spy prints them
    state: ProcState = ""
    wchan: str = ""
    syscall: str = ""  # first field of /proc/PID/task/TID/syscall, as a syscall name when known
    kernel_stack: Tuple[str, ...] = ()  # /proc/PID/task/TID/stack (root only)
    is_main: bool = False
    # what it waits on when asleep in a system call, and who is at the other end (None: not in such a call, or
    # an older worker); read from /proc on the node, the process never stopped
    waits: Optional[KernelWait] = None
    # user + system seconds it has run (/proc/PID/task/TID/stat): rising by about one per second between samples
    # while it spins on a core; None: not read (an older worker, or no /proc)
    cpu_time: Optional[float] = None

    # `path` is derived, not data: where the thread is, frame by frame (innermost first), without what differs
    # between ranks on the same spot. Each frame appears as a Frame with its function, filename, line, module,
    # native flag and loop iteration values only (no locals, loops or source), and the whole is interned:
    # threads at the same lines in the same loop iteration hold the same tuple object even when their frames
    # differ in locals, which name per-process objects by address. The analysis groups ranks by it with one
    # lookup per rank and reads loop iterations from it once per distinct path (app/analysis/stacks.py).
    # It is set when the stack is built and is not a dataclass field: JSON, the schema, equality and repr never
    # see it, and dataclasses.replace() computes it again. Sharing is an optimisation only: equal paths may be
    # distinct objects (after the intern tables start over, or after unpickling).
    # `enters_with`, derived the same way: the thread stands at a `with` header in one of its three innermost
    # Python frames (it may be waiting for a lock; app/analysis/locks.py reads it, and only then the frames).
    if typing.TYPE_CHECKING:  # declared for type checkers only: at run time plain instance attributes
        @property
        def path(self) -> Tuple[Frame, ...]: ...

        @property
        def enters_with(self) -> bool: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", frame_path(self.frames))
        object.__setattr__(self, "enters_with", _enters_with(self.frames))


def _enters_with(frames: Tuple[Frame, ...]) -> bool:
    n = 0
    for f in frames:
        if f.native:
            continue
        if f.withs and any(w.entering for w in f.withs):
            return True
        n += 1
        if n == 3:
            return False
    return False


# Interned paths. Built here, where the frames were just made (and sit in the CPU cache), rather than in the
# analysis, which would read 6M scattered frames again at 100k ranks x 60 frames (bench/analysis.py). The
# table is keyed column by column (six tuples, no tuple per frame).
_PATH_FIELDS = ("function", "filename", "line", "module", "native", "iteration")
_COLUMNS = tuple(map(attrgetter, _PATH_FIELDS))
# Frames over all interned paths before the path table starts over (~100 bytes each), and bare frames before
# theirs does (app/model/memo.py): a snapshot holds a few hundred distinct paths.
MAX_INTERNED_FRAMES = 1 << 18
_PATHS: BoundedMemo[tuple, Tuple[Frame, ...]] = BoundedMemo(MAX_INTERNED_FRAMES)
_BARE: BoundedMemo[tuple, Frame] = BoundedMemo(MAX_INTERNED_FRAMES)


def frame_path(frames: Tuple[Frame, ...]) -> Tuple[Frame, ...]:
    """The interned path of these frames (ThreadStack.path): the same tuple object for equal positions."""
    if not frames:
        return ()
    key = tuple(tuple(map(get, frames)) for get in _COLUMNS)
    path = _PATHS.get(key)
    return path if path is not None else _intern(key)


def _intern(key: tuple) -> Tuple[Frame, ...]:
    """A new path in the tables. The memo's setdefault keeps concurrent builders (the session's threads)
    consistent: the first to arrive wins and the others take its objects; a table starting over in between
    costs sharing, not correctness."""
    bare = []
    for ident in zip(*key):  # (function, filename, line, module, native, iteration)
        frame = _BARE.get(ident)
        if frame is None:
            function, filename, line, module, native, iteration = ident
            frame = _BARE.add(ident, Frame(function, filename, line, module, native, iteration=iteration))
        bare.append(frame)
    return _PATHS.add(key, tuple(bare), weight=len(bare))


@dataclass(frozen=True)
class GpuUse:
    """A GPU the rank holds, from nvidia-smi."""

    index: Optional[int]
    uuid: str
    name: str = ""
    used_mib: Optional[int] = None


@dataclass(frozen=True)
class ErrorInfo:
    """A classified failure: a code from workers.protocol.ERROR_HINTS, the detail, and the remedy."""

    code: str
    message: str
    hint: str = ""
    phase: str = ""  # for node errors: connect, login, start, discover, collect


@dataclass(frozen=True)
class StraceThread:
    """What one thread did while strace watched it."""

    tid: int
    blocked_in: str = ""  # the syscall still unfinished when strace detached, e.g. "futex(FUTEX_WAIT_BITSET)"
    calls: int = 0
    top: Tuple[Tuple[str, int], ...] = ()  # most frequent syscalls with counts


@dataclass(frozen=True)
class StraceResult:
    seconds: float
    output: str  # capped raw output
    truncated: bool = False
    threads: Tuple[StraceThread, ...] = ()


@dataclass(frozen=True)
class TcpSocket:
    """One TCP connection of a rank (from /proc/PID/net/tcp* and, when present, `ss -tin`)."""

    local: str  # "addr:port"
    peer: str
    state: str  # ESTABLISHED, SYN_SENT, ...
    send_q: int = 0  # bytes sent and not yet acknowledged
    recv_q: int = 0
    retransmits: int = 0  # unacknowledged retransmissions in flight (/proc/net/tcp "retrnsmt")
    backoff: int = 0  # RTO backoff exponent (ss -i "backoff:")
    total_retrans: Optional[int] = None
    last_send_ms: Optional[int] = None  # ss -i lastsnd
    last_recv_ms: Optional[int] = None  # ss -i lastrcv
    last_ack_ms: Optional[int] = None  # ss -i lastack
    bytes_acked: Optional[int] = None  # bytes sent and acknowledged over the connection's life (tcp_info)
    bytes_received: Optional[int] = None  # bytes received over the connection's life (tcp_info)


@dataclass(frozen=True)
class FlightGroup:
    """One process group in a rank's Flight Recorder record: how far its collectives got on this rank."""

    pg_id: str  # the recorder's id of the group ("0" is the default group)
    name: str = ""  # the group's name or description, when the recorder has one
    last_enqueued: Optional[int] = None  # collective_seq_id of the last collective this rank issued
    last_started: Optional[int] = None  # None when not tracked (gloo never marks a start)
    last_completed: Optional[int] = None
    last_collective: str = ""  # profiling_name of the group's newest entry, e.g. "gloo:all_reduce"


@dataclass(frozen=True)
class FlightEntry:
    """One recorded collective (only the newest entries travel back from the node)."""

    pg_id: str
    collective_seq_id: int
    profiling_name: str = ""
    state: str = ""  # scheduled, started, completed (gloo: always scheduled)
    retired: bool = False
    is_p2p: bool = False
    p2p_seq_id: int = 0
    record_id: int = 0


@dataclass(frozen=True)
class FlightRecord:
    """PyTorch's Flight Recorder for one rank, when its environment enables it (TORCH_FR_BUFFER_SIZE)."""

    source: str = ""  # worker_server, dump_file, or "" when no record could be read
    path: str = ""  # the socket or file it was read from
    version: str = ""
    groups: Tuple[FlightGroup, ...] = ()
    entries: Tuple[FlightEntry, ...] = ()  # newest last
    entries_total: int = 0  # entries the recorder held
    written_at: Optional[float] = None  # a dump file's mtime (epoch seconds); None for a live record
    notes: Tuple[str, ...] = ()  # why a source gave nothing


@dataclass(frozen=True)
class CgroupCpu:
    """The CPU limit that applies to a rank: the nearest cgroup (its own or an ancestor) that sets a quota, or
    the rank's own cgroup when none does, with that cgroup's throttling counters (cpu.stat)."""

    version: str = ""  # "v2" (cpu.max) or "v1" (cpu.cfs_quota_us)
    path: str = ""  # the cgroup, as /proc/PID/cgroup names it
    quota_us: Optional[int] = None  # CPU time allowed per period; None: no limit
    period_us: Optional[int] = None
    nr_periods: Optional[int] = None
    nr_throttled: Optional[int] = None  # periods in which the cgroup ran out of quota
    throttled_us: Optional[int] = None  # time its tasks were held back, in total


@dataclass(frozen=True)
class ProgressCounters:
    """Counters that move while a rank gets somewhere, read on the node at `at` (workers/collect/progress.py).
    Between two samples their differences tell a rank that works (CPU, bytes, context switches) from one
    that sleeps, and a rank held back (run-queue wait, cgroup throttling) from one that is not."""

    at: float = 0.0  # the node's epoch seconds when they were read
    state: ProcState = ""
    utime: Optional[float] = None  # seconds
    stime: Optional[float] = None
    voluntary_ctxt: Optional[int] = None
    nonvoluntary_ctxt: Optional[int] = None
    run_ns: Optional[int] = None  # /proc/PID/schedstat: time on a CPU
    wait_ns: Optional[int] = None  # time runnable but waiting for a CPU
    rchar: Optional[int] = None  # /proc/PID/io: bytes through read() and write() (files, pipes, sockets)
    wchar: Optional[int] = None
    read_bytes: Optional[int] = None  # bytes fetched from / sent to storage
    write_bytes: Optional[int] = None
    log_bytes: Optional[int] = None  # offsets of stdout and stderr where they are regular files
    cgroup: Optional[CgroupCpu] = None


@dataclass(frozen=True)
class PipeReader:
    """A process holding a pipe's read end (workers/pstate.py pipe_wait): the one that should drain it."""

    pid: int
    comm: str = ""
    state: str = ""
    ppid: Optional[int] = None
    wchan: str = ""
    cmdline: Tuple[str, ...] = ()  # redacted on the node


@dataclass(frozen=True)
class ProcessHold:
    """What holds a rank's process, read on the node before any tool touched it (workers/pstate.py)."""

    kind: str = ""  # running, sleeping, stopped, traced, frozen, disk_sleep, zombie, exiting, gone
    stopped_by: str = ""  # signal (SIGSTOP, job control) or tracer
    tracer_pid: Optional[int] = None  # the process tracing it (TracerPid), when one does
    tracer: str = ""  # the tracer's command name
    tty: bool = False  # it has a controlling terminal: Ctrl-Z or job control can stop it
    freezer: str = ""  # v1 or v2 when a cgroup freezer holds it
    cgroup: str = ""  # the freezer cgroup that was set to freeze (the one to thaw), relative to its mount
    freezer_state: str = ""  # FROZEN or FREEZING
    thaw: str = ""  # the command that thaws it, run on its node
    container: str = ""  # `docker unpause ID` when the cgroup is a container's
    wchan: str = ""  # the kernel function it sleeps in
    syscall: str = ""  # D state: the system call it is blocked in, when readable
    waits_on: str = ""  # D state: the file or device that call is on, when readable
    # A thread asleep writing to a full pipe (kind "sleeping": nothing holds the process, the pipe blocks it):
    pipe: str = ""  # "pipe:[inode]"
    pipe_tid: Optional[int] = None  # the thread blocked on it
    pipe_readers: Tuple[PipeReader, ...] = ()  # the processes holding its read end (the writer's own included)
    pipe_search_complete: bool = True  # False: /proc was not searched to the end (too many processes, deadline)

    @property
    def held(self) -> bool:
        """A state that holds the rank whatever its stack shows: stopped, traced, frozen, D."""
        return self.kind in ("stopped", "traced", "frozen", "disk_sleep")


RankKey = Tuple[str, int]  # (node name, pid): unique among a snapshot's ranks, stable across refreshes of a rank


class _OnNode(Protocol):
    @property
    def node(self) -> str: ...

    @property
    def pid(self) -> int: ...


def rank_key(r: _OnNode) -> RankKey:
    """A rank's (node, pid): a RankSnapshot's, or anything else about one rank (its progress, its finding)."""
    return (r.node, r.pid)


@dataclass(frozen=True)
class ErrorOutput:
    """The end of an error a rank wrote where its node can read it back (workers/collect/output.py): its stderr
    when that is a file, or torchrun's elastic error file. Redacted on the node; remote text."""

    source: Literal["stderr", "error_file"]
    path: str  # on the node (the rank's own view of it for an error file)
    text: str  # from where the last error starts: its traceback, or a few lines above the error line
    size: int = 0  # the file's size when read
    age: Optional[float] = None  # seconds since the file was last written, when it was read


@dataclass(frozen=True)
class RankSnapshot:
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
    """One `NVRM: Xid` line of a node's kernel log (app/decode/gpu.py)."""

    xid: int
    bus_id: str = ""  # the PCI address as the driver writes it, e.g. "0000:3b:00"
    text: str = ""  # the rest of the line (pid, process name, message): remote text
    at: Optional[float] = None  # epoch seconds, when the log gave a wall-clock time
    age_s: Optional[float] = None  # seconds before the evidence was collected


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's error counters from nvidia-smi; None: not reported (the GPU or driver lacks the field)."""

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
    """GPU-side evidence of one node, collected once per snapshot for NCCL/CUDA jobs (workers/collect/
    gpu_evidence.py): nvidia-smi's error counters (or that it did not answer), kernel Xid lines, NCCL RAS."""

    why: str = ""  # why it was collected: a rank maps libnccl, or --gpu-evidence on
    at: float = 0.0  # the node's epoch seconds when collected
    smi: str = ""  # ok, timeout (did not answer within smi_timeout), failed, missing
    smi_timeout: float = 0.0
    smi_stuck: bool = False  # it did not even end after SIGKILL: stuck in the driver
    smi_error: str = ""
    gpus: Tuple[GpuHealth, ...] = ()
    xid_source: str = ""  # dmesg, /dev/kmsg, journalctl -k, a syslog file
    xids: Tuple[GpuXid, ...] = ()  # newest last
    ras: Optional[RasView] = None
    notes: Tuple[str, ...] = ()


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

