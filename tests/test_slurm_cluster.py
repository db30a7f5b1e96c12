"""A real SLURM (slurmctld, slurmd per node, munge) on the namespace cluster: --slurm resolution and srun."""

from __future__ import annotations

from typing import Iterator

import pytest

from app.slurm.job import SlurmError
from app.slurm.resolve import resolve_job
from cluster import poll, support_problem
from slurm_cluster import SlurmCluster, build_slurm, slurm_problem

pytestmark = pytest.mark.skipif(bool(support_problem() or slurm_problem()),
                                reason=str(support_problem() or slurm_problem()))


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with build_slurm(2) as s:
        yield s


def submit(slurm: SlurmCluster, *args: str) -> str:
    out = slurm.run("sbatch", "--parsable", f"--output={slurm.dir}/job-%j.out", *args).stdout
    return out.strip().split(";")[0]


def wait_state(slurm: SlurmCluster, job_id: str, state: str) -> None:
    poll(lambda: slurm.run("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip() == state, 30,
         f"job {job_id} {state}", interval=0.1)


def test_running_job_resolves_to_its_nodes(slurm: SlurmCluster) -> None:
    job_id = submit(slurm, "-N", "2", "--job-name", "resolve me", "--wrap", "sleep 600")
    try:
        wait_state(slurm, job_id, "RUNNING")
        job = resolve_job(job_id, slurm.env())
        assert job.nodes == tuple(slurm.compute_names) and job.state == "RUNNING"
        assert job.name == "resolve me" and job.user == "root" and job.start_time
        assert job.source == "squeue --json" and not job.warnings  # 22.05: scontrol has no --json yet
        # inside the allocation, --slurm needs no id
        assert resolve_job(None, slurm.env({"SLURM_JOB_ID": job_id})).nodes == job.nodes
    finally:
        slurm.run("scancel", job_id, check=False)


def test_pending_job_is_refused_with_its_reason(slurm: SlurmCluster) -> None:
    job_id = submit(slurm, "--hold", "--wrap", "true")
    try:
        with pytest.raises(SlurmError) as err:
            resolve_job(job_id, slurm.env())
        assert err.value.problem == "not_running" and "PENDING" in str(err.value)
        assert "JobHeldUser" in str(err.value)
    finally:
        slurm.run("scancel", job_id, check=False)


def test_unknown_job_is_refused(slurm: SlurmCluster) -> None:
    with pytest.raises(SlurmError) as err:
        resolve_job("987654", slurm.env())
    assert err.value.problem == "unknown_job" and "987654" in str(err.value)
