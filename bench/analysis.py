"""Benchmark of the analysis core: 1k, 10k and 100k ranks x 60 frames, build time and peak memory per size.

Each snapshot has a majority in all_reduce, a minority culprit in the data loader, a few ranks in barrier,
one rank an iteration ahead (same stack, step=1204), and three idle helper threads per rank.

By default the snapshot is what `--locals` (the CLI default) collects: every rank has its own Frame objects
and its own copies of every string, as read from JSON, and every Python frame carries 2-4 locals whose reprs
name this rank's objects (`<Tensor at 0x7f..>`) besides the loop variable, so no frame can be shared between
ranks. --no-locals drops the locals (frames still per rank); --interned measures snapshots whose identical
frames are one shared object, as the parser and the snapshot reader give for frames without locals.

"build s" is the CPU time of building the snapshot (RankSnapshots, threads and frames, and whatever the model
derives from them when they are built): the part of the cost paid when a snapshot is read, not in analyze(). The
garbage collector is paused meanwhile: its passes over the growing heap (tens of millions of objects at 100k
ranks with locals) would otherwise be most of the figure and hide what building itself costs.

    python3 bench/analysis.py [--sizes 1000,10000,100000] [--depth 60] [--interned | --no-locals] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from app.analysis import analyze
from app.analysis.text import summary_text
from app.model import Frame, Local, LoopInfo, NodeStatus, RankSnapshot, Snapshot, ThreadStack

RANKS_PER_NODE = 8
SITE = "/opt/venv/lib/python3.11/site-packages"
LOOP = LoopInfo("for", 57, 70, "for step, batch in enumerate(loader):", ("step", "batch"))

Spec = Tuple[str, str, int]


def _paths(depth: int) -> Tuple[List[Spec], List[Spec], List[Spec]]:
    """(innermost-first) majority, loader culprit and barrier paths, padded to `depth` with model frames."""
    outer: List[Spec] = [("<module>", "/job/train.py", 120), ("main", "/job/train.py", 110)]
    model = [(f"forward_{i}", f"{SITE}/model/layer{i}.py", 40 + i) for i in range(depth)]
    train = ("train", "/job/train.py", 57)
    majority = [("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2950),
                ("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 81),
                ("sync_grads", "/job/train.py", 30)]
    majority += model[: depth - len(majority) - len(outer) - 1] + [train] + outer[::-1]
    loader = [("_recv", "/usr/lib/python3.11/multiprocessing/connection.py", 395),
              ("next_batch", "/job/loader.py", 31)]
    loader += model[: depth - len(loader) - len(outer) - 1] + [("train", "/job/train.py", 55)] + outer[::-1]
    barrier = [("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 4100)]
    barrier += model[: depth - len(barrier) - len(outer) - 1] + [("train", "/job/train.py", 75)] + outer[::-1]
    return majority, loader, barrier


def _copy(s: str) -> str:
    return (s + "\0")[:-1]  # a new string object with the same text, like json.loads gives per rank


_KINDS = ("Tensor", "Linear", "Parameter", "dict")
_NAMES = ("self", "x", "out", "mask")


def _locals(rank: int, depth: int, step: str) -> Tuple[Local, ...]:
    """2-4 locals of one frame as py-spy --locals reports them: reprs that name this rank's objects by address
    (per rank, like the strings json.loads gives), and in the training loop the loop variable."""
    out = [Local(_copy(_NAMES[k]), f"<{_KINDS[(depth + k) % 4]} at 0x7f{rank:06x}{depth:03x}{k}0>", k == 0)
           for k in range(2 + depth % 3)]
    if step:
        out[-1] = Local(_copy("step"), _copy(step))
    return tuple(out)


def make_snapshot(n: int, depth: int = 60, interned: bool = False, with_locals: bool = True) -> Snapshot:
    majority, loader, barrier = _paths(depth)
    idle = [("wait", "/usr/lib/python3.11/threading.py", 327), ("run", "/usr/lib/python3.11/threading.py", 982)]
    culprit, ahead = n // 2 + 1, 7 % n
    pool: Dict[tuple, Frame] = {}
    rank = 0

    def frame(fn: str, fi: str, ln: int, step: str = "", at: int = 0) -> Frame:
        if not interned:
            loops = (LoopInfo("for", 57, 70, _copy(LOOP.header), (_copy("step"), _copy("batch"))),) if step else ()
            return Frame(_copy(fn), _copy(fi), ln, loops=loops,
                         locals=_locals(rank, at, step) if with_locals else (),
                         iteration=((_copy("step"), _copy(step)),) if step else ())
        key = (fn, fi, ln, step)
        f = pool.get(key)
        if f is None:
            f = pool[key] = Frame(fn, fi, ln, loops=(LOOP,) if step else (), iteration=(("step", step),) if step else ())
        return f

    ranks = []
    for r in range(n):
        rank = r
        spec = loader if r == culprit else barrier if r % 997 == 996 else majority
        step = "1204" if r == ahead else "1203"
        frames = tuple(frame(fn, fi, ln, step if fn == "train" else "", i) for i, (fn, fi, ln) in enumerate(spec))
        threads = [ThreadStack(100 + r, "MainThread", frames=frames, state="S", is_main=True)]
        threads += [ThreadStack(200 + r + k, f"gloo{k}", state="S",
                                frames=tuple(frame(fn, fi, ln, "", 8 * k + i) for i, (fn, fi, ln) in enumerate(idle)))
                    for k in range(3)]
        ranks.append(RankSnapshot(node=f"node{r // RANKS_PER_NODE:05d}", pid=1000 + r % RANKS_PER_NODE,
                                  start_time=1, rank=r, world_size=n, local_world_size=RANKS_PER_NODE,
                                  state="S", num_threads=4, collected=True, threads=tuple(threads)))
    nodes = tuple(NodeStatus(f"node{i:05d}", state="done") for i in range((n + RANKS_PER_NODE - 1) // RANKS_PER_NODE))
    return Snapshot(taken_at=time.time(), nodes=nodes, ranks=tuple(ranks))


def _best(fn: Callable[[], object], repeat: int) -> Tuple[float, float]:
    """Best wall and best CPU seconds: on a shared machine CPU time is the steadier of the two."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--depth", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--interned", action="store_true",
                      help="no locals, and identical frames are one shared object")
    mode.add_argument("--no-locals", action="store_true", help="per-rank frames without locals")
    args = ap.parse_args()
    frames = ("interned frames without locals" if args.interned else "per-rank frames without locals"
              if args.no_locals else "per-rank frames with locals")
    print(f"analysis benchmark: {args.depth} frames per main thread, 3 helper threads per rank, {frames}, "
          f"best of {args.repeat}, Python {sys.version.split()[0]}")
    print(f"{'ranks':>8} {'build s':>8} {'classes':>8} {'findings':>9} {'analyze s':>10} {'(cpu s)':>8} "
          f"{'to_dict s':>10} {'summary s':>10} {'peak MiB':>9}  verdict")
    for n in (int(x) for x in args.sizes.split(",")):
        gc.collect()
        gc.disable()
        started = time.process_time()
        snap = make_snapshot(n, args.depth, args.interned, not args.no_locals)
        build = time.process_time() - started
        gc.enable()
        _measure(snap, n, args.repeat, build)
        del snap
        gc.collect()


def _measure(snap: Snapshot, n: int, repeat: int, build: float) -> None:
    """One table row: analyze (best of `repeat`), to_dict, summary_text, and analyze's peak allocations."""
    gc.collect()
    seconds, cpu = _best(lambda: analyze(snap), repeat)
    result = analyze(snap)
    to_dict_s, _ = _best(result.to_dict, 1)
    summary_s, _ = _best(lambda: summary_text(snap, result), 1)
    tracemalloc.start()
    analyze(snap)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"{n:>8} {build:>8.2f} {len(result.classes):>8} {len(result.findings):>9} {seconds:>10.3f} {cpu:>8.3f} "
          f"{to_dict_s:>10.3f} {summary_s:>10.3f} {peak / 2**20:>9.1f}  {result.verdict[:70]}")


if __name__ == "__main__":
    main()
