"""Live: the wait model's two frozen development scenarios (issue 24), diagnosed by the real CLI on the test cluster.

A rank of a healthy torch gloo job (app/demo/job.py) frozen by its cgroup freezer (v1 or v2) on a node whose
cgroup file systems are hidden from it: named frozen, dumped without ptrace and left exactly as it was. Both
scenarios share one healthy job on a 4-node cluster of this module's own, frozen and thawed in turn; judged as
test_dev_scenarios.py judges the others (assert_right).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

import pytest

from cluster import Cluster
from jobs import Job, _main_thread, start_job
from record_scenarios import DEVELOPMENT, Running, diagnose, freeze, hide_cgroups, others_still
from test_dev_scenarios import FROZEN, assert_right
from waiting import wait_until
from worker_targets import proc_state, tracer_pid

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]


@pytest.fixture(scope="module")
def dev_cluster(cluster_factory: Callable[..., Cluster]) -> Iterator[Cluster]:
    built = cluster_factory(2)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture(scope="module")
def healthy_job(dev_cluster: Cluster) -> Iterator[Job]:
    job = start_job(dev_cluster, "healthy", nodes=2, ranks_per_node=2, extra_args=["--step-delay", "0.2"])
    try:
        yield job
    finally:
        job.stop()


@contextlib.contextmanager
def frozen_on_a_blind_node(job: Job, cluster: Cluster, name: str) -> Iterator[int]:
    """The scenario's rank frozen by its freezer version from the host, its node's cgroup file systems hidden;
    thawed, shown again and training once more afterwards."""
    scenario = DEVELOPMENT[name]
    assert scenario.culprit is not None
    pid = job.ranks[scenario.culprit].host_pid
    thaw = freeze(pid, scenario.freezer)
    try:
        show = hide_cgroups(cluster[job.ranks[scenario.culprit].node])
        try:
            others_still(job, scenario.culprit)
            yield pid
        finally:
            show()
    finally:
        thaw()
    before = {r: _main_thread(loc.host_pid) for r, loc in job.ranks.items()}
    wait_until(lambda: all(_main_thread(loc.host_pid) != before[r] for r, loc in job.ranks.items()), 60,
               "the job to train again")


@pytest.mark.parametrize("name", FROZEN)
def test_a_rank_frozen_on_a_node_that_cannot_see_its_cgroup_is_named_frozen_and_left_frozen(
        name: str, healthy_job: Job, dev_cluster: Cluster, tmp_path: Path) -> None:
    with frozen_on_a_blind_node(healthy_job, dev_cluster, name) as pid:
        state = proc_state(pid)
        d = diagnose(Running(DEVELOPMENT[name], healthy_job, dev_cluster), tmp_path)
        print(f"\n{name}: hangscope took {d.seconds:.1f} s\n{d.stdout}")
        held = next(r for r in d.snapshot.ranks if r.rank == DEVELOPMENT[name].culprit)
        assert held.hold is None or not held.hold.cgroup, held.hold  # the node could not name the cgroup
        assert proc_state(pid) == state and tracer_pid(pid) == 0 and not held.resumed  # left exactly as it was
        assert_right(name, d)
