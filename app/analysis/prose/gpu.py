"""Sentences for GPU-side evidence (gpu_evidence.py's facts): Xid errors, ECC counters, an nvidia-smi that does not
answer, NCCL RAS; and each node's GPU evidence in a few lines for the reports."""

from __future__ import annotations

from typing import List, Optional, Tuple

from app.analysis.facts import Fact
from app.analysis.frames import clean
from app.analysis.gpu_evidence import FRESH_S, GpuEvidence, RasEvidence, _kind, meaning
from app.analysis.prose.words import who_short
from app.model import GpuHealth, NodeStatus

Text = Tuple[str, str, str]


def ago(seconds: Optional[float]) -> str:
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


def ecc_text(g: Optional[GpuHealth]) -> str:
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


def action(xid_kind: str, node: str, gpu: Optional[GpuHealth]) -> str:
    index = f" -i {gpu.index}" if gpu is not None and gpu.index is not None else ""
    if xid_kind == "app":
        return (f"the program faulted on that GPU and its CUDA context is lost: restart the job; rerun with "
                f"CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer to find the bad access; if it recurs on {node} only, "
                f"test that GPU (hangscope --test pairs)")
    return (f"take {node} out of the job (drain it in the scheduler, e.g. `scontrol update NodeName={node} "
            f"State=DRAIN Reason=Xid`), restart the job on other nodes; `nvidia-smi -r{index}` on {node} only "
            f"once nothing runs on it, then check the GPU with `hangscope --test pairs` (node-pair tests) or "
            f"`dcgmi diag -r 3` before it takes jobs again")


_LEVEL = {"moving": "the job progresses between samples: this GPU evidence has not stopped it",
          "one_sample": "one sample only: whether the job is stuck is not known",
          "stuck": "the samples show the job stuck"}


def gpu_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, GpuEvidence)
    node = clean(e.node, 80)
    who = who_short(f.who) if f.who.keys else "no rank"
    if e.what == "xid":
        x, gpu = e.xid, e.gpu
        assert x is not None
        kind = _kind(x.xid)
        gpu_name = f"GPU {gpu.index} ({x.bus_id})" if gpu is not None and gpu.index is not None else f"GPU {x.bus_id}"
        title = (f"{who} on {node}: its {gpu_name} reported Xid {x.xid}, {meaning(x.xid)}, {ago(x.age_s)}"
                 if e.mapped else
                 f"{node}'s {gpu_name} reported Xid {x.xid}, {meaning(x.xid)}, {ago(x.age_s)}; ranks there: {who}")
        if e.level == "stuck" and f.culprit:
            title += "; the other ranks wait for it"
        detail = (f"kernel log ({clean(e.source, 60) or 'unknown source'}): Xid {x.xid} {clean(x.text, 200)}"
                  + (f"; also Xid {', '.join(map(str, e.codes))} on this GPU" if e.codes else "")
                  + (f"; {ecc_text(gpu)}" if ecc_text(gpu) else "")
                  + (f"; which ranks use the GPU: {e.how}" if e.mapped else "; which rank uses it is not known")
                  + f". What to do: {action(kind, node, gpu)}.")
        return title, detail, f"Xid {x.xid} ({kind} fault) {ago(x.age_s)}; {_LEVEL[e.level]}"
    if e.what == "old_xid":
        newest = e.xid
        assert newest is not None
        return (f"older Xid errors on {node} (Xid {', '.join(map(str, e.codes))}; the newest {ago(newest.age_s)}): "
                "they predate the hang and likely did not cause it",
                f"newest: Xid {newest.xid} ({meaning(newest.xid)}) on {newest.bus_id}: {clean(newest.text, 200)}. "
                f"Worth a look if they repeat: `nvidia-smi -q -d ECC,ROW_REMAPPER` on {node}",
                f"more than {FRESH_S / 3600:.0f} h before the snapshot, or at a time the log does not give")
    if e.what == "smi":
        t = f"{e.timeout:g} s" if e.timeout else "its deadline"
        title = f"nvidia-smi on {node} did not answer within {t}" + (
            " and did not even end when killed (stuck in the NVIDIA driver)" if e.smi_stuck else "") + \
            f": a GPU or the driver there is hung; ranks there: {who}"
        detail = (f"nvidia-smi answers in well under a second on a healthy node; a GPU that fell off the bus (Xid 79), "
                  f"a GPU firmware timeout (Xid 119/120) or a hung driver makes it wait, and the ranks' CUDA calls on "
                  f"that node wait the same way. What to do: look at `dmesg -T | grep -i xid` on {node}, drain it, "
                  f"and reset the GPUs (`nvidia-smi -r`) or reboot it only when nothing runs there")
        reason = _LEVEL[e.level] + ("; but nvidia-smi hangs on every node: the cause is likely common to them "
                                    "(driver, a fabric manager), not one node" if e.all_nodes else "")
        return title, detail, reason
    g = e.gpu
    assert g is not None
    title = f"{node}'s GPU {g.index} ({g.bus_id}) has {ecc_text(g)}" + (f"; {who} run on it" if e.mapped else "")
    return (title, f"counters from nvidia-smi; a pending remap or retirement applies at the next GPU reset. "
                   f"What to do: `nvidia-smi -q -d ECC,ROW_REMAPPER -i {g.index}` on {node}; with "
                   f"uncorrectable errors or a failed remap, drain the node and test the GPU",
            f"ECC counters, no fresh Xid with them; {_LEVEL[e.level]}")


def ras_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, RasEvidence)
    comm = clean(e.comm, 40)
    if e.what == "missing":
        who = who_short(f.who) if f.who.keys else \
            f"communicator rank{'s' if len(e.subject) > 1 else ''} {', '.join(map(str, e.subject))}"
        named = []
        for label, pid, host, gpu, dead in e.named:
            state = "considered dead" if dead else "unresponsive"
            where = f" (process {pid} on {clean(host, 60)}, GPU {gpu})" if pid else ""
            named.append(f"{clean(label, 60)}{where}: {state}")
        return (f"NCCL RAS: {who} did not answer for communicator {comm}: "
                f"{'its' if len(e.subject) == 1 else 'their'} process is unresponsive; the other ranks wait",
                "; ".join(named) + ". RAS's threads run beside NCCL's in every process: a rank that does not answer "
                "them is stopped, hung hard (a GPU or driver call that never returns) or gone. What to do: look at "
                "that rank's node first (its stack here, `dmesg | grep -i xid` there)",
                f"RAS could not reach the rank; {_LEVEL[e.level]}")
    col = e.collective or "collective"
    if e.ahead:
        verb = f"launched more {col} operations ({e.high}) than the {e.behind} others ({e.low})"
    else:
        verb = f"launched only {e.low} {col} operations; {e.total - e.behind} others are at {e.high}"
    who = who_short(f.who) if f.who.keys and len(f.who.keys) == len(e.subject) else \
        f"communicator rank{'s' if len(e.subject) != 1 else ''} {', '.join(map(str, e.subject))}"
    if e.moved:
        why = "the counts moved since the previous sample: RAS saw a busy job"
    else:
        why = _LEVEL[e.level] + ("; the counts did not move since the previous sample" if e.unmoved else "")
    return (f"NCCL RAS: {who} {verb} in communicator {comm}",
            "RAS counts the collectives each rank launched: the ranks behind have not issued the operation the "
            "others wait in (they are elsewhere: their stacks say where). Counts that differ on a busy job are "
            "normal (NCCL outpaces RAS); counts that stay put across queries mean the communicator is stuck",
            why)


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
        bad = [g for g in ev.gpus if ecc_text(g)]
        out.append(f"nvidia-smi: {len(ev.gpus)} GPU(s)" + (
            "; " + "; ".join(f"GPU {g.index}: {ecc_text(g)}" for g in bad) if bad else ", no ECC/remap trouble"))
    elif ev.smi == "missing":
        out.append("nvidia-smi: not found on this node")
    elif ev.smi:
        out.append(f"nvidia-smi: {ev.smi}" + (f" ({clean(ev.smi_error, 120)})" if ev.smi_error else ""))
    if ev.xids:
        for x in ev.xids[-5:]:
            out.append(f"Xid {x.xid} on {x.bus_id} {ago(x.age_s)}: {meaning(x.xid)}")
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
