"""A small data-parallel training script (torch.distributed, gloo, CPU) with the concurrent helpers real training
code runs inside a rank: a checkpoint writer thread, a shard loading thread pool, a metrics writer thread fed by a
queue, an asyncio control-plane client and an async artifact uploader on event loop threads, a host stats poller,
log forwarding with a reporter thread, a DataLoader over a decoded feature cache, a sampling step profiler loaded on
demand, and an EMA of the weights kept by a thread.

Run under torchrun by bench/blind/threads/run.py, one feature per job (--feature). Each feature is written as such
code usually is; the set-up (bench/blind/threads/scenarios.py) gives it the circumstances it meets on one rank: a
stalled node service, an expired token, a data folder split in two, a cache that is cold...

Readiness for the harness: with env HANGSCOPE_READY_FILE set, every rank appends one JSON line at the start of
step --ready-step (the format tests/support/jobs.py reads).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import json
import logging
import os
import pickle
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

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
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
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

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        pass


def due(step: int, every: int) -> bool:
    return step > 0 and step % every == 0


def log(t: Trainer, text: str) -> None:
    print(f"[rank {t.rank}] {text}", flush=True)


# ----------------------------------------------------------------------------------------------------------------
class BestCheckpoint(Callback):
    """Rank --ckpt-rank keeps a local copy of its latest model for fast restarts: every --every steps it hands the
    state (model, optimizer and the recent-samples buffer, --buffer-mb MiB) to its writer thread (`ckpt-writer`),
    which saves it and writes the metrics of the moment beside it. The running metrics are kept under
    `_metrics_lock` and carry the last saved step, which the writer sets under `_ckpt_lock`."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.rank == t.args.ckpt_rank
        self._metrics_lock = threading.Lock()
        self._ckpt_lock = threading.Lock()
        self.metrics: Dict[str, Any] = {}
        self.last_saved = -1
        self.pending: Optional[Tuple[int, Dict[str, Any]]] = None
        self.wake = threading.Event()
        if self.active:
            self.sample_buffer = torch.randn(t.args.buffer_mb << 18)  # float32
            threading.Thread(target=self._write_loop, args=(t,), name="ckpt-writer", daemon=True).start()

    def _write_loop(self, t: Trainer) -> None:
        path = t.path(f"latest-rank{t.rank}.pt")
        while True:
            self.wake.wait()
            self.wake.clear()
            with self._ckpt_lock:
                if self.pending is None:
                    continue
                step, state = self.pending
                self.pending = None
                torch.save(state, path + ".tmp")
                os.replace(path + ".tmp", path)
                self.last_saved = step
                with self._metrics_lock:
                    meta = dict(self.metrics)
                with open(path + ".json", "w") as f:
                    json.dump(meta, f)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active:
            return
        with self._metrics_lock:
            self.metrics.update(step=step, loss=float(loss), time=time.time())
            with self._ckpt_lock:
                self.metrics["last_saved"] = self.last_saved
                if due(step, t.args.every):
                    self.pending = (step, {"model": {k: v.clone() for k, v in t.model.state_dict().items()},
                                           "opt": t.opt.state_dict(), "samples": self.sample_buffer})
                    self.wake.set()


# ----------------------------------------------------------------------------------------------------------------
class ShardPrefetch(Callback):
    """Every --every steps each rank loads its data folder (data/rank<R>/part-*.z: pickled lists of zlib-compressed
    chunks) for the next steps with a ThreadPoolExecutor of 2 threads (`shard-io`): one task per part, each of
    which decompresses its chunks in parallel on the same pool."""

    def on_train_start(self, t: Trainer) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="shard-io")
        folder = t.path("data", f"rank{t.rank}")
        self.parts = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".z"))

    def _load_part(self, path: str) -> bytes:
        with open(path, "rb") as f:
            chunks = pickle.load(f)
        pending = [self.pool.submit(zlib.decompress, c) for c in chunks]
        return b"".join(p.result() for p in pending)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not due(step, t.args.every):
            return
        futures = [self.pool.submit(self._load_part, p) for p in self.parts]
        data = [f.result() for f in futures]
        log(t, f"step {step}: loaded {sum(map(len, data))} bytes from {len(data)} part(s)")


# ----------------------------------------------------------------------------------------------------------------
class JsonlMetrics(Callback):
    """Each rank queues one record per step for its writer thread (`metrics-writer`), which appends them to
    metrics/rank<R>.jsonl. Every --every steps the rank waits until everything queued is written (`Queue.join()`)
    before it queues the checkpoint marker. Rank --eval-rank also evaluates on its held-out batch every --every
    steps and queues an "eval" record."""

    FIELDS = {"train": ("step", "loss", "time"), "ckpt": ("step", "path")}

    def on_train_start(self, t: Trainer) -> None:
        self.q: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        os.makedirs(t.path("metrics"), exist_ok=True)
        threading.Thread(target=self._write, args=(t.path("metrics", f"rank{t.rank}.jsonl"),),
                         name="metrics-writer", daemon=True).start()

    def _write(self, path: str) -> None:
        with open(path, "a") as f:
            while True:
                record = self.q.get()
                fields = self.FIELDS.get(record["kind"])
                if fields is None:  # not a kind this file holds
                    continue
                f.write(json.dumps({k: record.get(k) for k in fields}) + "\n")
                f.flush()
                self.q.task_done()

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        self.q.put({"kind": "train", "step": step, "loss": float(loss), "time": time.time()})
        if not due(step, t.args.every):
            return
        if t.rank == t.args.eval_rank:
            with torch.no_grad():
                x, y = synthetic_batch(10_000 + t.rank, 0, 64)
                self.q.put({"kind": "eval", "step": step, "loss": float(F.mse_loss(t.model(x), y))})
        self.q.join()  # everything before the marker is on disk
        self.q.put({"kind": "ckpt", "step": step, "path": t.path(f"ckpt-{step}")})


# ----------------------------------------------------------------------------------------------------------------
class ControlPlane(Callback):
    """Local rank 0 of each node runs the control-plane client on an asyncio event loop in a thread
    (`control-loop`); every --every steps the training loop asks it whether an operator asked the run to stop.
    Each request carries a token from the node's auth sidecar (HTTP on 127.0.0.1:--port)."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.local_rank == 0
        if self.active:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="control-loop", daemon=True).start()

    def _token(self, port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/token?scope=control") as resp:
            return json.loads(resp.read())["token"]

    async def _should_stop(self, t: Trainer, step: int) -> bool:
        token = self._token(t.args.port)
        await asyncio.sleep(0)  # the control plane's answer (a flag file on the shared folder here)
        return bool(token) and os.path.exists(t.path("STOP"))

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active or not due(step, t.args.every):
            return
        if asyncio.run_coroutine_threadsafe(self._should_stop(t, step), self.loop).result():
            raise SystemExit(f"stopped by the operator at step {step}")


# ----------------------------------------------------------------------------------------------------------------
class ArtifactUpload(Callback):
    """Local rank 0 of each node uploads its checkpoint every --every steps through an async storage client on an
    asyncio event loop in a thread (`io-loop`), and waits for the upload before the next one overwrites the file.
    Requests carry the node's access token (creds/<host>.json), refreshed once it has expired."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.local_rank == 0
        if self.active:
            with open(t.path("creds", f"{t.host}.json")) as f:
                self.token: Dict[str, Any] = json.load(f)
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="io-loop", daemon=True).start()

    def _auth_headers(self) -> Dict[str, str]:
        """The request headers (sync: the client's coroutines and the sync helpers both call it)."""
        if self.token["expires"] <= time.time():
            self.token = asyncio.run_coroutine_threadsafe(self._refresh_token(), self.loop).result()
        return {"Authorization": f"Bearer {self.token['value']}"}

    async def _refresh_token(self) -> Dict[str, Any]:
        await asyncio.sleep(0.05)  # the token service's round trip
        return {"value": os.urandom(8).hex(), "expires": time.time() + 3600}

    async def _upload(self, src: str, dst: str) -> int:
        headers = self._auth_headers()
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        await asyncio.to_thread(shutil.copyfile, src, dst)
        with open(dst + ".meta", "w") as f:
            json.dump({"auth": sorted(headers), "size": os.path.getsize(dst)}, f)
        return os.path.getsize(dst)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active or not due(step, t.args.every):
            return
        src = t.path(f"model-rank{t.rank}.pt")
        torch.save(t.model.state_dict(), src)
        dst = t.path("bucket", t.host, f"step{step}.pt")
        size = asyncio.run_coroutine_threadsafe(self._upload(src, dst), self.loop).result()
        log(t, f"step {step}: uploaded {size} bytes")


# ----------------------------------------------------------------------------------------------------------------
_LIBC = ctypes.PyDLL(ctypes.util.find_library("c"), use_errno=True)


def _recv_reply(sock: socket.socket, size: int = 4096) -> bytes:
    # straight to libc: the agent's replies are a few hundred bytes and come back in microseconds, and PyDLL skips
    # the GIL release and re-acquire that socket.recv pays on every call
    buf = ctypes.create_string_buffer(size)
    n = _LIBC.recv(sock.fileno(), buf, size, 0)
    if n < 0:
        raise OSError(ctypes.get_errno(), "recv from the node agent failed")
    return buf.raw[:n]


class HostMonitor(Callback):
    """The last local rank of each node polls the node agent (unix socket /run/node-agent.sock) for host stats in a
    thread (`host-stats`); every --every steps the step's log line asks it for fresh stats (waits up to 2 s, then
    logs the stale ones)."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.local_rank == t.local_world - 1
        self.latest: Dict[str, Any] = {}
        self.asked = threading.Event()
        self.updated = threading.Event()
        if self.active:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(t.args.agent_socket)
            threading.Thread(target=self._poll, name="host-stats", daemon=True).start()

    def _poll(self) -> None:
        while True:
            self.asked.wait()
            self.asked.clear()
            self.sock.sendall(b"STATS\n")
            self.latest = json.loads(_recv_reply(self.sock))
            self.updated.set()

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active or not due(step, t.args.every):
            return
        self.updated.clear()
        self.asked.set()
        fresh = self.updated.wait(2.0)
        log(t, f"step {step}: host {'' if fresh else '(stale) '}{self.latest}")


# ----------------------------------------------------------------------------------------------------------------
class LogForwarding(Callback):
    """Each rank's log goes to the site's log shipper (`log-ship --tag train.rank<R>`, from PATH) through a
    logging.StreamHandler on the shipper's stdin. Rank 0 also runs a reporter thread (`stats-reporter`) that logs
    the per-sample loss table of the global evaluation set every --every steps."""

    def on_train_start(self, t: Trainer) -> None:
        self.shipper = subprocess.Popen(["log-ship", "--tag", f"train.rank{t.rank}"], stdin=subprocess.PIPE,
                                        text=True)
        handler = logging.StreamHandler(self.shipper.stdin)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.logger = logging.getLogger("train")
        self.logger.addHandler(handler)
        self.logger.setLevel(logging.INFO)
        self.todo: "queue.Queue[Tuple[int, List[float]]]" = queue.Queue()
        if t.rank == 0:
            threading.Thread(target=self._report, name="stats-reporter", daemon=True).start()

    def _report(self) -> None:
        while True:
            step, losses = self.todo.get()
            mean = sum(losses) / len(losses)
            rows = "\n".join(f"  sample {i:5d}  loss {v:12.6f}  rel {v / mean:8.4f}" for i, v in enumerate(losses))
            self.logger.info("step %d: per-sample loss on the evaluation set (%d samples)\n%s", step, len(losses),
                             rows)

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        self.logger.info("step %d loss %.5f", step, float(loss))
        if t.rank == 0 and due(step, t.args.every):
            with torch.no_grad():
                x, y = synthetic_batch(20_000, 0, t.args.eval_samples)
                losses = ((t.model(x) - y) ** 2).squeeze(1).tolist()
            self.todo.put((step, losses))


# ----------------------------------------------------------------------------------------------------------------
class DecodedFeatures(Dataset):
    """Feature vectors assembled from 4 cached views per sample, decoded in parallel on a thread pool
    (`feat-decode`). The first time a rank uses its cache (no cache/rank<R>.idx yet) it decodes the first samples
    once and writes the index."""

    def __init__(self, root: str, rank: int, size: int = 4096) -> None:
        self.rank, self.size = rank, size
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="feat-decode")
        index = os.path.join(root, f"rank{rank}.idx")
        if not os.path.exists(index):
            os.makedirs(root, exist_ok=True)
            keys = [(i, k) for i in range(64) for k in range(4)]
            sums = [float(v.sum()) for v in self.pool.map(self._view, keys)]
            with open(index, "w") as f:
                json.dump({"samples": 64, "checksum": sum(sums)}, f)

    def _view(self, key: Tuple[int, int]) -> torch.Tensor:
        i, k = key
        gen = torch.Generator().manual_seed(self.rank * 1_000_003 + i * 4 + k)
        return torch.randn(FEATURES_IN // 4, generator=gen)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat(list(self.pool.map(self._view, [(i, k) for k in range(4)])))
        return x, x.sum(dim=0, keepdim=True) * 0.1


class CachedFeatures(Callback):
    """Each rank trains on its decoded feature cache (cache/) through a DataLoader with --loader-workers worker
    processes."""

    def on_train_start(self, t: Trainer) -> None:
        self.loader = DataLoader(DecodedFeatures(t.path("cache"), t.rank), batch_size=BATCH,
                                 num_workers=t.args.loader_workers)
        self.it: Optional[Iterator[Any]] = None

    def get_batch(self, t: Trainer, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.it is None:
            self.it = iter(self.loader)
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            return next(self.it)


# ----------------------------------------------------------------------------------------------------------------
class StepProfiler(Callback):
    """Rank --profile-rank turns the sampling profiler (perfhooks, next to this script) on at step --every, imported
    there so that the other ranks never load it, and writes its report every --every steps."""

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if t.rank != t.args.profile_rank or not due(step, t.args.every):
            return
        import perfhooks

        log(t, f"step {step}: profile {perfhooks.report(top=5)}")


# ----------------------------------------------------------------------------------------------------------------
class EmaWeights(Callback):
    """Rank --ema-rank keeps an exponential moving average of the weights for its evaluations, updated by a thread
    (`ema-worker`) from the weights the training loop publishes after each step, from step --every on. `lock` (an
    RLock: the swap helpers, which nest, take it too) guards the published weights and the average."""

    def on_train_start(self, t: Trainer) -> None:
        self.active = t.rank == t.args.ema_rank
        self.lock = threading.RLock()
        self.published = threading.Event()
        self.version = self.applied = 0
        self.source: Dict[str, torch.Tensor] = {}
        self.average = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
        if self.active:
            threading.Thread(target=self._update, args=(0.99,), name="ema-worker", daemon=True).start()

    def _update(self, decay: float) -> None:
        while True:
            with self.lock:
                if self.applied == self.version:  # nothing new yet
                    self.published.wait()
                    self.published.clear()
                for k, v in self.source.items():
                    self.average[k].mul_(decay).add_(v, alpha=1 - decay)
                self.applied = self.version

    def swapped_in(self, t: Trainer) -> Dict[str, torch.Tensor]:
        with self.lock:
            return {k: v.clone() for k, v in self.average.items()}

    def on_train_batch_end(self, t: Trainer, step: int, loss: torch.Tensor) -> None:
        if not self.active or step < t.args.every:
            return
        with self.lock:
            self.source = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
            self.version += 1
            self.published.set()


FEATURES: Dict[str, type] = {
    "best_ckpt": BestCheckpoint,
    "shard_prefetch": ShardPrefetch,
    "jsonl_metrics": JsonlMetrics,
    "control_plane": ControlPlane,
    "artifact_upload": ArtifactUpload,
    "host_monitor": HostMonitor,
    "log_forwarding": LogForwarding,
    "cached_features": CachedFeatures,
    "step_profiler": StepProfiler,
    "ema": EmaWeights,
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
    p.add_argument("--agent-socket", default="/run/node-agent.sock")
    p.add_argument("--ckpt-rank", type=int, default=-1)
    p.add_argument("--buffer-mb", type=int, default=64)
    p.add_argument("--eval-rank", type=int, default=-1)
    p.add_argument("--eval-samples", type=int, default=1536)
    p.add_argument("--loader-workers", type=int, default=1)
    p.add_argument("--profile-rank", type=int, default=-1)
    p.add_argument("--ema-rank", type=int, default=-1)
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
