"""A node's GPUs before a GPU test: the gpu_inventory op's reply, decoded by the investigation's own decoder
(app/decode/gpu.py) into the one GPU model, and the tests' own rule for "GPU busy".

Pure. Which GPUs are held by which process decides whether a test may start there without the user's
confirmation: any process holding a GPU counts (the hung job, most likely), however little memory it uses.
"""

from __future__ import annotations

from typing import Any

from app.decode import gpu as decode
from app.errors import HangscopeError
from app.gpu.model import NodeInventory
from app.model import GpuProcess


class GpusBusyError(HangscopeError):
    """GPUs the test would use are held by other processes (the hung job, most likely)."""

    title = "GPUs in use"
    hint = ("the hung job (or another process) still holds these GPUs: stop it first, or confirm with "
            "--allow-busy-gpus to test next to it (results may then be slow or fail for that reason)")

    def __init__(self, busy: list[tuple[str, GpuProcess]]) -> None:
        shown = "; ".join(f"{node}: pid {h.pid} {h.process or ''} holds {h.uuid} ({h.used_mib or '?'} MiB)"
                          for node, h in busy[:8])
        more = f"; and {len(busy) - 8} more" if len(busy) > 8 else ""
        super().__init__(f"{len(busy)} GPU holder(s) found: {shown}{more}")
        self.busy = busy


def node_inventory(node: str, data: Any) -> NodeInventory:
    """The gpu_inventory op's reply (workers/collect/nvidia.py read()) as the node's inventory."""
    ev = decode.gpu_evidence(data)
    if ev is None:
        return NodeInventory(node=node, notes=(f"inventory failed: {str(data)[:300]}",))
    notes = ev.notes + ((f"nvidia-smi: {ev.smi_error[:300]}",) if ev.smi == "failed" and ev.smi_error else ()) \
        + ((f"{ev.smi_via or 'nvidia-smi'} did not answer within {ev.smi_timeout:g}s (a GPU may have fallen off the "
            "bus)",) if ev.smi == "timeout" else ())
    if ev.smi != "ok":
        return NodeInventory(node=node, xids=ev.xids, notes=notes)
    return NodeInventory(node, ev.smi_via or "nvidia-smi", ev.gpus, ev.processes, ev.xids, notes)


def busy(inventories: list[NodeInventory]) -> list[tuple[str, GpuProcess]]:
    """The tests' rule for "GPU busy": every process that holds a GPU of a node to be tested."""
    return [(inv.node, h) for inv in inventories for h in inv.holders]


def summary(inv: NodeInventory) -> str:
    if not inv.source:
        return "no NVIDIA GPUs (neither nvidia-smi nor the driver's library answered)" + (
            f"; {inv.notes[0]}" if inv.notes else "")
    parts = [f"{len(inv.gpus)} GPU(s) via {inv.source}"]
    for g in inv.gpus:
        mem = f"{g.memory_used_mib}/{g.memory_total_mib} MiB" if g.memory_total_mib is not None else "memory ?"
        ecc = f", ECC uncorrected {g.ecc_uncorrected_volatile}" if g.ecc_uncorrected_volatile else ""
        util = f", {g.utilization_pct}% busy" if g.utilization_pct is not None else ""
        parts.append(f"[{g.index}] {g.name} {mem}{util}{ecc}")
    if inv.holders:
        parts.append("held by " + ", ".join(f"pid {h.pid} {h.process}".strip() for h in inv.holders))
    if inv.xids:
        parts.append("recent Xid " + ", ".join(f"{x.xid} on {x.bus_id}" for x in inv.xids[-5:]))
    return "; ".join(parts)
