"""A small data-parallel training script (torch.distributed, gloo, CPU) with the side-channels real training code
has: a weight server for a rollout worker, a tokenizer pool, a node cache lock, a shared stats manager, a snapshot
handshake with the node agent, a profiler thread, a checkpoint hook, a histogram exporter, a pinned-batch packer,
a rate-limited registry client.

Run under torchrun by bench/blind/waits/run.py, one feature per job (--feature). Each feature is written as such
code usually is; the set-up (bench/blind/waits/scenarios.py) gives it the circumstances in which it blocks on
one rank: a client that never comes, a worker killed by the OOM killer, a lock file left by a crashed run...

Readiness for the harness: with env HANGSCOPE_READY_FILE set, every rank appends one JSON line at the start of
step --ready-step (the format tests/support/jobs.py reads).
"""

from __future__ import annotations

import argparse
import errno
import json
import multiprocessing as mp
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
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
class WeightServer(Callback):
    """RL-style weight sync: every --every steps rank 0 serves the current weights to the rollout worker on a side
    channel (0.0.0.0:--port): it waits for the worker to connect, sends the state, and trains on."""

    def on_train_start(self, t: Trainer) -> None:
        self.srv: Optional[socket.socket] = None
        if t.rank == 0:
            self.srv = socket.create_server(("0.0.0.0", t.args.port), backlog=1)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if self.srv is None or not due(step, t.args.every):
            return
        log(t, f"step {step}: serving weights on port {t.args.port}, waiting for the rollout worker")
        conn, peer = self.srv.accept()
        with conn:
            payload = json.dumps({k: v.tolist() for k, v in t.model.state_dict().items()}).encode()
            conn.sendall(len(payload).to_bytes(8, "big") + payload)


# ----------------------------------------------------------------------------------------------------------------
def tokenize_chunk(chunk: List[str]) -> int:
    """Counts tokens of a chunk of documents; a pathological document (one huge line without separators) makes
    the byte-level fallback build its table in memory."""
    total = 0
    for doc in chunk:
        if doc.startswith("<huge>"):
            print(f"tokenizer worker {os.getpid()}: huge document, building the byte table", file=sys.stderr,
                  flush=True)
            table = []
            while True:  # grows until the OOM killer takes the process
                table.append(bytearray(1 << 20))
                time.sleep(0.05)
        total += len(doc.split())
    return total


class TokenizerPool(Callback):
    """Each rank tokenizes the next shard's documents in a multiprocessing.Pool of 2 workers every --every steps
    (--huge-doc RANK:STEP puts a pathological document into that rank's shard at that step)."""

    def on_train_start(self, t: Trainer) -> None:
        self.pool = mp.get_context("fork").Pool(2)
        rank, step = (int(x) for x in t.args.huge_doc.split(":")) if t.args.huge_doc else (-1, -1)
        self.huge_step = step if rank == t.rank else -1

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not due(step, t.args.every):
            return
        docs = [f"doc {i} of step {step} " * 8 for i in range(64)]
        if step == self.huge_step:
            docs[17] = "<huge>" + "x" * 1000
        chunks = [docs[i:i + 8] for i in range(0, len(docs), 8)]
        tokens = sum(self.pool.map(tokenize_chunk, chunks))
        log(t, f"step {step}: tokenized {tokens} tokens for the next shard")


# ----------------------------------------------------------------------------------------------------------------
class NodeCacheLock(Callback):
    """Local rank 0 of each node refreshes the node's dataset index cache every --every steps, under a lock file
    (O_CREAT|O_EXCL, its pid in it) so that two jobs on the node never write the cache at once; it retries every
    second while somebody else holds it."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank != 0 or not due(step, t.args.every):
            return
        cache = t.path("cache", t.host)
        os.makedirs(cache, exist_ok=True)
        lock = os.path.join(cache, "index.lock")
        while True:
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                break
            except FileExistsError:
                time.sleep(1.0)
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
            with open(os.path.join(cache, "index.json"), "w") as f:
                json.dump({"step": step, "shards": 64}, f)
        finally:
            os.close(fd)
            os.unlink(lock)


# ----------------------------------------------------------------------------------------------------------------
def _stats_worker(stats: Any, seed: int) -> None:
    for _ in range(3):
        stats[f"worker{seed}.samples"] = stats.get(f"worker{seed}.samples", 0) + BATCH


class SharedStats(Callback):
    """Each rank keeps its data statistics in a multiprocessing.Manager() dict shared with its loader processes,
    and reads them back every --every steps to log them."""

    def on_train_start(self, t: Trainer) -> None:
        self.manager = mp.get_context("fork").Manager()
        self.stats = self.manager.dict()
        p = mp.get_context("fork").Process(target=_stats_worker, args=(self.stats, t.rank), daemon=True)
        p.start()
        p.join()
        with open(t.path(f"manager-rank{t.rank}.pid"), "w") as f:
            f.write(f"{self.manager._process.pid}\n")

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        self.stats["steps"] = step
        if due(step, t.args.every):
            snapshot = dict(self.stats.items())
            log(t, f"step {step}: data stats {snapshot}")


# ----------------------------------------------------------------------------------------------------------------
class SnapshotHandshake(Callback):
    """Every --every steps local rank 0 of each node asks the node's snapshot agent to snapshot the local NVMe
    cache (a request file in the agent's spool folder, with its pid) and waits for the agent's SIGUSR2 saying the
    snapshot is done before it lets the node's ranks write into the cache again."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank != 0 or not due(step, t.args.every):
            return
        spool = t.path("spool", t.host)
        os.makedirs(spool, exist_ok=True)
        tmp = os.path.join(spool, f".req-{step}")
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()} snapshot /local/nvme/cache step={step}\n")
        os.rename(tmp, os.path.join(spool, f"req-{step}"))
        signal.sigwait({signal.SIGUSR2})


# ----------------------------------------------------------------------------------------------------------------
class ProfilerWindow(Callback):
    """One rank (--profile-rank) profiles steps 1-2: a writer thread drains the samples queue to a file until it is
    told to stop; at the end of the window the main thread sets the stop flag and joins the writer."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.rank == t.args.profile_rank
        if not self.active:
            return
        self.samples: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        self.stop = threading.Event()
        self.writer = threading.Thread(target=self._write, args=(t.path(f"profile-rank{t.rank}.jsonl"),),
                                       name="profile-writer")
        self.writer.start()

    def _write(self, path: str) -> None:
        with open(path, "w") as f:
            while not self.stop.is_set():
                sample = self.samples.get()
                f.write(json.dumps(sample) + "\n")

    def on_after_backward(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if self.active and 1 <= step <= 2:
            self.samples.put({"step": step, "loss": float(loss), "t": time.time()})

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if self.active and step == t.args.every:
            self.stop.set()
            self.writer.join()
            self.active = False
            log(t, "profile written")


# ----------------------------------------------------------------------------------------------------------------
class CheckpointHook(Callback):
    """Every --every steps local rank 0 of each node saves a checkpoint and runs the site's post-checkpoint hook
    (`ckpt-hook PATH`, from PATH) capturing its output for the log."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank != 0 or not due(step, t.args.every):
            return
        path = t.path("ckpt", t.host, f"step{step}.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(t.model.state_dict(), path)
        res = subprocess.run(["ckpt-hook", path], capture_output=True, text=True)
        log(t, f"ckpt-hook exited {res.returncode}: {res.stdout.strip()}")


# ----------------------------------------------------------------------------------------------------------------
class HistogramExporter(Callback):
    """Local rank 1 of each node streams the step's activation histograms to the node's metrics collector
    (127.0.0.1:--port), fire-and-forget over one persistent TCP connection (--hist-mb MB a step)."""

    def on_train_start(self, t: Trainer) -> None:
        self.conn: Optional[socket.socket] = None

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank != 1:
            return
        if self.conn is None:
            self.conn = socket.create_connection(("127.0.0.1", t.args.port))
        hist = torch.histc(torch.randn(1024), bins=64)
        record = (json.dumps({"step": step, "rank": t.rank, "hist": hist.tolist()}) + "\n").encode()
        blob = record * max(1, (t.args.hist_mb << 20) // len(record))
        self.conn.sendall(blob)


# ----------------------------------------------------------------------------------------------------------------
class PackingError(ValueError):
    pass


class PinnedPacker(Callback):
    """A packer thread packs each step's sequences into the pinned buffer; it and the main thread meet at a
    two-party threading.Barrier before and after each fill (the main thread reads the buffer between)."""

    def on_train_start(self, t: Trainer) -> None:
        self.meet = threading.Barrier(2)
        self.buffer = torch.zeros(BATCH, FEATURES_IN)
        self.bad = t.args.ragged_at if t.rank == t.args.ragged_rank else -1
        threading.Thread(target=self._pack, args=(t.rank,), name="packer", daemon=True).start()

    def _pack(self, seed: int) -> None:
        index = 0
        while True:
            self.meet.wait()
            if index == self.bad:
                raise PackingError(f"sequence {index}: length 4097 > max_seq_len 4096 after packing")
            x, _ = synthetic_batch(seed, index)
            self.buffer.copy_(x)
            index += 1
            self.meet.wait()

    def get_batch(self, t: Trainer, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        self.meet.wait()  # the packer may fill the buffer
        self.meet.wait()  # the buffer is full
        x = self.buffer.clone()
        return x, x.sum(dim=1, keepdim=True) * 0.1


# ----------------------------------------------------------------------------------------------------------------
class RateLimited(IOError):
    def __init__(self, retry_after: float) -> None:
        super().__init__(f"429 Too Many Requests, Retry-After: {retry_after:.0f}")
        self.retry_after = retry_after


def retrying(fn: Any, attempts: int = 8, base: float = 0.5, cap: float = 3600.0) -> Any:
    """Retry with exponential backoff; honour the server's Retry-After when it sends one."""
    for attempt in range(attempts):
        try:
            return fn()
        except RateLimited as exc:
            time.sleep(min(cap, max(exc.retry_after, base * 2 ** attempt)))
        except OSError:
            time.sleep(min(cap, base * 2 ** attempt))
    return fn()


class ModelRegistry(Callback):
    """Every --every steps rank --registry-rank registers the checkpoint with the model registry (--endpoint)."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.rank != t.args.registry_rank or not due(step, t.args.every):
            return
        host, port = t.args.endpoint.rsplit(":", 1)

        def register() -> None:
            with socket.create_connection((host, int(port)), timeout=30) as conn:
                conn.sendall(f"REGISTER blind-run step={step} loss={float(loss):.5f}\n".encode())
                status = conn.makefile("rb").readline().decode().strip()
            if status.startswith("429"):
                raise RateLimited(float(status.split("Retry-After:", 1)[1]))
            if not status.startswith("200"):
                raise IOError(errno.EIO, status)

        retrying(register)
        log(t, f"step {step}: registered")


FEATURES: Dict[str, type] = {
    "weight_server": WeightServer,
    "tokenizer_pool": TokenizerPool,
    "cache_lock": NodeCacheLock,
    "shared_stats": SharedStats,
    "snapshot_handshake": SnapshotHandshake,
    "profiler": ProfilerWindow,
    "ckpt_hook": CheckpointHook,
    "histograms": HistogramExporter,
    "packer": PinnedPacker,
    "registry": ModelRegistry,
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
    p.add_argument("--endpoint", default="")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--huge-doc", default="", help="RANK:STEP whose shard holds a pathological document")
    p.add_argument("--profile-rank", type=int, default=-1)
    p.add_argument("--hist-mb", type=int, default=4)
    p.add_argument("--ragged-rank", type=int, default=-1)
    p.add_argument("--ragged-at", type=int, default=-1, help="the sequence index the ragged rank cannot pack")
    p.add_argument("--registry-rank", type=int, default=0)
    p.add_argument("--timeout-hours", type=float, default=2.0)
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.feature == "snapshot_handshake":  # before any thread starts, so that only sigwait() takes SIGUSR2
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    dist.init_process_group("gloo", timeout=timedelta(hours=args.timeout_hours))
    t = Trainer(args)
    train(t, FEATURES[args.feature]())
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
