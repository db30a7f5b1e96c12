"""The groups set's scenarios: how each job is started on the test cluster and brought to its hung state.

Each scenario is bench/blind/groups/job.py under torchrun on 4 nodes x 2 ranks (tests/support/cluster.py's
network-namespace cluster, tests/support/jobs.py's launcher) with --scenario and --culprit. `live(cluster, spec)`
starts it and returns only once it is really in its state, checked from outside the job (its harness files and
/proc, never a sleep that hopes):

  - every rank wrote its ready line (step 2) and, at the hang step, the last call each rank entered is the one
    the scenario makes it block in (`expect`, from the set-up: WORKDIR/entered.jsonl);
  - rank 0's steps.log stops at step 2;
  - every rank's main thread sits unchanged in one syscall over 0.5 s;
  - with --fr: the culprit's worker server answers fr_trace_json (the Flight Recorder is readable).

Everything the scenario started is killed in `finally` (jobs.Job.stop: every process carrying the job's mark).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(REPO / "tests"), str(REPO / "tests" / "support")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import jobs  # noqa: E402
from cluster import Cluster  # noqa: E402
from jobs import Job, _main_thread  # noqa: E402
from waiting import wait_until  # noqa: E402

JOB = HERE / "job.py"
NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE
START_TIMEOUT = 240.0  # torch starting on 8 ranks of a loaded 2-core machine
HANG_STEP, READY_STEP = 3, 2
FR_ENV = {"TORCH_FR_BUFFER_SIZE": "2000"}


def node_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE + 1:02d}"


@dataclass
class Spec:
    name: str
    culprit: int
    fr: bool
    expect: Dict[int, str]  # rank -> the call it blocks in (job.py's entered label)


def _expect(default: str, **special: str) -> Dict[int, str]:
    out = {r: default for r in range(WORLD)}
    out.update({int(k[1:]): v for k, v in special.items()})
    return out


W = "all_reduce:world"
SPECS: List[Spec] = [
    Spec("wrong_group", 2, True, _expect(W, r2="all_reduce:dp_half")),
    Spec("gather_vs_reduce", 7, False, _expect(W, r7="all_gather:world")),
    Spec("swapped_order", 5, True, _expect(W, r2="all_reduce:tp_a", r3="all_reduce:tp_a", r4="all_reduce:tp_a",
                                           r5="all_reduce:tp_b", r6="all_reduce:tp_b", r7="all_reduce:tp_b")),
    Spec("p2p_wrong_peer", 6, False, _expect(W, r5="send:6", r6="recv:4")),
    Spec("p2p_both_recv", 1, True, _expect(W, r1="recv:2", r2="recv:1")),
    Spec("extra_barrier_rank0", 0, True, _expect(W, r0="barrier:world")),
    Spec("subgroup_skipped", 4, False, _expect(W, r5="all_reduce:moe", r6="all_reduce:moe", r7="all_reduce:moe")),
    Spec("broadcast_src", 3, True, _expect(W, r1="broadcast:world", r3="broadcast:world")),
    Spec("new_group_late", 5, False, _expect(W, r5="new_group")),
    Spec("same_ranks_other_group", 6, True, _expect(W, r6="all_reduce:metrics")),
]
BY_NAME: Dict[str, Spec] = {s.name: s for s in SPECS}


@dataclass
class Ctx:
    cluster: Cluster
    spec: Spec
    workdir: Path
    job: Optional[Job] = None
    notes: List[str] = field(default_factory=list)
    entered_lines: int = 0

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

    def entered_raw(self) -> List[dict]:
        with contextlib.suppress(OSError):
            return [json.loads(x) for x in (self.workdir / "entered.jsonl").read_text().splitlines() if x.strip()]
        return []

    def last_calls(self) -> Dict[int, str]:
        """Each rank's last call entered at the hang step."""
        out: Dict[int, str] = {}
        for d in self.entered_raw():
            out[int(d["rank"])] = str(d["in"])
        return out


def _still(ctx: Ctx) -> bool:
    """Every rank's main thread sits in one syscall, unchanged over 0.5 s."""
    ranks = range(WORLD)
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


def _fr_readable(ctx: Ctx) -> str:
    """The culprit's Flight Recorder through its worker server (the set-up's own check: it is readable)."""
    sock = ctx.workdir / "sock" / f"rank{ctx.spec.culprit}.sock"
    out = subprocess.run(["curl", "-s", "--max-time", "10", "--unix-socket", str(sock), "-X", "POST",
                          "http://localhost/handler/fr_trace_json"], capture_output=True, text=True, timeout=30)
    entries = json.loads(out.stdout).get("entries", [])
    if not entries:
        raise RuntimeError(f"the culprit's Flight Recorder is empty or unreadable: {out.stdout[:300]!r}")
    last = entries[-1]
    return (f"culprit's Flight Recorder readable: {len(entries)} entries, the last {last.get('profiling_name')} "
            f"on pg {last.get('process_group')} seq {last.get('collective_seq_id')} ({last.get('state')})")


def wait_hung(ctx: Ctx) -> None:
    spec = ctx.spec

    def reached() -> bool:
        calls = ctx.last_calls()
        return len(calls) == WORLD and calls == spec.expect

    try:
        wait_until(reached, 120, "every rank to enter the call it blocks in", interval=0.1)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}: last calls {ctx.last_calls()}, expected {spec.expect}") from None
    wait_until(lambda: _still(ctx), 120, "every rank's main thread to sit still in one call", interval=0.1)
    if ctx.last_calls() != spec.expect:
        raise RuntimeError(f"{spec.name}: calls moved on: {ctx.last_calls()}")
    if ctx.last_step() != READY_STEP:
        raise RuntimeError(f"{spec.name}: rank 0's last completed step is {ctx.last_step()}, not {READY_STEP}")
    ctx.entered_lines = len(ctx.entered_raw())
    ctx.notes.append("blocked in: " + ", ".join(f"{r}:{c}" for r, c in sorted(ctx.last_calls().items())))
    if spec.fr:
        ctx.notes.append(_fr_readable(ctx))


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    """The scenario's job in its hung state; everything it started is killed and removed on exit."""
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix=f"hangscope-groups-{spec.name}-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir)
        args = ["--workdir", str(workdir), "--scenario", spec.name, "--culprit", str(spec.culprit),
                "--hang-step", str(HANG_STEP), "--ready-step", str(READY_STEP), *(["--fr"] if spec.fr else [])]
        job = jobs._launch(cluster.nodes[:NODES], spec.name, RANKS_PER_NODE, None, READY_STEP, args,
                           standalone=False, extra_env=FR_ENV if spec.fr else None, script=JOB)
        stack.callback(job.stop)
        ctx.job = jobs._finish(job, START_TIMEOUT, wait=False)  # every rank's ready line: its pid, its node
        wait_hung(ctx)
        yield ctx


def still_in_state(ctx: Ctx) -> str:
    """After hangscope ran: "" when the job is still hung as it was, else what changed."""
    if ctx.last_step() != READY_STEP:
        return f"rank 0 completed step {ctx.last_step()} (the job was meant to be hung at step {HANG_STEP})"
    if len(ctx.entered_raw()) != ctx.entered_lines:
        return f"ranks entered more calls: {ctx.last_calls()}"
    gone = [r for r in range(WORLD) if _main_thread(ctx.host_pid(r)) is None]
    return f"ranks {gone} exited" if gone else ""
