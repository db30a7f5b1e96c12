"""The one definition of the JSON-lines protocol between the login node (app/) and the worker (workers/).

Stdlib only and Python 3.9 compatible: this module runs on compute nodes and is imported by app/ too.

Wire format: one JSON object per line, UTF-8, on the worker's stdin/stdout. Every reply is redacted on its way
out (workers/redact.py: redact_message), whatever op produced it. The worker's stderr is a log
side channel, never parsed as protocol.

Worker -> login, first and once:
    {"type": "hello", "protocol": 1, "worker_version": str, "python": "3.11.7", "python_exe": str,
     "pid": int, "uid": int, "euid": int, "user": str, "hostname": str, "kernel": str,
     "ptrace_scope": int | None, "cpus": int, "psutil": bool, "pid_ns": str | None, "machine": "x86_64",
     "tools": {"py-spy": {"path": str, "version": str} | None, "strace": ..., "gdb": ...,
               "nsenter": ..., "nvidia-smi": ..., "sudo": ...},
     "searched": {"py-spy": [paths searched], ...},
     "compress": "zlib" | absent}
With "compress": "zlib" (the login side asked for it in the worker's options: Session does) every message after
the hello may come as a frame: a line `z <n>` followed by n bytes of one zlib stream (each frame ends with a sync
flush), which decompress to whole message lines. A node's reply compresses 7-13x (issue 27); frames are told
from JSON lines by their first byte, so a reader handles both. The login side may name the stream's window with the
worker option "compress_window" (log2 of its bytes, 9-15; 15 when absent): the reader's memory for the stream is
that window plus ~7 KB, for the whole connection (app/session/session.py: COMPRESS_WINDOW says which it asks for).

Login -> worker, requests:
    {"id": int, "op": str, "args": {...}}
Each op's arguments, items and done data are TypedDicts below, tied to the op by its Op constant (OPS): the login
side builds every request as `protocol.COLLECT({...})` (a Call), so mypy checks its argument names and types and
the type of what comes back; the worker's handlers read exactly these names (tests/layout/test_protocol.py).

Worker -> login, replies (each echoes the request id):
    {"type": "item", "id": int, "data": {...}}        zero or more, streamed as results arrive
    {"type": "done", "id": int, "data": {...}}        exactly one of done/error ends a request
    {"type": "error", "id": int | None, "code": str, "message": str, "hint": str}
A line that is not valid protocol is answered with an error (id None, code "bad_request") and the worker
exits. A valid request with a wrong argument gets an error with its id (code "bad_request") and the worker
goes on. EOF on stdin: the worker kills everything it started and exits.

Ops (args -> items / done):
    ping      {}                                  -> done {"pong": true, "time": float}
    retire    {"pid": int}                        -> done {"retired": bool, "why": str}: ends an earlier worker of
                                                     this session on the node (one whose connection was lost, so
                                                     it never saw EOF), only if it runs as this worker's user with
                                                     this worker's very command line
    discover  {"pids": [int] | None, "match": str, "timeouts": bool, "gpus": bool (default true: nvidia-smi's
               GPU use per rank)}
                                                  -> item per rank: RankInfo dict (see workers/discover.py),
                                                     with "sockets": [TcpSocket dict] (workers/collect/sockets.py)
                                                     and "counters": {...} (workers/collect/progress.py),
                                                     and "output": [{"source": "stderr" | "error_file", "path",
                                                     "size", "age", "text"}] when it wrote an error where it can
                                                     be read (workers/collect/output.py; redacted), and with
                                                     "timeouts": "pg_timeout": {"seconds": float | None, "where",
                                                     "text"} when its script gives a process group a timeout
                                                     (workers/collect/pgtimeout.py; read from the file)
                                                  -> done {"count", "scanned", "unreadable", "notes": [str],
                                                     "worker_cpu": float, "sshd_cpu": float} (CPU seconds this
                                                     worker and the sshd carrying it have used so far)
    dump      {"targets": [{"pid", "start_time"}], "native": bool, "locals": bool,
               "nonblocking": bool, "timeout": float, "concurrency": int | None,
               "loops": bool, "source_context": int, "sudo": bool}
              -> item per target: {"pid", "start_time", "ok": bool,
                                   "pyspy": <py-spy --json output, parsed JSON> | None,
                                   "pyspy_stderr": str,
                                   "procfs": {...} (see workers/collect/procfs.py),
                                   "loops": {"<file>:<line>": [LoopInfo dict]},
                                   "source": {"<file>": {"<line>": "text"}},
                                   "state_before": str, "state_after": str, "resumed": bool,
                                   "process": <workers/pstate.py read(): what holds it, read before any tool>,
                                   "actions": [str] (what was done to the process, in order),
                                   "elapsed": float, "error": ErrorDict | None,
                                   "notes": [str], "source_context": int,
                                   "flight": None | {"enabled": {var: value}, "source": "worker_server" |
                                              "dump_file" | "", "path": str, "record": {...} | None,
                                              "written_at": float | None, "notes": [str]}
                                              (PyTorch Flight Recorder: workers/collect/flight.py)}
              -> done {"count": int, "elapsed": float}
    collect   discover's args + dump's args without "targets", and "hold": float: a snapshot pass in one request
              (the session's); with hold > 0 the dumps wait, at most that many seconds (10 at most), for a `go`
              naming this request, after the {"discovered"} item
              -> item {"rank": <discover item>} per rank, then one {"discovered": <discover's done data>},
                 then {"dump": <dump item>} per rank as each finishes
              with "compact": true (the session's), each dump item comes compact (workers/compact.py): without
                 "pyspy", "loops" and "source", with "threads": [{"thread_id", "os_thread_id", "thread_name",
                 "active", "owns_gil", "stack": id, "locals": [[frame index, name, repr, arg]]}] (None when
                 py-spy gave nothing), after an item {"stacks": {id: {"frames": [py-spy frames without locals],
                 "loops": {...}, "source": {...}, "context": int}}} carrying the stack table entries this
                 connection has not carried yet (an id is the hash of its entry: the same on every node and pass);
                 with "all_locals": true as well, "locals" lists every local of the thread, not only those the
                 login side's analysis reads
              -> item {"gpu_evidence": {...}} once, after the dumps, when args "gpu_evidence" is "on", or "auto" and
                 a rank maps libnccl/libcuda ("ras": true: this node also asks NCCL's RAS service): raw nvidia-smi
                 CSV or -q text, kernel Xid lines (workers/collect/nvidia.py), RAS's answer
                 (workers/collect/gpu_evidence.py); decoded by app/decode/gpu.py
              -> done {"discover": <discover's done data>, "dump": <dump's done data>}
    strace    {"pid", "start_time", "seconds": float, "max_lines": int, "sudo": bool, "data": bool}
              -> done {"pid", "output": str, "truncated": bool, "lines": int, "resumed": bool, "elapsed": float,
                       "seconds": float, "payloads": bool}   (output: first and last max_lines/2 lines around a
                       [truncated] marker; the bytes each call read or wrote are dropped (`""...`) unless "data")
    gdb       {"pid", "start_time", "timeout": float, "sudo": bool}
              -> done {"pid", "output": str, "stderr": str, "resumed": bool, "elapsed": float}
              strace and gdb end with error target_held (never attaching) on a stopped, frozen or D-state target
    store_ranks {"store": "addr:port", "listeners": ["addr:port"], "pid": int, "timeout": float, "list_keys": bool}
              -> done {"ranks": {listener: rank}, "how": "LIST_KEYS" | "CHECK", "keys": int, "read": int,
                       "elapsed": float}   the rank numbers the job's TCPStore gives the listening addresses of
                       gloo's pairs, read-only (workers/collect/pgstore.py), from pid's network namespace;
                       error store_unreadable when it cannot be read
    detail    {"pid", "start_time"}             -> done {"dump": <dump item, full: every local>} the last full dump
                                                     of that process a compact collect kept on the node (the
                                                     TUI's rank view); error target_exited when there is none
    push_tool {"name": "py-spy", "data_b64": str, "sha256": str}
              -> done {"name", "path"}   (kept in memory or a private temp dir removed at exit)
    go        {"target": int}                     -> done {"released": bool}; a held collect starts its dumps
    cancel    {"target": int}                     -> done {"cancelled": bool}; the target request ends
                                                     with error code "cancelled"
    shutdown  {}                                  -> done {}, then the worker exits

GPU test ops (workers/ops_gpu.py; the login side is app/gpu/):
    gpu_launch {"token": hex, "python": str, "nproc": int, "config": {...} (workers/gputest/program.py),
                "timeout": float, "nccl_debug": bool, "env": {"NCCL_*": str, ...},
                "cuda_visible_devices": str | None, "dump_wait": float, "max_lines": int}
              -> item {"lines": [[stream "out"|"err"|"agent", local_rank | None, text], ...]} as output arrives
              -> done {"returncode", "timed_out", "stopped", "cancelled", "leftovers": int, "killed": int,
                       "survivors": [pid], "lines": int, "dropped": int, "elapsed": float}
              one torchrun (--standalone) on this node; every process of the test carries
              HANGSCOPE_GPUTEST=<token> and is killed before the request answers, however it ends
    gpu_stop  {"token": hex}                      -> done {"found": bool}; that launch dumps the ranks'
                                                     stacks (SIGUSR1, faulthandler) and stops
    gpu_ports {"count", "exclude": [int], "low", "high"} -> done {"ports": [int]} (bindable now)
    net_probe {"targets": [{"host", "port"}], "timeout"}
              -> done {"interfaces": [...], "infiniband": [...], "hostname": {...}, "checks": [...], "env": {...}}
    gpu_python {"pids": [int], "python": str, "timeout"} -> done {"python": str ("" none found), "why": str,
                                                     "tried": [{"python", "why", "ok", "detail"}]}
              the tests' interpreter: "python" as given, else the ranks' own (argv[0] as their command line
              names it), else the first candidate that imports torch (gputest/interpreters.py)
    gpu_inventory {}                              -> done {"at": float, "smi": {...}, "xid_source", "xid_lines": [str],
                                                           "xid_timed", "notes": [str]}
              the collect op's gpu_evidence item without "why" and "ras", and with the processes holding GPUs in
              "smi" (workers/collect/nvidia.py read(); decoded by app/decode/gpu.py like the evidence)
"""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, Generic, List, Literal, Mapping, Optional, Tuple, TypedDict, TypeVar

    ErrorCode = Literal[
        "bad_request", "unknown_op", "tool_missing", "ptrace_denied", "target_exited", "target_changed",
        "already_traced", "timeout", "target_held", "store_unreadable", "sudo_password", "cancelled", "tool_failed",
        "internal",
        "unreachable", "dns", "refused", "connect_timeout", "host_key_unknown", "host_key_changed", "auth_failed",
        "throttled", "lost", "no_python", "protocol", "worker_crashed", "ssh_error"]

    # Message shapes, for type checkers on both sides (the worker builds them, app/decode/replies.py reads them). Every
    # key is optional to the reader: the data is remote, and each value is checked as it is taken.
    class ToolFound(TypedDict, total=False):
        path: str
        version: str
        pushed: bool  # set on the login side: hangscope pushed its own (app/transport/push.py)

    class Hello(TypedDict, total=False):
        type: str  # "hello"
        protocol: int
        worker_version: str
        python: str
        python_exe: str
        pid: int
        uid: int
        euid: int
        user: str
        hostname: str
        kernel: str
        machine: str
        ptrace_scope: Optional[int]
        cpus: int
        psutil: bool
        pid_ns: Optional[str]
        tools: Dict[str, Optional[ToolFound]]
        searched: Dict[str, List[str]]
        compress: str  # "zlib": messages after the hello may come as zlib frames (see the module's docstring)

    class RequestMsg(TypedDict):
        id: int
        op: str
        args: Dict[str, Any]

    class Reply(TypedDict, total=False):
        type: str  # "item", "done" or "error"
        id: Optional[int]
        data: Dict[str, Any]  # item, done
        code: str  # error: an ErrorCode (a newer worker's may be unknown here)
        message: str
        hint: str

    class ErrorDict(TypedDict):
        code: str  # an ErrorCode
        message: str
        hint: str

    class RankInfo(TypedDict, total=False):
        """discover's item per rank (workers/discover.py), the collect op's {"rank": ...}."""
        pid: int
        start_time: int
        found_by: str
        rank_evidence: str
        rank: Optional[int]
        local_rank: Optional[int]
        world_size: Optional[int]
        group_rank: Optional[int]
        local_world_size: Optional[int]
        master_addr: str
        master_port: Optional[int]
        cmdline: List[str]
        exe: str
        uid: Optional[int]
        user: str
        env: List[List[str]]  # [name, value] pairs, allowed names only, values redacted
        nspid: Optional[int]
        in_container: bool
        launcher: str
        launcher_pid: Optional[int]
        ppid: Optional[int]
        state: str
        wchan: str
        num_threads: int
        cpu_time: float
        rss: int
        gpus: List[Dict[str, Any]]
        children: List[int]
        sockets: List[Dict[str, Any]]  # workers/collect/sockets.py
        counters: Dict[str, Any]  # workers/collect/progress.py
        output: List[Dict[str, Any]]  # its recent error output: workers/collect/output.py (only when there is some)
        pg_timeout: Dict[str, Any]  # discover with "timeouts": its script's process-group timeout (pgtimeout.py)

    class PyspyThread(TypedDict, total=False):
        """One thread of py-spy's `dump --json` output."""
        pid: int
        thread_id: int
        os_thread_id: Optional[int]
        thread_name: Optional[str]
        active: bool
        owns_gil: bool
        frames: List[Dict[str, Any]]  # name, filename, short_filename, module, line, locals, is_entry, ...
        process_info: Any

    class DumpItem(TypedDict, total=False):
        """dump's item per target (workers/collect/pyspy.py), the collect op's {"dump": ...}."""
        pid: int
        start_time: Optional[int]
        ok: bool
        pyspy: Optional[List[PyspyThread]]
        pyspy_stderr: str
        procfs: Dict[str, Any]  # workers/collect/procfs.py
        loops: Dict[str, List[Dict[str, Any]]]  # "<file>:<line>" -> LoopInfo dicts (workers/loops.py)
        source: Dict[str, Dict[str, str]]  # file -> line number -> text
        state_before: str
        state_after: str
        resumed: bool
        process: Optional[Dict[str, Any]]  # workers/pstate.py read(), with "pipe": pipe_wait() when one is
        actions: List[str]
        elapsed: float
        error: Optional[ErrorDict]
        notes: List[str]
        source_context: int
        flight: Optional[Dict[str, Any]]  # workers/collect/flight.py
        started_at: float  # the node's clock when the dump began and ended (the pass's skew)
        ended_at: float
        threads: Optional[List[Dict[str, Any]]]  # compact (workers/compact.py): instead of pyspy, loops, source

    class CollectItem(TypedDict, total=False):
        """One item of the collect op: exactly one of the keys (collect_item_key() says which)."""
        rank: RankInfo
        discovered: Dict[str, Any]  # discover's done data
        dump: DumpItem
        process_dump: DumpItem  # a launcher or a rank's child, dumped when what it does matters
        gpu_evidence: GpuEvidence  # workers/collect/gpu_evidence.py, once per node when asked
        stacks: Dict[str, Dict[str, Any]]  # compact: stack table entries by id, before the dumps that use them

    class StraceDone(TypedDict, total=False):
        pid: int
        output: str
        truncated: bool
        lines: int
        resumed: bool
        elapsed: float
        seconds: float
        payloads: bool

    class GdbDone(TypedDict, total=False):
        pid: int
        output: str
        stderr: str
        resumed: bool
        elapsed: float

    # -- each op's arguments and replies (the Op constants below tie them to the op) ----------------------------
    class NoArgs(TypedDict):
        """An op that takes no arguments."""

    class NoItem(TypedDict):
        """An op that streams no items."""

    class PingDone(TypedDict, total=False):
        pong: bool
        time: float

    class RetireArgs(TypedDict):
        pid: int  # the earlier worker (its hello's pid)

    class RetireDone(TypedDict, total=False):
        retired: bool
        why: str  # why not, or how it ended

    class _Sudo(TypedDict, total=False):
        sudo: bool  # run tools (and read /proc) as root with `sudo -n` where the worker's user may not

    class _Which(TypedDict, total=False):
        pids: Optional[List[int]]  # only these processes, rank environment or not; None: discover
        match: Optional[str]  # only python processes whose command line matches (at most MATCH_LIMIT characters)

    class DiscoverArgs(_Which, _Sudo, total=False):
        timeouts: bool  # also read each rank's process-group timeout from its script (hangscope watch)
        gpus: bool  # each rank's GPU use from nvidia-smi (default true; the watch's cheap samples leave it out)

    class DiscoverDone(TypedDict, total=False):
        count: int
        scanned: int
        unreadable: int
        notes: List[str]
        processes: List[Dict[str, Any]]  # launchers and ranks' children (workers/discover.py)
        time: float  # the node's clock when discovery ended
        worker_cpu: float  # CPU seconds this worker (and the tools it reaped) used so far
        sshd_cpu: float  # ... and the sshd process that carries its channel, when readable

    class DumpOptions(_Sudo, total=False):
        """How to dump: dump's and collect's arguments."""
        native: bool
        locals: bool
        nonblocking: bool
        timeout: float  # per target
        concurrency: Optional[int]  # dumps at once; None: the node's CPUs
        loops: bool
        source_context: int

    class Target(TypedDict):
        pid: int
        start_time: Optional[int]

    class DumpArgs(DumpOptions, total=False):
        targets: List[Target]

    class DumpDone(TypedDict, total=False):
        count: int
        elapsed: float
        processes: DumpDone  # collect: the dump of the job's other processes, when some were dumped

    class CollectArgs(_Which, DumpOptions, total=False):
        """discover's arguments and dump's (without targets), and:"""
        hold: float  # seconds the dumps wait for a `go` naming this request (10 at most)
        gpu_evidence: str  # auto (an NCCL/CUDA job), on, off
        ras: bool  # this node also asks NCCL's RAS service
        compact: bool  # each distinct stack once: dump items refer to a stack table (workers/compact.py)
        all_locals: bool  # with compact: every local of each thread, not only those the analysis reads

    class GpuReading(TypedDict, total=False):
        """What workers/collect/nvidia.py read() returns: the gpu_inventory reply, the core of gpu_evidence."""
        at: float
        smi: Dict[str, Any]  # status, via, gpu_fields, gpus_csv, remap_*, app_*, query_text, timeout, stuck, error
        xid_source: str
        xid_lines: List[str]
        xid_timed: str  # iso, epoch, syslog
        notes: List[str]

    class GpuEvidence(GpuReading, total=False):
        why: str
        ras: Dict[str, Any]
        incomplete: bool

    CollectItemKey = Literal["rank", "discovered", "dump", "process_dump", "gpu_evidence", "stacks"]

    class CollectDone(TypedDict, total=False):
        discover: DiscoverDone
        dump: DumpDone

    class _OnePid(TypedDict):
        pid: int

    class StraceArgs(_OnePid, _Sudo, total=False):
        start_time: Optional[int]
        seconds: float
        max_lines: int
        data: bool  # keep the (redacted) bytes each call read or wrote

    class GdbArgs(_OnePid, _Sudo, total=False):
        start_time: Optional[int]
        timeout: float

    class DetailArgs(_OnePid, total=False):
        start_time: Optional[int]

    class DetailDone(TypedDict, total=False):
        dump: DumpItem

    class _StoreRanksBase(TypedDict):
        store: str  # "addr:port"
        listeners: List[str]
        pid: int  # a rank holding a connection to the store: its network namespace is used

    class StoreRanksArgs(_StoreRanksBase, total=False):
        timeout: float
        list_keys: bool

    class StoreRanksDone(TypedDict, total=False):
        ranks: Dict[str, int]  # listener -> rank
        how: str  # LIST_KEYS or CHECK
        keys: int
        read: int
        elapsed: float

    class PushToolArgs(TypedDict):
        name: str
        data_b64: str
        sha256: str

    class PushToolDone(TypedDict, total=False):
        name: str
        path: str

    class TargetArgs(TypedDict):
        target: int  # the request id that go releases or cancel ends

    class GoDone(TypedDict, total=False):
        released: bool

    class CancelDone(TypedDict, total=False):
        cancelled: bool

    class _GpuLaunchBase(TypedDict):
        token: str
        python: str
        config: Dict[str, Any]  # workers/gputest/program.py

    class GpuLaunchArgs(_GpuLaunchBase, total=False):
        nproc: int
        timeout: float
        nccl_debug: bool
        env: Dict[str, str]  # NCCL_*, GLOO_*, TORCH_*, CUDA_* settings
        cuda_visible_devices: Optional[str]
        dump_wait: float
        max_lines: int

    class GpuLaunchItem(TypedDict, total=False):
        lines: List[List[Any]]  # [stream "out" | "err" | "agent", local_rank | None, text]

    class GpuLaunchDone(TypedDict, total=False):
        returncode: Optional[int]
        timed_out: bool
        stopped: bool
        cancelled: bool
        leftovers: int
        killed: int
        survivors: List[int]
        lines: int
        dropped: int
        elapsed: float

    class GpuStopArgs(TypedDict):
        token: str

    class GpuStopDone(TypedDict, total=False):
        found: bool

    class GpuPortsArgs(TypedDict, total=False):
        count: int
        exclude: List[int]
        low: int
        high: int

    class GpuPortsDone(TypedDict, total=False):
        ports: List[int]

    class NetTarget(TypedDict):
        host: str
        port: int

    class NetProbeArgs(TypedDict, total=False):
        targets: List[NetTarget]
        timeout: float

    class NetProbeDone(TypedDict, total=False):
        interfaces: List[Dict[str, Any]]
        infiniband: List[Dict[str, Any]]
        hostname: Dict[str, Any]
        checks: List[Dict[str, Any]]
        env: Dict[str, str]

    class GpuPythonArgs(TypedDict, total=False):
        pids: List[int]
        python: str
        timeout: float

    class GpuPythonDone(TypedDict, total=False):
        python: str  # "": none found
        why: str
        tried: List[Dict[str, Any]]

    ArgsT = TypeVar("ArgsT")  # an op's arguments
    ItemT = TypeVar("ItemT")  # its items
    DoneT = TypeVar("DoneT")  # its done data

    class _Typed(Generic[ArgsT, ItemT, DoneT]):
        """Op and Call carry their op's argument, item and done types for type checkers only."""

PROTOCOL_VERSION = 1
MATCH_LIMIT = 200  # characters of a discover "match" pattern (--match), checked by the CLI and the worker


if not TYPE_CHECKING:  # at run time the type parameters are not needed: no typing import on the node
    class _Typed:
        def __class_getitem__(cls, params: Any) -> Any:
            return cls

    ArgsT = ItemT = DoneT = None


class Call(_Typed[ArgsT, ItemT, DoneT]):
    """One request to send: its op and its arguments, typed by the Op that made it (Op.__call__)."""

    __slots__ = ("op", "args")

    def __init__(self, op: str, args: ArgsT) -> None:
        self.op = op
        self.args = args

    def message(self, req_id: int) -> Dict[str, Any]:
        """The request as it goes on the wire."""
        return {"id": req_id, "op": self.op, "args": self.args}


class Op(_Typed[ArgsT, ItemT, DoneT]):
    """An op of the protocol, with (for type checkers) its argument, item and done types: `COLLECT({...})` is
    the collect request, its arguments checked against CollectArgs."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, args: ArgsT) -> Call[ArgsT, ItemT, DoneT]:
        return Call(self.name, args)

    def __repr__(self) -> str:
        return "Op(%r)" % self.name


# Every op, once: the worker's handlers are registered under these names (workers/ops.py, workers/server.py).
PING: Op[NoArgs, NoItem, PingDone] = Op("ping")
RETIRE: Op[RetireArgs, NoItem, RetireDone] = Op("retire")
DISCOVER: Op[DiscoverArgs, RankInfo, DiscoverDone] = Op("discover")
DUMP: Op[DumpArgs, DumpItem, DumpDone] = Op("dump")
COLLECT: Op[CollectArgs, CollectItem, CollectDone] = Op("collect")
STRACE: Op[StraceArgs, NoItem, StraceDone] = Op("strace")
GDB: Op[GdbArgs, NoItem, GdbDone] = Op("gdb")
DETAIL: Op[DetailArgs, NoItem, DetailDone] = Op("detail")
STORE_RANKS: Op[StoreRanksArgs, NoItem, StoreRanksDone] = Op("store_ranks")
PUSH_TOOL: Op[PushToolArgs, NoItem, PushToolDone] = Op("push_tool")
GO: Op[TargetArgs, NoItem, GoDone] = Op("go")
CANCEL: Op[TargetArgs, NoItem, CancelDone] = Op("cancel")
SHUTDOWN: Op[NoArgs, NoItem, NoItem] = Op("shutdown")
GPU_LAUNCH: Op[GpuLaunchArgs, GpuLaunchItem, GpuLaunchDone] = Op("gpu_launch")
GPU_STOP: Op[GpuStopArgs, NoItem, GpuStopDone] = Op("gpu_stop")
GPU_PORTS: Op[GpuPortsArgs, NoItem, GpuPortsDone] = Op("gpu_ports")
NET_PROBE: Op[NetProbeArgs, NoItem, NetProbeDone] = Op("net_probe")
GPU_PYTHON: Op[GpuPythonArgs, NoItem, GpuPythonDone] = Op("gpu_python")
GPU_INVENTORY: Op[NoArgs, NoItem, GpuReading] = Op("gpu_inventory")
OPS: Dict[str, Op[Any, Any, Any]] = {op.name: op for op in (
    PING, RETIRE, DISCOVER, DUMP, COLLECT, STRACE, GDB, DETAIL, STORE_RANKS, PUSH_TOOL, GO, CANCEL, SHUTDOWN, GPU_LAUNCH,
    GPU_STOP, GPU_PORTS, NET_PROBE, GPU_PYTHON, GPU_INVENTORY)}
COLLECT_ITEM_KEYS: Tuple[CollectItemKey, ...] = ("rank", "discovered", "dump", "process_dump", "gpu_evidence",
                                                 "stacks")


def collect_item_key(item: Mapping[str, Any]) -> Optional[CollectItemKey]:
    """Which of its keys a collect item carries (it carries one); None for anything else (a newer worker's)."""
    for key in COLLECT_ITEM_KEYS:
        if key in item:
            return key
    return None


# The closed set of error codes, each with the remedy a user reads. Worker-side and login-side codes share
# this table so that every layer speaks one vocabulary. ErrorCode names the same set for type checkers
# (tests/test_transport_local.py checks that the two agree).
ERROR_HINTS: Dict[str, str] = {
    # worker-side, per request or per rank
    "bad_request": "hangscope sent something the worker did not understand; report this as a bug",
    "unknown_op": "the worker is older or newer than hangscope; use matching versions",
    "tool_missing": "install the tool on the node (e.g. `pip install py-spy`), or let hangscope push its own",
    "ptrace_denied": (
        "ptrace is not allowed: run as the ranks' user, set kernel.yama.ptrace_scope=0, "
        "grant CAP_SYS_PTRACE, or use --sudo (sudo -n, never a password)"
    ),
    "target_exited": "the process exited before or during collection; it is no longer part of the job",
    "target_changed": "the pid now belongs to another process (pid reuse); rediscover ranks",
    "already_traced": "another tracer (strace, gdb, a debugger) is attached; detach it and retry",
    "timeout": ("the tool did not finish within its deadline and was killed; the message says the target's state "
                "afterwards and whether hangscope had to resume it"),
    "target_held": ("the process is stopped, frozen or in uninterruptible sleep: a ptrace tool would wait on it "
                    "or change it, so it was not run; the message says what holds the process and what resumes it"),
    "store_unreadable": ("the job's store did not answer hangscope's read-only queries; rank numbers come from the "
                         "other evidence (environment, --locals, the command line); --no-store skips the store"),
    "sudo_password": "sudo on the node needs a password; hangscope only uses `sudo -n`: add a NOPASSWD rule",
    "cancelled": "cancelled by the user",
    "tool_failed": "the tool ran but failed; its message is shown",
    "internal": "an unexpected error in the worker; report this as a bug with the message",
    # login-side, per node
    "unreachable": "the node did not answer: check that it is up and that the network path to it works",
    "dns": "the node name does not resolve: check the hosts file or your DNS / ~/.ssh/config HostName",
    "refused": "nothing listens on the SSH port: check the port and that sshd runs on the node",
    "connect_timeout": "no answer within the connect deadline: the node may be down or firewalled",
    "host_key_unknown": (
        "the node's host key is not in known_hosts: verify the fingerprint, then ssh to it once "
        "or pass --accept-new-host-keys"
    ),
    "host_key_changed": (
        "the node's host key differs from known_hosts: possible man-in-the-middle, or the node was reinstalled; "
        "verify, then remove the old key with `ssh-keygen -R HOST`"
    ),
    "auth_failed": "SSH authentication failed: check your key, ssh-agent and the user name",
    "throttled": "the node's sshd refused new connections (MaxStartups); lower --fanout",
    "lost": "the connection dropped during collection; data collected so far is kept and marked partial",
    "no_python": "no python3 >= 3.9 on the node: install one or pass --python PATH",
    "protocol": "the worker spoke an unexpected protocol: hangscope and worker versions differ",
    "worker_crashed": "the worker exited unexpectedly; its stderr is shown",
    "ssh_error": "an SSH error; its message is shown",
}


class ProtocolError(Exception):
    """A line that is not valid protocol."""


# One encoder for every message: json.dumps with arguments of its own builds a JSONEncoder per call (~10 us of
# a ~13 us message: the login side sends a collect and a go to each of 12,500 nodes a pass; a worker a line per
# item). An encoder keeps no state between calls.
_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))


def encode(msg: Dict[str, Any]) -> bytes:
    """One message as one line of UTF-8 JSON (non-ASCII escaped, so a line is always valid UTF-8)."""
    return _ENCODER.encode(msg).encode("ascii") + b"\n"


def decode(line: bytes) -> Dict[str, Any]:
    """Parse one line; raise ProtocolError for anything that is not a JSON object."""
    try:
        msg = json.loads(line.decode("utf-8", errors="replace"))
    except ValueError as exc:
        raise ProtocolError("not JSON: %r" % (line[:200],)) from exc
    if not isinstance(msg, dict):
        raise ProtocolError("not a JSON object: %r" % (line[:200],))
    return msg


def error(req_id: Optional[int], code: str, message: str, hint: Optional[str] = None) -> Dict[str, Any]:
    """An error reply; the hint defaults to the code's remedy."""
    if code not in ERROR_HINTS:
        code, message = "internal", "unknown error code %r: %s" % (code, message)
    return {"type": "error", "id": req_id, "code": code, "message": message,
            "hint": hint if hint is not None else ERROR_HINTS[code]}


def error_dict(code: str, message: str, hint: Optional[str] = None) -> ErrorDict:
    """A per-rank error carried inside an item (a rank's failure is data, not a failed request)."""
    if code not in ERROR_HINTS:
        code, message = "internal", "unknown error code %r: %s" % (code, message)
    return {"code": code, "message": message, "hint": hint if hint is not None else ERROR_HINTS[code]}


def pyspy_flags(native: bool, locals_: bool, nonblocking: bool) -> List[str]:
    """py-spy dump's flags for these options, in one place: the worker runs them, the TUI shows them."""
    return ["--native"] * native + ["--locals"] * locals_ + ["--nonblocking"] * nonblocking
