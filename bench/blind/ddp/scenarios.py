"""The blind DDP/autograd set's scenarios: how each one is set up on the test cluster, started, and held hung.

Each scenario is bench/blind/ddp/train.py (a gloo job, 4 nodes x 2 ranks, torchrun on every node of a
tests/support/cluster.py cluster) with one training recipe (--recipe) and the data shards that make one rank diverge
inside the data-parallel / autograd / optimizer machinery some steps into a run that was going well, while the others
go on to the next collective and wait for it. `live(cluster, spec)` starts it, returns once it is hung for good
(wait-until logic, copied from bench/blind/steady: every waiting rank's main thread still in one call, seen the same
twice, and the culprit's threads unchanged for SETTLE seconds; never a sleep that hopes), and kills everything in
`finally` (the job, the shared folder).

What each scenario is (the culprit, the blocking call, what it waits for, why) is written in truth.json, from this
set-up; nothing here reads how hangscope analyses a snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(REPO / "tests"), str(REPO / "tests" / "support")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cluster import Cluster, Node  # noqa: E402
from jobs import Job, _main_thread, start_job  # noqa: E402
from waiting import wait_until  # noqa: E402

TRAIN = HERE / "train.py"
NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE
START_TIMEOUT = 180.0  # seconds for torch to start on 8 ranks of a loaded 2-core machine
SETTLE = 3.0  # seconds the culprit's threads must sit unchanged to count as hung for good
SETTLE_TIMEOUT = 120.0
VOCAB = 1000
BATCHES = 40


def node_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE + 1:02d}"


@dataclass
class Ctx:
    """One scenario being set up and run: its cluster, its shared folder, the job."""

    cluster: Cluster
    spec: "Spec"
    workdir: Path
    stack: contextlib.ExitStack
    job: Optional[Job] = None
    notes: List[str] = field(default_factory=list)  # what the set-up did, for the record (pids)
    extra: Dict[str, Any] = field(default_factory=dict)

    def node(self, name: str) -> Node:
        return self.cluster[name]

    def host_pid(self, rank: int) -> int:
        assert self.job is not None
        return self.job.ranks[rank].host_pid


@dataclass
class Spec:
    name: str
    culprits: tuple  # the rank that hangs (truth.json has the same)
    recipe: str  # train.py --recipe
    args: List[str] = field(default_factory=list)
    prepare: Optional[Callable[[Ctx], None]] = None  # writes the data shards before the job starts
    polls: bool = False  # unused here (kept from steady's machinery)


# --- the data ------------------------------------------------------------------------------------------------------

def batch(rng: random.Random, rows: int = 8, width: int = 12) -> Dict[str, Any]:
    ids = [[rng.randrange(VOCAB) for _ in range(width)] for _ in range(rows)]
    y = [round(sum(r) / (len(r) * VOCAB) - 0.5, 4) for r in ids]
    return {"ids": ids, "y": y}


def write_shards(ctx: Ctx, edit: Callable[[int, int, Dict[str, Any], random.Random], Optional[Dict[str, Any]]],
                 count: Callable[[int], int] = lambda rank: BATCHES, name: str = "rank") -> None:
    """data/<name><R>.jsonl for every rank: `count(rank)` batches, each passed through edit(rank, step, batch, rng)
    (which may change it in place or return a replacement)."""
    folder = ctx.workdir / "data"
    folder.mkdir(exist_ok=True)
    for rank in range(WORLD):
        rng = random.Random(rank * 7919 + 17)
        lines = []
        for step in range(count(rank)):
            b = batch(rng)
            b = edit(rank, step, b, rng) or b
            lines.append(json.dumps(b, separators=(",", ":")))
        (folder / f"{name}{rank}.jsonl").write_text("\n".join(lines) + "\n")


def _same(rank: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
    return None


def prep_zero(ctx: Ctx) -> None:
    write_shards(ctx, _same)
    ctx.notes.append("every shard is fine: rank 0 alone calls ZeroRedundancyOptimizer.consolidate_state_dict(to=0) "
                     "at step 5 (the checkpoint is written by rank 0 only), the others go on to step 6")


def prep_epoch(ctx: Ctx) -> None:
    write_shards(ctx, _same, count=lambda rank: 23 if rank == 1 else BATCHES)
    ctx.notes.append("data/rank1.jsonl holds 23 batches, the others 40: rank 1's epoch ends at step 23 and it waits "
                     "in the end-of-epoch barrier while the others run step 23's DDP gradient all_reduce")


def prep_aux(ctx: Ctx) -> None:
    def edit(rank: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
        b["aux"] = [0] * len(b["y"])
        if rank == 2 and step == 6:
            b["aux"][3] = 1

    write_shards(ctx, edit)
    ctx.notes.append("data/rank2.jsonl batch 6 has one sample with an auxiliary label (no other batch of any rank "
                     "has one; rank 3, its tensor-parallel partner, reads its own shard): rank 2's backward runs the "
                     "tensor-parallel copy's all_reduce over {2, 3}; rank 3 never enters it")


def prep_robust(ctx: Ctx) -> None:
    def edit(rank: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
        if rank == 3 and step == 7:
            b["ids"][5][4] = 1187  # a record tokenised with a newer, larger vocabulary

    write_shards(ctx, edit)
    ctx.notes.append("data/rank3.jsonl batch 7 holds token id 1187 (the embedding has 1000 rows): rank 3's forward "
                     "raises IndexError, its loop logs it and skips the batch (no backward), so it is one DDP "
                     "reduction behind: at step 8's forward it broadcasts buffers while the others all_reduce step 7's "
                     "gradients")


def prep_experts(ctx: Ctx) -> None:
    def edit(rank: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
        if rank == 4 and step == 8:
            b["y"][2] = 250.0  # a label in the wrong unit

    write_shards(ctx, edit)
    ctx.notes.append("data/rank4.jsonl batch 8 has a label of 250 (the others are within +-0.5): rank 4's expert "
                     "gradient norm exceeds the threshold, so only rank 4 all_reduces it in clip_global_norm; the "
                     "others go on to step 9's forward (DDP buffer broadcast)")


def prep_pipeline(ctx: Ctx) -> None:
    write_shards(ctx, _same)

    def labels(rank: int, step: int, b: Dict[str, Any], rng: random.Random) -> Dict[str, Any]:
        out = {"y": b["y"]}
        if rank == 5 and step == 6:
            out["y"] = b["y"] + [0.01, -0.02]  # a label shard whose batch boundaries drifted: 10 rows
        return out

    write_shards(ctx, labels, name="labels")
    ctx.notes.append("data/labels5.jsonl batch 6 has 10 labels (the inputs of rank 4, its stage 0, have 8 rows): "
                     "rank 5 (stage 1) counts 5 micro-batches, rank 4 sends 4; rank 5 waits in recv for a 5th "
                     "activation while rank 4 and the others are in the step's loss all_reduce")


def prep_accumulate(ctx: Ctx) -> None:
    def edit(rank: int, step: int, b: Dict[str, Any], rng: random.Random) -> Dict[str, Any]:
        if rank == 6 and step == 8:
            b = batch(rng, width=20)  # a bucket of long sequences: 160 tokens in one micro-batch
        b["mask"] = [[1] * len(r) for r in b["ids"]]
        return b

    write_shards(ctx, edit, count=lambda rank: 2 * BATCHES)
    ctx.notes.append("data/rank6.jsonl micro-batch 8 holds 8 x 20 tokens (the others 8 x 12): rank 6 reaches the "
                     "150-token budget in one micro-batch and all_reduces gradients in that backward (DDP) while the "
                     "others, budget not reached, go on to micro-batch 9 and all_gather its token counts")


def prep_adaptive(ctx: Ctx) -> None:
    def edit(rank: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
        b["depth"] = 6 if (rank == 7 and step == 3) else 2

    write_shards(ctx, edit)
    ctx.notes.append("data/rank7.jsonl batch 3 asks for depth 6 (all other batches 2): rank 7's refinement block "
                     "runs 4 more times, so its backward-hook call count reaches 20 at step 7, not step 9: its hook "
                     "all_gathers gradient norms while the others all_reduce step 7's gradients (DDP)")


# --- hung for good --------------------------------------------------------------------------------------------

Sample = Tuple[str, str, int, int]
# threads that wake up on their own in a hung rank: gloo's transport loop sits in epoll_wait with a timeout;
# left out of the settle check (x86_64: epoll_wait, epoll_pwait)
POLLING = {"232", "281"}


def _task(path: str) -> Optional[Sample]:
    try:
        stat = Path(f"{path}/stat").read_text().rsplit(")", 1)[1].split()
        syscall = Path(f"{path}/syscall").read_text().split()[0]
        status = Path(f"{path}/status").read_text()
    except (OSError, IndexError):
        return None
    switches = sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
    return stat[0], syscall, int(stat[11]) + int(stat[12]), switches


def threads_of(pid: int) -> Dict[str, Sample]:
    out: Dict[str, Sample] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            sample = _task(f"/proc/{pid}/task/{tid}")
            if sample is not None and sample[1] not in POLLING:
                out[tid] = sample
    return out


def all_still(ctx: Ctx, timeout: float) -> None:
    """Until every rank's main thread (but a polling culprit's) sits in one system call, seen the same twice
    0.5 s apart."""
    assert ctx.job is not None
    seen: Dict[int, Any] = {}
    skip = set(ctx.spec.culprits) if ctx.spec.polls else set()

    def still() -> bool:
        ok = True
        for rank, loc in ctx.job.ranks.items():
            sample = _main_thread(loc.host_pid)
            if sample is None:
                raise RuntimeError(f"{ctx.spec.name}: rank {rank} exited:\n{ctx.job.log_tail()}")
            if rank in skip:
                continue
            ok = ok and seen.get(rank) == sample and sample[1] != "running"
            seen[rank] = sample
        return ok

    wait_until(still, timeout, "every waiting rank's main thread to sit still in one call", interval=0.5)


def wait_settled(ctx: Ctx) -> None:
    """Until the culprit's threads are unchanged for SETTLE seconds."""
    spec = ctx.spec
    seen: Dict[int, Tuple[Dict[str, Sample], float]] = {}

    def settled() -> bool:
        now, ok = time.monotonic(), True
        for rank in spec.culprits:
            pid = ctx.host_pid(rank)
            if _main_thread(pid) is None:
                raise RuntimeError(f"{spec.name}: rank {rank} exited:\n{ctx.job.log_tail() if ctx.job else ''}")
            sample = threads_of(pid)
            if rank not in seen or seen[rank][0] != sample:
                seen[rank] = (sample, now)
            ok = ok and now - seen[rank][1] >= SETTLE
        return ok

    try:
        wait_until(settled, SETTLE_TIMEOUT, "the culprit's threads to settle", interval=0.25)
    except TimeoutError as exc:
        moving = {r: threads_of(ctx.host_pid(r)) for r in spec.culprits}
        raise TimeoutError(f"{exc}: {moving}") from None


def wait_polling(ctx: Ctx) -> None:
    """A polling culprit: alive, and seen asleep between two polls (clock_nanosleep, x86_64 230) within 10 s."""
    spec = ctx.spec

    def asleep() -> bool:
        ok = True
        for rank in spec.culprits:
            sample = _main_thread(ctx.host_pid(rank))
            if sample is None:
                raise RuntimeError(f"{spec.name}: rank {rank} exited:\n{ctx.job.log_tail() if ctx.job else ''}")
            ok = ok and sample[1] == "230"
        return ok

    wait_until(asleep, 10, "the polling culprit asleep between two polls", interval=0.1)


# --- the scenarios ------------------------------------------------------------------------------------------------

SPECS: List[Spec] = [
    Spec("zero_consolidate_rank0_only", (0,), "zero", prepare=prep_zero),
    Spec("uneven_shard_no_join", (1,), "epoch", prepare=prep_epoch),
    Spec("tp_backward_allreduce_partner_skipped", (2,), "aux", prepare=prep_aux),
    Spec("forward_error_skipped_backward", (3,), "robust", prepare=prep_robust),
    Spec("clip_norm_allreduce_local_condition", (4,), "experts", prepare=prep_experts),
    Spec("pipeline_extra_microbatch_recv", (5,), "pipeline", prepare=prep_pipeline),
    Spec("token_budget_accumulation_early_sync", (6,), "accumulate", prepare=prep_accumulate),
    Spec("backward_hook_gather_counter_drift", (7,), "adaptive", prepare=prep_adaptive),
]
BY_NAME = {s.name: s for s in SPECS}


def _start(ctx: Ctx) -> Job:
    spec = ctx.spec
    args = ["--recipe", spec.recipe, "--workdir", str(ctx.workdir), *spec.args]
    # the job's name (Job.scenario) names nothing the nodes see; the workdir below is neutral too
    return start_job(ctx.cluster, "blind", nodes=NODES, ranks_per_node=RANKS_PER_NODE,
                     timeout=START_TIMEOUT, extra_args=args, wait=False, script=TRAIN)


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    """The scenario's job, hung for good; everything it started is killed and removed on exit."""
    with contextlib.ExitStack() as stack:
        # a neutral name: the headline may quote paths under it, and the scenario's name holds scoring words
        workdir = Path(tempfile.mkdtemp(prefix="hangscope-blind-job-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir, stack)
        if spec.prepare is not None:
            spec.prepare(ctx)
        ctx.job = _start(ctx)
        stack.callback(ctx.job.stop)
        all_still(ctx, timeout=120)
        if spec.polls:
            wait_polling(ctx)
        else:
            wait_settled(ctx)
        for culprit in spec.culprits:  # the culprit is where the set-up put it: alive
            if _main_thread(ctx.host_pid(culprit)) is None:
                raise RuntimeError(f"{spec.name}: rank {culprit} exited:\n{ctx.job.log_tail()}")
        ctx.notes.append(f"culprit host pid(s): {[ctx.host_pid(r) for r in spec.culprits]}")
        yield ctx
