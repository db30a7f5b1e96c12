"""This node's GPUs: model, memory, utilisation, ECC errors, holders, and recent Xid errors from the kernel log.

nvidia-smi's CSV output travels back raw (parsed on the login side); without nvidia-smi, nvidia-ml-py is used
when importable. Each query runs under a deadline: a GPU that fell off the bus can make nvidia-smi hang.
"""

from __future__ import annotations

from typing import Any, Dict, List

from workers.request import Request

TIMEOUT = 8.0
GPU_FIELDS = ("index,uuid,name,pci.bus_id,memory.used,memory.total,utilization.gpu,"
              "ecc.errors.uncorrected.volatile.total,temperature.gpu")
APP_FIELDS = "pid,gpu_uuid,used_memory,process_name"
XID_LINES = 50  # the most recent Xid lines kept
KERNEL_LOGS = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog")


def _nvidia_smi(req: Request, path: str, notes: List[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"source": "nvidia-smi", "gpu_fields": GPU_FIELDS, "app_fields": APP_FIELDS}
    for key, args in (("gpus_csv", ["--query-gpu=" + GPU_FIELDS, "--format=csv,noheader,nounits"]),
                      ("apps_csv", ["--query-compute-apps=" + APP_FIELDS, "--format=csv,noheader,nounits"])):
        res = req.run([path] + args, TIMEOUT, max_stdout=1 << 20)
        text = res.stdout.decode("utf-8", "replace")
        if res.timed_out:
            notes.append("nvidia-smi %s did not answer within %gs (a GPU may have fallen off the bus)"
                         % (args[0].split("=")[0], TIMEOUT))
        elif res.returncode != 0:
            notes.append("nvidia-smi %s failed: %s" % (args[0].split("=")[0],
                                                       (res.stderr.decode("utf-8", "replace") or text)[:300]))
        out[key] = text if res.returncode == 0 else ""
    return out


def _nvml(notes: List[str]) -> Dict[str, Any]:
    """nvidia-ml-py (pynvml) when nvidia-smi is not on PATH; the same facts as structured data."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return {"source": None}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver: the library loads but cannot talk to a GPU
        notes.append("nvidia-ml-py could not initialise NVML: %s" % exc)
        return {"source": None}
    gpus, apps = [], []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpu: Dict[str, Any] = {"index": i, "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                                   "name": _text(pynvml.nvmlDeviceGetName(h)),
                                   "memory_used_mib": mem.used // (1 << 20), "memory_total_mib": mem.total // (1 << 20)}
            for key, call in (("utilization_pct", lambda h=h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                              ("ecc_uncorrected", lambda h=h: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 1)),
                              ("bus_id", lambda h=h: _text(pynvml.nvmlDeviceGetPciInfo(h).busId))):
                try:
                    gpu[key] = call()
                except Exception:
                    gpu[key] = None  # not supported on this model
            gpus.append(gpu)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                apps.append({"pid": p.pid, "uuid": gpu["uuid"],
                             "used_mib": (p.usedGpuMemory or 0) // (1 << 20) if p.usedGpuMemory else None})
    except Exception as exc:
        notes.append("nvidia-ml-py query failed: %s" % exc)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return {"source": "nvidia-ml-py", "gpus": gpus, "apps": apps}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _xid_lines(req: Request, notes: List[str]) -> Dict[str, Any]:
    """Recent `NVRM: Xid` lines: dmesg when the kernel lets us read it, else the syslog files."""
    dmesg, _ = req.worker.tools.find("dmesg")
    if dmesg is not None:
        res = req.run([dmesg.path], TIMEOUT, max_stdout=16 << 20)
        if res.returncode == 0:
            lines = [ln for ln in res.stdout.decode("utf-8", "replace").splitlines() if "NVRM: Xid" in ln]
            return {"xid_source": "dmesg", "xid_lines": lines[-XID_LINES:]}
        why = res.stderr.decode("utf-8", "replace").strip()[:200]
        notes.append("dmesg is not readable here (%s); looked in the syslog files instead" % (why or "failed"))
    for path in KERNEL_LOGS:
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - (8 << 20)))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        return {"xid_source": path, "xid_lines": [ln for ln in text.splitlines() if "NVRM: Xid" in ln][-XID_LINES:]}
    return {"xid_source": "", "xid_lines": []}


def inventory(req: Request) -> Dict[str, Any]:
    notes: List[str] = []
    tool, _ = req.worker.tools.find("nvidia-smi")
    data = _nvidia_smi(req, tool.path, notes) if tool is not None else _nvml(notes)
    if data.get("source"):
        data.update(_xid_lines(req, notes))
    data["notes"] = notes
    return data
