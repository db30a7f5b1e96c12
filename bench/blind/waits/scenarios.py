"""The blind wait set's scenarios: how each one is set up on the test cluster, started, and held hung.

Each scenario is bench/blind/waits/train.py (a gloo job, 4 nodes x 2 ranks, torchrun on every node of a
tests/support/cluster.py cluster) with one feature switched on and the circumstances that make it block on one
rank (a client that never comes, a killed or stopped helper process, a leftover lock file, a missing agent). `live(cluster, spec)` starts it, returns once it is
hung for good (tests/support/jobs.py's wait-until-still logic, never a sleep), and kills everything in `finally`.

What each scenario is (the culprit, the blocking call, what it waits for, who could release it) is written in
truth.json, from this set-up; nothing here reads how hangscope analyses a snapshot.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(REPO / "tests"), str(REPO / "tests" / "support")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import jobs  # noqa: E402
from cluster import Cluster, Node  # noqa: E402
from jobs import PYTHON, Job, _main_thread, start_job  # noqa: E402
from record_scenarios import others_still  # noqa: E402
from waiting import wait_until  # noqa: E402

TRAIN = HERE / "train.py"
SERVICES = HERE / "services.py"
NODES, RANKS_PER_NODE = 4, 2
START_TIMEOUT = 180.0  # seconds for torch to start on 8 ranks of a loaded 2-core machine


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

    def log(self, name: str) -> str:
        assert self.job is not None
        with contextlib.suppress(OSError):
            return (self.job.workdir / f"{name}.log").read_text(errors="replace")
        return ""

    def service(self, node: Optional[Node], argv: Sequence[str]) -> subprocess.Popen:
        """Start services.py (on `node`, or on the login side when None); returns once it printed `ready`;
        killed when the scenario ends."""
        cmd = [PYTHON, "-u", str(SERVICES), *argv]
        proc = (node.spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) if node is not None else
                subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True))

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
    after: Optional[Callable[[Ctx], None]] = None  # once every rank is at its ready step, before the final wait
    wait: str = "blocked"  # blocked: every rank's main thread still in one call; others: all but the culprit
    stdin: str = ""  # the launchers' stdin: "" /dev/null, "pipe" (nobody writes), "pty" (a terminal nobody types in)


# --- set-up helpers -------------------------------------------------------------------------------------------

def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _log_says(ctx: Ctx, node: str, text: str, what: str) -> None:
    wait_until(lambda: text in ctx.log(node), 60, what, interval=0.1)


def _children(host_pid: int) -> List[int]:
    out: List[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{host_pid}/task"):
            with contextlib.suppress(OSError):
                out += [int(c) for c in Path(f"/proc/{host_pid}/task/{tid}/children").read_text().split()]
    return out


def _state(host_pid: int) -> str:
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{host_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return ""


# --- the scenarios ---------------------------------------------------------------------------------------------

def _host_pid_of(ctx: Ctx, rank: int, ns_pid: int) -> int:
    """The host pid of the rank's child (or grandchild) whose pid in the node's namespace is ns_pid."""
    todo = _children(ctx.host_pid(rank))
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("NSpid:") and int(line.split()[-1]) == ns_pid:
                    return pid
        todo += _children(pid)
    return 0


def prep_weight_server(ctx: Ctx) -> None:
    ctx.args += ["--port", "29650"]
    ctx.notes.append("rank 0 serves its weights on node01:29650 every 3 steps; no rollout worker is running (it "
                     "would connect from outside the job)")


def after_oom_kill(ctx: Ctx) -> None:
    found: dict = {}

    def huge() -> bool:
        m = re.search(r"tokenizer worker (\d+): huge document", ctx.log("node01"))
        if m:
            found["pid"] = _host_pid_of(ctx, 1, int(m.group(1)))
        return bool(found.get("pid"))

    wait_until(huge, 60, "rank 1's tokenizer worker to start on the huge document", interval=0.05)
    os.kill(found["pid"], signal.SIGKILL)  # what the OOM killer does
    ctx.notes.append(f"rank 1's pool worker (host pid {found['pid']}) growing on the huge document: SIGKILLed, as "
                     "the OOM killer would")


def prep_stale_lock(ctx: Ctx) -> None:
    cache = ctx.workdir / "cache" / "node02"
    cache.mkdir(parents=True)
    (cache / "index.lock").write_text("48213\n")  # the crashed run's pid: no such process
    ctx.notes.append(f"{cache / 'index.lock'} left by a crashed earlier run (pid 48213, gone)")


def after_stop_manager(ctx: Ctx) -> None:
    path = ctx.workdir / "manager-rank3.pid"
    wait_until(lambda: path.exists() and path.read_text().strip(), 60, "rank 3's manager pid file")
    pid = _host_pid_of(ctx, 3, int(path.read_text()))
    if not pid:
        raise RuntimeError("rank 3's manager process not found")
    os.kill(pid, signal.SIGSTOP)
    ctx.notes.append(f"rank 3's multiprocessing.Manager server process (host pid {pid}) SIGSTOPped")


def prep_snapshot_agents(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        if name != "node03":
            ctx.service(ctx.node(name), ["snapshot-agent", "--spool", str(ctx.workdir / "spool" / name)])
    ctx.notes.append("snapshot agents watch the spool folders of node01, node02 and node04; node03's is not running")


def prep_ckpt_hook(ctx: Ctx) -> None:
    ok = ("#!/bin/sh\n# FAKE site hook (bench/blind/waits): register the checkpoint, print a line\n"
          "echo \"registered $1\"\n")
    daemon = ("#!/bin/sh\n# FAKE site hook (bench/blind/waits), node04's newer version: also starts the checkpoint "
              "indexer in the background (its stdout not redirected)\n"
              "ckpt-indexer --watch \"$(dirname \"$1\")\" &\necho \"registered $1, indexer started\"\n")
    indexer = "#!/bin/sh\n# FAKE checkpoint indexer (bench/blind/waits): a daemon that runs forever\n" \
              "while :; do sleep 60; done\n"
    scripts = {name: (daemon if name == "node04" else ok) for name in ctx.cluster.names[:NODES]}
    fake_tool(ctx, "ckpt-hook", scripts)
    fake_tool(ctx, "ckpt-indexer", {"node04": indexer})
    ctx.notes.append("a FAKE `ckpt-hook` on every node's PATH; node04's starts `ckpt-indexer &` holding its stdout")


def prep_collectors(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        stop = ["--stop-reading-after", str(3 * 8 << 20)] if name == "node04" else []
        ctx.service(ctx.node(name), ["collector", "--port", "8126", *stop])
    ctx.args += ["--port", "8126", "--hist-mb", "8"]
    ctx.notes.append("a metrics collector on 127.0.0.1:8126 on every node; node04's stops reading its connection "
                     "after 24 MiB")


def prep_registry(ctx: Ctx) -> None:
    host = ctx.cluster.login_ip
    port = _free_port(host)
    ctx.service(None, ["registry", "--host", host, "--port", str(port), "--retry-after", "3600"])
    ctx.args += ["--endpoint", f"{host}:{port}"]
    ctx.notes.append(f"model registry on the login side at {host}:{port}; answers 429 Retry-After: 3600")


def fake_tool(ctx: Ctx, name: str, scripts: dict) -> None:
    for node_name, text in scripts.items():
        path = ctx.node(node_name).bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
        ctx.stack.callback(path.unlink, missing_ok=True)


def after_died(thread_error: str, rank: int) -> Callable[[Ctx], None]:
    def after(ctx: Ctx) -> None:
        _log_says(ctx, node_of(rank), thread_error, f"the thread of rank {rank} to die with {thread_error}")
    return after


SPECS: List[Spec] = [
    Spec("accept_rollout_worker", (0,), "weight_server", prepare=prep_weight_server),
    Spec("pool_worker_killed", (1,), "tokenizer_pool", ["--huge-doc", "1:3"], after=after_oom_kill),
    Spec("stale_lockfile", (2,), "cache_lock", prepare=prep_stale_lock, wait="others"),
    Spec("manager_stopped", (3,), "shared_stats", after=after_stop_manager),
    Spec("sigwait_ack", (4,), "snapshot_handshake", prepare=prep_snapshot_agents),
    Spec("join_blocked_thread", (5,), "profiler", ["--profile-rank", "5"]),
    Spec("pipe_grandchild", (6,), "ckpt_hook", prepare=prep_ckpt_hook),
    Spec("sendall_full", (7,), "histograms", prepare=prep_collectors),
    Spec("barrier_party_died", (6,), "packer", ["--ragged-rank", "6", "--ragged-at", "3"],
         after=after_died("PackingError", 6)),
    Spec("sleep_retry_after", (1,), "registry", ["--registry-rank", "1"], prepare=prep_registry),
]
BY_NAME = {s.name: s for s in SPECS}


class _Launch:
    """A cluster node as tests/support/jobs.py's Place whose launches get `stdin` (a pipe or a terminal)."""

    def __init__(self, node: Node, stdin: int) -> None:
        self._node, self._stdin = node, stdin

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    def spawn(self, argv: Any, env: Any = None, cwd: str = "/", **popen_kw: Any) -> subprocess.Popen:
        popen_kw.setdefault("stdin", self._stdin)
        return self._node.spawn(argv, env=env, cwd=cwd, **popen_kw)


def _start(ctx: Ctx, wait: bool) -> Job:
    spec = ctx.spec
    args = ["--feature", spec.feature, "--workdir", str(ctx.workdir), "--ready-step", str(spec.ready_step),
            *spec.args, *ctx.args]
    if not spec.stdin:
        return start_job(ctx.cluster, spec.name, nodes=NODES, ranks_per_node=RANKS_PER_NODE, timeout=START_TIMEOUT,
                         extra_args=args, wait=wait, script=TRAIN)
    if spec.stdin == "pipe":
        fd, keep = os.pipe()  # the launching session holds the write end and never writes
    else:
        keep, fd = os.openpty()  # the terminal the job was started from; nobody types in it
    ctx.stack.callback(os.close, keep)
    try:
        places = [_Launch(node, fd) for node in ctx.cluster.nodes[:NODES]]
        job = jobs._launch(places, spec.name, RANKS_PER_NODE, None, spec.ready_step, args, standalone=False,
                           script=TRAIN)
    finally:
        os.close(fd)
    return jobs._finish(job, START_TIMEOUT, wait)


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    """The scenario's job, hung; everything it started is killed and removed on exit."""
    with contextlib.ExitStack() as stack:
        # a neutral name: the headline may quote paths under it, and the scenario's name holds scoring words
        # (the first run's workdirs were named hangscope-blind-<scenario>-*; see FIRST-RUN.md)
        workdir = Path(tempfile.mkdtemp(prefix="hangscope-blind-job-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir, stack)
        if spec.prepare is not None:
            spec.prepare(ctx)
        blocked_at_start = spec.wait == "blocked" and spec.after is None
        ctx.job = _start(ctx, wait=blocked_at_start)
        stack.callback(ctx.job.stop)
        if spec.after is not None:
            spec.after(ctx)
        if spec.wait == "blocked":
            if not blocked_at_start:
                ctx.job.wait_blocked(timeout=120)
        else:
            for culprit in spec.culprits:
                others_still(ctx.job, culprit, timeout=120)
        for culprit in spec.culprits:  # the culprit is where the set-up put it: at its ready step, alive
            if _main_thread(ctx.host_pid(culprit)) is None:
                raise RuntimeError(f"{spec.name}: rank {culprit} exited:\n{ctx.job.log_tail()}")
        yield ctx
