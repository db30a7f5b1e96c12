"""Give a node without py-spy the login node's own py-spy binary, over the worker's push_tool op."""

from __future__ import annotations

import base64
import functools
import hashlib
import platform
import time
from typing import Optional

from app.errors import TransportError
from app.transport.login_tools import local_pyspy, pyspy_version
from app.transport.base import WorkerConnection
from workers import protocol

PUSH_TIMEOUT = 120.0  # ~11 MB of base64 over a slow link


@functools.lru_cache(maxsize=2)
def _encoded(path: str) -> tuple[str, str]:
    """(base64, sha256) of the binary, computed once per process however many nodes need it."""
    with open(path, "rb") as f:
        data = f.read()
    return base64.b64encode(data).decode("ascii"), hashlib.sha256(data).hexdigest()


async def ensure_pyspy(conn: WorkerConnection, *, timeout: float = PUSH_TIMEOUT) -> Optional[str]:
    """Push py-spy when the hello says it is missing and the node's CPU matches ours; returns a warning."""
    tools = conn.hello.get("tools")
    if not isinstance(tools, dict) or tools.get("py-spy"):
        return None
    node_machine = str(conn.hello.get("machine") or "")
    ours = platform.machine()
    if node_machine != ours:
        return (f"py-spy is missing on this node and its CPU ({node_machine or 'unknown'}) differs from this "
                f"login node's ({ours}), so hangscope cannot lend its own: install py-spy on the node")
    path = local_pyspy()
    if not path:
        return "py-spy is missing on this node and on this login node: install py-spy (pip install py-spy)"
    try:
        data_b64, sha256 = _encoded(path)
    except OSError as exc:
        return f"py-spy is missing on this node; reading {path} to push it failed: {exc.strerror or exc}"
    try:
        done = await conn.call(protocol.PUSH_TOOL({"name": "py-spy", "data_b64": data_b64, "sha256": sha256}),
                               timeout=timeout)
    except TransportError as exc:
        return f"py-spy is missing on this node and pushing this login node's copy failed: {exc.message}"
    version = pyspy_version() or "?"
    # What the node now has, so that NodeInfo shows the pushed py-spy rather than "missing".
    tools["py-spy"] = {"path": str(done.get("path", "")), "version": f"py-spy {version}", "pushed": True}
    return (f"py-spy was missing on this node: using the login node's py-spy {version} ({ours}), pushed to "
            f"{done.get('path', '?')} for this session only")


async def lend_pyspy(conn: WorkerConnection) -> None:
    """ensure_pyspy on a newly started worker (direct or through a relay): its warning into the connection's
    warnings and, when it pushed, the time it took into its timings."""
    t0 = time.monotonic()
    note = await ensure_pyspy(conn)
    if note:
        conn.warnings.append(note)
        conn.timings["push"] = time.monotonic() - t0
