"""The op handlers: each takes a Request, streams items, and returns the done data (or raises OpError)."""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any, Dict

from workers import discover as discovery
from workers import procinfo
from workers.collect import gpus
from workers.request import OpError, Request


def ping(req: Request) -> Dict[str, Any]:
    return {"pong": True, "time": time.time()}


def push_tool(req: Request) -> Dict[str, Any]:
    name = req.arg_str("name")
    if name not in ("py-spy", "strace", "gdb"):
        raise OpError("bad_request", "push_tool: %r is not a tool hangscope pushes" % name)
    try:
        data = base64.b64decode(req.arg_str("data_b64"), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise OpError("bad_request", "push_tool: data_b64 is not base64: %s" % exc)
    try:
        tool = req.worker.tools.push(name, data, req.arg_str("sha256"))
    except ValueError as exc:
        raise OpError("bad_request", "push_tool: %s" % exc)
    except OSError as exc:
        raise OpError("tool_failed", "push_tool: cannot store %s on this node: %s" % (name, exc))
    return {"name": name, "path": tool.path}


def discover(req: Request) -> Dict[str, Any]:
    pids = req.arg_list("pids")
    if pids is not None and not all(isinstance(p, int) and not isinstance(p, bool) for p in pids):
        raise OpError("bad_request", "discover: pids must be integers")
    scan = discovery.Scan(procinfo.source(prefer_psutil=not req.worker.options.get("no_psutil")))
    ranks = scan.ranks(pids)
    req.check()
    notes = scan.notes
    use = gpus.query(req, notes) if ranks else {}
    for rank in ranks:
        rank["gpus"] = use.get(rank["pid"], [])
        req.item(rank)
    return {"count": len(ranks), "scanned": len(scan.procs), "unreadable": scan.unreadable, "notes": notes}


HANDLERS = {
    "discover": discover,
    "ping": ping,
    "push_tool": push_tool,
}
