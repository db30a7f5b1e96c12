"""A small data-parallel gloo job (torchrun, CPU) shaped like real training code: nested loops (epochs > batches >
micro-batches) and the phases inside them (data fetch, forward/backward, gradient all_reduce, optimizer step,
logging, validation, checkpoint). Run by bench/blind/phases/run.py, 4 nodes x 2 ranks.

Gradients are averaged on a data-parallel group of its own (`dp`, as DDP is given a process_group); the metric
reductions and the barriers use the default (world) group. Both are gloo, each with its own sequence of collectives.

--loop picks the shape of the training loop:

  epochs_loader     for epoch in range(E): for x, y in loader: ...; after the inner loop: the epoch's loss
                    all_reduce (world), then validation on the --eval-ranks
  while_steps       while step < N: next(it) (a new epoch's iterator on StopIteration); after each step: a checkpoint
                    shard (--ckpt-local-rank) and, every --eval-every steps, early stopping on the rank's own
                    validation shard; after the loop: dist.barrier() (world) and the final save
  epochs_enumerate  for epoch in range(E): for batch_idx, (x, y) in enumerate(loader): ...; after the inner loop:
                    dist.barrier() (world) and a quick validation
  steps_micro       for step in range(N): for micro in range(A): fetch, forward/backward (optionally the tokens'
                    all_reduce, world, and a per-step token budget); then the gradients' all_reduce, the optimizer
                    step, and logging (the loss's all_reduce, world; heavy statistics on --log-rank)

What makes a rank slow (the job keeps training) or makes some ranks leave a loop the others are still in (the job
hangs): see the flags. The job's own behaviour never reads the harness's files.

For the harness (written, never read, by the job): with env HANGSCOPE_READY_FILE every rank appends one JSON line at
the start of step --ready-step; WORKDIR/steps.log gets `rank step time` after every optimizer step of every rank;
WORKDIR/entered.jsonl gets a line each time a rank enters a collective from global step --mark-from on;
WORKDIR/slow.jsonl gets a line each time a rank of --mark-slow enters its slow phase.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from typing import Iterator, List, Optional, Set, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

BATCH = 8
FEATURES = 16
Batch = Tuple[torch.Tensor, torch.Tensor]


# --- harness marks (never read by the job) --------------------------------------------------------------------

def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Marks:
    def __init__(self, workdir: str, rank: int, mark_from: int, slow: Set[int]) -> None:
        self.workdir, self.rank, self.mark_from, self.slow_ranks = workdir, rank, mark_from, slow
        self.gstep = 0  # the global step under way (optimizer steps completed so far)

    def ready(self) -> None:
        path = os.environ.get("HANGSCOPE_READY_FILE")
        if path:
            _append(path, json.dumps({"rank": self.rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                                      "pid": os.getpid(), "host": socket.gethostname(), "step": self.gstep,
                                      "where": "step"}))

    def enter(self, call: str) -> None:
        if self.gstep >= self.mark_from:
            _append(os.path.join(self.workdir, "entered.jsonl"),
                    json.dumps({"rank": self.rank, "step": self.gstep, "call": call, "t": round(time.time(), 3)}))

    def slow(self, phase: str) -> None:
        if self.rank in self.slow_ranks:
            _append(os.path.join(self.workdir, "slow.jsonl"),
                    json.dumps({"rank": self.rank, "step": self.gstep, "phase": phase, "t": round(time.time(), 3)}))

    def step_done(self) -> None:
        _append(os.path.join(self.workdir, "steps.log"), f"{self.rank} {self.gstep} {time.time():.3f}")
        self.gstep += 1


# --- data -----------------------------------------------------------------------------------------------------

def synthetic_batch(seed: int, size: int = BATCH) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(size, FEATURES, generator=gen)
    return x, x.sum(dim=1, keepdim=True) * 0.1


def decode(x: torch.Tensor, iters: int) -> torch.Tensor:
    """The records' decoding and augmentation, on the CPU: a fixed amount of work per batch."""
    a = torch.randn(128, 128)
    for _ in range(iters):
        a = torch.tanh(a @ a * 0.01)
    return x + a[:1, :FEATURES] * 0.0


class IndexServer:
    """The client of a shard-index service: a helper process that answers each request (`epoch rank`) with the
    shard's record count, after the storage's latency for this rank."""

    def __init__(self, latency: float) -> None:
        code = ("import sys, time\n"
                f"lat = {latency!r}\n"
                "for line in sys.stdin:\n"
                "    time.sleep(lat)\n"
                "    sys.stdout.write('ok ' + line); sys.stdout.flush()\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def lookup(self, epoch: int, rank: int) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{epoch} {rank}\n".encode())
        self.proc.stdin.flush()
        return self.proc.stdout.readline().decode()


class ShardLoader:
    """The batches of this rank's shard for one epoch: `batches` of them; each decoded on the CPU when fetched."""

    def __init__(self, rank: int, epoch: int, batches: int, decode_iters: int, marks: Marks,
                 index: Optional[IndexServer] = None) -> None:
        self.rank, self.epoch, self.batches, self.decode_iters = rank, epoch, batches, decode_iters
        self.marks, self.index = marks, index

    def __iter__(self) -> Iterator[Batch]:
        if self.index is not None:
            self.marks.slow("open_shard")
            self.index.lookup(self.epoch, self.rank)  # open the shard: ask the index service for its records
        for i in range(self.batches):
            x, y = synthetic_batch(self.rank * 100003 + self.epoch * 1009 + i)
            if self.decode_iters:
                self.marks.slow("decode")
                x = decode(x, self.decode_iters)
            yield x, y


def shard_batches(args: argparse.Namespace, rank: int, epoch: int) -> int:
    """How many batches this rank's shard has in this epoch (uneven shards: --short-ranks from --short-epoch)."""
    if rank in args.short_ranks and epoch >= args.short_epoch:
        return args.short_batches
    return args.shard_batches


# --- the steps' parts -----------------------------------------------------------------------------------------

def busy(seconds: float) -> None:
    """CPU work for about `seconds` of wall time (the model's larger part, on the CPU)."""
    a = torch.randn(256, 256)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        a = torch.tanh(a @ a * 0.01)


def forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, scale: float = 1.0,
                     extra_seconds: float = 0.0) -> float:
    loss = F.mse_loss(model(x), y) * scale
    loss.backward()
    if extra_seconds:
        busy(extra_seconds)
    return float(loss)


def sync_gradients(model: nn.Module, group: dist.ProcessGroup, marks: Marks) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    marks.enter("grad_allreduce")
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def validate(model: nn.Module, rank: int, seconds: float, marks: Marks) -> float:
    """Validation on this rank's held-out set (a fixed batch, and `seconds` of the rest of the model's forward)."""
    if seconds:
        marks.slow("validate")
    with torch.no_grad():
        x, y = synthetic_batch(7777 + rank)
        loss = float(F.mse_loss(model(x), y))
        if seconds:
            busy(seconds)
    return loss


def local_val_loss(model: nn.Module, rank: int, records: int) -> float:
    """The mean loss over this rank's validation shard of `records` batches (0 when the shard is empty)."""
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(records):
            x, y = synthetic_batch(5555 + rank * 31 + i)
            total += float(F.mse_loss(model(x), y))
            n += 1
    return total / max(n, 1)


class Uploader:
    """The checkpoint's way out: a helper process that copies stdin to storage at a limited rate."""

    def __init__(self, mb_per_s: float) -> None:
        chunk = 65536
        code = ("import sys, time\n"
                f"pause = {chunk / (mb_per_s * 1024 * 1024)!r}\n"
                "inp = sys.stdin.buffer\n"
                f"while inp.read({chunk}):\n"
                "    time.sleep(pause)\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)

    def save(self, state: dict, pad_mb: int) -> None:
        buf = io.BytesIO()
        torch.save({**state, "optimizer_state": torch.zeros(pad_mb * 1024 * 256)}, buf)
        assert self.proc.stdin is not None
        self.proc.stdin.write(buf.getbuffer())
        self.proc.stdin.flush()


# --- the loops ------------------------------------------------------------------------------------------------

class Ctx:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.manual_seed(0)
        self.model: nn.Module = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.dp = dist.new_group(backend="gloo")
        self.marks = Marks(args.workdir, self.rank, args.mark_from, set(args.mark_slow))

    def maybe_ready(self) -> None:
        if self.marks.gstep == self.args.ready_step:
            self.marks.ready()


def epochs_loader(c: Ctx) -> None:
    args, model, opt = c.args, c.model, c.opt
    for epoch in range(args.epochs):
        loader = ShardLoader(c.rank, epoch, shard_batches(args, c.rank, epoch), args.decode_iters, c.marks)
        total, seen = 0.0, 0
        for x, y in loader:
            c.maybe_ready()
            opt.zero_grad()
            total += forward_backward(model, x, y)
            seen += 1
            sync_gradients(model, c.dp, c.marks)
            opt.step()
            c.marks.step_done()
        stats = torch.tensor([total, float(seen)])
        c.marks.enter("epoch_allreduce")
        dist.all_reduce(stats)
        if c.rank in args.eval_ranks:
            validate(model, c.rank, args.eval_seconds, c.marks)


def while_steps(c: Ctx) -> None:
    args, model, opt = c.args, c.model, c.opt
    uploader = Uploader(args.upload_mb_s) if args.ckpt_mb and c.local_rank == args.ckpt_local_rank else None
    step, epoch = 0, 0
    it = iter(ShardLoader(c.rank, epoch, shard_batches(args, c.rank, epoch), args.decode_iters, c.marks))
    while step < args.steps:
        try:
            x, y = next(it)
        except StopIteration:
            epoch += 1
            it = iter(ShardLoader(c.rank, epoch, shard_batches(args, c.rank, epoch), args.decode_iters, c.marks))
            continue
        c.maybe_ready()
        opt.zero_grad()
        forward_backward(model, x, y)
        sync_gradients(model, c.dp, c.marks)
        opt.step()
        step += 1
        c.marks.step_done()
        if uploader is not None:
            c.marks.slow("save_shard")
            uploader.save({"step": step, "model": model.state_dict()}, args.ckpt_mb)
        if args.eval_every and step % args.eval_every == 0:
            records = 0 if c.rank in args.empty_val_ranks else 2
            if local_val_loss(model, c.rank, records) <= args.target_loss:
                break  # converged
    c.marks.enter("barrier")
    dist.barrier()
    if c.rank == 0:
        torch.save(model.state_dict(), os.path.join(args.workdir, "final.pt"))


def epochs_enumerate(c: Ctx) -> None:
    args, model, opt = c.args, c.model, c.opt
    index = None
    if args.index_latency:
        index = IndexServer(args.index_latency if c.rank in args.slow_index_ranks else 0.0)
    for epoch in range(args.epochs):
        loader = ShardLoader(c.rank, epoch, shard_batches(args, c.rank, epoch), args.decode_iters, c.marks, index)
        for batch_idx, (x, y) in enumerate(loader):
            c.maybe_ready()
            opt.zero_grad()
            loss = forward_backward(model, x, y)
            sync_gradients(model, c.dp, c.marks)
            opt.step()
            c.marks.step_done()
            if batch_idx % 100 == 0 and c.rank == 0 and args.verbose:
                print(f"epoch {epoch} batch {batch_idx} loss {loss:.4f}", flush=True)
        c.marks.enter("barrier")
        dist.barrier()
        validate(model, c.rank, 0.0, c.marks)


def steps_micro(c: Ctx) -> None:
    args, model, opt = c.args, c.model, c.opt
    heavy = args.heavy_seconds if c.rank in args.heavy_ranks else 0.0
    for step in range(args.steps):
        c.maybe_ready()
        opt.zero_grad()
        tokens_seen = 0
        x = torch.empty(0)
        for micro in range(args.accum):
            size = BATCH
            if c.rank in args.partial_ranks and step == args.partial_step and micro == args.accum - 1:
                size = BATCH // 2  # the shard's tail: a partial batch
            x, y = synthetic_batch(c.rank * 100003 + step * 101 + micro, size)
            if heavy:
                c.marks.slow("forward")
            loss = forward_backward(model, x, y, scale=1.0 / args.accum, extra_seconds=heavy)
            tokens = x.shape[0] * (args.long_factor if c.rank in args.long_ranks and step == args.long_step else 1)
            tokens_seen += tokens
            if args.count_tokens:
                count = torch.tensor([float(tokens)])
                c.marks.enter("tokens_allreduce")
                dist.all_reduce(count)
            if args.max_tokens and tokens_seen >= args.max_tokens:
                break  # this step's token budget is spent
        sync_gradients(model, c.dp, c.marks)
        opt.step()
        c.marks.step_done()
        if x.shape[0] < BATCH:
            continue  # a partial batch: not logged
        metric = torch.tensor([loss])
        c.marks.enter("metrics_allreduce")
        dist.all_reduce(metric)
        if c.rank == args.log_rank:
            if args.log_seconds:
                c.marks.slow("log_stats")
                busy(args.log_seconds)  # the weight and activation histograms of the step
            if args.verbose:
                print(f"step {step} loss {float(metric) / c.world:.4f}", flush=True)


LOOPS = {"epochs_loader": epochs_loader, "while_steps": while_steps, "epochs_enumerate": epochs_enumerate,
         "steps_micro": steps_micro}


def ranks(text: str) -> List[int]:
    return [int(r) for r in text.split(",") if r.strip()]


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--loop", choices=sorted(LOOPS), required=True)
    p.add_argument("--epochs", type=int, default=100000)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--ready-step", type=int, default=1)
    p.add_argument("--mark-from", type=int, default=10 ** 9, help="harness: mark collectives from this global step")
    p.add_argument("--mark-slow", type=ranks, default=[], help="harness: mark these ranks' slow phases")
    p.add_argument("--verbose", action="store_true")
    # data
    p.add_argument("--shard-batches", type=int, default=3)
    p.add_argument("--short-ranks", type=ranks, default=[], help="ranks whose shard is shorter from --short-epoch")
    p.add_argument("--short-epoch", type=int, default=1)
    p.add_argument("--short-batches", type=int, default=1)
    p.add_argument("--decode-iters", type=int, default=0, help="CPU decoding work per batch (every rank)")
    p.add_argument("--index-latency", type=float, default=0.0, help="the shard-index service's latency ...")
    p.add_argument("--slow-index-ranks", type=ranks, default=[], help="... for these ranks (0 for the others)")
    # phases
    p.add_argument("--eval-ranks", type=ranks, default=[], help="epochs_loader: the ranks that validate")
    p.add_argument("--eval-seconds", type=float, default=0.0)
    p.add_argument("--ckpt-mb", type=int, default=0, help="while_steps: a checkpoint shard this big every step ...")
    p.add_argument("--ckpt-local-rank", type=int, default=0, help="... written by this local rank of each node")
    p.add_argument("--upload-mb-s", type=float, default=1.5)
    p.add_argument("--eval-every", type=int, default=0, help="while_steps: early stopping every N steps")
    p.add_argument("--empty-val-ranks", type=ranks, default=[], help="ranks whose validation shard is empty")
    p.add_argument("--target-loss", type=float, default=1e-4)
    p.add_argument("--accum", type=int, default=2, help="steps_micro: micro-batches per step")
    p.add_argument("--heavy-ranks", type=ranks, default=[], help="steps_micro: their micro-batches are longer")
    p.add_argument("--heavy-seconds", type=float, default=0.0)
    p.add_argument("--partial-ranks", type=ranks, default=[], help="steps_micro: a partial batch at --partial-step")
    p.add_argument("--partial-step", type=int, default=-1)
    p.add_argument("--count-tokens", action="store_true", help="steps_micro: all_reduce the tokens of each micro")
    p.add_argument("--max-tokens", type=int, default=0, help="steps_micro: a rank's token budget per step")
    p.add_argument("--long-ranks", type=ranks, default=[], help="steps_micro: long sequences at --long-step")
    p.add_argument("--long-step", type=int, default=-1)
    p.add_argument("--long-factor", type=int, default=1)
    p.add_argument("--log-rank", type=int, default=0)
    p.add_argument("--log-seconds", type=float, default=0.0)
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(hours=2))
    c = Ctx(args)
    LOOPS[args.loop](c)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
