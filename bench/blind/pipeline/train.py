#!/usr/bin/env python3
"""A small pipeline-parallel trainer (gloo, CPU): pipeline stages x data-parallel replicas.

Ranks are laid out stage-major: rank = stage * dp + replica, so with torchrun's 2 processes a node each node holds
one stage's replicas. Stage 0 reads token ids from DATA/inputs-<replica>.jsonl, the last stage reads the targets
from DATA/targets-<replica>.jsonl; activations go forward and gradients backward between neighbouring stages of a
replica (point-to-point on the replica's pipeline group), gradients are averaged over a stage's replicas (its
data-parallel group).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

VOCAB = 1000


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--data-dir", type=Path, default=None, help="default: WORKDIR/data")
    ap.add_argument("--pp", type=int, default=4, help="pipeline stages")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=8, help="rows a step, per replica")
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layer-split", default="2,2,2,2", help="layers per stage")
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "auto"], default="gpipe")
    ap.add_argument("--activation-budget-kb", type=float, default=1024.0,
                    help="--schedule auto: a stage whose GPipe activations would exceed this runs 1F1B")
    ap.add_argument("--p2p", choices=["blocking", "batched"], default="blocking")
    ap.add_argument("--engine", choices=["manual", "torch"], default="manual",
                    help="manual: this file's schedules; torch: torch.distributed.pipelining's")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip-grad", type=float, default=0.0, help="global grad-norm clipping (0: off)")
    ap.add_argument("--freeze-layers", default="", help="a range of layer indices, e.g. 2-3")
    ap.add_argument("--train-tokens", type=int, default=0, help="stop after this many target tokens (0: off)")
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--metrics-dir", type=Path, default=None, help="append each rank's step metrics here (jsonl)")
    ap.add_argument("--dist-timeout-min", type=float, default=120.0)
    return ap.parse_args(argv)


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.ff = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class Stage(nn.Module):
    def __init__(self, index: int, stages: int, layers: List[int], hidden: int) -> None:
        super().__init__()
        self.first, self.last = index == 0, index == stages - 1
        self.layer_ids = layers
        self.embed = nn.Embedding(VOCAB, hidden) if self.first else None
        self.blocks = nn.ModuleList(Block(hidden) for _ in layers)
        self.head = nn.Linear(hidden, 1) if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        if self.head is not None:
            x = self.head(x).squeeze(-1)
        return x


class Shard:
    """One replica's data file, read a line (one batch) at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.f = None

    def next(self) -> dict:
        if self.f is None:
            self.f = open(self.path, "r")
        line = self.f.readline()
        if not line:
            self.f.close()
            self.f = open(self.path, "r")
            line = self.f.readline()
        return json.loads(line)


class Pipeline:
    def __init__(self, args, rank: int, world: int) -> None:
        self.args = args
        self.rank, self.world = rank, world
        self.pp = args.pp
        self.dp = world // args.pp
        self.stage_id, self.replica = divmod(rank, self.dp)
        # every rank creates every group, in the same order
        self.pp_group = self.dp_group = None
        for r in range(self.dp):
            g = dist.new_group([s * self.dp + r for s in range(self.pp)])
            if r == self.replica:
                self.pp_group = g
        for s in range(self.pp):
            g = dist.new_group([s * self.dp + r for r in range(self.dp)])
            if s == self.stage_id:
                self.dp_group = g
        self.prev = rank - self.dp if self.stage_id > 0 else None
        self.next = rank + self.dp if self.stage_id < self.pp - 1 else None
        split = [int(n) for n in args.layer_split.split(",")]
        assert len(split) == self.pp, "--layer-split needs one count per stage"
        start = sum(split[: self.stage_id])
        layers = list(range(start, start + split[self.stage_id]))
        torch.manual_seed(1234 + self.stage_id)  # the replicas of a stage start equal
        self.model = Stage(self.stage_id, self.pp, layers, args.hidden)
        if args.freeze_layers:
            lo, hi = (int(v) for v in args.freeze_layers.split("-"))
            for lid, block in zip(layers, self.model.blocks):
                if lo <= lid <= hi:
                    block.requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=args.lr) if self.params else None
        self.schedule = self.pick_schedule(len(layers))
        data = args.data_dir or (args.workdir / "data")
        self.inputs = Shard(data / f"inputs-{self.replica:02d}.jsonl") if self.model.first else None
        self.targets = Shard(data / f"targets-{self.replica:02d}.jsonl") if self.model.last else None
        self.tokens_seen = 0
        self.act_shape = (args.micro_batch_size, args.seq_len, args.hidden)
        self.pending: list = []  # the step's send handles
        self.pstage = None
        self.schedules: dict = {}
        if args.engine == "torch":
            from torch.distributed.pipelining import PipelineStage

            mbs, seq, h = self.act_shape
            example_in = (torch.zeros(mbs, seq, dtype=torch.long) if self.first else torch.zeros(mbs, seq, h),)
            example_out = torch.zeros(mbs, seq) if self.last else torch.zeros(mbs, seq, h)
            self.pstage = PipelineStage(self.model, self.stage_id, self.pp, torch.device("cpu"),
                                        input_args=example_in, output_args=example_out, group=self.pp_group)

    @property
    def first(self) -> bool:
        return self.model.first

    @property
    def last(self) -> bool:
        return self.model.last

    def pick_schedule(self, n_layers: int) -> str:
        a = self.args
        if a.schedule != "auto":
            return a.schedule
        n_micro = a.batch_size // a.micro_batch_size
        # activations GPipe keeps alive: every microbatch's, through every block of this stage (ff is 2x wide)
        kb = n_micro * a.micro_batch_size * a.seq_len * a.hidden * 4 * 4 * n_layers / 1024
        return "1f1b" if kb > a.activation_budget_kb else "gpipe"

    # --- point to point -------------------------------------------------------------------------------------------

    def _recv(self, peer: int) -> torch.Tensor:
        buf = torch.empty(self.act_shape)
        if self.args.p2p == "batched":
            works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, peer, group=self.pp_group)])
            for w in works:
                w.wait()
        else:
            dist.recv(buf, src=peer, group=self.pp_group)
        return buf

    def _send(self, t: torch.Tensor, peer: int) -> None:
        # sends do not wait for the peer's recv (a stage would block its neighbour's send in 1F1B): their handles
        # are waited for at the end of the step
        t = t.contiguous()
        if self.args.p2p == "batched":
            self.pending += dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer, group=self.pp_group)])
        else:
            self.pending.append(dist.isend(t, dst=peer, group=self.pp_group))

    def flush_sends(self) -> None:
        while self.pending:
            self.pending.pop(0).wait()

    def recv_forward(self) -> torch.Tensor:
        return self._recv(self.prev)

    def send_forward(self, t: torch.Tensor) -> None:
        self._send(t, self.next)

    def recv_backward(self) -> torch.Tensor:
        return self._recv(self.next)

    def send_backward(self, t: torch.Tensor) -> None:
        self._send(t, self.prev)

    # --- one step ---------------------------------------------------------------------------------------------------

    def load(self):
        a = self.args
        ids = tgt = mask = None
        if self.first:
            b = self.inputs.next()
            ids = torch.tensor(b["ids"], dtype=torch.long)
            n_micro = math.ceil(ids.shape[0] / a.micro_batch_size)
        else:
            n_micro = a.batch_size // a.micro_batch_size
        if self.last:
            b = self.targets.next()
            tgt = torch.tensor(b["target"], dtype=torch.float32)
            mask = torch.tensor(b["mask"], dtype=torch.float32)
        return ids, tgt, mask, n_micro

    def forward_one(self, i: int, ids, tgt, mask, saved) -> None:
        mbs = self.args.micro_batch_size
        if self.first:
            inp = ids[i * mbs:(i + 1) * mbs]
        else:
            inp = self.recv_forward().requires_grad_()
        out = self.model(inp)
        loss = None
        if self.last:
            m = mask[i * mbs:(i + 1) * mbs]
            valid = m.sum()
            if valid > 0:  # a microbatch of padding only has no loss
                err = (out - tgt[i * mbs:(i + 1) * mbs]) ** 2
                loss = (err * m).sum() / valid
                self.tokens_seen += int(valid)
        else:
            self.send_forward(out.detach())
        saved[i] = (inp, out, loss)

    def backward_one(self, i: int, saved) -> None:
        inp, out, loss = saved.pop(i)
        if self.last:
            if loss is None:
                return
            loss.backward()
            self.losses.append(loss.item())
        else:
            grad = self.recv_backward()
            out.backward(grad)
        if not self.first:
            self.send_backward(inp.grad)

    def torch_schedule(self, n_micro: int):
        if n_micro not in self.schedules:
            from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

            cls = Schedule1F1B if self.schedule == "1f1b" else ScheduleGPipe
            self.schedules[n_micro] = cls(self.pstage, n_microbatches=n_micro,
                                          loss_fn=masked_mse if self.last else None)
        return self.schedules[n_micro]

    def torch_step(self) -> None:
        ids, tgt, mask, n_micro = self.load()
        if self.last:  # the schedule splits the targets as it splits the batch
            n_micro = math.ceil(tgt.shape[0] / self.args.micro_batch_size)
            self.tokens_seen += int(mask.sum())
        sched = self.torch_schedule(n_micro)
        losses: list = []
        if self.first:
            sched.step(ids)
        elif self.last:
            sched.step(target=torch.stack([tgt, mask], dim=-1), losses=losses)
        else:
            sched.step()
        self.losses = [float(v) for v in losses]

    def step(self) -> None:
        if self.pstage is not None:
            self.torch_step()
            self.reduce_grads()
            self.clip()
            if self.opt is not None:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            return
        ids, tgt, mask, n_micro = self.load()
        saved = {}
        self.losses: List[float] = []
        if self.schedule == "gpipe":
            for i in range(n_micro):
                self.forward_one(i, ids, tgt, mask, saved)
            for i in reversed(range(n_micro)):
                self.backward_one(i, saved)
        else:  # 1F1B: warm up, then one forward / one backward, then drain
            warm = min(self.pp - self.stage_id - 1, n_micro)
            for i in range(warm):
                self.forward_one(i, ids, tgt, mask, saved)
            for i in range(n_micro - warm):
                self.forward_one(warm + i, ids, tgt, mask, saved)
                self.backward_one(i, saved)
            for i in range(n_micro - warm, n_micro):
                self.backward_one(i, saved)
        self.flush_sends()
        self.reduce_grads()
        self.clip()
        if self.opt is not None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def reduce_grads(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.dp_group)
        flat /= self.dp
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def clip(self) -> None:
        if self.args.clip_grad <= 0:
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        sq = torch.stack([g.pow(2).sum() for g in grads]).sum().reshape(1)
        dist.all_reduce(sq, group=self.pp_group)  # the whole model's norm: every stage's share
        norm = float(sq.sqrt())
        if norm > self.args.clip_grad:
            for g in grads:
                g.mul_(self.args.clip_grad / (norm + 1e-6))


def masked_mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """target[..., 0]: the values, target[..., 1]: the mask."""
    m = target[..., 1]
    return (((out - target[..., 0]) ** 2) * m).sum() / m.sum().clamp(min=1.0)


def announce(rank: int, local_rank: int, step: int) -> None:
    path = os.environ.get("HANGSCOPE_READY_FILE")
    if not path:
        return
    line = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "rank": rank, "local_rank": local_rank,
                       "step": step, "where": "training"})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=args.dist_timeout_min))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    pipe = Pipeline(args, rank, world)
    print(f"rank {rank}: stage {pipe.stage_id}/{pipe.pp} replica {pipe.replica}, layers "
          f"{pipe.model.layer_ids}, schedule {pipe.schedule}, {sum(p.numel() for p in pipe.params)} trainable",
          flush=True)
    dist.barrier()
    announce(rank, local_rank, 0)
    for step in range(1, args.steps + 1):
        t0 = time.monotonic()
        pipe.step()
        if args.metrics_dir is not None and step % args.log_every == 0:
            record = {"step": step, "rank": rank, "stage": pipe.stage_id, "seconds": round(time.monotonic() - t0, 4),
                      "loss": sum(pipe.losses) / len(pipe.losses) if pipe.losses else None}
            with open(args.metrics_dir / f"rank-{rank:05d}.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        if pipe.last and pipe.losses and step % args.log_every == 0:
            print(f"step {step} replica {pipe.replica} loss {sum(pipe.losses) / len(pipe.losses):.4f} "
                  f"tokens {pipe.tokens_seen} ({time.monotonic() - t0:.2f}s)", flush=True)
        if pipe.last and args.train_tokens and pipe.tokens_seen >= args.train_tokens:
            print(f"replica {pipe.replica}: {pipe.tokens_seen} tokens, token budget reached at step {step}",
                  flush=True)
            break
    dist.barrier()
    if rank == 0 or pipe.last:
        out = args.workdir / "out"
        out.mkdir(exist_ok=True)
        torch.save(pipe.model.state_dict(), out / f"stage{pipe.stage_id}-replica{pipe.replica}.pt")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
