"""Slow is not stuck, live: a DDP training job (4 nodes x 2 ranks, gloo on CPU) that trains on is called
progressing in every run of `hangscope HOSTS --print`, and with one node's ranks capped to 10 % of a CPU by a
cgroup it is still called progressing, with that node named slow and the throttling as the evidence.

The job is tests/support/ddp_train.py, our stand-in shaped like nanoGPT's train.py (module-level loop, gradient
accumulation, DDP's all_reduce inside backward). nanoGPT's own train.py, unmodified, and Lightning Fabric's
example are diagnosed the same way in tests/live/test_oss_cluster.py. One job serves every test here.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from cluster import UNHURRIED_LOGIN, Cluster, run_login
from cpu_cap import CpuCap
from jobs import REPO, Job, start_job
from app.model.codec import snapshot_from_json

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]

SCRIPT = REPO / "tests" / "support" / "ddp_train.py"
RUNS = 3  # consecutive runs that must all call the healthy job progressing (bench/oss_runs.py: 20 runs of real scripts)
CLI_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def cluster(cluster_factory: Callable[..., Cluster]) -> Iterator[Cluster]:
    """A cluster of this module's own (it overrides the session's): the session cluster runs the shared hung job,
    whose ranks would be found beside this job's."""
    built = cluster_factory(4)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture(scope="module")
def ddp_job(cluster: Cluster) -> Iterator[Job]:
    job = start_job(cluster, "ddp-train", nodes=4, ranks_per_node=2, script=SCRIPT, wait=False, timeout=180)
    try:
        yield job
    finally:
        job.stop()


def hangscope(cluster: Cluster, tmp_path: Path, *extra: str) -> tuple[str, Any, dict]:
    """`hangscope HOSTS --print --snapshot F` as a user runs it: (stdout, snapshot, analysis)."""
    out = tmp_path / f"snap-{secrets.token_hex(3)}.json"
    res = run_login([sys.executable, "-m", "app", str(cluster.hosts_file(tmp_path)), "--print", "--snapshot",
                     str(out), *UNHURRIED_LOGIN, *extra], cluster, timeout=CLI_TIMEOUT, cwd=str(REPO))
    assert out.exists(), f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    snap, analysis = snapshot_from_json(out.read_text(encoding="utf-8"))
    assert analysis is not None
    # exit 1 (partial) only for what a running rank does to py-spy's non-blocking read on a loaded machine: dumps
    # that fail, reported as such; the counters, read from /proc without py-spy, are there for every rank
    failed = [r for r in snap.ranks if r.error is not None]
    assert res.returncode == 0 or (res.returncode == 1 and failed and all(r.error.code == "tool_failed"
                                                                          for r in failed)
                                   and any(f["kind"] == "dump_failed" for f in analysis["findings"])), \
        f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout, snap, analysis


def flat(text: str) -> str:
    return " ".join(text.split())


def assert_progressing(stdout: str, snap: Any, analysis: dict) -> None:
    assert len(snap.ranks) == 8 and all(r.counters is not None for r in snap.ranks), "every rank's counters"
    assert analysis["verdict"].startswith("The job is progressing"), stdout
    assert analysis["findings"][0]["kind"] == "progressing", stdout
    blamed = [f for f in analysis["findings"] if f["culprit"] and f["kind"] != "slow_node"
              and f["confidence"] != "low"]
    assert blamed == [], f"a training job has no culprit:\n{stdout}"
    assert not any(f["kind"] == "still_running" for f in analysis["findings"]), stdout
    # no advice the evidence contradicts: the sockets carry the gradients, so the links work
    assert "check the links" not in flat(stdout), stdout
    stuck = [p for p in analysis["progress"] if p["status"] == "stuck"]
    assert stuck == [], f"ranks whose sockets moved are not stuck:\n{stdout}"


def test_a_healthy_ddp_job_is_progressing_in_every_run(cluster: Cluster, ddp_job: Job, tmp_path: Path) -> None:
    for run in range(RUNS):
        stdout, snap, analysis = hangscope(cluster, tmp_path)
        print(f"\nrun {run + 1}:\n{stdout}")
        assert_progressing(stdout, snap, analysis)
        assert not any(f["kind"] == "slow_node" for f in analysis["findings"]), f"no node is held back:\n{stdout}"
        moved = [p for p in analysis["progress"] if p["net_bytes"]]
        assert len(moved) == 8, "every rank's sockets to its peers moved the gradients between the samples"


def test_a_node_capped_to_ten_percent_cpu_is_named_slow(cluster: Cluster, ddp_job: Job, tmp_path: Path) -> None:
    slow = "node04"
    pids = [loc.host_pid for loc in ddp_job.ranks.values() if loc.node == slow]
    assert len(pids) == 2 and all(pids)
    with CpuCap(0.10) as cap:
        for pid in pids:
            cap.add(pid)
        time.sleep(2)  # the cap is felt at once; a few periods make it visible in the counters
        stdout, snap, analysis = hangscope(cluster, tmp_path, "--samples", "3")
        print(f"\n{stdout}")
        limited = [r for r in snap.ranks if r.node == slow]
        assert all(r.counters.cgroup is not None and r.counters.cgroup.quota_us == cap.quota for r in limited), \
            "the worker read the cap that applies to the ranks"
    assert_progressing(stdout, snap, analysis)
    slow_findings = [f for f in analysis["findings"] if f["kind"] == "slow_node"]
    assert [f["nodes"] for f in slow_findings] == [slow], stdout
    assert "throttled" in slow_findings[0]["title"] and "10% of a CPU" in slow_findings[0]["detail"], stdout
    assert f"{slow} is slow" in analysis["verdict"], "the verdict names the slow node next to 'progressing'"
    assert all(os.path.exists(f"/proc/{pid}") for pid in pids), "the ranks were left running"
