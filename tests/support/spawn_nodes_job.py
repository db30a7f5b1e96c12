"""torch.multiprocessing.spawn across nodes, the shape of PyTorch's ImageNet example: one launcher per node, and
the spawn target `main_worker(gpu, ngpus_per_node, args)` computes its global rank as node_rank * ngpus_per_node
+ gpu, so no argument is the rank and the spawn index is only the local rank. No rank has RANK/LOCAL_RANK/
WORLD_SIZE in its environment; the process group is set up with init_method tcp://MASTER:PORT. The last rank never
reaches the second all_reduce, so the others hang in it. Each rank writes its stderr to a file of its own
(READY_FILE.rank<N>.err, as torchrun's --log-dir does), and the last one, before it stops, prints an error it
caught (a traceback holding a token: what a user's log may hold).

    python spawn_nodes_job.py NODES NODE_RANK PER_NODE MASTER_ADDR MASTER_PORT READY_FILE
Each rank appends {"rank", "pid", "local"} to READY_FILE once its process group works.
"""

import argparse
import json
import os
import sys
import threading
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


SECRET = "hf_" + "SpawnNodesJobToken" * 2  # never to leave the node (workers/redact.py)


def main_worker(gpu: int, ngpus_per_node: int, args: argparse.Namespace) -> None:
    args.rank = args.node_rank * ngpus_per_node + gpu
    world = args.nodes * ngpus_per_node
    err = os.open(f"{args.ready}.rank{args.rank}.err", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(err, 2)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}", rank=args.rank,
                            world_size=world)
    t = torch.ones(4)
    dist.all_reduce(t)
    with open(args.ready, "a") as f:
        f.write(json.dumps({"rank": args.rank, "pid": os.getpid(), "local": gpu}) + "\n")
    if args.rank == world - 1:
        try:
            raise RuntimeError(f"shard 7 of the dataset is missing (HF_TOKEN={SECRET})")
        except RuntimeError:
            traceback.print_exc()  # caught, logged, and then the rank waits for data that never comes
        sys.stderr.flush()
        threading.Event().wait()  # the culprit: never reaches the next collective
    dist.all_reduce(t)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for name in ("nodes", "node_rank", "per_node"):
        p.add_argument(name, type=int)
    p.add_argument("master")
    p.add_argument("port", type=int)
    p.add_argument("ready")
    a = p.parse_args()
    mp.spawn(main_worker, args=(a.per_node, a), nprocs=a.per_node, join=True)
