"""The op handlers: each takes a Request, streams items, and returns the done data (or raises OpError)."""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any, Dict

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


HANDLERS = {
    "ping": ping,
    "push_tool": push_tool,
}
