"""GPU-side evidence for an NCCL/CUDA job, once per node per snapshot: the node's GPUs and kernel Xid lines (the
one reader, workers/collect/nvidia.py) and NCCL's RAS view of the job's communicators (NCCL >= 2.24).

Raw text travels back (bounded, redacted like every message); app/decode/gpu.py decodes it. Every source runs
under a deadline and nothing here may block on a hung driver (workers/collect/nvidia.py says how). The collector
itself runs in a thread the collect op waits for with a deadline (workers/ops.py), so a source that hangs anyway
costs that deadline, never the snapshot.

Collected only when the job is an NCCL/CUDA job (a rank maps libnccl or libcuda) or the user forces it
(--gpu-evidence on); with "off", or for a CPU job, nothing here runs.
"""

from __future__ import annotations

import socket
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Sequence, Tuple

from workers.collect import nvidia
from workers.request import Request

MODES = ("auto", "on", "off")
RAS_TIMEOUT = 8.0  # the whole RAS exchange; RAS itself is told to give up on a peer after RAS_PEER_TIMEOUT
RAS_PEER_TIMEOUT = 3
RAS_PORT = 28028
TOTAL_TIMEOUT = 15.0  # the collect op waits at most this long for the whole collector
MAX_RAS = 256 << 10
MAPS_BYTES = 8 << 20


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
        res = nvidia.run_bounded(req, base + (["-f", fmt] if fmt == "json" else []), RAS_TIMEOUT, MAX_RAS)
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
    out["smi"] = nvidia.smi(req, notes)
    out.update(nvidia.xids(req, notes))
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
