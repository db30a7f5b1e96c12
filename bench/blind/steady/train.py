"""A small data-parallel training script (torch.distributed, gloo, CPU) with the steady-state machinery real training
code carries: checkpoints (saved in the background, spooled to the node for a sidecar, uploaded per node, written
with torch.distributed.checkpoint after a retention pass) and input pipelines (DataLoader workers that tokenize
through a subprocess, a preprocessing thread pool, a stream from the node's data service, a prefetch thread).

Run under torchrun by bench/blind/steady/run.py, one feature per job (--feature). Each feature is written as such
code usually is; the set-up (bench/blind/steady/scenarios.py) gives it the circumstances it meets on one rank or
node, some steps into the run.

Each run: init_process_group, the feature's set-up, --steps training steps (a batch from the feature's input
pipeline or a synthetic one, gradients all_reduced, the feature's after-step hook: checkpoints), a barrier,
destroy_process_group.

Readiness for the harness: with env HANGSCOPE_READY_FILE set, every rank appends one JSON line as soon as it starts
(the format tests/support/jobs.py reads), before anything that could wait.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import json
import os
import queue
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

FEATURES_IN = 16
BATCH = 8
HERE = os.path.dirname(os.path.abspath(__file__))
SERVICES = os.path.join(HERE, "services.py")


def env_int(name: str, default: int = 0) -> int:
    return int(os.environ.get(name, str(default)))


def _ready() -> None:
    path = os.environ.get("HANGSCOPE_READY_FILE")
    if not path:
        return
    line = json.dumps({"rank": env_int("RANK"), "local_rank": env_int("LOCAL_RANK"), "pid": os.getpid(),
                       "host": socket.gethostname(), "step": 0, "where": "step"})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES_IN, 256), nn.ReLU(), nn.Linear(256, 1024), nn.ReLU(),
                                  nn.Linear(1024, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def synthetic_batch(seed: int, index: int, n: int = BATCH) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 100003 + index)
    x = torch.randn(n, FEATURES_IN, generator=gen)
    return x, x.sum(dim=1, keepdim=True) * 0.1


def features_of(values: List[int]) -> torch.Tensor:
    """A sample's feature vector from its token ids (a normalised histogram of 16 buckets)."""
    x = torch.zeros(FEATURES_IN)
    for v in values:
        x[v % FEATURES_IN] += 1.0
    return x / max(1, len(values))


def as_batch(rows: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    x = torch.stack(rows)
    return x, x.sum(dim=1, keepdim=True) * 0.1


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.local_rank = env_int("LOCAL_RANK")
        self.host = socket.gethostname()
        torch.manual_seed(0)
        self.model = Model()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        os.makedirs(self.path("logs"), exist_ok=True)
        self.logfile = open(self.path("logs", f"rank{self.rank}.log"), "a", buffering=1)  # noqa: SIM115

    def path(self, *parts: str) -> str:
        return os.path.join(self.args.workdir, *parts)

    def state(self, step: int) -> Dict[str, Any]:
        return {"step": step, "model": {k: v.clone() for k, v in self.model.state_dict().items()},
                "optim": self.opt.state_dict(), "rng": torch.get_rng_state()}

    def sync_gradients(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def log(self, text: str) -> None:
        self.logfile.write(f"{time.strftime('%H:%M:%S')} [rank {self.rank}] {text}\n")


class Feature:
    def setup(self, t: Trainer) -> None:
        """Set-up once the process group exists, before the first step."""

    def batches(self, t: Trainer) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """The input pipeline: synthetic batches unless the feature has one."""
        step = 0
        while True:
            yield synthetic_batch(t.rank, step)
            step += 1

    def after_step(self, t: Trainer, step: int) -> None:
        """After the optimizer step (checkpoints)."""

    def due(self, t: Trainer, step: int) -> bool:
        return step > 0 and step % t.args.ckpt_every == 0


# ---------------------------------------------------------------------------------------------------------------
class AsyncCheckpoint(Feature):
    """Rank 0 saves the checkpoint every --ckpt-every steps to the node-local checkpoint folder (--ckpt-dir) in a
    background thread, so that training does not wait for the disk; before a new save it waits for the previous
    one to finish (never two saves at once); after a save it prunes to the newest --keep checkpoints."""

    def setup(self, t: Trainer) -> None:
        self.idle = threading.Event()
        self.idle.set()
        self.saver: Optional[threading.Thread] = None

    def _save(self, t: Trainer, state: Dict[str, Any], step: int) -> None:
        final = os.path.join(t.args.ckpt_dir, f"step-{step:06d}.pt")
        torch.save(state, final + ".tmp")
        os.replace(final + ".tmp", final)
        kept = sorted(n for n in os.listdir(t.args.ckpt_dir) if n.startswith("step-") and n.endswith(".pt"))
        for old in kept[:-t.args.keep]:
            os.unlink(os.path.join(t.args.ckpt_dir, old))
        t.log(f"checkpoint {final} saved")
        self.idle.set()

    def after_step(self, t: Trainer, step: int) -> None:
        if t.rank != 0 or not self.due(t, step):
            return
        self.idle.wait()  # the previous save first
        self.idle.clear()
        os.makedirs(t.args.ckpt_dir, exist_ok=True)
        self.saver = threading.Thread(target=self._save, args=(t, t.state(step), step), name="ckpt-saver",
                                      daemon=True)
        self.saver.start()


# ---------------------------------------------------------------------------------------------------------------
class TokenizedDocs(IterableDataset):
    """This rank's documents (text/rank<R>.txt, one per line), tokenized by the streaming tokenizer (services.py
    tokenize, a subprocess per DataLoader worker), one sample per document."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        wid, nworkers = (info.id, info.num_workers) if info is not None else (0, 1)
        tok = subprocess.Popen([sys.executable, SERVICES, "tokenize"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE)
        assert tok.stdin is not None and tok.stdout is not None
        with open(self.path, "rb") as f:
            for i, doc in enumerate(f):
                if i % nworkers != wid:
                    continue
                tok.stdin.write(doc.rstrip(b"\n") + b"\n")
                tok.stdin.flush()
                ids = [int(v) for v in tok.stdout.readline().split()]
                yield features_of(ids)


class TokenizerWorkers(Feature):
    """The input pipeline is a DataLoader (--loader-workers worker processes) over this rank's documents, each
    worker tokenizing through its own tokenizer subprocess."""

    def batches(self, t: Trainer) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        loader = DataLoader(TokenizedDocs(t.path("text", f"rank{t.rank}.txt")), batch_size=BATCH,
                            num_workers=t.args.loader_workers, collate_fn=as_batch)
        yield from loader


# ---------------------------------------------------------------------------------------------------------------
class SpoolCheckpoint(Feature):
    """Every rank saves its checkpoint shard every --ckpt-every steps into the node's checkpoint spool (--spool-dir,
    rank<R>.pt), from which the node's upload sidecar ships it; then all ranks agree the checkpoint is complete (a
    barrier)."""

    def after_step(self, t: Trainer, step: int) -> None:
        if not self.due(t, step):
            return
        os.makedirs(t.args.spool_dir, exist_ok=True)
        torch.save(t.state(step), os.path.join(t.args.spool_dir, f"rank{t.rank}.pt"))
        dist.barrier()
        t.log(f"checkpoint of step {step} spooled")


# ---------------------------------------------------------------------------------------------------------------
class PreprocessPool(Feature):
    """Batches are assembled on a preprocessing thread pool (--preprocess-threads) from the decoded-sample cache
    (cache/rank<R>.pt); a sample missing from the cache is decoded from the raw shard (raw/rank<R>.jsonl) on the
    same pool."""

    def setup(self, t: Trainer) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(t.args.preprocess_threads, thread_name_prefix="prep")
        self.cache: Dict[int, torch.Tensor] = torch.load(t.path("cache", f"rank{t.rank}.pt"))
        with open(t.path("raw", f"rank{t.rank}.jsonl")) as f:
            self.raw = [line for line in f]

    def decode(self, index: int) -> torch.Tensor:
        return features_of(json.loads(self.raw[index])["ids"])

    def make_batch(self, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        indices = range(step * BATCH, (step + 1) * BATCH)
        missing = {i: self.pool.submit(self.decode, i) for i in indices if i not in self.cache}
        rows = [self.cache[i] if i in self.cache else missing[i].result() for i in indices]
        return as_batch(rows)

    def batches(self, t: Trainer) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        step = 0
        while True:
            yield self.pool.submit(self.make_batch, step).result()
            step += 1


# ---------------------------------------------------------------------------------------------------------------
class UploadCheckpoint(Feature):
    """Every rank saves its checkpoint shard every --ckpt-every steps into the shared folder
    (ckpt/<host>/rank<R>.pt); each node's local rank 0 then uploads the node's shards to the bucket (services.py
    upload, in the background, its output kept for the log); before the next checkpoint it waits for the previous
    upload to finish."""

    def setup(self, t: Trainer) -> None:
        self.upload: Optional[subprocess.Popen] = None

    def after_step(self, t: Trainer, step: int) -> None:
        if not self.due(t, step):
            return
        if t.local_rank == 0 and self.upload is not None:
            self.upload.wait()  # the previous upload first
            out = self.upload.stdout.read() if self.upload.stdout else b""
            t.log(f"upload finished ({self.upload.returncode}): {out[-200:]!r}")
        folder = t.path("ckpt", t.host)
        os.makedirs(folder, exist_ok=True)
        torch.save(t.state(step), os.path.join(folder, f"rank{t.rank}.pt"))
        dist.barrier()
        if t.local_rank == 0:
            self.upload = subprocess.Popen([sys.executable, SERVICES, "upload", "--src", folder, "--dest",
                                            t.path("bucket", f"step-{step:06d}", t.host)],
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


# ---------------------------------------------------------------------------------------------------------------
class StreamFromService(Feature):
    """The input pipeline streams this rank's shard (rank<R>) from the node's data service (--data-sock, a unix
    socket): `OPEN <shard>`, then a record count and length-prefixed records."""

    def _recv_exact(self, sock: socket.socket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("data service closed the stream")
            buf += chunk
        return bytes(buf)

    def records(self, t: Trainer) -> Iterator[bytes]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(t.args.data_sock)
        sock.sendall(f"OPEN rank{t.rank}\n".encode())
        (count,) = struct.unpack("<I", self._recv_exact(sock, 4))
        for _ in range(count):
            (n,) = struct.unpack("<I", self._recv_exact(sock, 4))
            yield self._recv_exact(sock, n)

    def batches(self, t: Trainer) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        rows: List[torch.Tensor] = []
        for rec in self.records(t):
            rows.append(features_of(list(rec)))
            if len(rows) == BATCH:
                yield as_batch(rows)
                rows = []


# ---------------------------------------------------------------------------------------------------------------
class RetentionDcp(Feature):
    """Checkpoints with torch.distributed.checkpoint (dcp.save, every rank, into ckpt/step-<N>) every --ckpt-every
    steps. Each node also keeps a local copy of the newest checkpoints (--ckpt-dir, for a fast restart), which the
    node's retention job prunes; the node's local rank 0 refreshes the local copy under the folder's lock (flock
    on --ckpt-dir/.lock) before the save."""

    def after_step(self, t: Trainer, step: int) -> None:
        if not self.due(t, step):
            return
        import torch.distributed.checkpoint as dcp

        if t.local_rank == 0:
            os.makedirs(t.args.ckpt_dir, exist_ok=True)
            with open(os.path.join(t.args.ckpt_dir, ".lock"), "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    last = t.path("ckpt", f"step-{step - t.args.ckpt_every:06d}")
                    if os.path.isdir(last):
                        shutil.copytree(last, os.path.join(t.args.ckpt_dir, os.path.basename(last)),
                                        dirs_exist_ok=True)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        dcp.save({"model": t.model.state_dict()}, checkpoint_id=t.path("ckpt", f"step-{step:06d}"))
        t.log(f"checkpoint of step {step} saved")


# ---------------------------------------------------------------------------------------------------------------
class PrefetchThread(Feature):
    """A prefetch thread reads and decodes this rank's records (data/rank<R>.jsonl) ahead of the training loop into
    a bounded queue (--prefetch batches)."""

    def setup(self, t: Trainer) -> None:
        self.q: "queue.Queue[Tuple[torch.Tensor, torch.Tensor]]" = queue.Queue(maxsize=t.args.prefetch)
        self.thread = threading.Thread(target=self._fill, args=(t.path("data", f"rank{t.rank}.jsonl"),),
                                       name="prefetch", daemon=True)
        self.thread.start()

    def _fill(self, path: str) -> None:
        rows: List[torch.Tensor] = []
        with open(path) as f:
            for line in f:
                rows.append(features_of(json.loads(line)["ids"]))
                if len(rows) == BATCH:
                    self.q.put(as_batch(rows))
                    rows = []

    def batches(self, t: Trainer) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.q.get()


FEATURES: Dict[str, type] = {
    "async_checkpoint": AsyncCheckpoint,
    "tokenizer_workers": TokenizerWorkers,
    "spool_checkpoint": SpoolCheckpoint,
    "preprocess_pool": PreprocessPool,
    "upload_checkpoint": UploadCheckpoint,
    "stream_service": StreamFromService,
    "retention_dcp": RetentionDcp,
    "prefetch_thread": PrefetchThread,
}


def train(t: Trainer, feature: Feature) -> None:
    batches = feature.batches(t)
    for step in range(t.args.steps):
        inputs, targets = next(batches)
        time.sleep(t.args.step_delay)  # the model's compute, scaled down
        t.opt.zero_grad()
        loss = F.mse_loss(t.model(inputs), targets)
        loss.backward()
        t.sync_gradients()
        t.opt.step()
        feature.after_step(t, step)
        if step % 5 == 0:
            t.log(f"step {step} loss {float(loss):.5f}")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--feature", choices=sorted(FEATURES), required=True)
    p.add_argument("--workdir", required=True, help="the run's shared folder")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-delay", type=float, default=0.05)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept on the node")
    p.add_argument("--ckpt-dir", default="/run/ckpt", help="the node-local checkpoint folder")
    p.add_argument("--spool-dir", default="/run/ckpt-spool", help="the node's checkpoint spool")
    p.add_argument("--loader-workers", type=int, default=1)
    p.add_argument("--preprocess-threads", type=int, default=1)
    p.add_argument("--data-sock", default="/run/datasvc.sock", help="the node's data service")
    p.add_argument("--prefetch", type=int, default=4, help="batches the prefetch thread reads ahead")
    p.add_argument("--timeout-hours", type=float, default=2.0)
    return p.parse_args(argv)


def main() -> int:
    _ready()
    args = parse_args()
    feature = FEATURES[args.feature]()
    dist.init_process_group("gloo", timeout=timedelta(hours=args.timeout_hours))
    t = Trainer(args)
    feature.setup(t)
    train(t, feature)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
