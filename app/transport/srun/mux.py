"""The node side of the srun transport: a tiny multiplexer that runs one worker per srun task.

srun gives every task the same stdin and merges every task's stdout into one stream, splitting (and so
interleaving) lines longer than about 1 KB. So both directions are framed in short lines (measured on SLURM
22.05: 1,000-byte lines arrive whole, 4,000-byte lines interleave between nodes):

- node -> login: `<task> <kind> <base64>` lines of at most FRAME_LINE bytes; kinds: H the node's name (first),
  O worker stdout, E worker stderr, X the worker's exit status (decimal).
- login -> node: the worker payload once (raw, N bytes, to every task), then `<task> D <base64>` (bytes for that
  task's worker), `<task> E` (EOF on its stdin: the worker stops its tools and exits), `<task> K` (EOF, then
  kill after a grace period). EOF on srun's stdin is `E` for every task. `<task>` is one task's number, `*`
  (every task) or ranges (`0-4,7`): srun's `--input=all` copies every line to every node, so a request sent
  to every node one line each would cost N^2 lines (58.75 GB out of the login node per pass at 12,500 nodes,
  issue 27); the same bytes for many tasks go out once, addressed to all of them (step.py coalesces them).

The stage (stage.py, a module of its own shipped as source) keeps the bootstrap's rules: python >= 3.9 checked by the worker stage itself, nothing written on the
node, the worker's own first stage unchanged (it reads the payload from its stdin).
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Sequence

FRAME_RAW = 720  # bytes of data per frame: base64 -> 960 chars, plus "<task> O " stays under 1,000 bytes
KILL_GRACE = 3.0  # seconds a worker has after EOF on a `K` before it is killed

STAGE_SOURCE = Path(__file__).with_name("stage.py")  # the node side, shipped as source (see stage.py)


def mux_stage(worker_argv: Sequence[str], payload_size: int) -> str:
    """The `-c` argument that runs on every node of the srun step; worker_argv is `python3 -c <stage>`."""
    call = "main(%d, %s, %d, %r)\n" % (payload_size, json.dumps([str(a) for a in worker_argv]), FRAME_RAW,
                                       KILL_GRACE)
    code = STAGE_SOURCE.read_text(encoding="ascii") + "\n" + call
    packed = base64.b64encode(zlib.compress(code.encode("ascii"), 9)).decode("ascii")
    return 'import base64,zlib;exec(zlib.decompress(base64.b64decode("%s")))' % packed


def frame(task: "int | bytes", kind: str, data: bytes = b"") -> bytes:
    """One login -> node line, for one task (an int) or several (`targets()`)."""
    who = b"%d" % task if isinstance(task, int) else task
    if kind == "D":
        return b"%s D %s\n" % (who, base64.b64encode(data))
    return b"%s %s\n" % (who, kind.encode("ascii"))


def targets(tasks: Sequence[int], every: int) -> bytes:
    """The task field that names these tasks: `*` when they are all `every` tasks of the step, else ranges."""
    distinct = sorted(set(tasks))
    if len(distinct) == every:
        return b"*"
    parts = []
    start = prev = distinct[0]
    for t in distinct[1:] + [-2]:
        if t == prev + 1:
            prev = t
            continue
        parts.append(b"%d" % start if start == prev else b"%d-%d" % (start, prev))
        start = prev = t
    return b",".join(parts)
