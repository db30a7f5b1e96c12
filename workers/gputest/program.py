"""The GPU test program: one process per GPU (or one per CPU-only node), launched by torch.distributed.run.

Runs under the *job's* Python (the one with torch), passed as `python -c <this source>`: it never touches the
node's disk and imports nothing from hangscope (the worker package lives only in the worker's memory). It
reads its settings from the environment (HANGSCOPE_GPUTEST_CONFIG, JSON) and reports every step as one line
`HANGSCOPE-GPUTEST {json}` on stdout, so the login side can tell a rank that cannot reach the rendezvous
store from one that waits for others, or one stuck in an all_reduce.

Steps (sanity, as the source guide's torch-distributed-gpu-test.py): join a TCPStore at the master, agree
on the backend (nccl only when every rank sees a GPU, unless forced), allocate memory on the GPU, then an
all_reduce of ones (the sum must equal the world size) and a barrier. Bench mode then times all_reduce over
a sweep of sizes with warm-up, as nccl-tests does (the login side computes algbw/busbw from the times).

The cross-node world is formed here rather than by torchrun's own multi-node rendezvous: torchrun runs
`--standalone` on each node (local ranks, log files), and this program joins the global world through its
own store, so that a node that cannot reach the master is *named* (its rank stays in `store_connect` while
the others report it missing) instead of every launcher silently waiting in an opaque rendezvous.

Safety: the process dies with its launcher (PR_SET_PDEATHSIG) and refuses to run when its parent is not
the launcher of this test; faulthandler prints where it hangs on SIGUSR1 (sent before hangscope kills a
stuck test) and kills it at a hard watchdog deadline even if nobody is left to do so.
"""

import faulthandler
import json
import os
import signal
import socket
import sys
import time
import traceback

MARK = "HANGSCOPE-GPUTEST "
MARK_ENV = "HANGSCOPE_GPUTEST"
CONFIG_ENV = "HANGSCOPE_GPUTEST_CONFIG"
WAIT_REPORT_S = 2.0  # how often a rank waiting for others says who is missing
_T0 = time.monotonic()
_STATE: dict = {"rank": None, "local_rank": None, "phase": "start"}


def emit(event, **fields):
    """One event line; flushed at once (the launcher tails it while the rank may hang next)."""
    msg = {"event": event, "rank": _STATE["rank"], "local_rank": _STATE["local_rank"],
           "t": round(time.monotonic() - _T0, 4)}
    msg.update(fields)
    sys.stdout.write(MARK + json.dumps(msg, sort_keys=True) + "\n")
    sys.stdout.flush()


def phase(name, **fields):
    _STATE["phase"] = name
    emit("phase", phase=name, **fields)


def stay_with_launcher():
    """Die with the parent (torchrun); exit now if the parent is not this test's launcher (orphaned)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (ImportError, OSError, AttributeError):
        pass
    mark = (MARK_ENV + "=" + os.environ.get(MARK_ENV, "")).encode()
    try:
        with open("/proc/%d/environ" % os.getppid(), "rb") as f:
            parent_env = f.read().split(b"\0")
    except OSError:
        parent_env = []
    if mark not in parent_env:
        sys.stderr.write("hangscope gputest: the launcher is gone; exiting\n")
        os._exit(3)


def join_world(dist, cfg, rank, world, has_cuda, timedelta):
    """Connect to the master's store, register, and wait until every rank has; returns (store, cuda ranks)."""
    phase("store_connect", master="%s:%s" % (cfg["master_addr"], cfg["master_port"]))
    store = dist.TCPStore(host_name=cfg["master_addr"], port=int(cfg["master_port"]), world_size=world,
                          is_master=(rank == 0), timeout=timedelta(seconds=float(cfg["join_timeout"])),
                          wait_for_workers=False)
    phase("join")
    store.set("hs/joined/%d" % rank, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    store.add("hs/cuda", 1 if has_cuda else 0)
    if store.add("hs/count", 1) == world:
        store.set("hs/all", "1")
    deadline = time.monotonic() + float(cfg["join_timeout"])
    while True:
        try:
            store.wait(["hs/all"], timedelta(seconds=WAIT_REPORT_S))
            break
        except Exception as exc:  # a wait timeout: say who is missing, then wait again
            if "timeout" not in str(exc).lower() and "timed out" not in str(exc).lower():
                raise
            joined = store.add("hs/count", 0)
            missing = []
            if rank == 0:
                missing = [r for r in range(world) if not store.check(["hs/joined/%d" % r])][:64]
            emit("waiting", joined=joined, missing=missing)
            if time.monotonic() > deadline:
                raise RuntimeError("only %d of %d ranks reached the rendezvous store within %ss"
                                   % (joined, world, cfg["join_timeout"]))
    return store, store.add("hs/cuda", 0)


def choose_backend(cfg, cuda_ranks, world, has_cuda):
    forced = cfg.get("backend") or "auto"
    if forced == "auto":
        if cuda_ranks == world:
            return "nccl", ""
        note = "some ranks see no GPU: using gloo" if cuda_ranks else ""
        return "gloo", note
    if forced == "nccl" and not has_cuda:
        raise RuntimeError("backend nccl was forced but this rank sees no CUDA device")
    return forced, ""


def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(cfg):
    rank = int(cfg["rank_offset"]) + int(os.environ["LOCAL_RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(cfg["world_size"])
    _STATE["rank"], _STATE["local_rank"] = rank, local_rank
    emit("start", pid=os.getpid(), host=socket.gethostname(), python=sys.version.split()[0],
         cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    phase("import")
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    has_cuda = bool(torch.cuda.is_available() and torch.cuda.device_count() > local_rank)
    nccl_version = None
    if has_cuda:
        try:
            nccl_version = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            nccl_version = None
    emit("imported", torch=torch.__version__, cuda=has_cuda,
         devices=torch.cuda.device_count() if torch.cuda.is_available() else 0,
         cuda_version=torch.version.cuda, nccl_version=nccl_version)

    store, cuda_ranks = join_world(dist, cfg, rank, world, has_cuda, timedelta)
    backend, note = choose_backend(cfg, cuda_ranks, world, has_cuda)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    emit("backend", backend=backend, device=str(device), gpu_name=gpu_name, note=note)

    phase("alloc", mib=int(cfg.get("alloc_mib", 64)))
    buf = torch.empty(int(cfg.get("alloc_mib", 64)) * (1 << 18), dtype=torch.float32, device=device)
    buf.fill_(1.0)
    sync(torch, device)
    free_total = list(torch.cuda.mem_get_info(device)) if device.type == "cuda" else None
    del buf

    phase("init_pg", backend=backend)
    dist.init_process_group(backend, store=dist.PrefixStore("hs/pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(cfg["pg_timeout"])))
    barrier_args = {"device_ids": [local_rank]} if backend == "nccl" else {}

    phase("all_reduce")
    t = torch.ones(1, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    sync(torch, device)
    value = float(t.item())
    phase("barrier")
    dist.barrier(**barrier_args)
    ok = value == float(world)
    emit("result", ok=ok, value=value, expected=world, mem_free_total=free_total,
         error="" if ok else "all_reduce sum is %g, expected %d" % (value, world))
    sys.stdout.write("is %s (global rank: %d/%d)\n" % ("OK" if ok else "broken", rank, world))

    if cfg.get("mode") == "bench" and ok:
        bench(torch, dist, cfg, device, world, rank, barrier_args)
    phase("destroy")
    dist.barrier(**barrier_args)
    dist.destroy_process_group()
    emit("done")
    return 0 if ok else 1


def bench(torch, dist, cfg, device, world, rank, barrier_args):
    """all_reduce timing per size, nccl-tests style: average time per iteration, averaged over ranks."""
    warmup, iters = int(cfg.get("warmup", 5)), max(1, int(cfg.get("iters", 20)))
    for size in cfg.get("sizes") or []:
        count = max(1, int(size) // 4)
        phase("bench", size=count * 4)
        x = torch.zeros(count, dtype=torch.float32, device=device)  # zeros: repeated sums never overflow
        for _ in range(warmup):
            dist.all_reduce(x)
        sync(torch, device)
        dist.barrier(**barrier_args)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync(torch, device)
        elapsed = (time.perf_counter() - start) / iters
        total = torch.tensor([elapsed], dtype=torch.float64, device=device)
        slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            emit("bench", size=count * 4, count=count, dtype="float32", iters=iters, warmup=warmup,
                 time_avg=float(total.item()) / world, time_max=float(slowest.item()))
        del x


def main():
    stay_with_launcher()
    cfg = json.loads(os.environ[CONFIG_ENV])
    # A C-level watchdog: needs no GIL, so it fires even inside a collective that never returns.
    faulthandler.dump_traceback_later(float(cfg.get("watchdog", 600)), exit=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        code = run(cfg)
    except Exception as exc:
        text = ("%s: %s" % (type(exc).__name__, exc)).strip()
        emit("result", ok=False, error=text[:2000], phase=_STATE["phase"])
        sys.stdout.write("is broken: %s\n" % text.splitlines()[0][:300] if text else "is broken\n")
        sys.stdout.flush()
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    faulthandler.cancel_dump_traceback_later()
    os._exit(code)  # skip interpreter teardown: a broken CUDA context can hang at exit


if __name__ == "__main__":
    main()
