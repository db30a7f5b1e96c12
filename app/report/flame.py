"""Flame-graph exports of the stacks: speedscope's file format (one profile per rank) and collapsed stacks.

Collapsed stacks (`thread;outer;inner N`, Brendan Gregg's format, read by flamegraph.pl, speedscope,
inferno) merge identical stacks across ranks, so the widths count ranks: the STAT view as a flame graph.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Dict, List, Sequence, Tuple

from app.model import Frame, RankSnapshot, Snapshot, ThreadStack

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"  # a format name, never fetched
_SEPARATORS = re.compile(r"[;\x00-\x1f\x7f-\x9f\u2028\u2029]")  # frame separator and anything that breaks a line


def rank_title(r: RankSnapshot) -> str:
    return f"{r.label} ({r.node} pid {r.pid})"


def thread_title(t: ThreadStack) -> str:
    name = t.name or "thread"
    return f"{name} [{t.tid}]" + (" (main)" if t.is_main else "")


def speedscope(snapshot: Snapshot, ranks: Sequence[RankSnapshot], exporter: str) -> Dict[str, Any]:
    """A speedscope file: one sampled profile per rank, one sample per thread (outermost frame first), each
    thread under a synthetic root frame naming it so threads stay apart in the left-heavy view."""
    frames: List[Dict[str, Any]] = []
    index: Dict[Tuple[str, str, int], int] = {}

    def frame_index(name: str, file: str = "", line: int = 0) -> int:
        key = (name, file, line)
        i = index.get(key)
        if i is None:
            i = index[key] = len(frames)
            entry: Dict[str, Any] = {"name": name}
            if file:
                entry["file"] = file
            if line:
                entry["line"] = line
            frames.append(entry)
        return i

    profiles = []
    for r in ranks:
        samples = []
        for t in r.threads:
            stack = [frame_index(f"thread {thread_title(t)}")]
            stack += [frame_index(_frame_name(f), f.filename, f.line) for f in reversed(t.frames)]
            samples.append(stack)
        profiles.append({"type": "sampled", "name": rank_title(r), "unit": "none", "startValue": 0,
                         "endValue": len(samples), "samples": samples, "weights": [1] * len(samples)})
    return {"$schema": SPEEDSCOPE_SCHEMA, "shared": {"frames": frames}, "profiles": profiles,
            "name": f"hangscope snapshot of {len(snapshot.ranks)} ranks", "activeProfileIndex": 0,
            "exporter": exporter}


def _frame_name(f: Frame) -> str:
    return f"{f.function} [native]" if f.native and f.module is None else f.function


def collapsed(ranks: Sequence[RankSnapshot]) -> str:
    """`MainThread;<module> (job.py:120);train (job.py:57);all_reduce (distributed_c10d.py:2950) 7`: every
    thread of every rank, identical stacks merged, the count = how many threads (of all ranks) have it."""
    counts: Counter = Counter()
    for r in ranks:
        for t in r.threads:
            if not t.frames:
                continue
            parts = [_part(t.name or "thread")] + [_part(f"{f.function} ({f.location})") for f in reversed(t.frames)]
            counts[";".join(parts)] += 1
    lines = [f"{stack} {n}" for stack, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(lines) + ("\n" if lines else "")


def _part(text: str) -> str:
    """A frame as one field: `;` separates frames and a line is one stack, so neither may appear inside."""
    return _SEPARATORS.sub(" ", text).strip() or "?"
