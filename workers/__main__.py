"""`python3 -m workers`: send hello, then answer JSON-lines requests on stdin until EOF or shutdown."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, Optional

from workers.hello import hello
from workers.ops import HANDLERS
from workers.server import Server


def main(options: Optional[Dict[str, Any]] = None) -> int:
    """Run the worker on this process's stdin/stdout; options: {"sudo": bool, "log": bool}."""
    opts = dict(options or {})
    os.environ["RUST_BACKTRACE"] = "0"  # py-spy's failures as a message, not a Rust backtrace (workers/collect)
    stdout = sys.stdout.buffer
    saved = sys.stdout
    # Anything printed by mistake must not corrupt the protocol stream: text output goes to stderr.
    sys.stdout = sys.stderr
    try:
        server = Server(sys.stdin.buffer, stdout, opts, HANDLERS)
        return server.serve(hello(server.worker.tools))
    finally:
        sys.stdout = saved


if __name__ == "__main__":
    sys.exit(main({"log": "--log" in sys.argv[1:], "sudo": "--sudo" in sys.argv[1:]}))
