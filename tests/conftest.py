"""Session fixtures: the network-namespace SSH test cluster, extra clusters to break, and one shared hung job.

Without root or a required tool, cluster tests are skipped with the reason; with env CI set they fail
instead, so a machine that cannot run them never hides a failure in CI.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

# the helpers in tests/support (cluster, jobs, waiting, ...) import by name, as when they sat in tests/ itself
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
# test modules live in one folder per layer (tests/analysis, tests/live, ...); a few share fixtures or builders
# with a module of another folder (test_report_build's make_snapshot, test_cluster_held's freezer): importable by
# name from every folder, as when they sat side by side
sys.path.extend(str(p) for p in sorted(Path(__file__).resolve().parent.iterdir())
                if p.is_dir() and next(p.glob("test_*.py"), None) is not None)

import cluster as cluster_mod
import jobs as jobs_mod
import leaks as leaks_mod
import xdist_groups

# The tests that press Ctrl+C (SIGINT to the command they started) act as a user at a terminal, whose foreground
# command has SIGINT at its default. A suite started as a background job of a script (`make test &`, a CI runner
# without job control) inherits SIGINT ignored, and so would every command it starts (an ignored signal stays
# ignored across exec, and Python then installs no KeyboardInterrupt handler): `hangscope - --print` reading a
# silent pipe would never see the Ctrl+C and would read on to the pipe's end. Restored here, in the pytest process
# and in each xdist worker, before any test starts a command.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

HUNG_JOB_CULPRIT = 5  # node03, local rank 1: neither the first nor the last rank, nor on the first node


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown when xdist is not loaded (-p no:xdist)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject.toml): one worker more than the cores this process may use, at least 2 and at most 6.
    Much of a live test's time is spent waiting (a job's start-up sleeps, deadlines, the CLI's interval between
    samples), which another worker fills; past 6, the torch jobs of parallel tests outgrow a small machine's
    memory."""
    return max(2, min(len(os.sched_getaffinity(0)) + 1, 6))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that share a fixture that starts torch jobs (hung_job, a module's jobs) run in one xdist worker
    (tests/support/xdist_groups.py), so each job is started once, not once per worker."""
    xdist_groups.group(items, tests_root=config.rootpath.joinpath("tests").relative_to(config.rootpath).as_posix())


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test: a child process, thread or open fd that the test (or its function-scoped fixtures) left
    behind fails it, named (tests/support/leaks.py; what wider-scoped fixtures hold is not counted). A test that
    must leave something running says why with @pytest.mark.allow_leaks("why")."""
    before = leaks_mod.picture()
    yield
    if request.node.get_closest_marker("allow_leaks"):
        return
    found = leaks_mod.leaks_since(before)
    if found:
        leaks_mod.kill_leaked_children(before)
        pytest.fail("left behind:\n  " + "\n  ".join(found), pytrace=False)


def _sshd_pids(clusters: list[cluster_mod.Cluster]) -> Callable[[], list[int]]:
    """The sshd daemons of these clusters as they are now (a fault test may have restarted one)."""
    def pids() -> list[int]:
        return [sshd.pid for c in clusters for n in c.nodes
                if (sshd := getattr(n, "_sshd", None)) is not None and sshd.poll() is None]
    return pids


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (env CI is set: cluster tests must run here, not be skipped)", pytrace=False)
    pytest.skip(reason)


def require_cluster() -> None:
    problem = cluster_mod.support_problem()
    if problem:
        _unavailable(problem)


def require_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        _unavailable(f"torch is not installed in {sys.executable} (pip install torch==2.13.0)")


@pytest.fixture(scope="session")
def cluster_support() -> None:
    """Skips (fails in CI) when no cluster can be built here; for tests that build clusters themselves."""
    require_cluster()


@pytest.fixture(scope="session")
def torch_support() -> None:
    """Skips (fails in CI) when torch, which the demo job's ranks need, is not installed."""
    require_torch()


@pytest.fixture(scope="session")
def cluster() -> Iterator[cluster_mod.Cluster]:
    """4 nodes, node01..node04, sshd on each; shared by the whole session: restore what you break."""
    require_cluster()
    built = cluster_mod.build_cluster(4)
    leaks_mod.daemons(_sshd_pids([built]))
    try:
        yield built
    finally:
        built.close()


@pytest.fixture(scope="session")
def cluster_factory() -> Iterator[Callable[..., cluster_mod.Cluster]]:
    """make(n=2, prefix="node") -> a separate cluster; close it when done (the session closes leftovers)."""
    built: list[cluster_mod.Cluster] = []
    leaks_mod.daemons(_sshd_pids(built))

    def make(n: int = 2, prefix: str = "node") -> cluster_mod.Cluster:
        require_cluster()
        built.append(cluster_mod.build_cluster(n, prefix=prefix))
        return built[-1]

    try:
        yield make
    finally:
        for c in built:
            c.close()


@pytest.fixture
def make_cluster(cluster_factory: Callable[..., cluster_mod.Cluster]) -> Iterator[Callable[..., cluster_mod.Cluster]]:
    """make_cluster(n=2, prefix="node") -> a separate cluster for this test only, for tests that break nodes."""
    built: list[cluster_mod.Cluster] = []

    def make(n: int = 2, prefix: str = "node") -> cluster_mod.Cluster:
        built.append(cluster_factory(n, prefix))
        return built[-1]

    try:
        yield make
    finally:
        for c in built:
            c.close()


@pytest.fixture(scope="session")
def local_spawn_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[jobs_mod.SpawnJob]:
    """A hung 2-rank torch.multiprocessing.spawn job on this machine (no rank environment; rank 1 never reaches
    the second all_reduce). Shared by the session's tests that only read it: never stop or unblock it."""
    require_torch()
    job = jobs_mod.start_local_spawn_job(tmp_path_factory.mktemp("spawn-job"))
    try:
        yield job
    finally:
        job.stop()


@pytest.fixture(scope="session")
def hung_job(cluster: cluster_mod.Cluster) -> Iterator[jobs_mod.Job]:
    """4 nodes x 2 ranks, scenario dataloader: rank 5 (node03, local rank 1) blocks reading its next batch at
    step 3, the other 7 block in that step's all_reduce. Shared by the session: never stop or unblock it."""
    require_torch()
    job = jobs_mod.start_job(cluster, "dataloader", nodes=4, ranks_per_node=2, culprit=HUNG_JOB_CULPRIT)
    try:
        yield job
    finally:
        job.stop()
