"""Findings from per-rank and per-node facts: missing ranks, failed nodes, failed dumps, odd process states,
thread counts, and snapshots that mix several jobs."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import chain, islice
from operator import attrgetter
from typing import Dict, List, Literal, Optional, Sequence, Tuple

from app.analysis.columns import Facts, facts
from app.analysis.facts import Confidence, Evidence, Fact, Who, nodes_who, ranks_who
from app.analysis.fold import _span as _fold_span
from app.analysis.fold import keys_of
from app.analysis.processes import finished_nodes
from app.model import ErrorInfo, RankSnapshot, Snapshot

JobId = Tuple[str, Optional[int], Optional[int]]  # (MASTER_ADDR, MASTER_PORT, WORLD_SIZE)


_job = attrgetter("master_addr", "master_port", "world_size")
_state = attrgetter("state")
_hold = attrgetter("hold")  # set by parse only when something holds the rank
_ODD_STATES = frozenset("TtZXD")
# More ranks than any job runs (the largest have ~10^5): a WORLD_SIZE above it comes from a wrong environment,
# and is reported as such instead of being counted out.
MAX_PLAUSIBLE_WORLD = 1 << 22
MAX_NUMBERS = 4096  # missing rank numbers a fact carries one by one (the gaps carry them all)


def _span(a: int, b: int) -> str:
    return _fold_span(a, b, 0)


def absent_ranges(found: Sequence[Optional[int]], world: int) -> Tuple[List[Tuple[int, int]], int]:
    """The ranges of 0..world-1 not in `found`, and how many numbers they hold: O(len(found)), whatever world
    is (a node reports WORLD_SIZE; it must not decide how much memory this takes)."""
    present = sorted({r for r in found if r is not None and 0 <= r < world})
    gaps: List[Tuple[int, int]] = []
    expect = 0
    for r in present:
        if r > expect:
            gaps.append((expect, r - 1))
        expect = r + 1
    if expect < world:
        gaps.append((expect, world - 1))
    return gaps, world - len(present)


def jobs(f: Facts) -> Dict[JobId, Facts]:
    """Ranks by job; one job is the usual case and costs no per-rank Python work."""
    if not f.ranks:
        return {}
    if len(set(f.addr)) == 1 and len(set(f.port)) == 1 and len(set(f.world)) == 1:
        return {(f.addr[0], f.port[0], f.world[0]): f}
    out: Dict[JobId, List[RankSnapshot]] = defaultdict(list)
    for r in f.ranks:
        out[_job(r)].append(r)
    return {j: facts(rs) for j, rs in out.items()}


@dataclass(frozen=True)
class JobsEvidence(Evidence):
    """The snapshot holds ranks of several jobs: each job's identity and its ranks, largest first."""

    jobs: Tuple[Tuple[JobId, Tuple[RankSnapshot, ...]], ...]


def several_jobs(by_job: Dict[JobId, Facts]) -> List[Fact]:
    named = {j: f.ranks for j, f in by_job.items() if j != ("", None, None)}
    if len(named) < 2:
        return []
    jobs = tuple((j, tuple(rs)) for j, rs in sorted(named.items(), key=lambda kv: -len(kv[1])))
    all_ranks = [r for rs in named.values() for r in rs]
    return [Fact("several_jobs", ranks_who(keys_of(all_ranks), tuple(r.rank for r in all_ranks)), "high",
                 JobsEvidence(jobs), culprit=False)]


@dataclass(frozen=True)
class NodeEvidence(Evidence):
    """Nodes that could not be inspected (or only partly), by the kind of failure."""

    state: str  # failed, partial
    code: str
    messages: Tuple[str, ...]  # what the nodes said (remote text)
    hint: str  # what to do (the error's remedy)


def failed_nodes(snapshot: Snapshot) -> List[Fact]:
    """Nodes that could not be inspected (or only partly), aggregated by the kind of failure."""
    groups: Dict[Tuple[str, str], List[str]] = defaultdict(list)
    messages: Dict[Tuple[str, str], List[str]] = defaultdict(list)
    first_error: Dict[Tuple[str, str], ErrorInfo] = {}  # one pass: a search per group is quadratic in nodes
    for n in snapshot.nodes:
        if n.state not in ("failed", "partial"):
            continue
        code = n.error.code if n.error else "unknown"
        groups[(n.state, code)].append(n.name)
        if n.error:
            first_error.setdefault((n.state, code), n.error)
            if n.error.message:
                messages[(n.state, code)].append(n.error.message)
    out = []
    for (state, code), names in sorted(groups.items()):
        err = first_error.get((state, code))
        # A lead rather than a note: when the ranks that were seen tell nothing, the unseen ones are next.
        out.append(Fact("node_failed", nodes_who(names), "low",
                        NodeEvidence(state, code, tuple(messages[(state, code)][:3]), err.hint if err else ""),
                        culprit=state == "failed"))
    return out


MissingCase = Literal["implausible", "failed", "hosts_short", "exited", "slots", "finished"]


@dataclass(frozen=True)
class MissingEvidence(Evidence):
    """Rank numbers 0..WORLD_SIZE-1 not found (or nodes holding fewer ranks than their slots), and why."""

    case: MissingCase
    world: int = 0
    count: int = 0  # how many numbers are missing
    gaps: Tuple[Tuple[int, int], ...] = ()
    failed: Tuple[str, ...] = ()  # nodes that could not be inspected
    inspected: int = 0
    per_node: Optional[int] = None
    short_of: Tuple[Tuple[str, int, int], ...] = ()  # (node, ranks found, expected)
    addr: str = ""
    port: Optional[int] = None
    shown: Tuple[RankSnapshot, ...] = ()  # implausible: the ranks that report the WORLD_SIZE
    finished: Tuple[str, ...] = ()  # finished: the nodes whose launcher waits in torchrun's exit barrier
    # exited: nodes short of ranks that run no launcher of the job either, while other nodes' launchers run
    no_launcher: Tuple[str, ...] = ()


def missing_ranks(snapshot: Snapshot, by_job: Dict[JobId, Facts]) -> List[Fact]:
    """Rank numbers 0..WORLD_SIZE-1 not found, and nodes with fewer ranks than their slots."""
    out: List[Fact] = []
    failed = tuple(n.name for n in snapshot.nodes if n.state in ("failed", "partial"))
    inspected = {n.name for n in snapshot.nodes}.union(*(f.node for f in by_job.values()))
    for (addr, port, _), ranks in by_job.items():
        sizes: Counter = Counter(ranks.world)
        sizes.pop(None, None)
        sizes.pop(0, None)
        if not sizes:
            continue
        world: int = sizes.most_common(1)[0][0]
        if world > MAX_PLAUSIBLE_WORLD or world < 0:
            shown = tuple(r for r in ranks.ranks if r.world_size == world)
            out.append(Fact("missing_ranks", ranks_who(keys_of(shown), tuple(r.rank for r in shown)), "medium",
                            MissingEvidence("implausible", world, shown=shown), culprit=False))
            continue
        gaps, count = absent_ranges(ranks.rank, world)
        if not gaps:
            continue
        numbers = tuple(islice((n for a, b in gaps for n in range(a, b + 1)), MAX_NUMBERS))
        no_launcher: Tuple[str, ...] = ()
        local: Counter = Counter(ranks.local_world)
        local.pop(None, None)
        per_node = local.most_common(1)[0][0] if local else None
        conf: Confidence
        short_of: Tuple[Tuple[str, int, int], ...] = ()
        done = finished_nodes(snapshot)
        short = _short_nodes(snapshot, ranks.node, per_node, typical=True) if done else None
        if done and short is not None:
            # a node short of ranks is explained by the barrier when its launcher waits in it, or still runs the
            # node's other ranks (an agent tears down its node's workers when one fails); a short node with neither
            # lost its ranks otherwise
            serving = {p.node for p in snapshot.processes[:4096] if p.role == "launcher" and p.of}
            if not all(n in done or n in serving for n, _, _ in short):
                done = ()
        if done:
            # their launchers wait in torchrun's exit barrier: the ranks they ran have ended well, and it is the
            # ranks still here that the job waits for
            case: MissingCase = "finished"
            conf, culprit = "high", False
        elif failed:
            case = "failed"
            conf, culprit = "low", False
        elif per_node and world > per_node * len(inspected):
            case, conf, culprit = "hosts_short", "low", False
        else:
            short_of = short if short is not None else _short_nodes(snapshot, ranks.node, per_node, typical=True)
            case, conf, culprit = "exited", "high", True
            launched = {p.node for p in snapshot.processes[:4096] if p.role == "launcher"}
            if len(launched) >= 2:
                no_launcher = tuple(n for n, _, _ in short_of if n not in launched)
        who = Who(numbers=numbers, nodes=tuple(n for n, _, _ in short_of) if culprit else (), missing=True)
        out.append(Fact("missing_ranks", who, conf,
                        MissingEvidence(case, world, count, tuple(gaps), failed, len(inspected), per_node, short_of,
                                        addr, port, finished=done, no_launcher=no_launcher), culprit=culprit))
        if done:
            # the ranks still running are what the finished nodes' launchers wait for: a lead of their own
            here = ranks.ranks
            out.append(Fact("unfinished", ranks_who(keys_of(here), tuple(r.rank for r in here)), "high",
                            MissingEvidence("finished", world, count, tuple(gaps), failed, len(inspected), per_node,
                                            short_of, addr, port, finished=done)))
    if not out and any(n.slots for n in snapshot.nodes):
        short_of = _short_nodes(snapshot, [r.node for r in snapshot.ranks], None)
        if short_of:
            out.append(Fact("missing_ranks", Who(nodes=(short_of[0][0],)), "medium",
                            MissingEvidence("slots", short_of=short_of)))
    return out


def _short_nodes(snapshot: Snapshot, rank_nodes: Sequence[str], per_node: Optional[int],
                 typical: bool = False) -> Tuple[Tuple[str, int, int], ...]:
    """(node, ranks found, expected) for nodes with fewer ranks than their slots, LOCAL_WORLD_SIZE, or
    (`typical`, when a rank is known to be missing) the most any node has: jobs place the same number of ranks
    on each node."""
    found = Counter(rank_nodes)
    if per_node is None and typical and len(found) >= 2:
        per_node = max(found.values())
    short_list = []
    for n in snapshot.nodes:
        if n.state in ("failed", "partial"):
            continue
        expected = n.slots if n.slots is not None else per_node
        if expected and found.get(n.name, 0) < expected:
            short_list.append((n.name, found.get(n.name, 0), expected))
    return tuple(short_list)


@dataclass(frozen=True)
class DumpEvidence(Evidence):
    """Ranks without a stack, by cause."""

    cause: str  # an error code, or not_collected, partial, no_thread, empty_stack
    message: str = ""  # the first rank's error message (remote text)
    hint: str = ""
    thread: str = ""  # no_thread: the thread name asked for


def dump_failures(no_stack: Sequence[RankSnapshot], thread: object) -> List[Fact]:
    """Ranks without a stack, by cause: not culprits, but the picture is incomplete."""
    groups: Dict[str, List[RankSnapshot]] = defaultdict(list)
    hints: Dict[str, str] = {}
    for r in no_stack:
        if r.error is not None:
            cause = r.error.code
            hints.setdefault(cause, r.error.hint)
        elif not r.collected:
            cause = "partial" if r.partial else "not_collected"
        else:
            cause = "no_thread" if thread != "main" else "empty_stack"
        groups[cause].append(r)
    out = []
    for cause, ranks in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        msg = next((r.error.message for r in ranks if r.error and r.error.message), "")
        out.append(Fact("dump_failed", ranks_who(keys_of(ranks), tuple(r.rank for r in ranks)), "high",
                        DumpEvidence(cause, msg, hints.get(cause, ""), str(thread)), culprit=False))
    return out


def _states(r: RankSnapshot) -> set:
    return {r.state} | {t.state for t in r.threads}


# The kernel functions a task frozen by the cgroup freezer sleeps in: v1's refrigerator (the task shows D), v2's
# trap (inlined into signal delivery: asleep in get_signal with state S). They say "frozen" whatever the node's view
# of the cgroup file system shows (a container with its own cgroup namespace does not see the freezer's cgroup).
FREEZER_WCHANS = ("__refrigerator", "do_freezer_trap")


def frozen_by_wchan(r: RankSnapshot) -> bool:
    """The process held by the freezer, by its threads' kernel waits: v1 (and the unified freezer of kernels since
    6.1) marks every task frozen, which /proc shows as D, and parks the running ones in `__refrigerator` (a task
    frozen in its sleep keeps its wait channel, e.g. hrtimer_nanosleep); v2 traps each in signal delivery,
    asleep in get_signal with state S."""
    threads = [t for t in r.threads if t.wchan or t.state]
    if not threads:
        return bool(r.wchan) and r.wchan.startswith(FREEZER_WCHANS)
    parked = any(t.wchan.startswith(FREEZER_WCHANS) for t in threads)
    if parked and all(t.state == "D" or t.wchan.startswith(FREEZER_WCHANS) for t in threads):
        return True
    return all(t.wchan == "get_signal" and t.state == "S" for t in threads)


def _hold_kind(r: RankSnapshot) -> str:
    """frozen, stopped, traced, exited, disk_sleep or "": what the node read before any tool (r.hold), else the
    kernel's freezer wait, else the state letters of the process and its threads (old snapshots, ranks not
    dumped).

    A stop that hangscope's own tool makes is never the job's: a hold whose tracer is the reading worker's own tool
    (it still held the process when the worker stopped waiting for it) holds nothing, and stop letters (T, t) do
    not hold a rank whose hold reading says it was running or asleep. The letters are read around the tools (a
    py-spy attaches and detaches thread by thread, and the kernel shows a tracer the moment it attaches, before the
    stop lands); the hold reading is the one made for this question. Without a hold reading (a rank not dumped, a
    snapshot from before the reading) a signal's stop (T) still holds the rank, but a tracing stop (t) does not:
    every tool of hangscope's makes one while it works, and only the reading names the tracer (a debugger's hold
    is read as "traced" with its pid)."""
    hold = r.hold
    if hold is not None and hold.kind in ("frozen", "stopped", "traced") and not hold.ours:
        return hold.kind
    if frozen_by_wchan(r):
        return "frozen"
    if hold is not None and hold.kind == "disk_sleep":
        return hold.kind
    states = _states(r)
    if "T" in states and hold is None:  # a signal's stop; a tracing stop (t) alone names no tracer (below)
        return "stopped"
    if states & {"Z", "X"} or (hold is not None and hold.kind in ("zombie", "exiting")):
        return "exited"
    if "D" in states:
        return "disk_sleep"
    return ""


StateKind = Literal["frozen", "stopped", "exited", "uninterruptible"]


@dataclass(frozen=True)
class StateEvidence(Evidence):
    """Ranks held by their process state (read on the node before any tool touched them), or gone."""

    kind: StateKind
    ranks: Tuple[RankSnapshot, ...] = ()
    total: int = 0  # ranks of the job
    traced: Tuple[RankSnapshot, ...] = ()  # stopped by a tracer
    gone: bool = False  # exited: seen in an earlier sample, not in this one (no RankSnapshot then)
    few: bool = True  # uninterruptible: a few ranks, not many alike


def process_states(f: Facts) -> List[Fact]:
    """Ranks stopped (SIGSTOP, job control, a tracer), frozen by the cgroup freezer, exited (Z/X) or in
    uninterruptible sleep (D), on any of their threads. A state that holds a rank outranks any stack position."""
    ranks = f.ranks
    # A helper thread in D can hold the main thread up, so every thread's state counts: one C-level sweep.
    seen = set(f.state) | set(map(_state, chain.from_iterable(f.threads)))
    chans = set(f.wchan)  # the processes' own wait channels: a frozen rank's is the freezer's (one column, in C)
    if _ODD_STATES.isdisjoint(seen) and not any(map(_hold, ranks)) and \
            not any(c == "get_signal" or c.startswith(FREEZER_WCHANS) for c in chans):
        return []  # the usual case, checked in C
    by: Dict[str, List[RankSnapshot]] = defaultdict(list)
    for r in ranks:
        kind = _hold_kind(r)
        if kind:
            by[kind].append(r)
    total = len(ranks)
    out = []

    def who(rs: Sequence[RankSnapshot]) -> Who:
        return ranks_who(keys_of(rs), tuple(r.rank for r in rs))

    if by["frozen"]:
        frozen = tuple(by["frozen"])
        out.append(Fact("frozen", who(frozen), "high", StateEvidence("frozen", frozen, total)))
    stopped = tuple(by["stopped"] + by["traced"])
    if stopped:
        out.append(Fact("stopped", who(stopped), "high", StateEvidence("stopped", stopped, total,
                                                                        traced=tuple(by["traced"]))))
    if by["exited"]:
        dead = tuple(by["exited"])
        out.append(Fact("exited", who(dead), "high", StateEvidence("exited", dead, total)))
    if by["disk_sleep"]:
        dstate = tuple(by["disk_sleep"])
        few = len(dstate) * 3 <= total
        out.append(Fact("uninterruptible", who(dstate), "high" if few else "medium",
                        StateEvidence("uninterruptible", dstate, total, few=few)))
    return out


@dataclass(frozen=True)
class ThreadCountEvidence(Evidence):
    count: int  # these ranks' thread count
    usual: int  # most ranks'
    usual_ranks: int  # how many ranks have the usual count


def thread_counts(f: Facts) -> List[Fact]:
    """Ranks with another thread count than most: a helper thread died or is stuck being created."""
    ranks = f.ranks
    counts = f.num_threads if all(f.num_threads) else [n or len(r.threads) for r, n in zip(ranks, f.num_threads)]
    tally = Counter(c for c in counts if c)
    if len(tally) < 2 or len(ranks) < 3:
        return []
    (usual, n_usual), (_, n_next) = tally.most_common(2)
    if n_usual == n_next:
        return []  # no usual count to compare with
    odd: Dict[int, List[RankSnapshot]] = defaultdict(list)
    for r, c in zip(ranks, counts):
        if c and c != usual:
            odd[c].append(r)
    out = []
    for c, rs in sorted(odd.items(), key=lambda kv: len(kv[1])):
        out.append(Fact("thread_count", ranks_who(keys_of(rs), tuple(r.rank for r in rs)), "low",
                        ThreadCountEvidence(c, usual, n_usual)))
    return out
