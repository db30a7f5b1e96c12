"""A DDP-tutorial-style job started by torch.multiprocessing.spawn: no RANK/LOCAL_RANK/WORLD_SIZE in any rank's
/proc/PID/environ, MASTER_ADDR/MASTER_PORT set in os.environ after exec, the rank an argument of the spawn
target. The last rank never reaches the second all_reduce, so the others hang in it (the tests' culprit).

    python spawn_job.py WORLD_SIZE MASTER_PORT READY_FILE [CULPRIT]    # CULPRIT: the rank that stops (the last)
Each rank appends {"rank", "pid"} to READY_FILE once its process group works.
"""

import json
import os
import sys
import threading

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def demo_basic(rank: int, world_size: int, port: int, ready: str, culprit: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.ones(4)
    dist.all_reduce(t)
    with open(ready, "a") as f:
        f.write(json.dumps({"rank": rank, "pid": os.getpid()}) + "\n")
    if rank == culprit:
        threading.Event().wait()  # the culprit: never reaches the next collective
    dist.all_reduce(t)


if __name__ == "__main__":
    world, port, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    culprit = int(sys.argv[4]) if len(sys.argv) > 4 else world - 1
    mp.spawn(demo_basic, args=(world, port, ready, culprit), nprocs=world, join=True)
