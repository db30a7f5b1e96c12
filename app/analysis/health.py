"""Findings from per-rank and per-node facts: missing ranks, failed nodes, failed dumps, odd process states,
thread counts, and snapshots that mix several jobs."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import chain
from operator import attrgetter
from typing import Dict, List, Optional, Sequence, Tuple

from app.analysis.columns import Facts, facts
from app.analysis.findings import Confidence, Finding
from app.analysis.fold import count_phrase, describe, fold_ints, fold_nodes, keys_of, short
from app.analysis.frames import clean
from app.model import RankSnapshot, Snapshot

JobId = Tuple[str, Optional[int], Optional[int]]  # (MASTER_ADDR, MASTER_PORT, WORLD_SIZE)


_job = attrgetter("master_addr", "master_port", "world_size")
_state = attrgetter("state")
_ODD_STATES = frozenset("TtZXD")


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
        found = set(ranks.rank)
        missing = sorted(set(range(world)) - found)
        if not missing:
            continue
        label = f"{'rank' if len(missing) == 1 else 'ranks'} {fold_ints(missing)}"
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
            detail = (f"{count_phrase(len(missing))} of the job's {world} did not show up on any inspected node: "
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


def process_states(f: Facts) -> List[Finding]:
    """Ranks stopped (T/t), exited (Z/X) or in uninterruptible sleep (D), on any of their threads."""
    ranks = f.ranks
    stopped, dead, dstate = [], [], []
    # A helper thread in D can hold the main thread up, so every thread's state counts: one C-level sweep.
    seen = set(f.state) | set(map(_state, chain.from_iterable(f.threads)))
    if _ODD_STATES.isdisjoint(seen):
        return []  # the usual case, checked in C
    for r in ranks:
        if r.state not in _ODD_STATES and _ODD_STATES.isdisjoint(map(_state, r.threads)):
            continue  # the usual case, checked in C
        states = {r.state} | {t.state for t in r.threads}
        if states & {"T", "t"}:
            stopped.append(r)
        elif states & {"Z", "X"}:
            dead.append(r)
        elif "D" in states:
            dstate.append(r)
    total = len(ranks)
    out = []
    if stopped:
        label = describe(stopped)
        traced = any("t" in ({r.state} | {t.state for t in r.threads}) for r in stopped)
        resumed = [r for r in stopped if r.resumed]
        detail = ("a stopped rank never reaches the next collective, so every other rank waits for it"
                  + ("; a tracer or debugger holds it (tracing stop)" if traced else "; someone sent it SIGSTOP")
                  + (f"; hangscope found {short(resumed)} stopped after its own tool and resumed it" if resumed else ""))
        out.append(Finding("stopped", f"{short(stopped)} {'is' if len(stopped) == 1 else 'are'} stopped",
                           detail, "high", "the kernel reports the process as stopped", keys_of(stopped),
                           label, fold_nodes(r.node for r in stopped)))
    if dead:
        out.append(Finding("exited", f"{short(dead)} exited (zombie) and {'is' if len(dead) == 1 else 'are'} "
                           "gone from the job", "an exited rank leaves the others waiting for it forever",
                           "high", "the kernel reports the process as a zombie", keys_of(dead), describe(dead),
                           fold_nodes(r.node for r in dead)))
    if dstate:
        waits = []
        for r in dstate[:5]:
            chans = sorted({t.wchan for t in r.threads if t.state == "D" and t.wchan} | ({r.wchan} if r.wchan else set()))
            waits.append(f"{short([r])} on {r.node} in {', '.join(clean(w, 60) for w in chans) or 'an unknown kernel wait'}")
        few = len(dstate) * 3 <= total
        out.append(Finding("uninterruptible", f"{short(dstate)} {'is' if len(dstate) == 1 else 'are'} in "
                           "uninterruptible sleep (D): waiting on I/O or a driver",
                           "; ".join(waits) + ("; ..." if len(dstate) > 5 else "") +
                           ". A process in D state cannot run Python until the kernel call returns (file system, "
                           "GPU driver, network storage).", "high" if few else "medium",
                           "the kernel reports D state" + (" for a few ranks" if few else " for many ranks alike"),
                           keys_of(dstate), describe(dstate), fold_nodes(r.node for r in dstate)))
    return out


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
