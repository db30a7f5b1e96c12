"""The blind pipeline-parallel set's scenarios: how each one is set up on the test cluster, started, and held hung.

Each scenario is bench/blind/pipeline/train.py (a gloo job, 4 nodes x 2 ranks = 4 pipeline stages x 2 data-parallel
replicas, torchrun on every node of a tests/support/cluster.py cluster) with one trainer configuration and the data
(and node services) the set-up puts around it, so that the pipeline hangs. `live(cluster, spec)` starts it, returns once it is hung for good (every rank's main
thread still in one call, seen the same twice, and the culprit's threads unchanged for SETTLE seconds; no sleep
that hopes), and kills everything in `finally` (the job, the node services, the shared folder).

What each scenario is (the culprit, the blocking call, what it waits for) is in truth.json and README.md; nothing
here reads how hangscope analyses a snapshot. Nothing the nodes see names a scenario: the job runs from a
neutral folder (/tmp/hangscope-blind-job-XXXX) with configuration flags a real trainer has.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
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
from jobs import PYTHON, Job, _main_thread, start_job  # noqa: E402
from waiting import wait_until  # noqa: E402

TRAIN = HERE / "train.py"
NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE
START_TIMEOUT = 240.0  # seconds for torch to start on 8 ranks of a loaded 2-core machine
SETTLE = 3.0  # seconds the culprit's threads must sit unchanged to count as hung for good
SETTLE_TIMEOUT = 120.0
VOCAB = 1000
BATCHES = 40
ROWS, SEQ = 8, 16
PP, DP = 4, 2


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
    extra: Dict[str, Any] = field(default_factory=dict)  # "dump": host pids of node services for run.py --check

    def node(self, name: str) -> Node:
        return self.cluster[name]

    def host_pid(self, rank: int) -> int:
        assert self.job is not None
        return self.job.ranks[rank].host_pid


@dataclass
class Spec:
    name: str
    culprits: tuple  # the rank(s) that hang (truth.json has the same)
    args: List[str]  # train.py's configuration
    prepare: Optional[Callable[[Ctx], None]] = None  # before the job starts: data, files, node services


# --- the data ---------------------------------------------------------------------------------------------------

Edit = Callable[[int, int, Dict[str, Any]], None]


def write_data(ctx: Ctx, inputs: Optional[Edit] = None, targets: Optional[Edit] = None,
               skip: Tuple[str, ...] = ()) -> None:
    """data/inputs-<replica>.jsonl (token ids, what stage 0 reads) and data/targets-<replica>.jsonl (targets and
    their mask, what the last stage reads): BATCHES batches of ROWS x SEQ each, each passed through the edits
    (edit(replica, index, batch)); files named in `skip` are left for the set-up."""
    folder = ctx.workdir / "data"
    folder.mkdir(exist_ok=True)
    for replica in range(DP):
        rng = random.Random(replica * 7919 + 17)
        ins, outs = [], []
        for index in range(BATCHES):
            ids = [[rng.randrange(VOCAB) for _ in range(SEQ)] for _ in range(ROWS)]
            b_in = {"ids": ids}
            b_out = {"target": [[round(t / VOCAB - 0.5, 4) for t in row] for row in ids],
                     "mask": [[1] * SEQ for _ in range(ROWS)]}
            if inputs is not None:
                inputs(replica, index, b_in)
            if targets is not None:
                targets(replica, index, b_out)
            ins.append(json.dumps(b_in, separators=(",", ":")))
            outs.append(json.dumps(b_out, separators=(",", ":")))
        for name, lines in ((f"inputs-{replica:02d}.jsonl", ins), (f"targets-{replica:02d}.jsonl", outs)):
            if name not in skip:
                (folder / name).write_text("\n".join(lines) + "\n")


def tool(ctx: Ctx, name: str, source: str) -> Path:
    """A small program of the node's own (a service the job uses), under the job's folder."""
    folder = ctx.workdir / "tools"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(source)
    return path


def service(ctx: Ctx, node: Node, argv: List[str], ready_line: str) -> int:
    """Start a long-running process on `node` (not part of the job), wait for its ready line; its host pid.
    Killed (with its nsenter) when the scenario ends."""
    proc = node.spawn(argv, stdout=subprocess.PIPE, stdin=subprocess.PIPE)

    def stop() -> None:
        if host:
            with contextlib.suppress(ProcessLookupError):
                os.kill(host, signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=15)
        for f in (proc.stdout, proc.stdin):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()

    host = 0
    ctx.stack.callback(stop)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode(errors="replace").strip()
    if line != ready_line:
        raise RuntimeError(f"{argv} did not start on {node.name}: {line!r}")
    host = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    ctx.extra.setdefault("dump", []).append(host)
    return host


# --- the set-ups ------------------------------------------------------------------------------------------------

def prep_ragged(ctx: Ctx) -> None:
    def edit(replica: int, index: int, b: Dict[str, Any]) -> None:
        if replica == 1 and index == 5:  # the tail of a packed file: 6 rows, not 8
            b["ids"] = b["ids"][:6]

    write_data(ctx, inputs=edit)
    ctx.notes.append("data/inputs-01.jsonl batch 6 holds 6 rows (the others 8): at step 6 rank 1 (stage 0, replica 1) "
                     "splits it into ceil(6/2) = 3 microbatches while stages 1-3 take batch_size // "
                     "micro_batch_size = 4; rank 1 sends 3 activations and waits in recv of microbatch 2's "
                     "gradient from rank 3; rank 3 waits in recv of a 4th activation from rank 1 (a p2p cycle); "
                     "ranks 5, 7 wait in recv from their previous stage; replica 0 waits in the DP all_reduce")


def prep_plain(ctx: Ctx) -> None:
    write_data(ctx)
    ctx.notes.append("every data file is fine (40 batches of 8 x 16 tokens)")


def prep_schedule(ctx: Ctx) -> None:
    prep_plain(ctx)
    ctx.notes.append("--schedule auto --layer-split 2,2,3,1 --activation-budget-kb 320: stage 2 (ranks 4, 5, 3 "
                     "layers: 384 KB of GPipe activations) picks 1F1B, the other stages (256/128 KB) GPipe. At step "
                     "1 stage 2 (1F1B, warm-up 1) forwards microbatches 0 and 1, then waits in recv of microbatch "
                     "0's gradient from stage 3 (ranks 6, 7); stage 3 (GPipe) waits in recv of microbatch 2's "
                     "activation from stage 2 (a p2p cycle)")


def prep_masked(ctx: Ctx) -> None:
    def edit(replica: int, index: int, b: Dict[str, Any]) -> None:
        if replica == 1 and index == 4:  # rows 4-5 (microbatch 2) are padding only
            for row in (4, 5):
                b["mask"][row] = [0] * SEQ

    write_data(ctx, targets=edit)
    ctx.notes.append("data/targets-01.jsonl batch 5: rows 4-5 (microbatch 2) fully masked: at step 5 rank 7 (last "
                     "stage, replica 1) has no loss for microbatch 2, skips its backward and sends 3 gradients, not "
                     "4, to rank 5; rank 5 waits (--p2p batched: batch_isend_irecv's irecv Work.wait) for the 4th "
                     "gradient; rank 7 goes on (DP all_reduce with rank 6 done) and waits in recv of step 6's "
                     "first activation from rank 5")


def prep_budget(ctx: Ctx) -> None:
    def edit(replica: int, index: int, b: Dict[str, Any]) -> None:
        if replica == 1:  # right-padded: 12 real target tokens a row
            b["mask"] = [[1] * 12 + [0] * 4 for _ in range(ROWS)]

    write_data(ctx, targets=edit)
    ctx.notes.append("data/targets-01.jsonl rows are right-padded (96 real tokens a batch, replica 0's 128): with "
                     "--train-tokens 768 counted by the last stage of each replica, rank 6 (last stage, replica 0) "
                     "reaches 768 at step 6, leaves the loop and waits in the final dist.barrier() (world); the "
                     "other stages do not know of the budget: rank 7 waits in step 7's DP all_reduce with rank 6, "
                     "rank 4 in recv of step 7's gradient from rank 6, the rest behind them")


STREAM_TOOL = r'''
import json, os, random, sys
path, batches = sys.argv[1], int(sys.argv[2])
if not os.path.exists(path):
    os.mkfifo(path)
print("streaming", flush=True)
rng = random.Random(5)
out = open(path, "w")
for _ in range(batches):
    ids = [[rng.randrange(1000) for _ in range(16)] for _ in range(8)]
    out.write(json.dumps({"ids": ids}, separators=(",", ":")) + "\n")
    out.flush()
# the next batches come from the upstream tokenizer, on stdin
for line in sys.stdin:
    out.write(line)
    out.flush()
'''


def prep_stream(ctx: Ctx) -> None:
    write_data(ctx, skip=("inputs-00.jsonl",))
    script = tool(ctx, "stream_tokens.py", STREAM_TOOL)
    host = service(ctx, ctx.node("node01"), [PYTHON, str(script), str(ctx.workdir / "data" / "inputs-00.jsonl"),
                                             "7"], "streaming")
    ctx.notes.append(f"data/inputs-00.jsonl is a named pipe fed by a tokenizer stream on node01 (host pid {host}: "
                     "python stream_tokens.py data/inputs-00.jsonl 7) that wrote 7 batches and now waits for its "
                     "upstream on stdin (never answers), the pipe held open: at step 8 rank 0 (stage 0, replica 0) "
                     "blocks in read() of the FIFO in Shard.next (readline); rank 2 waits in recv of an activation "
                     "from rank 0, rank 1 in the DP all_reduce with rank 0, ranks 3-7 behind them")


def prep_frozen(ctx: Ctx) -> None:
    prep_plain(ctx)
    ctx.notes.append("--freeze-layers 2-3 (exactly stage 1's layers) --clip-grad 1.0: stage 1 (ranks 2, 3) has no "
                     "trainable parameter, so clip() returns before the global-norm all_reduce on the pipeline "
                     "group; stages 0, 2, 3 wait in that all_reduce (pipeline group) at step 1, ranks 2 and 3 in "
                     "recv of step 2's first activation from stage 0")

# --- hung for good ------------------------------------------------------------------------------------------------

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
    """Until every rank's main thread sits in one system call, seen the same twice 0.5 s apart."""
    assert ctx.job is not None
    seen: Dict[int, Any] = {}

    def still() -> bool:
        ok = True
        for rank, loc in ctx.job.ranks.items():
            sample = _main_thread(loc.host_pid)
            if sample is None:
                raise RuntimeError(f"{ctx.spec.name}: rank {rank} exited:\n{ctx.job.log_tail()}")
            ok = ok and seen.get(rank) == sample and sample[1] != "running"
            seen[rank] = sample
        return ok

    wait_until(still, timeout, "every rank's main thread to sit still in one call", interval=0.5)


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


# --- the scenarios ----------------------------------------------------------------------------------------------

def prep_metrics(ctx: Ctx) -> None:
    prep_plain(ctx)
    folder = ctx.workdir / "metrics"
    folder.mkdir()
    for rank in range(WORLD):
        if rank != 5:
            (folder / f"rank-{rank:05d}.jsonl").write_text("")
    os.mkfifo(folder / "rank-00005.jsonl")
    ctx.notes.append("metrics/rank-00005.jsonl is a named pipe (left by a live `tail`-style metrics forwarder whose "
                     "reader is gone), the other ranks' files are plain: with --metrics-dir metrics --log-every 5, "
                     "rank 5 (stage 2, replica 1) blocks at step 5 in open() of the FIFO for append (no reader); "
                     "rank 3 waits in recv of a gradient from rank 5 (or its send), rank 7 in recv of an activation "
                     "from rank 5, rank 4 in the DP all_reduce with rank 5, the rest behind them")


SPECS: List[Spec] = [
    Spec("ragged_batch_fewer_microbatches", (1,), [], prep_ragged),
    Spec("auto_schedule_1f1b_vs_gpipe", (4, 5),
         ["--schedule", "auto", "--layer-split", "2,2,3,1", "--activation-budget-kb", "320"], prep_schedule),
    Spec("last_stage_skips_masked_microbatch", (7,), ["--p2p", "batched"], prep_masked),
    Spec("token_budget_last_stage_stops", (6,), ["--train-tokens", "768"], prep_budget),
    Spec("stage0_reads_stalled_fifo", (0,), [], prep_stream),
    Spec("metrics_file_is_fifo_mid_stage", (5,), ["--metrics-dir", "METRICS", "--log-every", "5"], prep_metrics),
    Spec("frozen_stage_skips_clip_allreduce", (2, 3), ["--freeze-layers", "2-3", "--clip-grad", "1.0"], prep_frozen),
]
BY_NAME = {s.name: s for s in SPECS}

def _start(ctx: Ctx) -> Job:
    args = ["--workdir", str(ctx.workdir),
            *[str(ctx.workdir / "metrics") if a == "METRICS" else a for a in ctx.spec.args]]
    # the job's name (Job.scenario) names nothing the nodes see; the script runs from the neutral workdir (a copy),
    # not from this set's folder, whose path would name the set
    script = ctx.workdir / "train.py"
    shutil.copyfile(TRAIN, script)
    return start_job(ctx.cluster, "blind", nodes=NODES, ranks_per_node=RANKS_PER_NODE,
                     timeout=START_TIMEOUT, extra_args=args, wait=False, script=script)


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
        all_still(ctx, timeout=150)
        wait_settled(ctx)
        for culprit in spec.culprits:  # the culprit is where the set-up put it: alive
            if _main_thread(ctx.host_pid(culprit)) is None:
                raise RuntimeError(f"{spec.name}: rank {culprit} exited:\n{ctx.job.log_tail()}")
        ctx.notes.append(f"culprit host pid(s): {[ctx.host_pid(r) for r in spec.culprits]}")
        yield ctx
