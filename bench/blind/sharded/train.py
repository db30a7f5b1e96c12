"""A small 2-D parallel trainer: FSDP2 (fully_shard) over the data-parallel mesh dimension, context parallelism over
the second one (each rank of a cp pair holds half of every sequence), a mixture-of-experts layer with expert
parallelism over the cp pair (token all_to_all), experts replicated over data parallel (their gradients synced by
hand over the expert-data-parallel group). gloo on CPU.

    torchrun --nnodes 4 --nproc_per_node 2 ... train.py --workdir DIR [--save-step N] [--accum-tokens T]

Data: DIR/data/shard<D>.jsonl, one batch a line for data-parallel index D: {"ids": [[...]], "y": [...]}; each
sequence is split in two halves, cp rank 0 takes the first, cp rank 1 the second.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import time

import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

warnings.filterwarnings("ignore")
VOCAB, DIM, EXPERTS = 1000, 16, 4
PAD = 0

ap = argparse.ArgumentParser()
ap.add_argument("--workdir", required=True)
ap.add_argument("--dp", type=int, default=4)
ap.add_argument("--cp", type=int, default=2)
ap.add_argument("--save-step", type=int, default=-1)
ap.add_argument("--accum-tokens", type=int, default=0, help="accumulate micro-batches until this many local tokens")
ap.add_argument("--spike-limit", type=float, default=50.0)
ap.add_argument("--epochs", type=int, default=1)
args = ap.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
mesh = init_device_mesh("cpu", (args.dp, args.cp), mesh_dim_names=("dp", "cp"))
dp_rank, cp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("cp")
dp_group, cp_group = mesh["dp"].get_group(), mesh["cp"].get_group()


def _groups(lists):
    mine = None
    for ranks in lists:
        g = dist.new_group(ranks)
        if rank in ranks:
            mine = g
    return mine


# expert parallel over the cp pair, expert data parallel over dp (separate communicators from the mesh's)
ep_group = _groups([[d * args.cp + c for c in range(args.cp)] for d in range(args.dp)])
edp_group = _groups([[d * args.cp + c for d in range(args.dp)] for c in range(args.cp)])
ep_peer = dist.get_global_rank(ep_group, 1 - dist.get_group_rank(ep_group, rank))
cp_peer = dist.get_global_rank(cp_group, 1 - cp_rank)


def report_ready(step):
    path = os.environ.get("HANGSCOPE_READY_FILE")
    if not path:
        return
    line = json.dumps({"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "pid": os.getpid(),
                       "host": socket.gethostname(), "step": step, "where": "training"})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


# --- context-parallel attention -------------------------------------------------------------------------------

def exchange_kv(k, v):
    """Send this rank's K/V half to the cp peer, receive the peer's (ring step of ring attention)."""
    kv = torch.cat([k, v], dim=-1).contiguous()
    other = torch.empty_like(kv)
    ops = [dist.P2POp(dist.isend, kv, cp_peer, group=cp_group), dist.P2POp(dist.irecv, other, cp_peer, group=cp_group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return other.split(k.shape[-1], dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)

    def forward(self, x, mask):
        if not mask.any():  # a half that is all padding: nothing to attend from
            return torch.zeros_like(x)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        k2, v2 = exchange_kv(k.detach(), v.detach())
        keys = torch.cat([k, k2], dim=1) if cp_rank == 1 else torch.cat([k2, k], dim=1)
        vals = torch.cat([v, v2], dim=1) if cp_rank == 1 else torch.cat([v2, v], dim=1)
        att = torch.softmax(q @ keys.transpose(1, 2) / math.sqrt(DIM), dim=-1)
        return self.out(att @ vals)


# --- mixture of experts, expert parallel over the cp pair ---------------------------------------------------------

class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty(sum(out_splits), x.shape[1])
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=ep_group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty(sum(in_splits), grad.shape[1])
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ep_group)
        return back, None, None


class MoE(nn.Module):
    """Hash routing (token id mod EXPERTS); this rank hosts experts [first, first + local)."""

    def __init__(self):
        super().__init__()
        self.local = EXPERTS // args.cp
        self.first = dist.get_group_rank(ep_group, rank) * self.local
        self.experts = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(self.local))

    def owner(self, expert):
        return expert // self.local

    def forward(self, x, ids):
        flat, route = x.reshape(-1, DIM), (ids.reshape(-1) % EXPERTS)
        owners = route // self.local
        me = dist.get_group_rank(ep_group, rank)
        order = torch.argsort(owners, stable=True)
        send_counts = torch.bincount(owners, minlength=args.cp)
        if int(send_counts[1 - me]) == 0:  # every token stays here: no dispatch needed
            return self.local_experts(flat, route).reshape(x.shape)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=ep_group)
        out_splits, in_splits = recv_counts.tolist(), send_counts.tolist()
        tokens = _AllToAll.apply(flat[order], out_splits, in_splits)
        troute = torch.empty(sum(out_splits), dtype=route.dtype)
        dist.all_to_all_single(troute, route[order].contiguous(), out_splits, in_splits, group=ep_group)
        done = self.local_experts(tokens, troute)
        back = _AllToAll.apply(done, in_splits, out_splits)
        out = torch.empty_like(back)
        out[order] = back
        return out.reshape(x.shape)

    def local_experts(self, tokens, route):
        out = torch.zeros_like(tokens)
        for i, expert in enumerate(self.experts):
            sel = route == self.first + i
            if sel.any():
                out = out.index_put((sel.nonzero(as_tuple=True)[0],), expert(tokens[sel]))
        return out


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.attn = Attention()
        self.moe = MoE()
        self.head = nn.Linear(DIM, 1)

    def forward(self, ids, mask, weight=None):
        h = self.embed(ids)
        h = h + self.attn(h, mask)
        h = h + self.moe(h, ids)
        m = mask.unsqueeze(-1).float() * (weight.unsqueeze(-1) if weight is not None else 1.0)
        return self.head((h * m).sum(1) / m.sum(1).clamp(min=1)).squeeze(-1)


model = Model()
expert_list = list(model.moe.experts.parameters())
expert_params = set(expert_list)
for p in expert_list:  # experts start equal on every data-parallel replica
    dist.broadcast(p.data, src=dist.get_global_rank(edp_group, 0), group=edp_group)
fully_shard(model, mesh=mesh["dp"], ignored_params=expert_params)
for p in model.parameters():  # the dense weights start equal on both cp ranks
    if p not in expert_params:
        dist.broadcast(p.to_local(), src=dist.get_global_rank(cp_group, 0), group=cp_group)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
dense = [p for p in model.parameters() if p not in expert_params]


def sync_cp_grads():
    for p in dense:
        if p.grad is not None:
            dist.all_reduce(p.grad.to_local(), group=cp_group)
            p.grad.to_local().div_(args.cp)


def sync_expert_grads():
    for p in model.moe.experts.parameters():
        if p.grad is not None:  # an expert no token reached has no gradient
            dist.all_reduce(p.grad, group=edp_group)
            p.grad.div_(args.dp)


def clip_grad_norm(max_norm=1.0):
    return torch.nn.utils.clip_grad_norm_(dense, max_norm)


def save_checkpoint(path):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    torch.save(state, path)


def check_weights():
    """After a non-finite loss: gather the full weights and say which are broken."""
    model.unshard()
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    model.reshard()
    return bad


def batches():
    path = os.path.join(args.workdir, "data", f"shard{dp_rank}.jsonl")
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            ids = torch.tensor(rec["ids"])
            half = ids.shape[1] // args.cp
            ids = ids[:, cp_rank * half:(cp_rank + 1) * half]
            w = torch.tensor(rec["w"], dtype=torch.float)[:, cp_rank * half:(cp_rank + 1) * half] if "w" in rec \
                else torch.ones(ids.shape)
            yield ids, ids != PAD, w, torch.tensor(rec["y"], dtype=torch.float)


def micro_batches():
    """One step's micro-batches: one, or (accumulation) as many as the local token budget takes."""
    it = batches()
    while True:
        group, tokens = [], 0
        for ids, mask, w, y in it:
            group.append((ids, mask, w, y))
            tokens += int(mask.sum())
            if not args.accum_tokens or tokens >= args.accum_tokens:
                break
        if not group:
            return
        yield group


@torch.no_grad()
def evaluate():
    model.eval()
    ids = torch.randint(1, VOCAB, (4, 12))
    out = model(ids, ids != PAD)
    model.train()
    return float(out.mean())


def train_epoch(epoch, step):
    for group in micro_batches():
        losses = []
        for i, (ids, mask, w, y) in enumerate(group):
            ntok = torch.tensor([float(mask.sum())])
            dist.all_reduce(ntok)  # global token count of this micro-batch (loss normalisation)
            model.set_requires_gradient_sync(i == len(group) - 1)
            pred = model(ids, mask, w)
            loss = F.mse_loss(pred, y) * float(mask.sum()) * world / float(ntok)
            loss.backward()
            losses.append(float(loss.detach()))
        loss_val = sum(losses) / len(losses)
        if loss_val > args.spike_limit:  # a loss spike: drop this step's update
            print(f"[rank {rank}] step {step}: loss {loss_val:.1f} > {args.spike_limit}, skipping step", flush=True)
            optimizer.zero_grad()
            step += 1
            continue
        sync_cp_grads()
        sync_expert_grads()
        clip_grad_norm()
        optimizer.step()
        optimizer.zero_grad()
        if not math.isfinite(loss_val):
            print(f"[rank {rank}] step {step}: non-finite loss, checking weights: {check_weights()}", flush=True)
        if step == args.save_step and rank == 0:
            save_checkpoint(os.path.join(args.workdir, f"ckpt-{step}.pt"))
        if step == args.save_step:
            dist.barrier()
        if step == 2 and epoch == 0:
            report_ready(step)
        if rank == 0:
            print(f"step {step} loss {loss_val:.4f}", flush=True)
        step += 1
    return step


step = 0
for epoch in range(args.epochs):
    step = train_epoch(epoch, step)
    print(f"[rank {rank}] epoch {epoch} done, eval {evaluate():.4f}", flush=True)
dist.barrier()
dist.destroy_process_group()
