"""The whole job as a process tree: launchers above their ranks, each rank's children below it (issue 16.3).

Launchers and children are never ranks (Snapshot.processes holds them apart); here they are put back where they
are in the job: per job, per node, the launcher chain (srun above torchrun), its ranks, and each rank's children
(data-loader workers, compile workers, subprocesses), with what a dumped one was doing. Also the finding for a
job that has launchers but no rank yet (torchrun waiting for its rendezvous): that is a job, not "nothing found".
Pure functions; every remote string goes through `clean` where it is shown.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

from app.analysis.facts import Evidence, Fact, Who
from app.analysis.frames import clean, frame_text, is_library
from app.model import JobProcess, RankSnapshot, Snapshot

MAX_LINES = 200  # of the printed tree
MAX_CHILDREN_SHOWN = 8  # per rank


def doing(p: JobProcess) -> str:
    """Where a dumped process's main thread is: its innermost Python frame (or its kernel wait)."""
    if p.threads:
        main = next((t for t in p.threads if t.is_main), p.threads[0])
        py = [f for f in main.frames if not f.native]
        own = next((f for f in py if not is_library(f)), None)  # the job's own code says more than threading's
        if own is not None and own is not py[0]:
            return f"in {frame_text(own)} (innermost: {frame_text(py[0])})"
        if py:
            return f"in {frame_text(py[0])}"
    if p.hold is not None and p.hold.held:
        return p.hold.kind.replace("_", " ")
    if p.wchan and p.state in ("S", "D"):
        return f"sleeping in {p.wchan}"
    return ""


def _proc_line(p: JobProcess) -> str:
    what = doing(p)
    dumped = f"dumped: {p.why_dumped}" if p.why_dumped else ""
    if p.error is not None and p.why_dumped:
        dumped += f" ({p.error.code.replace('_', ' ')})"
    extra = "; ".join(x for x in (what, dumped) if x)
    state = f" [{p.state}]" if p.state else ""
    return clean(f"{p.kind} pid {p.pid}{state}" + (f": {extra}" if extra else ""), 300)


def _rank_line(r: RankSnapshot) -> str:
    state = f" [{r.state}]" if r.state else ""
    return clean(f"{r.label}{' (pid ' + str(r.pid) + ')' if r.rank is not None else ''}{state}", 200)


def tree_lines(snapshot: Snapshot, limit: int = MAX_LINES) -> List[str]:
    """The jobs' process trees, indented two spaces a level; [] when the snapshot holds no launcher nor child
    (nothing to add to the ranks)."""
    if not snapshot.processes:
        return []
    jobs: Dict[str, Dict[str, Tuple[List[RankSnapshot], List[JobProcess]]]] = defaultdict(dict)
    for r in snapshot.ranks:
        jobs[r.job].setdefault(r.node, ([], []))[0].append(r)
    for p in snapshot.processes:
        jobs[p.job].setdefault(p.node, ([], []))[1].append(p)
    out: List[str] = []
    several = len(jobs) > 1
    for job in sorted(jobs, key=lambda j: (j == "", j)):
        depth0 = 0
        if several or job:
            out.append(clean(f"job {job or 'unidentified'}", 200))
            depth0 = 1
        for node, (ranks, procs) in jobs[job].items():
            out.append("  " * depth0 + clean(node, 200))
            out += _node_tree(ranks, procs, depth0 + 1)
            if len(out) >= limit:
                return out[:limit] + ["  ... (more in the snapshot file)"]
    return out


def _node_tree(ranks: Sequence[RankSnapshot], procs: Sequence[JobProcess], depth: int) -> List[str]:
    by_pid = {p.pid: p for p in procs}
    launchers = [p for p in procs if p.role == "launcher"]
    children: Dict[int, List[JobProcess]] = defaultdict(list)
    for p in procs:
        if p.role == "child" and p.of:
            children[p.of[0]].append(p)
    # a launcher's parent launcher (srun above torchrun): the nearest launcher among its ancestors
    parent: Dict[int, Optional[int]] = {}
    for p in launchers:
        up = p.ppid
        seen = 0
        while up is not None and up not in by_pid and seen < 64:
            up, seen = None, seen + 1  # only direct parents are known here; a gap ends the chain
        parent[p.pid] = up if up is not None and by_pid[up].role == "launcher" else None
    # ranks under their nearest launcher: the launcher listing them with the fewest ranks is the nearest
    owner: Dict[int, Optional[int]] = {}
    for r in ranks:
        holders = [p for p in launchers if r.pid in p.of]
        near = next((p for p in holders if p.pid == r.ppid), None) or (
            min(holders, key=lambda p: (len(p.of), -p.pid)) if holders else None)
        owner[r.pid] = near.pid if near is not None else None
    out: List[str] = []

    def rank_block(r: RankSnapshot, d: int) -> None:
        out.append("  " * d + _rank_line(r))
        kids = children.get(r.pid, [])
        for c in kids[:MAX_CHILDREN_SHOWN]:
            out.append("  " * (d + 1) + _proc_line(c))
        if len(kids) > MAX_CHILDREN_SHOWN:
            out.append("  " * (d + 1) + f"... {len(kids) - MAX_CHILDREN_SHOWN} more children")

    def launcher_block(p: JobProcess, d: int) -> None:
        out.append("  " * d + _proc_line(p))
        for q in launchers:
            if parent.get(q.pid) == p.pid:
                launcher_block(q, d + 1)
        for r in ranks:
            if owner.get(r.pid) == p.pid:
                rank_block(r, d + 1)

    for p in launchers:
        if parent.get(p.pid) is None:
            launcher_block(p, depth)
    for r in ranks:
        if owner.get(r.pid) is None:
            rank_block(r, depth)
    return out


def rank_family(snapshot: Snapshot, rank: RankSnapshot) -> List[str]:
    """One rank's place in its job, for its own view: the launchers above it (outermost first), the rank, and
    its children below it, indented two spaces a level; [] when it has neither launcher nor child."""
    here = [p for p in snapshot.processes if p.node == rank.node and p.job == rank.job]
    above = sorted((p for p in here if p.role == "launcher" and rank.pid in p.of), key=lambda p: (-len(p.of), p.pid))
    below = [p for p in here if p.role == "child" and p.of and p.of[0] == rank.pid]
    if not above and not below:
        return []
    out = ["  " * i + _proc_line(p) for i, p in enumerate(above)]
    out.append("  " * len(above) + _rank_line(rank) + "  (this rank)")
    out += ["  " * (len(above) + 1) + _proc_line(c) for c in below[:MAX_CHILDREN_SHOWN]]
    if len(below) > MAX_CHILDREN_SHOWN:
        out.append("  " * (len(above) + 1) + f"... {len(below) - MAX_CHILDREN_SHOWN} more children")
    return out


@dataclass(frozen=True)
class LaunchersEvidence(Evidence):
    """A job's launchers: running with no rank below them yet (waiting in their rendezvous), and, when their own
    flags say how many nodes the job has and which node rank each is, the node ranks with no launcher running
    and the nodes of the hosts list where none was found."""

    job: str
    launchers: Tuple[JobProcess, ...]
    nnodes: Optional[int] = None  # --nnodes (the most the launchers agree on)
    node_ranks: Tuple[int, ...] = ()  # the --node-rank values of the launchers found
    absent: Tuple[int, ...] = ()  # node ranks of 0..nnodes-1 no launcher has
    idle_nodes: Tuple[str, ...] = ()  # inspected nodes of the job's hosts with no launcher of it
    rendezvous: str = ""  # --rdzv-endpoint / --master-addr:--master-port, when given


@dataclass(frozen=True)
class HeldLauncherEvidence(Evidence):
    """A job's launcher that cannot run (stopped or traced, state T or t) while the job has no rank: the
    rendezvous (torchrun's agents meet through a store) needs every node's launcher, so the others wait for it."""

    job: str
    launcher: JobProcess
    how: str  # "stopped" or "traced"
    waiting: Tuple[JobProcess, ...] = ()  # the job's other launchers, which wait in the rendezvous
    rendezvous: str = ""  # --rdzv-endpoint / --master-addr:--master-port, when given


@dataclass(frozen=True)
class RendezvousEvidence(Evidence):
    """A launcher started with other rendezvous flags than the job's other launchers (another run id, endpoint,
    backend or node count): it waits in a rendezvous of its own, and the others wait for a node that never joins
    theirs. (flag, its value, the others' value) per flag."""

    job: str
    launcher: JobProcess
    diff: Tuple[Tuple[str, str, str], ...]
    others: int  # launchers that agree with each other


@dataclass(frozen=True)
class NoDataEvidence(Evidence):
    ranks: int  # ranks found (without a stack, when > 0)
    failed: int = 0  # nodes that failed
    nodes: int = 0


_NNODES = re.compile(r"^--nnodes(?:=(.*))?$")
_NODE_RANK = re.compile(r"^--node[-_]rank(?:=(.*))?$")
_ENDPOINT = re.compile(r"^--(?:rdzv[-_]endpoint|master[-_]addr|master[-_]port)(?:=(.*))?$")


def _flag(cmdline: Sequence[str], pattern: "re.Pattern[str]") -> Optional[str]:
    """A launcher flag's value (`--nnodes=4` or `--nnodes 4`)."""
    for i, arg in enumerate(cmdline[:256]):
        m = pattern.match(arg)
        if m is None:
            continue
        if m.group(1) is not None:
            return m.group(1)
        return cmdline[i + 1] if i + 1 < len(cmdline) else None
    return None


def _count(text: Optional[str]) -> Optional[int]:
    """`4`, or `1:4` (elastic min:max: the max is what the rendezvous waits for when min is not met)."""
    if text is None:
        return None
    last = text.rsplit(":", 1)[-1].strip()
    return int(last) if last.isdigit() and len(last) <= 7 else None


def launchers_without_ranks(snapshot: Snapshot) -> List[Fact]:
    """A job whose launchers run but none of whose ranks exist yet (torchrun in its rendezvous, waiting for a
    node that has not joined): a job, with what its launchers do and, from their own flags, the node ranks
    whose launcher is not running."""
    if snapshot.ranks:
        return []
    launchers = [p for p in snapshot.processes if p.role == "launcher"]
    if not launchers:
        return []
    by_job: Dict[str, List[JobProcess]] = defaultdict(list)
    for p in launchers:
        by_job[p.job].append(p)
    inspected = [n.name for n in snapshot.nodes if n.state in ("done", "partial")]
    out: List[Fact] = []
    for job, procs in sorted(by_job.items()):
        counts = Counter(c for c in (_count(_flag(p.cmdline, _NNODES)) for p in procs) if c is not None)
        nnodes = counts.most_common(1)[0][0] if counts else None
        ranks = sorted({int(v) for v in (_flag(p.cmdline, _NODE_RANK) for p in procs)
                        if v is not None and v.isdigit() and len(v) <= 7})
        absent: Tuple[int, ...] = ()
        if nnodes is not None and ranks:
            absent = tuple(n for n in range(min(nnodes, 1 << 16)) if n not in set(ranks))
        with_launcher = {p.node for p in procs}
        idle = tuple(n for n in inspected if n not in with_launcher)
        endpoint = " ".join(v for v in (_flag(p.cmdline, _ENDPOINT) for p in procs[:1]) if v)
        evidence = LaunchersEvidence(job, tuple(procs), nnodes, tuple(ranks), absent, idle, endpoint)
        nodes = tuple(dict.fromkeys(p.node for p in procs))
        out.append(Fact("launchers_only", Who(nodes=nodes), "high", evidence, culprit=False))
        for p, diff in odd_launchers(procs):
            out.append(Fact("rendezvous_differs", Who(nodes=(p.node,), pid=p.pid), "high",
                            RendezvousEvidence(job, p, diff, len(procs) - 1)))
        for p in procs:
            how = held_state(p)
            if how:  # the kernel's word: a stopped launcher takes no part in the rendezvous the others wait in
                others = tuple(q for q in procs if q is not p and not held_state(q))
                out.append(Fact("launcher_held", Who(nodes=(p.node,), pid=p.pid), "high",
                                HeldLauncherEvidence(job, p, how, others, endpoint)))
        if absent or (nnodes is not None and len(with_launcher) < nnodes and idle):
            # the launchers' own flags say the rendezvous waits for nodes that never started theirs
            out.append(Fact("launch_incomplete", Who(nodes=idle[:max(1, len(absent))] if idle else ()),
                            "high" if absent and idle and len(idle) <= len(absent) else "medium", evidence))
    return out


# torchrun's agent (torch.distributed.elastic) waits here, after its worker group succeeded, for every other node's
# agent to finish too: the ranks it started have ended well (SimpleElasticAgent._exit_barrier)
_EXIT_BARRIER = ("_exit_barrier", "torch/distributed/elastic/agent/server/api.py")


def in_exit_barrier(p: JobProcess) -> bool:
    """Whether a launcher's dump shows it in torchrun's exit barrier: its own ranks have finished."""
    return p.role == "launcher" and any(
        f.function.endswith(_EXIT_BARRIER[0]) and f.filename.replace("\\", "/").endswith(_EXIT_BARRIER[1])
        for t in p.threads for f in t.frames)


def finished_nodes(snapshot: Snapshot) -> Tuple[str, ...]:
    """The nodes whose launcher of the job waits in torchrun's exit barrier: their ranks have finished."""
    return tuple(dict.fromkeys(p.node for p in snapshot.processes[:4096] if not p.of and in_exit_barrier(p)))


def held_state(p: JobProcess) -> str:
    """"stopped" or "traced" for a process that cannot run until someone resumes it (SIGSTOP, job control, a
    tracer's stop), from the node's reading of its hold or its state letter; "" otherwise."""
    if p.hold is not None:  # the node's reading, which knows a passing stop of hangscope's own tool for what it is
        return p.hold.kind if p.hold.held and p.hold.kind in ("stopped", "traced") else ""
    return "stopped" if p.state == "T" else ""


# The flags that decide which rendezvous a launcher joins: a node started with another value meets no one (torchrun's
# --rdzv-* and --nnodes, the static launcher's --master-addr and --master-port); spelled with - or _
_RENDEZVOUS_KEYS = ("--rdzv-id", "--rdzv-endpoint", "--rdzv-backend", "--nnodes", "--master-addr", "--master-port")


def _rendezvous_flags(p: JobProcess) -> Dict[str, str]:
    from app.analysis.launch import flags

    got = {k.replace("_", "-"): v for k, v in flags(p.cmdline[:256]).items()}
    return {k: got.get(k, "(not given)")[:100] for k in _RENDEZVOUS_KEYS}


def odd_launchers(procs: Sequence[JobProcess]) -> List[Tuple[JobProcess, Tuple[Tuple[str, str, str], ...]]]:
    """Launchers of one kind whose rendezvous flags differ from what the others (at least two, two thirds or
    more) agree on: each with (flag, its value, theirs)."""
    out: List[Tuple[JobProcess, Tuple[Tuple[str, str, str], ...]]] = []
    by_kind: Dict[str, List[JobProcess]] = defaultdict(list)
    for p in procs[:4096]:
        if p.role == "launcher":
            by_kind[p.kind].append(p)
    for group in by_kind.values():
        if len(group) < 3:
            continue
        seen = [_rendezvous_flags(p) for p in group]
        majority: Dict[str, str] = {}
        for key in _RENDEZVOUS_KEYS:
            value, n = Counter(f[key] for f in seen).most_common(1)[0]
            if n >= 2 and n * 3 >= len(group) * 2 and "***" not in value:
                majority[key] = value
        for p, f in zip(group, seen):
            diff = tuple((k, f[k], v) for k, v in majority.items() if f[k] != v and "***" not in f[k])
            if diff:
                out.append((p, diff))
    return out


def one_rendezvous(snapshot: Snapshot) -> Snapshot:
    """Launchers (with no rank yet) that differ from the job's others only by their rendezvous flags are that
    job's, not jobs of their own: their rendezvous endpoint, which names a job, is the very mistake."""
    if snapshot.ranks or not snapshot.processes:
        return snapshot
    launchers = [p for p in snapshot.processes[:4096] if p.role == "launcher"]
    if len({p.job for p in launchers}) < 2:
        return snapshot
    jobs = Counter(p.job for p in launchers)
    odd = {(p.node, p.pid) for p, _ in odd_launchers(launchers)}
    usual = Counter(p.job for p in launchers if (p.node, p.pid) not in odd).most_common(1)
    if not odd or not usual or any(jobs[p.job] > len(odd) for p in launchers if (p.node, p.pid) in odd):
        return snapshot
    job = usual[0][0]
    return replace(snapshot, processes=tuple(replace(p, job=job) if (p.node, p.pid) in odd else p
                                             for p in snapshot.processes))


def no_data(snapshot: Snapshot) -> Fact:
    failed = sum(1 for n in snapshot.nodes if n.state == "failed")
    return Fact("no_data", Who(), "high", NoDataEvidence(len(snapshot.ranks), failed, len(snapshot.nodes)),
                culprit=False)


# A pass whose dumps start further apart than this is flagged: the analysis compares where ranks are as if at one
# moment, and a rank that moves (a step of a healthy job is often well under a second) can be caught one step on.
LARGE_SKEW = 1.0


def skew_line(snapshot: Snapshot) -> str:
    """How close together in time the pass's rank dumps were (Snapshot.dump_skew), flagged when large; "" when
    fewer than two ranks were dumped."""
    skew = snapshot.dump_skew
    if skew is None:
        return ""
    dumped = [r for r in snapshot.ranks if r.dump_started is not None]
    nodes = len({r.node for r in dumped})
    longest = max((r.dump_ended - r.dump_started for r in dumped
                   if r.dump_ended is not None and r.dump_started is not None), default=0.0)
    line = (f"Dump skew: the {len(dumped)} rank dumps on {nodes} node{'s' if nodes != 1 else ''} started within "
            f"{skew:.3f} s of each other (the longest took {longest:.3f} s)")
    if skew > LARGE_SKEW:
        line += (f"; large: more than {LARGE_SKEW:g} s apart, so ranks that still move may have been caught at "
                 "different moments: compare their positions with care, or take another snapshot")
    return line + "."
