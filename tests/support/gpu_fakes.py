"""FAKE GPU tools for the GPU evidence tests: nvidia-smi, dmesg and ncclras that print RECORDED outputs.

There is no GPU, NVIDIA driver or NCCL job here, so a GPU fault (an Xid in the kernel log, ECC errors, an
nvidia-smi that never answers, NCCL RAS naming a rank) cannot be produced for real. These executables stand in
for the node's own tools: placed first on a worker's PATH (or in a test cluster node's /usr/local/bin), they
print the recorded outputs of tests/data/gpu/ (see its README for where each format comes from). Everything
else in the path (the worker finding and running them under deadlines, the redaction, the decoding, the
analysis, the reports) is the real code.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Dict, List, Optional, Sequence

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"
FAKE_MARK = "HANGSCOPE_FAKE_GPU_TOOL"  # in each fake's source: a test can find its processes by it


def recorded(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def _write(bindir: Path, name: str, source: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text(source, encoding="utf-8")
    path.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return path


def _python_fake(what: str, body: str, data: Dict[str, str]) -> str:
    return ("#!/usr/bin/env python3\n"
            f"# FAKE {what} ({FAKE_MARK}): prints recorded output from tests/data/gpu; no GPU here\n"
            "import sys, time, datetime\n"
            f"DATA = {json.dumps(data)}\n" + body)


_SMI_BODY = '''
args = sys.argv[1:]
if DATA.get("hang"):
    time.sleep(3600)  # a GPU fallen off the bus: nvidia-smi never answers
a = " ".join(args)
if "--query-compute-apps" in a:  # as many columns as asked: discovery's 3, the GPU tests' 4 (process_name)
    asked = len(a.split("--query-compute-apps=")[1].split()[0].split(","))
    for line in DATA.get("apps", "").splitlines():
        print(", ".join(x.strip() for x in line.split(",", 3)[:asked]))
elif "--query-remapped-rows" in a:
    sys.stdout.write(DATA.get("remap", ""))
elif "--query-gpu=index,uuid,name" in a:  # discovery's own query (workers/collect/gpus.py)
    for line in DATA.get("gpus", "").splitlines():
        p = [x.strip() for x in line.split(",")]
        print("%s, %s, %s" % (p[0], p[2], p[3]))
elif "--query-gpu" in a:
    sys.stdout.write(DATA.get("gpus", ""))
elif "-q" in args:
    sys.stdout.write(DATA.get("q", ""))
else:
    print("fake nvidia-smi: unexpected arguments %r" % args, file=sys.stderr)
    sys.exit(2)
'''

_DMESG_BODY = '''
now = time.time()
if DATA.get("busybox"):  # busybox's dmesg (a container's): no options known, `[seconds since boot]` before each line
    if sys.argv[1:]:
        print("dmesg: unrecognized option '%s'" % sys.argv[1], file=sys.stderr)
        sys.exit(1)
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    for line in DATA["lines"].splitlines():
        if line.startswith("@AGE:"):
            age, rest = line[5:].split("@", 1)
            line = "[%12.6f]%s" % (max(0.0, up - float(age)), rest)
        print(line)
    sys.exit(0)
for line in DATA["lines"].splitlines():
    if line.startswith("@AGE:"):
        age, rest = line[5:].split("@", 1)
        t = datetime.datetime.fromtimestamp(now - float(age)).astimezone()
        line = t.strftime("%Y-%m-%dT%H:%M:%S,%f") + t.strftime("%z")[:3] + ":" + t.strftime("%z")[3:] + rest
    print(line)
'''

_RAS_BODY = '''
args = sys.argv[1:]
fmt = args[args.index("-f") + 1] if "-f" in args else "text"
if fmt == "json":
    if not DATA.get("json"):  # an NCCL older than 2.28.7 answers SET FORMAT with an error
        print("Unexpected response from NCCL: ERROR: Unknown command SET FORMAT json", file=sys.stderr)
        sys.exit(1)
    sys.stdout.write(DATA["json"])
else:
    sys.stdout.write(DATA.get("text", ""))
'''


def nvidia_smi(bindir: Path, *, gpus: str = "", remap: str = "", apps: str = "", query: str = "",
               hang: bool = False) -> Path:
    """A FAKE nvidia-smi: CSV for --query-gpu / --query-remapped-rows / --query-compute-apps, text for -q; with
    hang, one that sleeps and never answers (a GPU fallen off the bus)."""
    return _write(bindir, "nvidia-smi", _python_fake("nvidia-smi", _SMI_BODY, {
        "gpus": gpus, "remap": remap, "apps": apps, "q": query, "hang": "1" if hang else ""}))


def dmesg(bindir: Path, lines: str, *, busybox: bool = False) -> Path:
    """A FAKE dmesg printing recorded kernel lines; `@AGE:N@` becomes the ISO time N seconds before now. With
    busybox, one that refuses every option and prints the seconds since boot N seconds before now instead."""
    return _write(bindir, "dmesg", _python_fake("dmesg", _DMESG_BODY, {"lines": lines,
                                                                       "busybox": "1" if busybox else ""}))


def ncclras(bindir: Path, *, text: str = "", json_text: str = "") -> Path:
    """A FAKE ncclras client printing a recorded RAS answer (JSON only when json_text is given)."""
    return _write(bindir, "ncclras", _python_fake("ncclras", _RAS_BODY, {"text": text, "json": json_text}))


def apps_csv(pids_by_gpu: Dict[int, Sequence[int]], gpus_csv: str) -> str:
    """--query-compute-apps lines (pid, gpu uuid, used MiB, process name) for the given pids on the GPUs of
    gpus_csv; the fake prints as many of the columns as it is asked for."""
    uuids = {int(p[0]): p[2] for p in ([x.strip() for x in line.split(",")] for line in gpus_csv.splitlines())}
    return "".join(f"{pid}, {uuids[g]}, 30211, /usr/bin/python3\n" for g, pids in sorted(pids_by_gpu.items())
                   for pid in pids)


def ras_json(ranks: Sequence[dict], missing: Sequence[dict] = (), comm_hash: str = "0x5e1f0c3a9b7d2e41",
             version: str = "2.29.1") -> str:
    """A RAS JSON answer in the layout of NCCL's src/ras/client_support.cc (jsonWriteRankData and friends) for
    these ranks: each {"rank", "host", "pid", "gpu", "allreduce"} (collective counts per type)."""
    def rank(r: dict) -> dict:
        return {"rank": r["rank"], "host": r["host"], "pid": r["pid"], "cuda_dev": r["gpu"], "nvml_dev": r["gpu"],
                "status": {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False,
                           "abort_flag": False},
                "collective_counts": {"Broadcast": 1, "Reduce": 0, "AllGather": 0, "ReduceScatter": 0,
                                      "AllReduce": r["allreduce"]}}

    def gone(r: dict) -> dict:
        return {"rank": r["rank"], "host": r["host"], "pid": r["pid"], "cuda_dev": r["gpu"], "nvml_dev": r["gpu"],
                "status": {"unresponsive": True, "considered_dead": False}}

    doc = {"nccl_version": version, "cuda_runtime_version": 12080, "cuda_driver_version": 12080,
           "timestamp": "2026-01-01 00:00:00", "communicators_count": 1,
           "communicators": [{"hash": comm_hash, "secondary_hash": "0x1:0x2", "size": len(ranks) + len(missing),
                              "ranks_count": len(ranks), "missing_ranks_count": len(missing),
                              "ranks": [rank(r) for r in ranks], "missing_ranks": [gone(r) for r in missing]}],
           "ras": {"collection_time_sec": 0.004, "timeouts_count": 0}}
    return json.dumps(doc, indent=2) + "\n"


def path_with(bindir: Path, base: Optional[str] = None) -> str:
    return f"{bindir}{os.pathsep}{base if base is not None else os.environ.get('PATH', '')}"


# -- the gpu_xid scenario: a GPU fault on the culprit's node, for the recorded golden and the live test ----------

SCENARIO_GPUS = ("0, 00000000:3B:00.0, GPU-7f2c1e0a-5b1d-4c1e-9a53-1e6f0b2d3c01, NVIDIA H100 80GB HBM3, 0, 0, 0, [N/A], "
                 "30211, 81559, 100, 61\n"
                 "1, 00000000:5D:00.0, GPU-7f2c1e0a-5b1d-4c1e-9a53-1e6f0b2d3c02, NVIDIA H100 80GB HBM3, 2, 2, 0, [N/A], "
                 "30211, 81559, 0, 47\n")
SCENARIO_REMAP = "00000000:3B:00.0, 0, 0, 0, 0\n00000000:5D:00.0, 0, 1, 1, 0\n"
# fresh: the culprit's GPU (local rank 1 -> GPU 1 at 0000:5d:00) fell off the bus 40 s ago; stale: a week-old
# row-remap notice on GPU 0 (said as older, never the lead)
SCENARIO_DMESG = ("@AGE:604800@ NVRM: Xid (PCI:0000:3b:00): 63, pid=1896, Row Remapper: New row marked for "
                  "remapping, reset gpu to activate.\n"
                  "@AGE:40@ NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
                  "the bus.\n"
                  "@AGE:39@ NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.\n")


def install_gpu_xid(cluster, job, culprit: int, nodes: Sequence[str]) -> List[Path]:
    """FAKE GPU tools for the gpu_xid scenario (no GPU here): on the culprit's node an nvidia-smi whose process list
    puts each rank there on the GPU of its LOCAL_RANK and whose counters show the culprit's GPU with uncorrectable
    ECC errors, and a dmesg with a fresh Xid 79 for that GPU; on the first node an ncclras (JSON, NCCL 2.29) in
    which the culprit launched one AllReduce fewer than the others, as a rank stuck in a CUDA call does. Returns
    the files, to remove when the scenario stops."""
    loc = job.ranks[culprit]
    bindir = Path(cluster[loc.node].dir) / "bin"
    uuids = [line.split(",")[2].strip() for line in SCENARIO_GPUS.splitlines()]
    apps = "".join(f"{r.pid}, {uuids[r.local_rank]}, 30211\n" for r in job.ranks.values() if r.node == loc.node)
    made = [nvidia_smi(bindir, gpus=SCENARIO_GPUS, remap=SCENARIO_REMAP, apps=apps), dmesg(bindir, SCENARIO_DMESG)]
    ras_ranks = [{"rank": n, "host": cluster[r.node].ip, "pid": r.pid, "gpu": r.local_rank,
                  "allreduce": 41 if n == culprit else 42} for n, r in sorted(job.ranks.items())]
    made.append(ncclras(Path(cluster[nodes[0]].dir) / "bin", json_text=ras_json(ras_ranks)))
    return made


# A FAKE libnvidia-ml.so.1 (no driver here): the NVML calls the worker's ctypes child makes, with NVML's
# signatures (nvml.h) and recorded values: two GPUs, the second with uncorrectable ECC errors and a pending remap,
# held by pid 4242.
FAKE_NVML_C = r"""
/* FAKE libnvidia-ml.so.1 for hangscope's tests: no NVIDIA driver here. */
#include <string.h>
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
                 char busId[32]; } pci_t;
static const char *BUS[] = {"00000000:3B:00.0", "00000000:5D:00.0"};
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { *h = (void *)(long)(i + 1); return 0; }
static int idx(void *h) { return (int)(long)h - 1; }
int nvmlDeviceGetPciInfo_v3(void *h, pci_t *p) { memset(p, 0, sizeof *p); strcpy(p->busId, BUS[idx(h)]); return 0; }
int nvmlDeviceGetUUID(void *h, char *s, unsigned int n) {
    strncpy(s, idx(h) ? "GPU-7f2c1e0a-5b1d-4c1e-9a53-1e6f0b2d3c02" : "GPU-7f2c1e0a-5b1d-4c1e-9a53-1e6f0b2d3c01", n);
    return 0; }
int nvmlDeviceGetName(void *h, char *s, unsigned int n) { strncpy(s, "NVIDIA H100 80GB HBM3", n); return 0; }
int nvmlDeviceGetTotalEccErrors(void *h, int kind, int counter, unsigned long long *v) {
    *v = (idx(h) == 1 && kind == 1) ? 2 : 0; return 0; }
int nvmlDeviceGetRemappedRows(void *h, unsigned int *c, unsigned int *u, unsigned int *p, unsigned int *f) {
    *c = 0; *u = idx(h); *p = idx(h); *f = 0; return 0; }
typedef struct { unsigned long long total, free, used; } mem_t;
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    m->total = 81559ULL << 20; m->used = (idx(h) ? 30211ULL : 4ULL) << 20; m->free = m->total - m->used; return 0; }
typedef struct { unsigned int gpu, memory; } util_t;
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) { u->gpu = idx(h) ? 0 : 100; u->memory = 0; return 0; }
int nvmlDeviceGetTemperature(void *h, int sensor, unsigned int *t) { *t = 40 + idx(h); return 0; }
/* nvmlProcessInfo_t of nvmlDeviceGetComputeRunningProcesses_v3: pid, memory, GPU and compute instance */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; }
    proc_t;
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *n, proc_t *p) {
    if (idx(h) != 1) { *n = 0; return 0; }
    if (*n < 1) { *n = 1; return 7; }  /* NVML_ERROR_INSUFFICIENT_SIZE */
    p[0].pid = 4242; p[0].usedGpuMemory = 30211ULL << 20; p[0].gpuInstanceId = 0xFFFFFFFF;
    p[0].computeInstanceId = 0xFFFFFFFF; *n = 1; return 0; }
"""


def fake_nvml(libdir: Path) -> Path:
    """Build the FAKE libnvidia-ml.so.1 into libdir (needs a C compiler); its path."""
    import subprocess

    libdir.mkdir(parents=True, exist_ok=True)
    src = libdir / "fake_nvml.c"
    src.write_text(FAKE_NVML_C, encoding="utf-8")
    out = libdir / "libnvidia-ml.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True, timeout=60)
    return out
