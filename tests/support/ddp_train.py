"""A DDP training job for the progress tests, shaped like nanoGPT's train.py (our stand-in, not nanoGPT).

nanoGPT's own train.py runs too, unmodified, through a config file of its own format (tests/oss/README.md,
tests/live/test_oss_cluster.py); this stand-in writes ready lines and takes flags the progress tests vary. What
matters to hangscope is kept from nanoGPT: DDP (gloo here) whose gradient all_reduce runs inside
`loss.backward()`, gradient accumulation that syncs only on the last micro step, and the training loop at module
level (`while True:`) with its counters (`iter_num`) as module globals, which py-spy's --locals does not show.
Runs under torchrun: `torchrun ... tests/support/ddp_train.py [--accum N] [--batch N] [--width N] [--step-delay S]`.
With env HANGSCOPE_READY_FILE set, each rank appends its ready line (like app/demo/job.py) after a few steps.
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--accum", type=int, default=4, help="micro steps per optimizer step")
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--width", type=int, default=192)
parser.add_argument("--log-interval", type=int, default=10)
parser.add_argument("--max-iters", type=int, default=10**9)
parser.add_argument("--step-delay", type=float, default=0.0,
                    help="seconds each rank sleeps after an optimizer step (a job that trains on a small share of "
                         "the CPU, as one waiting on its input pipeline does; 0: as fast as it can)")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1337 + rank)
torch.set_num_threads(1)
model = DDP(torch.nn.Sequential(torch.nn.Linear(args.width, args.width * 4), torch.nn.GELU(),
                                torch.nn.Linear(args.width * 4, args.width * 4), torch.nn.GELU(),
                                torch.nn.Linear(args.width * 4, args.width)))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def report_ready(step):
    path = os.environ.get("HANGSCOPE_READY_FILE")
    if not path:
        return
    line = json.dumps({"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "pid": os.getpid(),
                       "host": socket.gethostname(), "step": step, "where": "training"})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


iter_num = 0
t0 = time.time()
while True:
    for micro_step in range(args.accum):
        # as nanoGPT does: the gradient all_reduce runs only in the last micro step's backward
        model.require_backward_grad_sync = micro_step == args.accum - 1
        x = torch.randn(args.batch, args.width)
        loss = (model(x) - x).pow(2).mean() / args.accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if args.step_delay:
        time.sleep(args.step_delay)
    if iter_num % args.log_interval == 0 and rank == 0:
        t1 = time.time()
        print(f"iter {iter_num}: loss {loss.item() * args.accum:.4f}, {args.log_interval / (t1 - t0):.1f} it/s",
              flush=True)
        t0 = t1
    if iter_num == 5:
        report_ready(iter_num)
    if iter_num >= args.max_iters:
        break
dist.destroy_process_group()
