"""Progress over time: from samples of the same job, each rank is stuck, progressing or gone, and which node
is slow.

A rank is keyed by (node, pid, start_time) so that a reused pid is a new rank. Progress is measured by what
moves, not by what a stack looks like: a running job spends most of each step in the same frame, so two
samples of it look alike. Between two samples a rank progresses when bytes moved on its TCP sockets to its
peers (its store connection left out: a rank polling the store for a missing peer moves bytes and gets
nowhere), when it wrote output or storage, or when its stack or loop iteration changed. CPU time and context
switches alone say the rank works, not that it gets anywhere (a rank spinning in an endless loop works too).

Things keep moving around a hung rank, and none of them is progress (`quiet`, shown but not counted):
- control traffic: NCCL RAS keepalives and the status gathers a RAS query starts, an agent's heartbeat, a
  monitor's polls carry well under BULK_RATE bytes a second; a job that gets anywhere moves its tensors;
- storage written or read at less than BULK_RATE (a metrics line appended, a log flushed);
- output the main thread did not write (its own task's write counter did not move): a logger thread, a progress
  bar's timer, a warning a server thread prints when hangscope asks it for its Flight Recorder, another process
  writing to the same file;
- a thread's place is its Python frames and the native frames that name a function; inside a native wait the
  tables name (cudaDeviceSynchronize, a TCPStore wait) the frames below it, and addresses without a symbol, are
  the wait's own machinery: a driver polling the GPU is caught at another address in every sample.
`stuck` means none of that moved and the stack has not changed for `stuck_samples` samples in a row.
Old snapshots without counters (RankSnapshot.counters) fall back to the stacks and /proc's CPU time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter
from bisect import bisect_left
from statistics import median
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple

from app.analysis.blocking import polls
from app.analysis.facts import Confidence, Evidence, Fact, Who, ranks_who
from app.analysis.fold import count_phrase, short_keys
from app.analysis.health import StateEvidence
from app.analysis.frames import clean, ddp_reducer, in_backward, path_collective, place_frames
from app.analysis.options import AnalysisOptions, selector
from app.model import Frame, ProgressCounters, RankSnapshot, Snapshot, TcpSocket, ThreadStack, rank_key

# waiting: unchanged, but in a collective while a slow node's ranks hold the progressing job back; slow: unchanged,
# but working on that slow node (its cgroup throttles it, it waits for a CPU): neither is stuck
Status = Literal["stuck", "progressing", "gone", "unknown", "waiting", "slow"]
Activity = Literal["spinning", "polling", "sleeping", "busy", "unknown"]
ProgressKey = Tuple[str, int, int]  # (node, pid, start_time)

_signature_part = attrgetter("function", "filename", "line", "iteration")

# bytes a second on a rank's connections to its peers (or to storage) below which they are control traffic, not
# the job's data: NCCL RAS keepalives and status gathers, heartbeats, a monitor's polls move a few hundred bytes a
# second; the smallest model the suite trains moves hundreds of kB a second
BULK_RATE = 16_000

THROTTLED_SHARE = 0.05  # a cgroup held back this share of the wall time or more is throttled
RUN_WAIT_SHARE = 0.25  # runnable but waiting for a CPU this share of the time: the node is short of CPU
RUN_WAIT_RATIO = 3.0  # ... and this many times more than the ranks of the other nodes


@dataclass(frozen=True)
class RankProgress:
    node: str
    pid: int
    start_time: int
    rank: Optional[int]
    status: Status
    since: Optional[float] = None  # epoch seconds of the first sample of the current unchanged run
    duration: float = 0.0  # seconds from `since` to the latest sample
    samples: int = 0  # samples in the current unchanged run
    cpu: Optional[float] = None  # share of one core used between the last two samples
    activity: Activity = "unknown"
    # Between the last two samples, from the counters (None where they were not read):
    moved: Tuple[str, ...] = ()  # what moved, in words: "sockets 1.2 MB", "output 300 B", "stack"
    quiet: Tuple[str, ...] = ()  # what moved that is not progress (the module doc): "sockets 848 B (control-sized)"
    net_bytes: Optional[int] = None  # bytes sent and received on its sockets to peers (not the store)
    store_bytes: Optional[int] = None  # ... on its connections to the job's store (MASTER_PORT)
    ctx_switches: Optional[int] = None
    io_bytes: Optional[int] = None  # storage read/write and output written
    # Over all samples with counters (the first to the latest):
    run_wait: Optional[float] = None  # share of the time runnable but waiting for a CPU (schedstat)
    throttled: Optional[float] = None  # share of the time its cgroup was CPU-throttled (cpu.stat)
    cgroup: str = ""  # the cgroup that limits its CPU, with the limit: "/slow (10% of a CPU)"
    outside: int = 0  # samples in which its main thread was outside any collective
    inside: int = 0  # samples in which it waited in one (DDP's backward counted when it is DDP's)
    running: int = 0  # samples in which its state was R (on or waiting for a CPU)
    held: str = ""  # stopped, frozen, traced or disk_sleep in the latest sample: what holds the rank (not a stack)
    # its thread waits in a collective in the latest sample (None: no stack); asleep in autograd's backward counts
    waits_now: Optional[bool] = None

    @property
    def sockets_moved(self) -> bool:
        """Its connections to its peers carried data between the last two samples, not only control traffic."""
        return any(m.startswith("sockets") for m in self.moved)


class _Signatures:
    """A rank's signature (where its chosen thread stands: each place frame's function, file, line and loop
    iteration), made once per distinct place: from the thread's interned path (ThreadStack.path: the frames'
    function, file, line, module, native flag and iteration, all a signature reads, one tuple for every thread
    at the same lines in the same iteration), not once per frames tuple, which differs from rank to rank where
    each rank keeps locals of its own (object addresses, its rank number). Every rank of every sample kept its
    own copy of a 60-frame signature once (~1 GB over two samples of 100k deep ranks, issue 27). Equal
    signatures come back as one object."""

    def __init__(self, options: AnalysisOptions) -> None:
        self._pick = selector(options)
        self._by_path: Dict[int, Tuple[Tuple[Frame, ...], Optional[tuple]]] = {}  # id(path) -> (path, sig)
        self._same: Dict[tuple, tuple] = {}

    def __call__(self, rank: RankSnapshot) -> Optional[tuple]:
        return self.of_thread(self._pick(rank))

    def of_thread(self, t: Optional[ThreadStack]) -> Optional[tuple]:
        """The signature of a rank whose chosen thread is `t` (picked by the caller)."""
        if t is None or not t.frames:
            return None
        path = t.path
        known = self._by_path.get(id(path))
        if known is not None and known[0] is path:
            return known[1]
        sig = tuple(map(_signature_part, place_frames(path)))
        sig = self._same.setdefault(sig, sig)
        self._by_path[id(path)] = (path, sig)  # the path held, so its id is not reused meanwhile
        return sig


def _port(endpoint: str) -> Optional[int]:
    tail = endpoint.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _store_socket(s: TcpSocket, master_port: Optional[int]) -> bool:
    return master_port is not None and master_port in (_port(s.local), _port(s.peer))


def socket_bytes(before: RankSnapshot, after: RankSnapshot) -> Tuple[Optional[int], Optional[int]]:
    """(bytes to peers, bytes to the store) that moved on the rank's TCP sockets between two samples; None
    when the counters are unknown (an old snapshot, a kernel without them)."""
    prior = before.sockets
    # a node lists a rank's sockets in the same order on each read while they stay open: then the socket at the
    # same place is the same socket, and no dict of them is built (100k ranks a sample, issue 27)
    same = len(prior) == len(after.sockets) and all(
        o.local == s.local and o.peer == s.peer for o, s in zip(prior, after.sockets))
    old = None if same else {(s.local, s.peer): s for s in prior}
    peers = store = None
    for i, s in enumerate(after.sockets):
        if s.state == "LISTEN" or s.bytes_acked is None or s.bytes_received is None:
            continue
        o = prior[i] if old is None else old.get((s.local, s.peer))
        if o is not None and (o.bytes_acked is None or o.bytes_received is None):
            continue
        moved = s.bytes_acked + s.bytes_received - ((o.bytes_acked or 0) + (o.bytes_received or 0) if o else 0)
        moved = max(0, moved)
        if _store_socket(s, after.master_port):
            store = (store or 0) + moved
        else:
            peers = (peers or 0) + moved
    return peers, store


ACTIVE_MS = 2000  # a socket that sent or received within this many milliseconds is in use


def sockets_active(rank: RankSnapshot) -> bool:
    """Whether the rank's connections to its peers (not the store) carried data in the last ACTIVE_MS, from
    tcp_info's last send/receive times: in use now, in one snapshot."""
    for s in rank.sockets:
        if s.state != "ESTABLISHED" or _store_socket(s, rank.master_port):
            continue
        if any(ms is not None and ms < ACTIVE_MS for ms in (s.last_send_ms, s.last_recv_ms)):
            return True
    return False


def ddp_backward_wait(ranks: Sequence[RankSnapshot], options: AnalysisOptions = AnalysisOptions()) -> bool:
    """Whether these ranks (one class: the same path) wait for DDP's gradient all_reduce inside backward: the
    path runs autograd's backward and the Reducer shows natively or their sockets to the peers are in use."""
    return bool(ranks) and all(_in_collective(r, options, sockets_active(r)) for r in ranks[:8])


def _cpu_seconds(c: ProgressCounters) -> Optional[float]:
    return c.utime + c.stime if c.utime is not None and c.stime is not None else None


def _diff(a: Optional[int], b: Optional[int]) -> Optional[int]:
    return b - a if a is not None and b is not None and b >= a else None


def _sum(*values: Optional[int]) -> Optional[int]:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def size_text(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1000  # type: ignore[assignment]
    return f"{n} B"


_PathFlags = Tuple[bool, bool]  # (waits in a collective, in autograd's backward without the Reducer showing)


def _path_flags(path: Tuple, cache: Optional[Dict[int, Tuple[Tuple, _PathFlags]]] = None) -> _PathFlags:
    """What a thread's path says about collectives, once per interned path (ThreadStack.path: ranks at the same
    place share one tuple), not once per rank and sample."""
    if cache is not None:
        hit = cache.get(id(path))
        if hit is not None and hit[0] is path:
            return hit[1]
    frames = tuple(reversed(path))  # outermost first
    if path_collective(frames)[0] is not None or ddp_reducer(frames):
        flags = (True, False)
    else:
        flags = (False, in_backward(frames))
    if cache is not None:
        cache[id(path)] = (path, flags)  # the path is kept alive with its id, so the id cannot be reused
    return flags


_UNPICKED: Any = object()


def _in_collective(rank: RankSnapshot, options: AnalysisOptions, sockets_active: Any,
                   cache: Optional[Dict[int, Tuple[Tuple, _PathFlags]]] = None,
                   thread: Optional[ThreadStack] = _UNPICKED) -> Optional[bool]:
    """Whether the rank's thread waits in a collective: torch.distributed's own frames, or autograd's backward
    when it is DDP's (its Reducer shows natively, or its sockets to the peers move). `sockets_active`: a bool,
    or a function asked only when the answer depends on it. `thread`: the rank's chosen thread when the caller
    has picked it (selector(options))."""
    t = selector(options)(rank) if thread is _UNPICKED else thread
    if t is None or not t.frames:
        return None
    collective, backward = _path_flags(t.path, cache)
    if collective:
        return True
    if not backward:
        return False
    return bool(sockets_active() if callable(sockets_active) else sockets_active)


def track(samples: Sequence[Snapshot], options: AnalysisOptions = AnalysisOptions()) -> Tuple[RankProgress, ...]:
    """Per rank status over `samples` (oldest first; the last one is the current snapshot)."""
    if not samples:
        return ()
    # one sample per moment: the current snapshot passed again in the history is not a second sample
    ordered = sorted({s.taken_at: s for s in samples}.values(), key=attrgetter("taken_at"))
    # per rank and sample: (when, signature, cpu time, the rank, its chosen thread), the thread picked once
    seen: Dict[ProgressKey, List[Tuple[float, Optional[tuple], float, RankSnapshot, Optional[ThreadStack]]]] = {}
    signature = _Signatures(options)
    pick = selector(options)
    for snap in ordered:
        taken_at = snap.taken_at
        for r in snap.ranks:
            t = pick(r)
            entry = (taken_at, signature.of_thread(t), r.cpu_time, r, t)
            key = (r.node, r.pid, r.start_time)
            got = seen.get(key)
            if got is None:
                seen[key] = [entry]
            else:
                got.append(entry)
    latest = ordered[-1].taken_at
    out = []
    flags: Dict[int, Tuple[Tuple, _PathFlags]] = {}
    for key, history in seen.items():
        when, sig, _, rank, thread = history[-1]
        if when != latest:
            out.append(RankProgress(*key, rank.rank, "gone", since=when, duration=latest - when,
                                    samples=len(history)))
            continue
        run = 1
        while run < len(history) and sig is not None and history[-1 - run][1] == sig:
            run += 1
        since = history[-run][0]
        cpu: Optional[float] = None
        if len(history) >= 2 and history[-1][0] > history[-2][0]:
            cpu = max(0.0, (history[-1][2] - history[-2][2]) / (history[-1][0] - history[-2][0]))
        moves = _moves(history[-2][3], rank) if len(history) >= 2 else {}
        if moves.get("cpu") is not None:
            cpu = moves["cpu"]
        moved = tuple(moves.get("moved", ()))
        if run > 1 and moved:
            run, since = 1, when  # it moved since the previous sample: its unchanged run starts now
        if len(history) > 1 and history[-2][1] != sig and sig is not None and history[-2][1] is not None:
            moved = ("stack",) + moved
        if sig is None and not moves:
            status: Status = "unknown"
        elif moved:
            status = "progressing"  # bytes moved, output written, or the stack or iteration changed
        elif sig is not None and run >= options.stuck_samples:
            status = "stuck"
        elif sig is None and len(history) >= options.stuck_samples:
            status = "stuck"  # no stack, but counters that did not move
        else:
            status = "unknown"  # not enough samples yet
        activity = _activity(cpu, options)
        if activity in ("spinning", "busy"):
            t = thread
            if t is not None and polls(t):
                activity = "polling"  # a CUDA synchronisation, NCCL's init: the CPU it uses is its wait's
        out.append(RankProgress(*key, rank.rank, status, since, latest - since, run, cpu, activity,
                                moved=moved, quiet=tuple(moves.get("quiet", ())),
                                net_bytes=moves.get("net"), store_bytes=moves.get("store"),
                                ctx_switches=moves.get("ctx"), io_bytes=moves.get("io"),
                                **_window([h[3] for h in history], options, flags,
                                          asleep=activity == "sleeping", threads=[h[4] for h in history]),
                                held=_held(rank)))
    out.sort(key=lambda p: (p.rank is None, p.rank or 0, p.node, p.pid, p.start_time))
    return tuple(out)


@dataclass(frozen=True)
class Movement:
    """What moved in one rank between two reads of its counters (app/watch follows a job with these)."""

    seconds: float  # between the two reads, on the node's clock
    net_bytes: Optional[int]  # to its peers (its store connection left out)
    io_bytes: Optional[int]  # storage and output
    moved: Tuple[str, ...]  # in words; empty: nothing that says progress moved
    cpu: Optional[float] = None  # share of one core used


def movement(before: RankSnapshot, after: RankSnapshot) -> Optional[Movement]:
    """What moved between two samples of the same rank, by the rule track() applies; None without counters."""
    moves = _moves(before, after)
    if not moves:
        return None
    assert before.counters is not None and after.counters is not None
    return Movement(after.counters.at - before.counters.at, moves.get("net"), moves.get("io"),
                    tuple(moves.get("moved", ())), moves.get("cpu"))


def _moves(before: RankSnapshot, after: RankSnapshot) -> dict:
    """What moved in a rank between two samples, from its counters; {} without them."""
    a, b = before.counters, after.counters
    if a is None or b is None or b.at <= a.at:
        return {}
    dt = b.at - a.at
    out: dict = {}
    ca, cb = _cpu_seconds(a), _cpu_seconds(b)
    if ca is not None and cb is not None:
        out["cpu"] = max(0.0, cb - ca) / dt
    out["ctx"] = _sum(_diff(a.voluntary_ctxt, b.voluntary_ctxt), _diff(a.nonvoluntary_ctxt, b.nonvoluntary_ctxt))
    storage = _sum(_diff(a.read_bytes, b.read_bytes), _diff(a.write_bytes, b.write_bytes))
    log = _diff(a.log_bytes, b.log_bytes)
    out["io"] = _sum(storage, log)
    out["net"], out["store"] = socket_bytes(before, after)
    moved: List[str] = []
    quiet: List[str] = []
    if out["net"]:
        words = f"sockets {size_text(out['net'])}"
        if out["net"] >= BULK_RATE * dt:
            moved.append(words)
        else:
            quiet.append(words + " (control-sized)")
    if log:
        main = _diff(a.main_wchar, b.main_wchar)
        if main is None or main > 0:  # unknown (an older worker): the output counts, as it always did
            moved.append(f"output {size_text(log)}")
        else:
            quiet.append(f"output {size_text(log)} (not by the main thread)")
    if storage:
        words = f"storage {size_text(storage)}"
        if storage >= BULK_RATE * dt:
            moved.append(words)
        else:
            quiet.append(words + " (a trickle)")
    issued = collectives_issued(before, after)
    if issued:
        moved.append(f"{issued} collective{'s' if issued > 1 else ''} (Flight Recorder)")
    out["moved"], out["quiet"] = moved, quiet
    return out


def collectives_issued(before: RankSnapshot, after: RankSnapshot) -> int:
    """Collectives the rank issued or completed between two samples, by its Flight Recorder read live from its
    worker server both times: the job's own count of its steps' communication, which moves whatever carries it
    (NVLink and InfiniBand move no socket bytes); 0 when it did not move or was not read live both times."""
    a, b = before.flight, after.flight
    if a is None or b is None or a.source != "worker_server" or b.source != "worker_server":
        return 0
    old = {g.pg_id: g for g in a.groups}
    most = 0
    for g in b.groups:
        o = old.get(g.pg_id)
        if o is None:
            continue
        for now, then in ((g.last_enqueued, o.last_enqueued), (g.last_completed, o.last_completed)):
            if now is not None and then is not None and now > then:
                most = max(most, now - then)
    return most


def _window(ranks: Sequence[RankSnapshot], options: AnalysisOptions,
            cache: Optional[Dict[int, Tuple[Tuple, _PathFlags]]] = None, asleep: bool = False,
            threads: Optional[Sequence[Optional[ThreadStack]]] = None) -> dict:
    """Over every sample of one rank: run-queue wait and throttling shares, where its thread was. `asleep`: it
    used no CPU between the last two samples (then a thread in autograd's backward waits, see waits_now).
    `threads`: each sample's chosen thread, when the caller has picked them."""
    if threads is None:
        pick = selector(options)
        threads = [pick(r) for r in ranks]
    with_counters = [r for r in ranks if r.counters is not None]
    out: dict = {}
    if len(with_counters) >= 2:
        a, b = with_counters[0].counters, with_counters[-1].counters
        assert a is not None and b is not None
        dt = b.at - a.at
        if dt > 0:
            wait = _diff(a.wait_ns, b.wait_ns)
            out["run_wait"] = wait / 1e9 / dt if wait is not None else None
            if a.cgroup is not None and b.cgroup is not None and a.cgroup.path == b.cgroup.path:
                throttled = _diff(a.cgroup.throttled_us, b.cgroup.throttled_us)
                periods = _diff(a.cgroup.nr_throttled, b.cgroup.nr_throttled)
                if throttled is not None and periods:
                    out["throttled"] = throttled / 1e6 / dt
                elif throttled is not None:
                    out["throttled"] = 0.0
        cg = b.cgroup
        if cg is not None and cg.quota_us and cg.period_us:
            out["cgroup"] = clean(f"{cg.path} ({cg.quota_us / cg.period_us:.0%} of a CPU)", 200)
    inside = outside = running = 0
    where: Optional[bool] = None
    for before, after, thread in zip((None,) + tuple(ranks[:-1]), ranks, threads):
        def active(before: Optional[RankSnapshot] = before, after: RankSnapshot = after) -> bool:
            moved = before is not None and (socket_bytes(before, after)[0] or 0) > 0
            return moved or sockets_active(after)

        where = _in_collective(after, options, active, cache, thread)
        if where is True:
            inside += 1
        elif where is False:
            outside += 1
        state = after.counters.state if after.counters is not None else after.state
        running += state == "R"
    if where is False and asleep and _path_flags(threads[-1].path, cache)[1]:  # type: ignore[union-attr]
        # in autograd's backward without using a CPU between samples: not computing the backward but waiting in
        # it, for DDP's gradient all_reduce, whose sockets fall quiet once every peer has sent what it could
        where = True
    out.update(inside=inside, outside=outside, running=running, waits_now=where)
    return out


def _held(rank: RankSnapshot) -> str:
    hold = rank.hold
    if hold is not None and hold.held:
        return hold.kind
    if hold is None and rank.state == "T":  # a signal's stop, only without a hold reading (health._hold_kind)
        return "stopped"
    return ""


def _activity(cpu: Optional[float], options: AnalysisOptions) -> Activity:
    if cpu is None:
        return "unknown"
    if cpu >= options.spinning_cpu:
        return "spinning"
    if cpu <= options.sleeping_cpu:
        return "sleeping"
    return "busy"


@dataclass(frozen=True)
class ProgressEvidence(Evidence):
    """What moved between samples: the ranks progressing (the job is not hung), or a few still running among
    stuck ones; the ranks a slow node holds back; the stuck ones."""

    moving: Tuple[RankProgress, ...]
    stuck: Tuple[RankProgress, ...]
    behind: Tuple[RankProgress, ...] = ()
    counted: bool = False  # counters moved (bytes, output), not only stacks
    working: int = 0  # of the stuck ones, those that used CPU between samples


def progress_facts(progress: Sequence[RankProgress]) -> List[Fact]:
    """Progressing job (not hung), a few ranks still moving among stuck ones, ranks gone between samples."""
    by: Dict[str, List[RankProgress]] = {"stuck": [], "progressing": [], "gone": [], "unknown": [], "waiting": [],
                                         "slow": []}
    for p in progress:
        by[p.status].append(p)
    out: List[Fact] = []
    moving, stuck, gone = by["progressing"], by["stuck"], by["gone"]
    behind = by["waiting"] + by["slow"]  # held back by a slow node, which slow_nodes names
    if gone:
        keys, numbers = _keys(gone)
        out.append(Fact("exited", ranks_who(keys, numbers), "high", StateEvidence("exited", gone=True)))
    # stuck ranks that used CPU between samples are working, not asleep: "stuck" is then only their stack
    working = [p for p in stuck if p.cpu is not None and p.activity in ("busy", "spinning")]
    counted = any(p.moved and p.moved != ("stack",) for p in moving)
    evidence = ProgressEvidence(tuple(moving), tuple(stuck), tuple(behind), counted, len(working))
    if moving and (not stuck or len(moving) > len(stuck)):
        keys, numbers = _keys(moving)
        out.append(Fact("progressing", ranks_who(keys, numbers), "high" if not stuck else "medium", evidence,
                        culprit=False))
    elif moving and stuck:
        keys, numbers = _keys(moving)
        conf: Confidence = "high" if len(moving) * 3 <= len(stuck) else "medium"
        if working:
            conf = "medium" if conf == "high" else "low"
        out.append(Fact("still_running", ranks_who(keys, numbers), conf, evidence))
    return out


def held_back(progress: Sequence[RankProgress], slow: Sequence[Fact]) -> Tuple[RankProgress, ...]:
    """Ranks called stuck that a slow node explains, in a job that progresses: those that wait in a collective
    become `waiting` (the slow node's ranks are what they wait for), those on the slow node that ran outside one
    (CPU used, or state R) become `slow`. A held rank (stopped, frozen) and a rank with no such evidence stay
    stuck. The job progresses when either rule holds (else nothing changes):

    - its own evidence: ranks off the slow node progress, at least as many as would be called waiting;
    - a straggler node (`_straggler`): every rank of the slow node moves (progresses, or works outside a
      collective), at least one progresses, and every other rank that does not move waits in a collective for
      them. A slow node slows all its ranks alike, so they all lag; the rest waits for them at each collective.

    One rank moving on a slow node while its neighbour there waits with the rest is neither: the node kept up, and
    the moving rank is a lead (still_running)."""
    nodes = {n for f in slow if f.kind == "slow_node" for n in f.who.nodes}
    moving = [p for p in progress if p.status == "progressing"]
    waiting = [p for p in progress if p.status == "stuck" and not p.held and p.waits_now and p.node not in nodes]
    if not nodes:
        return tuple(progress)
    own = any(p.node not in nodes for p in moving) and len(moving) >= len(waiting)
    if not own and not _straggler(progress, nodes):
        return tuple(progress)
    out = []
    for p in progress:
        if p.status == "stuck" and not p.held:
            if p.node in nodes and _working(p) and p.waits_now is False:
                p = replace(p, status="slow")
            elif p.waits_now:
                p = replace(p, status="waiting")
        out.append(p)
    return tuple(out)


def _working(p: RankProgress) -> bool:
    return p.activity in ("busy", "spinning") or p.running > 0


def _straggler(progress: Sequence[RankProgress], nodes: set) -> bool:
    """The slow nodes' ranks all move and the rest that does not move waits in a collective (held_back's rule)."""
    on = [p for p in progress if p.node in nodes]
    off = [p for p in progress if p.node not in nodes and p.status != "progressing"]
    return (any(p.status == "progressing" for p in on)
            and all(p.status == "progressing" or (p.status == "stuck" and not p.held and _working(p)
                                                  and p.waits_now is False) for p in on)
            and all(p.status == "stuck" and not p.held and p.waits_now for p in off))


SlowCode = Literal["throttled", "run_wait", "starved", "outside", "running"]


@dataclass(frozen=True)
class SlowReason:
    """One kind of evidence that a node's ranks are held back, with its figures."""

    code: SlowCode
    share: float  # the node's figure: throttled, waiting, starved (CPU share while runnable), outside, running
    other: float = 0.0  # the other nodes' figure to compare with
    cgroup: str = ""  # throttled: the cgroup and its limit

    @property
    def strong(self) -> bool:
        """Evidence on its own (counters), not only where ranks were caught."""
        return self.code in ("throttled", "run_wait", "starved")


@dataclass(frozen=True)
class SlowEvidence(Evidence):
    node: str
    reasons: Tuple[SlowReason, ...]
    flags: Optional[Evidence] = None  # the node's ranks were launched with other flags (launch.LaunchEvidence)


STARVED_CPU = 0.5  # a rank runnable in every sample that got less than this share of a CPU is held back
STARVED_OTHERS = 0.25  # ... while the other nodes' ranks were runnable in at most this share of samples



def median_without(ordered: Sequence[float], value: float) -> float:
    """The median of `ordered` (sorted, holding `value`) without one `value`: O(log n), so a figure for each node
    against all the others stays linear in nodes."""
    i = bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(k: int) -> float:  # the k-th of the list without index i
        return ordered[k if k < i else k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2

def slow_nodes(progress: Sequence[RankProgress]) -> List[Fact]:
    """Nodes whose ranks are held back: their cgroup throttles them, they wait for a CPU far longer than the
    other nodes' ranks, they stay runnable yet get a fraction of a CPU (a cap the node could not report), or
    they are caught outside the collective (running) while the others wait in it."""
    live = [p for p in progress if p.status != "gone"]
    nodes = sorted({p.node for p in live})
    if len(nodes) < 2:
        return []
    by_node: Dict[str, List[RankProgress]] = {n: [] for n in nodes}
    for p in live:
        by_node[p.node].append(p)
    # per node, once (the other nodes' figures are the totals less the node's: linear in ranks, not quadratic)
    wait_median = {n: median(w) for n, rs in by_node.items()
                   for w in [[p.run_wait for p in rs if p.run_wait is not None]] if w}
    seen_in = {n: sum(p.inside for p in rs if p.inside + p.outside >= 2) for n, rs in by_node.items()}
    seen_all = {n: sum(p.inside + p.outside for p in rs if p.inside + p.outside >= 2) for n, rs in by_node.items()}
    seen_out = {n: seen_all[n] - seen_in[n] for n in nodes}
    samples = {n: sum(p.inside + p.outside for p in rs) for n, rs in by_node.items()}
    running = {n: sum(p.running for p in rs) for n, rs in by_node.items()}
    total_in, total_all = sum(seen_in.values()), sum(seen_all.values())
    total_samples, total_running = sum(samples.values()), sum(running.values())
    moving = {n: sum(p.status == "progressing" for p in rs) for n, rs in by_node.items()}
    total_moving = sum(moving.values())
    medians = sorted(wait_median.values())
    evidence: Dict[str, List[SlowReason]] = {}
    strong: Dict[str, int] = {}
    for node, ranks in by_node.items():
        why: List[SlowReason] = []
        score = 0
        throttled = [p for p in ranks if p.throttled is not None and p.throttled >= THROTTLED_SHARE]
        if throttled and len(throttled) * 2 >= len(ranks):
            worst = max(throttled, key=lambda p: p.throttled or 0.0)
            why.append(SlowReason("throttled", worst.throttled or 0.0, cgroup=worst.cgroup))
            score += 2
        if node in wait_median and len(medians) >= 2:
            mine, theirs = wait_median[node], median_without(medians, wait_median[node])
            if mine >= RUN_WAIT_SHARE and mine >= RUN_WAIT_RATIO * max(theirs, 0.01):
                why.append(SlowReason("run_wait", mine, theirs))
                score += 2
        other_samples = total_samples - samples[node]
        other_r = (total_running - running[node]) / other_samples if other_samples >= 2 else None
        # Runnable in every sample, yet a fraction of a CPU between them, while the others are not runnable: a CPU
        # limit (or contention) holds the node's ranks back, whether or not its cgroup counters can be read
        starved = [p for p in ranks if p.samples >= 2 and p.running >= 2 and p.running >= p.inside + p.outside
                   and p.cpu is not None and p.cpu < STARVED_CPU and not p.held]
        # ... and only in a job that moves (ranks off the node progress): in a stuck job a rank on a CPU that gets
        # little of it is a spin on a loaded machine, not a node held back
        moving_elsewhere = total_moving > moving[node]
        if (not throttled and starved and moving_elsewhere and len(starved) * 2 >= len(ranks) and other_r is not None
                and other_r <= STARVED_OTHERS):
            why.append(SlowReason("starved", median(p.cpu or 0.0 for p in starved), other_r))
            score += 2
        other_all = total_all - seen_all[node]
        if seen_all[node] and other_all:
            out_share = seen_out[node] / seen_all[node]
            other_in = (total_in - seen_in[node]) / other_all
            if out_share >= 0.6 and other_in >= 0.6:
                why.append(SlowReason("outside", out_share, other_in))
                score += 1
        if samples[node] >= 2 and other_r is not None:
            r_share = running[node] / samples[node]
            if r_share >= 0.6 and other_r <= 0.25:
                why.append(SlowReason("running", r_share, other_r))
                score += 1
        if why:
            evidence[node], strong[node] = why, score
    # The counters (throttling, run-queue wait, a runnable rank's CPU share) are evidence on their own; where ranks
    # were caught and in which state is not, with few samples: a running job's ranks are caught anywhere. Both of
    # those, over 4 samples or more, are.
    slow = [n for n in evidence if strong[n] >= 2 and (any(w.strong for w in evidence[n]) or
                                                       min(p.inside + p.outside for p in by_node[n]) >= 4)]
    if not slow or len(slow) * 2 > len(nodes):
        return []  # most nodes alike: nothing stands out, or the whole job is short of CPU
    out = []
    for node in slow:
        keys, numbers = _keys(by_node[node])
        out.append(Fact("slow_node", Who(keys, numbers, (node,)), "high" if strong[node] >= 3 else "medium",
                        SlowEvidence(node, tuple(evidence[node]))))
    return out


def _keys(ps: Sequence[RankProgress]) -> Tuple[tuple, tuple]:
    return tuple(rank_key(p) for p in ps), tuple(p.rank for p in ps)


def stuck_summary(progress: Sequence[RankProgress]) -> str:
    """`8 ranks stuck for 42 s (since the first of 3 samples); 7 sleeping, 1 spinning`, or ""."""
    stuck = [p for p in progress if p.status == "stuck"]
    if not stuck:
        return ""
    longest = max(p.duration for p in stuck)
    acts: Dict[str, int] = {}
    held: Dict[str, List[RankProgress]] = {}
    for p in stuck:
        if p.held:  # a stopped or frozen rank sleeps because something holds it: say what, and which rank
            held.setdefault(p.held, []).append(p)
            continue
        acts[p.activity] = acts.get(p.activity, 0) + 1
    shown = [f"{n} {_ACTIVITY_WORDS.get(a, a)}" for a, n in sorted(acts.items()) if a != "unknown"]
    for kind, ps in sorted(held.items()):
        keys, numbers = _keys(ps)
        shown.append(f"{short_keys(keys, numbers)} {_HELD_WORDS.get(kind, kind)}")
    text = ", ".join(shown)
    return f"{count_phrase(len(stuck))} stuck for up to {longest:.0f} s" + (f"; {text}" if text else "")


def behind_summary(progress: Sequence[RankProgress]) -> str:
    """`2 waiting for a slow node, 2 slow`, or "" (the ranks held_back relabelled)."""
    waiting = sum(1 for p in progress if p.status == "waiting")
    slow = sum(1 for p in progress if p.status == "slow")
    parts = ([f"{waiting} waiting for a slow node"] if waiting else []) + ([f"{slow} slow"] if slow else [])
    return ", ".join(parts)


# a rank polling in a wait runs on a CPU, but it waits (blocking.POLLING_WAITS): not "spinning"
_ACTIVITY_WORDS = {"polling": "polling in a wait"}
_HELD_WORDS = {"stopped": "stopped", "traced": "stopped by a tracer", "frozen": "frozen (cgroup freezer)",
               "disk_sleep": "in uninterruptible sleep (D)"}
