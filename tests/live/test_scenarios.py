"""Live scenarios: the real CLI (`hangscope HOSTS --snapshot out.json`) diagnoses each way a torch gloo job hangs.

One torch job per scenario (tests/support/record_scenarios.py), each stopped before the next starts, on a 3-node
cluster of this module's own (the session cluster holds the shared hung job, whose ranks would mix in).
The data-loader scenario is tests/live/test_e2e_snapshot.py's, against the shared hung job.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest

from cluster import Cluster
from jobs import RankLoc
from record_scenarios import SCENARIOS, Diagnosis, diagnose, started

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support"),
              # each scenario's job starts and stops inside its own fixture, used by one test; what the tests share is
              # a 3-node cluster (sshd in namespaces), cheap to build once per xdist worker: the scenarios run in parallel
              pytest.mark.per_worker_fixtures("a job per scenario, stopped before its fixture returns")]


@dataclass(frozen=True)
class Case:
    """A scenario's ranks (as its job reported them) and the CLI's diagnosis of it."""

    ranks: dict[int, RankLoc]
    diagnosis: Diagnosis

    def key(self, rank: int) -> list[Any]:
        """A rank as findings name it: [node, pid]."""
        return [self.ranks[rank].node, self.ranks[rank].pid]


@pytest.fixture(scope="module")
def scenario_cluster(cluster_factory: Callable[..., Cluster]) -> Iterator[Cluster]:
    built = cluster_factory(max(s.nodes for s in SCENARIOS.values()))
    try:
        yield built
    finally:
        built.close()


@pytest.fixture(scope="module")
def run_case(scenario_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Case]:
    def run(name: str) -> Case:
        with started(scenario_cluster, SCENARIOS[name]) as running:  # the job stops before the next starts
            diagnosis = diagnose(running, tmp_path_factory.mktemp(name))
            print(f"\n{name}: hangscope took {diagnosis.seconds:.1f} s\n{diagnosis.stdout}")
            return Case(dict(running.job.ranks), diagnosis)
    return run


@pytest.fixture(scope="module")
def skip(run_case: Callable[[str], Case]) -> Case:
    return run_case("skip")


@pytest.fixture(scope="module")
def die(run_case: Callable[[str], Case]) -> Case:
    return run_case("die")


@pytest.fixture(scope="module")
def netcut(run_case: Callable[[str], Case]) -> Case:
    return run_case("netcut")


@pytest.fixture(scope="module")
def healthy(run_case: Callable[[str], Case]) -> Case:
    return run_case("healthy")


def flat(text: str) -> str:
    """The printed summary with its line wrapping undone."""
    return " ".join(text.split())


def assert_complete(case: Case, expected_ranks: list[int], partial: str = "") -> None:
    """Every rank found was collected whole; exit 0, or 1 with `partial` on stderr when the job has more ranks
    than were found (exit codes: 0 only when every rank of the job was collected)."""
    d = case.diagnosis
    if partial:
        assert d.returncode == 1 and f"hangscope: partial: {partial}" in d.stderr, f"exit {d.returncode}\n{d.stderr}"
    else:
        assert d.returncode == 0, f"exit {d.returncode}\n{d.stdout}\n{d.stderr}"
    assert sorted(r.rank for r in d.snapshot.ranks) == expected_ranks
    assert all(r.collected and r.error is None for r in d.snapshot.ranks)


def test_skip_names_the_rank_one_iteration_ahead(skip: Case) -> None:
    """(a) Every rank on the same line; only `step` tells rank 2 (step 4) from the others (step 3)."""
    d = skip.diagnosis
    assert_complete(skip, [0, 1, 2, 3])
    assert [c["numbers"] for c in d.analysis["classes"]] == [[0, 1, 2, 3]], "identical stacks: one class"
    first = d.analysis["findings"][0]
    assert first["kind"] == "iteration_split" and first["confidence"] == "high", first
    assert first["ranks"] == [skip.key(2)]
    assert first["title"].startswith("rank 2 is 1 iteration ahead (step=4 vs 3)"), first["title"]
    split = d.analysis["iteration_splits"][0]
    assert [(g["coordinate"], [k[0] for k in g["ranks"]]) for g in split["groups"]] == [
        ([["step", "3"]], [skip.ranks[r].node for r in (0, 1, 3)]), ([["step", "4"]], [skip.ranks[2].node])]
    assert flat(d.stdout).startswith("hangscope: Rank 2 is 1 iteration ahead (step=4 vs 3)"), d.stdout
    assert "iterations: step=3: ranks 0-1,3; step=4: rank 2" in flat(d.stdout)


def test_die_names_the_rank_that_is_gone(die: Case) -> None:
    """(c) Rank 3 exited (its sockets kept open by a child, as NCCL peers see it): the rest wait for it."""
    d = die.diagnosis
    assert_complete(die, [0, 1, 2], partial="rank 3 not found (WORLD_SIZE=4)")
    first = d.analysis["findings"][0]
    assert first["kind"] == "missing_ranks" and first["confidence"] == "high", first
    assert first["title"] == "rank 3 not found (WORLD_SIZE=4)"
    assert first["nodes"] == die.ranks[3].node == "node02"
    assert "node02: 1 of 2" in first["detail"], "the node short of a rank is named"
    assert flat(d.stdout).startswith("hangscope: Rank 3 not found (WORLD_SIZE=4); the other 3 ranks wait for "
                                       "it in `all_reduce`."), d.stdout
    assert [c["numbers"] for c in d.analysis["classes"]] == [[0, 1, 2]]
    assert d.analysis["classes"][0]["collective"] == "all_reduce"


def test_netcut_names_the_node_cut_off_from_its_sockets(netcut: Case) -> None:
    """(d) node02 cut off (ssh still allowed): every rank waits in all_reduce, the sockets name node02."""
    d = netcut.diagnosis
    assert_complete(netcut, [0, 1, 2])
    assert [c["numbers"] for c in d.analysis["classes"]] == [[0, 1, 2]]
    assert d.analysis["classes"][0]["collective"] == "all_reduce"
    first = d.analysis["findings"][0]
    assert first["kind"] == "network_stall" and first["confidence"] == "high", first
    assert first["nodes"] == "node02" and "node02 (or its link)" in first["title"], first
    assert "RTO backoff" in first["detail"] and "retransmission" in first["detail"], "the evidence is shown"
    for other in ("node01", "node03"):
        assert f"{other} (or its link)" not in d.stdout
    assert flat(d.stdout).startswith("hangscope: Every stalled socket involves node02"), d.stdout
    cut = netcut.ranks[1]
    assert cut.node == "node02"
    retrying = [s for r in d.snapshot.ranks if r.node == "node02" for s in r.sockets if s.backoff]
    assert retrying, "the cut node's own sockets back off"


def test_healthy_job_is_progressing_not_hung(healthy: Case) -> None:
    """(e) A job that trains on: two samples a second apart show every rank moving."""
    d = healthy.diagnosis
    assert_complete(healthy, [0, 1, 2, 3])
    first = d.analysis["findings"][0]
    assert first["kind"] == "progressing" and first["confidence"] == "high", first
    assert {p["status"] for p in d.analysis["progress"]} == {"progressing"}
    assert d.analysis["verdict"].startswith("The job is progressing")
    # what moved is named: every rank's sockets carried bytes between the samples
    assert re.match(r"hangscope: The job is progressing: 4 of 4 ranks moved between samples \(sockets moved "
                    r"[\d.]+ [kMG]?B on 4\b[^)]*\); it is not hung\.", flat(d.stdout)), d.stdout
    culprits = [f for f in d.analysis["findings"] if f["culprit"] and f["confidence"] != "low"]
    assert culprits == [], "a running job's ranks are caught at different places: nobody is to blame"


@pytest.fixture(scope="module")
def lock(run_case: Callable[[str], Case]) -> Case:
    return run_case("lock")


@pytest.fixture(scope="module")
def deadlock(run_case: Callable[[str], Case]) -> Case:
    return run_case("deadlock")


def test_a_lock_held_by_another_thread_of_the_culprit_is_named_with_its_holder(lock: Case) -> None:
    """(issue 17, case 9) rank 1's checkpoint-writer holds the metrics lock while it waits for an upload; the
    main thread blocks entering `with _metrics_lock:`; the others wait in all_reduce. The lock and its holder
    are the answer, not "a thread that died"."""
    d = lock.diagnosis
    assert_complete(lock, [0, 1, 2, 3])
    first = d.analysis["findings"][0]
    assert first["kind"] == "lock_wait" and first["confidence"] == "high", first
    assert first["ranks"] == [lock.key(1)]
    assert first["title"].startswith("rank 1's main thread waits for `_metrics_lock`, which its thread "
                                     "`checkpoint-writer` holds while it is in `CheckpointWriter.save`"), first
    assert "blocked entering `with _metrics_lock:`" in first["detail"]
    assert not [f for f in d.analysis["findings"] if f["kind"] == "thread_count" and f["confidence"] == "high"]
    assert flat(d.stdout).startswith("hangscope: Rank 1's main thread waits for `_metrics_lock`"), d.stdout


def test_two_threads_taking_two_locks_in_opposite_orders_are_a_deadlock(deadlock: Case) -> None:
    d = deadlock.diagnosis
    assert_complete(deadlock, [0, 1, 2, 3])
    first = d.analysis["findings"][0]
    assert first["kind"] == "lock_wait" and first["confidence"] == "high", first
    assert first["ranks"] == [deadlock.key(2)]
    assert first["title"] == ("rank 2 is deadlocked: its thread `checkpoint-writer` and main thread wait for "
                              "each other's locks")
    assert "holds `_weights_lock` and waits for `_metrics_lock`" in first["detail"]
    assert "holds `_metrics_lock` and waits for `_weights_lock`" in first["detail"]


@pytest.fixture(scope="module")
def order(run_case: Callable[[str], Case]) -> Case:
    return run_case("order")


def test_a_rank_that_iterates_its_buckets_in_another_order_is_named_with_both_orders(order: Case) -> None:
    """(issue 17, case 4) Every rank on one line in one all_reduce; only the bucket differs, because rank 1 walks
    the same buckets in another order: say so, with both orders, not "one iteration off"."""
    d = order.diagnosis
    assert_complete(order, [0, 1, 2, 3])
    first = d.analysis["findings"][0]
    assert first["kind"] == "iteration_split" and first["confidence"] == "high", first
    assert first["ranks"] == [order.key(1)]
    assert first["title"].startswith("rank 1 iterates `names` in another order than 3 others"), first["title"]
    assert 'the iteration order differs: `names` is ["attn", "mlp", "norm", "head", "embed"] on rank 1' \
        in first["detail"]
    assert "pairs its collective with the wrong one" not in first["detail"]


@pytest.fixture(scope="module")
def uneven(run_case: Callable[[str], Case]) -> Case:
    return run_case("uneven")


def test_a_rank_whose_data_ran_out_has_left_the_loop_the_ddp_ranks_are_still_in(uneven: Case) -> None:
    """(issue 17, case 8) DDP on a group of its own; rank 2's shard ran out: it left the training loop and waits
    in evaluate()'s all_reduce, the others wait in DDP's gradient all_reduce inside backward. Not "either side
    may hold the other up": rank 2 left the loop, and the classic cause is uneven inputs."""
    d = uneven.diagnosis
    assert_complete(uneven, [0, 1, 2, 3])
    first = d.analysis["findings"][0]
    assert first["kind"] == "minority_stack" and first["confidence"] == "high", first
    assert first["ranks"] == [uneven.key(2)]
    assert first["title"].startswith("rank 2 has left the loop `for step, batch in enumerate(loader)`"), first
    assert "where DDP all_reduces the gradients" in first["title"]
    assert "inputs are uneven" in first["detail"] and "join()" in first["detail"]
    assert "either side may hold the other up" not in first["reason"]


@pytest.fixture(scope="module")
def mismatch(run_case: Callable[[str], Case]) -> Case:
    return run_case("mismatch")


def test_a_rank_in_another_collective_type_is_named_with_both(mismatch: Case) -> None:
    """Mismatched collectives: rank 1 gathers its metrics with all_gather where the others all_reduce their
    gradients on the same group; gloo pairs neither and every rank waits."""
    d = mismatch.diagnosis
    assert_complete(mismatch, [0, 1, 2, 3])
    first = d.analysis["findings"][0]
    assert first["kind"] == "different_collective" and first["confidence"] == "high", first
    assert first["ranks"] == [mismatch.key(1)]
    assert flat(d.stdout).startswith("hangscope: Rank 1 is in `all_gather` (distributed_c10d.py:"), d.stdout
    assert "while 3 others wait in `all_reduce`" in first["title"]


@pytest.fixture(scope="module")
def gil(run_case: Callable[[str], Case]) -> Case:
    return run_case("gil")


def test_a_native_call_that_keeps_the_gil_is_named_with_the_threads_it_stops(gil: Case) -> None:
    """Rank 2 calls libc's pause() through ctypes.PyDLL, which keeps the GIL: py-spy says its main thread owns
    the GIL, /proc says it sleeps in `pause`; its shard-reader thread cannot run Python."""
    d = gil.diagnosis
    assert_complete(gil, [0, 1, 2, 3])
    first = d.analysis["findings"][0]
    assert first["kind"] == "gil_held" and first["confidence"] == "high", first
    assert first["ranks"] == [gil.key(2)]
    assert flat(d.stdout).startswith("hangscope: Rank 2's main thread holds the GIL while blocked in native code "
                                     "called from `native_wait` (job.py:"), d.stdout
    assert "sleeps in `pause`" in first["title"] and "`shard-reader`, cannot run" in first["title"], first
    assert "--native" in first["detail"]


@pytest.fixture(scope="module")
def native(run_case: Callable[[str], Case]) -> Case:
    return run_case("native")


def test_a_native_call_that_never_returns_is_named_with_its_system_call(native: Case) -> None:
    """Rank 3 calls libc's pause() through ctypes.CDLL (the GIL released): a C call that never returns."""
    d = native.diagnosis
    assert_complete(native, [0, 1, 2, 3])
    first = d.analysis["findings"][0]
    assert first["kind"] == "native_call" and first["confidence"] == "high", first
    assert first["ranks"] == [native.key(3)]
    assert flat(d.stdout).startswith("hangscope: Rank 3's main thread is inside a native call that does not "
                                     "return, made at `native_wait` (job.py:"), d.stdout
    assert "sleeps in `pause` with the GIL released" in first["title"]
    assert not any(f["kind"] == "gil_held" for f in d.analysis["findings"])


@pytest.fixture(scope="module")
def pipe(run_case: Callable[[str], Case]) -> Case:
    return run_case("pipe")


def test_a_rank_blocked_on_a_full_pipe_is_named(pipe: Case) -> None:
    """Rank 1 ships its logs through a pipe to a helper that stopped reading; its report fills the pipe."""
    d = pipe.diagnosis
    assert_complete(pipe, [0, 1, 2, 3])
    first = d.analysis["findings"][0]
    assert first["kind"] == "pipe_write" and first["confidence"] == "high", first
    assert first["ranks"] == [pipe.key(1)]
    assert flat(d.stdout).startswith("hangscope: Rank 1's main thread is blocked writing to a full pipe in "
                                     "`LogShipper.log` (job.py:"), d.stdout
    # the node found who holds the pipe's read end: the shipper child that never reads
    assert "`sleep 86400` (its child), which holds its read end, does not read" in flat(d.stdout), d.stdout
    hold = next(r for r in d.snapshot.ranks if r.rank == 1).hold
    assert hold is not None and hold.pipe.startswith("pipe:[") and [p.comm for p in hold.pipe_readers] == ["sleep"]


@pytest.fixture(scope="module")
def fsstall(run_case: Callable[[str], Case]) -> Case:
    return run_case("fsstall")


def test_a_rank_reading_from_a_stalled_file_system_is_in_d_state_with_its_file(fsstall: Case) -> None:
    """Rank 2 reads a data shard from a FUSE file system that never answers (tests/support/fuse_stall.py): state D.
    No blocking tool touches it; the headline names the state and the file."""
    d = fsstall.diagnosis
    assert_complete(fsstall, [0, 1, 2, 3])
    first = d.analysis["findings"][0]
    assert first["kind"] == "uninterruptible" and first["confidence"] == "high", first
    assert first["ranks"] == [fsstall.key(2)]
    assert flat(d.stdout).startswith("hangscope: Rank 2 is in uninterruptible sleep (D)"), d.stdout
    assert "stalled" in first["title"], first["title"]  # the file it waits on
