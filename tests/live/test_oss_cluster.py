"""Real open-source training scripts, unmodified, diagnosed live by `hangscope HOSTS --print` (issue 17).

nanoGPT's train.py and Lightning Fabric's language-model example (tests/oss/README.md; launched by
tests/support/oss_jobs.py), each a DDP job of 4 nodes x 2 ranks, gloo on CPU, on a 4-node cluster of this module's own.
One job per script serves its three tests, in this order:
- healthy: called progressing in every one of several consecutive runs, no culprit, no stuck rank;
- slow: node04's ranks capped to a share of a CPU by a cgroup: still progressing, node04 named slow;
- hung: made from outside, the script untouched (nanoGPT: a rank stopped with SIGSTOP, as a debugger or job
  control does; Lightning: a rank frozen by the cgroup v2 freezer, as `docker pause` or a scheduler's suspend
  does): the headline names that rank and what holds it; the rank is left as it was, then released.
And one more nanoGPT job whose node04 was launched with other training flags than the rest: named, with the flags.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from cluster import UNHURRIED_LOGIN, Cluster, run_login
from waiting import wait_until
from cpu_cap import CpuCap
from jobs import REPO, Job, _main_thread
from oss_jobs import cpu_ticks, start_oss_job
from test_cluster_held import frozen, is_frozen
from app.model.codec import snapshot_from_json

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]

CLI_TIMEOUT = 180.0
RUNS = {"nanogpt": 3, "lightning": 3}  # consecutive healthy runs in the suite; bench/oss_runs.py does 20 of each
SLOW = "node04"
HELD = 5  # the rank the hung test holds: on node03, neither the first nor the last


@pytest.fixture(scope="module")
def oss_cluster(cluster_factory: Callable[..., Cluster]) -> Iterator[Cluster]:
    """A cluster of this module's own: the session cluster's shared hung job would be found beside these."""
    built = cluster_factory(4)
    try:
        yield built
    finally:
        built.close()


# the jobs, by the name tests parametrize `job` with: (script, extra flags by node index)
JOBS: dict[str, tuple[str, dict[int, list[str]]]] = {
    "nanogpt": ("nanogpt", {}),
    "lightning": ("lightning", {}),
    # node04 launched with other training flags than the rest (issue 17: 32 vs 16 accumulation steps, batch 16 vs 4)
    "nanogpt-other-flags": ("nanogpt", {**{i: ["--gradient_accumulation_steps=16", "--batch_size=4"] for i in range(3)},
                                        3: ["--gradient_accumulation_steps=32", "--batch_size=16"]}),
}
SCRIPTS = pytest.mark.parametrize("job", ["nanogpt", "lightning"], indirect=True)


@pytest.fixture(scope="module")
def job(request: pytest.FixtureRequest, oss_cluster: Cluster) -> Iterator[Job]:
    """One training job per entry of JOBS, shared by the tests that name it (pytest groups the tests by it and
    stops one job before it starts the next)."""
    script, node_flags = JOBS[request.param]
    started = start_oss_job(oss_cluster, script, nodes=4, ranks_per_node=2, node_flags=node_flags)
    try:
        yield started
    finally:
        started.stop()


def hangscope(cluster: Cluster, tmp_path: Path, *extra: str) -> tuple[str, Any, dict]:
    """`hangscope HOSTS --print --snapshot F` as a user runs it: (stdout, snapshot, analysis)."""
    hosts = tmp_path / f"hosts-{secrets.token_hex(3)}.txt"
    hosts.write_text("".join(f"{name}\n" for name in cluster.names))
    out = tmp_path / f"snap-{secrets.token_hex(3)}.json"
    res = run_login([sys.executable, "-m", "app", str(hosts), "--print", "--snapshot", str(out), *UNHURRIED_LOGIN,
                     *extra], cluster,
                    timeout=CLI_TIMEOUT, cwd=str(REPO))
    assert out.exists(), f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    snap, analysis = snapshot_from_json(out.read_text(encoding="utf-8"))
    assert analysis is not None
    failed = [r for r in snap.ranks if r.error is not None]
    # exit 1 (partial) only for py-spy's non-blocking read failing on a running rank, reported as such: dumps
    # that fail, named in a dump_failed finding; the counters, read from /proc without py-spy, are there for
    # every rank (assert_progressing)
    assert res.returncode == 0 or (res.returncode == 1 and failed and all(r.error.code == "tool_failed"
                                                                          for r in failed)
                                   and any(f["kind"] == "dump_failed" for f in analysis["findings"])), \
        f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout, snap, analysis


def flat(text: str) -> str:
    return " ".join(text.split())


def assert_progressing(stdout: str, snap: Any, analysis: dict) -> None:
    assert sorted(r.rank for r in snap.ranks) == list(range(8)), f"all 8 ranks found:\n{stdout}"
    assert all(r.counters is not None for r in snap.ranks), "every rank's counters"
    assert analysis["verdict"].startswith("The job is progressing"), stdout
    assert analysis["findings"][0]["kind"] == "progressing", stdout
    blamed = [f for f in analysis["findings"] if f["culprit"] and f["kind"] != "slow_node"
              and f["confidence"] != "low"]
    assert blamed == [], f"a training job has no culprit:\n{stdout}"
    assert not any(f["kind"] == "still_running" for f in analysis["findings"]), stdout
    assert "check the links" not in flat(stdout), stdout  # the sockets carry the gradients: the links work
    stuck = [p for p in analysis["progress"] if p["status"] == "stuck"]
    assert stuck == [], f"no rank of a training job is stuck:\n{stdout}"


def module_counters(snap: Any) -> dict[int, dict[str, int]]:
    """rank -> the integer globals of its main thread's `<module>` frame (read from its memory: issue 16.5), for
    the ranks whose dump has that frame (a non-blocking sample of a running rank can miss the stack's bottom)."""
    out: dict[int, dict[str, int]] = {}
    for r in snap.ranks:
        main = next((t for t in r.threads if t.is_main), None)
        module = [f for f in (main.frames if main else ()) if f.function == "<module>"]
        if module:
            out[r.rank] = {lc.name: int(lc.repr) for lc in module[-1].locals if lc.repr.isdigit()}
    return out


def in_function(rank: Any, function: str, **local: str) -> bool:
    """Whether the rank's main thread, as the last sample saw it, was inside `function` of the job's script (with
    these locals, by their repr, when given)."""
    main = next((t for t in rank.threads if t.is_main), None)
    return any(f.function == function and f.filename.endswith("train.py")
               and all(any(lc.name == k and lc.repr == v for lc in f.locals) for k, v in local.items())
               for f in (main.frames if main else ()))


def wait_trained(job: Job, ranks: list[int] | None = None, timeout: float = 120) -> None:
    """Every rank (or those given) used more CPU: the job trains (before a test, and after a release)."""
    first = cpu_ticks(job)
    wanted = ranks if ranks is not None else list(job.ranks)
    wait_until(lambda: all(cpu_ticks(job)[r] > first[r] >= 0 for r in wanted), timeout, "the job to train")


@SCRIPTS
def test_a_healthy_training_job_is_progressing_in_every_run(oss_cluster: Cluster, job: Job, tmp_path: Path) -> None:
    runs = RUNS[job.scenario]
    counted: list[dict[int, dict[str, int]]] = []
    moving_runs = 0
    for run in range(runs):
        before = cpu_ticks(job)
        # the last run with 5 samples: more chances to catch ranks at the same place (issue 17: "6 ranks stuck
        # for up to 5 s" while 69 iterations ran)
        extra = ("--samples", "5") if run == runs - 1 else ()
        stdout, snap, analysis = hangscope(oss_cluster, tmp_path, *extra)
        print(f"\n{job.scenario} run {run + 1} {' '.join(extra)}:\n{stdout}")
        assert_progressing(stdout, snap, analysis)
        assert not any(f["kind"] == "slow_node" for f in analysis["findings"]), f"no node is held back:\n{stdout}"
        # Gradients cross the sockets in every training step; an evaluation loop (Lightning's `validate`, ~13
        # forward passes a rank after each ~55-step epoch) runs no collective. Samples that fell inside it (seen
        # beside two CPU burners, where it lasts seconds), or inside it and then the next epoch's first step
        # before its gradients are reduced, move nothing, and are right to.
        moved = {p["rank"] for p in analysis["progress"] if p["net_bytes"]}
        quiet = [r for r in snap.ranks if r.rank not in moved]
        assert all(in_function(r, "validate") or in_function(r, "train_epoch", batch_idx="0") for r in quiet), \
            f"a rank whose sockets moved nothing between the samples was evaluating, not training:\n{stdout}"
        moving_runs += len(moved) == 8
        after = cpu_ticks(job)
        assert all(after[r] > before[r] for r in before), "the job really trained while it was diagnosed"
        if job.scenario == "nanogpt":  # its loop runs at module level: iter_num is a global, read from memory
            counted.append(module_counters(snap))
            assert len(counted[-1]) >= 6 and all("iter_num" in c for c in counted[-1].values()), counted[-1]
    assert moving_runs, "every rank's sockets moved gradients between the samples of some run"
    if counted:  # the module-level counter moved on every rank from the first run to the last
        both = set(counted[0]) & set(counted[-1])
        assert len(both) >= 4 and all(counted[-1][r]["iter_num"] > counted[0][r]["iter_num"] for r in both), counted


@SCRIPTS
def test_a_cpu_throttled_node_is_named_slow(oss_cluster: Cluster, job: Job, tmp_path: Path) -> None:
    pids = [loc.host_pid for loc in job.ranks.values() if loc.node == SLOW]
    assert len(pids) == 2 and all(pids)
    with CpuCap(0.10) as cap:
        for pid in pids:
            cap.add(pid)
        time.sleep(2)  # the cap is felt at once; a few periods make it visible in the throttling counters
        # at 10% of a CPU a step of the slow node's ranks takes seconds (Lightning's longer than nanoGPT's), and the
        # whole job moves at its pace: samples 1 s apart (the default) can all fall inside one step, and a job that
        # moved nothing between them is rightly not called progressing. The samples span more than a step.
        stdout, snap, analysis = hangscope(oss_cluster, tmp_path, "--samples", "3", "--interval", "3")
        print(f"\n{job.scenario}, {SLOW} capped to 10% of a CPU:\n{stdout}")
        limited = [r for r in snap.ranks if r.node == SLOW]
        assert all(r.counters.cgroup is not None and r.counters.cgroup.quota_us == cap.quota for r in limited), \
            "the worker read the cap that applies to the ranks"
    assert_progressing(stdout, snap, analysis)
    slow = [f for f in analysis["findings"] if f["kind"] == "slow_node"]
    assert [f["nodes"] for f in slow] == [SLOW], stdout
    assert "throttled" in slow[0]["title"] and "10% of a CPU" in slow[0]["detail"], stdout
    assert f"{SLOW} is slow" in analysis["verdict"], "the verdict names the slow node next to 'progressing'"
    assert all(os.path.exists(f"/proc/{pid}") for pid in pids), "the ranks were left running"
    wait_trained(job)


def _state(host_pid: int) -> str:
    return (_main_thread(host_pid) or ("?",))[0]


@SCRIPTS
def test_a_held_rank_is_the_headline(oss_cluster: Cluster, job: Job, tmp_path: Path) -> None:
    """nanoGPT: rank 5 stopped with SIGSTOP; Lightning: rank 5 frozen by a cgroup v2 freezer. The others block
    in DDP's gradient all_reduce inside backward; the headline names the held rank and what holds it."""
    loc = job.ranks[HELD]
    others = [r for r in job.ranks if r != HELD]
    with contextlib.ExitStack() as held:
        if job.scenario == "nanogpt":
            os.kill(loc.host_pid, signal.SIGSTOP)
            held.callback(os.kill, loc.host_pid, signal.SIGCONT)
            kind, cause = "stopped", "is stopped (SIGSTOP or job control)"
            still_held: Callable[[], bool] = lambda: _state(loc.host_pid) == "T"  # noqa: E731
        else:
            group = held.enter_context(frozen(loc.host_pid, 2))
            kind, cause = "frozen", f"is frozen by the cgroup freezer (v2 cgroup /{group.name})"
            still_held = lambda: is_frozen(group, 2)  # noqa: E731
        others_blocked(job, others)
        stdout, snap, analysis = hangscope(oss_cluster, tmp_path)
        print(f"\n{job.scenario}, rank {HELD} {kind}:\n{stdout}")
        assert flat(stdout).startswith(f"hangscope: Rank {HELD} {cause}; the other 7 ranks wait for it"), stdout
        first = analysis["findings"][0]
        assert first["kind"] == kind and first["ranks"] == [[loc.node, loc.pid]], (first, stdout)
        assert first["confidence"] == "high"
        assert not analysis["verdict"].startswith("The job is progressing"), stdout
        assert not any(f["kind"] == "network_stall" and f["confidence"] == "high" for f in analysis["findings"]), \
            stdout
        assert sorted(r.rank for r in snap.ranks) == list(range(8)), stdout
        assert still_held(), "hangscope left the held rank as it was"
        if job.scenario == "nanogpt":  # module globals read from the waiting ranks' memory, never the held one's
            counters = module_counters(snap)
            assert counters.get(HELD, {}) == {}, counters
            assert all("iter_num" in counters[r] for r in others if r in counters) and len(counters) >= 6, counters
            held_rank = next(r for r in snap.ranks if r.rank == HELD)
            assert not any("globals" in a for a in held_rank.actions), held_rank.actions
    wait_trained(job)


def others_blocked(job: Job, ranks: list[int]) -> None:
    """The other ranks' main threads sit unchanged (CPU, context switches) in one call: waiting for the held one."""
    seen: dict[int, Any] = {}

    def still() -> bool:
        ok = True
        for rank in ranks:
            sample = _main_thread(job.ranks[rank].host_pid)
            assert sample is not None, f"rank {rank} exited:\n{job.log_tail()}"
            ok = ok and seen.get(rank) == sample and sample[1] != "running"
            seen[rank] = sample
        return ok

    wait_until(still, 90, "the other ranks to block waiting for the held one", interval=0.5)


@pytest.mark.parametrize("job", ["nanogpt-other-flags"], indirect=True)
def test_a_node_launched_with_other_training_flags_is_named(oss_cluster: Cluster, job: Job, tmp_path: Path) -> None:
    """nanoGPT with node04 started with `--gradient_accumulation_steps=32 --batch_size=16` where the other nodes
    were started with 16 and 4: it trains on (one all_reduce per iteration either way), and the odd node's
    ranks are named with the flags that differ, from their command lines."""
    stdout, snap, analysis = hangscope(oss_cluster, tmp_path)
    print(f"\nnanoGPT, node04 with other flags:\n{stdout}")
    assert analysis["verdict"].startswith("The job is progressing"), stdout
    differs = [f for f in analysis["findings"] if f["kind"] == "launch_differs"]
    odd = sorted([loc.node, loc.pid] for loc in job.ranks.values() if loc.node == SLOW)
    assert [sorted(f["ranks"]) for f in differs] == [odd], stdout
    assert ("--batch_size `16` where the others have `4`, --gradient_accumulation_steps `32` where the others "
            "have `16`") in differs[0]["title"], stdout
    assert differs[0]["culprit"] and differs[0]["confidence"] == "medium", differs[0]
    # node04 does 8x the work per step; where it shows as slow (on this shared 2-core machine its ranks also wait
    # for a CPU), the slow finding says its flags are why
    for slow in (f for f in analysis["findings"] if f["kind"] == "slow_node"):
        assert slow["nodes"] == SLOW and "run with other flags than the rest: --batch_size `16`" in slow["title"], \
            stdout
