"""The GPU test ops: launch and stop the test program, free ports, network and GPU probes.

Registered in workers/ops.py's HANDLERS; argument and reply shapes are in workers/protocol.py.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Callable, Dict, Mapping

    from workers.protocol import GpuPortsDone, GpuStopDone

from workers import protocol
from workers.request import OpError, Request

# workers.gputest is imported by each op, not here: every worker start (on every node, for every snapshot)
# would otherwise load and compile it, although only `hangscope --test` uses it.

MAX_TARGETS = 256


def gpu_launch(req: Request) -> Dict[str, Any]:
    from workers.gputest.launch import Launch
    return Launch(req).run()


def gpu_stop(req: Request) -> GpuStopDone:
    from workers.gputest.launch import request_stop
    return {"found": request_stop(req.arg_str("token"))}


def gpu_ports(req: Request) -> GpuPortsDone:
    count = req.arg_int("count", 1) or 1
    low, high = req.arg_int("low", 29500) or 29500, req.arg_int("high", 29999) or 29999
    exclude = req.arg_list("exclude") or []
    if not (1 <= count <= 64 and 1024 <= low <= high <= 65535) or \
            not all(isinstance(p, int) and not isinstance(p, bool) for p in exclude):
        raise OpError("bad_request", "count 1..64, 1024 <= low <= high <= 65535, integer excludes")
    from workers.gputest import ports
    return {"ports": ports.free_ports(count, exclude, low, high)}


def net_probe(req: Request) -> Dict[str, Any]:
    targets = req.arg_list("targets") or []
    if len(targets) > MAX_TARGETS:
        raise OpError("bad_request", "at most %d targets" % MAX_TARGETS)
    for t in targets:
        if not (isinstance(t, dict) and isinstance(t.get("host"), str) and isinstance(t.get("port"), int)
                and 0 < t["port"] < 65536 and 0 < len(t["host"]) <= 255):
            raise OpError("bad_request", "each target needs a host and a port 1..65535, got %r" % (t,))
    from workers.gputest import netprobe
    return netprobe.probe(targets, min(req.arg_float("timeout", 3.0), 30.0))


def gpu_inventory(req: Request) -> Dict[str, Any]:
    """The node's GPUs, the processes holding them and its Xid lines: the investigation's own reader."""
    from workers.collect import nvidia
    return nvidia.read(req, apps=True)


def gpu_python(req: Request) -> Dict[str, Any]:
    pids = req.arg_list("pids") or []
    if len(pids) > 4096 or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in pids):
        raise OpError("bad_request", "pids must be at most 4096 positive integers")
    from workers.gputest import interpreters
    return interpreters.choose(pids, req.arg_str("python"), min(req.arg_float("timeout", 60.0), 300.0))


HANDLERS: Dict[str, Callable[[Request], Mapping[str, Any]]] = {
    protocol.GPU_PYTHON.name: gpu_python,
    protocol.GPU_LAUNCH.name: gpu_launch,
    protocol.GPU_STOP.name: gpu_stop,
    protocol.GPU_PORTS.name: gpu_ports,
    protocol.NET_PROBE.name: net_probe,
    protocol.GPU_INVENTORY.name: gpu_inventory,
}
