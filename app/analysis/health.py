"""Findings from per-rank and per-node facts: missing ranks, failed nodes, failed dumps, odd process states,
thread counts, and snapshots that mix several jobs."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import chain
from operator import attrgetter
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from app.analysis.columns import Facts, facts
from app.analysis.findings import Confidence, Finding
from app.analysis.fold import _span as _fold_span
from app.analysis.fold import count_phrase, describe, fold_nodes, keys_of, short
from app.analysis.frames import clean
from app.model import RankSnapshot, Snapshot

JobId = Tuple[str, Optional[int], Optional[int]]  # (MASTER_ADDR, MASTER_PORT, WORLD_SIZE)


_job = attrgetter("master_addr", "master_port", "world_size")
_state = attrgetter("state")
_hold = attrgetter("hold")  # set by parse only when something holds the rank
_ODD_STATES = frozenset("TtZXD")
# More ranks than any job runs (the largest have ~10^5): a WORLD_SIZE above it comes from a wrong environment,
# and is reported as such instead of being counted out.
MAX_PLAUSIBLE_WORLD = 1 << 22


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


def several_jobs(by_job: Dict[JobId, Facts]) -> List[Finding]:
    named = {j: f.ranks for j, f in by_job.items() if j != ("", None, None)}
    if len(named) < 2:
        return []
    parts = [f"{addr or '?'}:{port if port is not None else '?'} (WORLD_SIZE={ws}): {describe(rs)}"
             for (addr, port, ws), rs in sorted(named.items(), key=lambda kv: -len(kv[1]))]
    all_ranks = [r for rs in named.values() for r in rs]
    return [Finding("several_jobs", f"the snapshot holds {len(named)} jobs", "; ".join(clean(p, 300) for p in parts)
                    + ". Missing ranks are counted per job; classes mix them.", "high",
                    "ranks report different MASTER_ADDR/MASTER_PORT/WORLD_SIZE",
                    keys_of(all_ranks), describe(all_ranks), fold_nodes(r.node for r in all_ranks), culprit=False)]


def failed_nodes(snapshot: Snapshot) -> List[Finding]:
    """Nodes that could not be inspected (or only partly), aggregated by the kind of failure."""
    groups: Dict[Tuple[str, str], List[str]] = defaultdict(list)
    messages: Dict[Tuple[str, str], List[str]] = defaultdict(list)
    for n in snapshot.nodes:
        if n.state not in ("failed", "partial"):
            continue
        code = n.error.code if n.error else "unknown"
        groups[(n.state, code)].append(n.name)
        if n.error and n.error.message:
            messages[(n.state, code)].append(clean(n.error.message, 200))
    out = []
    for (state, code), names in sorted(groups.items()):
        nodes = fold_nodes(names)
        err = next((n.error for n in snapshot.nodes if n.name in names and n.error), None)
        hint = f" What to do: {clean(err.hint, 300)}" if err and err.hint else ""
        said = "; ".join(messages[(state, code)][:3])
        phrase = code.replace("_", " ")
        if state == "failed":
            title = f"ranks on {nodes} unknown: node failed ({phrase})"
            reason = "the node gave no data: a culprit there would be invisible, but nothing says it is there"
        else:
            title = f"ranks on {nodes} partly known: collection was cut short ({phrase})"
            reason = "only part of the node's data arrived"
        # A lead rather than a note: when the ranks that were seen tell nothing, the unseen ones are next.
        out.append(Finding("node_failed", title, (said + "." if said else "") + hint, "low", reason,
                           (), "", nodes, culprit=state == "failed"))
    return out


def missing_ranks(snapshot: Snapshot, by_job: Dict[JobId, Facts]) -> List[Finding]:
    """Rank numbers 0..WORLD_SIZE-1 not found, and nodes with fewer ranks than their slots."""
    out: List[Finding] = []
    failed = [n.name for n in snapshot.nodes if n.state in ("failed", "partial")]
    inspected = {n.name for n in snapshot.nodes}.union(*(f.node for f in by_job.values()))
    for (addr, port, _), ranks in by_job.items():
        sizes: Counter = Counter(ranks.world)
        sizes.pop(None, None)
        sizes.pop(0, None)
        if not sizes:
            continue
        world: int = sizes.most_common(1)[0][0]
        if world > MAX_PLAUSIBLE_WORLD or world < 0:
            shown = [r for r in ranks.ranks if r.world_size == world]
            try:
                digits = str(world)
                number = digits if len(digits) <= 24 else f"{digits[:12]}... ({len(digits)} digits)"
            except ValueError:  # more digits than int->str allows (sys.set_int_max_str_digits)
                number = "(a number of thousands of digits)"
            out.append(Finding(
                "missing_ranks", f"WORLD_SIZE={number} is not a plausible number of ranks",
                f"{describe(shown)} report WORLD_SIZE={number}; no job runs that many ranks (the limit taken is "
                f"{MAX_PLAUSIBLE_WORLD}), so missing ranks are not counted for this job: its environment was "
                "probably set by hand or by something other than the launcher.", "medium",
                "the rank count comes from the ranks' environment, which is not plausible here",
                keys_of(shown), describe(shown), fold_nodes(r.node for r in shown), culprit=False))
            continue
        gaps, count = absent_ranges(ranks.rank, world)
        if not gaps:
            continue
        label = f"{'rank' if count == 1 else 'ranks'} {','.join(_span(a, b) for a, b in gaps)}"
        title = f"{label} not found (WORLD_SIZE={world})"
        local: Counter = Counter(ranks.local_world)
        local.pop(None, None)
        per_node = local.most_common(1)[0][0] if local else None
        conf: Confidence
        if failed:
            detail = f"{fold_nodes(failed)} could not be inspected; the missing ranks are probably there"
            conf, reason, culprit = "low", "ranks on failed nodes are unknown, not necessarily gone", False
        elif per_node and world > per_node * len(inspected):
            were = "was" if len(inspected) == 1 else "were"
            detail = (f"{count_phrase(len(inspected), 'node')} {were} inspected with {per_node} ranks each "
                      "(LOCAL_WORLD_SIZE), "
                      f"fewer than WORLD_SIZE={world}: the missing ranks are probably on nodes not in the hosts list")
            conf, reason, culprit = "low", "the hosts list may not cover the whole job", False
        else:
            short_of = _short_nodes(snapshot, ranks.node, per_node, typical=True)
            detail = (f"{count_phrase(count)} of the job's {world} did not show up on any inspected node: "
                      "a rank that exited (crashed, killed, OOM) leaves the others waiting for it forever")
            if short_of:
                detail += f"; nodes with fewer ranks than the others: {short_of}"
            conf, reason, culprit = "high", "every node answered and the rank is not among the processes", True
        if addr:
            detail += f" (job {clean(addr, 80)}:{port})"
        out.append(Finding("missing_ranks", title, detail + ".", conf, reason, (), label,
                           fold_nodes(s.split(":", 1)[0] for s in short_of.split(", ") if s) if culprit else "",
                           culprit=culprit))
    if not out and any(n.slots for n in snapshot.nodes):
        short_of = _short_nodes(snapshot, [r.node for r in snapshot.ranks], None)
        if short_of:
            out.append(Finding("missing_ranks", f"fewer ranks than expected: {short_of}",
                               "nodes hold fewer rank processes than the slots given for them in the hosts input.",
                               "medium", "the expected count comes from the hosts input, not from the job",
                               (), "", short_of.split(":", 1)[0]))
    return out


def _short_nodes(snapshot: Snapshot, rank_nodes: Sequence[str], per_node: Optional[int],
                 typical: bool = False) -> str:
    """`node02: 3 of 4` for nodes with fewer ranks than their slots, LOCAL_WORLD_SIZE, or (`typical`, when a
    rank is known to be missing) the most any node has: jobs place the same number of ranks on each node."""
    found = Counter(rank_nodes)
    if per_node is None and typical and len(found) >= 2:
        per_node = max(found.values())
    short_list = []
    for n in snapshot.nodes:
        if n.state in ("failed", "partial"):
            continue
        expected = n.slots if n.slots is not None else per_node
        if expected and found.get(n.name, 0) < expected:
            short_list.append(f"{n.name}: {found.get(n.name, 0)} of {expected}")
    return ", ".join(clean(s, 100) for s in short_list)


def dump_failures(no_stack: Sequence[RankSnapshot], thread: object) -> List[Finding]:
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
        label = describe(ranks)
        phrase = {"not_collected": "stacks were not collected", "partial": "the connection was cut short",
                  "no_thread": f"no thread named {clean(str(thread), 60)!s}",
                  "empty_stack": "the dump returned no frames"}.get(cause, cause.replace("_", " "))
        msg = next((clean(r.error.message, 200) for r in ranks if r.error and r.error.message), "")
        detail = "; ".join(p for p in (msg, clean(hints.get(cause, ""), 300)) if p)
        out.append(Finding("dump_failed", f"no stack for {label}: {phrase}",
                           detail or "these ranks are left out of the classes and the tree",
                           "high", "the picture is incomplete: a culprit could hide among these ranks",
                           keys_of(ranks), label, fold_nodes(r.node for r in ranks), culprit=False))
    return out


def _states(r: RankSnapshot) -> set:
    return {r.state} | {t.state for t in r.threads}


def _hold_kind(r: RankSnapshot) -> str:
    """frozen, stopped, traced, exited, disk_sleep or "": what the node read before any tool (r.hold), else the
    state letters of the process and its threads (old snapshots, ranks not dumped)."""
    hold = r.hold
    if hold is not None and hold.kind in ("frozen", "stopped", "traced", "disk_sleep"):
        return hold.kind
    states = _states(r)
    if states & {"T", "t"}:
        return "traced" if "t" in states or (hold is not None and hold.tracer_pid) else "stopped"
    if states & {"Z", "X"} or (hold is not None and hold.kind in ("zombie", "exiting")):
        return "exited"
    if "D" in states:
        return "disk_sleep"
    return ""


def _others(held: Sequence[RankSnapshot], total: int) -> str:
    others = total - len(held)
    if others <= 0:
        return ""
    them = "it" if len(held) == 1 else "them"
    return f"; the other {count_phrase(others)} wait for {them}" if others > 1 else f"; the other rank waits for {them}"


def _on_each(held: Sequence[RankSnapshot], what: "Callable[[RankSnapshot], str]") -> str:
    """`kill -CONT 4242` on node03, or for several ranks the command per rank, the first few."""
    parts = []
    for r in held[:4]:
        parts.append(f"`{clean(what(r), 300)}` on {clean(r.node, 80)}" if len(held) == 1 else
                     f"{short([r])}: `{clean(what(r), 300)}` on {clean(r.node, 80)}")
    return ", ".join(parts) + (", ..." if len(held) > 4 else "")


def process_states(f: Facts) -> List[Finding]:
    """Ranks stopped (SIGSTOP, job control, a tracer), frozen by the cgroup freezer, exited (Z/X) or in
    uninterruptible sleep (D), on any of their threads. A state that holds a rank outranks any stack position:
    the title says what holds it, that the others wait for it, and what resumes it."""
    ranks = f.ranks
    # A helper thread in D can hold the main thread up, so every thread's state counts: one C-level sweep.
    seen = set(f.state) | set(map(_state, chain.from_iterable(f.threads)))
    if _ODD_STATES.isdisjoint(seen) and not any(map(_hold, ranks)):
        return []  # the usual case, checked in C
    by: Dict[str, List[RankSnapshot]] = defaultdict(list)
    for r in ranks:
        kind = _hold_kind(r)
        if kind:
            by[kind].append(r)
    total = len(ranks)
    out = []
    frozen = by["frozen"]
    if frozen:
        first = frozen[0].hold
        assert first is not None
        where = (f"{first.freezer} cgroup {clean(first.cgroup, 200)}" if len(frozen) == 1 or
                 len({(r.node, r.hold.cgroup) for r in frozen if r.hold}) == 1 else "their cgroups")
        thaw = _on_each(frozen, lambda r: r.hold.thaw if r.hold and r.hold.thaw else "thaw its cgroup")
        container = first.container if len(frozen) == 1 and first.container else ""
        out.append(Finding(
            "frozen", f"{short(frozen)} {'is' if len(frozen) == 1 else 'are'} frozen by the cgroup freezer ({where})"
            f"{_others(frozen, total)}; thaw with {thaw}" + (f" (or `{clean(container, 100)}`)" if container else ""),
            "a frozen process does not run at all until its cgroup is thawed (a scheduler's suspend, `docker "
            "pause`, or someone writing the freezer); SIGCONT does not thaw it. hangscope dumped it without ptrace "
            "and left it frozen", "high", f"the node's {first.freezer} freezer reports the cgroup {first.freezer_state or 'FROZEN'}",
            keys_of(frozen), describe(frozen), fold_nodes(r.node for r in frozen)))
    stopped = by["stopped"] + by["traced"]
    if stopped:
        traced = by["traced"]
        resumed = [r for r in stopped if r.resumed]
        tracers = sorted({f"PID {r.hold.tracer_pid} ({clean(r.hold.tracer, 40)})" for r in traced
                          if r.hold is not None and r.hold.tracer_pid})
        if traced and not by["stopped"]:
            why = f"by its tracer, {', '.join(tracers)}" if tracers else "in a tracing stop (a debugger holds it)"
            todo = "detach the tracer (quit the debugger) to resume it"
        else:
            tty = any(r.hold is not None and r.hold.tty for r in by["stopped"])
            why = "SIGSTOP" + (" or Ctrl-Z in its terminal" if tty else " or job control")
            todo = _on_each(stopped, lambda r: f"kill -CONT {r.pid}") + (" resumes it" if len(stopped) == 1
                                                                          else " resume them")
        detail = ("a stopped rank never reaches the next collective, so every other rank waits for it; "
                  "hangscope dumped it without ptrace and left it stopped"
                  + ("; a tracer or debugger holds it (tracing stop)" if traced else "; someone sent it SIGSTOP")
                  + (f"; hangscope found {short(resumed)} stopped after its own tool and resumed it" if resumed else ""))
        out.append(Finding("stopped", f"{short(stopped)} {'is' if len(stopped) == 1 else 'are'} stopped ({why})"
                           f"{_others(stopped, total)}; {todo}",
                           detail, "high", "the kernel reports the process as stopped", keys_of(stopped),
                           describe(stopped), fold_nodes(r.node for r in stopped)))
    dead = by["exited"]
    if dead:
        out.append(Finding("exited", f"{short(dead)} exited (zombie) and {'is' if len(dead) == 1 else 'are'} "
                           "gone from the job", "an exited rank leaves the others waiting for it forever",
                           "high", "the kernel reports the process as a zombie", keys_of(dead), describe(dead),
                           fold_nodes(r.node for r in dead)))
    dstate = by["disk_sleep"]
    if dstate:
        waits = []
        for r in dstate[:5]:
            chans = sorted({t.wchan for t in r.threads if t.state == "D" and t.wchan} | ({r.wchan} if r.wchan else set())
                           | ({r.hold.wchan} if r.hold is not None and r.hold.wchan else set()))
            call = ""
            if r.hold is not None and r.hold.syscall:
                call = f" ({clean(r.hold.syscall, 40)}" + (f" on {clean(r.hold.waits_on, 200)}" if r.hold.waits_on else "") + ")"
            waits.append(f"{short([r])} on {r.node} in {', '.join(clean(w, 60) for w in chans) or 'an unknown kernel wait'}{call}")
        few = len(dstate) * 3 <= total
        on = next((r.hold.waits_on for r in dstate if r.hold is not None and r.hold.waits_on), "")
        out.append(Finding("uninterruptible", f"{short(dstate)} {'is' if len(dstate) == 1 else 'are'} in "
                           "uninterruptible sleep (D): waiting on I/O or a driver"
                           + (f" ({clean(on, 120)})" if on and len(dstate) == 1 else ""),
                           "; ".join(waits) + ("; ..." if len(dstate) > 5 else "") +
                           ". A process in D state cannot run Python until the kernel call returns (file system, "
                           "GPU driver, network storage).", "high" if few else "medium",
                           "the kernel reports D state" + (" for a few ranks" if few else " for many ranks alike"),
                           keys_of(dstate), describe(dstate), fold_nodes(r.node for r in dstate)))
    return out


def held_ranks(findings: Sequence[Finding]) -> List[Finding]:
    """The findings that say a rank is stopped or frozen: the state explains the hang by itself."""
    return [f for f in findings if f.kind in ("stopped", "frozen") and f.culprit]


def thread_counts(f: Facts) -> List[Finding]:
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
        out.append(Finding("thread_count", f"{short(rs)} {'has' if len(rs) == 1 else 'have'} {c} threads while "
                           f"{n_usual} others have {usual}",
                           "a thread that died (data loader, pin memory, a communication thread) or was never "
                           "started can leave a rank waiting", "low",
                           "thread counts also differ for harmless reasons (rank 0 hosts the store)",
                           keys_of(rs), describe(rs), fold_nodes(r.node for r in rs)))
    return out
