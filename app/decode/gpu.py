"""The one decoder of a node's GPUs (workers/collect/nvidia.py's raw reply, in the collect op's gpu_evidence item
and the GPU tests' gpu_inventory reply) into the one GPU model (app/model/gpu.py): nvidia-smi CSV or `-q` text,
the processes holding GPUs, kernel Xid lines with their times, and NCCL RAS's answer in JSON (NCCL >= 2.28.7) or
text.

Pure, and everything here is remote text: values are type-checked and bounded, never interpreted as markup.
Formats: nvidia-smi's --query-gpu / --query-remapped-rows / --query-compute-apps CSV
(`--format=csv,noheader,nounits`, `[N/A]` and `[Not Supported]` for fields a GPU lacks) and its `-q` report; the
driver's Xid lines (the shapes _XID reads are listed above it); RAS's output as NCCL's
src/ras/client_support.cc writes it.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from typing import Any, Optional

from app.model import GpuHealth, GpuProcess, GpuXid, NodeGpuEvidence, RasComm, RasRank, RasView, bus_key

MAX_GPUS = 64
MAX_PROCESSES = 1024
MAX_XIDS = 64
MAX_COMMS = 256
MAX_RANKS = 4096  # per communicator
MAX_TEXT = 300
MAX_RAS_TEXT = 1 << 20  # the worker sends at most 256 KiB; an older or hostile one is cut here

# The driver's Xid line, as the open kernel modules print it (src/nvidia/src/kernel/gpu/rc/kernel_rc.c):
#   NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s
#   NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u): %d, ...               a MIG GPU instance's error
#   NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, ...   and its compute instance's
# Older drivers (the 3xx series and before) wrote the address without `PCI:` and the message without pid and name,
# sometimes on a line of its own: `NVRM: Xid (0000:03:00): 13, 0003 00000000 ...`, `NVRM: Xid (0000:01:00): 16,`.
# Whatever comes before `NVRM:` is the log's own (dmesg's `[ 1843.308145]` or `[Fri Aug 30 11:43:09 2024]`,
# syslog's `Aug 30 11:43:09 host kernel:`, /dev/kmsg's `3,4471,3023054882,-;`): searched, not matched. A `.N`
# function after the device (nvidia-smi's notation of the same GPU) is tolerated; no driver writes it.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
                  r"((?: GPU-C?I:\d{1,3}){0,2})\): (\d{1,4})(?:,\s*(.*))?$")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?")
_SYSLOG = re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d\d:\d\d:\d\d) ")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _s(v: Any, n: int = MAX_TEXT) -> str:
    return v[:n] if isinstance(v, str) else ""


def _i(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None

def _d(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _num(text: str) -> Optional[int]:
    text = text.strip()
    try:
        return int(float(text))
    except ValueError:
        return None  # [N/A], [Not Supported], N/A


def _yes(text: str) -> Optional[bool]:
    t = text.strip().lower()
    return True if t in ("yes", "1", "true") else False if t in ("no", "0", "false") else None


def parse_gpu_csv(text: str, fields: str) -> list[GpuHealth]:
    names = [f.strip() for f in fields.split(",")]
    out = []
    for line in text.splitlines()[:MAX_GPUS]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(names):
            continue
        row = dict(zip(names, parts))
        out.append(GpuHealth(index=_num(row.get("index", "")), bus_id=row.get("pci.bus_id", "")[:40],
                             uuid=row.get("uuid", "")[:80], name=row.get("name", "")[:120],
                             ecc_uncorrected_volatile=_num(row.get("ecc.errors.uncorrected.volatile.total", "")),
                             ecc_uncorrected_aggregate=_num(row.get("ecc.errors.uncorrected.aggregate.total", "")),
                             ecc_corrected_volatile=_num(row.get("ecc.errors.corrected.volatile.total", "")),
                             retired_pending=_yes(row.get("retired_pages.pending", "")),
                             memory_used_mib=_num(row.get("memory.used", "")),
                             memory_total_mib=_num(row.get("memory.total", "")),
                             utilization_pct=_num(row.get("utilization.gpu", "")),
                             temperature_c=_num(row.get("temperature.gpu", ""))))
    return out


def parse_apps_csv(text: str, fields: str) -> list[GpuProcess]:
    """`--query-compute-apps` rows: the processes holding GPUs (the last column, a process name, may hold commas)."""
    names = [f.strip() for f in fields.split(",")]
    out = []
    for line in text.splitlines()[:MAX_PROCESSES]:
        parts = [p.strip() for p in line.split(",", len(names) - 1)]
        if len(parts) != len(names):
            continue
        row = dict(zip(names, parts))
        pid = _num(row.get("pid", ""))
        if pid is None or pid <= 0:
            continue
        out.append(GpuProcess(pid=pid, uuid=row.get("gpu_uuid", "")[:80], used_mib=_num(row.get("used_memory", "")),
                              process=row.get("process_name", "")[:200]))
    return out


def add_remaps(gpus: list[GpuHealth], text: str, fields: str) -> list[GpuHealth]:
    """`--query-remapped-rows` rows joined to the GPUs by bus id."""
    names = [f.strip() for f in fields.split(",")]
    rows = {}
    for line in text.splitlines()[:MAX_GPUS]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == len(names):
            row = dict(zip(names, parts))
            rows[bus_key(row.get("gpu_bus_id", ""))] = row
    out = []
    for g in gpus:
        remap = rows.get(bus_key(g.bus_id))
        if remap is None:
            out.append(g)
            continue
        out.append(GpuHealth(**{**g.__dict__, "remap_correctable": _num(remap.get("remapped_rows.correctable", "")),
                                "remap_uncorrectable": _num(remap.get("remapped_rows.uncorrectable", "")),
                                "remap_pending": _yes(remap.get("remapped_rows.pending", "")),
                                "remap_failure": _yes(remap.get("remapped_rows.failure", ""))}))
    return out


def parse_query_text(text: str) -> list[GpuHealth]:
    """`nvidia-smi -q`: one `GPU 00000000:3B:00.0` section per GPU; the ECC, retired pages and remapped rows
    sections read by their indentation (names as the driver prints them)."""
    gpus: list[dict] = []
    path: list[tuple[int, str]] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        m = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", raw)
        if m:
            if len(gpus) >= MAX_GPUS:
                break
            gpus.append({"bus_id": m.group(1), "index": len(gpus)})
            path = []
            continue
        if not gpus:
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        key, sep, value = raw.strip().partition(":")
        key, value = key.strip(), value.strip()
        while path and path[-1][0] >= indent:
            path.pop()
        section = [p for _, p in path]
        g = gpus[-1]
        if not sep or not value:
            path.append((indent, key))
            continue
        where = "/".join(section)
        if key == "Product Name":
            g["name"] = value[:120]
        elif key == "GPU UUID":
            g["uuid"] = value[:80]
        elif key == "Minor Number" and _num(value) is not None:
            g["minor"] = _num(value)
        elif where.startswith("ECC Errors/Volatile") and "Uncorrectable" in key and "Parity" not in key:
            g["ecc_uv"] = (g.get("ecc_uv") or 0) + (_num(value) or 0) if _num(value) is not None else g.get("ecc_uv")
        elif where.startswith("ECC Errors/Aggregate") and "Uncorrectable" in key and "Parity" not in key:
            g["ecc_ua"] = (g.get("ecc_ua") or 0) + (_num(value) or 0) if _num(value) is not None else g.get("ecc_ua")
        elif where.startswith("ECC Errors/Volatile") and "Correctable" in key and "Uncorrectable" not in key:
            g["ecc_cv"] = (g.get("ecc_cv") or 0) + (_num(value) or 0) if _num(value) is not None else g.get("ecc_cv")
        elif where.startswith("Retired Pages") and key == "Pending Page Blacklist":
            g["retired_pending"] = _yes(value)
        elif where.startswith("Remapped Rows"):
            if key == "Correctable Error":
                g["remap_c"] = _num(value)
            elif key == "Uncorrectable Error":
                g["remap_u"] = _num(value)
            elif key == "Pending":
                g["remap_p"] = _yes(value)
            elif key == "Remapping Failure Occurred":
                g["remap_f"] = _yes(value)
    return [GpuHealth(index=g.get("minor", g["index"]), bus_id=g["bus_id"], uuid=g.get("uuid", ""),
                      name=g.get("name", ""), ecc_uncorrected_volatile=g.get("ecc_uv"),
                      ecc_uncorrected_aggregate=g.get("ecc_ua"), ecc_corrected_volatile=g.get("ecc_cv"),
                      retired_pending=g.get("retired_pending"), remap_correctable=g.get("remap_c"),
                      remap_uncorrectable=g.get("remap_u"), remap_pending=g.get("remap_p"),
                      remap_failure=g.get("remap_f")) for g in gpus]


def _line_time(line: str, timed: str, collected_at: float) -> tuple[Optional[float], str]:
    """(epoch seconds or None, the line from its NVRM part) for one kernel log line as its source writes it."""
    if timed == "epoch":
        head, _, rest = line.partition("\t")
        try:
            return float(head), rest
        except ValueError:
            return None, rest
    text = line.strip()
    m = _ISO.match(text)
    if m:
        stamp = m.group(1).replace(" ", "T")
        frac = (m.group(2) or "0")[:6].ljust(6, "0")
        tz = m.group(3) or ""
        try:
            dt = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").replace(microsecond=int(frac))
            if tz in ("", "Z"):
                dt = dt.replace(tzinfo=timezone.utc) if tz == "Z" else dt.astimezone()
            else:
                sign = 1 if tz[0] == "+" else -1
                hh, mm = int(tz[1:3]), int(tz[-2:])
                from datetime import timedelta
                dt = dt.replace(tzinfo=timezone(sign * timedelta(hours=hh, minutes=mm)))
            return dt.timestamp(), text
        except ValueError:
            return None, text
    m = _SYSLOG.match(text)
    if m and m.group(1) in _MONTHS:
        year = time.gmtime(collected_at).tm_year if collected_at else time.gmtime().tm_year
        try:
            dt = datetime.strptime(f"{year} {m.group(1)} {m.group(2)} {m.group(3)}", "%Y %b %d %H:%M:%S").astimezone()
            at = dt.timestamp()
            if collected_at and at > collected_at + 86400:  # a December line read in January
                at = dt.replace(year=year - 1).timestamp()
            return at, text
        except ValueError:
            return None, text
    return None, text  # `[ 1234.5678]` (seconds since boot) or no time at all


def parse_xids(lines: list, timed: str, collected_at: float) -> list[GpuXid]:
    """The Xid lines among these kernel log lines, each with its time as its source writes it (`timed`: iso,
    epoch, syslog; see workers/collect/nvidia.py xids()) and its age at collected_at (0: unknown)."""
    out = []
    for line in lines[-MAX_XIDS:]:
        if not isinstance(line, str):
            continue
        at, text = _line_time(line[:2000], timed, collected_at)
        m = _XID.search(text)
        if not m:
            continue
        age = round(collected_at - at, 1) if at is not None and collected_at else None
        out.append(GpuXid(xid=int(m.group(3)), bus_id=m.group(1).lower(), text=(m.group(4) or "").strip()[:MAX_TEXT],
                          at=round(at, 3) if at is not None else None, age_s=age, mig=m.group(2).strip()))
    return out


# -- NCCL RAS --------------------------------------------------------------------------------------------------

def parse_ras_json(text: str) -> tuple[str, list[RasComm], int]:
    """(nccl_version, communicators, timeouts) from `SET FORMAT json` output (NCCL >= 2.28.7)."""
    doc = json.loads(text[text.index("{"):]) if "{" in text else {}
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    comms = []
    for c in (doc.get("communicators") or [])[:MAX_COMMS]:
        if not isinstance(c, dict):
            continue
        ranks = []
        for r in (c.get("ranks") or [])[:MAX_RANKS]:
            if not isinstance(r, dict) or _i(r.get("rank")) is None:
                continue
            st = _d(r.get("status"))
            counts = _d(r.get("collective_counts"))
            errs = [f"{k} {st.get(k)}" for k in ("init_state", "async_error")
                    if _i(st.get(k)) not in (None, 0, 7 if k == "init_state" else 0)]
            ranks.append(RasRank(rank=r["rank"], host=_s(r.get("host"), 100), pid=_i(r.get("pid")),
                                 gpu=_i(r.get("nvml_dev")) if _i(r.get("nvml_dev")) is not None else _i(r.get("cuda_dev")),
                                 ops=tuple((_s(k, 40), v) for k, v in list(counts.items())[:16] if _i(v) is not None),
                                 error=", ".join(errs)))
        missing = []
        for r in (c.get("missing_ranks") or [])[:MAX_RANKS]:
            if not isinstance(r, dict) or _i(r.get("rank")) is None:
                continue
            st = _d(r.get("status"))
            missing.append(r["rank"])
            ranks.append(RasRank(rank=r["rank"], host=_s(r.get("host"), 100), pid=_i(r.get("pid")),
                                 gpu=_i(r.get("nvml_dev")) if _i(r.get("nvml_dev")) is not None else _i(r.get("cuda_dev")),
                                 missing=True, unresponsive=st.get("unresponsive") is True,
                                 dead=st.get("considered_dead") is True))
        comms.append(RasComm(hash=_s(c.get("hash"), 40), size=_i(c.get("size")), ranks=tuple(ranks),
                             missing=tuple(missing)))
    ras = _d(doc.get("ras"))
    return _s(doc.get("nccl_version"), 40), comms, _i(ras.get("timeouts_count")) or 0


_COMM_HEAD = re.compile(r"^#(\d+)-(\d+) \((?:0x)?([0-9a-fA-F]+)\) (\w+)")
_RANK_LINE = re.compile(r"^Rank (\d+)(?: has (?:launched up to operation (\d+)|not launched any operations))?"
                        r"(?: -- GPU (\S+) managed by process (\d+) on node (\S+))?")
_GROUP = re.compile(r"^(\d+) ranks have (?:launched up to operation (\d+)|not launched any operations)")
_DIFF = re.compile(r"^Communicator ranks have different (?:(\w+) )?(?:collective )?operation counts")
_PROCESS = re.compile(r"^Process (\d+) on node (\S+) managing GPUs? (\S+)")
_TABLE = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s*$")


def parse_ras_text(text: str) -> tuple[str, list[RasComm], list[str], int]:
    """(nccl_version, communicators, dead or missing processes, timeouts) from RAS's text output (NCCL 2.24+)."""
    version = ""
    m = re.search(r"NCCL version (\S+)", text)
    if m:
        version = m.group(1)[:40]
    comms: dict[str, dict] = {}
    table: dict[int, tuple[str, str]] = {}
    dead: list[str] = []
    timeouts = 0
    section = ""
    current: Optional[dict] = None
    collective = ""
    group: Optional[list] = None
    kind = ""  # what the current communicator entry lists: INCOMPLETE, STATUS, COUNTS
    mode = ""  # the job-wide Errors / Warnings entry being read: INCOMPLETE, DEAD, TIMEOUT
    for raw in text.splitlines()[:20000]:
        line = raw.strip()
        if not line:
            continue
        if line in ("Errors", "Warnings", "Job summary") or line.startswith("Communicators"):
            section, current, mode = line, None, ""
            continue
        t = _TABLE.match(raw)
        if t and section.startswith("Communicators"):
            table[int(t.group(1))] = (t.group(7), t.group(8))
            continue
        h = _COMM_HEAD.match(line)
        if h:
            key = h.group(3).lower()
            current = comms.setdefault(key, {"hash": "0x" + key.lstrip("0"), "ranks": {}, "missing": [],
                                             "groups": [], "status": table.get(int(h.group(1)), ("", ""))[0],
                                             "errors": set()})
            current["errors"].add(h.group(4))
            collective, group, kind = "", None, h.group(4)
            continue
        if line.startswith("Communicator ranks have different status"):
            kind = "STATUS"  # ranks listed under it differ in status, not in counts
            continue
        if line in ("INCOMPLETE", "DEAD", "TIMEOUT"):  # a job-wide entry of Errors / Warnings
            current, group, mode = None, None, line
            continue
        if current is None:
            p = _PROCESS.match(line)
            if p and mode in ("INCOMPLETE", "DEAD") and len(dead) < 256:
                what = "dead" if mode == "DEAD" else "unresponsive"
                dead.append(f"process {p.group(1)} on {p.group(2)} (GPU {p.group(3)}): {what}")
            tm = re.match(r"^Encountered (\d+) communication timeouts?", line)
            if tm:
                timeouts = int(tm.group(1))
            continue
        if line.startswith("The missing rank"):
            current["missing"] += [int(x) for x in re.findall(r"\d+", line.partition(":")[2])][:MAX_RANKS]
            continue
        d = _DIFF.match(line)
        if d:
            collective, group, kind = d.group(1) or "", None, "COUNTS"
            continue
        g = _GROUP.match(line)
        if g:
            group = [collective, int(g.group(2) or 0), int(g.group(1)), []]
            current["groups"].append(group)
            continue
        r = _RANK_LINE.match(line)
        if r:
            rank = int(r.group(1))
            pid = int(r.group(4)) if r.group(4) else None
            gpu = _num(r.group(3).split("/")[0]) if r.group(3) else None
            if kind == "STATUS":
                continue
            if kind == "INCOMPLETE":
                current["missing"].append(rank)
                current["ranks"][rank] = RasRank(rank=rank, host=(r.group(5) or "")[:100], pid=pid, gpu=gpu,
                                                 missing=True, unresponsive=True)
            elif r.group(2) is not None or "not launched" in line:  # a lone outlier: its own count
                ops = int(r.group(2) or 0)
                current["groups"].append([collective, ops, 1, [rank]])
                current["ranks"].setdefault(rank, RasRank(rank=rank, host=(r.group(5) or "")[:100], pid=pid,
                                                          gpu=gpu))
            elif group is not None:
                group[3].append(rank)
                current["ranks"].setdefault(rank, RasRank(rank=rank, host=(r.group(5) or "")[:100], pid=pid,
                                                          gpu=gpu))
    out = [RasComm(hash=c["hash"][:40], ranks=tuple(sorted(c["ranks"].values(), key=lambda x: x.rank))[:MAX_RANKS],
                   missing=tuple(sorted(set(c["missing"])))[:MAX_RANKS],
                   op_groups=tuple((col[:40], ops, n, tuple(rs[:MAX_RANKS])) for col, ops, n, rs in c["groups"][:256]),
                   status=c["status"][:20], errors=",".join(sorted(c["errors"]))[:60])
           for c in list(comms.values())[:MAX_COMMS]]
    return version, out, dead, timeouts


def ras_view(raw: Any) -> Optional[RasView]:
    if not isinstance(raw, dict):
        return None
    status = _s(raw.get("status"), 20)
    view = RasView(status=status, via=_s(raw.get("via"), 20), address=_s(raw.get("address"), 120),
                   format=_s(raw.get("format"), 10), error=_s(raw.get("error")))
    text = raw.get("text")
    if status != "ok" or not isinstance(text, str):
        return view
    text = text[:MAX_RAS_TEXT]
    try:
        if view.format == "json" or text.lstrip().startswith("{"):
            version, comms, timeouts = parse_ras_json(text)
            dead: list[str] = []
            fmt = "json"
        else:
            version, comms, dead, timeouts = parse_ras_text(text)
            fmt = "text"
    except (ValueError, KeyError, TypeError) as exc:
        return RasView(status="failed", via=view.via, address=view.address, format=view.format,
                       error=f"RAS's answer could not be read: {type(exc).__name__}: {str(exc)[:200]}")
    return RasView(status="ok", via=view.via, address=view.address, format=fmt, nccl_version=version,
                   comms=tuple(comms), dead=tuple(d[:MAX_TEXT] for d in dead), timeouts=timeouts)


def gpu_evidence(raw: Any) -> Optional[NodeGpuEvidence]:
    """The collect op's {"gpu_evidence": ...} item, or the gpu_inventory op's reply, as the model's
    NodeGpuEvidence; None for anything else."""
    if not isinstance(raw, dict):
        return None
    raw_at = raw.get("at")
    at = raw_at if isinstance(raw_at, (int, float)) and not isinstance(raw_at, bool) else 0.0
    smi = _d(raw.get("smi"))
    gpus: list[GpuHealth] = []
    processes: list[GpuProcess] = []
    if isinstance(smi.get("apps_csv"), str) and isinstance(smi.get("app_fields"), str):
        processes = parse_apps_csv(smi["apps_csv"], smi["app_fields"])
    if isinstance(smi.get("gpus_csv"), str) and isinstance(smi.get("gpu_fields"), str):
        gpus = parse_gpu_csv(smi["gpus_csv"], smi["gpu_fields"])
        if isinstance(smi.get("remap_csv"), str) and isinstance(smi.get("remap_fields"), str):
            gpus = add_remaps(gpus, smi["remap_csv"], smi["remap_fields"])
    elif isinstance(smi.get("query_text"), str):
        gpus = parse_query_text(smi["query_text"])
    timeout = smi.get("timeout")
    raw_lines = raw.get("xid_lines")
    lines = raw_lines if isinstance(raw_lines, list) else []
    notes = tuple(_s(n, 500) for n in (raw.get("notes") or [])[:10] if isinstance(n, str)) \
        if isinstance(raw.get("notes"), list) else ()
    return NodeGpuEvidence(
        why=_s(raw.get("why"), 200), at=float(at), smi=_s(smi.get("status"), 20), smi_via=_s(smi.get("via"), 20),
        smi_timeout=float(timeout) if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) else 0.0,
        smi_stuck=smi.get("stuck") is True, smi_error=_s(smi.get("error"), 500), gpus=tuple(gpus),
        processes=tuple(processes),
        xid_source=_s(raw.get("xid_source"), 100),
        xids=tuple(parse_xids(lines, _s(raw.get("xid_timed"), 10), float(at))),
        ras=ras_view(raw.get("ras")), notes=notes)
