"""The blind hang set's scenarios: how each one is set up on the test cluster, started, and held hung.

Each scenario is bench/blind/hangs/train.py (a gloo job, 4 nodes x 2 ranks, torchrun on every node of a
tests/cluster.py cluster) with one feature switched on and the circumstances that make it block on some ranks
(a stalled service, a leftover file, a bad record, a signal). `live(cluster, spec)` starts it, returns once it is
hung for good (tests/jobs.py's wait-until-still logic, never a sleep), and kills everything in `finally`.

What each scenario is (the culprit, the blocking call, what it waits for, who could release it) is written in
truth.json, from this set-up; nothing here reads how hangscope analyses a snapshot.
"""

from __future__ import annotations

import contextlib
import os
import platform
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
for _p in (str(REPO), str(REPO / "tests")):
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
_NANOSLEEP = {"x86_64": "230", "aarch64": "115"}.get(platform.machine(), "230")  # clock_nanosleep


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


# --- the scenarios --------------------------------------------------------------------------------------------

def prep_future(ctx: Ctx) -> None:
    host = ctx.cluster.login_ip
    port = _free_port(host)
    ctx.service(None, ["objectstore", "--host", host, "--port", str(port), "--stall-key", "ckpt/step2/rank2.pt"])
    ctx.args += ["--endpoint", f"{host}:{port}", "--every", "1"]
    ctx.notes.append(f"object store on the login side at {host}:{port}; the PUT of ckpt/step2/rank2.pt is never "
                     "answered")


def after_died(thread_error: str, rank: int) -> Callable[[Ctx], None]:
    def after(ctx: Ctx) -> None:
        _log_says(ctx, node_of(rank), thread_error, f"the thread of rank {rank} to die with {thread_error}")
    return after


def prep_state_writer(ctx: Ctx) -> None:
    shards = ctx.workdir / "shards"
    shards.mkdir()
    (shards / "rank7").write_text("left by an earlier run's copy script\n")  # a file where rank 7's folder goes


def after_zombie(ctx: Ctx) -> None:
    pid = ctx.host_pid(1)
    wait_until(lambda: any(_state(c) == "Z" for c in _children(pid)), 60, "rank 1's augment worker to be a zombie")
    ctx.notes.append("rank 1's augment worker process died of SIGSEGV and is a zombie")


def prep_node_metrics(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        stall = ["--stall-after", "3"] if name == "node03" else []
        ctx.service(ctx.node(name), ["agent", "--port", "8125", *stall])
    ctx.args += ["--port", "8125"]
    ctx.notes.append("a metrics agent on 127.0.0.1:8125 on every node; node03's stops answering after 3 lines")


def prep_tracker(ctx: Ctx) -> None:
    node = ctx.node("node01")
    ip = ctx.cluster.login_ip
    rule = ("OUTPUT", "-d", ip, "-p", "tcp", "--dport", "8443", "-j", "DROP")
    node.iptables("-A", *rule)
    ctx.stack.callback(node.iptables, "-D", *rule)
    # SYNs are retried for longer than a run of the set takes (the default gives up after ~2 minutes)
    knob = "/proc/sys/net/ipv4/tcp_syn_retries"
    old = node.run(["cat", knob]).stdout.strip()
    node.run(["sh", "-c", f"echo 10 > {knob}"])
    ctx.stack.callback(node.run, ["sh", "-c", f"echo {old} > {knob}"])
    ctx.args += ["--endpoint", f"{ip}:8443"]
    ctx.notes.append(f"tracker at {ip}:8443 (the login side, outside the job); node01 drops what it sends there")


def prep_checkpoint(ctx: Ctx) -> None:
    old = ctx.workdir / "ckpt" / "step3" / "rank1.pt"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"an earlier run's checkpoint\n")


def fake_tool(ctx: Ctx, name: str, scripts: dict) -> None:
    for node_name, text in scripts.items():
        path = ctx.node(node_name).bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
        ctx.stack.callback(path.unlink, missing_ok=True)


def prep_log_sync(ctx: Ctx) -> None:
    ok = "#!/bin/sh\n# FAKE aws CLI (bench/blind/hangs): the copy succeeds\nexit 0\n"
    stuck = ("#!/bin/sh\n# FAKE aws CLI (bench/blind/hangs): a copy that never finishes (a stalled transfer)\n"
             "sleep 2147483647\n")
    fake_tool(ctx, "aws", {name: (stuck if name == "node04" else ok) for name in ctx.cluster.names[:NODES]})
    ctx.notes.append("a FAKE `aws` on every node's PATH; node04's never exits")


def prep_metrics_file(ctx: Ctx) -> None:
    path = ctx.workdir / "node03" / "metrics.jsonl"
    path.parent.mkdir()
    proc = ctx.service(ctx.node("node03"), ["compact-metrics", str(path)])
    ctx.notes.append(f"services.py compact-metrics (host pid {proc.pid}'s child) holds an exclusive flock on {path}")


def prep_node_summary(ctx: Ctx) -> None:
    (ctx.workdir / "scratch" / "node02").mkdir(parents=True)


def prep_halo(ctx: Ctx) -> None:
    resume = ctx.workdir / "resume"
    resume.mkdir()
    (resume / "rank5.json").write_text('{"step": 1}\n')


def prep_reward(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        if name != "node02":
            ctx.service(ctx.node(name), ["agent", "--port", "8600"])
    ctx.args += ["--port", "8600"]
    ctx.notes.append("reward-model servers on 127.0.0.1:8600 on node01, node03 and node04; none on node02")


def prep_kernel_cache(ctx: Ctx) -> None:
    for name in ("node01", "node03", "node04"):  # warm caches: built by an earlier run
        folder = ctx.workdir / "kcache" / name
        folder.mkdir(parents=True)
        (folder / "fused.ready").write_text("ok\n")


def after_preempt(ctx: Ctx) -> None:
    """SIGUSR1 (SLURM's preemption notice) to rank 1 while it writes its regular checkpoint (under the lock)."""
    pid = ctx.host_pid(1)

    def writing() -> bool:
        sample = _main_thread(pid)
        return sample is not None and sample[1] == _NANOSLEEP

    wait_until(writing, 60, "rank 1 to be writing its checkpoint (throttled: asleep between shards)", interval=0.01)
    os.kill(pid, signal.SIGUSR1)
    _log_says(ctx, "node01", "SIGUSR1: preemption notice", "rank 1's handler to run")
    ctx.notes.append("SIGUSR1 sent to rank 1 while it wrote its step-3 checkpoint")


SPECS: List[Spec] = [
    Spec("future_upload", (2,), "async_checkpoint", prepare=prep_future),
    Spec("event_prefetch_died", (0,), "prefetch", ["--bad-record", "0:3"],
         after=after_died("DecodeError", 0)),
    Spec("condition_lost_wakeup", (5,), "ema", ["--ema-rank", "5"]),
    Spec("semaphore_leaked", (7,), "state_writer", ready_step=2, prepare=prep_state_writer),
    Spec("queue_producer_finished", (6,), "streaming", ["--shard-batches", "50,50,50,50,50,50,3,50"]),
    Spec("mpqueue_zombie", (1,), "augment", ["--bad-record", "1:3"], after=after_zombie),
    Spec("socket_sidecar", (4,), "node_metrics", prepare=prep_node_metrics),
    Spec("socket_connect_outside", (0,), "tracker", prepare=prep_tracker),
    Spec("fifo_open", (3,), "control", ["--control-rank", "3"]),
    Spec("stdin_input", (1,), "checkpoint", prepare=prep_checkpoint, stdin="pipe"),
    Spec("pdb_breakpoint", (2,), "nan_guard", ["--nan-at", "2:3"], stdin="pty"),
    Spec("subprocess_child", (6,), "log_sync", prepare=prep_log_sync),
    Spec("flock_external", (4, 5), "metrics_file", prepare=prep_metrics_file),
    Spec("lockf_peer_rank", (3,), "node_summary", prepare=prep_node_summary),
    Spec("store_key", (5,), "eval_on_ckpt", ["--eval-rank", "5"]),
    Spec("p2p_recv_peer_elsewhere", (7,), "handoff", ["--nan-at", "3:3"]),
    Spec("p2p_tag_mismatch", (5,), "halo", prepare=prep_halo),
    Spec("timer_poll", (3,), "reward", prepare=prep_reward, wait="others"),
    Spec("spin_wait", (2,), "kernel_cache", prepare=prep_kernel_cache, wait="others"),
    Spec("shutdown_nondaemon", (7,), "flusher", ["--val-sizes", "4,4,4,4,4,4,4,0"],
         after=after_died("KeyError: 'val_loss'", 7)),
    Spec("signal_handler_lock", (1,), "preemption", ["--writer-rank", "1", "--shards", "600"],
         after=after_preempt),
    Spec("asyncio_future", (4,), "async_shards", ["--bad-record", "4:3"],
         after=after_died("TransportError", 4)),
    Spec("self_deadlock", (6,), "spike_monitor", ["--spike-at", "6:3"]),
]
BY_NAME = {s.name: s for s in SPECS}


class _Launch:
    """A cluster node as tests/jobs.py's Place whose launches get `stdin` (a pipe or a terminal)."""

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
        workdir = Path(tempfile.mkdtemp(prefix=f"hangscope-blind-{spec.name}-"))
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
