"""GPU-side evidence as findings: kernel Xid errors, ECC and row-remap counts, an nvidia-smi that does not
answer (each node's, app/decode/gpu.py), and NCCL RAS's view of the communicators (missing ranks, operation
counts that differ).

Calibrated like the rest of the analysis: GPU evidence names a culprit [high] only when the samples say the job
is stuck (history given, no progress); a job that progresses turns every GPU finding into a [low] note; an Xid
long before the snapshot is said to be old, [low]; without samples over time the ceiling is [medium].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Literal, Optional, Sequence, Tuple

from app.analysis.facts import Confidence, Evidence, Fact, Who, ranks_who
from app.analysis.fold import RankKey
from app.model import GpuHealth, GpuXid, NodeGpuEvidence, NodeStatus, RankSnapshot, RasComm, Snapshot
from app.model import bus_key

FRESH_S = 3600.0  # an Xid within the hour before the snapshot may be the hang's cause; older ones predate it

# What each Xid means and who acts on it, after NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors):
# "hw": the GPU, its memory or its links (drain the node, reset the GPU when nothing runs, test it);
# "app": usually the program's own fault on that GPU (illegal address, exception) that breaks its CUDA context;
# "info": a notice, not a failure by itself.
XIDS: Dict[int, Tuple[str, str]] = {
    8: ("GPU stopped processing (channel timeout)", "hw"),
    13: ("graphics engine exception (often an out-of-range access by the program)", "app"),
    31: ("GPU memory page fault (MMU fault: an illegal address, usually the program's)", "app"),
    32: ("invalid or corrupted push buffer stream", "hw"),
    38: ("driver firmware error", "hw"),
    43: ("GPU stopped processing (the program's channel faulted)", "app"),
    45: ("preemptive cleanup after an earlier error (the process was killed)", "info"),
    48: ("double-bit (uncorrectable) ECC error", "hw"),
    61: ("internal micro-controller breakpoint/warning", "hw"),
    62: ("internal micro-controller halt", "hw"),
    63: ("ECC page retirement or row-remap recording event", "info"),
    64: ("ECC page retirement or row-remap recording failure", "hw"),
    68: ("video processor exception", "app"),
    69: ("graphics engine class error", "app"),
    74: ("NVLink error", "hw"),
    79: ("GPU has fallen off the bus", "hw"),
    92: ("high single-bit ECC error rate", "hw"),
    94: ("contained ECC error (the program on that GPU must restart)", "hw"),
    95: ("uncontained ECC error (the GPU must be reset)", "hw"),
    109: ("context switch timeout", "hw"),
    119: ("GSP RPC timeout (the GPU's firmware did not answer)", "hw"),
    120: ("GSP error (the GPU's firmware)", "hw"),
    121: ("C2C link error", "hw"),
    140: ("unrecovered ECC error in GPU memory", "hw"),
    154: ("GPU recovery action changed (a reset or reboot is required)", "hw"),
}
_SEVERITY = {"hw": 0, "app": 1, "info": 2}


def meaning(xid: int) -> str:
    return XIDS.get(xid, ("see NVIDIA's Xid catalogue", "hw"))[0]


def _kind(xid: int) -> str:
    return XIDS.get(xid, ("", "hw"))[1]


def _gpu_of(ev: NodeGpuEvidence, bus: str) -> Optional[GpuHealth]:
    key = bus_key(bus)
    return next((g for g in ev.gpus if bus_key(g.bus_id) == key), None)


def _ranks_on_gpu(node: str, ranks: Sequence[RankSnapshot], gpu: Optional[GpuHealth], ras_gpu: Dict[RankKey, int]
                  ) -> Tuple[List[RankSnapshot], str]:
    """The ranks of this node on that GPU, and how that is known: nvidia-smi's process list (the GPU's uuid
    among the rank's), NCCL RAS (the rank's NVML device), or LOCAL_RANK = GPU index (the usual launch; a guess)."""
    here = [r for r in ranks if r.node == node]
    if gpu is None:
        return here, "node"
    # the uuid when it survived redaction (`***` on both sides matches nothing), else nvidia-smi's own index
    real = gpu.uuid if gpu.uuid and "***" not in gpu.uuid else ""
    by_uuid = [r for r in here if any((real and u.uuid == real) or
                                      (not real and u.index is not None and u.index == gpu.index) for u in r.gpus)]
    if by_uuid:
        return by_uuid, "nvidia-smi's process list"
    by_ras = [r for r in here if gpu.index is not None and ras_gpu.get((r.node, r.pid)) == gpu.index]
    if by_ras:
        return by_ras, "NCCL RAS"
    by_local = [r for r in here if gpu.index is not None and r.local_rank == gpu.index]
    if by_local:
        return by_local, "LOCAL_RANK = GPU index (a guess: the usual launch)"
    return here, "node"


Level = Literal["moving", "one_sample", "stuck"]


def _level(stuck: Optional[bool], strong: bool) -> Tuple[Confidence, bool, Level]:
    """(confidence, culprit, why) from whether the samples show the job stuck (None: one sample only)."""
    if stuck is False:
        return "low", False, "moving"
    if stuck is None:
        return ("medium" if strong else "low"), True, "one_sample"
    return ("high" if strong else "medium"), True, "stuck"


@dataclass(frozen=True)
class GpuEvidence(Evidence):
    """One node's GPU-side evidence: a fresh Xid (the worst per GPU), older Xids, an nvidia-smi that did not
    answer, or ECC and row-remap counters."""

    what: Literal["xid", "old_xid", "smi", "ecc"]
    node: str
    level: Level
    gpu: Optional[GpuHealth] = None
    xid: Optional[GpuXid] = None
    codes: Tuple[int, ...] = ()  # the other Xid codes on this GPU (xid), or every old code (old_xid)
    source: str = ""  # where the kernel log was read
    how: str = ""  # how the ranks on that GPU are known ("node": not known)
    ranks: Tuple[RankSnapshot, ...] = ()  # the ranks there
    timeout: float = 0.0  # smi: its deadline
    smi_stuck: bool = False  # smi: it did not even end when killed
    all_nodes: bool = False  # smi: it hangs on every node

    @property
    def mapped(self) -> bool:
        return self.how != "node"


def gpu_facts(snapshot: Snapshot, stuck: Optional[bool], history: Sequence[Snapshot]) -> List[Fact]:
    """Facts from every node's GPU evidence and NCCL RAS, for the ranks of this (one job's) snapshot. `stuck`:
    whether the samples show the job stuck (None: one sample)."""
    nodes = [n for n in snapshot.nodes if n.gpu is not None]
    if not nodes:
        return []
    ranks = snapshot.ranks
    by_pid: Dict[Tuple[str, int], RankSnapshot] = {(r.node, r.pid): r for r in ranks}
    comms = _ras_comms(nodes)
    ras_gpu = _ras_gpus(comms, nodes, ranks)
    out: List[Fact] = []
    hung_smi = [n for n in nodes if n.gpu is not None and n.gpu.smi == "timeout"]
    for node in nodes:
        ev = node.gpu
        assert ev is not None
        here = [r for r in ranks if r.node == node.name]
        if not here:
            continue
        out += _xid_facts(node, ev, ranks, ras_gpu, stuck)
        if ev.smi == "timeout":
            out.append(_smi_fact(node, ev, here, stuck, all_nodes=len(hung_smi) == len(nodes) > 1))
        out += _ecc_facts(node, ev, ranks, ras_gpu, stuck)
    out += _ras_facts(comms, nodes, ranks, by_pid, stuck, _previous_comms(history))
    return out


def _rank_who(rs: Sequence[RankSnapshot]) -> Who:
    return ranks_who(tuple((r.node, r.pid) for r in rs), tuple(r.rank for r in rs))


def _xid_facts(node: NodeStatus, ev: NodeGpuEvidence, ranks: Sequence[RankSnapshot],
               ras_gpu: Dict[RankKey, int], stuck: Optional[bool]) -> List[Fact]:
    out: List[Fact] = []
    fresh = [x for x in ev.xids if x.age_s is not None and x.age_s <= FRESH_S]
    old = [x for x in ev.xids if x not in fresh]
    worst: Dict[str, GpuXid] = {}  # per GPU, the most severe fresh Xid (the newest among equals)
    for x in fresh:
        key = bus_key(x.bus_id)
        have = worst.get(key)
        if have is None or (_SEVERITY[_kind(x.xid)], -(x.at or 0)) <= (_SEVERITY[_kind(have.xid)], -(have.at or 0)):
            worst[key] = x
    for key, x in worst.items():
        gpu = _gpu_of(ev, x.bus_id)
        on, how = _ranks_on_gpu(node.name, ranks, gpu, ras_gpu)
        kind = _kind(x.xid)
        codes = tuple(sorted({y.xid for y in fresh if bus_key(y.bus_id) == key} - {x.xid}))
        level, culprit, why = _level(stuck, strong=kind != "info" and how != "node")
        if kind == "info" and level != "low":
            level = "low"
        who = _rank_who(on)
        out.append(Fact("gpu_fault", Who(who.keys, who.numbers, (node.name,)), level,
                        GpuEvidence("xid", node.name, why, gpu, x, codes, ev.xid_source, how, tuple(on)),
                        culprit=culprit))
    if old:
        newest = max(old, key=lambda y: (y.at or 0))
        codes = tuple(sorted({y.xid for y in old}))
        out.append(Fact("gpu_fault", Who(nodes=(node.name,)), "low",
                        GpuEvidence("old_xid", node.name, "one_sample", xid=newest, codes=codes), culprit=False))
    return out


def _smi_fact(node: NodeStatus, ev: NodeGpuEvidence, here: Sequence[RankSnapshot], stuck: Optional[bool],
              all_nodes: bool) -> Fact:
    level, culprit, why = _level(stuck, strong=not all_nodes)
    who = _rank_who(here)
    return Fact("gpu_fault", Who(who.keys, who.numbers, (node.name,)), level,
                GpuEvidence("smi", node.name, why, ranks=tuple(here), timeout=ev.smi_timeout, smi_stuck=ev.smi_stuck,
                            all_nodes=all_nodes), culprit=culprit)


def _ecc_facts(node: NodeStatus, ev: NodeGpuEvidence, ranks: Sequence[RankSnapshot], ras_gpu: Dict[RankKey, int],
               stuck: Optional[bool]) -> List[Fact]:
    out: List[Fact] = []
    fresh_bus = {bus_key(x.bus_id) for x in ev.xids if x.age_s is not None and x.age_s <= FRESH_S}
    for g in ev.gpus:
        if not ecc_problem(g) or bus_key(g.bus_id) in fresh_bus:  # said with the Xid already
            continue
        on, how = _ranks_on_gpu(node.name, ranks, g, ras_gpu)
        mapped = how != "node"
        level, culprit, why = _level(stuck, strong=False)
        if not (g.ecc_uncorrected_volatile or g.remap_failure):
            level, culprit = "low", False  # a pending remap or retirement alone does not stop a job
        who = _rank_who(on) if mapped else Who()
        out.append(Fact("gpu_fault", Who(who.keys, who.numbers, (node.name,)), level,
                        GpuEvidence("ecc", node.name, why, g, how=how, ranks=tuple(on) if mapped else ()),
                        culprit=culprit))
    return out


def ecc_problem(g: Optional[GpuHealth]) -> bool:
    return g is not None and bool(g.ecc_uncorrected_volatile or g.remap_failure or g.remap_pending or
                                  g.retired_pending)


# -- NCCL RAS -----------------------------------------------------------------------------------------------------

def _ras_comms(nodes: Iterable[NodeStatus]) -> List[RasComm]:
    """The communicators RAS reported, once each (every node asked sees the same job-wide view)."""
    seen: Dict[str, RasComm] = {}
    for n in nodes:
        ras = n.gpu.ras if n.gpu is not None else None
        if ras is None or ras.status != "ok":
            continue
        for c in ras.comms:
            if c.hash not in seen:
                seen[c.hash] = c
    return list(seen.values())


def _previous_comms(history: Sequence[Snapshot]) -> Dict[str, RasComm]:
    if not history:
        return {}
    return {c.hash: c for c in _ras_comms(n for n in history[-1].nodes if n.gpu is not None)}


def _match(rr_host: str, rr_pid: Optional[int], nodes: Sequence[NodeStatus], ranks: Sequence[RankSnapshot]
           ) -> Optional[RankSnapshot]:
    """The snapshot's rank behind a RAS rank: the same pid, on the node whose name or address RAS names (or the
    only rank with that pid)."""
    if rr_pid is None:
        return None
    same = [r for r in ranks if r.pid == rr_pid]
    if len(same) == 1:
        return same[0]
    for r in same:
        node = next((n for n in nodes if n.name == r.node), None)
        if rr_host and node is not None and rr_host in (node.name, node.address):
            return r
    return None


def _ras_gpus(comms: Sequence[RasComm], nodes: Sequence[NodeStatus], ranks: Sequence[RankSnapshot]
              ) -> Dict[RankKey, int]:
    out: Dict[RankKey, int] = {}
    for c in comms:
        for rr in c.ranks:
            r = _match(rr.host, rr.pid, nodes, ranks)
            if r is not None and rr.gpu is not None:
                out[(r.node, r.pid)] = rr.gpu
    return out


def _count_groups(c: RasComm) -> List[Tuple[str, Dict[int, List[int]]]]:
    """Per collective type whose counts differ: {count: [comm ranks]} (JSON: every rank; text: the groups)."""
    out: List[Tuple[str, Dict[int, List[int]]]] = []
    if c.ranks and any(rr.ops for rr in c.ranks):
        types = sorted({k for rr in c.ranks for k, _ in rr.ops})
        for t in types:
            by: Dict[int, List[int]] = {}
            for rr in c.ranks:
                if rr.missing:
                    continue
                by.setdefault(dict(rr.ops).get(t, 0), []).append(rr.rank)
            if len(by) > 1:
                out.append((t, by))
        return out
    per: Dict[str, Dict[int, List[int]]] = {}
    for col, ops, n, named in c.op_groups:
        g = per.setdefault(col, {})
        g.setdefault(ops, [])
        g[ops] += list(named) or [-1] * n  # -1: a rank RAS counted but did not name
    return [(t, by) for t, by in per.items() if len(by) > 1]


@dataclass(frozen=True)
class RasEvidence(Evidence):
    """NCCL RAS's view of one communicator: ranks that did not answer, or operation counts that differ."""

    what: Literal["missing", "counts"]
    comm: str  # the communicator's hash
    level: Level
    named: Tuple[Tuple[str, Optional[int], str, Optional[int], bool], ...] = ()  # missing: (label, pid, host, gpu, dead)
    subject: Tuple[int, ...] = ()  # counts: the communicator ranks singled out
    collective: str = ""
    low: int = 0
    high: int = 0
    behind: int = 0  # how many ranks are at the low count
    total: int = 0
    ahead: bool = False  # the few are ahead (most are behind)
    moved: bool = False  # the counts moved since the previous sample
    unmoved: bool = False  # ... or did not (a previous sample exists)


def _ras_facts(comms: Sequence[RasComm], nodes: Sequence[NodeStatus], ranks: Sequence[RankSnapshot],
               by_pid: Dict[Tuple[str, int], RankSnapshot], stuck: Optional[bool],
               previous: Dict[str, RasComm]) -> List[Fact]:
    out: List[Fact] = []
    for c in comms:
        rank_of = {rr.rank: rr for rr in c.ranks}
        if any(rr.pid is not None for rr in c.ranks) and \
                not any(_match(rr.host, rr.pid, nodes, ranks) is not None for rr in c.ranks):
            continue  # none of its processes is a rank of this job: another job's communicator
        if c.missing:
            named = []
            keys: List[RankKey] = []
            for m in c.missing[:32]:
                rr = rank_of.get(m)
                r = _match(rr.host, rr.pid, nodes, ranks) if rr is not None else None
                label = r.label if r is not None else f"communicator rank {m}"
                named.append((label, rr.pid if rr is not None else None, rr.host if rr is not None else "",
                              rr.gpu if rr is not None else None, bool(rr is not None and rr.dead)))
                if r is not None:
                    keys.append((r.node, r.pid))
            level, culprit, why = _level(stuck, strong=True)
            who = ranks_who(tuple(keys), tuple(by_pid[k].rank for k in keys)) if keys else \
                Who(numbers=tuple(c.missing[:8]))
            out.append(Fact("nccl_ras", who, level, RasEvidence("missing", c.hash, why, tuple(named),
                                                                 subject=tuple(c.missing[:8])), culprit=culprit))
        for col, by in _count_groups(c):
            counts = sorted(by)
            low, high = counts[0], counts[-1]
            behind = [x for x in by[low] if x >= 0]
            total = sum(len(v) for v in by.values())
            ahead = len(by[low]) * 2 > total  # most ranks are behind: the few ahead are the odd ones
            subject = [x for v in counts[1:] for x in by[v] if x >= 0] if ahead else behind
            keys = []
            for x in subject:
                rr = rank_of.get(x)
                r = _match(rr.host, rr.pid, nodes, ranks) if rr is not None else None
                if r is not None:
                    keys.append((r.node, r.pid))
            prev = previous.get(c.hash)
            moved = prev is not None and _count_groups(prev) != _count_groups(c)
            if moved:
                level, culprit, why = "low", False, "moving"
            elif prev is not None:
                level, culprit, why = _level(stuck, strong=True)
            else:
                level, culprit, why = _level(stuck, strong=False)
            who = ranks_who(tuple(keys), tuple(by_pid[k].rank for k in keys)) if keys and len(keys) == len(subject) \
                else Who(numbers=tuple(subject[:8]))
            out.append(Fact("nccl_ras", Who(who.keys, who.numbers, tuple(dict.fromkeys(k[0] for k in keys))), level,
                            RasEvidence("counts", c.hash, why, subject=tuple(subject[:8]), collective=col, low=low,
                                        high=high, behind=len(by[low]), total=total, ahead=ahead, moved=moved,
                                        unmoved=prev is not None and not moved), culprit=culprit))
    return out
