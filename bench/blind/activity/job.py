"""A small data-parallel gloo job (torchrun, CPU) with the background activity real training jobs carry.

Run by bench/blind/activity/run.py, 4 nodes x 2 ranks. One script, switched by flags:

  hung jobs (--culprit R --hang-step K): at step K rank R blocks for good before the gradient all_reduce
      (--block queue: its batch producer thread died of a corrupt record and the main thread waits in
      queue.Queue.get(); child: it reads the output of a helper process that never answers; printwait: it loops
      waiting for a marker file that never appears, printing a "waiting" line every 0.5 s); the other ranks wait
      in that all_reduce (--wait block: the blocking call; poll_sleep / poll_spin: async_op=True and a Python loop
      on work.is_completed(), with or without a 10 ms sleep).
  progressing jobs (no --culprit): --step-sleep, --compute-seconds, --grad-mb, --checkpoint-mb, --slow-rank shape
      the step; it keeps training.

  activity, in every rank, in both kinds: --heartbeat (a keepalive thread exchanging small messages with its ring
  neighbours over its own TCP connections), --logger S (a thread printing a "still alive" line every S seconds),
  --metrics-file S (a thread appending a JSON line to a file every S seconds), --ema (a thread that keeps
  updating an EMA of the weights), --prefetch-spin (a prefetch thread spinning on queue.get(timeout=0.05)),
  --status-port P (a small HTTP status endpoint on port P + local rank).

For the harness (never read by the training logic): with env HANGSCOPE_READY_FILE every rank appends one JSON
line at the start of step --ready-step (the format tests/support/jobs.py reads); WORKDIR/entered.jsonl gets a
line when a rank enters the all_reduce of the hang step, or when the culprit enters its blocking call;
rank 0 appends `step N time` to WORKDIR/steps.log after each completed step.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

BATCH = 8


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _ready(step: int) -> None:
    path = os.environ.get("HANGSCOPE_READY_FILE")
    if path:
        _append(path, json.dumps({"rank": dist.get_rank(), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                                  "pid": os.getpid(), "host": socket.gethostname(), "step": step,
                                  "where": "step"}))


class State:
    """What the background threads read: the step, the last loss, when the step started."""

    def __init__(self) -> None:
        self.step = 0
        self.loss = 0.0
        self.step_started = time.time()
        self.started = time.time()


# --- background activity --------------------------------------------------------------------------------------

def my_ip() -> str:
    """The address the other nodes reach this one at (the route to the rendezvous host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((os.environ["MASTER_ADDR"], 9))
        return s.getsockname()[0]


class Heartbeat:
    """A keepalive: each rank sends `HB rank step time` to the next rank every 0.25 s over its own TCP connection and
    answers the previous rank's with `ACK rank` (like an elastic agent's or a comms library's RAS keepalive)."""

    def __init__(self, rank: int, world: int, state: State) -> None:
        self.rank, self.world, self.state = rank, world, state
        self.server = socket.create_server(("0.0.0.0", 0))
        addrs: List[Any] = [None] * world
        dist.all_gather_object(addrs, (my_ip(), self.server.getsockname()[1]))
        self.next_addr = addrs[(rank + 1) % world]

    def start(self) -> None:
        threading.Thread(target=self._answer, name="keepalive-rx", daemon=True).start()
        threading.Thread(target=self._send, name="keepalive-tx", daemon=True).start()

    def _answer(self) -> None:
        conn, _ = self.server.accept()
        f = conn.makefile("rb")
        while True:
            line = f.readline()
            if not line:
                return
            conn.sendall(f"ACK {self.rank}\n".encode())

    def _send(self) -> None:
        conn = socket.create_connection(tuple(self.next_addr), timeout=30)
        f = conn.makefile("rb")
        while True:
            conn.sendall(f"HB {self.rank} {self.state.step} {time.time():.3f}\n".encode())
            f.readline()
            time.sleep(0.25)


def logger(rank: int, state: State, every: float) -> None:
    while True:
        time.sleep(every)
        print(f"[rank {rank}] still alive: step {state.step}, {time.time() - state.step_started:.1f}s in this step, "
              f"{time.time() - state.started:.0f}s total", flush=True)


def metrics_writer(rank: int, state: State, path: str, every: float) -> None:
    with open(path, "a") as f:
        while True:
            time.sleep(every)
            f.write(json.dumps({"rank": rank, "step": state.step, "loss": state.loss, "t": round(time.time(), 3),
                                "maxrss_kb": _maxrss()}) + "\n")
            f.flush()


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def ema_loop(model: nn.Module, lock: threading.Lock) -> None:
    """EMA of the weights, kept on the CPU by a thread of its own; it recomputes continually (a little each 20 ms)."""
    shadow = [p.detach().clone() for p in model.parameters()]
    scratch = torch.randn(128, 128)
    while True:
        with lock:
            for s, p in zip(shadow, model.parameters()):
                s.mul_(0.999).add_(p.detach(), alpha=0.001)
        scratch = torch.tanh(scratch @ scratch.T * 0.01)  # the smoothing's own statistics
        time.sleep(0.02)


def prefetch_loop(requests: "queue.Queue[int]", out: "queue.Queue[Tuple[torch.Tensor, torch.Tensor]]",
                  rank: int) -> None:
    """A prefetcher that spins on its request queue with a short timeout (to notice a stop flag)."""
    stop = False
    while not stop:
        try:
            step = requests.get(timeout=0.05)
        except queue.Empty:
            continue
        out.put(synthetic_batch(rank, step))


def status_server(port: int, rank: int, state: State) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"rank": rank, "step": state.step, "loss": state.loss,
                               "since_step": round(time.time() - state.step_started, 3)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


# --- data -----------------------------------------------------------------------------------------------------

def synthetic_batch(rank: int, step: int, features: int = 16) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rank * 100003 + step)
    x = torch.randn(BATCH, features, generator=gen)
    return x, x.sum(dim=1, keepdim=True) * 0.1


class CorruptRecord(Exception):
    pass


class ProducerLoader:
    """Batches made ahead by a producer thread into a queue; a corrupt record kills the producer (the exception is
    printed to stderr by the thread machinery), and the consumer waits in queue.get() for ever."""

    def __init__(self, rank: int, bad_step: int, features: int) -> None:
        self.q: "queue.Queue[Tuple[torch.Tensor, torch.Tensor]]" = queue.Queue(maxsize=2)
        self.rank, self.bad_step, self.features = rank, bad_step, features
        threading.Thread(target=self._produce, name="batch-producer", daemon=True).start()

    def _produce(self) -> None:
        step = 0
        while True:
            if step == self.bad_step:
                raise CorruptRecord(f"record {step} of rank {self.rank}: bad length")
            self.q.put(synthetic_batch(self.rank, step, self.features))
            step += 1

    def get(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.q.get()


# --- the job --------------------------------------------------------------------------------------------------

def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--ready-step", type=int, default=3)
    p.add_argument("--culprit", type=int, default=-1)
    p.add_argument("--hang-step", type=int, default=3)
    p.add_argument("--block", choices=("queue", "child", "printwait"), default="queue")
    p.add_argument("--wait", choices=("block", "poll_sleep", "poll_spin"), default="block")
    p.add_argument("--heartbeat", action="store_true")
    p.add_argument("--logger", type=float, default=0.0)
    p.add_argument("--metrics-file", type=float, default=0.0)
    p.add_argument("--ema", action="store_true")
    p.add_argument("--prefetch-spin", action="store_true")
    p.add_argument("--status-port", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--compute-seconds", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank computes --compute-seconds, the others 0.1 s")
    p.add_argument("--grad-mb", type=float, default=0.0, help="a model whose gradients are this many MB")
    p.add_argument("--checkpoint-mb", type=int, default=0, help="rank 0 writes a checkpoint this big every step")
    p.add_argument("--print-steps", action="store_true")
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    dist.init_process_group("gloo", timeout=timedelta(hours=2))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.manual_seed(0)
    features = 16
    if args.grad_mb:
        features = max(16, int((args.grad_mb * 1024 * 1024 / 4) ** 0.5))
        model: nn.Module = nn.Sequential(nn.Linear(features, features), nn.ReLU(), nn.Linear(features, 1))
    else:
        model = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = State()
    weights_lock = threading.Lock()
    entered = os.path.join(args.workdir, "entered.jsonl")
    culprit = rank == args.culprit

    if args.heartbeat:
        Heartbeat(rank, world, state).start()
    if args.logger:
        threading.Thread(target=logger, args=(rank, state, args.logger), name="alive-logger", daemon=True).start()
    if args.metrics_file:
        os.makedirs(os.path.join(args.workdir, "metrics"), exist_ok=True)
        path = os.path.join(args.workdir, "metrics", f"rank{rank}.jsonl")
        threading.Thread(target=metrics_writer, args=(rank, state, path, args.metrics_file), name="metrics",
                         daemon=True).start()
    if args.ema:
        threading.Thread(target=ema_loop, args=(model, weights_lock), name="ema", daemon=True).start()
    requests: "queue.Queue[int]" = queue.Queue()
    prefetched: "queue.Queue[Tuple[torch.Tensor, torch.Tensor]]" = queue.Queue()
    if args.prefetch_spin:
        threading.Thread(target=prefetch_loop, args=(requests, prefetched, rank), name="prefetch",
                         daemon=True).start()
        requests.put(0)
    if args.status_port:
        threading.Thread(target=status_server, args=(args.status_port + local_rank, rank, state), name="status",
                         daemon=True).start()
    loader = ProducerLoader(rank, args.hang_step, features) if culprit and args.block == "queue" else None

    for step in range(args.steps):
        state.step, state.step_started = step, time.time()
        if step == args.ready_step:
            _ready(step)
        hang_now = args.culprit >= 0 and step == args.hang_step
        # the batch
        if loader is not None:
            if hang_now:
                _append(entered, json.dumps({"rank": rank, "step": step, "in": "queue.get"}))
            inputs, targets = loader.get()
        elif args.prefetch_spin:
            inputs, targets = prefetched.get()
            requests.put(step + 1)
        else:
            inputs, targets = synthetic_batch(rank, step, features)
        if culprit and hang_now and args.block == "child":
            # a tokenizer helper asked for the vocabulary of this shard; it never answers
            helper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(3600)"],
                                      stdout=subprocess.PIPE)
            _append(entered, json.dumps({"rank": rank, "step": step, "in": "read from helper"}))
            helper.stdout.readline()  # type: ignore[union-attr]
        if culprit and hang_now and args.block == "printwait":
            marker = os.path.join(args.workdir, "shards", f"rank{rank}.done")
            _append(entered, json.dumps({"rank": rank, "step": step, "in": "wait for marker"}))
            waited = time.time()
            while not os.path.exists(marker):
                print(f"[rank {rank}] waiting for {marker} ({time.time() - waited:.1f}s)", flush=True)
                time.sleep(0.5)
        # forward, backward, compute
        opt.zero_grad()
        loss = F.mse_loss(model(inputs), targets)
        loss.backward()
        seconds = args.compute_seconds
        if args.slow_rank >= 0:
            seconds = args.compute_seconds if rank == args.slow_rank else 0.1
        if seconds:
            a = torch.randn(256, 256)
            until = time.monotonic() + seconds
            while time.monotonic() < until:  # the rest of the model's forward and backward, on the CPU
                a = torch.tanh(a @ a * 0.01)
        # the gradients
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if hang_now:
            _append(entered, json.dumps({"rank": rank, "step": step, "in": "all_reduce"}))
        if args.wait == "block":
            dist.all_reduce(flat)
        else:
            work = dist.all_reduce(flat, async_op=True)
            if args.wait == "poll_sleep":
                while not work.is_completed():
                    time.sleep(0.01)
            else:
                while not work.is_completed():
                    pass
            work.wait()
        flat /= world
        offset = 0
        with weights_lock:
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            opt.step()
        state.loss = float(loss)
        if args.checkpoint_mb and rank == 0:
            path = os.path.join(args.workdir, "ckpt.pt")
            blob = torch.zeros(args.checkpoint_mb * 1024 * 256)  # float32: 1 MB per 256 Ki
            with open(path + ".tmp", "wb") as f:
                torch.save({"step": step, "model": model.state_dict(), "optimizer_state": blob}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
        if rank == 0:
            _append(os.path.join(args.workdir, "steps.log"), f"{step} {time.time():.3f}")
            if args.print_steps:
                print(f"step {step} loss {state.loss:.5f}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
