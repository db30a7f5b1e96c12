"""The headline: who, in what state, in which blocking operation (and where in the job's code), waiting for
what, released by whom, why the others wait, and what to run or change next.

Written from the culprit (app/analysis/culprit.py) and the fact at the wait graph's root. Where the culprit's
own thread names a wait (a future, a socket, a child, a lock...), the sentence is that chain of waits; where the
evidence is a position or a state (an iteration ahead, another collective, stopped), the fact's own sentence
says it, with the thread's wait added when it names one. A culprit whose mechanism no wait site knows is said
with the facts in hand (its system call and kernel wait) and what to check. Never a bare location.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, List, Optional, Sequence, Tuple

from app.analysis.blocking import ThreadWait
from app.analysis.culprit import Culprit
from app.analysis.divergence import StackEvidence
from app.analysis.flight import FlightEvidence
from app.analysis.facts import Fact, ranks_who
from app.analysis.findings import Finding
from app.analysis.gpu_evidence import RasEvidence
from app.analysis.fold import count_phrase, fold_ints, fold_nodes
from app.analysis.frames import clean, ddp_forward, group_arg, handle_wait, named
from app.analysis.p2p import P2P, P2PEvidence, class_call, rank_call
from app.analysis.graph import WaitGraph
from app.analysis.health import MissingEvidence, StateEvidence
from app.analysis.locks import LockEvidence
from app.analysis.prose.graph import display_names, short
from app.analysis.prose.graph import evidence as edge_evidence
from app.analysis.prose.stacks import (call_site, caller, callers, ddp_next, exiting, location, rank_branch,
                                      under_if)
from app.analysis.prose.state import resume_command, thaw_command
from app.analysis.prose.threads import (p2p_clause, readers_stopped, readers_writing, ring_order, thread_label,
                                       thread_where, waits_back_for)
from app.analysis.prose.waits import chain_text, duration, long_sleep, signals, thread_died, where
from app.analysis.prose.words import where as class_where
from app.analysis.prose.words import who_short
from app.analysis.release import Link, shared_futex
from app.analysis.sites import frame_site, native_site
from app.analysis.suspects import WaitEvidence, informative
from app.analysis.tree import StackClass
from app.model import Frame, RankSnapshot


def _others(c: Culprit, total: int) -> str:
    """`the other 7 ranks wait for it in `all_reduce``."""
    return others_wait(c.others, total - len(c.who.keys), "it" if len(c.who.keys) <= 1 else "them")


def others_wait(d: Optional[StackClass], n: int, them: str) -> str:
    """Where the rest of the job (`n` ranks, class `d`) waits for the culprit (`them`): `the other 7 ranks wait for
    them in `all_reduce``; "" when that is not known."""
    if d is None or n <= 0:
        return ""
    rest = "the other rank waits" if n == 1 else f"the other {count_phrase(n)} wait"
    device = None if d.collective else device_wait(d.frames)
    if device is not None:
        at = class_where(d).replace("in ", "at ", 1)
        return (f"{rest} for {them} in `{device}` {at}: the host waits for its GPU, where the collective it queued "
                f"waits for {them}")
    at = f"in `{d.collective}`" if d.collective else class_where(d)
    return f"{rest} for {them} {at}"


def _resume(pids: str, node: str, what: str = "it") -> str:
    """The next step for a process stopped by a signal: the command that resumes it, where."""
    return f"`kill -CONT {pids}` on {node} resumes {what}; hangscope left it as it was"


def device_wait(frames: Sequence[Frame]) -> Optional[str]:
    """The GPU synchronisation a path (outermost first) waits in, by the wait tables: the call the job made
    (`torch.cuda.synchronize`), else the runtime's (`cudaDeviceSynchronize`); None when it waits in none."""
    native = None
    for f in frames:
        if f.native:
            hit = native_site(f.function)
            if hit is not None and hit[1] == "device" and native is None:
                native = hit[3]
            continue
        site = frame_site(f.function, f.filename)
        if site is not None and site.resource == "device":
            return site.operation
    return native


def _wait_sentence(c: Culprit, total: int, alike: Sequence[RankSnapshot] = ()) -> str:
    r = c.rank
    assert r is not None
    if alike and r.rank is not None and all(a.rank is not None for a in alike):
        # ranks blocked the same way on the same party: one sentence for them all
        held = sorted([r, *alike], key=lambda x: x.rank or 0)
        nodes = fold_nodes(sorted({x.node for x in held}))
        head = (f"ranks {fold_ints([x.rank for x in held if x.rank is not None])} (pids "
                f"{', '.join(str(x.pid) for x in held[:4])}{', ...' if len(held) > 4 else ''} on {clean(nodes, 60)}) "
                f"are each {chain_text(c.links, r)}")
        others = others_wait(c.others, total - len(held), "them")
        return f"{head}; {others}" if others else head
    who = f"rank {r.rank}" if r.rank is not None else f"pid {r.pid}"
    head = f"{who} (pid {r.pid} on {clean(r.node, 60)}) is {chain_text(c.links, r)}"
    others = _others(c, total)
    return f"{head}; {others}" if others else head


def alike_blocked(c: Culprit, facts: Sequence[Fact]) -> List[RankSnapshot]:
    """The other ranks a blocked culprit's sentence stands for: blocked as surely, in the same operation at the same
    line, on the same party at the end of their chain (two ranks of a node waiting on one stopped process)."""
    if c.fact.kind != "blocked" or not c.links or c.rank is None:
        return []

    def key(links: Sequence[Link]) -> Tuple[Any, ...]:
        w = links[0].wait
        end = links[-1].release.parties[0] if links[-1].release.parties else None
        return (w.operation, w.frame.filename if w.frame else "", w.frame.line if w.frame else 0,
                (end.kind, end.node, end.pid, end.state) if end is not None else None)

    mine = key(c.links)
    if mine[3] is None:
        return []
    out = []
    for f in facts[:4096]:
        e = f.data
        if f.kind == "blocked" and f.strength == c.fact.strength and isinstance(e, WaitEvidence) and e.links \
                and e.rank is not c.rank and (e.rank.node, e.rank.pid) != (c.rank.node, c.rank.pid) \
                and key(e.links) == mine:
            out.append(e.rank)
    return out


# Facts that say where a rank is (its stack, its iteration, its sequence numbers), not what it waits for: the
# culprit's own wait adds that
_POSITIONAL = ("minority_stack", "different_collective", "iteration_split", "collective_lag", "still_running",
               "unfinished")


def _positional(f: Fact) -> bool:
    """A fact that says where a rank is (its stack, its iteration, how many collectives it issued), not what it
    waits for: NCCL RAS's counts of launched operations are one (the rank behind has not issued the collective)."""
    return f.kind in _POSITIONAL or (f.kind == "nccl_ras" and isinstance(f.data, RasEvidence) and
                                     f.data.what == "counts")


def culprit_sentence(c: Culprit, title: str, total: int, p2p: str = "", alike: Sequence[RankSnapshot] = ()) -> str:
    """The verdict's sentence for a culprit: its chain of waits, or the root fact's sentence (`title`) with the
    thread's wait added when it names one the sentence does not (`p2p`: what its unmatched send or recv waits
    for, prose.threads.p2p_clause)."""
    if c.fact.kind == "blocked" and c.rank is not None and c.links:
        return _wait_sentence(c, total, alike)
    if c.fact.kind == "missing_ranks" and c.fact.who.missing and c.others is not None and total:
        # where the ranks that are here wait for the missing ones (their one class: the place they stopped at)
        if c.others.size == total:
            them = "it" if c.fact.who.numbers and len(c.fact.who.numbers) == 1 else "them"
            return f"{title}; {others_wait(c.others, total, them)}"
    if p2p and c.fact.kind in ("minority_stack", "different_collective"):
        return f"{title}; {p2p}"
    e = c.fact.data
    if isinstance(e, FlightEvidence) and e.stage == "issued" and e.elsewhere and c.links and where(c.links[0].wait):
        return f"{title}; it called that collective{where(c.links[0].wait)}"  # the line names its group
    if c.links and c.rank is not None and informative(c.links[0].wait) and _positional(c.fact):
        # RAS's counts say nothing of where the others are (a stack fact's title does): say where they wait
        others = _others(c, total) if c.fact.kind == "nccl_ras" else ""
        return f"{title}; its main thread is {chain_text(c.links, c.rank)}" + (f"; {others}" if others else "")
    if c.links and c.rank is not None and c.fact.kind in ("minority_stack", "different_collective"):
        w = c.links[0].wait
        if w.state in ("running", "spinning"):
            return f"{title}; {running_text(w)}"
        if not w.known:
            return f"{title}; {unknown_wait(w)}"
    return title


def running_text(w: ThreadWait) -> str:
    """A thread on a CPU: where, how much CPU, and the loop it is in (what it would wait for is its condition)."""
    cpu = f", {w.cpu:.0%} of a CPU between samples" if w.cpu is not None else ""
    loop = (f", in the loop `{clean(w.poll.header.strip().rstrip(':'), 80)}`" if w.poll is not None else "")
    spin = " and does not wait: it spins" if w.state == "spinning" else ""
    return f"its main thread is running (state R){cpu}{where(w)}{loop}{spin}"


def unknown_wait(w: ThreadWait) -> str:
    """The facts in hand about a wait no site names, and that the mechanism is not known."""
    inner = w.frame
    at = f" in {named(inner)}" if inner is not None and inner is not w.caller else ""
    if not w.syscall and not w.wchan:
        return (f"what its main thread waits in{at} is not known: no wait site names the call and the kernel's "
                "state of the thread was not read")
    kernel = f"`{clean(w.syscall, 30)}`" if w.syscall else "a kernel wait"
    chan = f" (kernel wait `{clean(w.wchan, 40)}`)" if w.wchan else ""
    cpu = f", using {w.cpu:.0%} of a CPU" if w.cpu is not None else ""
    return (f"its main thread sleeps{at} in {kernel}{chan}{cpu}; no wait site names that call, so the mechanism "
            "is not known")


_COUNTED = re.compile(r"^\s*(?:for\s+[\w, ()]+\s+in\s+(?:range|itertools\.count|count)\s*\(|while\b)")


def counted_loop(header: str) -> bool:
    """A loop over a count or a condition (`for epoch in range(n)`, `while step < total`), not over data (a loader,
    a list of batches): a rank leaves it only by a decision of its own, never because its data ran out."""
    return bool(_COUNTED.match(header or ""))


def _p2p_next(e: StackEvidence, who: str, pid: str, at: str, classes: Sequence[StackClass],
              rank: Optional[RankSnapshot]) -> str:
    """A minority in a send or receive against the others' collective: it waits for its one peer, not for them.
    Which rank that is (when its arguments say: read as the culprit's own, `rank`, so that a peer written over its
    number is known here as in the wait graph), what completes it, and the ranks outside the others' collective
    that could be that peer (one that skipped its side of the exchange went on to another call)."""
    call = rank_call(rank) if rank is not None else class_call(e.mine)
    if call is None:
        return ""
    op, peer, argument, frame = call.op, call.peer, call.argument, call.frame
    found = handle_wait(frame)
    made = (f", made by `{clean(found.maker, 80)}` ({location(replace(frame, line=found.maker_line))})"
            if found is not None and found.maker else "")
    other = "send" if op == "recv" else "recv"
    step = f"{who} waits in a {op} for one peer" + (f" ({clean(argument, 60)})" if argument else "")
    step += f"{made}, not for the others: it completes when that rank posts the matching {other}. "
    if peer is None:
        step += (f"The peer's number is not in the stack: read it (a local: `py-spy dump --locals --pid {pid}`{at}; "
                 "a global or an attribute: log it). ")
    outside = [x for x in classes if x is not e.mine and x is not e.theirs][:3]
    if outside:
        listed = "; ".join(f"{who_short(ranks_who(x.ranks, x.numbers))} {_in_call(x)}" for x in outside)
        step += (f"Outside the others' `{clean(e.theirs.collective or '', 40)}`: {listed}. If the peer is there, it "
                 f"skipped its side of the exchange (a branch that returned before it) and went on; ")
    else:
        step += "If the peer is among the others, it skipped its side of the exchange and went on; "
    return clean(step + "run both sides of each send/recv under the same condition", 600)


def _ahead_next(e: StackEvidence, who: str, name: str, mine: str, theirs: str, delta: int) -> str:
    """A minority in a collective of a later iteration of the loop the others are in, they in one of theirs: it
    left their iteration without the collective they wait in (one iteration), or its count went apart (more)."""
    var = f"`{clean(name, 40)}`"
    if delta > 1:
        return (f"{delta} iterations ahead is more than one step skipped once: find where the {var} of {who} went "
                f"apart from the others': a start of its own (a resume that loaded a newer checkpoint or step on {who}: "
                "compare the step each rank resumed from, in its log or its checkpoint files), or a condition under "
                f"which {who} skips {call_site(e.theirs)} in every iteration; make every rank resume from the same "
                "step (agree on it before the loop: the minimum over the ranks, or rank 0's, broadcast)")
    return (f"{who} went on to {clean(name, 40)}={clean(mine, 40)} without {call_site(e.theirs)}{under_if(e.theirs)}, "
            f"which the others wait in at {clean(name, 40)}={clean(theirs, 40)}: {who} left that iteration early, by a "
            "`continue` or a condition that skipped the rest of the step on its own values (a loss spike, a NaN or "
            "inf check, an overflow, an empty batch); decide it on every rank together (all_reduce the flag first), "
            "or run the same collectives on the path that skips")


def _in_call(x: StackClass) -> str:
    """`in `all_to_all` from `MoE.forward` (train.py:149)`, else where the class is."""
    site = caller(x) if x.collective else None
    if x.collective and site is not None:
        return f"in `{clean(x.collective, 40)}` from {named(site)}"
    return class_where(x)


# Lead facts whose own next step says more than a deadlock's ordering advice when the graph also holds a cycle (a
# rank that left the loop waits in a barrier its pipeline peer's recv will never join: the loop's exit is the cause)
_OWN_NEXT = ("minority_stack", "different_collective", "iteration_split")


def next_step(c: Optional[Culprit], best: Fact, graph: WaitGraph, classes: Sequence[StackClass] = ()) -> str:
    """What to run or change next, for the root's kind of evidence (and, for a wait, for what it waits on);
    `classes`: the stack classes, for the ranks a minority's own wait may be waiting for."""
    # the recorder's own "why" (a collective of another group, a GPU that has not started it) says more than the
    # host thread's wait, which is the same on every rank there
    says_why = isinstance(best.data, FlightEvidence) and (best.data.stage != "issued" or bool(best.data.elsewhere))
    if c is not None and c.links and c.rank is not None and not says_why and (
            c.fact.kind == "blocked" or (_positional(c.fact) and informative(c.links[0].wait))):
        step = _wait_next(c.links, c)
        if step:
            return step
    if c is not None and not c.links and c.rank is not None and isinstance(best.data, WaitEvidence) \
            and len(best.data.links) > 1 and best.data.links[-1].who.kind == "rank" \
            and (best.data.links[-1].who.node, best.data.links[-1].who.pid) == (c.rank.node, c.rank.pid):
        # the root is the rank another one's chain of waits ends at (it holds what that one waits for)
        step = _wait_next(best.data.links, c)
        if step:
            return step
    root = graph.vertex(graph.root[0]) if graph.root and not graph.deadlock else None
    if root is not None and root.kind == "process" and root.pid is not None and best.kind != "rendezvous_differs":
        # a child the culprit waits on, a launcher that cannot run (one started with other flags runs well)
        node = clean(root.nodes[0], 60) if root.nodes else "its node"
        if root.state == "stopped":
            return _resume(str(root.pid), node)
        return f"see what it does: `py-spy dump --pid {root.pid}` on {node}"
    k = best.kind
    e = best.data
    who = who_short(c.who) if c is not None else who_short(best.who)
    calls = "calls" if len(best.who.keys) == 1 else "call"  # the verb after `who`
    key = c.who.keys[0] if c is not None and len(c.who.keys) == 1 else None
    at = f" on {clean(key[0], 60)}" if key else ""
    pid = str(key[1]) if key else "PID"
    if graph.deadlock and k == "lock_wait":
        return "take the locks in one order on every thread (or never wait while holding one)"
    crossed = next((e for e in graph.edges if e.kind == "collective" and e.p2p is not None), None)
    if crossed is not None and crossed.p2p is not None and not any(e.kind == "p2p" and e.strength == "high"
                                                                     for e in graph.edges):
        # a send or recv whose peer waits in a collective: not two calls in the wrong order, one rank took
        # another path (a branch that skipped its part)
        p = crossed.p2p
        mine = f"rank {p.rank}" if p.rank is not None else "the rank"
        return (f"{mine}'s {p.op} and rank {p.peer}'s `{clean(crossed.collective, 40)}` are not the same step of "
                "the program: find the branch one of them took that the other did not (a condition that differs "
                "between ranks: a NaN or overflow check, uneven data, an early `continue`), and make every rank run "
                "the same sequence of sends, recvs and collectives")
    if k == "p2p_wait" and isinstance(e, P2PEvidence) and e.tags:
        odd = [x for x in e.tags if x.key in best.who.keys] or list(e.tags)
        x = odd[0]
        written = f"`{clean(x.tag_text, 40)}`" if x.tag_text and x.tag_text != x.tag else "its tag"
        return clean(f"compute each pair's tag the same way on both sides: {who}'s {written} is {x.tag}"
                     + (f" where the others' is {e.usual}" if e.usual and e.usual != x.tag else "")
                     + " (a count kept per rank that went apart: a resume from another step, a step skipped on some "
                     "ranks); derive it from what every rank agrees on, or leave the tag out", 400)
    ring = e.ring if k == "p2p_wait" and isinstance(e, P2PEvidence) else ()
    if ring and all(x.op == "recv" for x in ring):
        order = ring_order(ring)
        skipped = ""
        if order is not None:
            name, ranked = order
            (first, _), rest = ranked[0], ranked[1:]
            skipped = (f"rank {first.rank} left {clean(name, 30)}={clean(rest[-1][1], 20)} without sending "
                     f"{', '.join(f'rank {c.rank}' for c, _ in rest)} all {'it expects' if len(rest) == 1 else 'they expect'}"
                     " there (one message skipped), or the others expect one more; ")
        return (skipped +
                "make both sides derive the messages between them from the same values: the number of microbatches "
                "(from one source, not each rank's own batch), one schedule on every stage, a send for every message "
                "the peer expects (an empty or masked microbatch still sends its zeros); compare what each of "
                f"{who_short(best.who)} counts with `py-spy dump --locals`")
    if k == "p2p_wait" or (graph.deadlock and k not in _OWN_NEXT):
        return ("make each send meet its recv: order the pairs by rank (the lower rank sends first) or post them "
                "together with batch_isend_irecv")
    if k == "stopped" and isinstance(e, StateEvidence) and e.traced and len(e.traced) == len(e.ranks):
        return "detach the tracer (quit the debugger) to resume it; hangscope left it as it was"
    if k in ("stopped", "frozen") and isinstance(e, StateEvidence):
        todo = resume_command(e)
        if k == "frozen" and not any(thaw_command(r.hold) for r in e.ranks):
            todo = (f"thaw its cgroup from the host (`cat /proc/{pid}/cgroup` there names it; the node's own view "
                    "does not show the freezer's cgroup)")
        return clean((todo + (" resumes it" if k == "stopped" and todo else "")) if todo else
                     "resume it (SIGCONT, or thaw its cgroup)", 300) + "; hangscope left it as it was"
    if k == "missing_ranks" and best.culprit and isinstance(e, MissingEvidence) and e.no_launcher:
        gone = fold_nodes(e.no_launcher)
        return (f"find why the launcher on {gone} exited: its output or log (a worker that fails at every start uses "
                "up --max-restarts), and `dmesg` there for the OOM killer; then restart the job")
    if k == "exited" or (k == "missing_ranks" and best.culprit):
        return f"find why {who} exited: its log, and `dmesg` on its node for the OOM killer; then restart the job"
    if k == "uninterruptible":
        return (f"look at what it waits on: `cat /proc/{pid}/stack`{at}; the file system or driver named there "
                "is what to fix")
    if k == "lock_wait" and isinstance(e, LockEvidence) and e.edge is not None:
        holder = (f"its {thread_label(e.edge.holder)} ({thread_where(e.edge.holder)})" if e.edge.holder is not None
                  else "the thread that took it")
        if e.edge.holder is not None and waits_back_for(e.rank, e.edge.holder, e.edge.waiter.thread):
            return clean(f"each waits for the other: release `{e.edge.waiter.key[1]}` before waiting in "
                         f"{thread_where(e.edge.holder)}, or give what it waits for before taking the lock", 300)
        return clean(f"see why {holder} does not finish; do not hold `{e.edge.waiter.key[1]}` while waiting", 300)
    if k == "lock_wait":
        return "see why the thread holding the lock does not finish; do not hold a lock while waiting"
    if k == "collective_lag" and isinstance(e, FlightEvidence) and e.stage == "started":
        return clean(f"find what {who}'s GPU runs before that collective: `nvidia-smi`{at} (a GPU busy with nothing "
                     "moving runs a kernel that does not end), and the kernels, stream or event waits its code "
                     "queues before the collective; a reproduction under `compute-sanitizer` or `cuda-gdb` shows "
                     "the kernel", 400)
    if k == "collective_lag" and isinstance(e, FlightEvidence) and e.stage == "crossed":
        ga, gb = clean(e.devs[0][0], 60), clean(e.devs[1][0], 60)
        return clean(f"call the collectives of process groups {ga} and {gb} in one order on every rank: the ranks in "
                     "both call them in opposite orders (see where each side calls them: `py-spy dump`)", 400)
    if k == "collective_lag" and isinstance(e, FlightEvidence) and e.stage == "ahead":
        return clean(f"find the collective only {who} issues: a branch that depends on the rank (`if rank == 0:` "
                     "around a collective), its data or the clock; every member of a group issues each of its "
                     "collectives. If there is none, see what holds the others before it (their stacks)", 400)
    if k == "collective_lag" and isinstance(e, FlightEvidence) and e.stage == "op":
        theirs = dict(e.names).get(e.pg, "")
        return clean(f"make every rank issue the same collectives in one order: find where {who} calls "
                     f"{e.op or 'another collective'} where the others call {theirs or 'theirs'}", 400)
    if k == "collective_lag" and isinstance(e, FlightEvidence) and e.elsewhere:
        there = clean(e.elsewhere[0][0], 40)
        return clean(f"make every rank call each group's collectives in one order: {who} calls process group "
                     f"{there}'s where the others call group {clean(e.pg, 40)}'s; a group's collective must be "
                     "called by every member of it, and by its members only", 400)
    if k == "collective_lag":
        return f"see what {who} does instead of that collective: `py-spy dump --locals --pid {pid}`{at}"
    if k == "iteration_split":
        if getattr(e, "order", None) is not None:
            return "iterate in one order on every rank (sorted(), not a set's or a dict's order)"
        return (f"find the branch under which {who} skipped or repeated a collective (one that depends on the "
                "rank, its data or the clock)")
    if k in ("minority_stack", "different_collective"):
        if getattr(e, "case", "") == "left_loop":
            loop = getattr(e, "loop", None)
            if loop is not None and counted_loop(loop.header):
                # a loop over a count (epochs, steps), not over data: the rank left it by a decision of its own
                return (f"find the `break` or `return` by which {who_short(best.who)} left that loop early (an early stop on its "
                        "own loss, a step or time budget, an error handled): decide it on every rank together "
                        "(all_reduce the flag or the metric it rests on) so that all leave at once")
            return ("give every rank the same number of batches (DistributedSampler(drop_last=True), equal "
                    "shards) or let DDP's join() cover the ranks that finish first")
        past = getattr(e, "past", None)
        if getattr(e, "case", "") == "left_or_behind" and past is not None and past.around is not None:
            names = past.around.variables + past.around.counters
            var = f"`{clean(names[0], 40)}`" if names else "the loop's iteration"
            return (f"tell the two readings apart: read {var} on both sides (hangscope --locals, or `py-spy dump "
                    f"--locals --pid {pid}`{at}) and take samples (`--samples 3 --interval 5`): the same value means "
                    f"{who} left the loop (give every rank the same number of batches, or DDP's join()); an earlier "
                    "one, or ranks that move between samples, mean a straggler behind the others")
        if isinstance(e, StackEvidence) and e.case == "other_iteration" and past is not None and past.within \
                and e.mine.collective and past.delta is not None and past.delta < -1:
            # more than one iteration apart at a collective: one call skipped in one iteration would leave one; the
            # counters went apart over many (a resume from another step on these ranks), or it is skipped every time
            return (f"{-past.delta} iterations apart is more than one call skipped once: find where the "
                    f"`{clean(past.name, 40)}` of {who} went apart from the others': a start of its own (a resume "
                    f"that loaded an older checkpoint or step on {who}: compare the step each rank resumed from, in its log or "
                    f"its checkpoint files), or a condition under which the others skip {call_site(e.mine)} in "
                    "every iteration; make every rank resume from the same step (agree on it before the loop: the "
                    "minimum over the ranks, or rank 0's, broadcast)")
        branch = rank_branch(e.mine) if isinstance(e, StackEvidence) and e.mine.collective else None
        if branch is not None and isinstance(e, StackEvidence) and e.case in ("other_iteration", "other_collective"):
            f, n, test = branch
            only = "it alone needs" if len(best.who.keys) == 1 else "they alone need"
            return (f"{who} {calls} {call_site(e.mine)} inside "
                    f"`if {clean(test, 80)}:` ({location(replace(f, line=n))}), a block run only by the ranks that "
                    f"condition selects: the others never call it. Call the collective on every rank of its group (and use "
                    f"its result where {only} it: gather on every rank, save on one), or give it a group "
                    "of those ranks only")
        if isinstance(e, StackEvidence) and e.case == "other_iteration" and past is not None and past.within \
                and e.mine.collective and past.delta is not None and past.delta < 0:
            cond = under_if(e.mine)
            if cond:
                # the condition in view: the one to decide the same on every rank
                return (f"{who} {calls} {call_site(e.mine)} in "
                        f"{clean(past.name, 40)}={clean(past.mine, 40)}{cond}, which the others passed without "
                        "calling it: that condition, or one further out, rests on the rank's own values (its data, a "
                        "count of its own, a metric); decide it the same on every rank (all_reduce the value or the "
                        "flag first)")
            return (f"find the condition under which {who} {calls} "
                    f"{call_site(e.mine)} in {clean(past.name, 40)}={clean(past.mine, 40)}, "
                    "which the others passed without calling it: a condition on the rank's own values (a norm over "
                    "a threshold, a NaN check, a count); decide it the same on every rank (all_reduce the value or "
                    "the flag first)")
        if isinstance(e, StackEvidence) and (e.mine_backward or e.theirs_backward) and (
                e.case == "other_collective" or (e.case == "other_iteration" and past is not None and past.within)):
            return ddp_next(e, who)
        ahead = e.case == "other_iteration" and past is not None and past.within and (past.delta or 0) > 0 \
            if isinstance(e, StackEvidence) else False
        if isinstance(e, StackEvidence) and (e.case == "other_collective" or ahead) and e.theirs.collective \
                and ddp_forward(e.mine.frames) and e.mine.collective == "broadcast":
            # DDP's forward against a collective of the job's: it went on into the next forward past that call
            their_call = caller(e.theirs)
            at = f" ({location(their_call)})" if their_call is not None else ""
            my_call = caller(e.mine)
            here = f" at {location(my_call)}" if my_call is not None else ""
            return (f"find why {who} runs the DDP-wrapped model's forward{here} where the others call "
                    f"`{clean(e.theirs.collective, 40)}`{at}: a branch only it takes (a forward through the wrapped "
                    "model on some ranks only), or that call skipped on it (an exception caught around a metric that "
                    "fails on its own data, a condition on its own values); every rank must make the same calls")
        if isinstance(e, StackEvidence) and e.case == "other_iteration" and past is not None and past.within \
                and e.mine.collective and e.theirs.collective and past.delta is not None and past.delta > 0:
            return _ahead_next(e, who, past.name, past.mine, past.theirs, past.delta)
        if isinstance(e, StackEvidence) and e.case == "other_collective" and e.mine.collective in P2P:
            step = _p2p_next(e, who, pid, at, classes, c.rank if c is not None else None)
            if step:
                return step
        if k == "different_collective":
            my_call, their_call = (caller(e.mine), caller(e.theirs)) if isinstance(e, StackEvidence) else (None, None)
            if isinstance(e, StackEvidence) and my_call is not None and their_call is not None \
                    and e.mine.collective and e.theirs.collective:
                # both calls are the job's: name them, and the two ways such a pair comes about
                return (f"make every rank issue the same collectives in one order: {who} {calls} "
                        f"`{clean(e.mine.collective, 40)}` from {named(my_call)}{under_if(e.mine)} where the others "
                        f"call `{clean(e.theirs.collective, 40)}` from {named(their_call)}{under_if(e.theirs)}: one "
                        "of them runs in code only some ranks reach (a block run by one rank alone: evaluation, "
                        "logging, a checkpoint), or was skipped on the others (an exception caught, an early "
                        "`continue`); run each on every rank of its group, or on none")
            return (f"make every rank issue the same collectives in one order: find where {who} calls one the others "
                    "do not (or where they call one it skipped)")
        if isinstance(e, StackEvidence) and e.case == "same_collective":
            site = callers(e)[0]
            from_ = f" from {named(site)}" if site is not None else ""
            exit_ = " (an exit handler: what made its main program end is in its error output)" if exiting(e.mine) else ""
            return (f"find why {who} {calls} `{clean(e.mine.collective or '', 40)}`{from_}{exit_} where the others "
                    "call it from elsewhere: every member of a process group must issue that group's collectives in "
                    "one order (no collective in an atexit handler or an error path that only some ranks take)")
        if c is not None and c.links and c.links[0].wait.state == "running":
            # on a CPU at one line over samples close together: a long step (a straggler) and a hang inside the
            # computation look alike until it has stood there longer
            return (f"see whether {who} finishes this step: sample again over a longer interval (`--samples 3 "
                    f"--interval 5`); if it stays, `py-spy dump --native --pid {pid}`{at} shows where it computes")
        verb = "do" if key is None and len(best.who.keys) > 1 else "does"
        return (f"see why {who} {verb} not return from there: `py-spy dump --native --locals --pid {pid}`{at}; "
                f"`cat /proc/{pid}/stack` shows the kernel side")
    if k == "launch_differs":
        return "start every rank with the same training flags"
    if k == "launcher_held":
        proc = getattr(e, "launcher", None)
        if proc is not None and getattr(e, "how", "") == "traced":
            return (f"detach the tracer from pid {proc.pid} on {clean(proc.node, 60)} (quit the debugger) to resume "
                    "it; hangscope left it as it was")
        if proc is not None:
            return _resume(str(proc.pid), clean(proc.node, 60))
    if k == "store_differs":
        given = getattr(e, "given", "")
        if getattr(e, "connected", False):
            holder = getattr(e, "holder", "")
            return (f"find what sets another MASTER_ADDR/MASTER_PORT in {who}'s processes (an env file they read, a "
                    f"config, an init_method) and give them the job's ({clean(given, 120)})"
                    + (f"; {clean(holder, 160)} serves the store they joined: if it is a leftover of an earlier run, "
                       "end it" if holder else ""))
        return (f"let the ranks use the address their launcher gives them ({clean(given, 120)}): do not set "
                "MASTER_PORT or MASTER_ADDR in the script or its config under the launcher, or pass "
                "init_method='env://' with the environment as it is")
    if k == "rendezvous_differs":
        proc = getattr(e, "launcher", None)
        if proc is not None:
            return (f"restart the launcher on {clean(proc.node, 60)} with the job's rendezvous flags (those of the "
                    "other nodes' launchers; the scheduler's or the launch script's line for that node is where it "
                    "differs)")
    if k == "launch_incomplete":
        return "start the missing node's launcher (same rendezvous, its --node-rank), or find why it exited"
    if k == "outside_peer":
        return "add that node to the hosts list and run hangscope again to see what its ranks do"
    if k == "network_stall":
        return f"check {fold_nodes(best.who.nodes) or 'that node'}'s link: `ss -tinpo` there, and `ping` it from the " \
            "other nodes"
    if k == "slow_node":
        return f"look at {fold_nodes(best.who.nodes) or 'that node'}'s CPU limit (cgroup cpu.max) and load"
    if k == "still_running":
        return f"see what {who} keeps doing: take more samples (--samples 5) with --locals"
    if k == "node_failed":
        return "fix access to the failed node(s) and run again: the culprit may be there"
    if k in ("native_call", "gil_held"):
        return f"see the C frames: `py-spy dump --native --pid {pid}`{at} (hangscope --native), or `gdb -p {pid}`"
    if k == "pipe_write":
        t = getattr(e, "thread", None)
        if t is not None and any(f.function.endswith("_feed") and f.filename.endswith("multiprocessing/queues.py")
                                 for f in t.frames):
            # a multiprocessing.Queue's feeder: what was put waits to be written into the queue's pipe
            return ("the queue's reader does not read (a consumer process that died or never started): make it "
                    "read, or on the path where it is gone call `queue.cancel_join_thread()` (what was not sent is "
                    "lost) so that the process can exit; the queue's feeder is joined at exit until everything put "
                    "is written")
        rank = getattr(e, "rank", None)
        stopped = readers_stopped(rank) if rank is not None else ()
        if stopped and rank is not None:
            return _resume(" ".join(map(str, stopped[:4])), clean(rank.node, 60),
                           "the pipe's reader (`fg` in the shell that stopped it)")
        writing = readers_writing(rank) if rank is not None else ()
        if writing and rank is not None and rank.hold is not None and all(p.ppid == rank.pid for p in rank.hold.pipe_readers):
            return ("its child waits for its output to be read while the rank waits for it to read its input: when "
                    "that output is the rank's to read (Popen with stdin and stdout piped), each waits for the other; "
                    "read the child's output while feeding it (`communicate()`, or a thread that reads), or send its "
                    "output to a file")
        return "make the pipe's reader read (or send the rank's output to a file)"
    if k in ("gpu_fault", "nccl_ras"):
        return "see the GPU evidence below: the node's kernel log (`dmesg -T | grep -i xid`) and nvidia-smi"
    return "see the first finding's detail"


def _wait_next(links: Sequence[Link], c: Culprit) -> str:
    """What to do about the end of a chain of waits."""
    last = links[-1]
    w: ThreadWait = last.wait
    r = c.rank
    assert r is not None
    node = clean(r.node, 60)
    rel = last.release
    first = rel.parties[0] if rel.parties else None
    ring = first is not None and first.role == "cycle" and first.kind == "rank"
    if len(links) > 1 and (ring or (links[-1].who.kind == "rank" and w.resource == "collective")):
        # another rank holds what this one waits for (a file lock, a pipe) and waits in a collective: of the whole
        # job (a cycle: release.chain), or of a group its call names (which may not include this rank)
        holder, waiter = links[-1].who, links[0].who
        them = f"rank {holder.rank}" if holder.rank is not None else f"pid {holder.pid}"
        me = f"rank {waiter.rank}" if waiter.rank is not None else "this rank"
        op = clean(w.operation, 40)
        after = "or let every rank reach the collective before any waits for it; give the wait a timeout"
        if ring:
            held = "the file lock" if links[0].wait.resource == "file_lock" else "what this rank waits for"
            return (f"{them} holds {held} while it waits in `{op}`, which needs {me}: release it before the "
                    f"collective (take and release it within one step, on every rank alike), {after}")
        group = group_arg(w.caller)
        on = f" on `{clean(group, 40)}`" if group else ""
        return (f"{them} holds what {me} waits for while it waits in `{op}`{on}: if that group includes {me}, each "
                f"waits for the other; release it before the collective, {after}")
    if (first is not None and first.role == "cycle" and len(links) > 1 and links[-2].who.pid is not None
            and links[-2].who.pid != r.pid):
        # the rank and a process of its own (a child) each wait for the other through a pipe or a socket
        if links[-2].wait.release in ("producer", "writer", "peer") and links[-2].wait.resource == "process_queue":
            # the child reads: it waits for something only the rank would send
            return ("each waits for the other: send the child what it waits for (its stop message) before waiting "
                    "for it to exit, or close the rank's end of the connection so that its read ends (EOFError); a "
                    "non-daemon multiprocessing child is joined at the rank's exit too: stop it in a `finally`")
        return ("each waits for the other: take what the child sends before waiting for it (its pipes with "
                "`communicate()` or a thread per pipe, its queue's items before `join()`), or send its output to a "
                "file or DEVNULL; give the wait a timeout")
    if any(link.wait.release == "importer" for link in links) and first is not None and first.role == "cycle":
        return ("a thread started while a module is being imported waits for that import to end, and the import waits "
                "for the thread: start the thread after the import (from a function the program calls), not at the "
                "module's top level, and do not wait for it there")
    if first is not None and first.role == "cycle" and all(link.who.kind == "thread" and link.who.pid == r.pid
                                                           for link in links):
        return ("these threads of the rank wait for each other (above): change the order so that one gives what the "
                "other waits for before it waits (the item or sentinel before `join()`, the lock released before "
                "waiting), or give one of the waits a timeout")
    if rel.none == "starved":
        return ("the pool's workers each wait for a task queued behind them in the same pool, so no worker is left to "
                "run it (pool starvation): do not wait inside a pool's task for another task of that pool; run the "
                "inner tasks on a second executor, or in the task itself")
    if rel.none == "workers_idle" and first is not None and first.kind == "process":
        return (f"a worker that held the task died: look for it in the kernel log on {node} (`dmesg -T | grep -i "
                "-e killed -e oom -e segfault`: the OOM killer, or a crash in native code on what it read); fix its "
                "cause, and wait with a timeout (`.get(timeout=...)`) or use "
                "concurrent.futures, whose pool raises BrokenProcessPool instead of waiting")
    if first is not None and first.role == "loop" and first.same:
        return ("never wait for `run_coroutine_threadsafe(...).result()` on the loop's own thread: `await` the "
                "coroutine there instead (and run blocking helpers with `loop.run_in_executor`)")
    # a thread the chain went through runs the event loop and is stuck in a call of its own: what to do about that
    # call, after saying that it holds up the loop (unless the loop waits for itself: said above for that link)
    at = next((i for i, link in enumerate(links[:-1]) if link.release.parties
               and link.release.parties[0].role == "loop" and not link.release.parties[0].same), None)
    if at is not None:
        rest = _wait_next(links[at + 1:], c)
        if first is not None and first.role == "loop":
            return rest
        return ("a synchronous call inside a coroutine holds up the event loop that the waiting thread needs: make it "
                f"asynchronous (an async client, or `await loop.run_in_executor(None, ...)`); {rest}")
    if (first is not None and first.role == "fork_holder") or rel.none == "forked_held":
        return ("a lock held when a process forks stays held in the child for good: start the worker processes "
                "with 'spawn' or 'forkserver' (`mp_context=multiprocessing.get_context(\"spawn\")`), or create the "
                "pool before any thread takes the lock; give the wait a timeout")
    if rel.none == "forked_no_workers":
        return ("make the executor in the process that uses it, after the fork (a DataLoader's `worker_init_fn`, or "
                "created on first use in each process), or start the workers with 'spawn'; give the wait a timeout")
    if rel.none == "undone":
        return ("find the path where a consumer takes an item and does not call `task_done()` (a `continue`, an early "
                "return, an exception): call it in a `finally`; or wait for the consumer another way than `join()`")
    if rel.none == "inherited":
        return (f"find the process that still holds the pipe: `ls -l /proc/{r.pid}/fd` on {node} names it "
                "(pipe:[N]), `lsof -n | grep` that pipe shows its other holders; start background helpers with "
                "their output redirected (`> /dev/null 2>&1`), and give the call a timeout")
    if first is not None and first.kind == "process" and first.feeders and w.release == "children":
        if any(f.same for f in first.feeders):
            return ("close the child's input before waiting for it (`proc.stdin.close()` first, or "
                    "`proc.communicate()`): the rank holds the write end of the pipe the child reads")
        pids = ", ".join(str(f.pid) for f in first.feeders[:3])
        return (f"the write end of pid {first.pid}'s input pipe stays open in pid {pids} on {node}: a process "
                "started after the pipe was made inherits it (a fork copies open files); start later processes "
                "without it (subprocess's `close_fds`, multiprocessing's 'spawn' or 'forkserver'), or close it in "
                "them, so the child sees the end of its input")
    if (first is not None and first.kind == "process" and first.stdin and not first.state
            and w.release == "children"):
        return (f"pid {first.pid} reads the standard input it inherited: start it with its input from /dev/null "
                "(`stdin=subprocess.DEVNULL`), or a pipe the rank writes and closes, and with its non-interactive "
                "options (overwrite or skip, assume yes, batch mode), so that a question fails instead of waiting; "
                "give the wait a timeout")
    if first is not None and first.role == "peer" and first.reading and len(rel.parties) == 1 and not first.state:
        return (f"both ends of the connection wait to read (pid {first.pid} on {node} too): find which side should "
                "have sent first (a request or a reply the protocol expects, a message cut short, a length that does "
                "not match what was sent), and give the reads a timeout so that a lost message fails instead of "
                "hanging")
    if first is not None and first.kind == "process" and first.pid is not None:
        if first.state == "stopped":
            return _resume(str(first.pid), node)
        if first.state == "zombie":
            return (f"pid {first.pid} has exited{' (' + clean(first.exit, 60) + ')' if first.exit else ''}: find why "
                    "(its log, `dmesg` for the OOM killer) and let the waiting code notice a dead child")
        return (f"see what pid {first.pid} does: `py-spy dump --pid {first.pid}` or `cat /proc/{first.pid}/stack` "
                f"on {node}; end it or give the wait a timeout")
    if first is not None and first.kind == "host":
        return (f"check {clean(first.address, 60)}: is the service up and reachable from {node} (`ss -tnp` there)? "
                "Give the call a timeout so that a missing answer fails instead of hanging")
    if first is not None and first.same:
        return "use an RLock, or do not call the code that takes the lock again while holding it"
    res = w.resource
    if res == "debugger":
        return ("a debugger stopped this rank: attach to its terminal and continue (`c`) or quit, and remove the "
                "breakpoint() / set_trace() from the code (PYTHONBREAKPOINT=0 disables them)")
    if res == "terminal" and w.operation == "terminal write":
        target = w.detail("target")
        tty = f"`{clean(target, 40)}`" if target else "its terminal"
        short = target[len("/dev/"):] if target.startswith("/dev/") else ""
        who = f" (`ps -t {clean(short, 30)}` on {node})" if short else ""
        return (f"press Ctrl-Q in the terminal {tty} on {node} if its output was stopped; else find the program "
                f"holding that terminal{who} and why it does not read; run jobs with their output redirected to a "
                "file")
    if res == "terminal":
        return "it reads its standard input: give it input, or start the job with stdin from /dev/null"
    if res == "shutdown":
        if not (r.output and r.output[0].text.strip()):
            return ("its main program ended without an error (it returned, or called sys.exit) while a helper thread "
                    "still runs: stop the helper threads (and join them with a timeout) before the program exits, or "
                    "make them daemon threads")
        return ("its main program ended (see its error output below): fix that error, and make the helper threads "
                "daemon threads or join them with a timeout so the process can exit")
    if res == "store_key":
        key = w.detail("key") or (f"the key {w.detail('key_template')} builds" if w.detail("key_template") else "") \
            or w.detail("argument")
        return (f"find which rank should set {clean(key, 80) or 'the key'} in the store and why it did not (a "
                "different key name or prefix, a branch that skipped it); give store.wait a timeout")
    if res == "signal":
        names = signals(w)
        if names:
            sig = names[0]
            kill = sig[3:] if sig.startswith("SIG") else sig.rsplit(" ", 1)[-1]
            return (f"find the process that should send {' or '.join(names)} to pid {r.pid} and why it did not (its "
                    f"log; is it running?); `kill -{kill} {r.pid}` on {node} releases this wait by hand; give the "
                    "wait a timeout (`signal.sigtimedwait`)")
        return (f"find which signal it waits for (`grep Sig /proc/{r.pid}/status` on {node}: SigBlk) and the process "
                "that should send it; give the wait a timeout")
    if res == "pipe" and rel.none in ("no_writer", "no_reader") and "FIFO" in w.operation:
        path = w.detail("path") or w.detail("target")
        end = "writing" if rel.none == "no_writer" else "reading"
        fifo = f"`{clean(path, 100)}`" if path else "the FIFO"
        return (f"no process has {fifo} open for {end}: start the program that should open it (is it running on "
                f"{node}, and does it use this path?), or open it with O_NONBLOCK and poll with a timeout")
    if res == "cpu":
        return "the loop never exits: fix its condition, and make it wait (an Event, a sleep) instead of spinning"
    if res == "event_loop" and rel.none in ("loop_alone", "loop_unread", "loop_untied", "loop_untied_unread"):
        return ("find what was to complete what the loop awaits (a thread that set a future with "
                "`call_soon_threadsafe`, a callback of a connection that closed): its exception is in the rank's "
                "error output if it died; give the await a timeout (`asyncio.wait_for`)")
    left = long_sleep(w)
    if left is not None:
        return (f"it wakes by itself in about {duration(left)}; if it should not wait that long, see what decided the "
                "delay (a back-off that grew, a retry-after from a server, seconds taken for milliseconds) and cap it")
    if res == "timer" and w.poll is not None and w.detail("retries"):
        return (f"the call it retries keeps failing: run it by hand on {node} to see the error (a service not "
                "started or not listening there, a refused or unreachable address, a wrong port or path), and give "
                "the loop a deadline or a number of tries after which it raises")
    if res == "timer" and w.poll is not None and w.detail("unwritten"):
        return (f"no process on {node} is writing {clean(w.detail('unwritten'), 100)}: find what should create or "
                "complete it (a copy or download that failed, a step another rank or node skipped, a file left "
                "by an earlier run that nothing will finish) and why its condition never turns true; give the loop a "
                "deadline")
    if res == "timer" and w.poll is not None:
        return ("the loop polls for something that does not happen: find why its condition never turns true, and "
                "give it a deadline")
    if res in ("event", "condition", "semaphore", "barrier", "queue", "process_queue", "future", "pool", "thread"):
        died = thread_died(r) if rel.none == "no_related_thread" and last.who.pid == r.pid else None
        if rel.nobody and died is not None:
            in_ = f" in {clean(died[1], 120)}" if died[1] else ""
            return (f"a thread of the rank died of an uncaught exception{in_} (said above, from its error output): fix "
                    "that error, and let a thread's failure reach the code that waits for it (set the event or put a "
                    "sentinel in a `finally`, or wait with a timeout and check that the thread is alive)")
        if rel.nobody:
            return ("nothing is left to release it: find the thread or process that should have (its exception in "
                    "the rank's error output?), and give the wait a timeout")
        return "see why the thread (or process) that should release it does not; give the wait a timeout"
    if res == "lock" and rel.none == "shared_lock":
        held_by = next((t for t in r.threads if t.tid == last.who.tid), None) if last.who.pid == r.pid else None
        path = shared_futex(held_by) if held_by is not None else ""
        name = path.split(" (deleted)")[0]
        if name and "(deleted)" not in path:
            return clean(f"find who maps {name} (`grep -l {name} /proc/[0-9]*/maps` on {node}): a process holding it "
                         "that does not give it back, or, if only the waiters map it, nobody left to: a holder that "
                         f"ended (killed while holding it) leaves it taken; remove it (`rm {name}`) and restart the "
                         "processes that use it", 500)
        return clean("find the other processes that use this lock (its shared memory"
                     + (f", {path}," if path else "") + " is mapped by them: `grep` their /proc/PID/maps): one holds "
                     "it, or one that ended while holding it left it taken, and then nothing can give it back: "
                     "recreate it and restart the processes that use it", 500)
    if res == "lock":
        return "see why the thread holding the lock does not release it; do not hold a lock while waiting"
    if res in ("child",):
        return f"see what the child does (`ps --ppid {r.pid}` on {node}); end it or give the wait a timeout"
    if res == "file_lock":
        return "see which process holds the file lock (`cat /proc/locks`, `fuser FILE`) and why it keeps it"
    if res == "socket" and "accept" in w.operation:
        where_to = w.detail("local")
        to = f" to {clean(where_to, 60)}" if where_to else ""
        return (f"find the client that should connect{to}: is it running, and was it given this address? Give the "
                "accept a timeout")
    if res in ("socket", "http"):
        return f"see which peer it waits for: `ss -tnp` on {node} (pid {r.pid}); give the call a timeout"
    if res == "device":
        return "check the GPU: `nvidia-smi`, and the kernel log for Xid errors (`dmesg -T | grep -i xid`)"
    if res == "native":
        return f"see the C frames: `py-spy dump --native --pid {r.pid}` on {node} (hangscope --native), or `gdb`"
    return f"`py-spy dump --native --locals --pid {r.pid}` and `cat /proc/{r.pid}/stack` on {node} show more"


HELD_ACROSS_GROUPS = (
    "no rank is the odd one out: the ranks wait in different collectives that others passed, as when each process "
    "group's collective waits for a member that is in another group's (tensor, pipeline, expert or sharding groups "
    "beside the data-parallel one); list the members of each group (`torch.distributed.get_process_group_ranks("
    "group)`, or the mesh's) and find the rank whose place differs from its group's: the one that skipped, or added, "
    "one group's collective")


def verdict(c: Optional[Culprit], top: Optional[Fact], top_finding: Optional[Finding],
            slow: Sequence[Finding], total: int, next_text: str, facts: Sequence[Fact] = ()) -> str:
    """The one plain sentence the summary starts with."""
    if top is None or top_finding is None:
        return "Nothing stands out."
    title = top_finding.title[:1].upper() + top_finding.title[1:]
    if top.kind == "progressing":
        return f"{title}; " + "; ".join(f.title for f in slow) + "." if slow else f"{title}."
    if not top.culprit or c is None:
        if top.kind == "dump_failed":
            return f"No culprit found, and the picture is incomplete: {top_finding.title}."
        if isinstance(top.data, StackEvidence) and top.data.case == "passed":
            # every odd class is held in a collective the others passed: with several process groups, each group's
            # collective waits for a member that is in another group's, and no class is the odd one out
            return f"{title}. Next: {HELD_ACROSS_GROUPS}."
        return f"{title}."
    # a stack fact about one rank that is in an unmatched send or recv: what that call waits for
    p2p = next((p2p_clause(f) for f in facts if f.kind == "p2p_wait" and len(f.who.keys) == 1
                and c.ranks[:1] == f.who.keys), "")
    sentence = culprit_sentence(c, top_finding.title, total, p2p, alike_blocked(c, facts))
    # a command line (a code span with arguments), not a name; spans paired from the start, so that the text
    # between two names (`a` inside `b`) is never read as one
    command = next((m for m in re.finditer(r"`[^`]*`", next_text) if " " in m.group()), None)
    # the sentence already says what to run (a held rank's sentence always names what resumes it)
    said = (command is not None and command.group() in sentence) or (top.kind in ("stopped", "frozen") and
                                                                      sentence == top_finding.title)
    tail = f" Next: {next_text}." if next_text and not said else ""
    if top.strength == "high":
        return f"{sentence[:1].upper() + sentence[1:]}.{tail}"
    if top.strength == "medium":
        return f"Likely lead: {sentence}.{tail}"
    return f"No clear culprit; the best lead: {sentence}.{tail}"


def graph_headline(c: Optional[Culprit], graph: WaitGraph, facts: Sequence[Fact], classes: Sequence[StackClass],
                   title: str, total: int) -> str:
    """The graph's own headline (the waits screen): who is at the root and what it is doing, who waits for it,
    and each step of the chain to it."""
    if graph.progressing:
        return "nobody: the job is progressing between samples"
    if c is None or not graph.root:
        return ""
    vs = {v.id: v for v in graph.vertices}
    names = display_names(graph.vertices)
    if graph.deadlock:
        ring = [e for e in graph.edges if e.waiter in graph.root and e.waited in graph.root and e.strength != "low"]
        return clean("a deadlock: " + "; ".join(f"{names[e.waiter]} waits for {names[e.waited]} ({e.evidence})"
                                               for e in ring), 600)
    v = vs[graph.root[0]]
    what = v.state or v.doing
    who = f"{v.label}{' is ' + what if v.state else (', ' + what if what else '')}"
    chain = graph.chain
    first = chain[0] if chain else graph.root[0]
    evidence: dict = {}
    for e in graph.edges:
        if e.waited == first and e.waiter not in chain and e.waiter not in graph.root:
            evidence.setdefault(e.waiter, []).append(e.evidence)
    it = "it" if len(chain) <= 1 else short(vs[first])
    why = "; ".join(f"{short(vs[w])} wait{'s' if len(vs[w].ranks) == 1 else ''} for {it} ({'; '.join(ev[:3])})"
                    for w, ev in list(evidence.items())[:3])
    steps = "; ".join(f"{names[e.waiter]} waits for {names[e.waited]} ({e.evidence})"
                      for a, z in zip(chain, chain[1:]) for e in graph.edges if e.waiter == a and e.waited == z)
    return clean("; ".join(p for p in (who, why, steps) if p), 600)


def with_texts(graph: WaitGraph, headline: str, next_text: str) -> WaitGraph:
    return replace(graph, headline=headline, next=next_text)


def evidence_of(f: Fact, classes: Sequence[StackClass]) -> str:
    return edge_evidence(f, classes)


__all__ = ["verdict", "next_step", "culprit_sentence", "graph_headline", "with_texts", "WaitEvidence"]
