"""A small data-parallel training script (torch.distributed, gloo, CPU) with the start-of-job machinery real training
code carries: corpus preprocessing on rank 0 with a worker pool, a per-host feature cache built under a file lock, an
evaluation process group, data-shard assignment published through the c10d store, node-local staging of the
dataset under a lock, fused kernels autotuned at import, a dataset archive extracted per node, and a tokenizer
copied to each node.

Run under torchrun by bench/blind/starts/run.py, one feature per job (--feature). Each feature is written as such
code usually is; the set-up (bench/blind/starts/scenarios.py) gives it the circumstances it meets on one rank or
node.

Each run: the feature's pre-rendezvous set-up (before init_process_group), init_process_group, the feature's
set-up, --steps training steps (gradients all_reduced), a barrier, destroy_process_group.

Readiness for the harness: with env HANGSCOPE_READY_FILE set, every rank appends one JSON line as soon as it starts
(the format tests/support/jobs.py reads), before anything that could wait.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import importlib
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import time
import zlib
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

FEATURES_IN = 16
BATCH = 8


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


class TinyModel(nn.Module):
    def __init__(self, vocab: int = FEATURES_IN) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(vocab, 32), nn.ReLU(), nn.Linear(32, 1))

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
        self.local_rank = env_int("LOCAL_RANK")
        self.host = socket.gethostname()
        torch.manual_seed(0)
        self.model = TinyModel()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        os.makedirs(self.path("logs"), exist_ok=True)
        self.logfile = open(self.path("logs", f"rank{self.rank}.log"), "a", buffering=1)  # noqa: SIM115

    def path(self, *parts: str) -> str:
        return os.path.join(self.args.workdir, *parts)

    def batch(self, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.args.step_delay)
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

    def log(self, text: str) -> None:
        self.logfile.write(f"{time.strftime('%H:%M:%S')} [rank {self.rank}] {text}\n")


class Feature:
    def before_init(self, args: argparse.Namespace) -> None:
        """Set-up that needs no process group (runs before init_process_group)."""

    def setup(self, t: Trainer) -> None:
        """Set-up once the process group exists, before the first step."""


# ----------------------------------------------------------------------------------------------------------------
def _decode_file(path: str) -> List[int]:
    """Decode one raw corpus file (a worker of the preprocessing pool): a header (record count), an offset table,
    then the records; each record is read straight out of the file's buffer by its offset (no copy of the file)."""
    import ctypes

    with open(path, "rb") as f:
        blob = f.read()
    buf = ctypes.create_string_buffer(blob, len(blob))
    base = ctypes.addressof(buf)
    count = int.from_bytes(blob[:4], "little")
    tokens: List[int] = []
    for i in range(count):
        entry = 4 + 8 * i
        offset = int.from_bytes(blob[entry:entry + 4], "little") | (int.from_bytes(blob[entry + 4:entry + 8],
                                                                                  "little") << 32)
        length = int.from_bytes(ctypes.string_at(base + offset, 2), "little")
        record = ctypes.string_at(base + offset + 2, length)
        tokens.extend(zlib.crc32(word) % 1000 for word in record.split())
    return tokens


class Preprocess(Feature):
    """Rank 0 turns the raw corpus (raw/*.rec) into the token cache (cache/tokens.pt) with a pool of --workers
    decoder processes while the other ranks wait (the main-process-first pattern: they wait in a barrier, then
    load the cache rank 0 wrote)."""

    def setup(self, t: Trainer) -> None:
        cache = t.path("cache", "tokens.pt")
        if t.rank != 0:
            dist.barrier()  # rank 0 builds the cache first
        else:
            files = sorted(glob.glob(t.path("raw", "*.rec")))
            with mp.get_context("fork").Pool(t.args.workers) as pool:
                parts = pool.map(_decode_file, files)
            os.makedirs(t.path("cache"), exist_ok=True)
            torch.save(torch.tensor([tok for part in parts for tok in part]), cache)
            dist.barrier()
        self.tokens = torch.load(cache)
        t.log(f"token cache: {self.tokens.numel()} tokens")


# ----------------------------------------------------------------------------------------------------------------
class FeatureCache(Feature):
    """Each host keeps a feature cache (cache/<host>/ in the shared folder). A cold one is built by the host's local
    rank 0, which claims the host's cache lock (cache/<host>/.lock, flock) before the job joins up, builds the
    shards, agrees the feature vocabulary with every rank (all_reduce of the vocabulary sizes) and writes the index;
    the host's other ranks read the cache under a shared lock, so never a half-built one."""

    def before_init(self, args: argparse.Namespace) -> None:
        self.folder = os.path.join(args.workdir, "cache", socket.gethostname())
        os.makedirs(self.folder, exist_ok=True)
        self.lock = open(os.path.join(self.folder, ".lock"), "a+")  # noqa: SIM115 (held for the run)
        self.building = env_int("LOCAL_RANK") == 0 and not os.path.exists(os.path.join(self.folder, "index.json"))
        if self.building:
            fcntl.flock(self.lock, fcntl.LOCK_EX)  # claim the build before the other ranks start reading

    def setup(self, t: Trainer) -> None:
        if self.building:
            shards = []
            for i in range(4):
                x, _ = synthetic_batch(70_000 + i, 0, 32)
                name = f"shard-{i}.pt"
                torch.save(x, os.path.join(self.folder, name))
                shards.append(name)
            vocab = torch.tensor([FEATURES_IN], dtype=torch.int64)
            dist.all_reduce(vocab, op=dist.ReduceOp.MAX)
            with open(os.path.join(self.folder, "index.json"), "w") as f:
                json.dump({"shards": shards, "vocab": int(vocab)}, f)
            fcntl.flock(self.lock, fcntl.LOCK_UN)
        else:
            fcntl.flock(self.lock, fcntl.LOCK_SH)  # wait for a build in progress
            with open(os.path.join(self.folder, "index.json")) as f:
                index = json.load(f)
            fcntl.flock(self.lock, fcntl.LOCK_UN)
            vocab = torch.tensor([index["vocab"]], dtype=torch.int64)
            dist.all_reduce(vocab, op=dist.ReduceOp.MAX)
        t.log(f"feature vocabulary: {int(vocab)}")


# ----------------------------------------------------------------------------------------------------------------
class EvalGroup(Feature):
    """Ranks that hold a held-out shard (eval/rank<R>.pt) evaluate together every --every steps on a process group
    of their own (gloo), so that evaluation never queues behind the gradient traffic."""

    def setup(self, t: Trainer) -> None:
        self.shard = t.path("eval", f"rank{t.rank}.pt")
        self.group: Optional[Any] = None
        if os.path.exists(self.shard):
            self.group = dist.new_group(backend="gloo", timeout=timedelta(hours=t.args.timeout_hours))
            t.log("evaluation group ready")
        else:
            t.log(f"no held-out shard at {self.shard}: this rank does not evaluate")


# ----------------------------------------------------------------------------------------------------------------
class ShardAssign(Feature):
    """Rank 0 lists the data shards (shards/*.bin) and assigns each to a rank by a stable hash of its name (so a
    shard stays on the same rank across restarts); it publishes each rank's list in the job's c10d store
    (data/shards/rank<R>), and each rank reads its own."""

    def setup(self, t: Trainer) -> None:
        store = dist.PrefixStore("data/", dist.distributed_c10d._get_default_store())
        if t.rank == 0:
            plan: Dict[int, List[str]] = {}
            for path in sorted(glob.glob(t.path("shards", "*.bin"))):
                name = os.path.basename(path)
                plan.setdefault(zlib.crc32(name.encode()) % t.world, []).append(name)
            for rank, names in plan.items():
                store.set(f"shards/rank{rank}", json.dumps(names))
        self.shards = json.loads(store.get(f"shards/rank{t.rank}"))
        t.log(f"shards: {self.shards}")


# ----------------------------------------------------------------------------------------------------------------
class LocalStage(Feature):
    """Before joining the job, each node's local rank 0 stages the dataset (data/*.pt) onto the node's local disk
    (--stage-dir), under the stage directory's lock (a POSIX record lock, lockf), so that two jobs on one node never
    stage into the same folder at once; a stamp file marks a finished copy."""

    def before_init(self, args: argparse.Namespace) -> None:
        if env_int("LOCAL_RANK") != 0:
            return
        os.makedirs(args.stage_dir, exist_ok=True)
        with open(os.path.join(args.stage_dir, ".lock"), "a+") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)
            try:
                stamp = os.path.join(args.stage_dir, "STAGED")
                if not os.path.exists(stamp):
                    for path in sorted(glob.glob(os.path.join(args.workdir, "data", "*.pt"))):
                        shutil.copy2(path, args.stage_dir)
                    with open(stamp, "w") as f:
                        f.write(f"{time.time():.0f}\n")
            finally:
                fcntl.lockf(lock, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------------------------------
class FusedKernels(Feature):
    """The model's fused kernels (the `fastkernels` package next to this script), imported before the job joins
    up; the package autotunes each device on first use and caches the result on the node (--kernel-cache)."""

    def before_init(self, args: argparse.Namespace) -> None:
        os.environ.setdefault("FASTKERNELS_CACHE", args.kernel_cache)
        os.environ.setdefault("FASTKERNELS_DEVICE", str(env_int("LOCAL_RANK")))
        self.kernels = importlib.import_module("fastkernels")


# ----------------------------------------------------------------------------------------------------------------
class ExtractData(Feature):
    """Each node's local rank 0 extracts the dataset archive (data.zip) into the node's local disk (--data-dir)
    unless a finished extraction is there (its .complete stamp); every rank then waits until all nodes have their
    data (a barrier)."""

    def setup(self, t: Trainer) -> None:
        dest = t.args.data_dir
        if t.local_rank == 0 and not os.path.exists(os.path.join(dest, ".complete")):
            os.makedirs(dest, exist_ok=True)
            subprocess.run(["unzip", "-q", t.path("data.zip"), "-d", dest], check=True)
            with open(os.path.join(dest, ".complete"), "w") as f:
                f.write("ok\n")
        dist.barrier()
        t.log(f"data ready in {dest}: {len(os.listdir(dest))} entries")


# ----------------------------------------------------------------------------------------------------------------
def _tokenizer_complete(path: str) -> bool:
    try:
        with open(path) as f:
            json.load(f)
        return True
    except (OSError, ValueError):
        return False


class TokenizerCopy(Feature):
    """Before joining the job, each node's local rank 0 copies the tokenizer (tokenizer.json) from the shared folder
    to the node's local disk (--tok-dir) unless it is there already (written to a temporary name, then renamed);
    the node's other ranks wait until the node's copy is complete (it parses); every rank loads it from there once
    the job has joined up."""

    def before_init(self, args: argparse.Namespace) -> None:
        local = os.path.join(args.tok_dir, "tokenizer.json")
        if env_int("LOCAL_RANK") == 0:
            if not os.path.exists(local):
                os.makedirs(args.tok_dir, exist_ok=True)
                shutil.copy2(os.path.join(args.workdir, "tokenizer.json"), local + ".tmp")
                os.replace(local + ".tmp", local)
        else:
            while not _tokenizer_complete(local):
                time.sleep(1.0)
        self.local = local

    def setup(self, t: Trainer) -> None:
        with open(self.local) as f:
            self.vocab = json.load(f)["vocab"]
        t.log(f"tokenizer: {len(self.vocab)} entries")


FEATURES: Dict[str, type] = {
    "preprocess": Preprocess,
    "feature_cache": FeatureCache,
    "eval_group": EvalGroup,
    "shard_assign": ShardAssign,
    "local_stage": LocalStage,
    "fused_kernels": FusedKernels,
    "extract_data": ExtractData,
    "tokenizer_copy": TokenizerCopy,
}


def train(t: Trainer) -> None:
    for step in range(t.args.steps):
        inputs, targets = t.batch(step)
        t.opt.zero_grad()
        loss = F.mse_loss(t.model(inputs), targets)
        loss.backward()
        t.sync_gradients()
        t.opt.step()
        if step % 10 == 0:
            t.log(f"step {step} loss {float(loss):.5f}")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--feature", choices=sorted(FEATURES), required=True)
    p.add_argument("--workdir", required=True, help="the run's shared folder")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-delay", type=float, default=0.1)
    p.add_argument("--workers", type=int, default=2, help="preprocessing pool size")
    p.add_argument("--stage-dir", default="/run/train-stage", help="the node-local staging folder")
    p.add_argument("--kernel-cache", default="/run/kernel-cache", help="the node-local autotuning cache")
    p.add_argument("--data-dir", default="/run/train-data", help="the node-local dataset folder")
    p.add_argument("--tok-dir", default="/run/tokenizer", help="the node-local tokenizer folder")
    p.add_argument("--timeout-hours", type=float, default=2.0)
    return p.parse_args(argv)


def main() -> int:
    _ready()
    args = parse_args()
    feature = FEATURES[args.feature]()
    feature.before_init(args)
    dist.init_process_group("gloo", timeout=timedelta(hours=args.timeout_hours))
    t = Trainer(args)
    feature.setup(t)
    train(t)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
