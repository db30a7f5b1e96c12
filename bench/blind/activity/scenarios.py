"""The activity set's scenarios: how each job is started on the test cluster and brought to its intended state.

Each scenario is bench/blind/activity/job.py under torchrun on 4 nodes x 2 ranks (tests/cluster.py's network-
namespace cluster, tests/support/jobs.py's launcher) with some flags. `live(cluster, spec)` starts it and returns
only once it is really in its state, checked from outside the job (/proc and the job's own harness files, never a
sleep that hopes):

  hung:        every rank wrote its "entered" line for the hang step (the culprit: into its blocking call; the
               others: into the all_reduce), rank 0's steps.log stops before the hang step, the main threads that
               block (the culprit's unless it prints in a loop; the others' where they do not poll) sit unchanged in
               one syscall, and what should keep moving does (the /proc counters named by `moving`);
  progressing: every rank reached its ready step and rank 0 finished 2 more steps after it.

Everything the scenario started (the job on every node, a sidecar) is killed in `finally`.
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
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(REPO / "tests"), str(REPO / "tests" / "support")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import jobs  # noqa: E402
from cluster import Cluster  # noqa: E402
from jobs import PYTHON, Job, _main_thread  # noqa: E402
from waiting import wait_until  # noqa: E402

JOB = HERE / "job.py"
SERVICES = HERE / "services.py"
NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE
START_TIMEOUT = 180.0  # torch starting on 8 ranks of a loaded 2-core machine
STATUS_PORT = 9100


def node_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE + 1:02d}"


@dataclass
class Spec:
    name: str
    hung: bool
    args: List[str]
    culprit: int = -1
    # what must be seen moving in 1 s before hangscope runs: (counter, who, at least); counter: rchar, wchar (bytes
    # read/written through read/write, /proc/PID/io: files and pipes, not socket send/recv), cpu (user+system ticks
    # of all its threads), switches (context switches of all its threads; an idle rank makes ~100/s of its own),
    # tcp (TCP segments in+out of the rank's node, /proc/PID/net/snmp: socket traffic; nothing else talks while
    # the job is hung and hangscope has not started); who: all, others (every rank but the culprit), culprit
    moving: List[Tuple[str, str, int]] = field(default_factory=list)
    sidecar: bool = False
    ready_step: int = 2


def _hang(culprit: int, block: str, *extra: str, wait: str = "block") -> List[str]:
    return ["--culprit", str(culprit), "--hang-step", "3", "--block", block, "--wait", wait, *extra]


SPECS: List[Spec] = [
    # A. hung, while something keeps moving
    Spec("keepalive", True, _hang(5, "queue", "--heartbeat"), 5, [("tcp", "all", 10)]),
    Spec("alive_logger", True, _hang(2, "child", "--logger", "0.5"), 2, [("wchar", "all", 1)]),
    Spec("metrics_jsonl", True, _hang(6, "queue", "--metrics-file", "0.5"), 6, [("wchar", "all", 1)]),
    Spec("poll_sleep", True, _hang(1, "child", wait="poll_sleep"), 1, [("switches", "others", 150)]),
    Spec("poll_spin", True, _hang(4, "queue", wait="poll_spin"), 4, [("cpu", "others", 10)]),
    Spec("ema_thread", True, _hang(3, "child", "--ema"), 3, [("cpu", "all", 1), ("switches", "all", 130)]),
    Spec("prefetch_spin", True, _hang(0, "queue", "--prefetch-spin"), 0, [("switches", "all", 110)]),
    Spec("sidecar_http", True, _hang(7, "child", "--status-port", str(STATUS_PORT)), 7, [("tcp", "all", 10)],
         sidecar=True),
    Spec("keepalive_logging", True, _hang(6, "child", "--heartbeat", "--logger", "0.5"), 6,
         [("tcp", "all", 10), ("wchar", "all", 1)]),
    Spec("culprit_prints", True, _hang(5, "printwait"), 5, [("wchar", "culprit", 1)]),
    # B. progressing, and moving little between two samples 1 s apart
    Spec("slow_loop", False, ["--step-sleep", "0.3"]),
    Spec("long_compute", False, ["--compute-seconds", "4"]),
    Spec("checkpoint_io", False, ["--checkpoint-mb", "1024", "--print-steps"]),
    Spec("big_grads", False, ["--grad-mb", "4", "--print-steps"]),
    Spec("straggler", False, ["--slow-rank", "3", "--compute-seconds", "2.5", "--print-steps"]),
]
BY_NAME: Dict[str, Spec] = {s.name: s for s in SPECS}


@dataclass
class Ctx:
    cluster: Cluster
    spec: Spec
    workdir: Path
    job: Optional[Job] = None
    notes: List[str] = field(default_factory=list)
    last_delta: Dict[str, Dict[int, int]] = field(default_factory=dict)

    def host_pid(self, rank: int) -> int:
        assert self.job is not None
        return self.job.ranks[rank].host_pid

    def steps(self) -> List[int]:
        with contextlib.suppress(OSError):
            return [int(line.split()[0]) for line in (self.workdir / "steps.log").read_text().splitlines()
                    if line.strip()]
        return []

    def last_step(self) -> int:
        done = self.steps()
        return done[-1] if done else -1

    def entered(self) -> Dict[int, str]:
        with contextlib.suppress(OSError):
            lines = (self.workdir / "entered.jsonl").read_text().splitlines()
            return {int(d["rank"]): str(d["in"]) for d in (json.loads(x) for x in lines if x.strip())}
        return {}

    def log(self, node: str) -> str:
        assert self.job is not None
        with contextlib.suppress(OSError):
            return (self.job.workdir / f"{node}.log").read_text(errors="replace")
        return ""


# --- /proc counters -------------------------------------------------------------------------------------------

def counters(host_pid: int) -> Dict[str, int]:
    """rchar, wchar, cpu (ticks of all threads), switches (context switches of all threads) of a process."""
    out = {"rchar": 0, "wchar": 0, "cpu": 0, "switches": 0, "tcp": 0}
    base = Path(f"/proc/{host_pid}")
    snmp = [line.split() for line in (base / "net" / "snmp").read_text().splitlines() if line.startswith("Tcp:")]
    tcp = dict(zip(snmp[0][1:], snmp[1][1:]))
    out["tcp"] = int(tcp["InSegs"]) + int(tcp["OutSegs"])
    for line in (base / "io").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "wchar"):
            out[key] = int(value)
    stat = (base / "stat").read_text().rsplit(")", 1)[1].split()
    out["cpu"] = int(stat[11]) + int(stat[12])
    for task in os.scandir(base / "task"):
        with contextlib.suppress(OSError):
            for line in Path(task.path, "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    out["switches"] += int(line.split()[1])
    return out


def moving_now(ctx: Ctx, window: float = 1.0) -> Dict[str, Dict[int, int]]:
    """How much each counter of each rank moved in `window` seconds (the way two samples 1 s apart would see it)."""
    assert ctx.job is not None
    ranks = sorted(ctx.job.ranks)
    before = {r: counters(ctx.host_pid(r)) for r in ranks}
    time.sleep(window)  # the measuring window itself, not a wait for a state
    after = {r: counters(ctx.host_pid(r)) for r in ranks}
    return {k: {r: after[r][k] - before[r][k] for r in ranks} for k in ("rchar", "wchar", "cpu", "switches", "tcp")}


def _who(ctx: Ctx, who: str) -> List[int]:
    culprit = ctx.spec.culprit
    return {"all": list(range(WORLD)), "others": [r for r in range(WORLD) if r != culprit],
            "culprit": [culprit]}[who]


def check_moving(ctx: Ctx) -> Dict[str, Dict[int, int]]:
    delta = moving_now(ctx)
    missing = [f"{counter} of rank {r}" for counter, who, least in ctx.spec.moving for r in _who(ctx, who)
               if delta[counter][r] < least]
    ctx.last_delta = delta
    return delta if not missing else {}


# --- bringing a scenario to its state -------------------------------------------------------------------------

def _still(ctx: Ctx, ranks: Sequence[int]) -> bool:
    """The main threads of `ranks` sit in one syscall, unchanged over 0.5 s."""
    first = {r: _main_thread(ctx.host_pid(r)) for r in ranks}
    time.sleep(0.5)  # the stillness window, not a wait for a state
    for r in ranks:
        now = _main_thread(ctx.host_pid(r))
        if now is None:
            assert ctx.job is not None
            raise RuntimeError(f"rank {r} exited:\n{ctx.job.log_tail()}")
        if now != first[r] or now[1] == "running" or now[0] not in "SD":
            return False
    return True


def wait_hung(ctx: Ctx) -> None:
    spec = ctx.spec
    args = spec.args
    wait_until(lambda: len(ctx.entered()) == WORLD, 120, "every rank to enter its call of the hang step",
               interval=0.1)
    ent = ctx.entered()
    if ent[spec.culprit] == "all_reduce" or any(ent[r] != "all_reduce" for r in range(WORLD) if r != spec.culprit):
        raise RuntimeError(f"{spec.name}: unexpected calls entered: {ent}")
    block = args[args.index("--block") + 1]
    waits_blocking = args[args.index("--wait") + 1] == "block"
    still = ([spec.culprit] if block != "printwait" else []) + \
            ([r for r in range(WORLD) if r != spec.culprit] if waits_blocking else [])
    if still:
        wait_until(lambda: _still(ctx, still), 120, f"ranks {still} to sit still in their call", interval=0.1)
    if block == "printwait":
        node = node_of(spec.culprit)
        wait_until(lambda: ctx.log(node).count(f"[rank {spec.culprit}] waiting for") >= 2, 60,
                   "the culprit to print its waiting line", interval=0.1)
    try:
        delta = wait_until(lambda: check_moving(ctx), 60, f"{spec.moving} to keep moving", interval=0.1)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; last seen moving in 1 s: {ctx.last_delta}") from None
    ctx.notes.append("moving in 1 s before hangscope: " + json.dumps(delta))
    if ctx.last_step() != 2:
        raise RuntimeError(f"{spec.name}: rank 0's last completed step is {ctx.last_step()}, not 2")


def wait_progressing(ctx: Ctx) -> None:
    assert ctx.job is not None
    target = ctx.spec.ready_step + 2
    wait_until(lambda: ctx.last_step() >= target, 120, f"rank 0 to finish step {target}", interval=0.1)
    times = [float(line.split()[1]) for line in (ctx.workdir / "steps.log").read_text().splitlines()[-3:]]
    gaps = ", ".join(f"{b - a:.2f}" for a, b in zip(times, times[1:]))
    ctx.notes.append(f"steps done when hangscope starts: {ctx.last_step() + 1}; the last step gaps (s): {gaps}")


def start_sidecar(ctx: Ctx, stack: contextlib.ExitStack) -> None:
    assert ctx.job is not None
    urls = [f"http://{ctx.cluster[loc.node].ip}:{STATUS_PORT + loc.local_rank}/status"
            for _, loc in sorted(ctx.job.ranks.items())]
    proc = subprocess.Popen([PYTHON, "-u", str(SERVICES), "sidecar", "--every", "0.3", *urls],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
        assert proc.stdout is not None
        proc.stdout.close()

    stack.callback(stop)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode(errors="replace").strip()  # it answers once a full round succeeded
    if line != "ready":
        raise RuntimeError(f"the sidecar did not start: {line!r}")
    ctx.notes.append(f"sidecar (login side, pid {proc.pid}) polls {len(urls)} status endpoints every 0.3 s")


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    """The scenario's job in its state; everything it started is killed and removed on exit."""
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix=f"hangscope-activity-{spec.name}-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir)
        args = ["--workdir", str(workdir), "--ready-step", str(spec.ready_step), *spec.args]
        job = jobs._launch(cluster.nodes[:NODES], spec.name, RANKS_PER_NODE, None, spec.ready_step, args,
                           standalone=False, script=JOB)
        stack.callback(job.stop)
        ctx.job = jobs._finish(job, START_TIMEOUT, wait=False)  # every rank's ready line: its pid, its node
        if spec.sidecar:
            start_sidecar(ctx, stack)
        if spec.hung:
            wait_hung(ctx)
        else:
            wait_progressing(ctx)
        yield ctx


def still_in_state(ctx: Ctx, steps_before: int) -> str:
    """After hangscope ran: "" when the job is still what it was meant to be, else what changed."""
    if ctx.spec.hung:
        if ctx.last_step() != 2:
            return f"rank 0 completed step {ctx.last_step()} (the job was meant to be hung at step 3)"
        if _main_thread(ctx.host_pid(ctx.spec.culprit)) is None:
            return "the culprit exited"
        return ""
    try:  # a step takes up to ~4 s: the one under way when hangscope ended must complete
        wait_until(lambda: ctx.last_step() > steps_before, 20, "a step to complete", interval=0.1)
    except TimeoutError:
        return f"no step completed while hangscope ran, nor 20 s after (last step {ctx.last_step()})"
    return ""
