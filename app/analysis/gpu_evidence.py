"""GPU-side evidence as findings: kernel Xid errors, ECC and row-remap counts, an nvidia-smi that does not
answer (each node's, app/decode/gpu.py), and NCCL RAS's view of the communicators (missing ranks, operation
counts that differ).

Calibrated like the rest of the analysis: GPU evidence names a culprit [high] only when the samples say the job
is stuck (history given, no progress); a job that progresses turns every GPU finding into a [low] note; an Xid
long before the snapshot is said to be old, [low]; without samples over time the ceiling is [medium].
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from app.analysis.findings import Confidence, Finding
from app.analysis.fold import RankKey, fold_nodes, short_keys
from app.analysis.frames import clean
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


def _ago(seconds: Optional[float]) -> str:
    if seconds is None:
        return "at an unknown time"
    s = max(0.0, seconds)
    if s < 120:
        return f"{s:.0f} s before the snapshot"
    if s < 7200:
        return f"{s / 60:.0f} min before the snapshot"
    if s < 172800:
        return f"{s / 3600:.0f} h before the snapshot"
    return f"{s / 86400:.0f} days before the snapshot"


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


def _who(rs: Sequence[RankSnapshot]) -> str:
    keys = tuple((r.node, r.pid) for r in rs)
    return short_keys(keys, tuple(r.rank for r in rs)) if rs else "no rank"


def _ecc_text(g: Optional[GpuHealth]) -> str:
    if g is None:
        return ""
    parts = []
    if g.ecc_uncorrected_volatile:
        parts.append(f"{g.ecc_uncorrected_volatile} uncorrectable ECC errors since the driver loaded")
    if g.remap_failure:
        parts.append("a row remap failed")
    if g.remap_pending:
        parts.append("a row remap waits for a GPU reset")
    if g.retired_pending:
        parts.append("a page waits to be retired")
    return ", ".join(parts)


def _action(xid_kind: str, node: str, gpu: Optional[GpuHealth]) -> str:
    index = f" -i {gpu.index}" if gpu is not None and gpu.index is not None else ""
    if xid_kind == "app":
        return (f"the program faulted on that GPU and its CUDA context is lost: restart the job; rerun with "
                f"CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer to find the bad access; if it recurs on {node} only, "
                f"test that GPU (hangscope --test pairs)")
    return (f"take {node} out of the job (drain it in the scheduler, e.g. `scontrol update NodeName={node} "
            f"State=DRAIN Reason=Xid`), restart the job on other nodes; `nvidia-smi -r{index}` on {node} only "
            f"once nothing runs on it, then check the GPU with `hangscope --test pairs` (node-pair tests) or "
            f"`dcgmi diag -r 3` before it takes jobs again")


def _level(stuck: Optional[bool], strong: bool) -> Tuple[Confidence, bool, str]:
    """(confidence, culprit, why) from whether the samples show the job stuck (None: one sample only)."""
    if stuck is False:
        return "low", False, "the job progresses between samples: this GPU evidence has not stopped it"
    if stuck is None:
        return ("medium" if strong else "low"), True, "one sample only: whether the job is stuck is not known"
    return ("high" if strong else "medium"), True, "the samples show the job stuck"


def gpu_findings(snapshot: Snapshot, findings: Sequence[Finding], history: Sequence[Snapshot]) -> List[Finding]:
    """Findings from every node's GPU evidence and NCCL RAS, for the ranks of this (one job's) snapshot."""
    nodes = [n for n in snapshot.nodes if n.gpu is not None]
    if not nodes:
        return []
    stuck: Optional[bool] = None
    if history:
        stuck = not any(f.kind == "progressing" for f in findings)
    ranks = snapshot.ranks
    by_pid: Dict[Tuple[str, int], RankSnapshot] = {(r.node, r.pid): r for r in ranks}
    comms = _ras_comms(nodes)
    ras_gpu = _ras_gpus(comms, nodes, ranks)
    out: List[Finding] = []
    hung_smi = [n for n in nodes if n.gpu is not None and n.gpu.smi == "timeout"]
    for node in nodes:
        ev = node.gpu
        assert ev is not None
        here = [r for r in ranks if r.node == node.name]
        if not here:
            continue
        out += _xid_findings(node, ev, ranks, ras_gpu, stuck)
        if ev.smi == "timeout":
            out.append(_smi_finding(node, ev, here, stuck, all_nodes=len(hung_smi) == len(nodes) > 1))
        out += _ecc_findings(node, ev, ranks, ras_gpu, stuck)
    out += _ras_findings(comms, nodes, ranks, by_pid, stuck, _previous_comms(history))
    return [_against(f, findings) for f in out]


def _against(g: Finding, findings: Sequence[Finding]) -> Finding:
    """A GPU culprit finding weighed against the surest other culprits (stacks, process state, locks): agreeing
    evidence is said; a [high] one that names other ranks than theirs drops to [medium] (a finding another piece
    of evidence contradicts is never [high])."""
    if not g.culprit or not g.ranks:
        return g
    mine = set(g.ranks)
    others = [f for f in findings if f.culprit and f.confidence == "high" and f.ranks
              and f.kind not in ("gpu_fault", "nccl_ras", "progressing")]
    if not others:
        return g
    if any(mine & set(f.ranks) for f in others):
        return replace(g, reason=g.reason + "; the stacks or process states single out the same rank")
    if g.confidence != "high":
        return g
    who = others[0].ranks_label or others[0].title
    return replace(g, confidence="medium",
                   reason=g.reason + f"; but other evidence singles out {clean(who, 80)}, not these ranks")


def _xid_findings(node: NodeStatus, ev: NodeGpuEvidence, ranks: Sequence[RankSnapshot],
                  ras_gpu: Dict[RankKey, int], stuck: Optional[bool]) -> List[Finding]:
    out: List[Finding] = []
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
        codes = sorted({y.xid for y in fresh if bus_key(y.bus_id) == key})
        gpu_name = f"GPU {gpu.index} ({x.bus_id})" if gpu is not None and gpu.index is not None else f"GPU {x.bus_id}"
        who = _who(on)
        mapped = how != "node"
        title = (f"{who} on {node.name}: its {gpu_name} reported Xid {x.xid}, {meaning(x.xid)}, {_ago(x.age_s)}"
                 if mapped else
                 f"{node.name}'s {gpu_name} reported Xid {x.xid}, {meaning(x.xid)}, {_ago(x.age_s)}; "
                 f"ranks there: {who}")
        level, culprit, why = _level(stuck, strong=kind != "info" and mapped)
        if kind == "info" and level != "low":
            level = "low"
        if stuck and culprit:
            title += "; the other ranks wait for it"
        others = [c for c in codes if c != x.xid]
        detail = (f"kernel log ({ev.xid_source or 'unknown source'}): Xid {x.xid} {clean(x.text, 200)}"
                  + (f"; also Xid {', '.join(map(str, others))} on this GPU" if others else "")
                  + (f"; {_ecc_text(gpu)}" if _ecc_text(gpu) else "")
                  + (f"; which ranks use the GPU: {how}" if mapped else "; which rank uses it is not known")
                  + f". What to do: {_action(kind, node.name, gpu)}.")
        reason = f"Xid {x.xid} ({kind} fault) {_ago(x.age_s)}; {why}"
        out.append(Finding("gpu_fault", title, detail, level, reason, tuple((r.node, r.pid) for r in on), who,
                           node.name, culprit=culprit))
    if old:
        newest = max(old, key=lambda y: (y.at or 0))
        codes = sorted({y.xid for y in old})
        out.append(Finding(
            "gpu_fault", f"older Xid errors on {node.name} (Xid {', '.join(map(str, codes))}; the newest "
                         f"{_ago(newest.age_s)}): they predate the hang and likely did not cause it",
            f"newest: Xid {newest.xid} ({meaning(newest.xid)}) on {newest.bus_id}: {clean(newest.text, 200)}. Worth a "
            f"look if they repeat: `nvidia-smi -q -d ECC,ROW_REMAPPER` on {node.name}",
            "low", f"more than {FRESH_S / 3600:.0f} h before the snapshot, or at a time the log does not give",
            (), "", node.name, culprit=False))
    return out


def _smi_finding(node: NodeStatus, ev: NodeGpuEvidence, here: Sequence[RankSnapshot], stuck: Optional[bool],
                 all_nodes: bool) -> Finding:
    level, culprit, why = _level(stuck, strong=not all_nodes)
    who = _who(here)
    t = f"{ev.smi_timeout:g} s" if ev.smi_timeout else "its deadline"
    title = f"nvidia-smi on {node.name} did not answer within {t}" + (
        " and did not even end when killed (stuck in the NVIDIA driver)" if ev.smi_stuck else "") + \
        f": a GPU or the driver there is hung; ranks there: {who}"
    detail = (f"nvidia-smi answers in well under a second on a healthy node; a GPU that fell off the bus (Xid 79), "
              f"a GPU firmware timeout (Xid 119/120) or a hung driver makes it wait, and the ranks' CUDA calls on "
              f"that node wait the same way. What to do: look at `dmesg -T | grep -i xid` on {node.name}, drain it, "
              f"and reset the GPUs (`nvidia-smi -r`) or reboot it only when nothing runs there")
    reason = why + ("; but nvidia-smi hangs on every node: the cause is likely common to them (driver, "
                    "a fabric manager), not one node" if all_nodes else "")
    return Finding("gpu_fault", title, detail, level, reason, tuple((r.node, r.pid) for r in here), who,
                   node.name, culprit=culprit)


def _ecc_findings(node: NodeStatus, ev: NodeGpuEvidence, ranks: Sequence[RankSnapshot], ras_gpu: Dict[RankKey, int],
                  stuck: Optional[bool]) -> List[Finding]:
    out: List[Finding] = []
    fresh_bus = {bus_key(x.bus_id) for x in ev.xids if x.age_s is not None and x.age_s <= FRESH_S}
    for g in ev.gpus:
        text = _ecc_text(g)
        if not text or bus_key(g.bus_id) in fresh_bus:  # said with the Xid already
            continue
        on, how = _ranks_on_gpu(node.name, ranks, g, ras_gpu)
        mapped = how != "node"
        level, culprit, why = _level(stuck, strong=False)
        if not (g.ecc_uncorrected_volatile or g.remap_failure):
            level, culprit = "low", False  # a pending remap or retirement alone does not stop a job
        title = f"{node.name}'s GPU {g.index} ({g.bus_id}) has {text}" + (f"; {_who(on)} run on it" if mapped else "")
        out.append(Finding("gpu_fault", title,
                           f"counters from nvidia-smi; a pending remap or retirement applies at the next GPU reset. "
                           f"What to do: `nvidia-smi -q -d ECC,ROW_REMAPPER -i {g.index}` on {node.name}; with "
                           f"uncorrectable errors or a failed remap, drain the node and test the GPU",
                           level, f"ECC counters, no fresh Xid with them; {why}",
                           tuple((r.node, r.pid) for r in on) if mapped else (), _who(on) if mapped else "",
                           node.name, culprit=culprit))
    return out


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


def _ras_findings(comms: Sequence[RasComm], nodes: Sequence[NodeStatus], ranks: Sequence[RankSnapshot],
                  by_pid: Dict[Tuple[str, int], RankSnapshot], stuck: Optional[bool],
                  previous: Dict[str, RasComm]) -> List[Finding]:
    out: List[Finding] = []
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
                state = "considered dead" if rr is not None and rr.dead else "unresponsive"
                where = f" (process {rr.pid} on {clean(rr.host, 60)}, GPU {rr.gpu})" if rr is not None and rr.pid else ""
                named.append(f"{r.label if r is not None else f'communicator rank {m}'}{where}: {state}")
                if r is not None:
                    keys.append((r.node, r.pid))
            level, culprit, why = _level(stuck, strong=True)
            who = short_keys(tuple(keys), tuple(by_pid[k].rank for k in keys)) if keys else \
                f"communicator rank{'s' if len(c.missing) > 1 else ''} {', '.join(map(str, c.missing[:8]))}"
            out.append(Finding(
                "nccl_ras", f"NCCL RAS: {who} did not answer for communicator {clean(c.hash, 40)}: "
                            f"{'its' if len(c.missing) == 1 else 'their'} process is unresponsive; the other ranks wait",
                "; ".join(named) + ". RAS's threads run beside NCCL's in every process: a rank that does not answer "
                "them is stopped, hung hard (a GPU or driver call that never returns) or gone. What to do: look at "
                "that rank's node first (its stack here, `dmesg | grep -i xid` there)",
                level, f"RAS could not reach the rank; {why}", tuple(keys), who,
                fold_nodes(k[0] for k in keys), culprit=culprit))
        for col, by in _count_groups(c):
            counts = sorted(by)
            low, high = counts[0], counts[-1]
            behind = [x for x in by[low] if x >= 0]
            total = sum(len(v) for v in by.values())
            if len(by[low]) * 2 > total:  # most ranks are behind: the few ahead are the odd ones
                ahead = [x for v in counts[1:] for x in by[v] if x >= 0]
                subject, verb = ahead, f"launched more {col or 'collective'} operations ({high}) than the {len(by[low])} others ({low})"
            else:
                subject, verb = behind, f"launched only {low} {col or 'collective'} operations; {total - len(by[low])} others are at {high}"
            keys = []
            for x in subject:
                rr = rank_of.get(x)
                r = _match(rr.host, rr.pid, nodes, ranks) if rr is not None else None
                if r is not None:
                    keys.append((r.node, r.pid))
            who = short_keys(tuple(keys), tuple(by_pid[k].rank for k in keys)) if keys and len(keys) == len(subject) \
                else f"communicator rank{'s' if len(subject) != 1 else ''} {', '.join(map(str, subject[:8]))}"
            prev = previous.get(c.hash)
            moved = prev is not None and _count_groups(prev) != _count_groups(c)
            if moved:
                level, culprit, why = "low", False, "the counts moved since the previous sample: RAS saw a busy job"
            elif prev is not None:
                level, culprit, why = _level(stuck, strong=True)
                why += "; the counts did not move since the previous sample"
            else:
                level, culprit, why = _level(stuck, strong=False)
            out.append(Finding(
                "nccl_ras", f"NCCL RAS: {who} {verb} in communicator {clean(c.hash, 40)}",
                "RAS counts the collectives each rank launched: the ranks behind have not issued the operation the "
                "others wait in (they are elsewhere: their stacks say where). Counts that differ on a busy job are "
                "normal (NCCL outpaces RAS); counts that stay put across queries mean the communicator is stuck",
                level, why, tuple(keys), who, fold_nodes(k[0] for k in keys), culprit=culprit))
    return out


def evidence_lines(node: NodeStatus) -> List[str]:
    """The node's GPU evidence in a few plain lines (reports, --print, the TUI's node panel)."""
    ev = node.gpu
    if ev is None:
        return []
    out = []
    if ev.smi == "timeout":
        out.append(f"nvidia-smi: did not answer within {ev.smi_timeout:g} s"
                   + (" (stuck in the driver even after SIGKILL)" if ev.smi_stuck else ""))
    elif ev.smi == "ok":
        bad = [g for g in ev.gpus if _ecc_text(g)]
        out.append(f"nvidia-smi: {len(ev.gpus)} GPU(s)" + (
            "; " + "; ".join(f"GPU {g.index}: {_ecc_text(g)}" for g in bad) if bad else ", no ECC/remap trouble"))
    elif ev.smi == "missing":
        out.append("nvidia-smi: not found on this node")
    elif ev.smi:
        out.append(f"nvidia-smi: {ev.smi}" + (f" ({clean(ev.smi_error, 120)})" if ev.smi_error else ""))
    if ev.xids:
        for x in ev.xids[-5:]:
            out.append(f"Xid {x.xid} on {x.bus_id} {_ago(x.age_s)}: {meaning(x.xid)}")
    else:
        out.append(f"no Xid lines ({ev.xid_source or 'no kernel log readable'})")
    ras = ev.ras
    if ras is not None and ras.status not in ("", "skipped"):
        if ras.status == "ok":
            missing = sum(len(c.missing) for c in ras.comms)
            out.append(f"NCCL RAS ({ras.via}, {ras.format}{', NCCL ' + clean(ras.nccl_version, 20) if ras.nccl_version else ''}): "
                       f"{len(ras.comms)} communicator(s), {missing} missing rank(s)"
                       + (f", {ras.timeouts} timeout(s)" if ras.timeouts else ""))
        else:
            out.append(f"NCCL RAS: {ras.status}" + (f" ({clean(ras.error, 120)})" if ras.error else ""))
    return out
