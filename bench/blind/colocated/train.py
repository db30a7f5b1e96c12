#!/usr/bin/env python3
"""A small language-model trainer (gloo, CPU), started with torchrun on every node.

Options for the data pipeline and the node-level services a shared cluster provides:

  --workdir DIR          the run's folder: data/corpus-*.txt, ckpt/, logs
  --env-dir DIR          per-node environment overrides: DIR/<hostname>.env (KEY=VALUE lines) is loaded, if it
                         exists, before the process group is initialised (cluster-specific GLOO/MASTER settings)
  --stage-dir DIR        stage this node's corpus shards into DIR/<hostname>/ (node-local scratch), one process per
                         node at a time (an exclusive flock on DIR/<hostname>/.lock), before the process group forms
  --cache-dir DIR        the tokenized corpus is cached in DIR/<hostname>/ (shared by the node's jobs), guarded by a
                         FileLock (DIR/<hostname>/tokens.lock)
  --ring                 local ranks hand batches over through a node-local shared-memory ring, guarded by a named
                         POSIX semaphore (/ring-<hostname>), created by the first user
  --stats-port PORT      per-node step statistics: local rank 0 serves 127.0.0.1:PORT (or uses the server already
                         listening there), every rank reports each step and waits for the acknowledgement
  --control-port PORT    rank 0 hosts a control store for sidecars on MASTER_ADDR:PORT; with --eval-every K, rank 0
                         publishes a checkpoint every K steps and waits for the evaluator's result
  --metrics-socket PATH  local rank 0 sends per-step metrics to the node's log agent (syslog over a UNIX socket)
"""

from __future__ import annotations

import argparse
import datetime
import errno
import fcntl
import hashlib
import json
import logging
import logging.handlers
import os
import shutil
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

VOCAB = 2048
SEQ = 16


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--step-delay", type=float, default=0.2)
    ap.add_argument("--env-dir", type=Path)
    ap.add_argument("--stage-dir", type=Path)
    ap.add_argument("--cache-dir", type=Path)
    ap.add_argument("--ring", action="store_true")
    ap.add_argument("--stats-port", type=int, default=0)
    ap.add_argument("--control-port", type=int, default=0)
    ap.add_argument("--run-name", default="")
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--metrics-socket", default="")
    ap.add_argument("--pg-timeout", type=float, default=7200.0)
    args, unknown = ap.parse_known_args()
    if unknown:
        print(f"ignoring {unknown}", file=sys.stderr)
    return args


def log(msg: str) -> None:
    print(f"[{os.environ.get('RANK', '?')}] {msg}", flush=True)


# --- environment ----------------------------------------------------------------------------------------------

def load_env_overrides(folder: Path) -> None:
    path = folder / f"{socket.gethostname()}.env"
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        os.environ[key.strip()] = value.strip()
    log(f"loaded {path}")


# --- data ----------------------------------------------------------------------------------------------------

def tokenize(line: str) -> list:
    return [int.from_bytes(hashlib.blake2s(w.encode(), digest_size=4).digest(), "little") % VOCAB
            for w in line.split()]


def shard_files(workdir: Path) -> list:
    return sorted((workdir / "data").glob("corpus-*.txt"))


def stage_node_shards(stage: Path, files: list) -> list:
    """Copy (and normalise) the corpus into node-local scratch, once per node."""
    folder = stage / socket.gethostname()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            out = []
            for src in files:
                dst = folder / src.name
                if not dst.exists():
                    tmp = dst.with_suffix(".part")
                    with open(src) as fin, open(tmp, "w") as fout:
                        for line in fin:
                            fout.write(" ".join(line.lower().split()) + "\n")
                    os.replace(tmp, dst)
                out.append(dst)
            return out
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cached_tokens(cache: Path, files: list) -> torch.Tensor:
    """The tokenized corpus from the shared cache, built by whoever gets there first."""
    from filelock import FileLock

    cache = cache / socket.gethostname()
    cache.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha1("|".join(f"{p.name}:{p.stat().st_size}" for p in files).encode()).hexdigest()[:16]
    target = cache / f"tokens-{key}.pt"
    with FileLock(str(cache / "tokens.lock")):
        if not target.exists():
            toks = [t for p in files for line in p.read_text().splitlines() for t in tokenize(line)]
            torch.save(torch.tensor(toks, dtype=torch.int64), target.with_suffix(".tmp"))
            os.replace(target.with_suffix(".tmp"), target)
        return torch.load(target)


def plain_tokens(files: list) -> torch.Tensor:
    return torch.tensor([t for p in files for line in p.read_text().splitlines() for t in tokenize(line)],
                        dtype=torch.int64)


class NodeRing:
    """Local ranks share one staging slot per node: whoever holds the semaphore fills it."""

    def __init__(self) -> None:
        from _multiprocessing import SemLock

        name = f"/ring-{socket.gethostname()}"
        try:
            self.sem = SemLock(1, 1, 1, name, False)
        except FileExistsError:
            self.sem = SemLock._rebuild(0, 1, 1, name)

    def take(self, tokens: torch.Tensor, start: int, n: int) -> torch.Tensor:
        self.sem.acquire()
        try:
            return tokens[start:start + n].clone()
        finally:
            self.sem.release()


# --- node services ---------------------------------------------------------------------------------------------

class StatsServer(threading.Thread):
    def __init__(self, sock: socket.socket) -> None:
        super().__init__(name="stats-server", daemon=True)
        self.sock = sock
        self.path = Path(f"/tmp/step-stats-{socket.gethostname()}.jsonl")

    def run(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                head = _recv_exact(conn, 4)
                if not head:
                    return
                body = _recv_exact(conn, struct.unpack("!I", head)[0])
                with open(self.path, "ab") as f:
                    f.write(body + b"\n")
                conn.sendall(b"ok")


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            return b""
        out += chunk
    return out


def start_stats(port: int, local_rank: int) -> socket.socket:
    if local_rank == 0:
        srv = socket.socket()
        try:
            srv.bind(("127.0.0.1", port))
            srv.listen(64)
            StatsServer(srv).start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            srv.close()
            log(f"stats service already running on port {port}; using it")
    for _ in range(200):
        try:
            return socket.create_connection(("127.0.0.1", port))
        except ConnectionRefusedError:
            time.sleep(0.1)
    raise RuntimeError(f"no stats service on port {port}")


def report(conn: socket.socket, record: dict) -> None:
    body = json.dumps(record).encode()
    conn.sendall(struct.pack("!I", len(body)) + body)
    if _recv_exact(conn, 2) != b"ok":
        raise RuntimeError("stats service went away")


def metrics_logger(path: str) -> logging.Logger:
    logger = logging.getLogger("metrics")
    handler = logging.handlers.SysLogHandler(address=path)
    handler.setFormatter(logging.Formatter("trainer: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


# --- model -----------------------------------------------------------------------------------------------------

class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 64)
        self.mix = nn.Sequential(nn.Linear(64 * SEQ, 256), nn.GELU(), nn.Linear(256, 64))
        self.out = nn.Linear(64, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids).flatten(1)
        return self.out(self.mix(h))


def average_gradients(model: nn.Module, world: int) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def main() -> None:
    args = parse()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    files = shard_files(args.workdir)
    if args.stage_dir is not None:
        files = stage_node_shards(args.stage_dir, files)
        log(f"staged {len(files)} shards")
    if args.env_dir is not None:
        load_env_overrides(args.env_dir)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    log(f"process group ready: rank {rank} of {world}")

    tokens = cached_tokens(args.cache_dir, files) if args.cache_dir is not None else plain_tokens(files)
    ring = NodeRing() if args.ring else None
    stats = start_stats(args.stats_port, local_rank) if args.stats_port else None
    metrics = metrics_logger(args.metrics_socket) if args.metrics_socket and local_rank == 0 else None
    control = None
    if args.control_port and rank == 0:
        control = dist.TCPStore(os.environ["MASTER_ADDR"], args.control_port, is_master=True,
                                timeout=datetime.timedelta(seconds=args.pg_timeout), wait_for_workers=False)
        control.set(f"{args.run_name}/started", str(time.time()))

    model = TinyLM()
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    need = args.batch * (SEQ + 1)
    span = max(1, tokens.numel() // world)
    for step in range(1, args.steps + 1):
        start = rank * span + ((step * need) % max(1, span - need))
        window = ring.take(tokens, start, need) if ring is not None else tokens[start:start + need]
        window = window.view(args.batch, SEQ + 1)
        logits = model(window[:, :SEQ])
        loss = nn.functional.cross_entropy(logits, window[:, SEQ])
        opt.zero_grad()
        loss.backward()
        average_gradients(model, world)
        opt.step()
        if stats is not None:
            report(stats, {"rank": rank, "step": step, "loss": round(loss.item(), 4), "t": time.time()})
        if metrics is not None:
            norms = {n: round(p.grad.norm().item(), 5) for n, p in model.named_parameters()}
            metrics.info(json.dumps({"rank": rank, "step": step, "loss": round(loss.item(), 5), "grad_norms": norms,
                                     "lr": args.lr, "tokens": step * need * world}))
        if args.eval_every and step % args.eval_every == 0:
            result = [None]
            if control is not None:
                ckpt = args.workdir / "ckpt" / args.run_name / f"step_{step:06d}.pt"
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                torch.save(model.state_dict(), ckpt)
                control.set(f"{args.run_name}/ckpt", f"{step}:{ckpt}")
                control.wait([f"{args.run_name}/eval/{step}"])
                result[0] = json.loads(control.get(f"{args.run_name}/eval/{step}"))
            dist.broadcast_object_list(result, 0)
            if rank == 0:
                log(f"step {step}: eval {result[0]}")
        if rank == 0 and step % 10 == 0:
            log(f"step {step} loss {loss.item():.4f}")
        time.sleep(args.step_delay)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
