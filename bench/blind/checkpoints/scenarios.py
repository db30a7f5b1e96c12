"""The blind checkpointing set's scenarios: how each one is set up on the test cluster, started, and held hung.

Each scenario is bench/blind/checkpoints/train.py (a gloo job, 4 nodes x 2 ranks, torchrun on every node of a
tests/support/cluster.py cluster) with one checkpoint configuration (--checkpoint ...) and what the set-up puts
around it (data shards, files left in the checkpoint folder, node services), so that one rank hangs in or around
saving / loading a checkpoint. `live(cluster, spec)` starts it, returns once it is hung for good (every rank's main
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
    args: List[str]  # train.py's checkpoint configuration
    prepare: Optional[Callable[[Ctx], None]] = None  # before the job starts: data, files, node services


# --- the data ---------------------------------------------------------------------------------------------------

def batch(rng: random.Random, rows: int = 8, width: int = 12) -> Dict[str, Any]:
    ids = [[rng.randrange(VOCAB) for _ in range(width)] for _ in range(rows)]
    y = [round(sum(r) / (len(r) * VOCAB) - 0.5, 4) for r in ids]
    return {"ids": ids, "y": y}


def write_shards(ctx: Ctx, edit: Optional[Callable[[int, int, Dict[str, Any]], None]] = None,
                 count: Callable[[int], int] = lambda rank: BATCHES) -> None:
    """data/train-<rank>.jsonl for every rank: count(rank) batches, each passed through edit(rank, index, batch)."""
    folder = ctx.workdir / "data"
    folder.mkdir(exist_ok=True)
    for rank in range(WORLD):
        rng = random.Random(rank * 7919 + 17)
        lines = []
        for index in range(count(rank)):
            b = batch(rng)
            b["mask"] = [[1] * len(r) for r in b["ids"]]
            if edit is not None:
                edit(rank, index, b)
            lines.append(json.dumps(b, separators=(",", ":")))
        (folder / f"train-{rank:05d}.jsonl").write_text("\n".join(lines) + "\n")


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
                os.kill(host, signal.SIGKILL)  # a stopped process dies of SIGKILL too
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


def _is_stopped(host_pid: int) -> bool:
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{host_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt"
    return False


# --- the set-ups ------------------------------------------------------------------------------------------------

def prep_plain(ctx: Ctx) -> None:
    write_shards(ctx)
    ctx.notes.append("every shard is fine (40 batches of 8 x 12 tokens each)")


def prep_full(ctx: Ctx) -> None:
    write_shards(ctx)
    ctx.notes.append("--checkpoint full: at step 5 rank 0 alone (the save is under `if self.rank == 0`) calls "
                     "save_full, which gathers every rank's loader/RNG state with dist.gather_object on the "
                     "checkpoint group; ranks 1-7 go on to step 6's gradient all_reduce on the default group")


def prep_async(ctx: Ctx) -> None:
    write_shards(ctx)
    folder = ctx.workdir / "ckpt" / "rank1"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "model.pt")
    ctx.notes.append("ckpt/rank1/model.pt is a named pipe (left there by a streaming copy whose reader is gone): "
                     "rank 1's ckpt-writer thread, started at step 5 holding the checkpointer's lock, blocks in "
                     "open() of the FIFO (no reader); at step 10 rank 1's main thread waits for that lock in "
                     "save_async; the others go on to step 11's gradient all_reduce")


SYNC_TOOL = r'''
import fcntl, os, sys, time
folder = sys.argv[1]
os.makedirs(folder, exist_ok=True)
lock = open(os.path.join(folder, ".lock"), "a+")
fcntl.flock(lock, fcntl.LOCK_EX)
print("syncing", flush=True)
# copy the folder to the remote store, the lock held so no checkpoint changes under it; the remote answers on stdin
for line in sys.stdin:
    time.sleep(0.1)
'''


def prep_node(ctx: Ctx) -> None:
    write_shards(ctx)
    script = tool(ctx, "ckpt_sync.py", SYNC_TOOL)
    folder = ctx.workdir / "ckpt" / "node02"
    host = service(ctx, ctx.node("node02"), [PYTHON, str(script), str(folder)], "syncing")
    ctx.notes.append(f"node02 runs a backup sync (host pid {host}: python ckpt_sync.py ckpt/node02) that holds "
                     "flock(ckpt/node02/.lock) and waits for its remote on stdin (never answers): at step 5 rank 2 "
                     "(local rank 0 of node02) blocks in fcntl.flock in save_node; ranks 0, 4, 6 write their "
                     "nodes' copies, and all ranks but 2 wait in the checkpoint group's barrier")


def prep_tokens(ctx: Ctx) -> None:
    def edit(rank: int, index: int, b: Dict[str, Any]) -> None:
        if rank == 3 and index >= 4:  # shorter sequences, right-padded: 92 real tokens a batch, not 96
            b["mask"][7] = [1] * 8 + [0] * 4

    write_shards(ctx, edit)
    ctx.notes.append("data/train-00003.jsonl from batch 4 on holds one right-padded row (92 real tokens a batch, "
                     "the others 96): with --save-every-tokens 960 counted by each rank, ranks 0-2, 4-7 reach 960 "
                     "tokens at step 10 and enter dcp.save (its planning collective on the checkpoint group); "
                     "rank 3 has 936, skips the save and waits in step 11's gradient all_reduce")


AGENT_TOOL = r'''
import os, socket, struct, sys
path, dest = sys.argv[1], sys.argv[2]
if os.path.exists(path):
    os.unlink(path)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(16)
print("listening", flush=True)
def read(conn, n):
    out = b""
    while len(out) < n:
        chunk = conn.recv(min(1 << 20, n - len(out)))
        if not chunk:
            raise EOFError
        out += chunk
    return out
while True:
    conn, _ = srv.accept()
    with conn:
        nlen, dlen = struct.unpack("!II", read(conn, 8))
        name = read(conn, nlen).decode()
        data = read(conn, dlen)
        target = os.path.join(dest, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
        conn.sendall(b"ok")
'''


def prep_agent(ctx: Ctx) -> None:
    write_shards(ctx)
    script = tool(ctx, "upload_agent.py", AGENT_TOOL)
    dest = ctx.workdir / "uploaded"
    dest.mkdir()
    hosts = {}
    for node in ctx.cluster.nodes[:NODES]:
        hosts[node.name] = service(ctx, node, [PYTHON, str(script), "/run/ckpt-upload.sock", str(dest)],
                                   "listening")
    os.kill(hosts["node03"], signal.SIGSTOP)
    wait_until(lambda: _is_stopped(hosts["node03"]), 10, "node03's upload agent to stop")
    ctx.notes.append(f"every node runs an upload agent (python upload_agent.py /run/ckpt-upload.sock); node03's "
                     f"(host pid {hosts['node03']}) is stopped (SIGSTOP, state T) before the job starts: at step 5 "
                     "rank 4 (local rank 0 of node03) connects (the kernel queues the connection) and blocks in "
                     "socket.sendall once the socket buffer is full; ranks 0, 2, 6 upload to their agents, and all "
                     "ranks but 4 wait in the checkpoint group's barrier")


def prep_sharded(ctx: Ctx) -> None:
    write_shards(ctx)
    ctx.notes.append("--checkpoint sharded: rank i writes the optimizer shard of parameter i % 8; rank 5 owns "
                     "tok.weight (1000 x 64 floats + Adam's two moments, ~770 KB, incompressible), the others "
                     "at most 8 KB. save_sharded pipes torch.save into `gzip -1 -c` (stdin and stdout "
                     "pipes) and reads gzip's output only after writing everything: gzip blocks writing its full "
                     "stdout pipe, rank 5 blocks writing gzip's full stdin pipe (a pipe deadlock with its child); "
                     "the others wait in the checkpoint group's barrier")


def prep_epoch(ctx: Ctx) -> None:
    write_shards(ctx, count=lambda rank: 23 if rank == 6 else BATCHES)
    ctx.notes.append("data/train-00006.jsonl holds 23 batches, the others 40: with --save-at-epoch-end, rank 6's "
                     "epoch ends at step 23 and it alone enters dcp.save (planning collective on the checkpoint "
                     "group); the others wait in step 24's gradient all_reduce")


def _load_train():
    spec = importlib.util.spec_from_file_location("ckpt_train_module", TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prep_resume(ctx: Ctx) -> None:
    import torch

    write_shards(ctx)
    train = _load_train()
    for rank in range(WORLD):
        folder = ctx.workdir / "ckpt" / f"rank{rank:05d}"
        folder.mkdir(parents=True)
        for step in (40, 48):
            model, opt = train.build()
            state = {"step": step, "position": (step - 1) % BATCHES, "model": model.state_dict(),
                     "optim": opt.state_dict(), "rng": torch.get_rng_state()}
            torch.save(state, folder / f"step_{step:08d}.pt")
    last = ctx.workdir / "ckpt" / "rank00007" / "step_00000048.pt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])  # the node went down while this file was written
    ctx.notes.append("every rank has ckpt/rankNNNNN/step_00000040.pt and step_00000048.pt; rank 7's step-48 file "
                     "is cut in half (written when its node went down): with --resume, rank 7 falls back to "
                     "step 40, the others resume at 48. They train in lockstep (rank 7's steps 41-42 against the "
                     "others' 49-50) until the others save at step 50 (save every 10) and wait in the checkpoint "
                     "group's barrier after the save, while rank 7 waits in its step 42's gradient all_reduce")


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

SPECS: List[Spec] = [
    Spec("rank0_only_save_gathers_state", (0,), ["--checkpoint", "full", "--save-every", "5"], prep_full),
    Spec("async_writer_holds_lock_on_fifo", (1,), ["--checkpoint", "async", "--save-every", "5"], prep_async),
    Spec("node_lock_held_by_backup_sync", (2,), ["--checkpoint", "node", "--save-every", "5"], prep_node),
    Spec("dcp_token_gate_rank_skips_save", (3,), ["--checkpoint", "dcp", "--save-every-tokens", "960"],
         prep_tokens),
    Spec("upload_agent_stopped", (4,), ["--checkpoint", "agent", "--save-every", "5"], prep_agent),
    Spec("gzip_pipe_deadlock_shard", (5,), ["--checkpoint", "sharded", "--save-every", "5"], prep_sharded),
    Spec("dcp_epoch_end_short_shard", (6,), ["--checkpoint", "dcp", "--save-at-epoch-end"], prep_epoch),
    Spec("resume_fallback_older_step", (7,), ["--checkpoint", "rank", "--save-every", "10", "--resume"],
         prep_resume),
]
BY_NAME = {s.name: s for s in SPECS}


def _start(ctx: Ctx) -> Job:
    args = ["--workdir", str(ctx.workdir), *ctx.spec.args]
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
