"""The demo training job: torch.distributed (gloo, CPU) that hangs in a chosen, realistic way.

Run under torchrun (`python -m torch.distributed.run ... app/demo/job.py --scenario S`); used by
`hangscope demo` and by the test suite's hung jobs. Scenarios (the culprit defaults to the last rank):
  dataloader  at step K the culprit blocks reading its next batch (a socket read that never returns) while
              the other ranks block in that step's all_reduce
  skip        at step K the culprit's batch gives a non-finite loss and it skips the step; the all_reduce
              alternates between two process groups, so it cannot silently pair with the wrong step: every
              rank ends up on the same line, the culprit at step K+1 and the others at step K
  die         the culprit exits (os._exit) at step K; the others wait in that step's all_reduce. With NCCL
              that is what peers of a dead rank do; gloo would notice the closed connections and fail, so
              the dying rank leaves its TCP sockets open in a small child (as a subprocess that inherited
              them does) and exits with status 0, so torchrun does not tear the others down either
  healthy     trains forever, slowly (a short pause per step keeps the CPU free)
  netcut      trains like healthy; a test cuts a node's network and every rank then waits in all_reduce
  lock        every rank logs its metrics under a lock that its checkpoint-writer thread also takes; at step K
              the culprit asks for a checkpoint, whose upload never completes: the writer keeps the lock, and
              the culprit's main thread blocks on it while the others wait in that step's all_reduce
  deadlock    at step K the culprit's main thread holds the metrics lock and needs the weights lock, while its
              checkpoint-writer holds the weights lock and needs the metrics lock (the opposite order)
  uneven      DDP (on a process group of its own); the culprit's data runs out at step K: it leaves the training
              loop and waits in evaluate()'s all_reduce while the others wait in DDP's gradient all_reduce inside
              loss.backward() (the classic uneven-inputs hang)
  order       every step all_reduces five gradient buckets, each on its own process group; at step K the
              culprit walks its buckets in another order (as a set's order can differ between processes): it
              waits in one bucket's all_reduce while the others wait in another's
  gpu_xid     at step K the culprit never returns from device_synchronize(), a stand-in for
              torch.cuda.synchronize() on a GPU that fell off the bus; the others wait in that step's all_reduce
              (the recorded scenario fakes the GPU fault on the culprit's node: tests/support/gpu_fakes.py)
  mismatch    at step K the culprit gathers its metrics with all_gather where the others all_reduce the
              gradients on the same group: gloo pairs neither, every rank waits (mismatched collective types)
  gil         at step K the culprit calls a native function (ctypes, through PyDLL) that blocks in the kernel
              without releasing the GIL: its other Python threads (the shard reader) cannot run either
  native      at step K the culprit calls a native function (ctypes, through CDLL: the GIL released) that never
              returns: a C extension call that blocks forever
  pipe        the culprit ships its logs to a helper process through a pipe; the helper has stopped reading, and
              at step K the culprit's report fills the pipe: it blocks in write()
  fsstall     at step K the culprit reads a data shard from --stall-file, on a file system that never answers
              (tests/support/fuse_stall.py): it sits in uninterruptible sleep (D)
One blocking operation of a library each (train_patterns(): at step K the culprit makes the call, the others
wait for it in that step's all_reduce):
  shutdown    the culprit's step raises (a corrupt batch: a shape error) and its interpreter waits at exit for its
              non-daemon `metrics-uploader` thread, which waits for the next item of its queue
  loaderlock  a DataLoader (1 worker, fork) over a node-local shard cache; a shard's `.lock` file that a killed job
              left behind makes the culprit's worker poll for ever, and the culprit waits for its batch
  executor    checkpoints uploaded on a ThreadPoolExecutor; the storage stops acknowledging, the upload never
              ends, and the next save waits in Future.result
  event       the culprit's shard-lister thread raised (its manifest lacks a shard) before it set its Event; the
              loop waits for it at the epoch's end
  queue       the culprit's batch-producer thread ran out of shards and ended without a sentinel; the loop waits in
              queue.Queue.get
  service     the culprit reports its metrics to a local agent (--service HOST:PORT, a process on its node) that
              accepts the connection and never answers: it waits in recv
  subprocess  the culprit runs a post-step hook, `tail -f` on its metrics file, which never exits
  flock       the culprit takes the node's dataset-cache lock (fcntl.flock on --lock-file), which another
              process on its node holds
  storekey    the culprit collects the others' eval results from the job's store (TCPStore.wait); they wrote
              them under the next step's keys, so the keys it waits for are never set
  poll        the culprit polls for a checkpoint's COMMITTED marker that is never written (sleep and retry)
  spin        the culprit's log flush busy-waits for a flag its writer thread (dead: its file was closed) never sets
  pdb         a breakpoint() left in the culprit's code; its stdin is a pipe nobody writes (run it so)
  sighandler  a preemption notice (SIGUSR1, as SLURM's --signal sends) arrives mid-step; the handler waits for the
              step to end, but it runs on the main thread, inside that step
  asyncio     the culprit scores its checkpoint with an asyncio client; the eval service drops the request and
              the future it awaits never completes (the loop waits in select)
  selflock    the culprit's step-time buffer fills: it flushes while holding its `_stats_lock`, and the flush takes
              that Lock again (not reentrant): the thread waits for itself
--worker-server DIR: each rank runs under torch's worker_main() and serves its debug handlers, the Flight
Recorder's fr_trace_json among them, on DIR/rank<RANK>.sock (hangscope reads it; FIELD-NOTES, gloo).
Readiness: with env HANGSCOPE_READY_FILE set, each rank appends one JSON line {rank, local_rank, pid, host,
step, where} just before the call it will hang in (healthy/netcut: after a few steps), flushed and fsynced.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import itertools
import json
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

WORKER_SERVER_FLAG = "--worker-server"
IN_PYTHON_FLAG = "--worker-server-set-in-python"  # set the socket in os.environ, as many jobs do: not in environ


def own_worker_socket(argv: Sequence[str]) -> None:
    """--worker-server DIR: this rank serves torch's debug handlers (Flight Recorder included) on its own unix
    socket, DIR/rank<RANK>.sock. torchrun gives every rank the same environment, and tools read a rank's
    settings from /proc/PID/environ, so the rank re-executes itself with its own TORCH_WORKER_SERVER_SOCKET
    (and TORCH_FR_BUFFER_SIZE) before torch is loaded: the pid, which torchrun watches, stays the same."""
    if WORKER_SERVER_FLAG not in argv[:-1] or IN_PYTHON_FLAG in argv:
        return
    path = os.path.join(argv[argv.index(WORKER_SERVER_FLAG) + 1], f"rank{os.environ.get('RANK', '0')}.sock")
    if os.environ.get("TORCH_WORKER_SERVER_SOCKET") == path:
        return
    env = dict(os.environ, TORCH_WORKER_SERVER_SOCKET=path)
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    argv0 = list(getattr(sys, "orig_argv", [])) or [sys.executable, *sys.argv]  # keeps the launcher's -u
    os.execve(sys.executable, [sys.executable, *argv0[1:]], env)


if __name__ == "__main__":
    own_worker_socket(sys.argv)

import torch  # noqa: E402 (after the re-exec above: a rank loads torch once)
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

SCENARIOS: tuple[str, ...] = ("dataloader", "skip", "die", "healthy", "netcut", "lock", "deadlock", "order",
                              "uneven", "mismatch", "gil", "native", "pipe", "fsstall")
SCENARIOS += ("gpu_xid",)  # the culprit never returns from device_synchronize (its GPU fell off the bus)
# one blocking operation each, in train_patterns()
PATTERNS: tuple[str, ...] = ("shutdown", "loaderlock", "executor", "event", "queue", "service", "subprocess", "flock",
                             "storekey", "poll", "spin", "pdb", "sighandler", "asyncio", "selflock")
SCENARIOS += PATTERNS
BUCKETS = ("embed", "attn", "mlp", "norm", "head")
FEATURES = 16
BATCH = 8
READY_AFTER = 3  # healthy/netcut report ready after this many steps


def report_ready(where: str, step: int) -> None:
    """Append this rank's ready line (one write, O_APPEND: lines of concurrent ranks never interleave)."""
    path = os.environ.get("HANGSCOPE_READY_FILE")
    if not path:
        return
    line = json.dumps({"rank": dist.get_rank(), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                       "pid": os.getpid(), "host": socket.gethostname(), "step": step, "where": where})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class StreamingLoader:
    """Batches streamed over a socket by a shard-reader thread, like a loader fed by a remote storage client.

    `stall_at`: the reader's storage request for that batch never completes, so the training loop's next()
    blocks in a real socket read. `poison_at`: that batch holds NaNs (a corrupt sample).
    """

    _HEADER = struct.Struct("!qI")  # batch index, payload bytes

    def __init__(self, seed: int, stall_at: Optional[int] = None, poison_at: Optional[int] = None) -> None:
        self._sock, peer = socket.socketpair()
        self._index = 0
        self._stall_at = stall_at
        self._poison_at = poison_at
        self._seed = seed
        self._storage_stalled = threading.Event()  # never set: the storage request that never returns
        threading.Thread(target=self._read_shards, args=(peer,), name="shard-reader", daemon=True).start()

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._index == self._stall_at:
            report_ready("data_loading", self._index)
        index, size = self._HEADER.unpack(self._recv_exact(self._HEADER.size))
        payload = self._recv_exact(size)
        self._index = index + 1
        rows = torch.frombuffer(payload, dtype=torch.float32).view(BATCH, FEATURES + 1)
        return rows[:, :FEATURES], rows[:, FEATURES:]

    def _recv_exact(self, size: int) -> bytearray:
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = self._sock.recv_into(view[got:])
            if n == 0:
                raise EOFError("the shard reader closed its stream")
            got += n
        return buf

    def _read_shards(self, sock: socket.socket) -> None:
        gen = torch.Generator().manual_seed(self._seed)
        index = 0
        while True:
            if index == self._stall_at:
                self._storage_stalled.wait()
            x = torch.randn(BATCH, FEATURES, generator=gen)
            y = x.sum(dim=1, keepdim=True) * 0.1
            if index == self._poison_at:
                x[0, 0] = float("nan")
            # bytes of the tensor's own storage: torch's CPU wheel does not bring numpy, so no .numpy() here
            payload = bytes(torch.cat([x, y], dim=1).contiguous().untyped_storage())
            sock.sendall(self._HEADER.pack(index, len(payload)) + payload)
            index += 1


def keep_sockets_open(seconds: float) -> None:
    """Hand this process's TCP sockets to a child that outlives it, so peers see no connection close."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.append(int(name))
        except OSError:
            continue
    holder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "socket_holder.py")
    # no RANK/LOCAL_RANK in its environment: it is not a rank, and must not be found as one
    env = {k: v for k, v in os.environ.items() if k == "PATH" or k.startswith("HANGSCOPE_")}
    subprocess.Popen([sys.executable, holder, str(seconds), *map(str, fds)], pass_fds=fds, env=env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


_metrics_lock = threading.Lock()
_weights_lock = threading.Lock()
METRICS: List[Tuple[int, float]] = []


class CheckpointWriter(threading.Thread):
    """Writes a checkpoint when asked, in the background, holding the locks the training loop also takes."""

    def __init__(self, upload_hangs: bool, opposite_order: bool) -> None:
        super().__init__(name="checkpoint-writer", daemon=True)
        self.requested = threading.Event()
        self.uploaded = threading.Event()  # the storage's acknowledgement (never comes when upload_hangs)
        self.holds_weights = threading.Event()
        self.upload_hangs, self.opposite_order = upload_hangs, opposite_order

    def run(self) -> None:
        while True:
            self.requested.wait()
            self.requested.clear()
            if self.opposite_order:
                with _weights_lock:
                    self.holds_weights.set()
                    with _metrics_lock:  # the training loop takes these in the other order: a deadlock
                        self.save()
            else:
                with _metrics_lock:  # the metrics go into the checkpoint, consistent with the weights
                    self.save()

    def save(self) -> None:
        if self.upload_hangs:
            self.uploaded.wait()


def device_synchronize() -> None:
    """gpu_xid: the demo has no GPU; this stands in for torch.cuda.synchronize() on a GPU that fell off the bus,
    a call that never returns (the rank's thread waits in the driver). The GPU fault itself is faked on the
    recording's node (tests/support/gpu_fakes.py: its nvidia-smi, dmesg and ncclras print recorded outputs)."""
    threading.Event().wait()


def log_metrics(step: int, loss: float) -> None:
    with _metrics_lock:
        METRICS.append((step, loss))


def log_metrics_and_weights(step: int, loss: float, writer: CheckpointWriter) -> None:
    with _metrics_lock:
        METRICS.append((step, loss))
        writer.requested.set()
        writer.holds_weights.wait()
        with _weights_lock:  # the writer holds it and waits for _metrics_lock, which this thread holds
            METRICS.append((step, 0.0))


def gather_metrics(loss: torch.Tensor, group: dist.ProcessGroup) -> List[torch.Tensor]:
    """Every rank's loss, for logging (the culprit calls this where the others sync their gradients)."""
    out = [torch.zeros_like(loss) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, loss, group=group)
    return out


def native_wait(hold_gil: bool) -> None:
    """A call into native code that never returns: libc's pause(), through ctypes. PyDLL keeps the GIL held
    during the call (as a C extension that forgets Py_BEGIN_ALLOW_THREADS does); CDLL releases it."""
    import ctypes

    lib = ctypes.PyDLL(None) if hold_gil else ctypes.CDLL(None)
    lib.pause()


class LogShipper:
    """The rank's log lines go to a helper process through a pipe (as to a log shipper or `| tee`). With
    `stalled`, the helper never reads: once the pipe's buffer is full, the rank's next write blocks."""

    def __init__(self, stalled: bool) -> None:
        # no RANK in its environment: it is not a rank (HANGSCOPE_* kept: the tests find and stop it by it)
        env = {k: v for k, v in os.environ.items() if k == "PATH" or k.startswith("HANGSCOPE_")}
        argv = ["sleep", "86400"] if stalled else ["cat"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
        assert self.proc.stdin is not None
        self.pipe = self.proc.stdin

    def log(self, text: str) -> None:
        self.pipe.write(text.encode())
        self.pipe.flush()


def read_shard(path: str) -> bytes:
    """The next data shard, from shared storage."""
    with open(path, "rb") as f:
        return f.read(1 << 16)


def sync_buckets(buckets: Dict[str, torch.Tensor], bucket_groups: Dict[str, dist.ProcessGroup],
                 names: List[str]) -> None:
    """One all_reduce per gradient bucket, each on its own process group, in the order `names` gives."""
    for name in names:
        dist.all_reduce(buckets[name], group=bucket_groups[name])


def sync_gradients(model: nn.Module, group: dist.ProcessGroup) -> None:
    """Average gradients over all ranks: one flat all_reduce per step."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def evaluate(model: nn.Module, group: dist.ProcessGroup) -> float:
    """The validation loss averaged over all ranks: one all_reduce."""
    with torch.no_grad():
        x = torch.randn(BATCH, FEATURES, generator=torch.Generator().manual_seed(1))
        loss = F.mse_loss(model(x), x.sum(dim=1, keepdim=True) * 0.1).reshape(1)
    dist.all_reduce(loss, group=group)
    return float(loss.item()) / dist.get_world_size()


class PlainSGD:
    """SGD without momentum, as torch.optim.SGD(params, lr=lr) steps (each parameter less lr times its gradient).
    Not torch.optim itself: since torch 2.x an optimizer's first step() imports torch._dynamo, about 1 CPU-s a
    rank (a third of a demo rank's start in torch 2.13), paid by every rank of a demo job that shares one machine's
    cores (and by the test suite's ~170 demo ranks)."""

    def __init__(self, params: Iterator[torch.Tensor], lr: float) -> None:
        self.params = list(params)
        self.lr = lr

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-self.lr)


def train(args: argparse.Namespace, groups: Sequence[dist.ProcessGroup],
          bucket_groups: Optional[Dict[str, dist.ProcessGroup]] = None,
          ddp_group: Optional[dist.ProcessGroup] = None) -> None:
    rank = dist.get_rank()
    culprit = rank == args.culprit
    hang_step = args.hang_step + 1 if (culprit and args.scenario == "skip") else args.hang_step
    torch.manual_seed(0)
    model = TinyModel()
    if ddp_group is not None:
        model = nn.parallel.DistributedDataParallel(model, process_group=ddp_group)
    optimizer = PlainSGD(model.parameters(), lr=0.01)
    loader = StreamingLoader(seed=rank,
                             stall_at=args.hang_step if culprit and args.scenario == "dataloader" else None,
                             poison_at=args.hang_step if culprit and args.scenario == "skip" else None)
    forever = args.scenario in ("healthy", "netcut")
    writer = None
    if args.scenario in ("lock", "deadlock"):
        writer = CheckpointWriter(upload_hangs=culprit and args.scenario == "lock",
                                  opposite_order=culprit and args.scenario == "deadlock")
        writer.start()
    shipper = LogShipper(stalled=culprit) if args.scenario == "pipe" else None
    for step, batch in enumerate(loader):
        if culprit and step == args.hang_step and args.scenario in ("gil", "native"):
            report_ready("native", step)
            native_wait(hold_gil=args.scenario == "gil")
        if culprit and step == args.hang_step and args.scenario == "fsstall":
            report_ready("read", step)
            read_shard(args.stall_file)
        if shipper is not None:
            if culprit and step == args.hang_step:
                report_ready("write", step)
                shipper.log(f"step {step}: parameter report\n" + "x" * (1 << 20))  # more than a pipe holds
            shipper.log(f"step {step}\n")
        if ddp_group is not None and culprit and step == args.hang_step:
            report_ready("evaluate", step)
            break  # this rank's shard has run out: it leaves the training loop before the others
        inputs, targets = batch
        optimizer.zero_grad()
        loss = F.mse_loss(model(inputs), targets)
        if not torch.isfinite(loss):
            # the bug the skip scenario shows: a rank-local decision to skip a step, and with it a collective
            continue
        if ddp_group is not None and step == args.hang_step:
            report_ready("backward", step)  # DDP's gradient all_reduce runs inside backward()
        loss.backward()
        if culprit and args.scenario == "gpu_xid" and step == args.hang_step:
            report_ready("synchronize", step)
            device_synchronize()
        if culprit and args.scenario == "die" and step == args.hang_step:
            report_ready("exit", step)
            keep_sockets_open(args.timeout_hours * 3600)
            os._exit(0)
        if writer is not None:
            if culprit and step == args.hang_step and args.scenario == "lock":
                writer.requested.set()
                while not _metrics_lock.locked():  # the writer has taken the lock for its checkpoint
                    time.sleep(0.01)
                report_ready("lock", step)
            if culprit and step == args.hang_step and args.scenario == "deadlock":
                report_ready("deadlock", step)
                log_metrics_and_weights(step, loss.item(), writer)
            log_metrics(step, loss.item())
        if ddp_group is not None:  # DDP averaged the gradients in backward()
            optimizer.step()
            continue
        if not forever and step == hang_step and not (culprit and writer is not None):
            report_ready("all_reduce", step)
        if bucket_groups is not None:
            names = list(BUCKETS)
            if culprit and step == args.hang_step:
                names = names[1:] + names[:1]  # this rank's buckets come out in another order
            sync_buckets({name: torch.ones(4) for name in names}, bucket_groups, names)
        if culprit and step == args.hang_step and args.scenario == "mismatch":
            gather_metrics(loss.detach().reshape(1), groups[step % len(groups)])  # the others all_reduce here
        sync_gradients(model, groups[step % len(groups)])
        optimizer.step()
        if forever and step == READY_AFTER:
            report_ready("training", step)
        if args.step_delay > 0:
            time.sleep(args.step_delay)  # a slow but progressing job, without burning the machine's CPU
    if ddp_group is not None:
        evaluate(model, groups[0])


# --- the wait patterns: train_patterns() ----------------------------------------------------------------------

def scratch(name: str) -> str:
    """A folder for this rank's files: beside the ready file (the test's work folder, removed with it), else in
    the temp folder."""
    ready = os.environ.get("HANGSCOPE_READY_FILE")
    base = os.path.dirname(ready) if ready else tempfile.gettempdir()
    path = os.path.join(base, f"{name}-rank{os.environ.get('RANK', '0')}-{os.getpid()}")
    os.makedirs(path, exist_ok=True)
    return path


def helper(argv: List[str]) -> subprocess.Popen:
    """A process of the node's own that the demo stands in for (a metrics agent, another job's lock holder): not a
    rank (no RANK in its environment), in a session of its own."""
    env = {k: v for k, v in os.environ.items() if k == "PATH" or k.startswith("HANGSCOPE_")}
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)


# the node's metrics agent when it has stopped answering: it accepts connections and never replies
STALLED_AGENT = ("import socket, sys, time\n"
                 "s = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n"
                 "print(s.getsockname()[1], flush=True)\n"
                 "held = []\n"
                 "while True:\n"
                 "    held.append(s.accept())\n")


class MetricsUploader(threading.Thread):
    """Uploads each step's metrics in the background; a non-daemon thread, told to stop by a None in its queue
    at the end of training (which an exception skips)."""

    def __init__(self) -> None:
        super().__init__(name="metrics-uploader")
        self.queue: "queue.Queue[Optional[Tuple[int, float]]]" = queue.Queue()

    def run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            METRICS.append(item)


class ShardDataset(torch.utils.data.Dataset):
    """Samples from shard files in a node-local cache (one shard per batch). A shard that another process is still
    writing has a `.lock` file beside it; a reader waits for the lock to go away."""

    def __init__(self, root: str, seed: int) -> None:
        self.root, self.seed = root, seed

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        shard = os.path.join(self.root, f"shard-{index // BATCH:05d}.bin")
        while os.path.exists(shard + ".lock"):  # being written: wait for the writer to finish
            time.sleep(0.5)
        x = torch.randn(FEATURES, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + index))
        return x, x.sum(dim=0, keepdim=True) * 0.1


def shard_loader(rank: int, stale_shard: Optional[int]) -> torch.utils.data.DataLoader:
    root = scratch("shards")
    if stale_shard is not None:  # a job killed while it wrote this shard left its lock behind
        open(os.path.join(root, f"shard-{stale_shard:05d}.bin.lock"), "w").close()
    return torch.utils.data.DataLoader(ShardDataset(root, rank), batch_size=BATCH, num_workers=1,
                                       multiprocessing_context="fork")


class AsyncCheckpointer:
    """Checkpoints uploaded in the background on a ThreadPoolExecutor (as async checkpoint savers do): the next
    save first waits for the previous upload, and an upload waits for the storage's acknowledgement. `acks`: how
    many uploads the storage acknowledges before it stops answering (None: all)."""

    def __init__(self, acks: Optional[int]) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-upload")
        self.pending: Optional[Future] = None
        self.conn, storage = socket.socketpair()
        threading.Thread(target=self._storage, args=(storage, acks), name="storage", daemon=True).start()

    def save(self, model: nn.Module) -> None:
        if self.pending is not None:
            self.pending.result()  # one upload at a time: the previous one must have finished
        blob = b"".join(bytes(p.detach().clone().untyped_storage()) for p in model.parameters())
        self.pending = self.pool.submit(self._upload, blob)

    def _upload(self, blob: bytes) -> None:
        self.conn.sendall(struct.pack("!I", len(blob)) + blob)
        self.conn.recv(1)  # the storage's acknowledgement

    @staticmethod
    def _storage(sock: socket.socket, acks: Optional[int]) -> None:
        """Stands in for the remote storage: reads each upload and acknowledges it, until it stops answering."""
        while sock.recv(1 << 16) and acks != 0:
            sock.sendall(b"k")
            acks = None if acks is None else acks - 1
        time.sleep(1e9)  # stalled: keeps the connection open and never answers


class ShardLister:
    """Lists the next epoch's shards from the manifest in a background thread while this epoch trains; the loop
    waits for the list (`ready`) at the epoch's end."""

    def __init__(self, manifest: Dict[str, str]) -> None:
        self.ready = threading.Event()
        self.shards: List[str] = []
        threading.Thread(target=self._list, args=(manifest,), name="shard-lister", daemon=True).start()

    def _list(self, manifest: Dict[str, str]) -> None:
        self.shards = [manifest[name] for name in manifest["index"].split(",")]  # KeyError: a shard missing
        self.ready.set()


def produce_shards(shards: "queue.Queue[int]", count: int) -> None:
    """The batch producer: puts this rank's shards into the queue, one per step, and ends with its list."""
    for shard in range(count):
        shards.put(shard)


def report_metrics(agent: Tuple[str, int], step: int, loss: float) -> bytes:
    """Reports the step's metrics to the node's metrics agent, a local service, and reads its reply."""
    with socket.create_connection(agent) as conn:
        conn.sendall(f"step={step} loss={loss:.4f}\n".encode())
        return conn.recv(64)


def run_hook(metrics_file: str) -> None:
    """The post-step hook a user configured to show the metrics: `tail -f` (not `tail`) follows the file for ever."""
    subprocess.run(["tail", "-f", metrics_file], stdout=subprocess.DEVNULL, check=True)


def build_dataset_cache(lock_file: str) -> None:
    """The node's dataset cache is built by one process at a time: take its lock file first (as the datasets
    library and torch.hub do), and wait while another process holds it."""
    with open(lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write(f"{os.getpid()}\n")


def publish_eval(store: dist.Store, step: int, rank: int, loss: float) -> None:
    """Each rank's eval result, for the aggregating rank; this code path counts steps from 1."""
    store.set(f"eval/{step + 1}/rank{rank}", f"{loss:.6f}")


def collect_eval(store: dist.Store, step: int, world: int) -> List[float]:
    """The aggregating rank waits for every rank's eval result in the job's store."""
    keys = [f"eval/{step}/rank{r}" for r in range(world)]
    store.wait(keys, timedelta(hours=2))
    return [float(store.get(k)) for k in keys]


def wait_for_commit(checkpoint: str) -> int:
    """Waits until the checkpoint is committed (rank 0 writes its COMMITTED marker), retrying."""
    for attempt in itertools.count():
        if os.path.exists(os.path.join(checkpoint, "COMMITTED")):
            return attempt
        time.sleep(0.5)
    return -1


class BufferedLog:
    """Log lines written by a background thread; flush() hands the buffer over and busy-waits until it is on disk."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a")  # noqa: SIM115 (open for the thread's life; closed under it in the demo)
        self.lines: List[str] = []
        self.flushed = True
        self.wake = threading.Event()
        threading.Thread(target=self._write, name="log-writer", daemon=True).start()

    def _write(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            self.file.write("".join(self.lines))  # ValueError once the file is closed: the thread dies
            self.lines.clear()
            self.flushed = True

    def flush(self) -> None:
        self.flushed = False
        self.wake.set()
        while not self.flushed:  # the writer sets it when the lines are written
            pass


def inspect_step(step: int, loss: float) -> None:
    """A debugging aid left in the code: stop in pdb on an alarming step."""
    print(f"step {step}: loss {loss:.4f} looks wrong", flush=True)
    breakpoint()


class PreemptionSaver:
    """Saves a checkpoint when the scheduler's preemption notice (SIGUSR1, SLURM's --signal=USR1@60) arrives; it
    waits for the step in flight to finish first. But a Python signal handler runs on the main thread, inside
    that very step."""

    def __init__(self) -> None:
        self.step_done = threading.Event()
        self.step_done.set()
        signal.signal(signal.SIGUSR1, self.on_notice)

    def on_notice(self, signum: int, frame: Any) -> None:
        self.step_done.wait()
        METRICS.append((-1, 0.0))  # the checkpoint


class EvalClient:
    """Scores a checkpoint on the eval service with asyncio: each request is a future that the service's
    callback completes. A request the service drops is never completed."""

    def __init__(self) -> None:
        self.requests: Dict[int, "asyncio.Future[float]"] = {}

    def score(self, step: int) -> float:
        return asyncio.run(self._score(step))

    async def _score(self, step: int) -> float:
        answer: "asyncio.Future[float]" = asyncio.get_running_loop().create_future()
        self.requests[step] = answer  # the service's callback sets its result (this one it dropped)
        return await answer


_stats_lock = threading.Lock()
STEP_TIMES: List[Tuple[int, float]] = []


def record_step_time(step: int, seconds: float, flush_at: int) -> None:
    with _stats_lock:
        STEP_TIMES.append((step, seconds))
        if len(STEP_TIMES) >= flush_at:
            flush_step_times()


def flush_step_times() -> None:
    with _stats_lock:  # already held by record_step_time, on this same thread: a Lock is not reentrant
        METRICS.extend(STEP_TIMES)
        STEP_TIMES.clear()


def train_patterns(args: argparse.Namespace, groups: Sequence[dist.ProcessGroup]) -> None:
    """The loop of the wait patterns: at step K the culprit makes its scenario's blocking call; the others go on
    into that step's all_reduce and wait there."""
    rank, world = dist.get_rank(), dist.get_world_size()
    culprit, k, s = rank == args.culprit, args.hang_step, args.scenario
    torch.manual_seed(0)
    model = TinyModel()
    optimizer = PlainSGD(model.parameters(), lr=0.01)
    batches = iter(shard_loader(rank, k if culprit else None) if s == "loaderlock" else StreamingLoader(seed=rank))
    uploader = MetricsUploader() if s == "shutdown" else None
    if uploader is not None:
        uploader.start()
    checkpointer = AsyncCheckpointer(acks=k - 1 if culprit else None) if s == "executor" else None
    manifest = {"index": "a,b", "a": "shard-a", "b": "shard-b"}
    if culprit:
        del manifest["b"]
    lister = ShardLister(manifest) if s == "event" else None
    shards: "queue.Queue[int]" = queue.Queue(maxsize=2)
    if s == "queue":
        threading.Thread(target=produce_shards, args=(shards, k if culprit else 1 << 30), name="batch-producer",
                         daemon=True).start()
    saver = PreemptionSaver() if s == "sighandler" else None
    log = BufferedLog(os.path.join(scratch("log"), "train.log")) if s == "spin" else None
    for step in itertools.count():
        hang = culprit and step == k
        if saver is not None:
            saver.step_done.clear()
        if hang:
            report_ready(s, step)
        if s == "queue":
            shards.get()
        inputs, targets = next(batches)
        if s == "shutdown" and hang:
            inputs = inputs[:, 1:]  # a corrupt sample: one feature short, and the forward raises
        optimizer.zero_grad()
        loss = F.mse_loss(model(inputs), targets)
        loss.backward()
        if uploader is not None:
            uploader.queue.put((step, loss.item()))
        if checkpointer is not None:
            checkpointer.save(model)
        if lister is not None and step == k:
            lister.ready.wait()  # the epoch ends here: the next epoch's shards
        if hang and s == "service":
            report_metrics(service_address(args), step, loss.item())
        if hang and s == "subprocess":
            path = os.path.join(scratch("metrics"), "metrics.txt")
            with open(path, "w") as f:
                f.write(f"{step} {loss.item():.6f}\n")
            run_hook(path)
        if hang and s == "flock":
            build_dataset_cache(args.lock_file or held_lock_file())
        if s == "storekey" and step == k:
            store = dist.distributed_c10d._get_default_store()
            publish_eval(store, step, rank, loss.item())
            if culprit:  # the aggregating rank
                collect_eval(store, step, world)
        if hang and s == "poll":
            wait_for_commit(scratch(f"checkpoint-step{step}"))
        if log is not None:
            log.lines.append(f"step {step} loss {loss.item():.4f}\n")
            if hang:
                log.file.close()  # closed under the writer (a rotation gone wrong): its next write raises
                log.flush()
        if hang and s == "pdb":
            inspect_step(step, loss.item())
        if hang and s == "sighandler":
            os.kill(os.getpid(), signal.SIGUSR1)  # the preemption notice arrives mid-step
        if hang and s == "asyncio":
            EvalClient().score(step)
        if s == "selflock":
            record_step_time(step, 0.01, flush_at=k + 1 if culprit else 1 << 30)
        if step == k and not culprit:
            report_ready("all_reduce", step)
        sync_gradients(model, groups[step % len(groups)])
        optimizer.step()
        if saver is not None:
            saver.step_done.set()


def service_address(args: argparse.Namespace) -> Tuple[str, int]:
    """--service HOST:PORT, or (the demo on its own) a stalled agent started here."""
    if args.service:
        host, _, port = args.service.rpartition(":")
        return host, int(port)
    agent = helper([sys.executable, "-c", STALLED_AGENT, "0"])
    assert agent.stdout is not None
    return "127.0.0.1", int(agent.stdout.readline())


def held_lock_file() -> str:
    """(the demo on its own) a lock file another process holds: util-linux flock, holding it for a day."""
    path = os.path.join(scratch("cache"), "dataset.lock")
    holder = helper(["flock", "--no-fork", path, "sh", "-c", "echo held; exec sleep 86400"])
    assert holder.stdout is not None
    holder.stdout.readline()
    return path


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="skip")
    parser.add_argument("--culprit", type=int, default=None, help="rank that misbehaves (default: the last)")
    parser.add_argument("--hang-step", type=int, default=3, help="step at which the job hangs (default 3)")
    parser.add_argument("--stall-file", default="", help="fsstall: the file the culprit reads at the hang step")
    parser.add_argument("--step-delay", type=float, default=None,
                        help="seconds each step sleeps (healthy/netcut: 0.05; the others: 0, they reach their hang "
                        "at once; give one to let a job train a while before it hangs)")
    parser.add_argument("--service", default="", help="service: HOST:PORT of the culprit's local metrics agent "
                        "(default: a stalled one started by the culprit)")
    parser.add_argument("--lock-file", default="", help="flock: the dataset-cache lock file (default: one that a "
                        "process started by the culprit holds)")
    parser.add_argument("--timeout-hours", type=float, default=2.0,
                        help="process-group timeout: long, so a hang stays hung while it is investigated")
    parser.add_argument(WORKER_SERVER_FLAG, metavar="DIR",
                        help="run the training under torch.distributed.elastic.control_plane.worker_main() with "
                        "the Flight Recorder on; each rank serves on DIR/rank<RANK>.sock")
    parser.add_argument(IN_PYTHON_FLAG, action="store_true",
                        help="with --worker-server: set TORCH_WORKER_SERVER_SOCKET in os.environ just before "
                        "worker_main(), so it is not in /proc/PID/environ (the Flight Recorder must be switched on "
                        "by the launch environment)")
    args = parser.parse_args(argv)
    if args.scenario == "fsstall" and not args.stall_file:
        parser.error("--scenario fsstall needs --stall-file (a file on a file system that does not answer)")
    if args.step_delay is None:
        args.step_delay = 0.05 if args.scenario in ("healthy", "netcut") else 0.0
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    timeout = timedelta(hours=args.timeout_hours)
    dist.init_process_group("gloo", timeout=timeout)
    world = dist.get_world_size()
    if args.culprit is None:
        args.culprit = world - 1
    if not 0 <= args.culprit < world:
        print(f"--culprit {args.culprit} is not a rank of this {world}-rank job", file=sys.stderr)
        return 2
    # two groups over the same ranks, used on alternate steps (see "skip" above)
    groups = [dist.new_group(list(range(world)), timeout=timeout) for _ in range(2)]
    # order: a process group per bucket, created in one order on every rank (new_group must be)
    bucket_groups = ({name: dist.new_group(list(range(world)), timeout=timeout) for name in BUCKETS}
                     if args.scenario == "order" else None)
    # uneven: DDP on a group of its own (on the default group gloo would abort on the evaluate() all_reduce's
    # size mismatch instead of hanging)
    ddp_group = dist.new_group(list(range(world)), timeout=timeout) if args.scenario == "uneven" else None
    if args.scenario in PATTERNS:
        train_patterns(args, groups)
        return 0
    if args.worker_server:
        from torch.distributed.elastic.control_plane import worker_main

        if args.worker_server_set_in_python:
            os.environ["TORCH_WORKER_SERVER_SOCKET"] = os.path.join(args.worker_server, f"rank{dist.get_rank()}.sock")

        with worker_main():  # serves TORCH_WORKER_SERVER_SOCKET while the rank trains (and hangs)
            train(args, groups, bucket_groups, ddp_group)
    else:
        train(args, groups, bucket_groups, ddp_group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
