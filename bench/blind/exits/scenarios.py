"""The blind exit set's scenarios: how each one is set up on the test cluster, started, and held hung.

Each scenario is bench/blind/exits/train.py (a gloo job, 4 nodes x 2 ranks, torchrun on every node of a
tests/support/cluster.py cluster) with one feature switched on and the circumstances that make one rank hang on its
way out (its end-of-run code, or its interpreter's exit after an exception or an early exit) while the others wait
for it in a collective. `live(cluster, spec)` starts it, returns once it is hung for good (wait-until logic: every
rank's main thread still in one call, seen the same twice, and the culprit's threads unchanged for SETTLE seconds;
never a sleep that hopes), and kills everything in `finally`.

What each scenario is (the culprit, the blocking call, what it waits for, who could release it) is written in
truth.json, from this set-up; nothing here reads how hangscope analyses a snapshot.
"""

from __future__ import annotations

import contextlib
import os
import pty
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import threading
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
EVENTS_FIFO = "/run/job-events.fifo"  # train.py's EVENTS


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
    launch: Any = None  # the cluster the launchers are started on (a terminal for one node's launcher), or None
    notes: List[str] = field(default_factory=list)  # what the set-up did, for the record (pids, addresses)
    extra: Dict[str, Any] = field(default_factory=dict)

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
    started: Optional[Callable[[Ctx], None]] = None  # once every rank is ready (at step --ready-step)


# --- the set-ups -------------------------------------------------------------------------------------------------

def prep_eval(ctx: Ctx) -> None:
    """Every rank's held-out shard, eval/rank<R>.pt (64 samples); every scenario has them, some spoil one."""
    import torch

    folder = ctx.workdir / "eval"
    folder.mkdir()
    for rank in range(WORLD):
        gen = torch.Generator().manual_seed(50_000 + rank)
        x = torch.randn(64, 16, generator=gen)
        torch.save({"x": x, "y": x.sum(dim=1, keepdim=True) * 0.1}, folder / f"rank{rank}.pt")


def prep_preds_dir(ctx: Ctx) -> None:
    (ctx.workdir / "preds" / "rank5.bin").mkdir(parents=True)
    (ctx.workdir / "preds" / "rank5.bin" / "part-0000").write_bytes(b"\0" * 64)
    ctx.notes.append("preds/rank5.bin is a directory (left from an earlier export, one part file in it): rank 5's "
                     "prediction writer cannot open it and exits with code 1 at once")


def prep_missing_eval(ctx: Ctx) -> None:
    (ctx.workdir / "eval" / "rank2.pt").unlink()
    ctx.notes.append("eval/rank2.pt is missing: rank 2's final evaluation raises FileNotFoundError")


def prep_gateway(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        ctx.service(ctx.node(name), ["object-gateway", "--port", "9107", *(["--stall"] if name == "node04" else [])])
    import torch

    path = ctx.workdir / "eval" / "rank6.pt"
    shard = torch.load(path)
    shard["y"][17, 0] = float("nan")
    torch.save(shard, path)
    ctx.notes.append("an object-storage gateway on 127.0.0.1:9107 on every node; node04's upstream hangs: it reads "
                     "each PUT and never answers. eval/rank6.pt holds a NaN target: rank 6's final evaluation raises "
                     "FloatingPointError")


def prep_corrupt_eval(ctx: Ctx) -> None:
    path = ctx.workdir / "eval" / "rank3.pt"
    path.write_bytes(path.read_bytes()[:200])
    ctx.notes.append("eval/rank3.pt is truncated to 200 bytes: rank 3's torch.load raises in the final evaluation")


def prep_terminal(ctx: Ctx) -> None:
    """node01's launcher runs in a terminal (a pty, as in a tmux pane): its stdin, stdout and stderr; a reader
    (the terminal emulator) drains the pty's output all along."""
    master, slave = pty.openpty()
    iflag = termios.tcgetattr(slave)[0]
    if not iflag & termios.IXON:
        raise RuntimeError("the new pty has no IXON: Ctrl-S would not stop its output")
    seen = bytearray()

    def emulator() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            seen.extend(data)

    reader = threading.Thread(target=emulator, name="terminal-emulator", daemon=True)
    reader.start()

    def close() -> None:
        with contextlib.suppress(OSError):
            os.close(slave)
        with contextlib.suppress(OSError):
            os.close(master)
        reader.join(timeout=5)

    ctx.stack.callback(close)
    ctx.extra.update(master=master, seen=seen)
    ctx.launch = TerminalCluster(ctx.cluster, "node01", slave)
    ctx.notes.append(f"node01's torchrun runs with a pty ({os.ttyname(slave)}) as stdin, stdout and stderr; the pty's "
                     f"output is read all along")


def press_ctrl_s(ctx: Ctx) -> None:
    """Ctrl-S typed in node01's terminal (the line discipline stops the terminal's output: IXON)."""
    os.write(ctx.extra["master"], b"\x13")
    ctx.notes.append(f"Ctrl-S typed into node01's terminal once every rank was ready (output so far: "
                     f"{len(ctx.extra['seen'])} bytes)")


def prep_events(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        node = ctx.node(name)
        ctx.stack.callback(node.run, ["rm", "-f", EVENTS_FIFO], check=False)
        if name == "node03":
            node.run(["mkfifo", "-m", "666", EVENTS_FIFO])
        else:
            ctx.service(node, ["event-daemon", "--fifo", EVENTS_FIFO])
    ctx.notes.append(f"{EVENTS_FIFO} on every node, each node's own /run; the job-event daemon reads it on node01, "
                     f"node02 and node04; on node03 it is not running (the FIFO is there, no reader)")


def prep_empty_val(ctx: Ctx) -> None:
    import torch

    torch.save({"x": torch.zeros(0, 16), "y": torch.zeros(0, 1)}, ctx.workdir / "eval" / "rank7.pt")
    ctx.notes.append("eval/rank7.pt is empty (0 samples): rank 7's validation loss is NaN, never an improvement")


class TerminalNode:
    """A node whose spawned processes (the launcher) get the terminal `fd` as stdin, stdout and stderr."""

    def __init__(self, node: Node, fd: int) -> None:
        self._node, self._fd = node, fd

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    def spawn(self, argv: Any, *a: Any, **popen_kw: Any) -> subprocess.Popen:
        popen_kw.update(stdin=self._fd, stdout=self._fd, stderr=self._fd)
        return self._node.spawn(argv, *a, **popen_kw)


class TerminalCluster:
    """The cluster, with one node's launcher started in a terminal."""

    def __init__(self, cluster: Cluster, name: str, fd: int) -> None:
        self._cluster = cluster
        self._wrapped = {name: TerminalNode(cluster[name], fd)}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    def __getitem__(self, name: str) -> Any:
        return self._wrapped.get(name) or self._cluster[name]

    @property
    def nodes(self) -> List[Any]:
        return [self._wrapped.get(n.name, n) for n in self._cluster.nodes]


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


def threads_of(pid: int) -> Dict[str, Sample]:
    """Every thread of `pid` as (state, syscall, cpu ticks, context switches), gloo's polling thread left out."""
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


# --- the scenarios ------------------------------------------------------------------------------------------------

SPECS: List[Spec] = [
    Spec("mpqueue_feeder_dead_reader", (5,), "pred_stream", prepare=prep_preds_dir),
    Spec("mp_child_join_waits_sentinel", (2,), "ckpt_mirror", prepare=prep_missing_eval),
    Spec("threadpool_atexit_stalled_upload", (6,), "ckpt_upload", prepare=prep_gateway),
    Spec("atexit_allreduce_metrics_group", (3,), "metrics_agg", prepare=prep_corrupt_eval),
    Spec("console_report_stopped_tty", (0,), "console_report", prepare=prep_terminal, started=press_ctrl_s),
    Spec("finalize_thread_join_fifo", (4,), "ckpt_finalize", prepare=prep_events),
    Spec("early_exit_prefetch_thread_put", (7,), "prefetch_early_stop", prepare=prep_empty_val),
    Spec("gzip_wait_pipe_held_by_fork", (1,), "trace_stats", ["--trace-rank", "1"]),
]
BY_NAME = {s.name: s for s in SPECS}


def _start(ctx: Ctx) -> Job:
    spec = ctx.spec
    args = ["--feature", spec.feature, "--workdir", str(ctx.workdir), *spec.args, *ctx.args]
    # the job's name (Job.scenario) names nothing the nodes see; the workdir below is neutral too
    return start_job(ctx.launch or ctx.cluster, "blind", nodes=NODES, ranks_per_node=RANKS_PER_NODE,
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
        prep_eval(ctx)
        if spec.prepare is not None:
            spec.prepare(ctx)
        ctx.job = _start(ctx)
        stack.callback(ctx.job.stop)
        if spec.started is not None:
            spec.started(ctx)
        all_still(ctx, timeout=120)
        wait_settled(ctx)
        for culprit in spec.culprits:  # the culprit is where the set-up put it: alive
            if _main_thread(ctx.host_pid(culprit)) is None:
                raise RuntimeError(f"{spec.name}: rank {culprit} exited:\n{ctx.job.log_tail()}")
        ctx.notes.append(f"culprit host pid(s): {[ctx.host_pid(r) for r in spec.culprits]}")
        yield ctx
