"""The blind thread set's scenarios: how each one is set up on the test cluster, started, and held hung.

Each scenario is bench/blind/threads/train.py (a gloo job, 4 nodes x 2 ranks, torchrun on every node of a
tests/support/cluster.py cluster) with one feature switched on and the circumstances that make one rank block by
the concurrency inside its own process (its threads, thread pools, event loops, the GIL, locks shared by threads, its
DataLoader's worker processes). `live(cluster, spec)` starts it, returns once it is hung for good (wait-until logic:
every rank's main thread still in one call, and the culprit's threads, and where it matters its children, unchanged
for SETTLE seconds; never a sleep that hopes), and kills everything in `finally`.

What each scenario is (the culprit, the blocking call, what it waits for, who could release it) is written in
truth.json, from this set-up; nothing here reads how hangscope analyses a snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(REPO / "tests"), str(REPO / "tests" / "support")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cluster import Cluster, Node  # noqa: E402
from jobs import PYTHON, Job, _main_thread, start_job  # noqa: E402
from record_scenarios import others_still  # noqa: E402
from waiting import wait_until  # noqa: E402

TRAIN = HERE / "train.py"
SERVICES = HERE / "services.py"
NODES, RANKS_PER_NODE = 4, 2
START_TIMEOUT = 180.0  # seconds for torch to start on 8 ranks of a loaded 2-core machine
SETTLE = 3.0  # seconds the culprit's threads must sit unchanged to count as hung for good
SETTLE_TIMEOUT = 120.0


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
    notes: List[str] = field(default_factory=list)  # what the set-up did, for the record (pids, addresses)

    def node(self, name: str) -> Node:
        return self.cluster[name]

    def host_pid(self, rank: int) -> int:
        assert self.job is not None
        return self.job.ranks[rank].host_pid

    def service(self, node: Node, argv: Sequence[str]) -> subprocess.Popen:
        """Start services.py on `node`; returns once it printed `ready`; killed when the scenario ends."""
        proc = node.spawn([PYTHON, "-u", str(SERVICES), *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        def stop() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
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
    culprits: tuple  # the ranks that block in the scenario's resource (truth.json has the same)
    feature: str  # train.py --feature
    args: List[str] = field(default_factory=list)
    ready_step: int = 3
    prepare: Optional[Callable[[Ctx], None]] = None  # before the job starts
    # how the culprit's main thread waits: "blocked" (one call, still: Job.wait_blocked for every rank) or
    # "polls" (it wakes up on its own: a timed poll, the GIL's 5 ms drop requests; the others are waited for,
    # and the culprit's main thread is left out of the settle check)
    main: str = "blocked"
    children: bool = False  # the culprit's child processes must settle too (a DataLoader worker)
    settle: Optional[Callable[[Ctx], bool]] = None  # a further condition of "hung for good", polled


# --- the set-ups -------------------------------------------------------------------------------------------------

def fake_tool(ctx: Ctx, name: str, scripts: Dict[str, str]) -> None:
    """Install a FAKE site tool `name` on the PATH of each node in `scripts` (node name -> the script's text)."""
    for node_name, text in scripts.items():
        path = ctx.node(node_name).bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
        ctx.stack.callback(path.unlink, missing_ok=True)


def _py(body: str) -> str:
    return f"#!{PYTHON}\n" + body


def prep_shards(ctx: Ctx) -> None:
    """Each rank's data folder holds one part; rank 6's was written as two (its shard was over the part size)."""
    for rank in range(NODES * RANKS_PER_NODE):
        folder = ctx.workdir / "data" / f"rank{rank}"
        folder.mkdir(parents=True)
        for part in range(2 if rank == 6 else 1):
            chunks = [zlib.compress(bytes([rank, part, c]) * 65536) for c in range(4)]
            (folder / f"part-{part:03d}.z").write_bytes(pickle.dumps(chunks))
    ctx.notes.append("data/rank<R>/ holds one part-000.z per rank, rank 6's two (part-000.z, part-001.z)")


def prep_sidecar(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        ctx.service(ctx.node(name), ["auth-sidecar", "--port", "8740", *(["--stall"] if name == "node03" else [])])
    ctx.args += ["--port", "8740"]
    ctx.notes.append("an auth sidecar on 127.0.0.1:8740 on every node; node03's upstream hangs: it accepts and "
                     "reads requests but never answers")


def prep_creds(ctx: Ctx) -> None:
    creds = ctx.workdir / "creds"
    creds.mkdir()
    now = time.time()
    for name in ctx.cluster.names[:NODES]:
        expires = now - 86400 if name == "node02" else now + 86400
        (creds / f"{name}.json").write_text(json.dumps({"value": os.urandom(8).hex(), "expires": expires}))
    ctx.notes.append("creds/<node>.json per node; node02's token expired a day ago, the others' are valid a day")


def prep_agent(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        ctx.service(ctx.node(name), ["node-agent", "--socket", "/run/node-agent.sock",
                                     *(["--stall"] if name == "node04" else [])])
    ctx.notes.append("a node agent on /run/node-agent.sock (each node's own /run) on every node; node04's "
                     "collector is wedged: it reads requests and never answers")


LOG_SHIP = _py("""# FAKE site tool (bench/blind/threads): forwards the lines on its stdin to the log collector (here: a file)
import argparse, sys
ap = argparse.ArgumentParser()
ap.add_argument("--tag", required=True)
args = ap.parse_args()
forwarded = 0
for line in sys.stdin:
    forwarded += 1  # (the collector is left out of the fake)
""")
LOG_SHIP_WAITING = _py("""# FAKE site tool (bench/blind/threads), node01's newer version: connects to the log collector before it
# reads anything from its stdin, retrying forever; node01's collector address does not answer
import argparse, socket, sys, time
ap = argparse.ArgumentParser()
ap.add_argument("--tag", required=True)
ap.add_argument("--collector", default="198.51.100.7:5140")
args = ap.parse_args()
host, port = args.collector.rsplit(":", 1)
while True:
    try:
        conn = socket.create_connection((host, int(port)), timeout=5)
        break
    except OSError:
        time.sleep(1.0)
for line in sys.stdin:
    conn.sendall(f"<{args.tag}> {line}".encode())
""")


def prep_log_ship(ctx: Ctx) -> None:
    fake_tool(ctx, "log-ship", {name: (LOG_SHIP_WAITING if name == "node01" else LOG_SHIP)
                                for name in ctx.cluster.names[:NODES]})
    ctx.notes.append("a FAKE `log-ship` on every node's PATH; node01's (a newer version) connects to its collector "
                     "before reading stdin and retries forever (the collector does not answer)")


def prep_cache(ctx: Ctx) -> None:
    cache = ctx.workdir / "cache"
    cache.mkdir()
    for rank in range(NODES * RANKS_PER_NODE):
        if rank != 5:
            (cache / f"rank{rank}.idx").write_text(json.dumps({"samples": 64, "checksum": 0.0}))
    ctx.notes.append("cache/rank<R>.idx present for every rank but 5 (rank 5's cache is cold: it decodes its first "
                     "samples on the thread pool before the DataLoader forks its worker)")


# --- hung for good --------------------------------------------------------------------------------------------

Sample = Tuple[str, str, int, int]
# torch's own threads that wake up on their own in a hung rank: gloo's transport loop sits in epoll_wait with a
# timeout (~100 wake-ups a second); left out of the settle check (x86_64: epoll_wait, epoll_pwait)
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


def _children(pid: int) -> List[int]:
    out: List[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    kids = [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
                    out += kids
                    todo += kids
    return out


def threads_of(pid: int, children: bool, skip_main: bool) -> Dict[str, Sample]:
    """Every thread of `pid` (and of its descendants) as (state, syscall, cpu ticks, context switches)."""
    out: Dict[str, Sample] = {}
    for p in [pid, *(_children(pid) if children else [])]:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                if skip_main and p == pid and tid == str(pid):
                    continue
                sample = _task(f"/proc/{p}/task/{tid}")
                if sample is not None and sample[1] not in POLLING:
                    out[f"{p}/{tid}"] = sample
    return out


def wait_settled(ctx: Ctx) -> None:
    """Until the culprit's threads (and its children's, where the spec says) are unchanged for SETTLE seconds,
    and the spec's own condition holds."""
    spec = ctx.spec
    seen: Dict[int, Tuple[Dict[str, Sample], float]] = {}

    def settled() -> bool:
        now, ok = time.monotonic(), True
        for rank in spec.culprits:
            pid = ctx.host_pid(rank)
            if _main_thread(pid) is None:
                raise RuntimeError(f"{spec.name}: rank {rank} exited:\n{ctx.job.log_tail() if ctx.job else ''}")
            sample = threads_of(pid, spec.children, skip_main=spec.main == "polls")
            if rank not in seen or seen[rank][0] != sample:
                seen[rank] = (sample, now)
            ok = ok and now - seen[rank][1] >= SETTLE
        return ok and (spec.settle is None or spec.settle(ctx))

    try:
        wait_until(settled, SETTLE_TIMEOUT, "the culprit's threads to settle", interval=0.25)
    except TimeoutError as exc:
        moving = {r: {k: (Path(f"/proc/{k.replace('/', '/task/')}/comm").read_text().strip(), v)
                      for k, v in threads_of(ctx.host_pid(r), spec.children, False).items()}
                  for r in spec.culprits}
        raise TimeoutError(f"{exc}: {moving}") from None


def gil_waiter(ctx: Ctx) -> bool:
    """The culprit's main thread keeps asking for the GIL (a timed futex wait every 5 ms: 50+ wake-ups in 0.5 s)
    while a thread of it sleeps in recvfrom (45 on x86_64)."""
    pid = ctx.host_pid(ctx.spec.culprits[0])
    first = _task(f"/proc/{pid}/task/{pid}")
    time.sleep(0.5)  # the measuring interval of a rate, not a wait for an event
    second = _task(f"/proc/{pid}/task/{pid}")
    if first is None or second is None:
        return False
    in_recv = any(s[1] == "45" for k, s in threads_of(pid, False, True).items())
    return second[3] - first[3] >= 50 and in_recv


# --- the scenarios ------------------------------------------------------------------------------------------------

SPECS: List[Spec] = [
    Spec("abba_ckpt_metrics_locks", (3,), "best_ckpt", ["--ckpt-rank", "3"]),
    Spec("pool_nested_submit_starved", (6,), "shard_prefetch", prepare=prep_shards),
    Spec("queue_join_missing_task_done", (1,), "jsonl_metrics", ["--eval-rank", "1"]),
    Spec("loop_thread_sync_http", (4,), "control_plane", prepare=prep_sidecar),
    Spec("loop_result_on_own_thread", (2,), "artifact_upload", prepare=prep_creds),
    Spec("gil_held_in_pydll_recv", (7,), "host_monitor", prepare=prep_agent, main="polls", settle=gil_waiter),
    Spec("logging_lock_writer_full_pipe", (0,), "log_forwarding", prepare=prep_log_ship),
    Spec("dataloader_forked_threadpool", (5,), "cached_features", ready_step=0, prepare=prep_cache, main="polls",
         children=True),
    Spec("import_lock_thread_at_import", (6,), "step_profiler", ["--profile-rank", "6"]),
    Spec("rlock_holder_waits_event", (1,), "ema", ["--ema-rank", "1"]),
]
BY_NAME = {s.name: s for s in SPECS}


def _start(ctx: Ctx) -> Job:
    spec = ctx.spec
    args = ["--feature", spec.feature, "--workdir", str(ctx.workdir), "--ready-step", str(spec.ready_step),
            *spec.args, *ctx.args]
    # the job's name (Job.scenario) names nothing the nodes see; the workdir below is neutral too
    return start_job(ctx.cluster, "blind", nodes=NODES, ranks_per_node=RANKS_PER_NODE, timeout=START_TIMEOUT,
                     extra_args=args, wait=spec.main == "blocked", script=TRAIN)


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
        if spec.main != "blocked":
            for culprit in spec.culprits:
                others_still(ctx.job, culprit, timeout=120)
        wait_settled(ctx)
        for culprit in spec.culprits:  # the culprit is where the set-up put it: alive
            if _main_thread(ctx.host_pid(culprit)) is None:
                raise RuntimeError(f"{spec.name}: rank {culprit} exited:\n{ctx.job.log_tail()}")
        ctx.notes.append(f"culprit host pid(s): {[ctx.host_pid(r) for r in spec.culprits]}")
        yield ctx
