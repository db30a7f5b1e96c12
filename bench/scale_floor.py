"""Where a first headline's login CPU goes per rank, against what no wire can avoid with today's model (issue 27).

SIMULATION (bench/scale.py's FAKE transport: recorded worker replies replayed as N nodes through the real
login-side code). For one size it measures, per rank, on this machine (CPU seconds of this process):

  pass 1            Session.snapshot(): connect, read, decode, build the model (bench/scale.py's "CPU ms/node",
                    per rank, without the FAKE's own CPU)
  objects           constructing the model objects the pass built (RankSnapshot and its counters, sockets,
                    threads, kernel waits: ~10 a rank), through the decoders' own builders (app/decode/build.py),
                    every argument prepared beforehand: no parsing, no checking, frames shared. Any wire that
                    keeps one model object per rank pays at least this
  analysis          analyze() + summary_text() on the pass's snapshot, the rest of a first headline
  parse             orjson over the node's recorded lines, per rank: a lower bound for reading any JSON wire

and prints the projection to 12,500 nodes x 8 ranks. "floor" is objects + analysis + parse: what a wire that
sent nothing but pre-checked values would still cost with one model object per rank and today's analysis.

    python3 bench/scale_floor.py [--nodes 1000] [--shape small|deep] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import itertools
import json
import os
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import scale  # noqa: E402  (bench/scale.py: the FAKE transport)
from app.analysis import analyze  # noqa: E402
from app.analysis.text import summary_text  # noqa: E402
from app.decode.build import Builder  # noqa: E402
from app.hosts import HostSpec  # noqa: E402
from app.model import CollectOptions  # noqa: E402
from app.session import Session  # noqa: E402
from app.transport import base  # noqa: E402
from app.transport import lines as wire_lines  # noqa: E402

TARGET_RANKS = 12_500 * 8
SHARED = ("Frame", "Local")  # shared through the stack table in any wire that sends stack ids


def pass_one(nodes: int, shape: str) -> Tuple[Any, float]:
    """The snapshot of a FAKE pass 1 and its login CPU seconds (the FAKE's own taken out)."""
    rec = scale.load_recording(shape)
    names = [f"sim{i:05d}" for i in range(nodes)]

    async def run() -> Tuple[Any, float]:
        opts = scale.FakeOptions(collect=CollectOptions(locals=True))
        fake = scale.FakeConnector(rec, names, scale.RANKS_RECORDED, 0.0)
        fake.prebuild()
        object.__setattr__(opts, "fake", fake)
        base._REQUEST_IDS = itertools.count(1)  # the ids the FAKE predicted
        gc.collect()
        c0, f0 = time.process_time(), scale.FakeCpu.seconds
        session = Session([HostSpec(name=n, host=n, slots=scale.RANKS_RECORDED) for n in names], opts)
        snap = await session.snapshot()
        cpu = time.process_time() - c0 - (scale.FakeCpu.seconds - f0)
        await session.close()
        return snap, cpu

    return asyncio.run(run())


def model_classes(ranks: Any) -> Set[type]:
    """The dataclasses a rank is made of, frames and locals left out (shared)."""
    found: Set[type] = set()

    def walk(obj: Any) -> None:
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            for x in (v if type(v) is tuple else (v,)):
                if dataclasses.is_dataclass(x) and type(x).__name__ not in SHARED and type(x) not in found:
                    found.add(type(x))
                    walk(x)

    for r in ranks[:64]:
        found.add(type(r))
        walk(r)
    return found


def constructions(ranks: Any) -> List[Tuple[Callable[..., Any], Dict[str, Any]]]:
    """(builder, its keyword arguments) for every model object of every rank, children first."""
    kinds = model_classes(ranks)
    plans: Dict[type, Tuple[Callable[..., Any], Tuple[str, ...]]] = {}
    calls: List[Tuple[Callable[..., Any], Dict[str, Any]]] = []

    def add(obj: Any) -> None:
        plan = plans.get(type(obj))
        if plan is None:
            plan = plans[type(obj)] = (Builder(type(obj)).make, tuple(f.name for f in dataclasses.fields(obj)))
        kw = {}
        for name in plan[1]:
            v = getattr(obj, name)
            if type(v) in kinds:
                add(v)
            elif type(v) is tuple and v and type(v[0]) in kinds:
                for x in v:
                    add(x)
            kw[name] = v
        calls.append((plan[0], kw))

    for r in ranks:
        add(r)
    return calls


def parse_per_rank(shape: str) -> float:
    """CPU seconds to parse one node's recorded pass-1 lines (zlib undone beforehand), per rank."""
    rec = scale.load_recording(shape)
    node = scale.FakeNode(rec, 0, "sim00000", scale.RANKS_RECORDED, scale.RANKS_RECORDED, "")
    node.prebuild((1,))
    data = b"".join(node.built[0])
    found: List[bytes] = []
    pos, unzip = 0, zlib.decompressobj(0)
    while pos < len(data):
        nl = data.index(b"\n", pos)
        head, pos = data[pos:nl], nl + 1
        if head.startswith(b"z "):
            size = int(head[2:])
            found += [ln for ln in unzip.decompress(data[pos:pos + size]).split(b"\n") if ln]
            pos += size
        else:
            found.append(head)
    reps = 300
    t = time.process_time()
    for _ in range(reps):
        for line in found:
            wire_lines.decode(line)
    return (time.process_time() - t) / reps / scale.RANKS_RECORDED


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--shape", default="small", choices=("small", "deep"))
    ap.add_argument("--repeat", type=int, default=3, help="measurements of objects and analysis (median)")
    ap.add_argument("--json", metavar="FILE", help="also write the row as JSON")
    args = ap.parse_args()
    snap, pass_cpu = pass_one(args.nodes, args.shape)
    ranks = snap.ranks
    n = len(ranks)
    gc.collect()
    gc.freeze()  # what the pass built is frozen, as the Session does after a pass
    calls = constructions(ranks)
    objects, analysis = [], []
    for _ in range(args.repeat):
        gc.disable()  # as during a pass (the Session pauses the collector)
        t = time.process_time()
        for make, kw in calls:
            make(**kw)
        objects.append((time.process_time() - t) / n)
        gc.enable()
        t = time.process_time()
        summary_text(snap, analyze(snap))
        analysis.append((time.process_time() - t) / n)
    row = {"nodes": args.nodes, "ranks": n, "shape": args.shape, "objects_per_rank": len(calls) / n,
           "pass_us": pass_cpu / n * 1e6, "objects_us": statistics.median(objects) * 1e6,
           "analysis_us": statistics.median(analysis) * 1e6, "parse_us": parse_per_rank(args.shape) * 1e6}
    row["floor_us"] = row["objects_us"] + row["analysis_us"] + row["parse_us"]
    row["now_us"] = row["pass_us"] + row["analysis_us"]
    print(f"# SIMULATION (FAKE transport, recorded replies), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}; {args.nodes} nodes x 8 ranks ({args.shape}); "
          f"CPU microseconds a rank, and seconds at 12,500 x 8 (100,000 ranks) on one login core")
    print("| per rank | us | at 12,500 x 8 |\n|---|---|---|")
    for key, label in (("pass_us", "pass 1 now (connect, read, check, build)"),
                       ("analysis_us", "analysis + summary"),
                       ("now_us", "**first headline now**"),
                       ("objects_us", f"constructing the model objects alone ({row['objects_per_rank']:.1f} a rank)"),
                       ("parse_us", "parsing the node's JSON lines alone"),
                       ("floor_us", "**floor: objects + analysis + parse**")):
        print(f"| {label} | {row[key]:.1f} | {row[key] * TARGET_RANKS / 1e6:.1f} s |")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
