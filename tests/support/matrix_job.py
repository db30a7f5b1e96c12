"""One small gloo job (2 ranks) that hangs, started by whichever launcher the test names (tests/
live/test_cluster_launchers.py): rank 1 never reaches the second all_reduce, so rank 0 waits in it.

    python matrix_job.py rank READY [PORT]              under torchrun / torch.distributed.run / accelerate /
                                                        mpirun: the rank from RANK or OMPI_COMM_WORLD_RANK
    python matrix_job.py multiprocessing READY PORT     forks 2 ranks with multiprocessing.Process(target=run,
                                                        args=(rank, 2, ...)): no rank in any environment
    python matrix_job.py subprocess READY PORT          starts 2 ranks as `python matrix_job.py child READY PORT
                                                        --rank N`: no rank environment, the rank an argument
Each rank appends {"rank", "pid", "mode"} to READY once its process group works (pid as it sees itself).
MASTER_ADDR/MASTER_PORT are set inside Python where the launcher does not give them, so /proc/PID/environ of
those ranks has no store address either.
"""

import json
import multiprocessing
import os
import subprocess
import sys
import threading


def run(rank, world_size, port, ready, mode):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if port:
        os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.ones(4)
    dist.all_reduce(t)
    fd = os.open(ready, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (json.dumps({"rank": rank, "pid": os.getpid(), "mode": mode}) + "\n").encode())
    os.close(fd)
    if rank == world_size - 1:
        threading.Event().wait()  # never reaches the next collective
    dist.all_reduce(t)


def main():
    sys.argv[1:] = [a for a in sys.argv[1:] if not a.startswith("--local_rank=")]  # deepspeed puts it first
    mode, ready = sys.argv[1], sys.argv[2]
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if mode == "rank":
        env = os.environ
        rank = int(env.get("RANK", env.get("OMPI_COMM_WORLD_RANK", "-1")))
        world = int(env.get("WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", "0")))
        run(rank, world, port, ready, env.get("MATRIX_MODE", "rank"))
    elif mode == "multiprocessing":
        import torch  # noqa: F401  (the parent has torch loaded, as a real launcher script does)

        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=run, args=(rank, 2, port, ready, mode)) for rank in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    elif mode == "subprocess":
        procs = [subprocess.Popen([sys.executable, __file__, "child", ready, str(port), "--rank", str(rank)])
                 for rank in range(2)]
        for p in procs:
            p.wait()
    elif mode == "child":
        run(int(sys.argv[5]), 2, port, ready, "subprocess")


if __name__ == "__main__":
    main()
