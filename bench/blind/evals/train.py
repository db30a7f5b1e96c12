"""Tabular binary classifier trained with DDP (gloo): streamed pre-packed training shards, validation every N samples,
metrics aggregated over the ranks, early stopping, optional push of the metrics to the node's metrics agent.

    torchrun --nnodes N --nproc-per-node P ... train.py --config config.json
"""

import argparse
import json
import logging
import os
import time
import urllib.request

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

log = logging.getLogger("train")
FEATURES = 16


def read_jsonl(path):
    with open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


class PackedShard(torch.utils.data.IterableDataset):
    """This rank's training shard, packed into batches offline (one batch a line)."""

    def __init__(self, path):
        self.path = path

    def __iter__(self):
        for rec in read_jsonl(self.path):
            yield torch.tensor(rec["x"]), torch.tensor(rec["y"], dtype=torch.float32)


def load_validation(path, batch_size):
    rows = [r for r in read_jsonl(path) if r.get("label") is not None]  # unlabelled rows cannot be scored
    batches = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        batches.append(([r["id"] for r in chunk], torch.tensor([r["x"] for r in chunk]),
                        torch.tensor([float(r["label"]) for r in chunk])))
    return batches


def build_model():
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))


def reduce_mean(t):
    t = t.detach().clone()
    dist.all_reduce(t)
    return t / dist.get_world_size()


def input_saliency(model, x):
    """|d logit / d input| for a few fixed examples (written to the run folder for the dashboard)."""
    with torch.enable_grad():
        x = x.clone().requires_grad_(True)
        logits = model(x).squeeze(1)
        (grad,) = torch.autograd.grad(logits.sum(), x)
    return grad.abs()


@torch.no_grad()
def evaluate(model, batches, saliency_ids=frozenset(), out_dir=None):
    net = model.module if isinstance(model, DDP) else model
    net.eval()
    crit = nn.BCEWithLogitsLoss(reduction="sum")
    total, count, tp, fp, fn = 0.0, 0, 0, 0, 0
    running = None
    for i, (ids, x, y) in enumerate(batches):
        if saliency_ids and saliency_ids.intersection(ids):
            sal = input_saliency(model, x)
            if out_dir:
                torch.save({"ids": ids, "saliency": sal}, os.path.join(out_dir, f"saliency-{ids[0]}.pt"))
        logits = net(x).squeeze(1)
        loss = crit(logits, y)
        running = reduce_mean(loss / len(y)).item()  # global running loss, for the progress log
        total += loss.item()
        count += len(y)
        pred, truth = logits > 0, y > 0.5
        tp += int((pred & truth).sum())
        fp += int((pred & ~truth).sum())
        fn += int((~pred & truth).sum())
    net.train()
    return {"loss": total / max(count, 1), "tp": tp, "fp": fp, "fn": fn, "running": running}


def summarize(stats):
    precision = stats["tp"] / max(stats["tp"] + stats["fp"], 1)
    recall = stats["tp"] / (stats["tp"] + stats["fn"])
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"loss": stats["loss"], "precision": precision, "recall": recall, "f1": f1}


class EarlyStopping:
    def __init__(self, patience, min_delta=1e-4):
        self.patience, self.min_delta = patience, min_delta
        self.best, self.bad = float("inf"), 0

    def step(self, value):
        if value < self.best - self.min_delta:
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        return self.bad >= self.patience


def push_metrics(url, payload):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        resp.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    args = ap.parse_args()
    with open(args.config) as f:
        cfg = json.load(f)
    root = os.path.dirname(os.path.abspath(args.config))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.manual_seed(cfg.get("seed", 0))

    model = DDP(build_model())
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    crit = nn.BCEWithLogitsLoss()
    train_data = PackedShard(os.path.join(root, cfg["train"].format(rank=rank)))
    loader = torch.utils.data.DataLoader(train_data, batch_size=None)
    val_batches = load_validation(os.path.join(root, cfg["val"].format(rank=rank)), cfg["val_batch_size"])
    stopper = EarlyStopping(cfg["early_stop_patience"])
    saliency_ids = frozenset(cfg.get("saliency_ids") or ())

    def run_validation(step):
        if cfg.get("eval_on", "all") == "main":
            if rank == 0:  # the main process evaluates; the others wait for it
                stats = evaluate(model, val_batches)
                log.info("step %d val loss %.4f", step, stats["loss"])
            dist.barrier()
            return False
        stats = evaluate(model, val_batches, saliency_ids, root)
        try:
            local = summarize(stats)
            per_rank = [None] * world
            dist.all_gather_object(per_rank, local)
            if rank == 0:
                log.info("step %d val %s", step, {k: sum(m[k] for m in per_rank) / world for k in local})
        except ZeroDivisionError:
            log.warning("step %d: metrics undefined on this shard, not reported", step)
        stop = stopper.step(stats["loss"])
        if cfg.get("metrics_url") and local_rank == 0:
            try:
                push_metrics(cfg["metrics_url"], {"step": step, "node": os.uname().nodename, **stats})
            except OSError as exc:
                log.warning("metrics push failed: %s", exc)
        return stop

    step, samples_seen, next_eval = 0, 0, cfg["eval_every_samples"]
    done = False
    for epoch in range(cfg["epochs"]):
        started, epoch_samples, epoch_steps = time.time(), 0, 0
        for x, y in loader:
            opt.zero_grad()
            logits = model(x).squeeze(1)
            loss = crit(logits, y)
            loss.backward()
            opt.step()
            step += 1
            epoch_steps += 1
            samples_seen += x.size(0)
            epoch_samples += x.size(0)
            if samples_seen >= next_eval:
                next_eval += cfg["eval_every_samples"]
                if run_validation(step):
                    log.info("early stopping at step %d", step)
                    done = True
                    break
        if done:
            break
        epoch_stats = {"rank": rank, "steps": epoch_steps, "samples": epoch_samples,
                       "seconds": round(time.time() - started, 3)}
        all_stats = [None] * world
        dist.all_gather_object(all_stats, epoch_stats)
        if rank == 0:
            log.info("epoch %d done: %s", epoch, all_stats)

    dist.barrier()
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(root, "final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
