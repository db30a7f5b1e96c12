"""A job whose ranks read their batches through torch's DataLoader with worker processes (num_workers=2, fork),
run under torchrun. At step K (--hang-step) the culprit's workers never return a batch (its dataset's
__getitem__ blocks for good from that batch on): the culprit rank waits in the DataLoader's result queue while
the other ranks wait for it in that step's all_reduce. Every rank thus has two child processes that inherit its
RANK environment: hangscope must find the ranks, not ranks plus workers, and show the workers under their rank.

    torchrun ... tests/support/loader_job.py --hang-step K --culprit R
With env HANGSCOPE_READY_FILE set, each rank appends its ready line (like app/demo/job.py) just before the call
it hangs in, with "workers": the pids of its DataLoader workers.
"""

import argparse
import json
import os
import socket
import threading

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--hang-step", type=int, default=3)
parser.add_argument("--culprit", type=int, default=-1)
parser.add_argument("--batch", type=int, default=4)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
culprit = args.culprit if args.culprit >= 0 else world - 1
torch.set_num_threads(1)


class Samples(Dataset):
    def __init__(self, stall_from):
        self.stall_from = stall_from

    def __len__(self):
        return 10 ** 6

    def __getitem__(self, index):
        if self.stall_from is not None and index >= self.stall_from:
            threading.Event().wait()  # the storage read that never completes
        return torch.full((8,), float(index))


def report_ready(step, where, workers):
    path = os.environ.get("HANGSCOPE_READY_FILE")
    if not path:
        return
    line = json.dumps({"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "pid": os.getpid(),
                       "host": socket.gethostname(), "step": step, "where": where, "workers": workers})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


stall = args.hang_step * args.batch if rank == culprit else None
loader = DataLoader(Samples(stall), batch_size=args.batch, num_workers=2, multiprocessing_context="fork",
                    prefetch_factor=1)
batches = iter(loader)
workers = sorted(w.pid for w in batches._workers)
step = 0
while True:
    if step == args.hang_step:
        report_ready(step, "data_loading" if rank == culprit else "all_reduce", workers)
    batch = next(batches)
    total = batch.sum().reshape(1)
    dist.all_reduce(total)
    step += 1
