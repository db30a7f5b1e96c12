"""Which GPUs each process holds, from nvidia-smi (when the node has it), under a deadline."""

from __future__ import annotations

import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Set, Tuple

from workers.request import Request

_TIMEOUT = 5.0


def parse_apps(text: str) -> List[Dict[str, Any]]:
    """`--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits` lines."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        used: Optional[int] = int(parts[2]) if parts[2].isdigit() else None
        out.append({"pid": int(parts[0]), "uuid": parts[1], "used_mib": used})
    return out


def parse_gpus(text: str) -> Dict[str, Dict[str, Any]]:
    """`--query-gpu=index,uuid,name --format=csv,noheader` lines, by uuid."""
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 3:
            continue
        out[parts[1]] = {"index": int(parts[0]) if parts[0].isdigit() else None, "name": parts[2]}
    return out


def by_pid(apps_text: str, gpus_text: str) -> Dict[int, List[Dict[str, Any]]]:
    """GpuUse dicts per pid."""
    gpus = parse_gpus(gpus_text)
    out: Dict[int, List[Dict[str, Any]]] = {}
    for app in parse_apps(apps_text):
        info = gpus.get(app["uuid"], {})
        out.setdefault(app["pid"], []).append({"index": info.get("index"), "uuid": app["uuid"],
                                               "name": info.get("name", ""), "used_mib": app["used_mib"]})
    return out


# nvidia-smi initialises the driver on every run: ~0.1-0.5 s of CPU and the driver's lock, at every
# refresh of every node. Which GPUs a rank holds does not change while it lives, so the answer is kept
# for the same set of ranks (the memory figures then date from the first query; at most REUSE_S old).
REUSE_S = 60.0
_cache: Dict[str, Any] = {"ranks": None, "at": 0.0, "use": {}}
_lock = threading.Lock()


def query_cached(req: Request, notes: List[str], ranks: Set[Tuple[int, int]]) -> Dict[int, List[Dict[str, Any]]]:
    """query(), reused while the node's ranks (pid, start time) are the same ones and the answer is recent."""
    with _lock:
        if _cache["ranks"] == ranks and time.monotonic() - _cache["at"] < REUSE_S:
            return _cache["use"]
    before = len(notes)
    use = query(req, notes)
    if len(notes) == before:  # a failed query is asked again next time
        with _lock:
            _cache.update(ranks=set(ranks), at=time.monotonic(), use=use)
    return use


def query(req: Request, notes: List[str]) -> Dict[int, List[Dict[str, Any]]]:
    """GPU use per pid; empty without nvidia-smi. A failing or hanging nvidia-smi becomes a note."""
    tool, _ = req.worker.tools.find("nvidia-smi")
    if tool is None:
        return {}
    from workers.collect import nvidia  # never waits on an nvidia-smi stuck in the driver

    texts = []
    for query_args in (["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
                       ["--query-gpu=index,uuid,name", "--format=csv,noheader"]):
        res = nvidia.run_bounded(req, [tool.path] + query_args, _TIMEOUT, 1 << 20)
        if res["timed_out"] or res["rc"] != 0:
            if res["timed_out"]:
                nvidia.note_smi_timeout(_TIMEOUT, res["stuck"])
            why = "timed out after %.0fs" % _TIMEOUT if res["timed_out"] else \
                res["stderr"].strip()[:200] or res["stdout"][:200]
            notes.append("nvidia-smi failed, GPU use not shown: %s" % why)
            return {}
        texts.append(res["stdout"])
    return by_pid(texts[0], texts[1])
