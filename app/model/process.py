"""What the node read about one process: its state, what holds it, its counters, sockets, tool output and
error output, and a classified failure."""

from __future__ import annotations

import sys
import typing
from dataclasses import dataclass
from typing import Literal, Optional, Tuple

ProcState = str  # one letter from /proc/PID/stat: R S D T t Z X I, or "" when unknown


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

    # The address parts, parsed once a socket (the analysis asks for them in several rooms and passes: at 12,500
    # nodes x 8 ranks that was 350,000 parses a pass). Not fields: derived, set at construction always in this
    # order (an attribute added later unshares the instance's dict: +750 B a socket), each address one string.
    if typing.TYPE_CHECKING:
        @property
        def local_host(self) -> str: ...

        @property
        def peer_host(self) -> str: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "local_host", sys.intern(endpoint_host(self.local)))
        object.__setattr__(self, "peer_host", sys.intern(endpoint_host(self.peer)))


def endpoint_host(endpoint: str) -> str:
    """The address part of "addr:port", "[v6]:port"; IPv4-mapped IPv6 addresses as IPv4."""
    host = endpoint.rsplit(":", 1)[0] if ":" in endpoint else endpoint
    host = host.strip("[]")
    if host[:7].lower() == "::ffff:" and "." in host:
        host = host[7:]
    return host


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
    main_wchar: Optional[int] = None  # /proc/PID/task/PID/io: bytes the main thread itself wrote (any fd)
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
    # The tracer is a tool of the reading worker's own (its py-spy, strace or gdb, attaching or detaching while the
    # state was read): hangscope's own passing stop, never the job's hold (workers/pstate.py ours())
    tracer_ours: bool = False
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
        """A state that holds the rank whatever its stack shows: stopped, traced, frozen, D; never a tracing stop of
        hangscope's own tool (tracer_ours)."""
        return self.kind in ("stopped", "traced", "frozen", "disk_sleep") and not self.ours

    @property
    def ours(self) -> bool:
        """A tracing stop of hangscope's own making: the tracer was the reading worker's own tool."""
        return self.kind == "traced" and self.tracer_ours


@dataclass(frozen=True)
class ErrorOutput:
    """The end of an error a rank wrote where its node can read it back (workers/collect/output.py): its stderr
    when that is a file, or torchrun's elastic error file. Redacted on the node; remote text."""

    source: Literal["stderr", "error_file"]
    path: str  # on the node (the rank's own view of it for an error file)
    text: str  # from where the last error starts: its traceback, or a few lines above the error line
    size: int = 0  # the file's size when read
    age: Optional[float] = None  # seconds since the file was last written, when it was read
