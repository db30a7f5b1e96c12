"""The blind co-located set's scenarios: the job (train.py, 4 nodes x 2 ranks, gloo, torchrun on every node of a
tests/support/cluster.py cluster) and what else lives on its nodes: leftovers of an earlier attempt, another user's
processes, node daemons, sidecars. `live(cluster, spec)` sets a scenario up, starts the job, returns once it is hung
for good (checked from /proc, no sleep that hopes) and kills everything in `finally`.

What each scenario is (the culprit, the blocking call, what it waits for) is in truth.json and README.md; nothing
here reads how hangscope analyses a snapshot. Nothing the nodes see names a scenario: the job runs from a neutral
folder (/tmp/hangscope-blind-job-XXXX) with configuration flags a real trainer has; the other programs have the
names such programs have (prep_tokens.py, evaluate.py, log_agent.py, python3 -m http.server, gdb).
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
# the test cluster's helpers come from this checkout's tests/support; `app` (record_scenarios imports it) comes from
# PYTHONPATH (the frozen copy under test) when set: REPO goes to the END of sys.path, so that record_scenarios
# (which puts REPO first only when it is missing) leaves PYTHONPATH's app in front
for _p in (str(REPO / "tests" / "support"), str(REPO / "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from cluster import Cluster, Node  # noqa: E402
from testenv import PYTHON  # noqa: E402
from waiting import wait_until  # noqa: E402

TRAIN = HERE / "train.py"
NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE
START_TIMEOUT = 300.0
SETTLE = 3.0
SYSTEM_PYTHON = "/usr/bin/python3"


def node_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE + 1:02d}"


@dataclass
class RankLoc:
    node: str
    host_pid: int


@dataclass
class Job:
    """The job: torchrun on every node (static rendezvous at node01), its ranks found from /proc (RANK in their
    environment, below each node's launcher)."""

    workdir: Path
    launchers: List[Tuple[str, subprocess.Popen]] = field(default_factory=list)
    ranks: Dict[int, RankLoc] = field(default_factory=dict)

    def log_tail(self, lines: int = 12) -> str:
        out = []
        for name, _ in self.launchers:
            text = read(str(self.workdir / "logs" / f"launcher-{name}.log"))
            out += [f"[{name}] {line}" for line in text.splitlines()[-lines:]]
        return "\n".join(out)

    def stop(self) -> None:
        pids = [loc.host_pid for loc in self.ranks.values()]
        for _, proc in self.launchers:
            pids += children(proc.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for _, proc in self.launchers:
            proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=15)


def descendants(pid: int) -> List[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def env_of(pid: int) -> Dict[str, str]:
    return dict(e.split("=", 1) for e in read(f"/proc/{pid}/environ").split(chr(0)) if "=" in e)


def start_job(cluster: Cluster, script: Path, args: List[str], timeout: float) -> Job:
    job = Job(script.parent)
    (job.workdir / "logs").mkdir(exist_ok=True)
    master = cluster.nodes[0]
    used = master.run(["ss", "-Htln"]).stdout
    port = next(p for p in range(random.randint(20000, 40000), 60000) if f":{p} " not in used)
    try:
        for i, node in enumerate(cluster.nodes[:NODES]):
            argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node_rank", str(i),
                    "--master_addr", master.ip, "--master_port", str(port), "--nproc_per_node", str(RANKS_PER_NODE),
                    str(script), *args]
            with open(job.workdir / "logs" / f"launcher-{node.name}.log", "wb") as log:
                job.launchers.append((node.name, node.spawn(argv, env={"OMP_NUM_THREADS": "1",
                                                                       "PYTHONUNBUFFERED": "1"},
                                                            stdout=log, stderr=subprocess.STDOUT,
                                                            stdin=subprocess.DEVNULL, cwd=str(job.workdir))))

        def found() -> bool:
            for name, proc in job.launchers:
                if proc.poll() is not None:
                    raise RuntimeError(f"the launcher on {name} exited ({proc.returncode}):\n{job.log_tail()}")
                for pid in descendants(proc.pid):
                    rank = env_of(pid).get("RANK")
                    if rank is not None and "train.py" in read(f"/proc/{pid}/cmdline"):
                        job.ranks[int(rank)] = RankLoc(name, pid)
            return len(job.ranks) == WORLD

        wait_until(found, timeout, "the job's 8 ranks", interval=1.0)
    except BaseException:
        job.stop()
        raise
    return job

@dataclass
class Ctx:
    cluster: Cluster
    spec: "Spec"
    workdir: Path
    stack: contextlib.ExitStack
    job: Optional[Job] = None
    notes: List[str] = field(default_factory=list)
    roles: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # extra processes: node, host_pid, pid, cmd
    args: List[str] = field(default_factory=list)  # train.py's options, set by prepare

    def node(self, name: str) -> Node:
        return self.cluster[name]

    def host_pid(self, rank: int) -> int:
        assert self.job is not None
        return self.job.ranks[rank].host_pid


@dataclass
class Spec:
    name: str
    blocked: Tuple[int, ...]  # the job's ranks held at the designed place (dumped by --check, settle-checked)
    prepare: Callable[[Ctx], None]  # before the job starts: data, files, other processes; sets ctx.args
    after: Optional[Callable[[Ctx], None]] = None  # once the job's ranks exist
    polling: Tuple[int, ...] = ()  # blocked ranks whose wait is a poll loop (sleep/retry): alive, not still
    role: str = ""  # the extra process that is the culprit (ctx.roles key), "" when ranks are


# --- /proc helpers ------------------------------------------------------------------------------------------------

def read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""


def state_of(pid: int, tid: Optional[int] = None) -> str:
    stat = read(f"/proc/{pid}/task/{tid or pid}/stat")
    return stat.rsplit(")", 1)[-1].split()[0] if stat else "?"


def node_pid(host_pid: int) -> int:
    for line in read(f"/proc/{host_pid}/status").splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return 0


def children(pid: int) -> List[int]:
    out: List[int] = []
    for tid in (Path(f"/proc/{pid}/task").iterdir() if Path(f"/proc/{pid}/task").exists() else ()):
        out += [int(c) for c in read(f"{tid}/children").split()]
    return out


def main_sample(pid: int) -> Optional[Tuple[str, str]]:
    stat = read(f"/proc/{pid}/stat")
    if not stat:
        return None
    return stat.rsplit(")", 1)[-1].split()[0], read(f"/proc/{pid}/syscall").split(" ")[0]


POLLING_SYSCALLS = {"232", "281", "7", "271"}  # epoll_wait, epoll_pwait, poll, ppoll: loops that wake up


def threads_of(pid: int) -> Dict[str, Tuple[str, str, int]]:
    out = {}
    for tid in (os.listdir(f"/proc/{pid}/task") if os.path.exists(f"/proc/{pid}/task") else ()):
        stat = read(f"/proc/{pid}/task/{tid}/stat")
        sc = read(f"/proc/{pid}/task/{tid}/syscall").split(" ")[0]
        if not stat or sc in POLLING_SYSCALLS:
            continue
        f = stat.rsplit(")", 1)[-1].split()
        out[tid] = (f[0], sc, int(f[11]) + int(f[12]))
    return out


# --- extra processes ----------------------------------------------------------------------------------------------

def spawn_role(ctx: Ctx, role: str, node: Node, argv: List[str], env: Optional[Dict[str, str]] = None,
               ready: Optional[str] = None, what: str = "", keep_stdin: bool = True) -> int:
    """A process on `node` that is not one of the job's ranks: started, registered (killed when the scenario ends),
    its host pid returned once it printed `ready` (if given)."""
    log = ctx.workdir / "logs" / f"{role}.log"
    log.parent.mkdir(exist_ok=True)
    out = subprocess.PIPE if ready else open(log, "wb")
    proc = node.spawn(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                      stdin=subprocess.PIPE if keep_stdin else subprocess.DEVNULL, cwd=str(ctx.workdir))
    info: Dict[str, Any] = {"node": node.name, "host_pid": 0, "pid": 0, "cmd": " ".join(argv), "what": what}
    ctx.roles[role] = info

    def stop() -> None:
        if info["host_pid"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(info["host_pid"], signal.SIGKILL)
        proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=15)
        for f in (proc.stdout, proc.stdin):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()

    ctx.stack.callback(stop)
    if ready:
        assert proc.stdout is not None
        seen = []
        for _ in range(50):  # torch's warnings may come first
            line = proc.stdout.readline().decode(errors="replace").strip()
            seen.append(line)
            if ready in line or not line:
                break
        if ready not in seen[-1]:
            raise RuntimeError(f"{role} did not start on {node.name}: {seen[-5:]!r}")
    wait_until(lambda: bool(children(proc.pid)), 30, f"{role}'s process on {node.name}", interval=0.05)
    host = children(proc.pid)[0]
    info["host_pid"], info["pid"] = host, node_pid(host)
    return host


def tool(ctx: Ctx, name: str, source: str) -> Path:
    folder = ctx.workdir / "tools"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(source)
    return path


WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if can more no out some so what up "
         "time into only its other new could these two may first then do any like my now over such our man me "
         "even most made after also did many before must through back years where much your way well down should "
         "because each just those people how too little state good very make world still own see men work long "
         "get here between both life being under never day same another know while last might us great old year "
         "off come since against go came right used take three model data train token layer loss gradient").split()


def write_corpus(folder: Path, shards: int = 2, lines: int = 1500, seed: int = 11) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for k in range(shards):
        with open(folder / f"corpus-{k:03d}.txt", "w") as f:
            for _ in range(lines):
                f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))).capitalize() + ".\n")


def rank_env(rank: int, master: str, port: int, run_id: str) -> Dict[str, str]:
    """The environment torchrun gives a rank (what a process of an earlier attempt still carries)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank % RANKS_PER_NODE), "WORLD_SIZE": str(WORLD),
            "LOCAL_WORLD_SIZE": str(RANKS_PER_NODE), "GROUP_RANK": str(rank // RANKS_PER_NODE),
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(WORLD), "MASTER_ADDR": master, "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "OMP_NUM_THREADS": "1"}


def holds_lock(host_pid: int, path: Path) -> bool:
    """Whether /proc/locks shows a lock of `host_pid` on `path` (by inode; the pid column is the host's)."""
    try:
        ino = path.stat().st_ino
    except OSError:
        return False
    for line in read("/proc/locks").splitlines():
        f = line.split()
        if len(f) >= 6 and f[4] == str(host_pid) and f[5].endswith(f":{ino}"):
            return True
    return False


# --- the set-ups --------------------------------------------------------------------------------------------------

def prep_stage(ctx: Ctx) -> None:
    """Attempt 1 of the run (a bigger corpus, its own folder) left its rank 2 on node02 behind, stopped (job control:
    the attempt was suspended and only its other ranks were killed) while staging node02's shards under the stage
    lock. Attempt 2 (the job) stages into the same node-local folder."""
    stage = ctx.workdir / "scratch"
    old = ctx.workdir / "attempt1"
    write_corpus(old / "data", shards=2, lines=200000, seed=5)
    script = old / "train.py"
    shutil.copyfile(TRAIN, script)
    lock = stage / "node02" / ".lock"
    for attempt in range(4):
        shutil.rmtree(stage, ignore_errors=True)
        (stage / "node02").mkdir(parents=True)
        lock.touch()
        env = rank_env(2, "node01", 29431, "a1-7c3e")
        host = spawn_role(ctx, "leftover", ctx.node("node02"),
                          [PYTHON, str(script), "--workdir", str(old), "--stage-dir", str(stage)], env=env,
                          keep_stdin=False, what="rank 2 of the earlier attempt (attempt 1), stopped")
        try:
            wait_until(lambda: holds_lock(host, lock) or state_of(host) == "Z", 120, "the leftover to take the lock",
                       interval=0.005)
        except TimeoutError:
            continue
        os.kill(host, signal.SIGSTOP)
        wait_until(lambda: state_of(host) in "Tt", 10, "the leftover to stop")
        if holds_lock(host, lock) and any(p.suffix == ".part" for p in (stage / "node02").iterdir()):
            break
        os.kill(host, signal.SIGKILL)
    else:
        raise RuntimeError("could not stop the leftover inside its staging")
    ctx.notes.append(f"leftover: attempt 1's rank 2 (host pid {host}, node pid {ctx.roles['leftover']['pid']}, "
                     f"env RANK=2 MASTER_PORT=29431, train.py --stage-dir) holds flock(scratch/node02/.lock) and is "
                     f"stopped (T) in the middle of staging; attempt 2's ranks 2 and 3 block in fcntl.flock in "
                     f"stage_node_shards before init_process_group; the other 6 ranks wait in init_process_group")
    ctx.args = ["--stage-dir", str(stage)]


def prep_env(ctx: Ctx) -> None:
    """node03's env override file is left from attempt 1 (launched with its master on node04, port 29517); attempt 1's
    rank 0 is still alive on node04, hosting that store and waiting in its own init_process_group."""
    env_dir = ctx.workdir / "env"
    env_dir.mkdir()
    (env_dir / "node03.env").write_text("# written by launch.sh for run lm-0419 (attempt 1)\nGLOO_SOCKET_IFNAME=eth0\n"
                                        "MASTER_ADDR=node04\nMASTER_PORT=29517\n")
    for n in ("node01", "node02", "node04"):
        (env_dir / f"{n}.env").write_text("# written by launch.sh for run lm-0420\nGLOO_SOCKET_IFNAME=eth0\n")
    old = ctx.workdir / "attempt1"
    old.mkdir()
    shutil.copyfile(TRAIN, old / "train.py")
    shutil.copytree(ctx.workdir / "data", old / "data")
    host = spawn_role(ctx, "leftover", ctx.node("node04"), [PYTHON, str(old / "train.py"), "--workdir", str(old)],
                      env=rank_env(0, "node04", 29517, "lm-0419"), keep_stdin=False,
                      what="rank 0 of the earlier attempt (store host node04:29517)")
    node = ctx.node("node04")
    wait_until(lambda: ":29517" in node.run(["ss", "-Htln"]).stdout, 180, "the leftover's store to listen",
               interval=0.5)
    ctx.notes.append(f"leftover: attempt 1's rank 0 on node04 (host pid {host}, node pid "
                     f"{ctx.roles['leftover']['pid']}) hosts a TCPStore on node04:29517 and waits in its "
                     f"init_process_group; env/node03.env (stale, attempt 1's) sets MASTER_ADDR=node04 "
                     f"MASTER_PORT=29517: attempt 2's ranks 4 and 5 join that store and wait in init_process_group "
                     f"for peers that never come there; ranks 0-3, 6, 7 wait in init_process_group for 4 and 5")
    ctx.args = ["--env-dir", str(env_dir)]


PREP_TOOL = r'''
import os, sys, time
from filelock import FileLock

cache = sys.argv[1]
os.makedirs(cache, exist_ok=True)
with FileLock(os.path.join(cache, "tokens.lock")):
    print("prep: tokenizer cache locked", flush=True)
    existing = [n for n in os.listdir(cache) if n.startswith("tokens-")]
    if existing:
        answer = input(f"{len(existing)} cached token files in {cache} were built with another vocabulary. "
                       "Rebuild them? [y/N] ")
        if answer.strip().lower() != "y":
            sys.exit(1)
    time.sleep(1)
'''


def prep_cache(ctx: Ctx) -> None:
    """A data-prep script of another user, started on node01 against the same node-local token cache, asks on its
    terminal whether to rebuild, holding the cache's FileLock (nobody answers: its stdin stays open, unread)."""
    cache = ctx.workdir / "cache"
    folder = cache / "node01"
    folder.mkdir(parents=True)
    (folder / "tokens-5d2a9c41e07f3b18.pt").write_bytes(os.urandom(4096))
    script = tool(ctx, "prep_tokens.py", PREP_TOOL)
    host = spawn_role(ctx, "prep", ctx.node("node01"), [PYTHON, str(script), str(folder)], ready="locked",
                      what="prep_tokens.py waiting at its [y/N] prompt")
    wait_until(lambda: holds_lock(host, folder / "tokens.lock"), 30, "the prep script to hold the lock")
    ctx.notes.append(f"prep: python prep_tokens.py cache/node01 on node01 (host pid {host}, node pid "
                     f"{ctx.roles['prep']['pid']}) holds FileLock(cache/node01/tokens.lock) and waits in input() "
                     f"(its stdin an open pipe nobody writes); ranks 0 and 1 poll FileLock.acquire (sleep loop) in "
                     f"cached_tokens after init; ranks 2-7 wait in the first collective (the parameter broadcast)")
    ctx.args = ["--cache-dir", str(cache)]


EVAL_TOOL = r'''
import argparse, datetime, json, os, time
import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--store", required=True)
ap.add_argument("--run-name", required=True)
args = ap.parse_args()
host, port = args.store.rsplit(":", 1)
store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(hours=4))
print("evaluator: connected", flush=True)
done = set()
while True:
    store.wait([f"{args.run_name}/ckpt"])
    step, path = store.get(f"{args.run_name}/ckpt").decode().split(":", 1)
    if step in done:
        time.sleep(5)
        continue
    state = torch.load(path)
    score = float(sum(v.float().norm() for v in state.values()))
    store.set(f"{args.run_name}/eval/{step}", json.dumps({"step": int(step), "score": score}))
    done.add(step)
'''


def prep_eval(ctx: Ctx) -> None:
    """The evaluation sidecar (started from last run's config: run name lm-0419) connects to the control store that
    rank 0 hosts on node01:29610 and waits for lm-0419's checkpoints; the job is lm-0420."""
    ctx.extra_eval = tool(ctx, "evaluate.py", EVAL_TOOL)  # type: ignore[attr-defined]
    ctx.args = ["--control-port", "29610", "--run-name", "lm-0420", "--eval-every", "3"]


def after_eval(ctx: Ctx) -> None:
    node = ctx.node("node01")
    wait_until(lambda: ":29610" in node.run(["ss", "-Htln"]).stdout, 240, "rank 0's control store", interval=0.5)
    host = spawn_role(ctx, "evaluator", ctx.node("node02"),
                      [PYTHON, str(ctx.extra_eval), "--store", "node01:29610", "--run-name", "lm-0419"],  # type: ignore
                      ready="connected", env={"OMP_NUM_THREADS": "1"}, what="evaluate.py --run-name lm-0419")
    ctx.notes.append(f"evaluator: python evaluate.py --store node01:29610 --run-name lm-0419 on node02 (host pid "
                     f"{host}, node pid {ctx.roles['evaluator']['pid']}) waits in TCPStore.wait for lm-0419/ckpt; "
                     f"rank 0 (run lm-0420) publishes lm-0420/ckpt at step 3 and waits in TCPStore.wait for "
                     f"lm-0420/eval/3; ranks 1-7 wait in broadcast_object_list")


def prep_stats(ctx: Ctx) -> None:
    """Another user's file server on node04 listens on 127.0.0.1:47100, the port the trainer's per-node stats service
    uses; the trainer's local rank 0 takes the port in use for its own service already running."""
    shared = ctx.workdir / "share"
    shared.mkdir()
    (shared / "index.html").write_text("<h1>eval plots</h1>\n")
    spawn_role(ctx, "http", ctx.node("node04"),
               [SYSTEM_PYTHON, "-m", "http.server", "47100", "--bind", "127.0.0.1", "--directory", str(shared)],
               keep_stdin=False, what="python3 -m http.server 47100 (another user's)")
    node = ctx.node("node04")
    wait_until(lambda: "127.0.0.1:47100" in node.run(["ss", "-Htln"]).stdout, 30, "the file server to listen")
    ctx.notes.append(f"http: python3 -m http.server 47100 --bind 127.0.0.1 on node04 (host pid "
                     f"{ctx.roles['http']['host_pid']}, node pid {ctx.roles['http']['pid']}): rank 6 finds the port "
                     f"in use ('stats service already running'), ranks 6 and 7 connect to the file server and after "
                     f"step 1 block in recv for the acknowledgement of their length-prefixed report (the server "
                     f"waits for an HTTP request line that never ends); ranks 0-5 wait in step 2's all_reduce")
    ctx.args = ["--stats-port", "47100"]


STALE_SEM = r'''
import os, signal
from _multiprocessing import SemLock
sem = SemLock(1, 1, 1, "/ring-node02", False)
sem.acquire()
os.kill(os.getpid(), signal.SIGKILL)
'''


def prep_ring(ctx: Ctx) -> None:
    """node02's /ring-node02 semaphore was left taken (value 0) by a process of an earlier attempt that was killed
    while holding it; nothing alive holds it."""
    import _multiprocessing

    with contextlib.suppress(OSError):
        _multiprocessing.sem_unlink("/ring-node02")
    for n in range(1, NODES + 1):  # the job's ranks create their nodes' semaphores: none is left behind
        ctx.stack.callback(_sem_unlink, f"/ring-node{n:02d}")
    ctx.node("node02").run([PYTHON, "-c", STALE_SEM], check=False)
    if not Path("/dev/shm/sem.ring-node02").exists():
        raise RuntimeError("no stale semaphore")
    ctx.notes.append("/dev/shm/sem.ring-node02: left at 0 by a killed process of an earlier attempt (no process "
                     "holds it); ranks 2 and 3 block in SemLock.acquire (sem_wait, futex) in NodeRing.take at step 1; "
                     "ranks 0, 1, 4-7 wait in step 1's all_reduce")
    ctx.args = ["--ring"]


def _sem_unlink(name: str) -> None:
    import _multiprocessing

    with contextlib.suppress(OSError):
        _multiprocessing.sem_unlink(name)


def prep_plain(ctx: Ctx) -> None:
    ctx.args = []


def after_gdb(ctx: Ctx) -> None:
    """Someone attached gdb to rank 5 from a terminal on node03 and left it at its prompt."""
    pid = ctx.host_pid(5)
    t0 = time.monotonic()  # rank 0 prints its loss every 10 steps; 60 s of training do as well, whatever the log keeps
    wait_until(lambda: " loss " in ctx.job.log_tail() or time.monotonic() - t0 > 60, 300, "the job to train",
               interval=1)
    time.sleep(2)
    spawn_role(ctx, "gdb", ctx.node("node03"), ["gdb", "-q", "-nx", "-iex", "set auto-solib-add off", "-p",
                                                  str(node_pid(pid))], what="gdb -p <rank 5>")
    wait_until(lambda: state_of(pid) == "t", 60, "rank 5 to stop under gdb")
    ctx.notes.append(f"gdb: gdb -q -p {node_pid(pid)} on node03 (host pid {ctx.roles['gdb']['host_pid']}, node pid "
                     f"{ctx.roles['gdb']['pid']}) is attached to rank 5 (tracing stop, t) and waits at its prompt "
                     f"(stdin an open pipe); the other ranks wait in all_reduce")


AGENT_TOOL = r'''
import os, socket, sys, time
path, upstream = sys.argv[1], sys.argv[2]
if os.path.exists(path):
    os.unlink(path)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind(path)
os.chmod(path, 0o666)
print("log-agent: listening", flush=True)
backoff = 1.0
out = None
while True:
    if out is None:
        try:
            if upstream.startswith("file:"):
                out = open(upstream[5:], "ab")
            else:
                host, port = upstream.rsplit(":", 1)
                out = socket.create_connection((host, int(port)), timeout=5).makefile("wb")
            backoff = 1.0
        except OSError:
            time.sleep(backoff)  # collector unreachable: back off before the next try
            backoff = min(backoff * 2, 600.0)
            continue
    data = sock.recv(65536)
    out.write(data + b"\n")
    out.flush()
'''


def prep_agent(ctx: Ctx) -> None:
    """Every node runs a log agent on /run/log-agent.sock; node03's forwards to a collector that is down (node01:5140,
    nothing listens) and sits in its retry back-off without reading its socket."""
    script = tool(ctx, "log_agent.py", AGENT_TOOL)
    for node in ctx.cluster.nodes:
        upstream = "node01:5140" if node.name == "node03" else f"file:{ctx.workdir}/logs/agent-{node.name}.log"
        (ctx.workdir / "logs").mkdir(exist_ok=True)
        role = "agent" if node.name == "node03" else f"agent-{node.name}"
        spawn_role(ctx, role, node, [SYSTEM_PYTHON, str(script), "/run/log-agent.sock", upstream], ready="listening",
                   keep_stdin=False, what=f"log_agent.py on {node.name}")
    ctx.notes.append(f"agent: python3 log_agent.py /run/log-agent.sock node01:5140 on node03 (host pid "
                     f"{ctx.roles['agent']['host_pid']}, node pid {ctx.roles['agent']['pid']}) cannot reach its "
                     f"collector and sleeps in its back-off loop, never reading its socket; rank 4 (local rank 0 of "
                     f"node03) fills the socket's queue with per-step metrics and blocks in send() (SysLogHandler); "
                     f"ranks 0-3, 5-7 wait in all_reduce")
    ctx.args = ["--metrics-socket", "/run/log-agent.sock"]


# --- the scenarios ------------------------------------------------------------------------------------------------

SPECS: List[Spec] = [
    Spec("leftover_stopped_rank_holds_stage_lock", (2, 3), prep_stage, role="leftover"),
    Spec("stale_env_joins_leftover_store", (4, 5), prep_env),
    Spec("prep_prompt_holds_cache_filelock", (0, 1), prep_cache, polling=(0, 1), role="prep"),
    Spec("sidecar_evaluator_watches_old_run", (0,), prep_eval, after=after_eval, role="evaluator"),
    Spec("file_server_on_stats_port", (6, 7), prep_stats, role="http"),
    Spec("stale_semaphore_from_killed_attempt", (2, 3), prep_ring),
    Spec("gdb_attached_to_rank", (5,), prep_plain, after=after_gdb, role="gdb"),
    Spec("log_agent_backoff_fills_socket", (4,), prep_agent, role="agent"),
]
BY_NAME = {s.name: s for s in SPECS}


def _start(ctx: Ctx) -> Job:
    script = ctx.workdir / "train.py"
    shutil.copyfile(TRAIN, script)
    return start_job(ctx.cluster, script, ["--workdir", str(ctx.workdir), *ctx.args], START_TIMEOUT)


def wait_hung(ctx: Ctx, timeout: float = 300) -> None:
    """Every rank's main thread sits in one call (seen the same twice, 1 s apart) but the polling ones (alive), then
    the blocked ranks' threads are unchanged for SETTLE seconds."""
    assert ctx.job is not None
    seen: Dict[int, Any] = {}

    def still() -> bool:
        ok = True
        for rank, loc in ctx.job.ranks.items():
            sample = main_sample(loc.host_pid)
            if sample is None or sample[0] in "ZX":
                raise RuntimeError(f"{ctx.spec.name}: rank {rank} exited:\n{ctx.job.log_tail()}")
            if rank in ctx.spec.polling:
                continue
            ok = ok and seen.get(rank) == sample and (sample[0] in "tT" or (sample[1] != "running" and sample[0] != "R"))
            seen[rank] = sample
        return ok

    wait_until(still, timeout, "every rank's main thread to sit still in one call", interval=1.0)
    settled: Dict[int, Tuple[Any, float]] = {}

    def settle() -> bool:
        now, ok = time.monotonic(), True
        for rank in ctx.spec.blocked:
            if rank in ctx.spec.polling:
                continue
            sample = threads_of(ctx.host_pid(rank))
            if rank not in settled or settled[rank][0] != sample:
                settled[rank] = (sample, now)
            ok = ok and now - settled[rank][1] >= SETTLE
        return ok

    wait_until(settle, 120, "the blocked ranks' threads to settle", interval=0.25)


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="hangscope-blind-job-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir, stack)
        for n in range(1, NODES + 1):  # the stats service's record of the nodes (train.py --stats-port)
            stack.callback(lambda n=n: Path(f"/tmp/step-stats-node{n:02d}.jsonl").unlink(missing_ok=True))
        write_corpus(workdir / "data")
        spec.prepare(ctx)
        ctx.job = _start(ctx)
        stack.callback(ctx.job.stop)
        if spec.after is not None:
            spec.after(ctx)
        wait_hung(ctx)
        for role, info in ctx.roles.items():
            if state_of(info["host_pid"]) in ("?", "Z", "X"):
                raise RuntimeError(f"{spec.name}: {role} is gone")
        ctx.notes.append("rank host pids: " + json.dumps({r: ctx.host_pid(r) for r in sorted(ctx.job.ranks)}))
        ctx.notes.append("rank node pids: " + json.dumps({r: node_pid(ctx.host_pid(r)) for r in sorted(ctx.job.ranks)}))
        yield ctx
