"""The blind sharded / multi-dimensional parallel set's scenarios: how each is set up on the test cluster, started,
and held hung.

Each scenario is bench/blind/sharded/train.py (FSDP2 over a 4x2 ("dp", "cp") device mesh, context parallel K/V
exchange, MoE expert parallel all_to_all, gloo, 4 nodes x 2 ranks, torchrun on every node of a
tests/support/cluster.py cluster) with the data shards (and a flag) that make one rank diverge some steps into a run
that was going well. `live(cluster, spec)` starts it, returns once it is hung for good (every waiting rank's main
thread still in one call, seen the same twice, and the culprit's threads unchanged for SETTLE seconds), and kills
everything in `finally`. What each scenario is is written in truth.json; nothing here reads hangscope's analysis.
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
# data/shard<D>.jsonl for data-parallel index D (ranks 2D and 2D+1, the cp pair, on one node); each batch is 4
# sequences of 24 tokens; cp rank 0 takes tokens 0-11, cp rank 1 tokens 12-23. Every half holds a token of each
# residue mod 4 (every expert gets tokens, every rank sends tokens to its expert-parallel peer) unless edited.

HALF = 12


def _tok(rng: random.Random, residue: int) -> int:
    return rng.randrange(1, VOCAB // 4) * 4 + residue


def batch(rng: random.Random) -> Dict[str, Any]:
    ids = []
    for _ in range(4):
        row = [_tok(rng, rng.randrange(4)) for _ in range(2 * HALF)]
        for half in (0, 1):
            for r in range(4):
                row[half * HALF + r] = _tok(rng, r)
        ids.append(row)
    y = [round(sum(r) / (len(r) * VOCAB) - 0.5, 4) for r in ids]
    return {"ids": ids, "y": y}


def write_shards(ctx: Ctx, edit: Callable[[int, int, Dict[str, Any], random.Random], None],
                 count: Callable[[int], int] = lambda d: BATCHES) -> None:
    folder = ctx.workdir / "data"
    folder.mkdir(exist_ok=True)
    for d in range(NODES):
        rng = random.Random(d * 7919 + 17)
        lines = []
        for step in range(count(d)):
            b = batch(rng)
            edit(d, step, b, rng)
            lines.append(json.dumps(b, separators=(",", ":")))
        (folder / f"shard{d}.jsonl").write_text("\n".join(lines) + "\n")


def _same(d: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
    return None


def prep_save(ctx: Ctx) -> None:
    write_shards(ctx, _same)
    ctx.notes.append("--save-step 4: after step 4 rank 0 alone gathers the full state dict (get_model_state_dict, "
                     "full_state_dict) and the others go on to the barrier after the checkpoint")


def prep_local_route(ctx: Ctx) -> None:
    def edit(d: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
        if d == 1 and step == 5:
            for row in b["ids"]:
                row[HALF:] = [_tok(rng, 2 + (i % 2)) for i in range(HALF)]

    write_shards(ctx, edit)
    ctx.notes.append("shard1 batch 5: the second half (rank 3's) holds only tokens of experts 2 and 3, which rank 3 "
                     "hosts: its MoE sends nothing to its expert-parallel peer and returns before the token-count "
                     "all_to_all_single; rank 2 waits in it")


def prep_spike(ctx: Ctx) -> None:
    def edit(d: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
        if d == 2 and step == 6:
            b["y"][0] = 20.0
            for row in b["ids"]:
                row[HALF:] = [0] * HALF
            b["ids"][0][HALF:HALF + 4] = [_tok(rng, r) for r in range(4)]

    write_shards(ctx, edit)
    ctx.notes.append("shard2 batch 6: label 20 (others within +-0.5) and the second half nearly all padding: rank "
                     "4's token-weighted loss exceeds the spike limit (50), rank 5's does not; rank 4 alone skips "
                     "the step after backward (no cp gradient all_reduce, no clip) and goes on to step 7's token "
                     "all_reduce")


def prep_nan_weight(ctx: Ctx) -> None:
    def edit(d: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
        b["w"] = [[1.0] * (2 * HALF) for _ in b["ids"]]
        if d == 3 and step == 6:
            b["w"][1][3] = float("nan")

    write_shards(ctx, edit)
    ctx.notes.append("shard3 batch 6: one token weight is NaN in the first half (rank 6's): rank 6's loss is NaN, "
                     "after the step it alone calls model.unshard() (FSDP all_gather over its dp group) to find "
                     "broken weights; the others go on to step 7's token all_reduce")


def prep_empty_half(ctx: Ctx) -> None:
    def edit(d: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
        if d == 2 and step == 5:
            for row in b["ids"]:
                row[HALF:] = [0] * HALF

    write_shards(ctx, edit)
    ctx.notes.append("shard2 batch 5: the second half of every sequence is padding: rank 5's attention returns "
                     "early without the K/V exchange (batch_isend_irecv with its cp peer); rank 4 waits in the "
                     "receive, rank 5 goes on to the MoE token-count all_to_all_single")


def prep_unused_expert(ctx: Ctx) -> None:
    def edit(d: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
        if d == 0 and step == 6:
            for row in b["ids"]:
                for half in (0, 1):
                    row[half * HALF:(half + 1) * HALF] = [_tok(rng, i % 3) for i in range(HALF)]

    write_shards(ctx, edit)
    ctx.notes.append("shard0 batch 6 has no token of expert 3 (hosted by rank 1): its weight and bias get no "
                     "gradient on rank 1, which skips their all_reduce over the expert-data-parallel group "
                     "{1,3,5,7}; ranks 3,5,7 wait in it, rank 1 goes on to clip_grad_norm_'s all_reduce")


def prep_accumulate(ctx: Ctx) -> None:
    def edit(d: int, step: int, b: Dict[str, Any], rng: random.Random) -> None:
        if d == 1 and step == 9:
            for row in b["ids"]:
                row[6:HALF] = [0] * (HALF - 6)

    write_shards(ctx, edit, count=lambda d: 2 * BATCHES)
    ctx.notes.append("--accum-tokens 96; shard1 micro-batch 9 has half of its first half padded: rank 2 (24 tokens) "
                     "needs a third micro-batch for step 4 while rank 3 and all others take two; the others "
                     "reduce_scatter (set_requires_gradient_sync True) on micro-batch 9, rank 2 does not and goes on "
                     "to micro-batch 10's token all_reduce")


def prep_uneven(ctx: Ctx) -> None:
    write_shards(ctx, _same, count=lambda d: 7 if d == 3 else BATCHES)
    ctx.notes.append("shard3 holds 7 batches, the others 40: ranks 6 and 7 end the epoch after step 6 and run the "
                     "evaluation forward (FSDP all_gather over their dp groups); the others wait in step 7's token "
                     "all_reduce")


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
    Spec("full_state_dict_rank0_only", (0,), "", ["--save-step", "4"], prepare=prep_save),
    Spec("moe_dispatch_skipped_all_local", (3,), "", prepare=prep_local_route),
    Spec("loss_spike_skip_local", (4,), "", prepare=prep_spike),
    Spec("nan_check_unshard_one_rank", (6,), "", prepare=prep_nan_weight),
    Spec("cp_kv_exchange_skipped_empty_half", (5,), "", prepare=prep_empty_half),
    Spec("expert_grad_none_allreduce_skipped", (1,), "", prepare=prep_unused_expert),
    Spec("accumulation_token_budget_sync_drift", (2,), "", ["--accum-tokens", "96"], prepare=prep_accumulate),
    Spec("uneven_dp_shard_eval_allgather", (6, 7), "", prepare=prep_uneven),
]
BY_NAME = {s.name: s for s in SPECS}


def _start(ctx: Ctx) -> Job:
    spec = ctx.spec
    args = ["--workdir", str(ctx.workdir), *spec.args]
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
