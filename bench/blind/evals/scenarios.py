"""The blind evaluation/metrics/early-stopping set's scenarios: how each is set up on the test cluster, started and held
hung.

Each scenario is bench/blind/evals/train.py (copied into a neutral job folder), a gloo DDP job on 4 nodes x 2 ranks
(torchrun on every node of a tests/support/cluster.py cluster, static rendezvous at node01), with one config and the
data shards that make one rank leave the common path around validation, metrics or early stopping. `live(cluster,
spec)` writes the data, starts the job, returns once it is hung for good (every rank's main thread still in one call,
seen the same twice; the culprit's threads unchanged for SETTLE seconds: never a sleep that hopes), and kills
everything in `finally`. The wait-until machinery is adapted from bench/blind/ddp/scenarios.py; the launcher from
tests/support/record_scenarios.py's start_launchers_only (ranks found by the job's mark in their environment).

What each scenario is (culprit, blocking call, what it waits for) is written in truth.json, from this set-up.
"""

from __future__ import annotations

import contextlib
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
from jobs import MARK, PYTHON, Job, RankLoc, _free_port, _main_thread  # noqa: E402
from waiting import wait_until  # noqa: E402

TRAIN = HERE / "train.py"
AGENT = HERE / "metrics_agent.py"
NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE
START_TIMEOUT = 240.0
SETTLE = 3.0
SETTLE_TIMEOUT = 120.0
HANG_TIMEOUT = 240.0
FEATURES = 16
TRAIN_BATCHES, TRAIN_ROWS = 30, 8
VAL_ROWS = 80
AGENT_PORT = 9091


def node_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE + 1:02d}"


@dataclass
class Ctx:
    cluster: Cluster
    spec: "Spec"
    workdir: Path
    stack: contextlib.ExitStack
    job: Optional[Job] = None
    notes: List[str] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)

    def node(self, name: str) -> Node:
        return self.cluster[name]

    def host_pid(self, rank: int) -> int:
        assert self.job is not None
        return self.job.ranks[rank].host_pid


@dataclass
class Spec:
    name: str
    culprits: tuple
    prepare: Callable[[Ctx], None]
    polls: bool = False


# --- the data ------------------------------------------------------------------------------------------------------

W_TRUE = [round(random.Random(4242).gauss(0, 1), 3) for _ in range(FEATURES)]


def _row(rng: random.Random) -> Tuple[List[float], int]:
    x = [round(rng.gauss(0, 1), 4) for _ in range(FEATURES)]
    return x, int(sum(a * b for a, b in zip(x, W_TRUE)) > 0)


def base_config(**over: Any) -> Dict[str, Any]:
    cfg = {"train": "data/train-{rank:05d}.jsonl", "val": "data/val-{rank:05d}.jsonl", "epochs": 5, "lr": 0.05,
           "eval_every_samples": 128, "val_batch_size": 8, "eval_on": "all", "early_stop_patience": 2,
           "saliency_ids": [], "metrics_url": None, "seed": 0}
    cfg.update(over)
    return cfg


def write_job(ctx: Ctx, cfg: Dict[str, Any],
              train_rows: Callable[[int, int], int] = lambda rank, b: TRAIN_ROWS,
              train_batches: Callable[[int], int] = lambda rank: TRAIN_BATCHES,
              val_edit: Optional[Callable[[int, int, Dict[str, Any], random.Random], Dict[str, Any]]] = None) -> None:
    """config.json, data/train-R.jsonl (packed batches), data/val-R.jsonl (rows with ids) for every rank."""
    data = ctx.workdir / "data"
    data.mkdir(exist_ok=True)
    for rank in range(WORLD):
        rng = random.Random(1000 + rank)
        lines = []
        for b in range(train_batches(rank)):
            rows = [_row(rng) for _ in range(train_rows(rank, b))]
            lines.append(json.dumps({"x": [r[0] for r in rows], "y": [r[1] for r in rows]}, separators=(",", ":")))
        (data / f"train-{rank:05d}.jsonl").write_text("\n".join(lines) + "\n")
        vrng = random.Random(5000 + rank)
        vlines = []
        for i in range(VAL_ROWS):
            x, y = _row(vrng)
            rec = {"id": rank * VAL_ROWS + i, "x": x, "label": y}
            if val_edit is not None:
                rec = val_edit(rank, i, rec, vrng)
            vlines.append(json.dumps(rec, separators=(",", ":")))
        (data / f"val-{rank:05d}.jsonl").write_text("\n".join(vlines) + "\n")
    (ctx.workdir / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")


def prep_main_eval(ctx: Ctx) -> None:
    write_job(ctx, base_config(eval_on="main"))
    ctx.notes.append("config eval_on=main: at step 16 (128 samples) rank 0 alone runs evaluate(), whose per-batch "
                     "reduce_mean() all_reduces the batch loss; the other 7 ranks wait in dist.barrier() after it")


def prep_saliency(ctx: Ctx) -> None:
    write_job(ctx, base_config(saliency_ids=[97]))
    ctx.notes.append("config saliency_ids=[97]: val row 97 is in rank 1's shard (rows 80-159), batch 2. rank 1 runs "
                     "input_saliency() through the DDP wrapper with grad enabled; DDP's pre-forward broadcasts the "
                     "BatchNorm buffers from rank 0 (require_forward_param_sync left True by the last training "
                     "forward); the others go on to the batch's reduce_mean() all_reduce")


def prep_recall(ctx: Ctx) -> None:
    def edit(rank: int, i: int, rec: Dict[str, Any], rng: random.Random) -> Dict[str, Any]:
        if rank == 2:
            while rec["label"] != 0:  # a shard exported from a query that kept only negatives
                rec["x"], rec["label"] = _row(rng)
        return rec

    write_job(ctx, base_config(), val_edit=edit)
    ctx.notes.append("data/val-00002.jsonl has no positive label: rank 2's summarize() divides by tp+fn=0, the "
                     "ZeroDivisionError is caught around the metrics block, so rank 2 skips all_gather_object and "
                     "goes on to step 17's forward (DDP buffer broadcast); the others wait in all_gather_object")


def prep_early_stop(ctx: Ctx) -> None:
    def edit(rank: int, i: int, rec: Dict[str, Any], rng: random.Random) -> Dict[str, Any]:
        if rank == 3:
            rec["label"] = 1 - rec["label"]  # a shard whose label column was exported inverted
        return rec

    write_job(ctx, base_config(), val_edit=edit)
    ctx.notes.append("data/val-00003.jsonl has inverted labels: rank 3's local validation loss rises at every "
                     "evaluation (steps 16, 32, 48), its EarlyStopping (patience 2, on the local loss) fires at step "
                     "48: it leaves the loops and waits in the final dist.barrier(); the others go on training "
                     "(step 49: DDP forward buffer broadcast / backward all_reduce)")


def prep_agent(ctx: Ctx) -> None:
    write_job(ctx, base_config(metrics_url=f"http://127.0.0.1:{AGENT_PORT}/metrics/job/train"))
    ctx.extra["agents"] = True
    ctx.notes.append(f"a metrics agent on 127.0.0.1:{AGENT_PORT} of every node; node03's is stopped (SIGSTOP) before "
                     "the job starts: its listening socket still accepts, nobody answers. Local rank 0 of each node "
                     "pushes after each validation (urlopen, no timeout): rank 4 (node03) waits for the HTTP "
                     "response; the others go on to step 17 (DDP broadcast / backward all_reduce)")


def prep_samples(ctx: Ctx) -> None:
    write_job(ctx, base_config(), train_rows=lambda rank, b: 12 if rank == 5 else TRAIN_ROWS)
    ctx.notes.append("data/train-00005.jsonl is packed 12 rows a batch (the others 8): rank 5's samples_seen "
                     "reaches eval_every_samples=128 at step 11, the others' at step 16: rank 5 runs validation "
                     "(evaluate's reduce_mean all_reduce) while the others run step 12 (DDP buffer broadcast in "
                     "forward / gradient all_reduce in backward)")


def prep_short_stream(ctx: Ctx) -> None:
    write_job(ctx, base_config(), train_batches=lambda rank: 25 if rank == 6 else TRAIN_BATCHES)
    ctx.notes.append("data/train-00006.jsonl holds 25 batches (the others 30): after the step-16 validation, "
                     "rank 6's stream ends at step 25 and it calls the end-of-epoch all_gather_object; the others "
                     "run step 26 (DDP buffer broadcast in forward / gradient all_reduce in backward)")


def prep_filtered_val(ctx: Ctx) -> None:
    def edit(rank: int, i: int, rec: Dict[str, Any], rng: random.Random) -> Dict[str, Any]:
        if rank == 7 and i % 8 == 3 and i < 72:
            rec["label"] = None  # rows the labelling pass never reached
        return rec

    write_job(ctx, base_config(), val_edit=edit)
    ctx.notes.append("data/val-00007.jsonl has 9 unlabelled rows, dropped by load_validation(): rank 7 has 9 "
                     "validation batches, the others 10; each batch all_reduces its loss (reduce_mean): after its 9th "
                     "rank 7 goes on to the metrics all_gather_object while the others wait in the 10th batch's "
                     "all_reduce")


# --- hung for good (from bench/blind/ddp/scenarios.py) ---------------------------------------------------------

Sample = Tuple[str, str, int, int]
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

    wait_until(still, timeout, "every rank's main thread to sit still in one call", interval=1.0)


def wait_settled(ctx: Ctx) -> None:
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


# --- starting the job ----------------------------------------------------------------------------------------------

def _environ(pid: int) -> Dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def marked(mark: str) -> List[Tuple[int, Dict[str, str]]]:
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            env = _environ(int(d))
            if env.get(MARK) == mark:
                found.append((int(d), env))
    return found


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""


def _ns_pid(host_pid: int) -> int:
    for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return host_pid


def find_ranks(job: Job, mark: str) -> bool:
    """job.ranks from the processes that carry the job's mark and a RANK (torchrun's workers)."""
    for pid, env in marked(mark):
        if "RANK" not in env or "train.py" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            continue
        rank = int(env["RANK"])
        if rank not in job.ranks:
            with contextlib.suppress(OSError):
                job.ranks[rank] = RankLoc(node_of(rank), _ns_pid(pid), int(env.get("LOCAL_RANK", "0")), pid, 0, "")
    return len(job.ranks) == WORLD


def start_agents(ctx: Ctx, job: Job, mark: str) -> None:
    script = ctx.workdir / "metrics_agent.py"
    shutil.copy(AGENT, script)
    for node in ctx.cluster.nodes[:NODES]:
        proc = node.spawn([PYTHON, str(script), "--port", str(AGENT_PORT)],
                          env={MARK: mark, "AGENT_HOME": node.name}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
        ctx.stack.callback(lambda p=proc: (p.kill(), p.wait(10)))

    def listening() -> bool:
        return all(f":{AGENT_PORT}" in n.run(["ss", "-Hltn"], check=False).stdout
                   for n in ctx.cluster.nodes[:NODES])

    wait_until(listening, 60, "the metrics agents to listen", interval=0.5)
    # the agent's python itself (the node's spawn wrapper above it carries the same environment)
    wedged = [pid for pid, env in marked(mark) if env.get("AGENT_HOME") == "node03"
              and _read_text(f"/proc/{pid}/comm").startswith("python")]
    assert len(wedged) == 1, wedged
    os.kill(wedged[0], signal.SIGSTOP)
    ctx.stack.callback(lambda: os.kill(wedged[0], signal.SIGCONT) if Path(f"/proc/{wedged[0]}").exists() else None)
    ctx.extra["dump"] = wedged
    ctx.notes.append(f"node03's metrics agent: host pid {wedged[0]}, stopped")


def _start(ctx: Ctx) -> Job:
    places = ctx.cluster.nodes[:NODES]
    logdir = Path(tempfile.mkdtemp(prefix="hangscope-blind-logs-"))
    logdir.chmod(0o755)
    mark = os.urandom(4).hex()
    job = Job("blind", None, 0, WORLD, list(places), logdir, f"{MARK}={mark}")
    ctx.stack.callback(job.stop)
    if ctx.extra.get("agents"):
        start_agents(ctx, job, mark)
    script = ctx.workdir / "train.py"
    shutil.copy(TRAIN, script)
    master = places[0]
    port = _free_port(master)
    for index, node in enumerate(places):
        argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node-rank", str(index),
                "--master-addr", master.ip, "--master-port", str(port), "--nproc-per-node", str(RANKS_PER_NODE),
                str(script), "--config", str(ctx.workdir / "config.json")]
        with open(logdir / f"{node.name}.log", "wb") as out:
            job.launchers.append(node.spawn(argv, env={MARK: mark, "OMP_NUM_THREADS": "1"}, stdout=out,
                                            stderr=subprocess.STDOUT, cwd=str(ctx.workdir)))

    def up() -> bool:
        for proc in job.launchers:
            if proc.poll() is not None:
                raise RuntimeError(f"a launcher exited with {proc.returncode}:\n{job.log_tail()}")
        return find_ranks(job, mark)

    wait_until(up, START_TIMEOUT, "all 8 ranks to start", interval=1.0)
    return job


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="hangscope-blind-job-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir, stack)
        spec.prepare(ctx)
        ctx.job = _start(ctx)
        all_still(ctx, timeout=HANG_TIMEOUT)
        wait_settled(ctx)
        for culprit in spec.culprits:
            if _main_thread(ctx.host_pid(culprit)) is None:
                raise RuntimeError(f"{spec.name}: rank {culprit} exited:\n{ctx.job.log_tail()}")
        ctx.notes.append(f"culprit host pid(s): {[ctx.host_pid(r) for r in spec.culprits]}")
        yield ctx


SPECS: List[Spec] = [
    Spec("eval_on_main_only_collective_inside", (0,), prep_main_eval),
    Spec("saliency_grad_eval_ddp_buffer_broadcast", (1,), prep_saliency),
    Spec("metric_error_swallowed_skips_gather", (2,), prep_recall),
    Spec("early_stopping_on_local_loss", (3,), prep_early_stop),
    Spec("metrics_push_to_stuck_node_agent", (4,), prep_agent),
    Spec("eval_trigger_by_local_sample_count", (5,), prep_samples),
    Spec("train_stream_exhausted_epoch_gather", (6,), prep_short_stream),
    Spec("uneven_val_batches_after_filtering", (7,), prep_filtered_val),
]
BY_NAME = {s.name: s for s in SPECS}
