"""The blind elastic set's scenarios: torchrun's elastic agent (c10d rendezvous) on 4 nodes x 2 ranks of the
tests/support/cluster.py test cluster, hung one way each.

Every node runs `torchrun --nnodes 4 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint node01:PORT
--rdzv-id RUN --monitor-interval 1 [--max-restarts N] train.py ...` (LOGLEVEL=INFO), each launcher's output into a
log file of the job's folder (node05's kind of launch: `sh -c 'torchrun ... 2>&1 | tee -a train.log'` where a
scenario says so). `live(cluster, spec)` starts it, does to it what the scenario does (a stop, a kill, a missing
file, a wrong flag), waits until it is hung for good (conditions on /proc and the launchers' logs, never a sleep
that hopes), and kills everything in `finally`: every process carrying the job's mark (stopped ones continued
first), the launchers, the job's folder.

What each scenario is (the culprit, the blocking call, what it waits for) is in truth.json, from this set-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(REPO / "tests"), str(REPO / "tests" / "support")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cluster import Cluster, Node  # noqa: E402
from jobs import MARK, PYTHON, _free_port, _main_thread  # noqa: E402
from testenv import SCRIPTS  # noqa: E402
from waiting import wait_until  # noqa: E402

TRAIN = HERE / "train.py"
NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE
SETTLE = 3.0
TORCHRUN = str(SCRIPTS / "torchrun")


def node_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE + 1:02d}"


@dataclass
class Proc:
    host_pid: int
    node: str
    env: Dict[str, str]
    cmdline: str
    state: str

    @property
    def rank(self) -> Optional[int]:
        return int(self.env["RANK"]) if "RANK" in self.env else None


@dataclass
class Job:
    """What record_scenarios' Running needs of a job (nothing), and what the set-up needs: the launchers, the mark."""

    mark: str
    workdir: Path
    cluster: Cluster
    launchers: List[subprocess.Popen] = field(default_factory=list)
    ranks: Dict[int, Any] = field(default_factory=dict)

    def procs(self) -> List[Proc]:
        """Every live process of the job (its mark in the environment), on the host's /proc."""
        nets = {}
        for node in self.cluster.nodes:
            with contextlib.suppress(OSError):
                nets[os.stat(f"/run/netns/{node.ns}").st_ino] = node.name
        out = []
        needle = f"{MARK}={self.mark}".encode()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                raw = Path(f"/proc/{d}/environ").read_bytes()
                if needle not in raw.split(b"\0"):
                    continue
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                net = os.stat(f"/proc/{d}/ns/net").st_ino
            except OSError:
                continue
            env = dict(kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)
            if net not in nets or cmd.startswith("nsenter "):  # the test cluster's own wrapper, not the job's
                continue
            out.append(Proc(int(d), nets[net], {k.decode(): v.decode(errors="replace") for k, v in env.items()},
                            cmd, stat[0]))
        return out

    def workers(self, restart: Optional[int] = None) -> List[Proc]:
        return [p for p in self.procs() if p.rank is not None and "train.py" in p.cmdline and p.state != "Z"
                and (restart is None or p.env.get("TORCHELASTIC_RESTART_COUNT") == str(restart))]

    def agents(self) -> List[Proc]:
        return [p for p in self.procs() if p.rank is None and "torchrun" in p.cmdline and "tee" not in p.cmdline
                and not p.cmdline.startswith(("sh ", "/bin/sh "))]

    def agent(self, node: str) -> Proc:
        return next(p for p in self.agents() if p.node == node)

    def log(self, node: str) -> str:
        text = ""
        for name in (f"{node}.log", f"{node}.train.log"):
            with contextlib.suppress(OSError):
                text += (self.workdir / name).read_text(errors="replace")
        return text

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(f"[{n.name}] " + "\n".join(self.log(n.name).splitlines()[-lines:])
                         for n in self.cluster.nodes)

    def stop(self) -> None:
        for p in self.procs():  # stopped ones first continued, so that they die of SIGKILL at once
            with contextlib.suppress(OSError):
                os.kill(p.host_pid, signal.SIGCONT)
        for _ in range(3):
            for p in self.procs():
                with contextlib.suppress(OSError):
                    os.kill(p.host_pid, signal.SIGKILL)
            time.sleep(0.3)
        for proc in self.launchers:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=15)


@dataclass
class Ctx:
    cluster: Cluster
    spec: "Spec"
    workdir: Path
    job: Optional[Job] = None
    notes: List[str] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)
    culprit_pids: List[int] = field(default_factory=list)  # host pids of the culprit process(es) (may be none)

    def node(self, name: str) -> Node:
        return self.cluster[name]


@dataclass
class Spec:
    name: str
    culprit: str  # "rank N", "agent nodeXX", "none nodeXX" (no process), "none port" (nothing listens)
    node: str
    train_args: List[str] = field(default_factory=list)
    max_restarts: int = 0
    prepare: Optional[Callable[[Ctx], None]] = None
    launch_override: Optional[Callable[[Ctx, Node, List[str]], List[str]]] = None  # a node's launcher argv
    tee: bool = False
    act: Optional[Callable[[Ctx], None]] = None  # what is done to the running job, then waits until hung

    @property
    def rank(self) -> Optional[int]:
        return int(self.culprit.split()[1]) if self.culprit.startswith("rank ") else None


# --- data ---------------------------------------------------------------------------------------------------

def write_data(ctx: Ctx) -> None:
    folder = ctx.workdir / "data"
    folder.mkdir(exist_ok=True)
    for rank in range(WORLD):
        rng = random.Random(rank * 7919 + 17)
        lines = []
        for _ in range(64):
            ids = [[rng.randrange(1000) for _ in range(12)] for _ in range(8)]
            y = [round(sum(r) / (len(r) * 1000) - 0.5, 4) for r in ids]
            lines.append(json.dumps({"ids": ids, "y": y}))
        (folder / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    ev = ctx.workdir / "eval"
    ev.mkdir(exist_ok=True)
    for rank in range(WORLD):
        count = 0 if (ctx.spec.name == "exit_barrier_reporter_thread" and rank == 3) else 64
        (ev / f"{rank}.json").write_text(json.dumps({"count": count, "sq_err": 0.021 * count}))


# --- waiting -------------------------------------------------------------------------------------------------

def wait_log(ctx: Ctx, node: str, pattern: str, timeout: float = 180, count: int = 1) -> None:
    assert ctx.job is not None
    rx = re.compile(pattern)
    wait_until(lambda: len(rx.findall(ctx.job.log(node))) >= count, timeout,
               f"{node}'s log to show {pattern!r} x{count}", interval=0.3)


def settled(ctx: Ctx, pids: Callable[[], List[int]], what: str, timeout: float = 120, settle: float = SETTLE,
            skip_polling: bool = True) -> None:
    """Until the main threads of `pids()` (re-read each time) are unchanged (state, syscall, cpu, switches) for
    `settle` seconds, and not running."""
    seen: Dict[int, Any] = {}
    since = [time.monotonic()]

    def still() -> bool:
        now = time.monotonic()
        cur = {}
        for pid in pids():
            s = _main_thread(pid)
            if s is None:
                continue
            cur[pid] = s
        if not cur or cur != seen or any(s[1] == "running" for s in cur.values()):
            seen.clear()
            seen.update(cur)
            since[0] = now
            return False
        return now - since[0] >= settle

    wait_until(still, timeout, what, interval=0.25)


def asleep_in_polls(ctx: Ctx, pids: Callable[[], List[int]], seconds: float) -> None:
    """For processes that poll (a rendezvous loop, a connect retry): alive and not on a CPU, `seconds` on end."""
    start = time.monotonic()

    def ok() -> bool:
        ps = pids()
        if not ps:
            raise RuntimeError(f"{ctx.spec.name}: the processes to watch are gone:\n{ctx.job.log_tail()}")
        return time.monotonic() - start >= seconds

    wait_until(ok, seconds + 30, "the polling processes to stay", interval=0.5)


# --- the scenarios' set-ups ------------------------------------------------------------------------------------

def launch_own_endpoint(ctx: Ctx, node: Node, argv: List[str]) -> List[str]:
    if node.name != ctx.spec.node:
        return argv
    i = argv.index("--rdzv-endpoint")
    port = argv[i + 1].rsplit(":", 1)[1]
    return [*argv[:i + 1], f"{node.name}:{port}", *argv[i + 2:]]


def launch_other_id(ctx: Ctx, node: Node, argv: List[str]) -> List[str]:
    if node.name != ctx.spec.node:
        return argv
    i = argv.index("--rdzv-id")
    return [*argv[:i + 1], ctx.extra["other_id"], *argv[i + 2:]]


def agents_in_rendezvous(ctx: Ctx) -> None:
    """Each node's launcher logged its attempt to join the rendezvous, no rank exists, and they stay."""
    for n in ctx.cluster.nodes:
        wait_log(ctx, n.name, r"Rendezvous'ing worker group")
    asleep_in_polls(ctx, lambda: [a.host_pid for a in ctx.job.agents()] if len(ctx.job.agents()) == NODES else [],
                    8)
    if ctx.job.workers():
        raise RuntimeError("ranks started: the rendezvous completed")
    ctx.culprit_pids = [ctx.job.agent(ctx.spec.node).host_pid]


def prep_other_id(ctx: Ctx) -> None:
    ctx.extra["other_id"] = f"run{secrets.randbelow(9000) + 1000}"


def stop_store_host(ctx: Ctx) -> None:
    wait_log(ctx, "node01", r"step \d+/")
    agent = ctx.job.agent("node01")
    os.kill(agent.host_pid, signal.SIGSTOP)
    ctx.notes.append(f"node01's torchrun (host pid {agent.host_pid}) SIGSTOPped once rank 0 logged a step")
    ctx.culprit_pids = [agent.host_pid]
    settled(ctx, lambda: [w.host_pid for w in ctx.job.workers()], "every rank blocked")
    if len(ctx.job.workers()) != WORLD:
        raise RuntimeError("not every rank is there")


def prep_host_config(ctx: Ctx) -> None:
    folder = ctx.workdir / "hosts"
    folder.mkdir()
    for n in ctx.cluster.nodes:
        if n.name != ctx.spec.node:
            (folder / f"{n.name}.json").write_text(json.dumps({"threads": 1, "pin": "0-1"}))
    ctx.spec.train_args = ["--host-config", str(folder)]  # a copy per run: Spec is per scenario


def node_gone(ctx: Ctx) -> None:
    culprit = ctx.spec.node
    wait_until(lambda: not any(a.node == culprit for a in ctx.job.agents())
               and len(ctx.job.workers(restart=None)) == WORLD - RANKS_PER_NODE, 240,
               f"{culprit}'s launcher gone and the other ranks started", interval=0.5)
    settled(ctx, lambda: [w.host_pid for w in ctx.job.workers()], "the other ranks blocked", timeout=180)
    ctx.culprit_pids = []


def rank_left_at_exit(ctx: Ctx) -> None:
    rank = ctx.spec.rank
    wait_until(lambda: [w.rank for w in ctx.job.workers()] == [rank], 240, f"only rank {rank} left", interval=0.5)
    ctx.culprit_pids = [ctx.job.workers()[0].host_pid]
    for n in ctx.cluster.nodes:
        if n.name != ctx.spec.node:
            wait_log(ctx, n.name, r"Waiting 300 seconds for other agents to finish|Local worker group finished")
    settled(ctx, lambda: ctx.culprit_pids, f"rank {rank} blocked")


def stop_foreground_pipeline(ctx: Ctx) -> None:
    node = ctx.spec.node
    wait_log(ctx, node, r"step \d+/")
    # what Ctrl-Z in that node's terminal does to the foreground job: the shell's pipeline (torchrun | tee) stops;
    # the ranks, in sessions of their own, go on
    procs = [p for p in ctx.job.procs() if p.node == node and p.rank is None]
    for p in procs:
        os.kill(p.host_pid, signal.SIGSTOP)
    ctx.notes.append(f"{node}: SIGSTOP to its launch pipeline {[(p.host_pid, p.cmdline[:40]) for p in procs]}")
    ctx.extra["dump"] = [p.host_pid for p in procs]
    rank = ctx.spec.rank
    pid = next(w.host_pid for w in ctx.job.workers() if w.rank == rank)
    wait_until(lambda: (_main_thread(pid) or ("", ""))[1] == "1", 120, f"rank {rank} blocked in write", interval=0.3)
    ctx.culprit_pids = [pid]
    settled(ctx, lambda: [w.host_pid for w in ctx.job.workers()], "every rank blocked")


def stop_agent_then_kill(ctx: Ctx) -> None:
    node = ctx.spec.node
    wait_log(ctx, "node01", r"step \d+/")
    agent = ctx.job.agent(node)
    os.kill(agent.host_pid, signal.SIGSTOP)
    time.sleep(1)  # a moment later, elsewhere: the kernel's OOM killer takes one rank (SIGKILL)
    victim = next(w for w in ctx.job.workers() if w.rank == 7)
    os.kill(victim.host_pid, signal.SIGKILL)
    ctx.notes.append(f"{node}'s torchrun (host pid {agent.host_pid}) SIGSTOPped; 1 s later rank 7 (host pid "
                     f"{victim.host_pid}) SIGKILLed")
    ctx.culprit_pids = [agent.host_pid]
    for n in ctx.cluster.nodes:
        if n.name != node:
            wait_log(ctx, n.name, r"Rendezvous'ing worker group", count=2)
    wait_until(lambda: not [w for w in ctx.job.workers() if w.node != node], 120,
               "the other nodes' ranks gone", interval=0.5)
    asleep_in_polls(ctx, lambda: [a.host_pid for a in ctx.job.agents()], 8)


def prep_config(ctx: Ctx) -> None:
    cfg = ctx.workdir / "run.json"
    cfg.write_text(json.dumps({"dist": {"port": 29500, "backend": "gloo"}, "optim": {"lr": 0.05}}))
    ctx.spec.train_args = ["--config", str(cfg)]


def ranks_retrying(ctx: Ctx) -> None:
    wait_until(lambda: len(ctx.job.workers()) == WORLD, 180, "every rank started", interval=0.5)
    asleep_in_polls(ctx, lambda: [w.host_pid for w in ctx.job.workers()], 15)
    if any("step " in ctx.job.log(n.name) for n in ctx.cluster.nodes):
        raise RuntimeError("the job trains")
    ctx.culprit_pids = []


SPECS: List[Spec] = [
    Spec("rdzv_endpoint_own_host", "agent node04", "node04", launch_override=launch_own_endpoint,
         act=agents_in_rendezvous),
    Spec("store_host_agent_stopped", "agent node01", "node01", train_args=["--eval-every", "200"],
         act=stop_store_host),
    Spec("restarts_exhausted_node_gone", "none node03", "node03", max_restarts=1, prepare=prep_host_config,
         act=node_gone),
    Spec("exit_barrier_reporter_thread", "rank 3", "node02", train_args=["--steps", "60", "--report-every", "5"],
         act=rank_left_at_exit),
    Spec("tee_pipeline_stopped", "rank 4", "node03", train_args=["--log-every", "1"], tee=True,
         act=stop_foreground_pipeline),
    Spec("agent_stopped_restart_round", "agent node02", "node02", max_restarts=3, act=stop_agent_then_kill),
    Spec("master_port_overridden", "none port", "node01", prepare=prep_config, act=ranks_retrying),
    Spec("rdzv_id_differs", "agent node02", "node02", prepare=prep_other_id, launch_override=launch_other_id,
         act=agents_in_rendezvous),
]
BY_NAME = {s.name: s for s in SPECS}


def _launch(ctx: Ctx) -> Job:
    spec = ctx.spec
    job = Job(secrets.token_hex(4), ctx.workdir, ctx.cluster)
    master = ctx.cluster.nodes[0]
    port = _free_port(master)
    while port == 29500:
        port = _free_port(master)
    for node in ctx.cluster.nodes:
        argv = [TORCHRUN, "--nnodes", str(NODES), "--nproc-per-node", str(RANKS_PER_NODE),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master.name}:{port}", "--rdzv-id", "run7",
                "--max-restarts", str(spec.max_restarts), "--monitor-interval", "1",
                str(TRAIN), "--workdir", str(ctx.workdir), *spec.train_args]
        if spec.launch_override is not None:
            argv = spec.launch_override(ctx, node, argv)
        env = {MARK: job.mark, "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO", "PYTHONUNBUFFERED": "0"}
        with open(ctx.workdir / f"{node.name}.log", "ab") as log:
            if spec.tee:
                line = " ".join(f"'{a}'" for a in argv) + f" 2>&1 | tee -a '{ctx.workdir / (node.name + '.train.log')}'"
                job.launchers.append(node.spawn(["/bin/sh", "-c", line], env=env, cwd=str(ctx.workdir),
                                                stdout=subprocess.DEVNULL, stderr=log))
            else:
                job.launchers.append(node.spawn(argv, env=env, cwd=str(ctx.workdir), stdout=log,
                                                stderr=subprocess.STDOUT))
    return job


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    """The scenario's job, hung for good; everything it started is killed and removed on exit."""
    import copy

    spec = copy.deepcopy(spec)
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="job-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir)
        write_data(ctx)
        if spec.prepare is not None:
            spec.prepare(ctx)
        ctx.job = _launch(ctx)
        stack.callback(ctx.job.stop)
        assert spec.act is not None
        spec.act(ctx)
        workers = ctx.job.workers()
        layout = {w.rank: w.node for w in workers}
        bad = {r: n for r, n in layout.items() if n != node_of(r)}
        if bad:
            raise RuntimeError(f"ranks not where the truth puts them: {bad}")
        ctx.notes.append(f"ranks alive: {sorted(layout)}; agents: "
                         f"{[(a.node, a.host_pid, a.state) for a in ctx.job.agents()]}; culprit host pids "
                         f"{ctx.culprit_pids}")
        yield ctx
