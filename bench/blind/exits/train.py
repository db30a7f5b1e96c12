"""A small data-parallel training script (torch.distributed, gloo, CPU) with the end-of-run machinery real training
code carries: a prediction stream to a writer process, a checkpoint mirror process, background checkpoint uploads,
a metrics aggregator with its own process group and an atexit hook, a console report, a checkpoint finaliser
thread that notifies the node's job-event daemon, a prefetch thread with early stopping, and a compressed trace.

Run under torchrun by bench/blind/exits/run.py, one feature per job (--feature). Each feature is written as such
code usually is; the set-up (bench/blind/exits/scenarios.py) gives it the circumstances it meets on one rank.

Each run: --steps training steps, then the final evaluation on the rank's held-out shard (eval/rank<R>.pt), the
feature's end-of-run hook, the final metrics all_reduce, the feature's after-sync hook, a barrier, and
destroy_process_group.

Readiness for the harness: with env HANGSCOPE_READY_FILE set, every rank appends one JSON line at the start of
step --ready-step (the format tests/support/jobs.py reads).
"""

from __future__ import annotations

import argparse
import atexit
import http.client
import json
import math
import multiprocessing as mp
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

FEATURES_IN = 16
BATCH = 8
EVENTS = "/run/job-events.fifo"  # the node's job-event daemon reads job events from here
GATEWAY = ("127.0.0.1", 9107)  # the node's object-storage gateway (HTTP)


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


def synthetic_batch(seed: int, index: int, n: int = BATCH) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 100003 + index)
    x = torch.randn(n, FEATURES_IN, generator=gen)
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
        os.makedirs(self.path("logs"), exist_ok=True)
        self.logfile = open(self.path("logs", f"rank{self.rank}.log"), "a", buffering=1)

    def batch(self, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.args.step_delay)  # the input pipeline's latency (the data is synthetic here)
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

    def validate(self) -> float:
        """The loss on this rank's held-out shard."""
        shard = torch.load(self.path("eval", f"rank{self.rank}.pt"))
        with torch.no_grad():
            return float(F.mse_loss(self.model(shard["x"]), shard["y"]))

    def evaluate(self) -> float:
        """The final evaluation: refuses to report a non-finite loss."""
        loss = self.validate()
        if not math.isfinite(loss):
            raise FloatingPointError(f"rank {self.rank}: non-finite evaluation loss ({loss})")
        return loss


class Callback:
    def on_train_start(self, t: Trainer) -> None:
        pass

    def get_batch(self, t: Trainer, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return t.batch(step)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        pass

    def on_train_end(self, t: Trainer) -> None:
        pass

    def after_sync(self, t: Trainer, totals: torch.Tensor) -> None:
        pass


def due(step: int, every: int) -> bool:
    return step > 0 and step % every == 0


def log(t: Trainer, text: str) -> None:
    t.logfile.write(f"{time.strftime('%H:%M:%S')} [rank {t.rank}] {text}\n")


# ----------------------------------------------------------------------------------------------------------------
def _write_predictions(q: "mp.Queue[Any]", path: str) -> None:
    """The prediction writer (a child process): appends each step's predictions to the rank's file."""
    with open(path, "ab") as out:
        while True:
            item = q.get()
            if item is None:
                return
            step, blob = item
            out.write(step.to_bytes(4, "little") + len(blob).to_bytes(4, "little") + blob)


class PredictionStream(Callback):
    """Every --every steps each rank streams its predictions on the probe set (--probe rows) to a writer process
    (`pred-writer`, daemon) through a multiprocessing.Queue, which appends them to preds/rank<R>.bin; at the end
    the rank checks its writer and waits until everything is written."""

    def on_train_start(self, t: Trainer) -> None:
        ctx = mp.get_context("fork")
        os.makedirs(t.path("preds"), exist_ok=True)
        self.q = ctx.Queue()
        self.writer = ctx.Process(target=_write_predictions, args=(self.q, t.path("preds", f"rank{t.rank}.bin")),
                                  name="pred-writer", daemon=True)
        self.writer.start()
        self.probe, _ = synthetic_batch(30_000, 0, t.args.probe)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if step % t.args.every:
            return
        with torch.no_grad():
            preds = t.model(self.probe)
        self.q.put((step, preds.numpy().tobytes()))

    def on_train_end(self, t: Trainer) -> None:
        if self.writer.exitcode is not None:
            raise RuntimeError(f"rank {t.rank}: prediction writer exited with code {self.writer.exitcode}; "
                               f"predictions in {t.path('preds')} are incomplete")
        self.q.put(None)
        self.writer.join()


# ----------------------------------------------------------------------------------------------------------------
def _mirror_loop(conn: Any, folder: str) -> None:
    """The checkpoint mirror (a child process): copies each checkpoint it is sent to the node's folder."""
    os.makedirs(folder, exist_ok=True)
    while True:
        path = conn.recv()
        if path is None:
            return
        shutil.copy2(path, os.path.join(folder, os.path.basename(path)))


class CheckpointMirror(Callback):
    """Local rank 0 of each node saves a checkpoint every --every steps and has a child process (`ckpt-mirror`)
    copy it to the node's mirror folder (mirror/<host>/), sending it the path over a Pipe. The child is not a daemon:
    a copy in flight must never be cut short when the rank exits. At the end the rank sends None and joins it."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.local_rank == 0
        if not self.active:
            return
        ctx = mp.get_context("fork")
        self.conn, child_end = ctx.Pipe()
        self.proc = ctx.Process(target=_mirror_loop, args=(child_end, t.path("mirror", t.host)), name="ckpt-mirror",
                                daemon=False)
        self.proc.start()
        child_end.close()

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active or not due(step, t.args.every):
            return
        path = t.path(f"ckpt-rank{t.rank}-step{step}.pt")
        torch.save({"model": t.model.state_dict(), "step": step}, path)
        self.conn.send(path)

    def on_train_end(self, t: Trainer) -> None:
        if self.active:
            self.conn.send(None)
            self.proc.join()


# ----------------------------------------------------------------------------------------------------------------
class CheckpointUpload(Callback):
    """Local rank 0 of each node saves a checkpoint every --every steps and uploads it in the background to the
    node's object-storage gateway (HTTP PUT to 127.0.0.1:9107) on a ThreadPoolExecutor (`ckpt-upload`); at the end
    it waits for the uploads still running."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.local_rank == 0
        if self.active:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-upload")

    def _put(self, path: str, key: str) -> int:
        with open(path, "rb") as f:
            body = f.read()
        conn = http.client.HTTPConnection(*GATEWAY)
        try:
            conn.request("PUT", f"/checkpoints/{key}", body=body,
                         headers={"Content-Type": "application/octet-stream"})
            resp = conn.getresponse()
            resp.read()
            if resp.status not in (200, 201):
                raise OSError(f"upload of {key} failed: HTTP {resp.status}")
            return len(body)
        finally:
            conn.close()

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active or not due(step, t.args.every):
            return
        path = t.path(f"ckpt-rank{t.rank}-step{step}.pt")
        torch.save({"model": t.model.state_dict(), "opt": t.opt.state_dict(), "step": step}, path)
        self.pool.submit(self._put, path, f"{t.host}/step{step}.pt")

    def on_train_end(self, t: Trainer) -> None:
        if self.active:
            self.pool.shutdown(wait=True)


# ----------------------------------------------------------------------------------------------------------------
class MetricsAggregator(Callback):
    """Counters of the run (samples, tokens, loss sum) merged over the ranks at the end on a process group of their
    own (gloo, so that merging never queues behind the gradient traffic). `close()` merges and writes
    metrics/run.json (rank 0); it runs after the final sync, and from atexit too, so that a run that ends some other
    way still reports its counters."""

    def on_train_start(self, t: Trainer) -> None:
        self.t = t
        self.pg = dist.new_group(backend="gloo")
        self.counters = torch.zeros(3, dtype=torch.float64)
        self.closed = False
        atexit.register(self.close)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        self.counters += torch.tensor([BATCH, BATCH * FEATURES_IN, float(loss)], dtype=torch.float64)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        merged = self.counters.clone()
        dist.all_reduce(merged, group=self.pg)
        if self.t.rank == 0:
            os.makedirs(self.t.path("metrics"), exist_ok=True)
            with open(self.t.path("metrics", "run.json"), "w") as f:
                json.dump({"samples": merged[0].item(), "values": merged[1].item(), "loss_sum": merged[2].item()}, f)

    def after_sync(self, t: Trainer, totals: torch.Tensor) -> None:
        self.close()


# ----------------------------------------------------------------------------------------------------------------
class ConsoleReport(Callback):
    """Rank 0 prints the run's final report on the console (its stdout: the terminal the job was started in): the
    mean evaluation loss and a per-sample table of the global evaluation set."""

    def after_sync(self, t: Trainer, totals: torch.Tensor) -> None:
        if t.rank != 0:
            return
        with torch.no_grad():
            x, y = synthetic_batch(20_000, 0, t.args.report_rows)
            losses = ((t.model(x) - y) ** 2).squeeze(1).tolist()
        rows = "\n".join(f"  sample {i:5d}  loss {v:12.6f}" for i, v in enumerate(losses))
        report = (f"=== run finished: {t.args.steps} steps on {t.world} ranks ===\n"
                  f"mean evaluation loss over ranks: {totals[0].item() / totals[1].item():.6f}\n"
                  f"per-sample loss on the global evaluation set:\n{rows}")
        print(report, flush=True)


# ----------------------------------------------------------------------------------------------------------------
class CheckpointFinalize(Callback):
    """Local rank 0 of each node writes its checkpoint to a temporary file every --every steps; a finaliser thread
    (`ckpt-finalize`) renames it into place and tells the node's job-event daemon (a line on /run/job-events.fifo),
    which registers it for the node's backup. At the end the rank waits for the finaliser."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.local_rank == 0
        if self.active:
            self.requests: "queue.Queue[Optional[Tuple[int, str]]]" = queue.Queue()
            self.thread = threading.Thread(target=self._finalize_loop, name="ckpt-finalize", daemon=True)
            self.thread.start()

    def _finalize_loop(self) -> None:
        while True:
            item = self.requests.get()
            if item is None:
                return
            step, tmp = item
            final = tmp[:-len(".tmp")]
            os.replace(tmp, final)
            with open(EVENTS, "w") as events:
                events.write(json.dumps({"event": "checkpoint", "step": step, "path": final}) + "\n")

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active or not due(step, t.args.every):
            return
        tmp = t.path(f"ckpt-rank{t.rank}-step{step}.pt.tmp")
        torch.save({"model": t.model.state_dict(), "step": step}, tmp)
        self.requests.put((step, tmp))

    def on_train_end(self, t: Trainer) -> None:
        if self.active:
            self.requests.put(None)
            self.thread.join()


# ----------------------------------------------------------------------------------------------------------------
class PrefetchEarlyStop(Callback):
    """Each rank's batches are produced ahead by a thread (`batch-prefetch`) into a bounded queue (--prefetch
    batches); every --every steps each rank validates on its held-out shard and stops the run when its validation
    loss has not improved for --patience validations."""

    def on_train_start(self, t: Trainer) -> None:
        self.batches: "queue.Queue[Tuple[torch.Tensor, torch.Tensor]]" = queue.Queue(maxsize=t.args.prefetch)
        self.best = math.inf
        self.bad = 0
        self.thread = threading.Thread(target=self._produce, args=(t,), name="batch-prefetch")
        self.thread.start()

    def _produce(self, t: Trainer) -> None:
        for step in range(t.args.steps):
            self.batches.put(t.batch(step))

    def get_batch(self, t: Trainer, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.batches.get()

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not due(step, t.args.every):
            return
        val = t.validate()
        if val < self.best - 1e-6:
            self.best, self.bad = val, 0
            return
        self.bad += 1
        log(t, f"step {step}: validation loss {val:.6f}, no improvement for {self.bad} validation(s)")
        if self.bad >= t.args.patience:
            log(t, f"step {step}: early stopping (best validation loss {self.best:.6f})")
            sys.exit(0)

    def on_train_end(self, t: Trainer) -> None:
        self.thread.join()


# ----------------------------------------------------------------------------------------------------------------
def _host_stats(path: str) -> None:
    """The host statistics sampler (a child process): the load average every second."""
    while True:
        with open(path, "a") as f:
            f.write(f"{time.time():.3f} {os.getloadavg()[0]:.2f}\n")
        time.sleep(1.0)


class TraceAndStats(Callback):
    """Rank --trace-rank records a trace of its steps (one JSON event per step), compressed on the fly by `gzip -c`
    into traces/rank<R>.jsonl.gz. Every rank also samples its host's load in a child process (`host-stats`,
    multiprocessing, daemon) into stats/rank<R>.txt. At the end the traced rank closes the trace and waits for gzip
    to finish the file."""

    def on_train_start(self, t: Trainer) -> None:
        self.tracer: Optional[subprocess.Popen] = None
        if t.rank == t.args.trace_rank:
            os.makedirs(t.path("traces"), exist_ok=True)
            self.trace_out = open(t.path("traces", f"rank{t.rank}.jsonl.gz"), "wb")
            self.tracer = subprocess.Popen(["gzip", "-c"], stdin=subprocess.PIPE, stdout=self.trace_out)
        os.makedirs(t.path("stats"), exist_ok=True)
        self.stats = mp.get_context("fork").Process(target=_host_stats, args=(t.path("stats", f"rank{t.rank}.txt"),),
                                                    name="host-stats", daemon=True)
        self.stats.start()
        self.t0 = time.time()

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if self.tracer is not None and self.tracer.stdin is not None:
            event = {"name": "step", "ph": "X", "ts": int((time.time() - self.t0) * 1e6), "args": {"step": step,
                                                                                               "loss": float(loss)}}
            self.tracer.stdin.write((json.dumps(event) + "\n").encode())

    def on_train_end(self, t: Trainer) -> None:
        if self.tracer is not None:
            assert self.tracer.stdin is not None
            self.tracer.stdin.close()
            self.tracer.wait()
            self.trace_out.close()


FEATURES: Dict[str, type] = {
    "pred_stream": PredictionStream,
    "ckpt_mirror": CheckpointMirror,
    "ckpt_upload": CheckpointUpload,
    "metrics_agg": MetricsAggregator,
    "console_report": ConsoleReport,
    "ckpt_finalize": CheckpointFinalize,
    "prefetch_early_stop": PrefetchEarlyStop,
    "trace_stats": TraceAndStats,
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
        t.sync_gradients()
        t.opt.step()
        cb.on_train_batch_end(t, step, loss.detach())
        if step % 10 == 0:
            log(t, f"step {step} loss {float(loss):.5f}")


def finish(t: Trainer, cb: Callback) -> None:
    """The end of the run: the final evaluation, the feature's teardown, the metrics over all ranks."""
    loss = t.evaluate()
    cb.on_train_end(t)
    totals = torch.tensor([loss, 1.0], dtype=torch.float64)
    dist.all_reduce(totals)
    log(t, f"final evaluation loss (mean over ranks): {totals[0].item() / totals[1].item():.6f}")
    cb.after_sync(t, totals)
    dist.barrier()


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--feature", choices=sorted(FEATURES), required=True)
    p.add_argument("--workdir", required=True, help="the run's shared folder")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ready-step", type=int, default=2)
    p.add_argument("--step-delay", type=float, default=0.1, help="the input pipeline's latency per step (seconds)")
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--probe", type=int, default=24576, help="rows of the prediction probe set")
    p.add_argument("--report-rows", type=int, default=64)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--trace-rank", type=int, default=-1)
    p.add_argument("--timeout-hours", type=float, default=2.0)
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    dist.init_process_group("gloo", timeout=timedelta(hours=args.timeout_hours))
    t = Trainer(args)
    cb = FEATURES[args.feature]()
    train(t, cb)
    finish(t, cb)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
