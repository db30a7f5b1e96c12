#!/usr/bin/env python3
"""Data-parallel trainer for a small token regression model (gloo, CPU), with its checkpointing.

    torchrun --nnodes N --nproc_per_node P train.py --workdir DIR --checkpoint MODE [--resume] ...

Data: DIR/data/train-<rank>.jsonl, one batch a line ({"ids": [[...]], "mask": [[...]], "y": [...]}).
Gradients are averaged by hand (one flat all_reduce a step). Checkpoints go under DIR/ckpt:

  full     every --save-every steps, rank 0 writes one full checkpoint with every rank's RNG / loader state
  async    every --save-every steps, each rank writes its own copy on a background writer thread
  node     every --save-every steps, local rank 0 of each node writes the node's copy under the node's
           checkpoint lock, then all ranks meet in a barrier
  agent    every --save-every steps, local rank 0 of each node streams the state to the node's upload
           agent (/run/ckpt-upload.sock), then all ranks meet in a barrier
  sharded  every --save-every steps, each rank writes the optimizer shard of the parameters it owns,
           gzip-compressed, then all ranks meet in a barrier
  dcp      torch.distributed.checkpoint every --save-every-tokens tokens (counted by each rank), and/or at
           the end of each epoch (--save-at-epoch-end)
  rank     every --save-every steps each rank writes its own resumable state (step, loader position, model,
           optimizer), then all ranks meet in a barrier; --resume restarts from the newest loadable one
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

VOCAB, DIM = 1000, 64


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.shift = nn.Parameter(torch.zeros(1))
        self.norm = nn.LayerNorm(DIM)
        self.proj = nn.Linear(DIM, 8, bias=False)
        self.tok = nn.Embedding(VOCAB, DIM)
        self.head = nn.Linear(8, 1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) * mask.unsqueeze(-1)
        x = x.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        x = torch.tanh(self.proj(self.norm(x)))
        return self.head(x).squeeze(-1) * self.scale + self.shift


def build(seed: int = 1234):
    torch.manual_seed(seed)
    model = Regressor()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def log(msg: str) -> None:
    print(f"[rank {os.environ.get('RANK', '?')}] {msg}", flush=True)


# --- data -----------------------------------------------------------------------------------------------------------

class Shard:
    def __init__(self, path: Path) -> None:
        self.batches = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def __len__(self) -> int:
        return len(self.batches)

    def get(self, index: int):
        b = self.batches[index]
        ids = torch.tensor(b["ids"], dtype=torch.long)
        mask = torch.tensor(b.get("mask") or [[1] * len(r) for r in b["ids"]], dtype=torch.float32)
        return ids, mask, torch.tensor(b["y"], dtype=torch.float32)


# --- gradient sync ----------------------------------------------------------------------------------------------------

def sync_gradients(model: nn.Module, world: int) -> None:
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def train_step(model, opt, shard: Shard, index: int, world: int) -> tuple:
    ids, mask, y = shard.get(index)
    opt.zero_grad(set_to_none=False)
    loss = nn.functional.mse_loss(model(ids, mask), y)
    loss.backward()
    sync_gradients(model, world)
    opt.step()
    return loss.item(), int(mask.sum().item())


# --- checkpointing --------------------------------------------------------------------------------------------------

class Checkpointer:
    def __init__(self, args, rank: int, local_rank: int, world: int, model, opt) -> None:
        self.args, self.rank, self.local_rank, self.world = args, rank, local_rank, world
        self.model, self.opt = model, opt
        self.root = Path(args.workdir) / "ckpt"
        self.node = socket.gethostname()
        # checkpoint traffic on its own group, so it never interleaves with the gradient all_reduce
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=2))
        self._lock = threading.Lock()
        self.tokens_seen = 0
        self.next_token_save = args.save_every_tokens

    def state(self, step: int, position: int) -> dict:
        return {"step": step, "position": position, "model": self.model.state_dict(),
                "optim": self.opt.state_dict(), "rng": torch.get_rng_state()}

    # full: one file, written by rank 0
    def save_full(self, step: int, position: int) -> None:
        loader_states = [None] * self.world
        dist.gather_object({"position": position, "rng": torch.get_rng_state()}, loader_states, dst=0,
                           group=self.group)
        path = self.root / "full" / f"step_{step:08d}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({**self.state(step, position), "ranks": loader_states}, path)

    # async: a background writer thread, one write at a time
    def save_async(self, step: int, position: int) -> None:
        self._lock.acquire()  # released by the writer when the previous write is on disk
        staged = {k: (v.detach().clone() if torch.is_tensor(v) else v)
                  for k, v in self.state(step, position)["model"].items()}
        path = self.root / f"rank{self.rank}" / "model.pt"
        writer = threading.Thread(target=self._write, args=({"step": step, "model": staged}, path),
                                  name="ckpt-writer", daemon=True)
        writer.start()

    def _write(self, payload: dict, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                torch.save(payload, f)
        finally:
            self._lock.release()

    # node: local rank 0 writes the node's copy under the node's checkpoint lock
    def save_node(self, step: int, position: int) -> None:
        if self.local_rank == 0:
            folder = self.root / self.node
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / ".lock", "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    torch.save(self.state(step, position), folder / f"step_{step:08d}.pt")
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        dist.barrier(group=self.group)

    # agent: local rank 0 streams to the node's upload agent
    def save_agent(self, step: int, position: int) -> None:
        if self.local_rank == 0:
            import io

            buf = io.BytesIO()
            torch.save(self.state(step, position), buf)
            data = buf.getvalue()
            name = f"{self.node}/step_{step:08d}.pt".encode()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect("/run/ckpt-upload.sock")
                s.sendall(struct.pack("!II", len(name), len(data)) + name)
                s.sendall(data)
                s.recv(16)  # the agent's ack
        dist.barrier(group=self.group)

    # sharded: each rank writes the optimizer state of the parameters it owns (index % world), gzip'd
    def save_sharded(self, step: int, position: int) -> None:
        params = list(self.model.parameters())
        opt_state = self.opt.state
        owned = {i: {"param": p.detach(), **{k: v for k, v in opt_state.get(p, {}).items()}}
                 for i, p in enumerate(params) if i % self.world == self.rank}
        path = self.root / "sharded" / f"step_{step:08d}" / f"shard-{self.rank:05d}.pt.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        gz = subprocess.Popen(["gzip", "-1", "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        torch.save({"step": step, "owned": owned}, gz.stdin)
        gz.stdin.close()
        blob = gz.stdout.read()
        gz.wait()
        path.write_bytes(blob)
        dist.barrier(group=self.group)

    # dcp: torch.distributed.checkpoint
    def save_dcp(self, step: int, position: int, tag: str) -> None:
        import torch.distributed.checkpoint as dcp

        state = {"model": self.model.state_dict(), "step": torch.tensor(step)}
        dcp.save(state, checkpoint_id=str(self.root / "dcp" / f"{tag}_{step:08d}"), process_group=self.group)

    # rank: each rank's own resumable state
    def save_rank(self, step: int, position: int) -> None:
        folder = self.root / f"rank{self.rank:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".step_{step:08d}.pt.tmp"
        torch.save(self.state(step, position), tmp)
        os.replace(tmp, folder / f"step_{step:08d}.pt")
        dist.barrier(group=self.group)  # every rank's file is on disk before the step counts as saved

    def resume(self) -> tuple:
        folder = self.root / f"rank{self.rank:05d}"
        for path in sorted(folder.glob("step_*.pt"), reverse=True):
            try:
                state = torch.load(path, weights_only=False)
            except Exception as exc:  # a file cut short: fall back to the one before
                log(f"cannot load {path.name} ({type(exc).__name__}: {exc}); trying an older checkpoint")
                continue
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optim"])
            torch.set_rng_state(state["rng"])
            log(f"resumed from {path.name}")
            return state["step"], state["position"]
        return 0, -1

    def after_step(self, step: int, position: int, tokens: int, epoch_end: bool) -> None:
        mode, every = self.args.checkpoint, self.args.save_every
        if mode == "full" and step % every == 0:
            if self.rank == 0:
                self.save_full(step, position)
        elif mode == "async" and step % every == 0:
            self.save_async(step, position)
        elif mode == "node" and step % every == 0:
            self.save_node(step, position)
        elif mode == "agent" and step % every == 0:
            self.save_agent(step, position)
        elif mode == "sharded" and step % every == 0:
            self.save_sharded(step, position)
        elif mode == "rank" and step % every == 0:
            self.save_rank(step, position)
        elif mode == "dcp":
            self.tokens_seen += tokens
            if self.args.save_every_tokens and self.tokens_seen >= self.next_token_save:
                self.save_dcp(step, position, "tokens")
                self.next_token_save += self.args.save_every_tokens
            if self.args.save_at_epoch_end and epoch_end:
                self.save_dcp(step, position, "epoch")


def ready(rank: int, local_rank: int, step: int) -> None:
    """One line for the launcher's harness: this rank trains."""
    path = os.environ.get("HANGSCOPE_READY_FILE")
    if not path:
        return
    line = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "rank": rank, "local_rank": local_rank,
                       "step": step, "where": "training"})
    with open(path, "a") as f:
        f.write(line + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--checkpoint", default="full",
                    choices=["full", "async", "node", "agent", "sharded", "dcp", "rank"])
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--save-every-tokens", type=int, default=0)
    ap.add_argument("--save-at-epoch-end", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--steps", type=int, default=120)
    args = ap.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=2))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.set_num_threads(1)
    shard = Shard(Path(args.workdir) / "data" / f"train-{rank:05d}.jsonl")
    model, opt = build()
    ckpt = Checkpointer(args, rank, local_rank, world, model, opt)
    step, position = ckpt.resume() if args.resume else (0, -1)
    told = False
    while step < args.steps:
        position = (position + 1) % len(shard)
        step += 1
        loss, tokens = train_step(model, opt, shard, position, world)
        if not told:
            ready(rank, local_rank, step)
            told = True
        if step % 5 == 0:
            log(f"step {step} loss {loss:.4f}")
        ckpt.after_step(step, position, tokens, epoch_end=position == len(shard) - 1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
