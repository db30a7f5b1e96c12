"""A small data-parallel gloo job (torchrun, CPU) whose ranks call collectives that do not match, on one rank, at
one step: the blind groups set (bench/blind/groups/run.py runs it on 4 nodes x 2 ranks).

Every step: forward, backward, the scenario's own communication (a subgroup's statistics all_reduce, a pipeline
boundary send/recv, a halo exchange, a schedule broadcast...), then the gradient all_reduce on the world. At step
--hang-step the rank --culprit makes the scenario's mistake (--scenario):

  wrong_group             it averages its gradients over the subgroup dp_half [0,1,2,3] instead of the world
  gather_vs_reduce        it takes the all_gather path for the gradients, the others all_reduce
  swapped_order           it calls the tp_b [4,5,6,7] statistics all_reduce before the tp_a [2,3,4,5] one
  p2p_wrong_peer          the even rank of a boundary pair receives from rank-2 instead of rank-1
  p2p_both_recv           the halo exchange between ranks 1 and 2: rank 1 receives first (so do both)
  extra_barrier_rank0     rank 0 saves a checkpoint and calls dist.barrier() in its rank-0-only branch
  subgroup_skipped        a member of moe [4,5,6,7] skips the group's aux all_reduce and goes on
  broadcast_src           the schedule broadcast: it passes its own rank as src, the others 0
  new_group_late          it creates a new process group (lazily, for evaluation) that nobody else creates
  same_ranks_other_group  it all_reduces its gradients on `metrics`, a world-sized group, the others on the world

--fr: the Flight Recorder is readable: each rank re-executes itself once, before importing torch, with its own
TORCH_WORKER_SERVER_SOCKET (WORKDIR/sock/rankR.sock; tools read a rank's environment from /proc/PID/environ), and
trains inside torch.distributed.elastic.control_plane.worker_main(); TORCH_FR_BUFFER_SIZE comes from the
launcher's environment.

For the harness (never read by the training logic): with env HANGSCOPE_READY_FILE every rank appends one JSON
line at the start of step --ready-step (the format tests/support/jobs.py reads); at the hang step every rank
appends to WORKDIR/entered.jsonl a line naming each communication call just before it makes it; rank 0 appends
`step N time` to WORKDIR/steps.log after each completed step.
"""

from __future__ import annotations

import os
import sys


def _fr_reexec() -> None:
    """Once, before torch is imported: this rank's own worker-server socket, in the environment it runs with."""
    if "--fr" not in sys.argv or os.environ.get("TORCH_WORKER_SERVER_SOCKET"):
        return
    workdir = sys.argv[sys.argv.index("--workdir") + 1]
    folder = os.path.join(workdir, "sock")
    os.makedirs(folder, exist_ok=True)
    os.environ["TORCH_WORKER_SERVER_SOCKET"] = os.path.join(folder, f"rank{os.environ['RANK']}.sock")
    os.execv(sys.executable, [sys.executable, *sys.argv])


_fr_reexec()

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Dict, List, Optional  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

TIMEOUT = timedelta(hours=1)
BATCH, FEATURES = 8, 16
SCENARIOS = ("wrong_group", "gather_vs_reduce", "swapped_order", "p2p_wrong_peer", "p2p_both_recv",
             "extra_barrier_rank0", "subgroup_skipped", "broadcast_src", "new_group_late", "same_ranks_other_group")
# the groups every rank creates at start, in this order (new_group is collective over the world)
GROUPS: Dict[str, List[tuple]] = {
    "wrong_group": [("dp_half", [0, 1, 2, 3])],
    "swapped_order": [("tp_a", [2, 3, 4, 5]), ("tp_b", [4, 5, 6, 7])],
    "subgroup_skipped": [("moe", [4, 5, 6, 7])],
    "same_ranks_other_group": [("metrics", None)],
}


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Marks:
    """The harness's files: the ready line, the calls entered at the hang step, rank 0's completed steps."""

    def __init__(self, workdir: str, hang_step: int) -> None:
        self.workdir, self.hang_step, self.step = workdir, hang_step, 0

    def ready(self, step: int) -> None:
        path = os.environ.get("HANGSCOPE_READY_FILE")
        if path:
            _append(path, json.dumps({"rank": dist.get_rank(), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                                      "pid": os.getpid(), "host": socket.gethostname(), "step": step,
                                      "where": "step"}))

    def enter(self, what: str) -> None:
        if self.step == self.hang_step:
            _append(os.path.join(self.workdir, "entered.jsonl"),
                    json.dumps({"rank": dist.get_rank(), "step": self.step, "in": what}))

    def done(self, step: int) -> None:
        if dist.get_rank() == 0:
            _append(os.path.join(self.workdir, "steps.log"), f"{step} {time.time():.3f}")


def synthetic_batch(rank: int, step: int) -> tuple:
    gen = torch.Generator().manual_seed(rank * 100003 + step)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    return x, x.sum(dim=1, keepdim=True) * 0.1


class Comms:
    """The scenario's communication around the gradient all_reduce; `bug` is true on the culprit at the hang step."""

    def __init__(self, scenario: str, groups: Dict[str, object], marks: Marks, workdir: str) -> None:
        self.scenario, self.groups, self.marks, self.workdir = scenario, groups, marks, workdir
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.eval_group: Optional[object] = None

    def _members(self, name: str) -> List[int]:
        return dist.get_process_group_ranks(self.groups[name])  # type: ignore[arg-type]

    def all_reduce(self, t: torch.Tensor, name: str = "world") -> None:
        self.marks.enter(f"all_reduce:{name}")
        dist.all_reduce(t, group=None if name == "world" else self.groups[name])  # type: ignore[arg-type]

    # --- before the gradient sync ---------------------------------------------------------------------------
    def before_sync(self, step: int, bug: bool, model: nn.Module) -> None:
        s, r = self.scenario, self.rank
        if s == "swapped_order":  # tensor-parallel statistics: tp_a's first, then tp_b's
            stats = torch.full((64,), float(step))
            order = ["tp_a", "tp_b"] if not bug else ["tp_b", "tp_a"]
            for name in order:
                if r in self._members(name):
                    self.all_reduce(stats, name)
        elif s == "subgroup_skipped":  # the experts' aux loss, over the expert group
            if r in self._members("moe") and not bug:
                aux = torch.full((64,), float(r))
                self.all_reduce(aux, "moe")
        elif s == "p2p_wrong_peer":  # pipeline boundaries: 1 -> 2, 3 -> 4, 5 -> 6
            act = torch.full((64,), float(r))
            if r in (1, 3, 5):
                self.marks.enter(f"send:{r + 1}")
                dist.send(act, r + 1)
            elif r in (2, 4, 6):
                src = r - 1 if not bug else r - 2
                self.marks.enter(f"recv:{src}")
                dist.recv(act, src)
        elif s == "p2p_both_recv":  # a halo exchange between ranks 1 and 2: 1 sends first, 2 receives first
            if r in (1, 2):
                peer = 3 - r
                mine, theirs = torch.full((64,), float(r)), torch.zeros(64)
                send_first = (r == 1) != bug
                for op in (("send", "recv") if send_first else ("recv", "send")):
                    self.marks.enter(f"{op}:{peer}")
                    if op == "send":
                        dist.send(mine, peer)
                    else:
                        dist.recv(theirs, peer)
        elif s == "broadcast_src":  # the LR schedule's state, from rank 0
            sched = torch.full((64,), float(step) if r == 0 else 0.0)
            self.marks.enter("broadcast:world")
            dist.broadcast(sched, src=0 if not bug else r)
        elif s == "extra_barrier_rank0" and bug:  # rank 0 checkpoints, and waits "until the file is visible"
            torch.save(model.state_dict(), os.path.join(self.workdir, "ckpt.pt"))
            self.marks.enter("barrier:world")
            dist.barrier()
        elif s == "new_group_late" and bug:  # its evaluation branch makes the eval group the first time it runs
            self.marks.enter("new_group")
            self.eval_group = dist.new_group(timeout=TIMEOUT, group_desc="eval")

    # --- the gradient sync ----------------------------------------------------------------------------------
    def grad_sync(self, flat: torch.Tensor, bug: bool) -> None:
        s = self.scenario
        if bug and s == "wrong_group":
            self.all_reduce(flat, "dp_half")
        elif bug and s == "same_ranks_other_group":
            self.all_reduce(flat, "metrics")
        elif bug and s == "gather_vs_reduce":
            parts = [torch.zeros_like(flat) for _ in range(self.world)]
            self.marks.enter("all_gather:world")
            dist.all_gather(parts, flat)
            flat.copy_(torch.stack(parts).sum(dim=0))
        else:
            self.all_reduce(flat)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--scenario", choices=SCENARIOS, required=True)
    p.add_argument("--culprit", type=int, required=True)
    p.add_argument("--hang-step", type=int, default=3)
    p.add_argument("--ready-step", type=int, default=2)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--fr", action="store_true", help="train inside worker_main() (the Flight Recorder readable)")
    return p.parse_args(argv)


def train(args: argparse.Namespace) -> int:
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank = dist.get_rank()
    groups = {name: dist.new_group(ranks, timeout=TIMEOUT, group_desc=name)
              for name, ranks in GROUPS.get(args.scenario, [])}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    marks = Marks(args.workdir, args.hang_step)
    comms = Comms(args.scenario, groups, marks, args.workdir)
    for step in range(args.steps):
        marks.step = step
        if step == args.ready_step:
            marks.ready(step)
        bug = rank == args.culprit and step == args.hang_step
        inputs, targets = synthetic_batch(rank, step)
        opt.zero_grad()
        loss = F.mse_loss(model(inputs), targets)
        loss.backward()
        comms.before_sync(step, bug, model)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        comms.grad_sync(flat, bug)
        flat /= dist.get_world_size()
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        opt.step()
        marks.done(step)
        time.sleep(0.05)
    dist.destroy_process_group()
    return 0


def main() -> int:
    args = parse_args()
    if args.fr:
        from torch.distributed.elastic.control_plane import worker_main

        with worker_main():
            return train(args)
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
