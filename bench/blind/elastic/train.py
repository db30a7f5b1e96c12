"""A small data-parallel trainer launched with torchrun (one process per rank, gloo).

    torchrun --nnodes 4 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id RUN \
        train.py --workdir DIR [--steps N] [--log-every K] [--eval-every K] ...

Each rank reads its own shard (DIR/data/rank<R>.jsonl) and trains a bag-of-embeddings regressor with DDP.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

log = logging.getLogger("train")

VOCAB = 1000


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--step-sleep", type=float, default=0.02)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--host-config", default="", help="folder of per-host settings (<hostname>.json)")
    ap.add_argument("--config", default="", help="a JSON run config (dist.port, ...)")
    ap.add_argument("--report-every", type=float, default=0.0, help="seconds between metric reports (0: off)")
    return ap.parse_args()


class MetricsReporter:
    """Writes the latest metrics to DIR/metrics/<rank>.json every `interval` seconds in the background."""

    def __init__(self, folder: Path, rank: int, interval: float) -> None:
        self.path = folder / f"{rank}.json"
        self.interval = interval
        self.latest: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-reporter")
        folder.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def update(self, **values) -> None:
        self.latest.update(values)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.path.write_text(json.dumps(self.latest))
            self._stop.wait(self.interval)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.EmbeddingBag(VOCAB, 32, mode="mean")
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids)).squeeze(-1)


def batches(path: Path):
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    while True:
        for row in rows:
            yield torch.tensor(row["ids"]), torch.tensor(row["y"])


def load_host_settings(folder: str) -> dict:
    """Per-host tuning (threads, pinning) kept next to the job's config, one file per machine."""
    with open(os.path.join(folder, f"{socket.gethostname()}.json")) as f:
        return json.load(f)


def write_summary(workdir: Path, rank: int, losses: list) -> None:
    stats = json.loads((workdir / "eval" / f"{rank}.json").read_text())
    summary = {
        "rank": rank,
        "final_loss": losses[-1] if losses else None,
        "eval_mse": stats["sq_err"] / stats["count"],
        "eval_count": stats["count"],
    }
    (workdir / "summary").mkdir(exist_ok=True)
    (workdir / "summary" / f"{rank}.json").write_text(json.dumps(summary))


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [%(name)s] %(message)s")
    workdir = Path(args.workdir)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.host_config:
        settings = load_host_settings(args.host_config)
        torch.set_num_threads(int(settings.get("threads", 1)))
    if args.config:
        cfg = json.loads(Path(args.config).read_text())
        os.environ["MASTER_PORT"] = str(cfg["dist"]["port"])
    torch.set_num_threads(1)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(Model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = batches(workdir / "data" / f"rank{rank}.jsonl")
    reporter = MetricsReporter(workdir / "metrics", rank, args.report_every) if args.report_every else None
    eval_group = None
    losses = []
    started = time.time()
    for step in range(args.steps):
        ids, y = next(data)
        loss = nn.functional.mse_loss(model(ids), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if reporter is not None:
            reporter.update(step=step, loss=losses[-1])
        if local_rank == 0 and step % args.log_every == 0:
            gnorm = sum(p.grad.norm().item() ** 2 for p in model.parameters()) ** 0.5
            log.info("step %d/%d loss %.5f grad_norm %.5f lr %.4f samples/s %.1f elapsed %.1fs world %d rank %d "
                     "restart %s", step, args.steps, losses[-1], gnorm, opt.param_groups[0]["lr"],
                     (step + 1) * len(y) * world / max(time.time() - started, 1e-6), time.time() - started, world,
                     rank, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if args.eval_every and step > 0 and step % args.eval_every == 0:
            if eval_group is None:  # the evaluation runs on the first node's ranks; created on first use
                eval_group = dist.new_group(ranks=list(range(int(os.environ["LOCAL_WORLD_SIZE"]))))
            if rank < int(os.environ["LOCAL_WORLD_SIZE"]):
                t = torch.tensor([losses[-1]])
                dist.all_reduce(t, group=eval_group)
        time.sleep(args.step_sleep)

    total = torch.tensor([sum(losses) / len(losses)])
    dist.all_reduce(total)
    if rank == 0:
        log.info("mean loss over ranks: %.5f", total.item() / world)
    dist.destroy_process_group()
    write_summary(workdir, rank, losses)
    if reporter is not None:
        reporter.close()


if __name__ == "__main__":
    main()
