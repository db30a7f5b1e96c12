"""hangscope's compute-node worker: stdlib only (psutil optional), Python >= 3.9, never imports app/.

Every snapshot starts one worker per node, so what it imports before its hello is on every node's critical
path: modules import typing only for type checkers (`TYPE_CHECKING = False; if TYPE_CHECKING:` — the name
mypy and pyright treat as true), since annotations are strings here (`from __future__ import annotations`)
and typing costs ~2.5 ms of each start; rarely used modules (pickle, http.client, base64, hashlib,
tempfile, ctypes) are imported in the functions that need them.
"""

# Reported in the hello; bumped together with app.__version__.
WORKER_VERSION = "0.1.0"
