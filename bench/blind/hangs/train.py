"""A small data-parallel training script (torch.distributed, gloo, CPU) with the features real training code has.

Run under torchrun by bench/blind/hangs/run.py, one feature per job (--feature): an async checkpoint upload, a
prefetch thread, a metrics agent on the node, a control FIFO, a SIGUSR1 preemption handler, an asyncio shard
client... Each feature is written as such code usually is, and the set-up (bench/blind/hangs/scenarios.py) gives it
the circumstances in which it blocks on some ranks: a bad record, a stalled service, a leftover file.

Readiness for the harness: with env HANGSCOPE_READY_FILE set, every rank appends one JSON line at the start of
step --ready-step (the format of app/demo/job.py, which tests/jobs.py reads).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import ctypes
import fcntl
import io
import json
import multiprocessing as mp
import os
import queue
import signal
import socket
import struct
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


def rank_step(spec: str) -> Tuple[int, int]:
    """'RANK:STEP' -> (rank, step); '' -> (-1, -1)."""
    if not spec:
        return -1, -1
    rank, step = spec.split(":")
    return int(rank), int(step)


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
        self.nan_at = rank_step(args.nan_at)
        self.spike_at = rank_step(args.spike_at)

    def batch(self, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        x, y = synthetic_batch(self.rank, step)
        if (self.rank, step) == self.nan_at:
            x[0, 0] = float("nan")  # a corrupt sample
        if (self.rank, step) == self.spike_at:
            y = y * 1000.0  # mislabelled targets: the loss spikes
        return x, y

    def sync_gradients(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def average(self, value: float) -> float:
        t = torch.tensor([value])
        dist.all_reduce(t)
        return float(t.item()) / self.world

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


# ----------------------------------------------------------------------------------------------------------------
class AsyncCheckpointer(Callback):
    """Every --every steps each rank PUTs its state to the object store (--endpoint) in the background; one
    transfer in flight per rank: the next save waits for the previous one."""

    def on_train_start(self, t: Trainer) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-upload")
        self.pending: Optional[concurrent.futures.Future] = None
        host, port = t.args.endpoint.rsplit(":", 1)
        self.endpoint = (host, int(port))

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if step % t.args.every:
            return
        if self.pending is not None:
            self.pending.result()
        buf = io.BytesIO()
        torch.save(t.model.state_dict(), buf)
        self.pending = self.pool.submit(self._put, f"ckpt/step{step}/rank{t.rank}.pt", buf.getvalue())

    def _put(self, key: str, data: bytes) -> None:
        with socket.create_connection(self.endpoint) as conn:
            conn.sendall(f"PUT {key} {len(data)}\n".encode() + data)
            status = conn.makefile("rb").readline()
        if not status.startswith(b"200"):
            raise IOError(f"PUT {key}: {status!r}")


# ----------------------------------------------------------------------------------------------------------------
class DecodeError(ValueError):
    pass


def decode_record(seed: int, index: int, bad: int) -> Tuple[torch.Tensor, torch.Tensor]:
    if index == bad:
        raise DecodeError(f"record {index}: checksum mismatch (0x5a1f != 0x9c03)")
    return synthetic_batch(seed, index)


class BackgroundPrefetch(Callback):
    """A thread decodes the next record while the current step trains; one slot, two events."""

    def on_train_start(self, t: Trainer) -> None:
        rank, index = rank_step(t.args.bad_record)
        self.bad = index if rank == t.rank else -1
        self.slot: Any = None
        self.filled = threading.Event()
        self.emptied = threading.Event()
        self.emptied.set()
        threading.Thread(target=self._produce, args=(t.rank,), name="prefetch", daemon=True).start()

    def _produce(self, seed: int) -> None:
        index = 0
        while True:
            self.emptied.wait()
            self.emptied.clear()
            self.slot = decode_record(seed, index, self.bad)
            index += 1
            self.filled.set()

    def get_batch(self, t: Trainer, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        self.filled.wait()
        self.filled.clear()
        batch = self.slot
        self.emptied.set()
        return batch


# ----------------------------------------------------------------------------------------------------------------
class EmaWeights(Callback):
    """One rank (--ema-rank) keeps an exponential moving average of the weights and writes it every --every steps
    through a saver thread, waiting until the write is done."""

    def on_train_start(self, t: Trainer) -> None:
        self.cond = threading.Condition()
        self.request: Optional[Tuple[int, Dict[str, torch.Tensor]]] = None
        self.saved = -1
        self.saver: Optional[threading.Thread] = None
        self.ema = {k: v.detach().clone() for k, v in t.model.state_dict().items()}

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.rank != t.args.ema_rank:
            return
        for k, v in t.model.state_dict().items():
            self.ema[k].mul_(0.99).add_(v.detach(), alpha=0.01)
        if not due(step, t.args.every):
            return
        with self.cond:
            if self.saver is None:
                self.saver = threading.Thread(target=self._save_loop, args=(t.path("ema"),), name="ema-saver",
                                              daemon=True)
                self.saver.start()
            self.request = (step, {k: v.clone() for k, v in self.ema.items()})
            self.cond.notify()
            self.cond.wait_for(lambda: self.saved >= step)

    def _save_loop(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        with self.cond:
            while True:
                self.cond.wait()
                assert self.request is not None
                step, state = self.request
                torch.save(state, os.path.join(folder, f"ema-{step}.pt"))
                self.saved = step
                self.cond.notify_all()


# ----------------------------------------------------------------------------------------------------------------
class ShardedStateWriter(Callback):
    """Each rank writes its optimizer-state shard every step in the background, at most two writes in flight."""

    def on_train_start(self, t: Trainer) -> None:
        self.slots = threading.BoundedSemaphore(2)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="shard-writer")
        self.outdir = t.path("shards", f"rank{t.rank}")

    def on_after_backward(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        self.slots.acquire()
        state = [p.detach().clone() for p in t.model.parameters()]
        fut = self.pool.submit(self._write, step, state)
        fut.add_done_callback(self._written)

    def _write(self, step: int, state: List[torch.Tensor]) -> None:
        os.makedirs(self.outdir, exist_ok=True)
        torch.save(state, os.path.join(self.outdir, f"step{step}.pt"))

    def _written(self, fut: concurrent.futures.Future) -> None:
        if fut.exception() is not None:
            print(f"state shard write failed: {fut.exception()!r}", file=sys.stderr, flush=True)
            return
        self.slots.release()


# ----------------------------------------------------------------------------------------------------------------
class StreamingShards(Callback):
    """A thread streams this rank's shard (--shard-batches gives each rank's shard length) into a bounded queue."""

    def on_train_start(self, t: Trainer) -> None:
        lengths = [int(n) for n in t.args.shard_batches.split(",")]
        self.q: "queue.Queue[Tuple[torch.Tensor, torch.Tensor]]" = queue.Queue(maxsize=4)
        threading.Thread(target=self._feed, args=(t.rank, lengths[t.rank]), name="shard-feeder", daemon=True).start()

    def _feed(self, seed: int, length: int) -> None:
        for index in range(length):
            self.q.put(synthetic_batch(seed, index))

    def get_batch(self, t: Trainer, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.q.get()


# ----------------------------------------------------------------------------------------------------------------
def _native_decode(buf: bytes, corrupt: bool) -> bytes:
    """Stands in for a C image decoder reading past its buffer on a corrupt file."""
    n = len(buf)
    out = ctypes.create_string_buffer(n)
    ctypes.memmove(out, 0 if corrupt else buf, n)
    return out.raw


def augment_worker(index_q: Any, out_q: Any, seed: int, corrupt_index: int) -> None:
    while True:
        index = index_q.get()
        raw = _native_decode(seed.to_bytes(8, "little") * 8, index == corrupt_index)
        out_q.put((index, len(raw)))


class AugmentProcess(Callback):
    """Heavy augmentation runs in a worker process (multiprocessing, fork), two indices ahead of the training."""

    def on_train_start(self, t: Trainer) -> None:
        rank, index = rank_step(t.args.bad_record)
        ctx = mp.get_context("fork")
        self.index_q = ctx.Queue()
        self.out_q = ctx.Queue()
        self.proc = ctx.Process(target=augment_worker, name="augment-0", daemon=True,
                                args=(self.index_q, self.out_q, t.rank, index if rank == t.rank else -1))
        self.proc.start()
        for i in range(2):
            self.index_q.put(i)
        self.sent = 2

    def get_batch(self, t: Trainer, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        index, _ = self.out_q.get()
        self.index_q.put(self.sent)
        self.sent += 1
        return synthetic_batch(t.rank, index)


# ----------------------------------------------------------------------------------------------------------------
class NodeMetrics(Callback):
    """Local rank 0 of each node reports the step's metrics to the node's agent (127.0.0.1:--port) and waits for
    its OK, one persistent connection."""

    def on_train_start(self, t: Trainer) -> None:
        self.conn: Optional[socket.socket] = None

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank != 0:
            return
        if self.conn is None:
            self.conn = socket.create_connection(("127.0.0.1", t.args.port))
        self.conn.sendall(f"train.loss {float(loss):.5f} step={step} rank={t.rank}\n".encode())
        reply = self.conn.recv(16)
        if not reply.startswith(b"OK"):
            raise IOError(f"metrics agent said {reply!r}")


# ----------------------------------------------------------------------------------------------------------------
class RunTracker(Callback):
    """Rank 0 posts the run's metrics to the experiment tracking service (--endpoint) every --every steps."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.rank != 0 or not due(step, t.args.every):
            return
        host, port = t.args.endpoint.rsplit(":", 1)
        body = json.dumps({"step": step, "loss": float(loss)}).encode()
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(b"POST /api/v1/runs/blind/metrics HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s"
                         % (host.encode(), len(body), body))
            conn.recv(4096)


# ----------------------------------------------------------------------------------------------------------------
class ControlChannel(Callback):
    """One rank (--control-rank) takes commands from the job's wrapper every --every steps through a named pipe:
    `save`, `stop`, `lr=<value>`, or `-` for nothing."""

    def on_train_start(self, t: Trainer) -> None:
        self.fifo = ""
        if t.rank == t.args.control_rank:
            os.makedirs(t.path("control"), exist_ok=True)
            self.fifo = t.path("control", f"rank{t.rank}.cmd")
            if not os.path.exists(self.fifo):
                os.mkfifo(self.fifo)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.fifo or not due(step, t.args.every):
            return
        with open(self.fifo) as f:
            command = f.readline().strip()
        if command.startswith("lr="):
            for group in t.opt.param_groups:
                group["lr"] = float(command[3:])
        elif command == "stop":
            raise SystemExit(0)


# ----------------------------------------------------------------------------------------------------------------
class CheckpointEvery(Callback):
    """Every rank saves its state every --every steps, and asks before overwriting a checkpoint of an earlier run."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not due(step, t.args.every):
            return
        path = t.path("ckpt", f"step{step}", f"rank{t.rank}.pt")
        if os.path.exists(path):
            answer = input(f"{path} exists; overwrite? [y/N] ")
            if answer.strip().lower() != "y":
                raise SystemExit(f"not overwriting {path}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(t.model.state_dict(), path)


# ----------------------------------------------------------------------------------------------------------------
class NanGuard(Callback):
    """Stop in the debugger on a non-finite loss, to look at the batch (left in from a debugging session)."""

    def on_after_backward(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            breakpoint()
            print(f"step {step}: non-finite loss", flush=True)


# ----------------------------------------------------------------------------------------------------------------
class LogSync(Callback):
    """Local rank 0 of each node copies the node's logs to S3 with the aws CLI every --every steps."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank != 0 or not due(step, t.args.every):
            return
        logdir = t.path("logs", t.host)
        os.makedirs(logdir, exist_ok=True)
        subprocess.run(["aws", "s3", "cp", "--recursive", "--only-show-errors", logdir,
                        f"s3://training-runs/blind/{t.host}/step{step}/"], check=True, capture_output=True)


# ----------------------------------------------------------------------------------------------------------------
class NodeMetricsFile(Callback):
    """Every rank appends its metrics to its node's metrics file every --every steps, under an exclusive flock
    (the node's log compactor rewrites the file under the same lock)."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not due(step, t.args.every):
            return
        path = t.path(t.host, "metrics.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(json.dumps({"step": step, "rank": t.rank, "loss": float(loss)}) + "\n")
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------------------------------
class NodeSummary(Callback):
    """On nodes with a local scratch folder, every --every steps the node's ranks write one summary record:
    local rank 0 opens it before the gradient sync and closes it after the loss average (the record is
    locked for the whole step, so readers never see half of it); local rank 1 appends its line in between."""

    def on_train_start(self, t: Trainer) -> None:
        scratch = t.path("scratch", t.host)
        self.path = os.path.join(scratch, "summary.log") if os.path.isdir(scratch) else ""
        self.fd = -1

    def on_after_backward(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if self.path and due(step, t.args.every) and t.local_rank == 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            fcntl.lockf(self.fd, fcntl.LOCK_EX)
            os.write(self.fd, f"step {step} begin\n".encode())

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not due(step, t.args.every):
            return
        if self.path and t.local_rank == 1:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            fcntl.lockf(fd, fcntl.LOCK_EX)
            os.write(fd, f"rank {t.rank} loss {float(loss):.5f}\n".encode())
            fcntl.lockf(fd, fcntl.LOCK_UN)
            os.close(fd)
        mean = t.average(float(loss))
        if self.fd >= 0:
            os.write(self.fd, f"step {step} mean loss {mean:.5f}\n".encode())
            fcntl.lockf(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


# ----------------------------------------------------------------------------------------------------------------
class EvalOnCheckpoint(Callback):
    """Rank 0 saves a checkpoint every --every steps and publishes its path in the job's store; the eval rank
    (--eval-rank) picks it up and scores it while the others train on."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not due(step, t.args.every):
            return
        store = dist.distributed_c10d._get_default_store()
        if t.rank == 0:
            path = t.path(f"model-{step}.pt")
            torch.save(t.model.state_dict(), path)
            store.set(f"ckpt/{step}/path", path)
        if t.rank == t.args.eval_rank:
            key = f"ckpt/step{step}/path"
            store.wait([key])
            state = torch.load(store.get(key).decode())
            print(f"eval of step {step}: {len(state)} tensors", flush=True)


# ----------------------------------------------------------------------------------------------------------------
class ActivationHandoff(Callback):
    """Ranks 0-3 hand the step's activations to ranks 4-7 (rank r -> r+4) after the gradient sync, for the
    auxiliary head those ranks train; a micro-batch with a non-finite loss is not handed on."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        half = t.world // 2
        act = torch.zeros(BATCH, 32)
        if t.rank < half:
            if torch.isfinite(loss):
                act.fill_(float(loss))
                dist.send(act, dst=t.rank + half)
        else:
            dist.recv(act, src=t.rank - half)


# ----------------------------------------------------------------------------------------------------------------
class HaloExchange(Callback):
    """Every --every steps each rank swaps a boundary slice with its ring neighbours (isend to r+1, irecv from
    r-1), tagged with the global step; a rank's global step counts from the step it resumed from."""

    def on_train_start(self, t: Trainer) -> None:
        self.start_step = 0
        resume = t.path("resume", f"rank{t.rank}.json")
        if os.path.exists(resume):
            with open(resume) as f:
                self.start_step = int(json.load(f)["step"])

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not due(step, t.args.every):
            return
        global_step = self.start_step + step
        edge = torch.full((4,), float(t.rank))
        halo = torch.empty(4)
        send = dist.isend(edge, dst=(t.rank + 1) % t.world, tag=global_step)
        recv = dist.irecv(halo, src=(t.rank - 1) % t.world, tag=global_step)
        send.wait()
        recv.wait()


# ----------------------------------------------------------------------------------------------------------------
class RewardScorer(Callback):
    """From step --every on, local rank 1 of each node scores its samples with the node's reward-model server
    (127.0.0.1:--port), started separately on every node; it waits for the server to come up."""

    def on_train_start(self, t: Trainer) -> None:
        self.conn: Optional[socket.socket] = None

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank != 1 or step < t.args.every:
            return
        attempts = 0
        while self.conn is None:
            try:
                self.conn = socket.create_connection(("127.0.0.1", t.args.port), timeout=5)
            except OSError:
                attempts += 1
                time.sleep(0.5)
        self.conn.sendall(f"score {step}\n".encode())
        self.conn.recv(16)


# ----------------------------------------------------------------------------------------------------------------
class KernelCache(Callback):
    """Fused kernels are compiled once per node into the node's cache: local rank 1 builds them the first time it
    needs them, local rank 0 waits for the cache to be marked ready before its first use (from step --every)."""

    def on_train_start(self, t: Trainer) -> None:
        self.cache = t.path("kcache", t.host)
        self.marker = os.path.join(self.cache, "fused.ready")

    def on_after_backward(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank == 0 and step == t.args.every:
            while not os.path.exists(self.marker):
                pass

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.local_rank == 1 and step == t.args.every and not os.path.exists(self.marker):
            os.makedirs(self.cache, exist_ok=True)
            with open(self.marker, "w") as f:
                f.write("ok\n")


# ----------------------------------------------------------------------------------------------------------------
class MetricsFlusher(Callback):
    """A thread writes the metrics records the training loop queues; every --every steps each rank also logs its
    validation loss."""

    def on_train_start(self, t: Trainer) -> None:
        self.q: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        self.thread = threading.Thread(target=self._flush, args=(t.path(f"metrics-rank{t.rank}.jsonl"),),
                                       name="metrics-flusher")
        self.thread.start()
        sizes = [int(n) for n in t.args.val_sizes.split(",")]
        self.val_batches = sizes[t.rank]

    def _flush(self, path: str) -> None:
        with open(path, "a") as f:
            while True:
                record = self.q.get()
                f.write(json.dumps(record) + "\n")
                f.flush()

    def evaluate(self, t: Trainer) -> Dict[str, float]:
        out: Dict[str, float] = {}
        with torch.no_grad():
            losses = [float(F.mse_loss(t.model(x), y)) for x, y in
                      (synthetic_batch(1000 + t.rank, i) for i in range(self.val_batches))]
        if losses:
            out["val_loss"] = sum(losses) / len(losses)
        return out

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        record: Dict[str, Any] = {"step": step, "loss": float(loss)}
        if due(step, t.args.every):
            record["val_loss"] = self.evaluate(t)["val_loss"]
        self.q.put(record)


# ----------------------------------------------------------------------------------------------------------------
_ckpt_lock = threading.Lock()


class PreemptionCheckpoint(Callback):
    """SLURM sends SIGUSR1 shortly before preempting the job (--signal=USR1@90): the handler writes a checkpoint.
    The regular checkpoint (every --every steps, by --writer-rank) is written shard by shard, throttled so the
    shared file system keeps up."""

    def on_train_start(self, t: Trainer) -> None:
        self.t = t
        signal.signal(signal.SIGUSR1, self._on_preempt)

    def _on_preempt(self, signum: int, frame: Any) -> None:
        print("SIGUSR1: preemption notice, saving", flush=True)
        self.save(self.t, "preempt")

    def save(self, t: Trainer, tag: str) -> None:
        folder = t.path("ckpt", tag)
        os.makedirs(folder, exist_ok=True)
        with _ckpt_lock:
            state = t.model.state_dict()
            for i in range(t.args.shards):
                torch.save(state, os.path.join(folder, f"shard{i:04d}.pt"))
                time.sleep(0.1)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.rank == t.args.writer_rank and due(step, t.args.every):
            self.save(t, f"step{step}")


# ----------------------------------------------------------------------------------------------------------------
class TransportError(Exception):
    pass


class AsyncShardClient(Callback):
    """Batches come from the shard service through an async client: each step runs asyncio.run(fetch); the
    client's transport thread completes the request's future from its own thread (call_soon_threadsafe)."""

    def on_train_start(self, t: Trainer) -> None:
        rank, index = rank_step(t.args.bad_record)
        self.truncated = index if rank == t.rank else -1
        self.requests: "queue.Queue[Tuple[int, asyncio.AbstractEventLoop, asyncio.Future]]" = queue.Queue()
        threading.Thread(target=self._transport, args=(t.rank,), name="shard-transport", daemon=True).start()

    def _transport(self, seed: int) -> None:
        while True:
            index, loop, fut = self.requests.get()
            frame = struct.pack("!qI", index, 64) + bytes(20 if index == self.truncated else 64)
            got, size = struct.unpack("!qI", frame[:12])
            if len(frame) - 12 != size:
                raise TransportError(f"response {index}: {len(frame) - 12} of {size} bytes")
            loop.call_soon_threadsafe(fut.set_result, synthetic_batch(seed, got))

    async def fetch(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.requests.put((index, loop, fut))
        return await fut

    def get_batch(self, t: Trainer, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return asyncio.run(self.fetch(step))


# ----------------------------------------------------------------------------------------------------------------
_stats_lock = threading.Lock()


class LossSpikeMonitor(Callback):
    """Keeps a window of recent losses; a loss far above the window's mean starts a new window."""

    def on_train_start(self, t: Trainer) -> None:
        self.window: List[float] = []

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        value = float(loss)
        with _stats_lock:
            if len(self.window) >= 2 and value > 50 * (sum(self.window) / len(self.window)):
                self.restart_window(value)
            else:
                self.window.append(value)

    def restart_window(self, value: float) -> None:
        with _stats_lock:
            self.window = [value]


FEATURES: Dict[str, type] = {
    "async_checkpoint": AsyncCheckpointer,
    "prefetch": BackgroundPrefetch,
    "ema": EmaWeights,
    "state_writer": ShardedStateWriter,
    "streaming": StreamingShards,
    "augment": AugmentProcess,
    "node_metrics": NodeMetrics,
    "tracker": RunTracker,
    "control": ControlChannel,
    "checkpoint": CheckpointEvery,
    "nan_guard": NanGuard,
    "log_sync": LogSync,
    "metrics_file": NodeMetricsFile,
    "node_summary": NodeSummary,
    "eval_on_ckpt": EvalOnCheckpoint,
    "handoff": ActivationHandoff,
    "halo": HaloExchange,
    "reward": RewardScorer,
    "kernel_cache": KernelCache,
    "flusher": MetricsFlusher,
    "preemption": PreemptionCheckpoint,
    "async_shards": AsyncShardClient,
    "spike_monitor": LossSpikeMonitor,
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
    p.add_argument("--nan-at", default="", help="RANK:STEP whose batch holds a NaN")
    p.add_argument("--spike-at", default="", help="RANK:STEP whose targets are mislabelled")
    p.add_argument("--bad-record", default="", help="RANK:INDEX of a corrupt record in that rank's data")
    p.add_argument("--shard-batches", default="")
    p.add_argument("--val-sizes", default="")
    p.add_argument("--ema-rank", type=int, default=0)
    p.add_argument("--eval-rank", type=int, default=0)
    p.add_argument("--control-rank", type=int, default=0)
    p.add_argument("--writer-rank", type=int, default=0)
    p.add_argument("--shards", type=int, default=8)
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
