"""A small data-parallel training script (torch.distributed, gloo, CPU) with the data-parallel and autograd machinery
real training code carries: DistributedDataParallel (buffers broadcast each forward, no_sync gradient accumulation),
ZeroRedundancyOptimizer, rank-local expert parameters, a tensor-parallel auxiliary head with a custom
autograd.Function, a module backward hook for gradient statistics, and a two-stage pipeline (send/recv between the
stages of a node).

Run under torchrun by bench/blind/ddp/run.py, one recipe per job (--recipe). Each recipe is written as such code
usually is; the set-up (bench/blind/ddp/scenarios.py) writes each rank's data shard (data/rank<R>.jsonl: one batch
a line) and gives one rank or one node the data it meets some steps into the run.

Readiness for the harness: with env HANGSCOPE_READY_FILE set, every rank appends one JSON line as soon as it starts
(the format tests/support/jobs.py reads), before anything that could wait.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB = 1000
DIM = 32
HIDDEN = 64


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


# --- data ----------------------------------------------------------------------------------------------------------

def read_shard(path: str) -> List[Dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def tensors(batch: Dict[str, Any]) -> Tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(batch["ids"], dtype=torch.long), torch.tensor(batch["y"], dtype=torch.float32)


# --- models --------------------------------------------------------------------------------------------------------

class Encoder(nn.Module):
    """Token ids -> a pooled, normalised hidden vector."""

    def __init__(self, norm: str = "layer") -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.proj = nn.Linear(DIM, HIDDEN)
        self.norm = nn.BatchNorm1d(HIDDEN) if norm == "batch" else nn.LayerNorm(HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.proj(self.embed(ids).mean(dim=1))))


class Regressor(nn.Module):
    def __init__(self, norm: str = "layer") -> None:
        super().__init__()
        self.encoder = Encoder(norm)
        self.body = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU())
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.encoder(ids))).squeeze(-1)


class Refiner(nn.Module):
    """One refinement iteration, applied as many times as the batch asks (adaptive depth)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + 0.5 * torch.tanh(self.lin(h))


class AdaptiveRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.refine = Refiner()
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, ids: torch.Tensor, depth: int) -> torch.Tensor:
        h = self.encoder(ids)
        for _ in range(depth):
            h = self.refine(h)
        return self.head(h).squeeze(-1)


class TwoHeaded(nn.Module):
    """The regression head and the hidden state the auxiliary (tensor-parallel) head reads."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(ids)
        return self.head(h).squeeze(-1), h


# --- the trainer ---------------------------------------------------------------------------------------------------

class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.local_rank = env_int("LOCAL_RANK")
        self.host = socket.gethostname()
        torch.manual_seed(0)
        os.makedirs(self.path("logs"), exist_ok=True)
        self.logfile = open(self.path("logs", f"rank{self.rank}.log"), "a", buffering=1)  # noqa: SIM115

    def path(self, *parts: str) -> str:
        return os.path.join(self.args.workdir, *parts)

    def shard(self, name: str = "rank") -> List[Dict[str, Any]]:
        return read_shard(self.path("data", f"{name}{self.rank}.jsonl"))

    def log(self, text: str) -> None:
        self.logfile.write(f"{time.strftime('%H:%M:%S')} [rank {self.rank}] {text}\n")

    def pause(self) -> None:
        time.sleep(self.args.step_delay)  # the model's compute, scaled down


def barrier_and_report(t: Trainer, what: str) -> None:
    dist.barrier()
    t.log(what)


# recipe: sharded optimizer state (ZeroRedundancyOptimizer), checkpoint every --ckpt-every steps -----------------

def recipe_zero(t: Trainer) -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = DDP(Regressor())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    for step, batch in enumerate(t.shard()):
        ids, y = tensors(batch)
        t.pause()
        loss = F.mse_loss(model(ids), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step > 0 and step % t.args.ckpt_every == 0 and t.rank == 0:
            opt.consolidate_state_dict(to=0)
            os.makedirs(t.path("ckpt"), exist_ok=True)
            torch.save({"step": step, "model": model.module.state_dict(), "optim": opt.state_dict()},
                       t.path("ckpt", f"step-{step:06d}.pt"))
            t.log(f"checkpoint of step {step} written")
    barrier_and_report(t, "done")


# recipe: one epoch over this rank's shard, then the end-of-epoch checkpoint --------------------------------------

def recipe_epoch(t: Trainer) -> None:
    model = DDP(Regressor())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = t.shard()
    seen = 0
    for step, batch in enumerate(batches):
        ids, y = tensors(batch)
        t.pause()
        loss = F.mse_loss(model(ids), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += len(batch["y"])
        if step % 5 == 0:
            t.log(f"step {step} loss {float(loss.detach()):.4f}")
    t.log(f"epoch done: {seen} samples")
    barrier_and_report(t, "all ranks at the end of the epoch")
    if t.rank == 0:
        torch.save(model.module.state_dict(), t.path("epoch.pt"))


# recipe: an auxiliary head, tensor-parallel over the node's two ranks, on batches that carry auxiliary labels --------

class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's `f`: identity forward; backward sums the input gradient over the tensor-parallel group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ColumnParallelAux(nn.Module):
    """This rank's column shard of the auxiliary head (HIDDEN -> 8 outputs, split over the group)."""

    def __init__(self, group: Any, parts: int) -> None:
        super().__init__()
        self.group = group
        self.shard = nn.Linear(HIDDEN, 8 // parts)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.shard(CopyToTensorParallel.apply(h, self.group))


def recipe_aux(t: Trainer) -> None:
    per_node = env_int("LOCAL_WORLD_SIZE", 2)
    groups = [dist.new_group(list(range(n, n + per_node))) for n in range(0, t.world, per_node)]
    tp_group = groups[t.rank // per_node]
    model = DDP(TwoHeaded())
    aux = ColumnParallelAux(tp_group, per_node)
    opt = torch.optim.SGD(list(model.parameters()) + list(aux.parameters()), lr=0.01)
    for step, batch in enumerate(t.shard()):
        ids, y = tensors(batch)
        has_aux = torch.tensor(batch["aux"], dtype=torch.bool)
        t.pause()
        pred, h = model(ids)
        loss = F.mse_loss(pred, y)
        if has_aux.any():
            aux_out = aux(h[has_aux])
            loss = loss + 0.1 * aux_out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    barrier_and_report(t, "done")


# recipe: robust training loop (a batch whose forward fails is logged and skipped) -------------------------------

def recipe_robust(t: Trainer) -> None:
    model = DDP(Regressor(norm="batch"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    skipped = 0
    for step, batch in enumerate(t.shard()):
        ids, y = tensors(batch)
        t.pause()
        try:
            pred = model(ids)
        except (IndexError, RuntimeError) as exc:
            skipped += 1
            print(f"[rank {t.rank}] warning: step {step}: skipping batch: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            continue
        loss = F.mse_loss(pred, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    barrier_and_report(t, f"done ({skipped} batches skipped)")


# recipe: a dense model (DDP) with one rank-local expert per rank; gradients clipped to a global norm -----------------

def clip_global_norm(dense: List[nn.Parameter], local: List[nn.Parameter], max_norm: float) -> float:
    """The dense gradients are the same on every rank (DDP averaged them); the experts' are this rank's own, so
    their share of the norm is summed over the ranks, which only matters when it alone could reach max_norm."""
    dense_sq = sum(float(p.grad.pow(2).sum()) for p in dense if p.grad is not None)
    local_sq = torch.zeros(1)
    for p in local:
        if p.grad is not None:
            local_sq += p.grad.pow(2).sum()
    if float(local_sq) > max_norm ** 2:
        dist.all_reduce(local_sq)
    total = math.sqrt(dense_sq + float(local_sq))
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for p in list(dense) + list(local):
            if p.grad is not None:
                p.grad.mul_(coef)
    return total


def recipe_experts(t: Trainer) -> None:
    model = DDP(Regressor(norm="batch"))
    expert = nn.Linear(HIDDEN, 1)  # this rank's expert: not replicated, not in DDP
    dense, local = list(model.parameters()), list(expert.parameters())
    opt = torch.optim.SGD(dense + local, lr=0.01)
    for step, batch in enumerate(t.shard()):
        ids, y = tensors(batch)
        t.pause()
        pred = model(ids) + expert(model.module.encoder(ids).detach()).squeeze(-1)
        loss = F.mse_loss(pred, y)
        opt.zero_grad()
        loss.backward()
        norm = clip_global_norm(dense, local, t.args.max_norm)
        opt.step()
        if step % 5 == 0:
            t.log(f"step {step} loss {float(loss.detach()):.4f} grad norm {norm:.3f}")
    barrier_and_report(t, "done")


# recipe: a two-stage pipeline on each node (local rank 0: the encoder; local rank 1: the head and the labels) -------

def recipe_pipeline(t: Trainer) -> None:
    per_node = env_int("LOCAL_WORLD_SIZE", 2)
    stage = t.rank % per_node
    stage_groups = [dist.new_group(list(range(s, t.world, per_node))) for s in range(per_node)]
    my_stage = stage_groups[stage]
    micro = t.args.micro
    if stage == 0:
        part: nn.Module = Encoder()
        peer = t.rank + 1
        batches = t.shard()
    else:
        part = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
        peer = t.rank - 1
        batches = t.shard("labels")
    opt = torch.optim.SGD(part.parameters(), lr=0.01)
    for step, batch in enumerate(batches):
        t.pause()
        opt.zero_grad()
        stat = torch.zeros(2)
        if stage == 0:
            ids = torch.tensor(batch["ids"], dtype=torch.long)
            n_micro = len(ids) // micro
            outs = []
            for m in range(n_micro):
                h = part(ids[m * micro:(m + 1) * micro])
                dist.send(h.detach().contiguous(), peer)
                outs.append(h)
            for m in range(n_micro):
                g = torch.empty(micro, HIDDEN)
                dist.recv(g, peer)
                outs[m].backward(g)
        else:
            y = torch.tensor(batch["y"], dtype=torch.float32)
            n_micro = len(y) // micro
            pending = []
            for m in range(n_micro):
                h = torch.empty(micro, HIDDEN)
                dist.recv(h, peer)
                h.requires_grad_(True)
                loss = F.mse_loss(part(h).squeeze(-1), y[m * micro:(m + 1) * micro]) / n_micro
                loss.backward()
                pending.append(dist.isend(h.grad.contiguous(), peer))
                stat += torch.tensor([float(loss.detach()), 1.0])
            for req in pending:
                req.wait()
        flat = torch.cat([p.grad.reshape(-1) for p in part.parameters()])
        dist.all_reduce(flat, group=my_stage)
        flat /= dist.get_world_size(my_stage)
        offset = 0
        for p in part.parameters():
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
        dist.all_reduce(stat)  # the step's loss, for the log
        if t.rank == 1 and step % 5 == 0:
            t.log(f"step {step} loss {float(stat[0]) / max(1.0, float(stat[1])):.4f}")
    barrier_and_report(t, "done")


# recipe: gradient accumulation to a token budget per optimizer step, the loss normalised by the global token count --

def recipe_accumulate(t: Trainer) -> None:
    model = DDP(Regressor(norm="batch"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    budget = t.args.tokens_per_step
    tokens, micro, updates = 0, 0, 0
    for batch in t.shard():
        ids, y = tensors(batch)
        mask = torch.tensor(batch["mask"], dtype=torch.bool)
        t.pause()
        n_tok = int(mask.sum())
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(t.world)]
        dist.all_gather(counts, torch.tensor([n_tok]))  # this micro-batch's tokens on every rank
        global_tokens = int(sum(int(c) for c in counts))
        tokens += n_tok
        boundary = tokens >= budget
        with (contextlib.nullcontext() if boundary else model.no_sync()):
            pred = model(ids * mask)
            loss = F.mse_loss(pred, y, reduction="sum") * (t.world * n_tok / global_tokens) / len(y)
            loss.backward()
        micro += 1
        if boundary:
            opt.step()
            opt.zero_grad()
            if t.rank == 0 and updates % 5 == 0:
                t.log(f"update {updates}: {micro} micro-batches, {tokens} tokens")
            tokens, micro, updates = 0, 0, updates + 1
    barrier_and_report(t, "done")


# recipe: adaptive-depth model, with gradient statistics of the refinement block gathered for the log -------------

class GradStats:
    """A full backward hook on a module: every --stats-every-th gradient through it, the ranks' gradient norms
    are gathered for the log."""

    def __init__(self, t: Trainer, module: nn.Module, every: int) -> None:
        self.t, self.every, self.calls = t, every, 0
        self.handle = module.register_full_backward_hook(self)

    def __call__(self, module: nn.Module, grad_input: Any, grad_output: Any) -> None:
        self.calls += 1
        if self.calls % self.every:
            return
        mine = grad_output[0].detach().norm().reshape(1)
        norms = [torch.zeros(1) for _ in range(self.t.world)]
        dist.all_gather(norms, mine)
        if self.t.rank == 0:
            self.t.log(f"refine grad norms {[round(float(n), 4) for n in norms]}")


def recipe_adaptive(t: Trainer) -> None:
    model = AdaptiveRegressor()
    stats = GradStats(t, model.refine, t.args.stats_every)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step, batch in enumerate(t.shard()):
        ids, y = tensors(batch)
        t.pause()
        loss = F.mse_loss(ddp(ids, batch["depth"]), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 0:
            t.log(f"step {step} loss {float(loss.detach()):.4f} ({stats.calls} refine backward calls)")
    barrier_and_report(t, "done")


RECIPES = {
    "zero": recipe_zero,
    "epoch": recipe_epoch,
    "aux": recipe_aux,
    "robust": recipe_robust,
    "experts": recipe_experts,
    "pipeline": recipe_pipeline,
    "accumulate": recipe_accumulate,
    "adaptive": recipe_adaptive,
}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--recipe", choices=sorted(RECIPES), required=True)
    p.add_argument("--workdir", required=True, help="the run's shared folder (data/, logs/)")
    p.add_argument("--step-delay", type=float, default=0.05)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--max-norm", type=float, default=5.0)
    p.add_argument("--micro", type=int, default=2, help="pipeline micro-batch size")
    p.add_argument("--tokens-per-step", type=int, default=150)
    p.add_argument("--stats-every", type=int, default=20)
    p.add_argument("--timeout-hours", type=float, default=2.0)
    return p.parse_args(argv)


def main() -> int:
    _ready()
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(hours=args.timeout_hours))
    t = Trainer(args)
    RECIPES[args.recipe](t)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
