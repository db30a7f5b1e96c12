"""Turning the worker's raw replies into the model: pure functions, no I/O, golden-tested on recorded output.

The replies' shapes are the TypedDicts of workers/protocol.py (Hello, RankInfo, DumpItem, ...), checked by
mypy here and where the worker builds them.

Everything here reads remote data: values are type-checked as they are taken, never trusted, and text is
kept as text (never interpreted as markup or shell).
"""

from __future__ import annotations

import dataclasses
import re
from sys import intern
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from app.errors import hint_for
from app.model import (CgroupCpu, ErrorInfo, ErrorOutput, Frame, GpuUse, JobProcess, Local, LoopInfo, NodeInfo, PipeReader,
                       ProcessHold,
                       ProgressCounters, RankSnapshot, StraceResult, StraceThread, TcpSocket, ThreadStack, ToolInfo,
                       WithInfo)
from app.model.frames import share
from app.model.memo import BoundedMemo
from app.analysis.coordinates import iteration, meaningful  # noqa: F401 (meaningful: re-exported)
from app.decode.build import Builder
from app.decode.flight import flight_record
from app.decode.kwait import cpu_time as thread_cpu_time
from app.decode.kwait import kernel_wait
from app.decode.kwait import strs as _strs

if TYPE_CHECKING:  # the message shapes (workers/protocol.py): the worker builds them, this module reads them
    from workers.protocol import DumpItem, Hello, RankInfo


# The readers below take what json.loads built: exact types (a bool is no int). `type(v) is int` is one check
# where isinstance needed two, and these run ~60 times a rank (issue 27: 100k ranks a pass).

def _int(value: Any) -> int | None:
    return value if type(value) is int else None


INTERN_LEN = 200  # characters: a shorter string from a node is kept once, however many ranks carry it
# A command line from a node (a rank's, a launcher's): at most MAX_ARGV arguments of MAX_ARG characters each, as
# its executable's path; Linux lets one be megabytes (ARG_MAX), which no summary, screen or file needs.
MAX_ARGV = 256
MAX_ARG = 4096


def _str(value: Any) -> str:
    """A string field; short ones interned: 100k ranks repeat the same states, users, paths and names, and each
    JSON parse builds its own copy (at 1,000 nodes x 8, 1.3 million objects the model kept from the parser)."""
    if type(value) is not str:
        return ""
    return intern(value) if len(value) <= INTERN_LEN else value


# (name, value) pairs of environments, kept once: the ranks of a job differ in a few (RANK, LOCAL_RANK)
_ENV_PAIRS: BoundedMemo[tuple, tuple] = BoundedMemo(1 << 16)




def _env(raw: Any) -> tuple[tuple[str, str], ...]:
    out = []
    for e in _list(raw):
        if type(e) is list and len(e) == 2 and type(e[0]) is str and type(e[1]) is str:
            pair = (e[0], e[1])
            out.append(_ENV_PAIRS.get(pair) or _ENV_PAIRS.add(pair, (_str(e[0]), _str(e[1]))))
    return tuple(out)


def _float(value: Any) -> float:
    return float(value) if type(value) is int or type(value) is float else 0.0


def _list(value: Any) -> list:
    return value if type(value) is list else []


def _dict(value: Any) -> dict:
    return value if type(value) is dict else {}


def node_info(hello: Hello) -> NodeInfo:
    tools = tuple(ToolInfo(name, _str(t.get("path")), _str(t.get("version")))
                  for name, t in sorted(_dict(hello.get("tools")).items()) if isinstance(t, dict))
    searched = tuple((name, tuple(p for p in _list(paths) if isinstance(p, str)))
                     for name, paths in sorted(_dict(hello.get("searched")).items()))
    return NodeInfo(hostname=_str(hello.get("hostname")), python=_str(hello.get("python")),
                    python_exe=_str(hello.get("python_exe")), kernel=_str(hello.get("kernel")),
                    uid=_int(hello.get("uid")), user=_str(hello.get("user")),
                    ptrace_scope=_int(hello.get("ptrace_scope")), cpus=_int(hello.get("cpus")) or 0,
                    psutil=hello.get("psutil") is True, tools=tools, searched=searched)


def error_info(err: Any, phase: str = "") -> ErrorInfo | None:
    if not isinstance(err, dict):
        return None
    code = _str(err.get("code")) or "internal"
    return ErrorInfo(code=code, message=_str(err.get("message")),
                     hint=_str(err.get("hint")) or hint_for(code), phase=phase)


def _gpu(g: dict) -> GpuUse:
    return GpuUse(index=_int(g.get("index")), uuid=_str(g.get("uuid")), name=_str(g.get("name")),
                  used_mib=_int(g.get("used_mib")))


_TCP_SOCKET = Builder(TcpSocket).make
_THREAD = Builder(ThreadStack).make
_COUNTERS = Builder(ProgressCounters).make


def _socket(s: dict) -> TcpSocket:
    # ~3 sockets a rank, 13 fields each: the checks are inlined (the helpers' calls were most of the cost)
    g = s.get
    local, peer, state = g("local"), g("peer"), g("state")
    send_q, recv_q, retransmits, backoff = g("send_q"), g("recv_q"), g("retransmits"), g("backoff")
    total, lsend, lrecv, lack = g("total_retrans"), g("last_send_ms"), g("last_recv_ms"), g("last_ack_ms")
    acked, received = g("bytes_acked"), g("bytes_received")
    return _TCP_SOCKET(local=_str(local), peer=_str(peer), state=_str(state),
                     send_q=send_q if type(send_q) is int else 0, recv_q=recv_q if type(recv_q) is int else 0,
                     retransmits=retransmits if type(retransmits) is int else 0,
                     backoff=backoff if type(backoff) is int else 0,
                     total_retrans=total if type(total) is int else None,
                     last_send_ms=lsend if type(lsend) is int else None,
                     last_recv_ms=lrecv if type(lrecv) is int else None,
                     last_ack_ms=lack if type(lack) is int else None,
                     bytes_acked=acked if type(acked) is int and acked >= 0 else None,
                     bytes_received=received if type(received) is int and received >= 0 else None)


def _count(value: Any) -> int | None:
    """A counter: a non-negative integer, else unknown."""
    return value if type(value) is int and value >= 0 else None


def _seconds(value: Any) -> float | None:
    return float(value) if (type(value) is int or type(value) is float) and value >= 0 else None


@dataclasses.dataclass(frozen=True)
class PgTimeout:
    """The process-group timeout a rank's script sets (workers/collect/pgtimeout.py): seconds (None: set by an
    expression hangscope could not read without running the script), where, and the expression (remote text)."""

    seconds: float | None
    where: str
    text: str


def pg_timeout(raw: Any) -> PgTimeout | None:
    if not isinstance(raw, dict):
        return None
    seconds = raw.get("seconds")
    value = float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None
    if value is not None and not 0 < value < 1e9:  # nan, inf, 0 and negatives are no timeout
        value = None
    return PgTimeout(value, _str(raw.get("where"))[:200], _str(raw.get("text"))[:200])


def _cgroup(cg: dict) -> CgroupCpu:
    return CgroupCpu(version=_str(cg.get("version"))[:8], path=_str(cg.get("path"))[:512],
                     quota_us=_count(cg.get("quota_us")), period_us=_count(cg.get("period_us")),
                     nr_periods=_count(cg.get("nr_periods")), nr_throttled=_count(cg.get("nr_throttled")),
                     throttled_us=_count(cg.get("throttled_us")))


# The ranks of a node mostly share their cgroup (a job's, with its throttling counters read at once): each
# distinct one read once, keyed by what the node sent.
_CGROUPS: BoundedMemo[tuple, CgroupCpu] = BoundedMemo(1 << 12)


def counters(raw: Any) -> ProgressCounters | None:
    """The worker's progress counters (workers/collect/progress.py); None when absent or malformed."""
    if type(raw) is not dict:
        return None
    g = raw.get
    at = _seconds(g("at"))
    if at is None:
        return None
    cg = g("cgroup")
    cgroup = None
    if type(cg) is dict:
        try:
            key = tuple(cg.items())
            cgroup = _CGROUPS.get(key)
        except TypeError:  # an unhashable value (remote data)
            key, cgroup = None, None
        if cgroup is None:
            cgroup = _cgroup(cg) if key is None else _CGROUPS.add(key, _cgroup(cg))
    c = _count
    return _COUNTERS(
        at=at, state=_str(g("state"))[:1], utime=_seconds(g("utime")),
        stime=_seconds(g("stime")), voluntary_ctxt=c(g("voluntary_ctxt")),
        nonvoluntary_ctxt=c(g("nonvoluntary_ctxt")), run_ns=c(g("run_ns")),
        wait_ns=c(g("wait_ns")), rchar=c(g("rchar")), wchar=c(g("wchar")),
        read_bytes=c(g("read_bytes")), write_bytes=c(g("write_bytes")),
        log_bytes=c(g("log_bytes")), main_wchar=c(g("main_wchar")), cgroup=cgroup)


def rank_from_discover(node: str, item: RankInfo) -> RankSnapshot:
    """A discovered rank, not yet collected."""
    g = item.get
    env = _env(g("env"))
    master_addr, master_port = _str(g("master_addr")), _int(g("master_port"))
    launcher, launcher_pid = _str(g("launcher")), _int(g("launcher_pid"))
    job, job_evidence = _job(node, env, master_addr, master_port, launcher, launcher_pid)
    pid, start_time, num_threads, rss = g("pid"), g("start_time"), g("num_threads"), g("rss")
    gpus, children, sockets = g("gpus"), g("children"), g("sockets")
    return _built_rank(
        node=node, pid=pid if type(pid) is int and pid else 0,
        start_time=start_time if type(start_time) is int and start_time else 0,
        rank=_int(g("rank")), local_rank=_int(g("local_rank")),
        found_by=_str(g("found_by"))[:100], rank_evidence=_str(g("rank_evidence"))[:200],
        world_size=_int(g("world_size")), group_rank=_int(g("group_rank")),
        local_world_size=_int(g("local_world_size")), master_addr=master_addr,
        master_port=master_port, launcher=launcher, launcher_pid=launcher_pid, ppid=_int(g("ppid")),
        cmdline=_strs(g("cmdline"), MAX_ARGV, MAX_ARG), exe=_str(g("exe"))[:MAX_ARG],
        uid=_int(g("uid")), user=_str(g("user")), state=_str(g("state")),
        wchan=_str(g("wchan")), num_threads=num_threads if type(num_threads) is int and num_threads else 0,
        cpu_time=_float(g("cpu_time")), rss=rss if type(rss) is int and rss else 0,
        gpus=tuple(_gpu(x) for x in gpus if isinstance(x, dict)) if type(gpus) is list and gpus else (),
        env=env, nspid=_int(g("nspid")), in_container=g("in_container") is True,
        children=tuple(c for c in children if type(c) is int) if type(children) is list and children else (),
        sockets=tuple(_socket(x) for x in sockets if type(x) is dict) if type(sockets) is list else (),
        output=error_output(g("output")) if g("output") else (),
        counters=counters(g("counters")), collected=False, job=job, job_evidence=job_evidence)


# ~50 fields: __init__ set each with its own call (~10 us a rank) and replace() read each first (~17 us)
_RANK = Builder(RankSnapshot)
_built_rank = _RANK.make


_LOOPBACK = ("localhost", "127.", "::1", "0.0.0.0")


def job_identity(r: RankSnapshot) -> tuple[str, str]:
    """(job, evidence) from the best evidence the rank carries: the address of its store (MASTER_ADDR:
    MASTER_PORT: every rank of a job has the same, two jobs on one node cannot), the elastic run id (when
    set: torchrun's default "none" tells nothing), SLURM's job and step ids, else its launcher process (a
    job on one node). Loopback store addresses are per node. ("", "") when nothing tells."""
    return _job(r.node, r.env, r.master_addr, r.master_port, r.launcher, r.launcher_pid)


def _job(node: str, pairs: tuple[tuple[str, str], ...], master_addr: str, master_port: int | None, launcher: str,
         launcher_pid: int | None) -> tuple[str, str]:
    if master_addr and master_port is not None:
        addr = master_addr[:100]
        local = addr.startswith(_LOOPBACK)
        return (f"{addr}:{master_port}" + (f" on {node}" if local else ""), "MASTER_ADDR:MASTER_PORT")
    env = dict(pairs)
    run = env.get("TORCHELASTIC_RUN_ID", "")
    if run and run != "none":
        return f"elastic run {run[:100]}", "TORCHELASTIC_RUN_ID"
    slurm = env.get("SLURM_JOB_ID", "")
    if slurm:
        step = env.get("SLURM_STEP_ID", "")
        return f"SLURM job {slurm[:40]}" + (f".{step[:20]}" if step else ""), "SLURM_JOB_ID, SLURM_STEP_ID"
    if launcher_pid:
        return (f"{launcher or 'launcher'} pid {launcher_pid} on {node}", "launcher process")
    return "", ""


def error_output(raw: Any) -> tuple[ErrorOutput, ...]:
    """workers/collect/output.py's findings (remote text: bounded, typed)."""
    out = []
    for o in _list(raw)[:4]:
        if isinstance(o, dict) and o.get("source") in ("stderr", "error_file") and isinstance(o.get("text"), str):
            out.append(ErrorOutput(source=o["source"], path=_str(o.get("path"))[:500], text=o["text"][:4000],
                                   size=_count(o.get("size")) or 0, age=_float(o.get("age"))))
    return tuple(out)


def process_from_discover(node: str, item: Mapping[str, Any]) -> JobProcess | None:
    """A launcher or a rank's child as discovery listed it (remote text: bounded, typed)."""
    role = item.get("role")
    pid = _int(item.get("pid"))
    if role not in ("launcher", "child") or not pid:
        return None
    env = tuple((k[:100], v[:1000]) for k, v in (tuple(e) for e in _list(item.get("env"))[:64]
                                                  if isinstance(e, list) and len(e) == 2)
                if isinstance(k, str) and isinstance(v, str))
    return JobProcess(
        node=node, pid=pid, start_time=_int(item.get("start_time")) or 0, role=role,
        kind=_str(item.get("kind"))[:60] or role, ppid=_int(item.get("ppid")),
        of=tuple(p for p in (_int(x) for x in _list(item.get("of"))[:4096]) if p is not None),
        cmdline=tuple(a[:MAX_ARG] for a in _list(item.get("cmdline"))[:MAX_ARGV] if isinstance(a, str)),
        exe=_str(item.get("exe"))[:MAX_ARG], state=_str(item.get("state"))[:1], wchan=_str(item.get("wchan"))[:100],
        num_threads=_int(item.get("num_threads")) or 0, cpu_time=_float(item.get("cpu_time")), env=env,
        nspid=_int(item.get("nspid")))


_DATA_LOADER_WORKER = "torch/utils/data/_utils/worker.py"


def apply_process_dump(proc: JobProcess, item: DumpItem | Dumped, why: str) -> JobProcess:
    """A launcher's or child's dump (an item, or one decode_dump read), read as a rank's is (apply_dump); a child
    whose stack runs torch's DataLoader worker loop is named a data-loader worker."""
    shell = apply_decoded(RankSnapshot(node=proc.node, pid=proc.pid, start_time=proc.start_time, rank=-1),
                          item if isinstance(item, Dumped) else decode_dump(item))
    kind = proc.kind
    if proc.role == "child" and any(f.filename.endswith(_DATA_LOADER_WORKER) and f.function.endswith("_worker_loop")
                                    for t in shell.threads for f in t.frames):
        kind = "data-loader worker"
    return dataclasses.replace(proc, kind=kind, threads=shell.threads, collected=shell.collected, hold=shell.hold,
                               error=shell.error, actions=proc.actions + shell.actions, why_dumped=why,
                               state=shell.state or proc.state)


_RDZV_FLAGS = ("--rdzv-endpoint", "--rdzv_endpoint")
_ADDR_FLAGS = ("--master-addr", "--master_addr")
_PORT_FLAGS = ("--master-port", "--master_port")


def launcher_job(p: JobProcess) -> tuple[str, str]:
    """A launcher's job when it has no rank to take it from: the store its command line names (torchrun's
    --rdzv-endpoint, or --master-addr and --master-port), the way job_identity names a rank's; else the
    launcher itself."""
    args: dict[str, str] = {}
    argv = list(p.cmdline)
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=")
        if not eq and i + 1 < len(argv):
            value = argv[i + 1]
        if flag in _RDZV_FLAGS + _ADDR_FLAGS + _PORT_FLAGS and flag not in args:
            args[flag.replace("_", "-")] = value[:100]
    endpoint = args.get("--rdzv-endpoint", "")
    addr, port = args.get("--master-addr", ""), args.get("--master-port", "")
    if not endpoint and addr and port.isdigit():
        endpoint = f"{addr}:{port}"
    if endpoint and ":" in endpoint:
        local = endpoint.startswith(_LOOPBACK)
        return endpoint + (f" on {p.node}" if local else ""), "the launcher's command line (rendezvous endpoint)"
    return f"{p.kind} pid {p.pid} on {p.node}", "launcher process"


def process_jobs(procs: Sequence[JobProcess], ranks: Sequence[RankSnapshot]) -> list[tuple[str, str]]:
    """Each process's job and why: the job of the ranks it serves; a launcher with none, the job of the launchers
    that share its rendezvous and still serve ranks (torchrun's agent whose ranks have ended waits in its exit
    barrier: the same job, not a second one), else its own command line's (launcher_job)."""
    jobs = {(r.node, r.pid): (r.job, r.job_evidence) for r in ranks}
    served = [next((jobs[(p.node, pid)] for pid in p.of if (p.node, pid) in jobs), None) for p in procs]
    by_rendezvous = {launcher_job(p)[0]: job for p, job in zip(procs, served)
                     if p.role == "launcher" and job is not None and job[0]}
    out = []
    for p, job in zip(procs, served):
        if job is None or not job[0]:
            job = launcher_job(p) if p.role == "launcher" else ("", "")
            job = by_rendezvous.get(job[0], job)
        out.append(job)
    return out


def with_job(r: RankSnapshot) -> RankSnapshot:
    job, evidence = job_identity(r)
    return dataclasses.replace(r, job=job, job_evidence=evidence) if job else r


# --- dumps ------------------------------------------------------------------------------------------------

_NATIVE_FILE = re.compile(r"\.so(?:\.[\w.]+)?$|\.(?:c|cc|cpp|cxx|h|hpp)$")


def _loop(d: dict) -> LoopInfo | None:
    kind = d.get("kind")
    if kind not in ("for", "async for", "while"):
        return None
    return LoopInfo(kind=kind, line=_int(d.get("line")) or 0, end_line=_int(d.get("end_line")) or 0,
                    header=_str(d.get("header")),
                    variables=tuple(v for v in _list(d.get("variables")) if isinstance(v, str)),
                    counters=tuple(v for v in _list(d.get("counters")) if isinstance(v, str)))


def _with(d: dict) -> WithInfo | None:
    if d.get("kind") != "with":
        return None
    return WithInfo(line=_int(d.get("line")) or 0, end_line=_int(d.get("end_line")) or 0, header=_str(d.get("header")),
                    items=tuple(v[:200] for v in _list(d.get("items"))[:4] if isinstance(v, str)),
                    entering=d.get("entering") is True)


# Identical frames without locals, shared between ranks and passes: a snapshot of 100k ranks then holds its few
# hundred distinct frames once, and building a thread's interned path (ThreadStack.path, what the analysis
# groups by) is cheaper on shared frames. Frames are frozen: sharing is invisible but to `is`. Bounded, like
# the model's intern tables, by app/model/memo.py.
MAX_SHARED_FRAMES = 1 << 16
_SHARED_FRAMES: BoundedMemo[tuple, Frame] = BoundedMemo(MAX_SHARED_FRAMES)
_NATIVE_FILES: BoundedMemo[str, bool] = BoundedMemo(MAX_SHARED_FRAMES)  # whether a file name is native code

_ABSENT = object()


def _locals(raw: Any) -> tuple[Local, ...]:
    if not raw or type(raw) is not list:
        return ()
    out = []
    for lc in raw:
        if type(lc) is dict:
            name, value = lc.get("name"), lc.get("repr")
            out.append(Local(name if type(name) is str else "", value if type(value) is str else "",
                             lc.get("arg") is True))
    return tuple(out)


def _frame(f: dict, loops: dict, source: dict, context: int) -> Frame:
    # Every frame of every rank of every refresh comes through here: type checks are inlined (the helpers'
    # calls were most of the cost), the answers that depend only on the file name are remembered.
    filename, line, module, name = f.get("filename"), f.get("line"), f.get("module"), f.get("name")
    if type(filename) is not str:
        filename = ""
    if type(line) is not int:
        line = 0
    if type(module) is not str:
        module = None
    if type(name) is not str:
        name = ""
    native = _NATIVE_FILES.get(filename)
    if native is None:
        native = _NATIVE_FILES.add(filename, bool(_NATIVE_FILE.search(filename)))
    native = native or module is not None
    local_vars = _locals(f.get("locals"))
    raw_loops = loops.get("%s:%d" % (filename, line)) if loops else None
    frame_loops = tuple(lp for lp in (_loop(d) for d in raw_loops if isinstance(d, dict)) if lp is not None) \
        if type(raw_loops) is list else ()
    frame_withs = tuple(w for w in (_with(d) for d in raw_loops if isinstance(d, dict)) if w is not None) \
        if type(raw_loops) is list else ()
    lines: tuple[tuple[int, str], ...] = ()
    if line and not native:
        text = source.get(filename)
        if type(text) is dict:
            got = []
            for n in range(max(1, line - context), line + context + 1):
                value = text.get(str(n), _ABSENT)
                if value is not _ABSENT:
                    got.append((n, value if type(value) is str else ""))
            lines = tuple(got)
    key = (name, filename, line, module, native, frame_loops, frame_withs, lines) if not local_vars else None
    if key is not None:
        shared = _SHARED_FRAMES.get(key)
        if shared is not None:
            return shared
    frame = Frame(function=name, filename=filename, line=line, module=module, native=native,
                  locals=local_vars, loops=frame_loops,
                  iteration=iteration(frame_loops, local_vars, line) if frame_loops else (), source=lines,
                  withs=frame_withs)
    if key is not None:
        frame = _SHARED_FRAMES.add(key, frame)
    return frame


def _procfs_threads(item: DumpItem) -> dict[int, dict]:
    out = {}
    for t in _list(_dict(item.get("procfs")).get("threads")):
        if isinstance(t, dict) and _int(t.get("tid")) is not None:
            out[t["tid"]] = t
    return out


def _thread(tid: int, name: str, active: bool, owns_gil: bool, frames: tuple[Frame, ...], is_main: bool,
            t: dict | None) -> ThreadStack:
    """One thread, py-spy's view merged with /proc's (t) in one construction (dataclasses.replace costs more
    than the thread's whole parse)."""
    if t is None:
        return _THREAD(tid=tid, name=name, active=active, owns_gil=owns_gil, frames=frames, is_main=is_main)
    g = t.get
    waits = g("waits")
    return _THREAD(tid=tid, name=name or _str(g("comm")), active=active, owns_gil=owns_gil, frames=frames,
                        state=_str(g("state")), wchan=_str(g("wchan")), syscall=_str(g("syscall")),
                        kernel_stack=_strs(g("kernel_stack")), is_main=is_main,
                        waits=kernel_wait(waits) if waits is not None else None,
                        cpu_time=thread_cpu_time(g("cpu_time")))


@dataclasses.dataclass(frozen=True)
class Dumped:
    """A dump item read into the model, before it meets its rank (decode_dump: in the connection's reader as the
    item arrives; apply_decoded: on the rank)."""

    pid: int | None
    threads: tuple[ThreadStack, ...]
    collected: bool
    error: ErrorInfo | None
    resumed: bool
    elapsed: float
    state: str
    flight: Any
    hold: ProcessHold | None
    actions: tuple[str, ...]
    notes: tuple[str, ...]
    started_at: float | None
    ended_at: float | None


# one a dump item (100k a pass at 12,500 nodes): a frozen dataclass's __init__ sets its 13 fields one call each
_DUMPED = Builder(Dumped).make


def _time(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def decode_dump(item: DumpItem) -> Dumped:
    """A dump item's threads (py-spy's, merged with /proc's; /proc's alone when py-spy gave nothing) and the rest
    of what it says, independent of the rank it belongs to."""
    procfs = _procfs_threads(item)
    by_nstid = {t["nstid"]: tid for tid, t in procfs.items() if _int(t.get("nstid")) is not None}
    loops, source = _dict(item.get("loops")), _dict(item.get("source"))
    context = _int(item.get("source_context"))
    context = 3 if context is None else max(0, context)
    pid = _int(item.get("pid"))
    pyspy = item.get("pyspy")
    threads: list[ThreadStack] = []
    seen: set[int] = set()
    for t in _list(pyspy):
        if not isinstance(t, dict):
            continue
        raw_tid = _int(t.get("os_thread_id")) or _int(t.get("thread_id")) or 0
        tid = raw_tid if raw_tid in procfs else by_nstid.get(raw_tid, raw_tid)  # container: ns-local ids
        seen.add(tid)
        name = _str(t.get("thread_name"))
        frames = tuple(_frame(f, loops, source, context) for f in _list(t.get("frames")) if isinstance(f, dict))
        threads.append(_thread(tid, name, t.get("active") is True, t.get("owns_gil") is True, frames,
                               name == "MainThread" or tid == pid, procfs.get(tid)))
    for tid in sorted(set(procfs) - seen):  # threads py-spy does not show (native ones), or all without it
        threads.append(_thread(tid, "", False, False, (), tid == pid, procfs[tid]))
    return _DUMPED(pid=pid, threads=tuple(threads), collected=isinstance(pyspy, list),
                  error=error_info(item.get("error")), resumed=item.get("resumed") is True,
                  elapsed=_float(item.get("elapsed")), state=_str(item.get("state_before")),
                  flight=flight_record(item.get("flight")), hold=process_hold(item.get("process")),
                  actions=_strs(item.get("actions"), 20, 300),
                  notes=_strs(item.get("notes"), 20, 500),
                  started_at=_time(item.get("started_at")), ended_at=_time(item.get("ended_at")))


# --- compact dumps (workers/compact.py): a stack table per connection, and per rank what is its own ------------

# The stack table of one connection (a worker's, or a relay's for all its nodes): stack id -> its frames, built
# once per id (without locals: shared by every thread on that stack).
StackTable = dict

MAX_STACKS = 1 << 14  # entries one table holds; a worker forgets what it sent past workers/compact.py MAX_SENT
# A thread's frames with the locals it kept, by (its stack's frames, its locals): ranks on the same stack in the
# same loop iteration share one tuple (and its path, computed once: model/frames.py share()).
# Weighed by the locals its keys hold (a deep stack's thread keeps ~180), so that ranks whose locals all differ
# (a job that passes its rank down a 60-frame stack) cannot keep tens of thousands of keys alive.
MAX_KEPT = 1 << 18
_WITH_LOCALS: BoundedMemo[tuple, tuple[tuple[Frame, ...], tuple[Frame, ...]]] = BoundedMemo(MAX_KEPT)
# Below that, each distinct kept local once, and each frame with the same locals once: where one local differs
# per rank (its rank, in every frame of a recursion), its other locals and the frames without it stay shared, and
# a rank costs the frames that are its own, not 60 frames and 180 locals (issue 27: ~65 KB a rank, 6 GB at
# 12,500 x 8). A frame's entry holds the frame it was built on, so an id in the table is that frame's.
_LOCALS: BoundedMemo[tuple, Local] = BoundedMemo(MAX_KEPT)
_FRAMES_WITH: BoundedMemo[tuple, tuple[Frame, Frame]] = BoundedMemo(MAX_KEPT)
_LOCAL = Builder(Local).make
_FRAME = Builder(Frame).make


# Stack table entries already decoded for some connection, by id: (the entry as it came, its frames). A job's
# nodes stand on the same few stacks and the id is the hash of the entry's content (workers/compact.py), so
# most connections send entries decoded before: a 60-frame entry decodes in ~300 us and compares equal in ~15 us
# (12,500 nodes, issue 27). The id alone is never trusted: a node's entry is taken from here only when it equals
# the one decoded. Weighed by frames (the raw entries are kept: ~1 KB a frame).
_DECODED_STACKS: BoundedMemo[str, tuple[dict, tuple[Frame, ...]]] = BoundedMemo(1 << 13)


def decode_stacks(raw: Any, table: StackTable) -> int:
    """Add a {"stacks": ...} item's entries to the connection's table; how many were new."""
    added = 0
    for sid, entry in _dict(raw).items():
        if not isinstance(sid, str) or sid in table or not isinstance(entry, dict):
            continue
        if len(table) >= MAX_STACKS:
            table.clear()
        known = _DECODED_STACKS.get(sid)
        if known is not None and known[0] == entry:
            table[sid] = known[1]
            added += 1
            continue
        loops, source = _dict(entry.get("loops")), _dict(entry.get("source"))
        context = _int(entry.get("context"))
        context = 3 if context is None else max(0, context)
        frames = share(tuple(_frame(f, loops, source, context) for f in _list(entry.get("frames"))
                             if isinstance(f, dict)))
        table[sid] = frames
        _DECODED_STACKS.add(sid, (entry, frames), max(1, len(frames)))  # keeps the first entry stored for an id
        added += 1
    return added


def _kept_key(raw: Any) -> tuple:
    """A thread's kept locals ([frame index, name, repr, arg] each) as a hashable key; malformed entries are left
    out. A deep stack keeps ~180 a thread (every plain-valued argument), so the well-formed list is read in one
    comprehension, and only a list with a bad entry is read entry by entry."""
    if type(raw) is not list:
        return ()
    try:
        return tuple([(i, n, v, a is True) for i, n, v, a in raw
                      if type(i) is int and type(n) is str and type(v) is str])
    except (TypeError, ValueError):  # an entry that is not a 4-item sequence
        pass
    out = []
    for k in raw:
        if type(k) is list and len(k) == 4 and type(k[0]) is int and type(k[1]) is str and type(k[2]) is str:
            out.append((k[0], k[1], k[2], k[3] is True))
    return tuple(out)


def _local(name: str, value: str, arg: bool) -> Local:
    key = (name, value, arg)
    got = _LOCALS.get(key)
    if got is None:
        name, value = _str(name), _str(value)  # interned when short: the key and the Local hold the same text
        got = _LOCALS.add((name, value, arg), _LOCAL(name=name, repr=value, arg=arg))
    return got


def _same_locals(before: tuple[Frame, ...], frames: tuple[Frame, ...], kept: tuple) -> bool:
    """Whether `before` (built by _with_locals on these very frames) holds exactly the locals `kept` names, in
    their order: then it is what _with_locals would build from them (a copy of `frames`, position by position)."""
    j, n = 0, len(kept)
    for i, f in enumerate(before):
        if f is frames[i]:
            continue
        for lc in f.locals:
            if j == n:
                return False
            k = kept[j]
            if k[0] != i or k[1] != lc.name or k[2] != lc.repr or k[3] is not lc.arg:
                return False
            j += 1
    return j == n


def _with_locals(frames: tuple[Frame, ...], kept: tuple, before: tuple[Frame, ...] | None = None
                 ) -> tuple[Frame, ...]:
    """The stack's frames with this thread's kept locals (and the loop iteration they give) in place; `before`,
    what the thread's last pass gave on the same frames, is taken again when its locals are the same."""
    # by the table's frames tuple, not the node's id for it: equal entries share one tuple (decode_stacks), and a
    # node that sends other frames under a known id must not get, nor give, another node's frames; the entry holds
    # the tuple, so its id is never reused while the entry is in the table
    # Either table is used only while it pays (BoundedMemo.use): where every rank's locals are its own, neither
    # key ever comes back, and hashing ~180 locals to miss and storing what nobody reads was ~a fifth of a rank.
    whole = _WITH_LOCALS.use()
    key = (id(frames), kept)
    if whole:
        got = _WITH_LOCALS.get(key)
        if got is not None and got[0] is frames:
            _WITH_LOCALS.hits += 1
            return got[1]
    # A rank whose locals are its own (in no table any more at 100k ranks) keeps its frames from one pass to the
    # next while they do not change: the TUI's last snapshot and the new one share them (a refresh built them
    # all again: two snapshots' worth of per-rank frames at once).
    if before is not None and _same_locals(before, frames, kept):
        return before
    # per frame: its id, then name, repr, arg of each of its locals (one flat list: the frame's key below)
    by_frame: dict[int, list] = {}
    count = len(frames)
    for i, name, value, arg in kept:
        if 0 <= i < count:
            got_i = by_frame.get(i)
            if got_i is None:
                by_frame[i] = [id(frames[i]), name, value, arg]
            else:
                got_i += (name, value, arg)
    out = list(frames)
    memo = _FRAMES_WITH
    for i, flat in by_frame.items():
        f = frames[i]
        fkey = None
        if memo.use():
            fkey = tuple(flat)
            known = memo.get(fkey)
            if known is not None and known[0] is f:
                memo.hits += 1
                out[i] = known[1]
                continue
        lv = tuple([_local(flat[k], flat[k + 1], flat[k + 2]) for k in range(1, len(flat), 3)])
        frame = _FRAME(function=f.function, filename=f.filename, line=f.line, module=f.module, native=f.native,
                       locals=lv, loops=f.loops, iteration=iteration(f.loops, lv, f.line) if f.loops else (),
                       source=f.source, withs=f.withs)
        out[i] = frame if fkey is None else memo.add(fkey, (f, frame), weight=len(lv))[1]
    built = share(tuple(out))
    return _WITH_LOCALS.add(key, (frames, built), weight=len(kept) + 1)[1] if whole else built


# A node's threads of its last pass, for the next one: (pid, tid) -> (the table's frames, the frames with its
# locals). A session keeps one per node and replaces it each pass (app/session/session.py _collect_decoder).
ThreadsBefore = dict


def decode_compact_dump(item: DumpItem, table: StackTable,
                        last: tuple[ThreadsBefore, ThreadsBefore] | None = None) -> Dumped:
    """A compact dump item (workers/compact.py) read against its connection's stack table: as decode_dump reads
    a full one, but each thread's frames come from the table (shared), with the locals the item kept. `last`:
    (the node's threads of its last pass, those of this one, filled here), so that a thread whose frames and
    locals did not change keeps its frame objects."""
    procfs = _procfs_threads(item)
    by_nstid = {t["nstid"]: tid for tid, t in procfs.items() if _int(t.get("nstid")) is not None}
    pid = _int(item.get("pid"))
    raw_threads = item.get("threads")
    threads: list[ThreadStack] = []
    seen: set[int] = set()
    unknown = 0
    for t in _list(raw_threads):
        if not isinstance(t, dict):
            continue
        raw_tid = _int(t.get("os_thread_id")) or _int(t.get("thread_id")) or 0
        tid = raw_tid if raw_tid in procfs else by_nstid.get(raw_tid, raw_tid)
        seen.add(tid)
        name = _str(t.get("thread_name"))
        sid = t.get("stack")
        frames = table.get(sid) if isinstance(sid, str) else None
        if frames is None:
            unknown += 1
            frames = ()
        kept = _kept_key(t.get("locals"))
        if kept and frames:
            if last is None:
                frames = _with_locals(frames, kept)
            else:
                before = last[0].get((pid, tid))
                base = frames
                frames = _with_locals(frames, kept, before[1] if before is not None and before[0] is frames else None)
                last[1][(pid, tid)] = (base, frames)
        threads.append(_thread(tid, name, t.get("active") is True, t.get("owns_gil") is True, frames,
                               name == "MainThread" or tid == pid, procfs.get(tid)))
    for tid in sorted(set(procfs) - seen):
        threads.append(_thread(tid, "", False, False, (), tid == pid, procfs[tid]))
    notes = _strs(item.get("notes"), 20, 500)
    if unknown:
        notes += (f"{unknown} thread(s) name a stack its node's worker did not send: shown without frames",)
    return _DUMPED(pid=pid, threads=tuple(threads), collected=isinstance(raw_threads, list),
                  error=error_info(item.get("error")), resumed=item.get("resumed") is True,
                  elapsed=_float(item.get("elapsed")), state=_str(item.get("state_before")),
                  flight=flight_record(item.get("flight")), hold=process_hold(item.get("process")),
                  actions=_strs(item.get("actions"), 20, 300), notes=notes,
                  started_at=_time(item.get("started_at")), ended_at=_time(item.get("ended_at")))


def apply_decoded(rank: RankSnapshot, d: Dumped, **more: Any) -> RankSnapshot:
    """The rank with what its dump said (decode_dump), and `more` fields set in the same replace (one copy of a
    ~50-field rank, not two)."""
    if rank.rank is None:
        rank = spawn_identity(rank, d.threads)
    return _RANK.replace(
        rank, threads=d.threads, collected=d.collected, error=d.error, resumed=rank.resumed or d.resumed,
        elapsed=d.elapsed, state=d.state or rank.state, flight=d.flight, hold=d.hold or rank.hold,
        actions=rank.actions + d.actions if rank.actions else d.actions,
        notes=rank.notes + d.notes if rank.notes else d.notes, **more)


def apply_dump(rank: RankSnapshot, item: DumpItem) -> RankSnapshot:
    """The rank with its threads (py-spy's, merged with /proc's; /proc's alone when py-spy gave nothing)."""
    return apply_decoded(rank, decode_dump(item))


_SPAWN_WRAP = "torch/multiprocessing/spawn.py"
_MP_PROCESS = "multiprocessing/process.py"


def spawn_identity(rank: RankSnapshot, threads: Iterable[ThreadStack]) -> RankSnapshot:
    """A rank without a rank environment started by torch.multiprocessing.spawn: its number is the spawn target's
    `rank` argument (py-spy --locals), its world size the target's `world_size` argument; torch's `_wrap` frame
    calls the target as fn(i, *args), so with no argument named `rank` the process index `i` is only its local
    rank. Nothing is guessed: without locals, or without such a frame, the rank stays unknown."""
    for t in sorted(threads, key=lambda t: not t.is_main):
        frames = t.frames
        for i, f in enumerate(frames):
            if i and f.filename.endswith(_MP_PROCESS) and f.function.rsplit(".", 1)[-1] == "run":
                # plain multiprocessing: Process(target=fn, args=(rank, ...)).start(); run() calls the target
                target = frames[i - 1]
                args = {lc.name: lc.repr for lc in target.locals if lc.arg}
                number, world = _int_text(args.get("rank")), _int_text(args.get("world_size"))
                if number is not None:
                    return dataclasses.replace(
                        rank, rank=number, world_size=rank.world_size or world,
                        rank_evidence=f"the multiprocessing target's `rank` argument ({target.function[:80]}, "
                                      "py-spy --locals)")
                continue
            if f.function != "_wrap" or not f.filename.endswith(_SPAWN_WRAP) or i == 0:
                continue
            target = frames[i - 1]
            args = {lc.name: lc.repr for lc in target.locals if lc.arg}
            index = next((_int_text(lc.repr) for lc in f.locals if lc.name == "i"), None)
            number, world = _int_text(args.get("rank")), _int_text(args.get("world_size"))
            fn = target.function[:80]
            if number is not None:
                return dataclasses.replace(
                    rank, rank=number, world_size=rank.world_size or world,
                    local_rank=rank.local_rank if rank.local_rank is not None else index,
                    rank_evidence=f"the spawn target's `rank` argument ({fn}, py-spy --locals)")
            if index is not None:
                return dataclasses.replace(
                    rank, local_rank=index, world_size=rank.world_size or world,
                    rank_evidence=f"unknown: the spawn target {fn} has no `rank` argument; its spawn index {index} "
                                  "is the local rank only")
    return rank


def _int_text(value: Any) -> int | None:
    """A local's repr that is a plain non-negative integer (py-spy shows ints as digits), else None."""
    return int(value) if isinstance(value, str) and value.isdigit() and len(value) < 10 else None


def process_hold(raw: Any) -> ProcessHold | None:
    """workers/pstate.py's reading of what holds a process (remote text, bounded); None when nothing does."""
    if not isinstance(raw, dict):
        return None
    pipe = _dict(raw.get("pipe"))
    if raw.get("kind") in ("running", "sleeping", "gone", "", None) and not _int(raw.get("tracer_pid")) \
            and not pipe:
        return None  # nothing holds it: the state letter says the rest (and the analysis skips None in C)
    f = _dict(raw.get("freezer"))
    version = _int(f.get("version"))
    hold = ProcessHold(
        kind=_str(raw.get("kind"))[:20], stopped_by=_str(raw.get("stopped_by"))[:20],
        tracer_pid=_int(raw.get("tracer_pid")) or None, tracer=_str(raw.get("tracer"))[:64],
        tracer_ours=raw.get("tracer_ours") is True, tty=raw.get("tty") is True,
        freezer=f"v{version}" if version in (1, 2) else "",
        cgroup=_str(f.get("cgroup"))[:500], freezer_state=_str(f.get("state"))[:20], thaw=_str(f.get("thaw"))[:600],
        container=_str(f.get("container"))[:100], wchan=_str(raw.get("wchan"))[:100],
        syscall=_str(raw.get("syscall"))[:40], waits_on=_str(raw.get("waits_on"))[:300])
    if not pipe:
        return hold
    readers = tuple(PipeReader(pid=pid, comm=_str(r.get("comm"))[:64], state=_str(r.get("state"))[:2],
                               ppid=_int(r.get("ppid")), wchan=_str(r.get("wchan"))[:100],
                               cmdline=tuple(_str(a)[:200] for a in _list(r.get("cmdline"))[:16]))
                    for r in _list(pipe.get("readers"))[:8] if isinstance(r, dict)
                    for pid in [_int(r.get("pid"))] if pid)
    return dataclasses.replace(hold, pipe=_str(pipe.get("pipe"))[:40], pipe_tid=_int(pipe.get("tid")),
                               pipe_readers=readers, pipe_search_complete=pipe.get("complete") is not False)


# --- strace and gdb ---------------------------------------------------------------------------------------

_STRACE_LINE = re.compile(r"^(?:\[pid\s+(\d+)\]\s+)?(?:\d\d:\d\d:\d\d\.\d+\s+)?(.*)$")
_CALL = re.compile(r"^([a-z_][a-z0-9_]*)\((.*)$")
_RESUMED = re.compile(r"^<\.\.\. ([a-z_][a-z0-9_]*) resumed>")
_RESULT = re.compile(r"\)\s+= ")


def _describe_call(name: str, args: str) -> str:
    """A blocked call with the argument that tells what it waits for: the futex op, the fd of a read."""
    parts = [p.strip() for p in args.split(",")]
    if name == "futex" and len(parts) > 1:
        op = parts[1].split("|")[0].replace("_PRIVATE", "")
        return "futex(%s)" % op
    if name in ("read", "recvfrom", "recvmsg", "write", "sendto", "sendmsg", "epoll_wait", "epoll_pwait",
                "accept", "accept4", "connect") and parts and parts[0].isdigit():
        return "%s(%s)" % (name, parts[0])
    return "%s()" % name


def strace_result(done: Mapping[str, Any]) -> StraceResult:
    """Per thread: the call still unfinished when strace detached, how many calls, the most frequent ones."""
    data = _dict(done.get("data")) if "data" in done else dict(done)
    output = _str(data.get("output"))
    main_pid = _int(data.get("pid")) or 0
    pending: dict[int, str] = {}  # tid -> the call started and not (yet) finished
    counts: dict[int, Counter] = {}
    for raw in output.splitlines():
        if raw.startswith("[truncated"):
            continue
        m = _STRACE_LINE.match(raw)
        if m is None:
            continue
        tid = int(m.group(1)) if m.group(1) else main_pid
        rest = m.group(2)
        resumed = _RESUMED.match(rest)
        if resumed:
            if "<detached ...>" in rest:  # resumed, then still blocked when strace let go
                pending.setdefault(tid, "%s()" % resumed.group(1))
            elif _RESULT.search(rest):
                pending.pop(tid, None)
            continue
        call = _CALL.match(rest)
        if call is None:
            continue  # "+++ exited with 0 +++", signals
        name, args = call.group(1), call.group(2)
        counts.setdefault(tid, Counter())[name] += 1
        if "<unfinished ...>" in rest or "<detached ...>" in rest or not _RESULT.search(rest):
            pending[tid] = _describe_call(name, args)
        else:
            pending.pop(tid, None)
    tids = sorted(set(counts) | set(pending))
    threads = tuple(StraceThread(tid=tid, blocked_in=pending.get(tid, ""), calls=sum(counts.get(tid, {}).values()),
                                 top=tuple(counts.get(tid, Counter()).most_common(5))) for tid in tids)
    return StraceResult(seconds=_float(data.get("seconds")), output=output, truncated=data.get("truncated") is True,
                        threads=threads)


_GDB_NOISE = ("To enable execution of this file add", "\tadd-auto-load-safe-path", "line to your configuration file",
              "To completely disable this security protection add", "\tset auto-load safe-path /",
              "For more information about this security protection see the",
              "\"Auto-loading safe path\" section in the GDB manual", "\tinfo \"(gdb)Auto-loading safe path\"")


def gdb_text(done: Mapping[str, Any]) -> str:
    """gdb's backtraces without its auto-load advice (which repeats for every library)."""
    data = _dict(done.get("data")) if "data" in done else dict(done)
    lines = [ln for ln in _str(data.get("output")).splitlines() if not ln.startswith(_GDB_NOISE)]
    return "\n".join(lines).strip("\n")
