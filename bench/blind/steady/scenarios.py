"""The blind steady-state set's scenarios: how each one is set up on the test cluster, started, and held hung.

Each scenario is bench/blind/steady/train.py (a gloo job, 4 nodes x 2 ranks, torchrun on every node of a
tests/support/cluster.py cluster) with one checkpoint or input-pipeline feature switched on and the circumstances that
make one rank hang some steps into a run that was going well (a full node disk, a FIFO, a pipe, a thread pool, a
node-local service, a lock, a dead thread), while the others go on to the next collective and wait for it.
`live(cluster, spec)` starts it, returns once it is hung for good (wait-until logic, copied from bench/blind/starts:
every waiting rank's main thread still in one call, seen the same twice, and the culprit's threads unchanged for
SETTLE seconds; never a sleep that hopes), and kills everything in `finally` (the job, the node services, the
node-local files it used).

What each scenario is (the culprit, the blocking call, what it waits for, who could release it) is written in
truth.json, from this set-up; nothing here reads how hangscope analyses a snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(REPO / "tests"), str(REPO / "tests" / "support")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cluster import Cluster, Node  # noqa: E402
from jobs import PYTHON, Job, _main_thread, start_job  # noqa: E402
from waiting import wait_until  # noqa: E402

TRAIN = HERE / "train.py"
SERVICES = HERE / "services.py"
NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE
START_TIMEOUT = 180.0  # seconds for torch to start on 8 ranks of a loaded 2-core machine
SETTLE = 3.0  # seconds the culprit's threads must sit unchanged to count as hung for good
SETTLE_TIMEOUT = 120.0
# the node-local folders train.py uses (each node has its own /run); removed on every node after each scenario
NODE_LOCAL = ("/run/ckpt", "/run/ckpt-spool", "/run/ckpt-upload.conf", "/run/stream", "/run/datasvc.sock")


def node_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE + 1:02d}"


@dataclass
class Ctx:
    """One scenario being set up and run: its cluster, its shared folder, the job's arguments, the job."""

    cluster: Cluster
    spec: "Spec"
    workdir: Path
    stack: contextlib.ExitStack
    args: List[str] = field(default_factory=list)
    job: Optional[Job] = None
    launch: Any = None  # the cluster the launchers are started on (one node's launcher with a held stdin), or None
    notes: List[str] = field(default_factory=list)  # what the set-up did, for the record (pids, addresses)
    extra: Dict[str, Any] = field(default_factory=dict)

    def node(self, name: str) -> Node:
        return self.cluster[name]

    def host_pid(self, rank: int) -> int:
        assert self.job is not None
        return self.job.ranks[rank].host_pid

    def node_sh(self, name: str, script: str) -> None:
        """A shell command inside node `name` (its own /run)."""
        self.node(name).run(["sh", "-c", script])

    def service(self, node: Node, argv: Sequence[str]) -> subprocess.Popen:
        """Start services.py on `node`; returns once it printed `ready`; killed when the scenario ends."""
        proc = node.spawn([PYTHON, "-u", str(SERVICES), *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        def stop() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=15)
            if proc.stdout is not None:
                proc.stdout.close()

        self.stack.callback(stop)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode(errors="replace").strip()
        if line != "ready":
            raise RuntimeError(f"services.py {' '.join(argv)} did not start: {line!r}")
        return proc


@dataclass
class Spec:
    name: str
    culprits: tuple  # the ranks that hang (truth.json has the same)
    feature: str  # train.py --feature
    args: List[str] = field(default_factory=list)
    prepare: Optional[Callable[[Ctx], None]] = None  # before the job starts
    polls: bool = False  # the culprit polls (wakes up every second): hung for good once the others sit still


# --- the set-ups -------------------------------------------------------------------------------------------------

def _words(seed: int, n: int) -> str:
    return " ".join(f"w{(seed * 7919 + i * 104729) % 50000}" for i in range(n))


def prep_async_checkpoint(ctx: Ctx) -> None:
    """node01's /run (a 16 MiB tmpfs) nearly full of an earlier version's checkpoints (ckpt-epoch*.pt, a name the
    retention pass does not match): rank 0's first background save dies of ENOSPC."""
    free_kib = int(ctx.node("node01").run(["sh", "-c", "df -k /run | tail -1"]).stdout.split()[3])
    fill = max(0, free_kib - 700)  # leave ~0.7 MiB: a checkpoint is ~2.2 MiB
    per = fill // 4
    ctx.node_sh("node01", "mkdir -p /run/ckpt && for e in 1 2 3 4; do "
                          f"head -c {per * 1024} /dev/urandom > /run/ckpt/ckpt-epoch$e.pt; done")
    ctx.notes.append(f"node01: /run/ckpt holds 4 checkpoints of an earlier version (ckpt-epoch1..4.pt, {per} KiB "
                     f"each), /run had {free_kib} KiB free: rank 0's background save at step 5 fails with ENOSPC, its "
                     "thread dies; at step 10 rank 0 waits for it (Event.wait)")


def prep_tokenizer_docs(ctx: Ctx) -> None:
    folder = ctx.workdir / "text"
    folder.mkdir()
    for rank in range(WORLD):
        docs = [_words(rank * 1000 + i, 60) for i in range(600)]
        if rank == 1:
            docs[84] = _words(4242, 160_000)  # ~1 MiB: one huge document
        (folder / f"rank{rank}.txt").write_text("\n".join(docs) + "\n")
    ctx.notes.append("text/rank1.txt: document 84 is ~1 MiB on one line: rank 1's DataLoader worker writes it whole "
                     "to its tokenizer's stdin before reading the tokens; the tokenizer blocks writing its stdout")


def prep_spool_fifo(ctx: Ctx) -> None:
    ctx.node_sh("node02", "mkdir -p /run/ckpt-spool && mkfifo /run/ckpt-spool/rank2.pt")
    ctx.notes.append("node02: /run/ckpt-spool/rank2.pt is a FIFO left by a streaming upload sidecar that is no longer "
                     "running (no reader): rank 2's torch.save at step 5 blocks opening it")


def prep_preprocess_cache(ctx: Ctx) -> None:
    import torch

    (ctx.workdir / "cache").mkdir()
    (ctx.workdir / "raw").mkdir()
    n = 3200
    for rank in range(WORLD):
        ids = [[(rank * 31 + i * 17 + j) % 997 for j in range(12)] for i in range(n)]
        (ctx.workdir / "raw" / f"rank{rank}.jsonl").write_text("".join(json.dumps({"ids": x}) + "\n" for x in ids))
        upto = 100 if rank == 3 else n
        cache = {i: torch.bincount(torch.tensor(ids[i]) % 16, minlength=16).float() / 12 for i in range(upto)}
        torch.save(cache, ctx.workdir / "cache" / f"rank{rank}.pt")
    ctx.notes.append("cache/rank3.pt holds samples 0..99 only (a cache build cut short): at step 12 rank 3's batch "
                     "task, on the 1-thread preprocessing pool, submits decodes to the same pool and waits for them")


def prep_upload_debug(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        level = "debug" if name == "node03" else "info"
        ctx.node_sh(name, f"echo 'log_level = {level}' > /run/ckpt-upload.conf")
    ctx.notes.append("node03: /run/ckpt-upload.conf says log_level = debug (one line per 1 KiB part): node03's "
                     "uploader fills its stdout pipe, which rank 4 reads only after wait(); at step 10 rank 4 waits for "
                     "it")


def prep_stream(ctx: Ctx) -> None:
    import struct

    stage = ctx.workdir / "stage"
    stage.mkdir()
    for rank in range(WORLD):
        recs = [bytes((rank * 13 + i * 7 + j) % 251 for j in range(64)) for i in range(400)]
        (stage / f"rank{rank}.idx").write_text(json.dumps({"lengths": [len(r) for r in recs]}))
        data = b"".join(recs)
        (stage / f"rank{rank}.bin").write_bytes(data[:100 * 64 + 20] if rank == 5 else data)
    assert struct.calcsize("<I") == 4
    for i, name in enumerate(ctx.cluster.names[:NODES]):
        ranks = (2 * i, 2 * i + 1)
        cp = "; ".join(f"cp {stage}/rank{r}.idx {stage}/rank{r}.bin /run/stream/" for r in ranks)
        ctx.node_sh(name, f"mkdir -p /run/stream; {cp}")
        proc = ctx.service(ctx.node(name), ["datasvc", "--root", "/run/stream", "--sock", "/run/datasvc.sock"])
        if name == "node03":
            ctx.extra["dump"] = [p for p in _descendants(proc.pid) if "datasvc" in _cmdline(p)]
    ctx.notes.append("node03: /run/stream/rank5.bin is cut short after 100 records (its index lists 400): node03's "
                     "data service sends what it has and waits for the next command; rank 5 waits for the rest")


def prep_stopped_prune(ctx: Ctx) -> None:
    ctx.node_sh("node04", "mkdir -p /run/ckpt && for i in $(seq 1 200); do mkdir -p /run/ckpt/step-$i; "
                          "echo x > /run/ckpt/step-$i/shard; done")
    proc = ctx.service(ctx.node("node04"), ["prune", "--dir", "/run/ckpt"])
    pids = [p for p in _descendants(proc.pid) if "prune" in _cmdline(p)]
    if not pids:
        raise RuntimeError("the retention job's process was not found")
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    ctx.extra["dump"] = pids
    ctx.notes.append(f"node04: the retention job (services.py prune, host pid {pids}) holds /run/ckpt/.lock (flock) "
                     "and was stopped (SIGSTOP, as by Ctrl-Z) while pruning: rank 6 waits for the lock at step 5")


def prep_prefetch_corrupt(ctx: Ctx) -> None:
    folder = ctx.workdir / "data"
    folder.mkdir()
    for rank in range(WORLD):
        lines = [json.dumps({"ids": [(rank * 31 + i * 17 + j) % 997 for j in range(12)]}) for i in range(800)]
        if rank == 7:
            lines[90] = lines[90][:25]  # a record cut short
        (folder / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    ctx.notes.append("data/rank7.jsonl: record 90 is cut short: rank 7's prefetch thread dies of JSONDecodeError; "
                     "the training loop waits on the empty queue (Queue.get)")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _descendants(pid: int) -> List[int]:
    out: List[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        task = Path(f"/proc/{p}/task")
        for tid in (task.iterdir() if task.exists() else ()):
            try:
                kids = [int(c) for c in (tid / "children").read_text().split()]
            except OSError:
                kids = []
            out += kids
            todo += kids
    return out


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
    Spec("async_save_thread_died_disk_full", (0,), "async_checkpoint", prepare=prep_async_checkpoint),
    Spec("loader_worker_tokenizer_pipe_deadlock", (1,), "tokenizer_workers", prepare=prep_tokenizer_docs),
    Spec("spool_checkpoint_fifo_no_reader", (2,), "spool_checkpoint", prepare=prep_spool_fifo),
    Spec("preprocess_pool_nested_submit", (3,), "preprocess_pool", prepare=prep_preprocess_cache),
    Spec("upload_wait_pipe_full", (4,), "upload_checkpoint", prepare=prep_upload_debug),
    Spec("data_service_truncated_shard", (5,), "stream_service", prepare=prep_stream),
    Spec("retention_lock_stopped_holder", (6,), "retention_dcp", prepare=prep_stopped_prune),
    Spec("prefetch_thread_died_queue_get", (7,), "prefetch_thread", prepare=prep_prefetch_corrupt),
]
BY_NAME = {s.name: s for s in SPECS}


def _start(ctx: Ctx) -> Job:
    spec = ctx.spec
    args = ["--feature", spec.feature, "--workdir", str(ctx.workdir), *spec.args, *ctx.args]
    # the job's name (Job.scenario) names nothing the nodes see; the workdir below is neutral too
    return start_job(ctx.launch or ctx.cluster, "blind", nodes=NODES, ranks_per_node=RANKS_PER_NODE,
                     timeout=START_TIMEOUT, extra_args=args, wait=False, script=TRAIN)


def _clean_nodes(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        with contextlib.suppress(Exception):
            ctx.node(name).run(["rm", "-rf", *NODE_LOCAL], check=False)


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    """The scenario's job, hung for good; everything it started is killed and removed on exit."""
    with contextlib.ExitStack() as stack:
        # a neutral name: the headline may quote paths under it, and the scenario's name holds scoring words
        workdir = Path(tempfile.mkdtemp(prefix="hangscope-blind-job-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir, stack)
        _clean_nodes(ctx)
        stack.callback(_clean_nodes, ctx)
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
