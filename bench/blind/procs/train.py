"""A small data-parallel training script (torch.distributed, gloo, CPU) with the helper processes real training code
starts or talks to: a shard checker run after each shard is written, a text normalizer filter, a dataset
statistics process pool, a prediction writer process, a manifest prefetch pool, an evaluator process, a vocabulary
lookup coprocess, an index builder process.

Run under torchrun by bench/blind/procs/run.py, one feature per job (--feature). Each feature is written as such
code usually is; the set-up (bench/blind/procs/scenarios.py) gives it the circumstances in which it blocks on
one rank: a tool that writes more than usual, a service that stalls, a leftover file, a helper that crashes...

Readiness for the harness: with env HANGSCOPE_READY_FILE set, every rank appends one JSON line at the start of
step --ready-step (the format tests/support/jobs.py reads).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from multiprocessing.connection import Listener
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

FEATURES_IN = 16
BATCH = 8


def _ready(step: int) -> None:
    path = os.environ.get("HANGSCOPE_READY_FILE")
    if not path:
        return
    line = json.dumps({"rank": dist.get_rank(), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                       "pid": os.getpid(), "host": socket.gethostname(), "step": step, "where": "step"})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES_IN, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def synthetic_batch(seed: int, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 100003 + index)
    x = torch.randn(BATCH, FEATURES_IN, generator=gen)
    return x, x.sum(dim=1, keepdim=True) * 0.1


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.host = socket.gethostname()
        torch.manual_seed(0)
        self.model = TinyModel()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def batch(self, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return synthetic_batch(self.rank, step)

    def sync_gradients(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def path(self, *parts: str) -> str:
        return os.path.join(self.args.workdir, *parts)


class Callback:
    def on_train_start(self, t: Trainer) -> None:
        pass

    def get_batch(self, t: Trainer, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return t.batch(step)

    def on_after_backward(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        pass

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        pass


def due(step: int, every: int) -> bool:
    return step > 0 and step % every == 0


def log(t: Trainer, text: str) -> None:
    print(f"[rank {t.rank}] {text}", flush=True)


# ----------------------------------------------------------------------------------------------------------------
class ShardAudit(Callback):
    """Every --every steps local rank 0 of each node writes the node's sample shard and runs the site's checker
    (`shard-audit PATH`, from PATH) on it; it keeps the checker's output for the log."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank != 0 or not due(step, t.args.every):
            return
        path = t.path("shards", t.host, f"step{step}.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            for i in range(512):
                x, y = synthetic_batch(t.rank, step * 1000 + i)
                f.write(json.dumps({"x": x[0].tolist(), "y": float(y[0])}) + "\n")
        p = subprocess.Popen(["shard-audit", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        rc = p.wait()
        out, err = p.stdout.read(), p.stderr.read()  # type: ignore[union-attr]
        log(t, f"shard-audit exited {rc}: {out.decode().strip()} ({len(err.splitlines())} warnings)")


# ----------------------------------------------------------------------------------------------------------------
class TextNormalizer(Callback):
    """Every --every steps local rank 1 of each node passes the step's caption text through the site's text
    normalizer (`text-normalize`, a stdin -> stdout filter): it writes all the text, closes its stdin, then reads
    the normalized text back. --long-rank R gets the long-form captions (--text-kb KiB)."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank != 1 or not due(step, t.args.every):
            return
        kb = t.args.text_kb if t.rank == t.args.long_rank else 8
        line = f"A Photo Of Sample {step} From Rank {t.rank}, Taken Outdoors In Daylight.\n"
        text = (line * ((kb << 10) // len(line) + 1)).encode()
        p = subprocess.Popen(["text-normalize"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        p.stdin.write(text)  # type: ignore[union-attr]
        p.stdin.close()  # type: ignore[union-attr]
        normalized = p.stdout.read()  # type: ignore[union-attr]
        p.wait()
        log(t, f"step {step}: {len(normalized)} bytes of normalized captions")


# ----------------------------------------------------------------------------------------------------------------
_PROGRESS: Dict[str, int] = {"columns": 0}
_PROGRESS_LOCK = threading.Lock()


def column_stats(values: List[float]) -> Tuple[float, float]:
    """Mean and variance of one feature column (run in a pool worker)."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    with _PROGRESS_LOCK:
        _PROGRESS["columns"] += 1
    return mean, var


class FeatureStats(Callback):
    """Rank --side-rank computes the per-column statistics of the training features every --every steps in a
    concurrent.futures.ProcessPoolExecutor of 2 workers (created on first use); a heartbeat thread writes the
    progress file every 2 s."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.rank == t.args.side_rank
        self.executor: Optional[ProcessPoolExecutor] = None
        if self.active:
            threading.Thread(target=self._heartbeat, args=(t.path(f"progress-rank{t.rank}.json"),),
                             name="heartbeat", daemon=True).start()

    def _heartbeat(self, path: str) -> None:
        while True:
            with _PROGRESS_LOCK:
                with open(path, "w") as f:
                    json.dump(dict(_PROGRESS, t=time.time()), f)
                time.sleep(2.0)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active or not due(step, t.args.every):
            return
        if self.executor is None:
            self.executor = ProcessPoolExecutor(2, mp_context=mp.get_context("fork"))
        x, _ = synthetic_batch(t.rank, step)
        futures = [self.executor.submit(column_stats, x[:, c].tolist()) for c in range(FEATURES_IN)]
        stats = [f.result() for f in futures]
        log(t, f"step {step}: feature stats {stats[:2]}...")


# ----------------------------------------------------------------------------------------------------------------
def _write_predictions(q: Any, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        while True:
            record = q.get()
            if record is None:
                return
            f.write(json.dumps(record) + "\n")


class PredictionDump(Callback):
    """Each rank streams its predictions on the step's batch to a writer process through a bounded
    multiprocessing.Queue (16 records), every --every steps; the writer appends them to dumps/rank<R>/preds.jsonl."""

    def on_train_start(self, t: Trainer) -> None:
        ctx = mp.get_context("fork")
        self.q = ctx.Queue(maxsize=16)
        self.writer = ctx.Process(target=_write_predictions, name="pred-writer",
                                  args=(self.q, t.path("dumps", f"rank{t.rank}", "preds.jsonl")), daemon=True)
        self.writer.start()

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not due(step, t.args.every):
            return
        with torch.no_grad():
            for i in range(64):
                x, y = synthetic_batch(t.rank, step * 1000 + i)
                pred = t.model(x)
                self.q.put({"step": step, "i": i, "pred": pred[:, 0].tolist(), "y": y[:, 0].tolist()})


# ----------------------------------------------------------------------------------------------------------------
def fetch_manifest(port: int, step: int) -> Dict[str, Any]:
    """The next shard's manifest from the node's shard cache daemon (HTTP on 127.0.0.1)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/manifest?shard={step + 1}") as resp:
        return json.loads(resp.read())


class ManifestPrefetch(Callback):
    """Local rank 0 of each node prefetches the next shard's manifest in a multiprocessing.Pool(1) worker while
    the step trains, and collects it at the end of every --every-th step."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.local_rank == 0
        if self.active:
            self.pool = mp.get_context("fork").Pool(1)
        self.pending: Any = None

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active:
            return
        if self.pending is None and due(step + 1, t.args.every):
            self.pending = self.pool.apply_async(fetch_manifest, (t.args.port, step + 1))
        if self.pending is not None and due(step, t.args.every):
            manifest = self.pending.get()
            self.pending = None
            log(t, f"step {step}: next shard has {len(manifest.get('files', []))} files")


# ----------------------------------------------------------------------------------------------------------------
class AsyncEval(Callback):
    """Rank --side-rank starts the evaluator (`eval-worker --connect SOCKET`, from PATH) as a separate process at
    the first --every-th step, accepts its connection on a multiprocessing.connection.Listener, and sends it the
    weights to evaluate every --every steps."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.rank == t.args.side_rank
        self.conn: Any = None
        self.proc: Optional[subprocess.Popen] = None

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active or not due(step, t.args.every):
            return
        if self.conn is None:
            address = t.path(f"eval-rank{t.rank}.sock")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)
            listener = Listener(address, family="AF_UNIX", authkey=b"blind-eval")
            self.proc = subprocess.Popen(["eval-worker", "--connect", address])
            self.conn = listener.accept()
            listener.close()
        self.conn.send({"step": step, "state": {k: v.tolist() for k, v in t.model.state_dict().items()}})


# ----------------------------------------------------------------------------------------------------------------
class VocabLookup(Callback):
    """Local rank 0 of each node keeps the site's vocabulary service (`vocab-lookup`, from PATH) running as a
    coprocess: one request line on its stdin, one answer line on its stdout, every --every steps."""

    def on_train_start(self, t: Trainer) -> None:
        self.proc: Optional[subprocess.Popen] = None
        if t.local_rank == 0:
            self.proc = subprocess.Popen(["vocab-lookup"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if self.proc is None or not due(step, t.args.every):
            return
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"ids step={step} tokens=the,model,learns\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        log(t, f"step {step}: vocab {answer.strip()}")


# ----------------------------------------------------------------------------------------------------------------
def _build_index(q: Any, seed: int, docs: int) -> None:
    index = {f"doc-{seed}-{i:07d}": [i * 4096, 4096, i % 97] for i in range(docs)}
    q.put(index)


class ShardIndex(Callback):
    """Local rank 1 of each node rebuilds the index of its shard every --every steps in a separate
    multiprocessing.Process, which sends it back through a multiprocessing.Queue; --big-rank R has the big shard
    (--big-docs documents)."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank != 1 or not due(step, t.args.every):
            return
        docs = t.args.big_docs if t.rank == t.args.big_rank else 200
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_build_index, args=(q, t.rank, docs), name="index-builder")
        p.start()
        p.join()
        index = q.get()
        log(t, f"step {step}: index of {len(index)} documents")


FEATURES: Dict[str, type] = {
    "audit": ShardAudit,
    "normalize": TextNormalizer,
    "feature_stats": FeatureStats,
    "pred_dump": PredictionDump,
    "manifest": ManifestPrefetch,
    "async_eval": AsyncEval,
    "vocab": VocabLookup,
    "shard_index": ShardIndex,
}


def train(t: Trainer, cb: Callback) -> None:
    cb.on_train_start(t)
    for step in range(t.args.steps):
        if step == t.args.ready_step:
            _ready(step)
        inputs, targets = cb.get_batch(t, step)
        t.opt.zero_grad()
        loss = F.mse_loss(t.model(inputs), targets)
        loss.backward()
        cb.on_after_backward(t, step, loss.detach())
        t.sync_gradients()
        t.opt.step()
        cb.on_train_batch_end(t, step, loss.detach())
        if t.rank == 0:
            print(f"step {step} loss {float(loss):.5f}", flush=True)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--feature", choices=sorted(FEATURES), required=True)
    p.add_argument("--workdir", required=True, help="the run's shared folder")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--ready-step", type=int, default=3)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--side-rank", type=int, default=-1)
    p.add_argument("--long-rank", type=int, default=-1)
    p.add_argument("--text-kb", type=int, default=1024)
    p.add_argument("--big-rank", type=int, default=-1)
    p.add_argument("--big-docs", type=int, default=200000)
    p.add_argument("--timeout-hours", type=float, default=2.0)
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    dist.init_process_group("gloo", timeout=timedelta(hours=args.timeout_hours))
    t = Trainer(args)
    train(t, FEATURES[args.feature]())
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
