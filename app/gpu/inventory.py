"""GPU inventory per node from the gpu_inventory op: nvidia-smi CSV (or nvidia-ml-py records) and Xid lines.

Pure. nvidia-smi writes `[N/A]` or `[Not Supported]` for fields a GPU lacks; those become None. Which GPUs
are held by which process decides whether a test may start there without the user's confirmation.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from app.errors import HangscopeError
from app.gpu.model import GpuHolder, GpuInfo, NodeInventory, XidEvent

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+), ?(.*)$")


class GpusBusyError(HangscopeError):
    """GPUs the test would use are held by other processes (the hung job, most likely)."""

    title = "GPUs in use"
    hint = ("the hung job (or another process) still holds these GPUs: stop it first, or confirm with "
            "--allow-busy-gpus to test next to it (results may then be slow or fail for that reason)")

    def __init__(self, busy: list[tuple[str, GpuHolder]]) -> None:
        shown = "; ".join(f"{node}: pid {h.pid} {h.process or ''} holds {h.uuid} ({h.used_mib or '?'} MiB)"
                          for node, h in busy[:8])
        more = f"; and {len(busy) - 8} more" if len(busy) > 8 else ""
        super().__init__(f"{len(busy)} GPU holder(s) found: {shown}{more}")
        self.busy = busy


def _num(text: str) -> Optional[int]:
    text = text.strip()
    try:
        return int(float(text))
    except ValueError:
        return None  # [N/A], [Not Supported], N/A


def parse_gpus_csv(text: str, fields: str) -> list[GpuInfo]:
    names = [f.strip() for f in fields.split(",")]
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(names):
            continue
        row = dict(zip(names, parts))
        out.append(GpuInfo(index=_num(row.get("index", "")), uuid=row.get("uuid", "")[:80],
                           name=row.get("name", "")[:120], bus_id=row.get("pci.bus_id", "")[:40],
                           memory_used_mib=_num(row.get("memory.used", "")),
                           memory_total_mib=_num(row.get("memory.total", "")),
                           utilization_pct=_num(row.get("utilization.gpu", "")),
                           ecc_uncorrected=_num(row.get("ecc.errors.uncorrected.volatile.total", "")),
                           temperature_c=_num(row.get("temperature.gpu", ""))))
    return out


def parse_apps_csv(text: str, fields: str) -> list[GpuHolder]:
    names = [f.strip() for f in fields.split(",")]
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", len(names) - 1)]
        if len(parts) != len(names):
            continue
        row = dict(zip(names, parts))
        pid = _num(row.get("pid", ""))
        if pid is None:
            continue
        out.append(GpuHolder(pid=pid, uuid=row.get("gpu_uuid", "")[:80], used_mib=_num(row.get("used_memory", "")),
                             process=row.get("process_name", "")[:200]))
    return out


def parse_xids(lines: list[Any]) -> list[XidEvent]:
    out = []
    for line in lines:
        if not isinstance(line, str):
            continue
        m = _XID.search(line)
        if m:
            out.append(XidEvent(bus=m.group(1), code=int(m.group(2)), text=m.group(3)[:300], line=line[:500]))
    return out


def node_inventory(node: str, data: Any) -> NodeInventory:
    if not isinstance(data, dict):
        return NodeInventory(node=node, notes=(f"inventory failed: {str(data)[:300]}",))
    notes = tuple(str(n)[:300] for n in data.get("notes") or [])
    source = data.get("source")
    xids = tuple(parse_xids(data.get("xid_lines") or []))
    if source == "nvidia-smi":
        gpus = parse_gpus_csv(str(data.get("gpus_csv") or ""), str(data.get("gpu_fields") or ""))
        holders = parse_apps_csv(str(data.get("apps_csv") or ""), str(data.get("app_fields") or ""))
        return NodeInventory(node, "nvidia-smi", tuple(gpus), tuple(holders), xids, notes)
    if source == "nvidia-ml-py":
        gpus = [GpuInfo(index=g.get("index"), uuid=str(g.get("uuid", ""))[:80], name=str(g.get("name", ""))[:120],
                        bus_id=str(g.get("bus_id") or "")[:40], memory_used_mib=g.get("memory_used_mib"),
                        memory_total_mib=g.get("memory_total_mib"), utilization_pct=g.get("utilization_pct"),
                        ecc_uncorrected=g.get("ecc_uncorrected"))
                for g in data.get("gpus") or [] if isinstance(g, dict)]
        holders = [GpuHolder(pid=int(a["pid"]), uuid=str(a.get("uuid", ""))[:80], used_mib=a.get("used_mib"))
                   for a in data.get("apps") or [] if isinstance(a, dict) and isinstance(a.get("pid"), int)]
        return NodeInventory(node, "nvidia-ml-py", tuple(gpus), tuple(holders), xids, notes)
    return NodeInventory(node=node, notes=notes)


def busy(inventories: list[NodeInventory]) -> list[tuple[str, GpuHolder]]:
    return [(inv.node, h) for inv in inventories for h in inv.holders]


def summary(inv: NodeInventory) -> str:
    if not inv.source:
        return "no NVIDIA GPUs (nvidia-smi not found)" + (f"; {inv.notes[0]}" if inv.notes else "")
    parts = [f"{len(inv.gpus)} GPU(s) via {inv.source}"]
    for g in inv.gpus:
        mem = f"{g.memory_used_mib}/{g.memory_total_mib} MiB" if g.memory_total_mib is not None else "memory ?"
        ecc = f", ECC uncorrected {g.ecc_uncorrected}" if g.ecc_uncorrected else ""
        util = f", {g.utilization_pct}% busy" if g.utilization_pct is not None else ""
        parts.append(f"[{g.index}] {g.name} {mem}{util}{ecc}")
    if inv.holders:
        parts.append("held by " + ", ".join(f"pid {h.pid} {h.process}".strip() for h in inv.holders))
    if inv.xids:
        parts.append("recent Xid " + ", ".join(f"{x.code} on {x.bus}" for x in inv.xids[-5:]))
    return "; ".join(parts)
