"""The one reader of a node's NVIDIA GPUs: nvidia-smi's CSV (or the same CSV from NVML, through ctypes in a
child, where nvidia-smi is missing), its `-q` report when the driver refuses a field, the processes that hold
GPUs, and the kernel's Xid lines with their time.

Used by the investigation's GPU evidence (workers/collect/gpu_evidence.py, the collect op), by the GPU tests'
look at a node before they run (the gpu_inventory op, workers/ops_gpu.py) and, for its deadline and its memory
of a hung nvidia-smi, by discovery's GPU use per rank (workers/collect/gpus.py). Raw text travels back:
app/decode/gpu.py decodes it into the one GPU model (app/model/gpu.py).

Nothing here may block on a hung driver: nvidia-smi and the NVML child run under a deadline and, when even
SIGKILL does not end them (a process stuck in the driver, state D), are left to a reaper thread and reported
as such; one that timed out is not asked again for SMI_HUNG_REUSE seconds.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Sequence

from workers import children
from workers.request import Request

SMI_TIMEOUT = 5.0  # nvidia-smi answers in well under a second on a healthy node
DMESG_TIMEOUT = 3.0
MAX_SMI = 512 << 10  # bytes of nvidia-smi output kept (-q of 8 GPUs is ~100 KiB)
MAX_KERNEL_LOG = 8 << 20  # bytes of kernel log scanned
XID_LINES = 64  # the newest Xid lines kept
# One query for everyone: identity, the error counters the investigation reads, and the memory and load the GPU
# tests show. A query that fails (an old driver refuses a field) falls back to `nvidia-smi -q`; the row-remap
# fields (newer than the rest) are a query of their own.
GPU_FIELDS = ("index,pci.bus_id,uuid,name,ecc.errors.uncorrected.volatile.total,"
              "ecc.errors.uncorrected.aggregate.total,ecc.errors.corrected.volatile.total,"
              "retired_pages.pending,memory.used,memory.total,utilization.gpu,temperature.gpu")
REMAP_FIELDS = ("gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,"
                "remapped_rows.failure")
APP_FIELDS = "pid,gpu_uuid,used_memory,process_name"  # the processes holding GPUs (asked by the GPU tests)
KERNEL_LOGS = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog")
XID_MARK = "NVRM: Xid"  # what the driver's Xid lines carry (app/decode/gpu.py reads the rest)

# nvidia-smi that timed out (here or at discovery, workers/collect/gpus.py): not asked again within this many
# seconds, so a hung driver costs one deadline per pass, not one per query
SMI_HUNG_REUSE = 30.0
_smi_hung = {"at": 0.0, "timeout": 0.0, "stuck": False}
_smi_lock = threading.Lock()


def note_smi_timeout(timeout: float, stuck: bool) -> None:
    """A query found nvidia-smi not answering: remember it for this pass."""
    with _smi_lock:
        _smi_hung.update(at=time.monotonic(), timeout=timeout, stuck=stuck)


def run_bounded(req: Request, argv: Sequence[str], timeout: float, max_stdout: int) -> Dict[str, Any]:
    """Run argv under a hard deadline without ever waiting on a child that SIGKILL cannot end (one stuck in
    a driver call): such a child is handed to a reaper thread and reported `stuck`."""
    start = time.monotonic()
    out: Dict[str, Any] = {"rc": None, "stdout": "", "stderr": "", "timed_out": False, "stuck": False,
                           "elapsed": 0.0}
    try:
        proc = req.worker.children.spawn(argv, owner=req)
    except OSError as exc:
        out["stderr"] = "cannot start: %s" % exc
        return out
    res = children.Result()
    try:
        children._pump(proc, res, start, timeout, None, 0, max_stdout, 64 << 10)
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    if res.timed_out or proc.poll() is None:
        out["timed_out"] = out["timed_out"] or res.timed_out or time.monotonic() - start >= timeout
        children.kill_group(proc)
    try:
        out["rc"] = proc.wait(timeout=max(0.2, min(1.0, timeout - (time.monotonic() - start))))
    except subprocess.TimeoutExpired:
        children.kill_group(proc)
        try:
            out["rc"] = proc.wait(timeout=1.0)
            out["timed_out"] = True
        except subprocess.TimeoutExpired:
            out["timed_out"] = out["stuck"] = True  # SIGKILLed and still there: in the kernel, state D

            def reap() -> None:
                proc.wait()
                req.worker.children.forget(proc)

            threading.Thread(target=reap, name="reap-%d" % proc.pid, daemon=True).start()
            out["elapsed"] = round(time.monotonic() - start, 3)
            out["stdout"] = res.stdout.decode("utf-8", "replace")
            return out
    req.worker.children.forget(proc)
    out["stdout"] = res.stdout.decode("utf-8", "replace")
    out["stderr"] = res.stderr.decode("utf-8", "replace")[:2000]
    out["elapsed"] = round(time.monotonic() - start, 3)
    return out


# NVML through ctypes, for a node with the driver's libnvidia-ml but no nvidia-smi. It runs in a child python
# (killed at its deadline like nvidia-smi): an NVML call into a hung driver must never block the worker. It
# prints nvidia-smi's CSV forms (GPU_FIELDS, REMAP_FIELDS and APP_FIELDS, in that order of columns), so the login
# side decodes one format. Signatures and structures as in nvml.h; a call the library lacks leaves its columns
# [N/A]. Processes: nvmlDeviceGetComputeRunningProcesses_v3 (or _v2, the same nvmlProcessInfo_t of pid, memory,
# GPU and compute instance), else the unversioned call with the first structure (pid, memory).
_NVML_CHILD = r"""
import ctypes, json, sys
try:
    lib = ctypes.CDLL("libnvidia-ml.so.1")
except OSError as exc:
    print(json.dumps({"status": "missing", "error": str(exc)[:200]})); sys.exit(0)
C_UINT, C_ULL = ctypes.c_uint, ctypes.c_ulonglong
class Pci(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", C_UINT), ("bus", C_UINT),
                ("device", C_UINT), ("pciDeviceId", C_UINT), ("pciSubSystemId", C_UINT),
                ("busId", ctypes.c_char * 32)]
class Mem(ctypes.Structure):
    _fields_ = [("total", C_ULL), ("free", C_ULL), ("used", C_ULL)]
class Util(ctypes.Structure):
    _fields_ = [("gpu", C_UINT), ("memory", C_UINT)]
class Proc1(ctypes.Structure):
    _fields_ = [("pid", C_UINT), ("usedGpuMemory", C_ULL)]
class Proc2(ctypes.Structure):
    _fields_ = [("pid", C_UINT), ("usedGpuMemory", C_ULL), ("gpuInstanceId", C_UINT), ("computeInstanceId", C_UINT)]
NA = "[N/A]"
def call(name, *args):
    try:
        return getattr(lib, name)(*args) == 0
    except AttributeError:  # an older library without this call
        return False
def comm(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            arg0 = f.read(4096).split(b"\0")[0]
        return arg0.decode("utf-8", "replace").replace(",", " ")
    except OSError:
        return ""
if not call("nvmlInit_v2"):
    print(json.dumps({"status": "failed", "error": "nvmlInit failed"})); sys.exit(0)
n = C_UINT()
call("nvmlDeviceGetCount_v2", ctypes.byref(n))
gpus, remaps, apps = [], [], []
for i in range(min(n.value, 64)):
    h = ctypes.c_void_p()
    if not call("nvmlDeviceGetHandleByIndex_v2", C_UINT(i), ctypes.byref(h)):
        continue
    pci, uuid, name = Pci(), ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
    bus = pci.busId.decode() if call("nvmlDeviceGetPciInfo_v3", h, ctypes.byref(pci)) else ""
    call("nvmlDeviceGetUUID", h, uuid, C_UINT(96))
    call("nvmlDeviceGetName", h, name, C_UINT(96))
    def ecc(kind, counter):
        v = C_ULL()
        return str(v.value) if call("nvmlDeviceGetTotalEccErrors", h, ctypes.c_int(kind), ctypes.c_int(counter),
                                    ctypes.byref(v)) else NA
    mem, util, temp = Mem(), Util(), C_UINT()
    has_mem = call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(mem))
    has_util = call("nvmlDeviceGetUtilizationRates", h, ctypes.byref(util))
    has_temp = call("nvmlDeviceGetTemperature", h, ctypes.c_int(0), ctypes.byref(temp))
    gpus.append(", ".join([str(i), bus, uuid.value.decode(), name.value.decode(), ecc(1, 0), ecc(1, 1), ecc(0, 0), NA,
                           str(mem.used >> 20) if has_mem else NA, str(mem.total >> 20) if has_mem else NA,
                           str(util.gpu) if has_util else NA, str(temp.value) if has_temp else NA]))
    c, u, p, f = C_UINT(), C_UINT(), C_UINT(), C_UINT()
    if call("nvmlDeviceGetRemappedRows", h, ctypes.byref(c), ctypes.byref(u), ctypes.byref(p), ctypes.byref(f)):
        remaps.append(", ".join([bus, str(c.value), str(u.value), str(p.value), str(f.value)]))
    for fn, kind in (("nvmlDeviceGetComputeRunningProcesses_v3", Proc2), ("nvmlDeviceGetComputeRunningProcesses_v2",
                     Proc2), ("nvmlDeviceGetComputeRunningProcesses", Proc1)):
        if not hasattr(lib, fn):
            continue
        count, infos = C_UINT(64), (kind * 64)()
        if call(fn, h, ctypes.byref(count), infos):
            for info in infos[:min(count.value, 64)]:
                apps.append(", ".join([str(info.pid), uuid.value.decode(), str(info.usedGpuMemory >> 20),
                                       comm(info.pid)]))
        break
call("nvmlShutdown")
print(json.dumps({"status": "ok", "gpus_csv": "".join(g + "\n" for g in gpus),
                  "remap_csv": "".join(r + "\n" for r in remaps), "apps_csv": "".join(a + "\n" for a in apps)}))
"""


def _nvml(req: Request, apps: bool) -> Dict[str, Any]:
    import json
    import sys

    res = run_bounded(req, [sys.executable, "-I", "-S", "-c", _NVML_CHILD], SMI_TIMEOUT, MAX_SMI)
    out: Dict[str, Any] = {"via": "nvml", "timeout": SMI_TIMEOUT, "elapsed": res["elapsed"]}
    if res["timed_out"]:
        out.update(status="timeout", stuck=res["stuck"])
        return out
    try:
        got = json.loads(res["stdout"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        out.update(status="failed", error=(res["stderr"] or res["stdout"])[:300])
        return out
    if not isinstance(got, dict) or got.get("status") != "ok":
        return {"status": "missing"} if isinstance(got, dict) and got.get("status") == "missing" else \
            dict(out, status="failed", error=str(got.get("error", ""))[:300] if isinstance(got, dict) else "")
    out.update(status="ok", gpu_fields=GPU_FIELDS, gpus_csv=str(got.get("gpus_csv", "")),
               remap_fields=REMAP_FIELDS, remap_csv=str(got.get("remap_csv", "")))
    if apps:
        out.update(app_fields=APP_FIELDS, apps_csv=str(got.get("apps_csv", "")))
    return out


def smi(req: Request, notes: List[str], apps: bool = False) -> Dict[str, Any]:
    """The node's GPUs as nvidia-smi (or NVML) reports them, raw; with apps, also the processes holding them.
    "status": ok, timeout, failed or missing (neither nvidia-smi nor libnvidia-ml here)."""
    tool, _ = req.worker.tools.find("nvidia-smi")
    if tool is None:
        return _nvml(req, apps)
    with _smi_lock:
        hung = dict(_smi_hung)
    if hung["at"] and time.monotonic() - hung["at"] < SMI_HUNG_REUSE:
        return {"status": "timeout", "via": "nvidia-smi", "timeout": hung["timeout"], "stuck": hung["stuck"],
                "asked": "discovery", "path": tool.path}
    out: Dict[str, Any] = {"via": "nvidia-smi", "path": tool.path, "timeout": SMI_TIMEOUT}

    def query(args: Sequence[str]) -> Optional[Dict[str, Any]]:
        """One run, or None (and out says why) when it timed out: the driver hangs, ask nothing more."""
        res = run_bounded(req, [tool.path] + list(args), SMI_TIMEOUT, MAX_SMI)
        out["elapsed"] = round(out.get("elapsed", 0.0) + res["elapsed"], 3)
        if res["timed_out"]:
            out.update(status="timeout", stuck=res["stuck"])
            note_smi_timeout(SMI_TIMEOUT, res["stuck"])
            return None
        return res

    res = query(["--query-gpu=" + GPU_FIELDS, "--format=csv,noheader,nounits"])
    if res is None:
        return out
    if res["rc"] == 0:
        out.update(status="ok", gpu_fields=GPU_FIELDS, gpus_csv=res["stdout"])
    else:  # an older driver refuses a field: the full report has whatever this driver knows
        full = query(["-q"])
        if full is None:
            return out
        if full["rc"] != 0:
            out.update(status="failed",
                       error=(full["stderr"] or full["stdout"] or res["stderr"] or res["stdout"])[:500])
            return out
        out.update(status="ok", query_text=full["stdout"])
    if "gpus_csv" in out:
        rem = query(["--query-remapped-rows=" + REMAP_FIELDS, "--format=csv,noheader,nounits"])
        if rem is None:
            return out
        if rem["rc"] == 0:
            out.update(remap_fields=REMAP_FIELDS, remap_csv=rem["stdout"])
    if apps:
        held = query(["--query-compute-apps=" + APP_FIELDS, "--format=csv,noheader,nounits"])
        if held is None:
            return out
        if held["rc"] == 0:
            out.update(app_fields=APP_FIELDS, apps_csv=held["stdout"])
        else:
            notes.append("nvidia-smi --query-compute-apps failed: %s" % (held["stderr"] or held["stdout"])[:300])
    return out


def _uptime() -> Optional[float]:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _kmsg(notes: List[str]) -> Optional[Dict[str, Any]]:
    """/dev/kmsg read without blocking: one record per read, kernel facility only (a line written from user
    space into /dev/kmsg is not the driver's), with its time since boot turned into epoch seconds."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        notes.append("/dev/kmsg is not readable (%s)" % exc.strerror)
        return None
    lines: List[str] = []
    now, up = time.time(), _uptime()
    total = 0
    try:
        while total < MAX_KERNEL_LOG:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: the record was overwritten while reading; go on with the next
                    continue
                break
            if not rec:
                break
            total += len(rec)
            if XID_MARK.encode() not in rec:
                continue
            head, _, text = rec.decode("utf-8", "replace").partition(";")
            fields = head.split(",")
            try:
                prio, usec = int(fields[0]), int(fields[2])
            except (ValueError, IndexError):
                continue
            if prio >> 3 != 0:  # not the kernel's facility
                continue
            at = round(now - up + usec / 1e6, 3) if up is not None else None
            lines.append("%s\t%s" % (at if at is not None else "", text.split("\n", 1)[0]))
    finally:
        os.close(fd)
    return {"xid_source": "/dev/kmsg", "xid_lines": lines[-XID_LINES:], "xid_timed": "epoch"}


def _dmesg_plain(req: Request, path: str) -> Optional[Dict[str, Any]]:
    """`dmesg` without options, for one that knows neither --kernel nor --time-format (busybox in a container,
    util-linux before 2.26): its `[seconds since boot]` turned into epoch seconds as /dev/kmsg's are. It cannot
    keep to the kernel's own records: a line written into /dev/kmsg from user space is read too."""
    res = run_bounded(req, [path], DMESG_TIMEOUT, MAX_KERNEL_LOG)
    if res["rc"] != 0:
        return None
    now, up = time.time(), _uptime()
    lines: List[str] = []
    for line in res["stdout"].splitlines():
        if XID_MARK not in line:
            continue
        at = ""
        if line.startswith("[") and "]" in line:
            stamp, _, rest = line[1:].partition("]")
            try:
                secs = float(stamp.strip())
            except ValueError:
                secs = None  # `dmesg -T`-like times or none: the decoder reads the line as it is
            if secs is not None:
                line = rest.lstrip()
                at = str(round(now - up + secs, 3)) if up is not None else ""
        lines.append("%s\t%s" % (at, line))
    return {"xid_source": "dmesg", "xid_lines": lines[-XID_LINES:], "xid_timed": "epoch"}


def xids(req: Request, notes: List[str]) -> Dict[str, Any]:
    """The newest Xid lines with their time: dmesg (ISO times; else plain), /dev/kmsg, the journal, then the
    syslog files. "xid_timed" says how the lines carry their time: iso, epoch (`<seconds>\\t<line>`), syslog."""
    dmesg, _ = req.worker.tools.find("dmesg")
    if dmesg is not None:
        res = run_bounded(req, [dmesg.path, "--kernel", "--time-format", "iso"], DMESG_TIMEOUT, MAX_KERNEL_LOG)
        if res["rc"] == 0:
            lines = [ln for ln in res["stdout"].splitlines() if XID_MARK in ln]
            return {"xid_source": "dmesg", "xid_lines": lines[-XID_LINES:], "xid_timed": "iso"}
        plain = None if res["timed_out"] else _dmesg_plain(req, dmesg.path)
        if plain is not None:
            return plain
        why = "did not answer within %gs" % DMESG_TIMEOUT if res["timed_out"] else \
            (res["stderr"].strip() or "exit %s" % res["rc"])[:200]
        notes.append("dmesg: %s" % why)
    kmsg = _kmsg(notes)
    if kmsg is not None:
        return kmsg
    journal, _ = req.worker.tools.find("journalctl")
    if journal is not None:
        res = run_bounded(req, [journal.path, "-k", "-q", "--no-pager", "-o", "short-iso", "-n", "20000"],
                          DMESG_TIMEOUT, MAX_KERNEL_LOG)
        if res["rc"] == 0:
            lines = [ln for ln in res["stdout"].splitlines() if XID_MARK in ln]
            return {"xid_source": "journalctl -k", "xid_lines": lines[-XID_LINES:], "xid_timed": "iso"}
    for path in KERNEL_LOGS:
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - MAX_KERNEL_LOG))
                text = f.read(MAX_KERNEL_LOG).decode("utf-8", "replace")
        except OSError:
            continue
        return {"xid_source": path, "xid_lines": [ln for ln in text.splitlines() if XID_MARK in ln][-XID_LINES:],
                "xid_timed": "syslog"}
    notes.append("no kernel log could be read for Xid lines (dmesg, /dev/kmsg, journalctl, syslog files)")
    return {"xid_source": "", "xid_lines": [], "xid_timed": ""}


def read(req: Request, apps: bool = False) -> Dict[str, Any]:
    """Everything this module reads, in the shape of the collect op's gpu_evidence item without "why" and "ras"
    (app/decode/gpu.py decodes both): {"at", "smi": smi(), "xid_source", "xid_lines", "xid_timed", "notes"}."""
    notes: List[str] = []
    out: Dict[str, Any] = {"at": round(time.time(), 3), "notes": notes}
    out["smi"] = smi(req, notes, apps=apps)
    out.update(xids(req, notes))
    return out
