"""GPU-side evidence for an NCCL/CUDA job, once per node per snapshot: kernel Xid lines, nvidia-smi's ECC and
row-remap counts, and NCCL's RAS view of the job's communicators (NCCL >= 2.24).

Raw text travels back (bounded, redacted like every message); app/gpu_evidence.py decodes it. Every source
runs under a deadline and nothing here may block on a hung driver: nvidia-smi runs in a child that is killed at
its deadline and, when even SIGKILL does not end it (a process stuck in the driver, state D), is left to a
reaper thread and reported as such. The collector itself runs in a thread the collect op waits for with a
deadline (workers/ops.py), so a source that hangs anyway costs that deadline, never the snapshot.

Collected only when the job is an NCCL/CUDA job (a rank maps libnccl or libcuda) or the user forces it
(--gpu-evidence on); with "off", or for a CPU job, nothing here runs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Sequence, Tuple

from workers import children
from workers.request import Request

MODES = ("auto", "on", "off")
SMI_TIMEOUT = 5.0  # nvidia-smi answers in well under a second on a healthy node
RAS_TIMEOUT = 8.0  # the whole RAS exchange; RAS itself is told to give up on a peer after RAS_PEER_TIMEOUT
RAS_PEER_TIMEOUT = 3
RAS_PORT = 28028
DMESG_TIMEOUT = 3.0
TOTAL_TIMEOUT = 15.0  # the collect op waits at most this long for the whole collector
MAX_SMI = 512 << 10  # bytes of nvidia-smi output kept (-q of 8 GPUs is ~100 KiB)
MAX_RAS = 256 << 10
MAX_KERNEL_LOG = 8 << 20  # bytes of kernel log scanned
XID_LINES = 64  # the newest Xid lines kept
MAPS_BYTES = 8 << 20
# A query that fails on an old driver (remapped_rows.* are newer than ECC fields) falls back to `nvidia-smi -q`.
GPU_FIELDS = ("index,pci.bus_id,uuid,name,ecc.errors.uncorrected.volatile.total,"
              "ecc.errors.uncorrected.aggregate.total,ecc.errors.corrected.volatile.total,"
              "retired_pages.pending")
REMAP_FIELDS = ("gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,"
                "remapped_rows.failure")
KERNEL_LOGS = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog")

# nvidia-smi that timed out at discovery (workers/collect/gpus.py): not asked again within this many seconds
SMI_HUNG_REUSE = 30.0
_smi_hung = {"at": 0.0, "timeout": 0.0, "stuck": False}
_smi_lock = threading.Lock()


def note_smi_timeout(timeout: float, stuck: bool) -> None:
    """Another query (discovery's GPU use) found nvidia-smi not answering: remember it for this pass."""
    with _smi_lock:
        _smi_hung.update(at=time.monotonic(), timeout=timeout, stuck=stuck)


def job_uses_gpu(pids: Sequence[int]) -> Optional[str]:
    """Why this is an NCCL/CUDA job (the first rank that maps libnccl or libcuda), or None."""
    for pid in pids:
        try:
            with open("/proc/%d/maps" % pid, "rb") as f:
                data = f.read(MAPS_BYTES)
        except OSError:
            continue
        for lib in (b"/libnccl.so", b"/libcuda.so"):
            if lib in data:
                return "pid %d maps %s" % (pid, lib[1:].decode())
    return None


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
# prints nvidia-smi's CSV forms, so the login side decodes one format.
_NVML_CHILD = r"""
import ctypes, json, sys
try:
    lib = ctypes.CDLL("libnvidia-ml.so.1")
except OSError as exc:
    print(json.dumps({"status": "missing", "error": str(exc)[:200]})); sys.exit(0)
class Pci(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]
def ok(rc): return rc == 0
if not ok(lib.nvmlInit_v2()):
    print(json.dumps({"status": "failed", "error": "nvmlInit failed"})); sys.exit(0)
n = ctypes.c_uint()
lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
gpus, remaps = [], []
for i in range(min(n.value, 64)):
    h = ctypes.c_void_p()
    if not ok(lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(h))):
        continue
    pci, uuid, name = Pci(), ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
    bus = pci.busId.decode() if ok(lib.nvmlDeviceGetPciInfo_v3(h, ctypes.byref(pci))) else ""
    lib.nvmlDeviceGetUUID(h, uuid, ctypes.c_uint(96))
    lib.nvmlDeviceGetName(h, name, ctypes.c_uint(96))
    def ecc(kind, counter):
        v = ctypes.c_ulonglong()
        return str(v.value) if ok(lib.nvmlDeviceGetTotalEccErrors(h, ctypes.c_int(kind), ctypes.c_int(counter),
                                                                   ctypes.byref(v))) else "[N/A]"
    gpus.append(", ".join([str(i), bus, uuid.value.decode(), name.value.decode(), ecc(1, 0), ecc(1, 1), ecc(0, 0),
                           "[N/A]"]))
    c, u, p, f = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
    if ok(lib.nvmlDeviceGetRemappedRows(h, ctypes.byref(c), ctypes.byref(u), ctypes.byref(p), ctypes.byref(f))):
        remaps.append(", ".join([bus, str(c.value), str(u.value), str(p.value), str(f.value)]))
lib.nvmlShutdown()
print(json.dumps({"status": "ok", "gpus_csv": "\n".join(gpus) + "\n", "remap_csv": "\n".join(remaps) + "\n"}))
"""


def _nvml(req: Request) -> Dict[str, Any]:
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
    return out


def _smi(req: Request, notes: List[str]) -> Dict[str, Any]:
    tool, _ = req.worker.tools.find("nvidia-smi")
    if tool is None:
        return _nvml(req)
    with _smi_lock:
        hung = dict(_smi_hung)
    if hung["at"] and time.monotonic() - hung["at"] < SMI_HUNG_REUSE:
        return {"status": "timeout", "timeout": hung["timeout"], "stuck": hung["stuck"], "asked": "discovery",
                "path": tool.path}
    out: Dict[str, Any] = {"path": tool.path, "timeout": SMI_TIMEOUT}
    res = run_bounded(req, [tool.path, "--query-gpu=" + GPU_FIELDS, "--format=csv,noheader,nounits"],
                      SMI_TIMEOUT, MAX_SMI)
    out["elapsed"] = res["elapsed"]
    if res["timed_out"]:
        out.update(status="timeout", stuck=res["stuck"])
        note_smi_timeout(SMI_TIMEOUT, res["stuck"])
        return out
    if res["rc"] == 0:
        out.update(status="ok", gpu_fields=GPU_FIELDS, gpus_csv=res["stdout"])
        rem = run_bounded(req, [tool.path, "--query-remapped-rows=" + REMAP_FIELDS, "--format=csv,noheader,nounits"],
                          SMI_TIMEOUT, MAX_SMI)
        if rem["timed_out"]:
            out.update(status="timeout", stuck=rem["stuck"])
            note_smi_timeout(SMI_TIMEOUT, rem["stuck"])
        elif rem["rc"] == 0:
            out.update(remap_fields=REMAP_FIELDS, remap_csv=rem["stdout"])
        return out
    # an older driver refuses a field: the full report has whatever this driver knows
    full = run_bounded(req, [tool.path, "-q"], SMI_TIMEOUT, MAX_SMI)
    if full["timed_out"]:
        out.update(status="timeout", stuck=full["stuck"])
        note_smi_timeout(SMI_TIMEOUT, full["stuck"])
    elif full["rc"] == 0:
        out.update(status="ok", query_text=full["stdout"])
    else:
        out.update(status="failed", error=(full["stderr"] or full["stdout"] or res["stderr"] or res["stdout"])[:500])
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
            if b"NVRM: Xid" not in rec:
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


def _xids(req: Request, notes: List[str]) -> Dict[str, Any]:
    """The newest Xid lines with their time: dmesg (ISO times), /dev/kmsg, the journal, then syslog files."""
    dmesg, _ = req.worker.tools.find("dmesg")
    if dmesg is not None:
        res = run_bounded(req, [dmesg.path, "--kernel", "--time-format", "iso"], DMESG_TIMEOUT, MAX_KERNEL_LOG)
        if res["rc"] == 0:
            lines = [ln for ln in res["stdout"].splitlines() if "NVRM: Xid" in ln]
            return {"xid_source": "dmesg", "xid_lines": lines[-XID_LINES:], "xid_timed": "iso"}
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
            lines = [ln for ln in res["stdout"].splitlines() if "NVRM: Xid" in ln]
            return {"xid_source": "journalctl -k", "xid_lines": lines[-XID_LINES:], "xid_timed": "iso"}
    for path in KERNEL_LOGS:
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - MAX_KERNEL_LOG))
                text = f.read(MAX_KERNEL_LOG).decode("utf-8", "replace")
        except OSError:
            continue
        return {"xid_source": path, "xid_lines": [ln for ln in text.splitlines() if "NVRM: Xid" in ln][-XID_LINES:],
                "xid_timed": "syslog"}
    notes.append("no kernel log could be read for Xid lines (dmesg, /dev/kmsg, journalctl, syslog files)")
    return {"xid_source": "", "xid_lines": [], "xid_timed": ""}


def ras_address(envs: Sequence[Optional[Dict[str, str]]]) -> Tuple[str, int, bool]:
    """Where this node's ranks' RAS listens (NCCL_RAS_ADDR, else localhost:28028), and whether RAS is off."""
    for env in envs:
        if not env:
            continue
        if env.get("NCCL_RAS_ENABLE", "").strip() == "0":
            return "", 0, False
        addr = env.get("NCCL_RAS_ADDR", "").strip()
        if addr:
            host, _, port = addr.rpartition(":")
            try:
                return (host.strip("[]") or "localhost"), int(port), True
            except ValueError:
                pass
    return "localhost", RAS_PORT, True


def _ras_socket(host: str, port: int, deadline: float) -> Dict[str, Any]:
    """NCCL's RAS client protocol (src/ras/client_support.cc): CLIENT PROTOCOL 2 / TIMEOUT n / SET FORMAT json
    (NCCL >= 2.28.7; an older one answers ERROR and the text form is read) / STATUS, then read until EOF."""
    out: Dict[str, Any] = {"via": "socket", "address": "%s:%d" % (host, port)}
    try:
        sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
    except OSError as exc:
        out["status"] = "refused" if isinstance(exc, ConnectionRefusedError) else "unreachable"
        out["error"] = str(exc)[:200]
        return out
    buf = b""

    def line() -> str:
        nonlocal buf
        while b"\n" not in buf:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            chunk = sock.recv(4096)
            if not chunk:
                raise EOFError("RAS closed the connection")
            buf += chunk
            if len(buf) > 4096:
                raise ValueError("RAS answered a line over 4 KiB")
        first, _, buf = buf.partition(b"\n")
        return first.decode("utf-8", "replace").strip()

    try:
        with sock:
            sock.sendall(b"CLIENT PROTOCOL 2\n")
            hello = line()
            if not hello.upper().startswith("SERVER PROTOCOL"):
                out.update(status="failed", error="not an NCCL RAS service: %r" % hello[:100])
                return out
            out["protocol"] = hello[len("SERVER PROTOCOL"):].strip()[:20]
            sock.sendall(b"TIMEOUT %d\n" % RAS_PEER_TIMEOUT)
            line()
            sock.sendall(b"SET FORMAT json\n")
            out["format"] = "json" if line().upper() == "OK" else "text"
            sock.sendall(b"STATUS\n")
            data = bytearray(buf)
            while len(data) < MAX_RAS:
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            else:
                out["truncated"] = True
            out.update(status="ok", text=bytes(data[:MAX_RAS]).decode("utf-8", "replace"))
    except socket.timeout:
        out.update(status="timeout", error="RAS did not answer within %gs" % RAS_TIMEOUT)
    except (OSError, EOFError, ValueError) as exc:
        out.update(status="failed", error=str(exc)[:200])
    return out


def _ras(req: Request, host: str, port: int) -> Dict[str, Any]:
    """The `ncclras` client when the node has it (json first, text from an NCCL older than 2.28.7), else the
    RAS socket directly."""
    tool, _ = req.worker.tools.find("ncclras")
    if tool is None:
        return _ras_socket(host, port, time.monotonic() + RAS_TIMEOUT)
    base = [tool.path, "-h", host, "-p", str(port), "-t", str(RAS_PEER_TIMEOUT)]
    out: Dict[str, Any] = {"via": "ncclras", "address": "%s:%d" % (host, port)}
    for fmt in ("json", "text"):
        res = run_bounded(req, base + (["-f", fmt] if fmt == "json" else []), RAS_TIMEOUT, MAX_RAS)
        if res["timed_out"]:
            out.update(status="timeout", error="ncclras did not answer within %gs" % RAS_TIMEOUT)
            return out
        if res["rc"] == 0 and res["stdout"].strip():
            out.update(status="ok", format=fmt, text=res["stdout"])
            return out
        err = (res["stderr"] or res["stdout"]).strip()
        if "Failed to connect" in err or "Connecting to" in err:
            out.update(status="refused", error=err[:300])
            return out
        out.update(status="failed", error=err[:300])
    return out


def collect(req: Request, pids: Sequence[int], envs: Sequence[Optional[Dict[str, str]]], mode: str,
            ras: bool, out: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The node's GPU evidence, or None when the job is not an NCCL/CUDA job (mode auto) or mode is off. `out`
    is filled as each source answers (finish() sends what is there if the whole takes too long); NCCL's RAS is
    asked in a thread of its own beside nvidia-smi and the kernel log."""
    if mode == "off" or not pids and mode != "on":
        return None
    why = job_uses_gpu(pids) if mode == "auto" else "--gpu-evidence on"
    if why is None:
        return None
    out = {} if out is None else out
    notes: List[str] = []
    out.update(why=why, at=round(time.time(), 3), notes=notes)
    host, port, enabled = ras_address(envs)
    asking = None
    if not ras:
        out["ras"] = {"status": "skipped"}
    elif not enabled:
        out["ras"] = {"status": "disabled", "error": "NCCL_RAS_ENABLE=0 in the ranks' environment"}
    else:
        out["ras"] = {"status": "timeout", "error": "RAS did not answer within %gs" % RAS_TIMEOUT}

        def ask() -> None:
            out["ras"] = _ras(req, host, port)

        asking = threading.Thread(target=ask, name="gpu-ras-%d" % req.id, daemon=True)
        asking.start()
    out["smi"] = _smi(req, notes)
    out.update(_xids(req, notes))
    if asking is not None:
        asking.join(RAS_TIMEOUT + 2.0)  # _ras ends by its own deadline; this one only guards against a bug
    return out


def start(req: Request, pids: Sequence[int], envs: Sequence[Optional[Dict[str, str]]], mode: str,
          ras: bool) -> Tuple[threading.Thread, Dict[str, Any]]:
    """collect() in a thread of its own (the dumps go on meanwhile); the box holds its result, or what it had
    when finish() stopped waiting, or the error."""
    box: Dict[str, Any] = {"partial": {}}

    def work() -> None:
        try:
            box["data"] = collect(req, pids, envs, mode, ras, box["partial"])
        except Exception as exc:  # a bug here must not lose the snapshot: it becomes a note
            box["data"] = {"why": "", "notes": ["GPU evidence failed: %s: %s" % (type(exc).__name__, exc)]}

    t = threading.Thread(target=work, name="gpu-evidence-%d" % req.id, daemon=True)
    t.start()
    return t, box


def finish(thread: threading.Thread, box: Dict[str, Any], started: float) -> Optional[Dict[str, Any]]:
    """The collector's result, waiting at most until TOTAL_TIMEOUT after it started; past that, what it had."""
    thread.join(max(0.0, TOTAL_TIMEOUT - (time.monotonic() - started)))
    if thread.is_alive():
        partial = dict(box["partial"])
        partial["notes"] = list(partial.get("notes") or []) + [
            "GPU evidence did not finish within %gs (a GPU tool hangs): what answered is kept" % TOTAL_TIMEOUT]
        partial["incomplete"] = True
        return partial
    return box.get("data")
