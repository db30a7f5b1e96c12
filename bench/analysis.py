"""Benchmark of the analysis core: 1k, 10k and 100k ranks x 60 frames, build time and peak memory per size.

Each snapshot has a majority in all_reduce, a minority culprit in the data loader, a few ranks in barrier,
one rank an iteration ahead (same stack, step=1204), and three idle helper threads per rank. Every rank gets
its own Frame objects and its own copies of every string, as a snapshot read from JSON has today;
--interned measures snapshots whose identical frames are one shared object, as a parser that interns frames
would give (the analysis then keys frames by identity and skips most attribute reads).

    python3 bench/analysis.py [--sizes 1000,10000,100000] [--depth 60] [--interned] [--repeat 3]
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

from app.analysis import analyze  # noqa: E402
from app.analysis.text import summary_text  # noqa: E402
from app.model import Frame, LoopInfo, NodeStatus, RankSnapshot, Snapshot, ThreadStack  # noqa: E402

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


def make_snapshot(n: int, depth: int = 60, interned: bool = False) -> Snapshot:
    majority, loader, barrier = _paths(depth)
    idle = [("wait", "/usr/lib/python3.11/threading.py", 327), ("run", "/usr/lib/python3.11/threading.py", 982)]
    culprit, ahead = n // 2 + 1, 7 % n
    pool: Dict[tuple, Frame] = {}

    def frame(fn: str, fi: str, ln: int, step: str = "") -> Frame:
        if not interned:
            return Frame(_copy(fn), _copy(fi), ln, loops=(LOOP,) if step else (),
                         iteration=((_copy("step"), _copy(step)),) if step else ())
        key = (fn, fi, ln, step)
        f = pool.get(key)
        if f is None:
            f = pool[key] = Frame(fn, fi, ln, loops=(LOOP,) if step else (), iteration=(("step", step),) if step else ())
        return f

    ranks = []
    for r in range(n):
        spec = loader if r == culprit else barrier if r % 997 == 996 else majority
        step = "1204" if r == ahead else "1203"
        frames = tuple(frame(fn, fi, ln, step if fn == "train" else "") for fn, fi, ln in spec)
        threads = [ThreadStack(100 + r, "MainThread", frames=frames, state="S", is_main=True)]
        threads += [ThreadStack(200 + r + k, f"gloo{k}", state="S",
                                frames=tuple(frame(fn, fi, ln) for fn, fi, ln in idle)) for k in range(3)]
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
    ap.add_argument("--interned", action="store_true", help="identical frames are one shared object")
    args = ap.parse_args()
    print(f"analysis benchmark: {args.depth} frames per main thread, 3 helper threads per rank, "
          f"{'interned' if args.interned else 'per-rank'} frames, best of {args.repeat}, Python {sys.version.split()[0]}")
    print(f"{'ranks':>8} {'classes':>8} {'findings':>9} {'analyze s':>10} {'(cpu s)':>8} {'to_dict s':>10} "
          f"{'summary s':>10} {'peak MiB':>9}  verdict")
    for n in (int(x) for x in args.sizes.split(",")):
        _measure(make_snapshot(n, args.depth, args.interned), n, args.repeat)
        gc.collect()


def _measure(snap: Snapshot, n: int, repeat: int) -> None:
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
    print(f"{n:>8} {len(result.classes):>8} {len(result.findings):>9} {seconds:>10.3f} {cpu:>8.3f} "
          f"{to_dict_s:>10.3f} {summary_s:>10.3f} {peak / 2**20:>9.1f}  {result.verdict[:70]}")


if __name__ == "__main__":
    main()
