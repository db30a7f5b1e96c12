"""The phases set's scenarios: how each job is started on the test cluster and brought to its intended state.

Each scenario is bench/blind/phases/job.py under torchrun on 4 nodes x 2 ranks (the tests' network-namespace
cluster, tests/support/jobs.py's launcher) with some flags. `live(cluster, spec)` starts it and returns only once
it is really in its state, checked from outside the job (/proc and the job's harness files, never a sleep that
hopes):

  hung:        every rank's last entered collective is the one the set-up says it hangs in (the culprits': the call
               after or outside the loop, or the next iteration's; the others': the call the culprits never reach),
               at the global step the set-up says, and every rank's main thread sits unchanged in one syscall;
  progressing: every rank completed the step after its ready step (it trains); while the straggler(s) are in their
               slow phase (1 s into it, by the harness's slow.jsonl), the other ranks' main threads sleep (they
               wait); and the straggler has just entered its slow phase again when live() returns (so the two
               samples hangscope takes ~1 s apart fall inside it). A node capped in CPU (a cgroup, as a noisy
               neighbour or a wrong limit does) is capped once its ranks are ready.

After hangscope ran, still_in_state() checks: hung, no rank completed a step or entered another collective, every
rank alive; progressing, every rank completed another step. Everything is killed in `finally`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
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
from cpu_cap import CpuCap  # noqa: E402
from jobs import Job, _main_thread  # noqa: E402
from waiting import wait_until  # noqa: E402

JOB = HERE / "job.py"
NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE
START_TIMEOUT = 120.0  # torch starting on 8 ranks of a loaded 2-core machine


def node_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE + 1:02d}"


@dataclass
class Spec:
    name: str
    hung: bool
    args: List[str]
    culprit: List[int] = field(default_factory=list)  # hung: the ranks that left the loop / skipped the collective
    # hung: (call, global step) each rank's main thread ends up in: the culprits', the others'
    culprit_in: Tuple[str, int] = ("", 0)
    others_in: Tuple[str, int] = ("", 0)
    slow: List[int] = field(default_factory=list)  # progressing: the straggler ranks
    phase: str = ""  # progressing: the straggler's slow phase (as job.py marks it)
    cap: float = 0.0  # progressing: the slow ranks' node(s) capped to this share of one CPU
    ready_step: int = 1  # hung: every rank's ready line comes before the hang; progressing: see _prog


def _hung(loop: str, *extra: str, mark_from: int = 3) -> List[str]:
    return ["--loop", loop, "--mark-from", str(mark_from), *extra]


def _prog(loop: str, slow: Sequence[int], *extra: str) -> List[str]:
    # (progressing: its specs' ready_step is 0, so that live() sees steps 0 and 1 complete on every rank and does
    # not wait for more slow steps than it needs)
    return ["--loop", loop, "--mark-slow", ",".join(map(str, slow)), *extra]


SPECS: List[Spec] = [
    # P. progressing, a straggler caught at a later line of the loop body than the others
    Spec("eval_rank0", False, _prog("epochs_loader", [0], "--shard-batches", "2", "--eval-ranks", "0",
                                     "--eval-seconds", "5"), slow=[0], phase="validate", ready_step=0),
    Spec("ckpt_upload_nodes", False, _prog("while_steps", [0, 2, 4, 6], "--ckpt-mb", "6", "--ckpt-local-rank", "0",
                                           "--upload-mb-s", "1.5"), slow=[0, 2, 4, 6], phase="save_shard", ready_step=0),
    Spec("log_stats_rank3", False, _prog("steps_micro", [3], "--log-rank", "3", "--log-seconds", "5"),
         slow=[3], phase="log_stats", ready_step=0),
    # P. progressing, a straggler caught at an earlier line
    Spec("throttled_node_fetch", False, _prog("epochs_enumerate", [4, 5], "--decode-iters", "400"),
         slow=[4, 5], phase="decode", cap=0.025, ready_step=0),
    Spec("epoch_start_index", False, _prog("epochs_enumerate", [6], "--shard-batches", "2", "--index-latency", "5",
                                           "--slow-index-ranks", "6"), slow=[6], phase="open_shard", ready_step=0),
    Spec("micro_long_seqs", False, _prog("steps_micro", [7], "--accum", "4", "--heavy-ranks", "7",
                                         "--heavy-seconds", "1.2"), slow=[7], phase="forward", ready_step=0),
    # H. hung: a minority left a loop the others are still in, or skipped a collective
    Spec("uneven_shard_epoch", True, _hung("epochs_loader", "--short-ranks", "5", "--short-epoch", "1",
                                           "--short-batches", "1"),
         culprit=[5], culprit_in=("epoch_allreduce", 4), others_in=("grad_allreduce", 4)),
    Spec("early_stop_node", True, _hung("while_steps", "--eval-every", "3", "--empty-val-ranks", "2,3"),
         culprit=[2, 3], culprit_in=("barrier", 3), others_in=("grad_allreduce", 3)),
    Spec("skip_partial_log", True, _hung("steps_micro", "--partial-ranks", "6", "--partial-step", "3"),
         culprit=[6], culprit_in=("grad_allreduce", 4), others_in=("metrics_allreduce", 4)),  # the others: step 3's log
    Spec("short_shards_half", True, _hung("epochs_enumerate", "--short-ranks", "4,5,6,7", "--short-epoch", "1",
                                          "--short-batches", "1"),
         culprit=[4, 5, 6, 7], culprit_in=("barrier", 4), others_in=("grad_allreduce", 4)),
    Spec("token_budget_break", True, _hung("steps_micro", "--accum", "4", "--count-tokens", "--max-tokens", "32",
                                           "--long-ranks", "1", "--long-step", "3", "--long-factor", "4"),
         culprit=[1], culprit_in=("grad_allreduce", 3), others_in=("tokens_allreduce", 3)),
]
BY_NAME: Dict[str, Spec] = {s.name: s for s in SPECS}


@dataclass
class Ctx:
    cluster: Cluster
    spec: Spec
    workdir: Path
    job: Optional[Job] = None
    notes: List[str] = field(default_factory=list)

    def host_pid(self, rank: int) -> int:
        assert self.job is not None
        return self.job.ranks[rank].host_pid

    def _lines(self, name: str) -> List[str]:
        with contextlib.suppress(OSError):
            return [x for x in (self.workdir / name).read_text().splitlines() if x.strip()]
        return []

    def last_steps(self) -> Dict[int, int]:
        """Each rank's last completed global step (-1: none)."""
        out = {r: -1 for r in range(WORLD)}
        for line in self._lines("steps.log"):
            rank, step, _ = line.split()
            out[int(rank)] = max(out[int(rank)], int(step))
        return out

    def step_times(self, rank: int) -> List[float]:
        return [float(t) for r, _, t in (x.split() for x in self._lines("steps.log")) if int(r) == rank]

    def entered(self) -> Dict[int, Tuple[str, int]]:
        """Each rank's last entered collective and its global step."""
        out: Dict[int, Tuple[str, int]] = {}
        for d in (json.loads(x) for x in self._lines("entered.jsonl")):
            out[int(d["rank"])] = (str(d["call"]), int(d["step"]))
        return out

    def slow_marks(self, rank: int) -> List[dict]:
        return [d for d in (json.loads(x) for x in self._lines("slow.jsonl")) if int(d["rank"]) == rank]


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


def expected_in(spec: Spec, rank: int) -> Tuple[str, int]:
    return spec.culprit_in if rank in spec.culprit else spec.others_in


def wait_hung(ctx: Ctx) -> None:
    spec = ctx.spec

    def arrived() -> bool:
        ent = ctx.entered()
        return all(ent.get(r) == expected_in(spec, r) for r in range(WORLD))

    try:
        wait_until(arrived, 60, "every rank to enter the collective it hangs in", interval=0.1)
    except TimeoutError as exc:
        assert ctx.job is not None
        raise TimeoutError(f"{exc}; last entered: {ctx.entered()}\n{ctx.job.log_tail()}") from None
    wait_until(lambda: _still(ctx, range(WORLD)), 60, "every rank's main thread to sit still in its call",
               interval=0.1)
    ent = ctx.entered()
    if not arrived():
        raise RuntimeError(f"{spec.name}: a rank entered another collective: {ent}")
    ctx.notes.append("last entered: " + ", ".join(f"{r}: {c}@{s}" for r, (c, s) in sorted(ent.items())))
    ctx.notes.append("last completed step per rank: " + json.dumps(ctx.last_steps()))


def wait_progressing(ctx: Ctx) -> None:
    spec = ctx.spec
    target = spec.ready_step + 1
    wait_until(lambda: min(ctx.last_steps().values()) >= target, 60, f"every rank to complete step {target}",
               interval=0.1)
    lead = spec.slow[0]
    others = [r for r in range(WORLD) if r not in spec.slow]

    def fresh_mark(age: float) -> Optional[dict]:
        marks = ctx.slow_marks(lead)
        if marks and time.time() - marks[-1]["t"] < age:
            return marks[-1]
        return None

    def others_wait() -> bool:
        mark = wait_until(lambda: fresh_mark(0.3), 30, f"rank {lead} to enter {spec.phase}", interval=0.02)
        time.sleep(max(0.0, mark["t"] + 1.0 - time.time()))  # 1 s into the straggler's phase
        states = {r: _main_thread(ctx.host_pid(r)) for r in others}
        if any(s is None for s in states.values()):
            assert ctx.job is not None
            raise RuntimeError(f"a rank exited:\n{ctx.job.log_tail()}")
        waiting = [r for r, s in states.items() if s and s[0] in "SD" and s[1] != "running"]
        ctx.notes.append(f"1 s into rank {lead}'s {spec.phase} (step {mark['step']}): ranks {waiting} of {others} "
                         f"sleep in a syscall")
        return len(waiting) == len(others)

    wait_until(others_wait, 45, "the other ranks to wait while the straggler is in its slow phase", interval=0)
    mark = wait_until(lambda: fresh_mark(0.3), 30, f"rank {lead} to enter {spec.phase} again", interval=0.02)
    times = ctx.step_times(lead)[-3:]
    gaps = ", ".join(f"{b - a:.2f}" for a, b in zip(times, times[1:]))
    ctx.notes.append(f"steps completed by every rank when hangscope starts: {min(ctx.last_steps().values()) + 1}; "
                     f"rank {lead}'s last step gaps (s): {gaps}; it entered {spec.phase} of step {mark['step']} "
                     f"{time.time() - mark['t']:.2f} s ago")


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    """The scenario's job in its state; everything it started is killed and removed on exit."""
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix=f"hangscope-phases-{spec.name}-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir)
        args = ["--workdir", str(workdir), "--ready-step", str(spec.ready_step), *spec.args]
        job = jobs._launch(cluster.nodes[:NODES], spec.name, RANKS_PER_NODE, None, spec.ready_step, args,
                           standalone=False, script=JOB)
        stack.callback(job.stop)
        ctx.job = jobs._finish(job, START_TIMEOUT, wait=False)  # every rank's ready line: its pid, its node
        if spec.cap:
            cap = stack.enter_context(CpuCap(spec.cap))
            for r in spec.slow:
                cap.add(ctx.host_pid(r))
            ctx.notes.append(f"ranks {spec.slow} ({', '.join(sorted({node_of(r) for r in spec.slow}))}) capped to "
                             f"{spec.cap:.2f} of one CPU together")
        if spec.hung:
            wait_hung(ctx)
        else:
            wait_progressing(ctx)
        yield ctx


def still_in_state(ctx: Ctx, before: Dict[int, int]) -> str:
    """After hangscope ran: "" when the job is still what it was meant to be, else what changed. `before`: each
    rank's last completed step when hangscope started."""
    if ctx.spec.hung:
        now = ctx.last_steps()
        if now != before:
            return f"a rank completed a step (the job was meant to be hung): {before} -> {now}"
        if any(ctx.entered().get(r) != expected_in(ctx.spec, r) for r in range(WORLD)):
            return f"a rank entered another collective: {ctx.entered()}"
        if any(_main_thread(ctx.host_pid(r)) is None for r in range(WORLD)):
            return "a rank exited"
        return ""
    try:  # a straggler's step takes ~5 s: the one under way when hangscope ended must complete on every rank
        wait_until(lambda: min(ctx.last_steps().values()) > min(before.values()), 30, "a step to complete",
                   interval=0.1)
    except TimeoutError:
        return f"no step completed on every rank while hangscope ran, nor 30 s after ({ctx.last_steps()})"
    return ""
