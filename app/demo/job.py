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
--worker-server DIR: each rank runs under torch's worker_main() and serves its debug handlers, the Flight
Recorder's fr_trace_json among them, on DIR/rank<RANK>.sock (hangscope reads it; FIELD-NOTES, gloo).
Readiness: with env HANGSCOPE_READY_FILE set, each rank appends one JSON line {rank, local_rank, pid, host,
step, where} just before the call it will hang in (healthy/netcut: after a few steps), flushed and fsynced.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

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
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
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
        if forever:
            if step == READY_AFTER:
                report_ready("training", step)
            time.sleep(args.step_delay)  # a slow but progressing job, without burning the machine's CPU
    if ddp_group is not None:
        evaluate(model, groups[0])


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="skip")
    parser.add_argument("--culprit", type=int, default=None, help="rank that misbehaves (default: the last)")
    parser.add_argument("--hang-step", type=int, default=3, help="step at which the job hangs (default 3)")
    parser.add_argument("--stall-file", default="", help="fsstall: the file the culprit reads at the hang step")
    parser.add_argument("--step-delay", type=float, default=0.05, help="healthy/netcut: seconds per step")
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
