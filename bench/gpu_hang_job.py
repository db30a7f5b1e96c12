"""A small NCCL job that hangs one rank on purpose, for `make gpu-check` (bench/gpu_check.py): run under torchrun.

Every rank all_reduces a CUDA tensor over NCCL each step; at step HANG_STEP the last rank stops in Python
(time.sleep, forever) before its all_reduce, and the others wait for it inside NCCL: their all_reduce is enqueued
and the host thread blocks in torch.cuda.synchronize(). The Flight Recorder is on (TORCH_FR_BUFFER_SIZE, set by
the launcher) and every rank serves torch's debug handlers on its own unix socket (worker_main(), as
app/demo/job.py does), so hangscope reads each rank's record live; NCCL's RAS service runs in every NCCL process.

Modes (GPU_CHECK_MODE):
- nccl: the world's group is NCCL, rank r on GPU r % the GPUs there. Two ranks on one GPU (a one-GPU machine):
  NCCL refuses one communicator's ranks on the same device ("Duplicate GPU detected"), unless each rank says it
  is another host (NCCL_HOSTID, set per rank here): then they talk over NCCL's socket transport.
- shared: the world's group is gloo (the hang is there), and every rank also all_reduces over an NCCL group of
  its own (one rank: NCCL's work, record and RAS without two ranks on one device). The fallback when NCCL refuses.
- cpu: gloo on CPU tensors, no GPU: only to rehearse bench/gpu_check.py where no GPU is (--rehearse).

Hangs (GPU_CHECK_HANG), what the last rank (the culprit) does at HANG_STEP:
- sleep: it stops in Python (time.sleep, forever) before its all_reduce: the host-side culprit.
- kernel: its GPU runs a kernel that does not end (torch.cuda._sleep, ~days), queued before its all_reduce; its
  host then waits in torch.cuda.synchronize like every other rank's: only the GPU side tells it apart.
- cycle: it all_reduces over a group of two (rank 0 and itself, made by every rank at the start) where the
  others all_reduce over the world: rank 0 waits for it in the world's collective, and it waits for rank 0 in
  the pair's: a cycle.

Each rank appends "<rank> <pid> <what>" lines to GPU_CHECK_READY (one write each): "ready" when it has done its
first step, "hung" (the culprit) or "waiting" (the others) at the hang step.
"""

from __future__ import annotations

import os
import sys
import time

MODE = os.environ.get("GPU_CHECK_MODE", "nccl")
HANG_STEP = int(os.environ.get("GPU_CHECK_HANG_STEP", "3"))
HANG = os.environ.get("GPU_CHECK_HANG", "sleep")
SOCKETS = os.environ.get("GPU_CHECK_SOCKETS", "")  # a folder for the ranks' worker-server sockets


def own_environment() -> None:
    """torchrun gives every rank the same environment, and tools read a rank's from /proc/PID/environ: each rank
    re-executes itself once with its own worker-server socket (and NCCL host id) before torch is loaded."""
    rank = os.environ.get("RANK", "0")
    want = {}
    if SOCKETS:
        want["TORCH_WORKER_SERVER_SOCKET"] = os.path.join(SOCKETS, f"rank{rank}.sock")
    if MODE == "nccl" and os.environ.get("GPU_CHECK_SHARE_GPU") == "1":
        want["NCCL_HOSTID"] = f"gpu-check-{rank}"  # one GPU, two ranks: each says it is a host of its own
    if all(os.environ.get(k) == v for k, v in want.items()):
        return
    argv0 = list(getattr(sys, "orig_argv", [])) or [sys.executable, *sys.argv]
    os.execve(sys.executable, [sys.executable, *argv0[1:]], dict(os.environ, **want))


def say(what: str) -> None:
    path = os.environ.get("GPU_CHECK_READY")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.environ.get('RANK', '?')} {os.getpid()} {what}\n".encode())
        finally:
            os.close(fd)


def main() -> int:
    own_environment()
    from contextlib import nullcontext
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = MODE != "cpu"
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    timeout = timedelta(minutes=30)  # long: the hang stays while it is investigated
    if MODE == "cpu":
        dist.init_process_group("gloo", timeout=timeout)
        group, own = None, None
    elif MODE == "nccl":
        try:  # bound to its device: the communicator is made now (torch >= 2.3), not at the first collective
            dist.init_process_group("nccl", timeout=timeout, device_id=device)
        except TypeError:
            dist.init_process_group("nccl", timeout=timeout)
        group, own = None, None
    else:
        dist.init_process_group("gloo", timeout=timeout)
        singles = [dist.new_group([r], backend="nccl", timeout=timeout) for r in range(world)]  # every rank makes all
        group, own = None, singles[rank]
    serve = nullcontext()
    if SOCKETS:
        from torch.distributed.elastic.control_plane import worker_main

        serve = worker_main()
    culprit = world - 1
    pair = dist.new_group([0, culprit], timeout=timeout) if HANG == "cycle" and own is None else None
    with serve:
        x = torch.ones(1 << 20, device=device)
        for step in range(1, 1_000_000):
            if own is not None:  # shared: NCCL work on the rank's own group, then the world's (gloo) collective
                dist.all_reduce(x, group=own)
                sync()
                y = x.cpu()
            else:
                y = x
            if step == HANG_STEP:
                if rank == culprit:
                    say("hung")
                    if HANG == "kernel" and cuda:
                        torch.cuda._sleep(1 << 50)  # the rank's GPU never finishes this kernel
                    elif HANG == "cycle" and pair is not None:
                        dist.all_reduce(y, group=pair)  # the wrong group: rank 0 is in the world's all_reduce
                        sync()
                    else:
                        while True:  # the rank out of step: it never reaches this step's all_reduce
                            time.sleep(3600)
                else:
                    say("waiting")
            dist.all_reduce(y, group=group)
            sync()  # NCCL: the host waits here for the all_reduce the culprit never joins
            if step == 1:
                say("ready")
            x.div_(world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
