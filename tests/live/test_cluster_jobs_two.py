"""Live: two jobs on the same nodes, `hangscope HOSTS --print` over real SSH. Job A (dataloader) hangs: its
rank 3 blocks reading its next batch, its ranks 0-2 in all_reduce. Job B (healthy) trains on. Both have ranks
0-3 on node01/node02, told apart by the address of their store (MASTER_ADDR:MASTER_PORT). Each job is analysed
on its own: the headline says job A is hung and names its rank 3, and says job B progresses; no finding about
job B's ranks is a culprit, and --job picks one job."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from app.model.codec import snapshot_from_json
from cluster import UNHURRIED_LOGIN, Cluster, run_login
from jobs import Job, start_job

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]


@pytest.fixture(scope="module")
def two_jobs(cluster_factory: Callable[..., Cluster]) -> Iterator[tuple[Cluster, Job, Job]]:
    cluster = cluster_factory(2)  # its own nodes: the session's shared hung job must not be a third job here
    hung = start_job(cluster, "dataloader", nodes=2, ranks_per_node=2, culprit=3)
    try:
        healthy = start_job(cluster, "healthy", nodes=2, ranks_per_node=2, extra_args=["--step-delay", "0.2"])
        try:
            yield cluster, hung, healthy
        finally:
            healthy.stop()
    finally:
        hung.stop()
        cluster.close()


def hangscope(cluster: Cluster, tmp: Path, *flags: str) -> tuple[str, object, dict]:
    hosts = tmp / "hosts.txt"
    hosts.write_text("".join(f"{n}\n" for n in cluster.names))
    out = tmp / "snap.json"
    res = run_login([sys.executable, "-m", "app", str(hosts), "--print", "--force", "--snapshot", str(out), *UNHURRIED_LOGIN, *flags],
                    cluster, timeout=240, cwd=str(REPO))
    assert out.exists(), f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    snap, analysis = snapshot_from_json(out.read_text())
    assert analysis is not None
    return " ".join(res.stdout.split()), snap, analysis


def store_of(job: Job, cluster: Cluster) -> str:
    """The job's store address as its ranks carry it (torchrun's --master_addr/--master_port)."""
    launcher_args = job.launchers[0].args
    addr = launcher_args[launcher_args.index("--master_addr") + 1]
    port = launcher_args[launcher_args.index("--master_port") + 1]
    return f"{addr}:{port}"


def test_each_job_is_analysed_on_its_own_and_the_headline_says_which_is_hung(two_jobs, tmp_path) -> None:
    cluster, hung, healthy = two_jobs
    a, b = store_of(hung, cluster), store_of(healthy, cluster)
    stdout, snap, analysis = hangscope(cluster, tmp_path)
    jobs = {r.job for r in snap.ranks}  # type: ignore[attr-defined]
    assert jobs == {a, b}, jobs
    assert all(r.job_evidence == "MASTER_ADDR:MASTER_PORT" for r in snap.ranks)  # type: ignore[attr-defined]
    for job, key in ((hung, a), (healthy, b)):
        ranks = {r.rank: r for r in snap.ranks if r.job == key}  # type: ignore[attr-defined]
        assert sorted(ranks) == [0, 1, 2, 3]
        assert all((ranks[n].node, ranks[n].pid) == (loc.node, loc.pid) for n, loc in job.ranks.items())
    culprit = hung.ranks[3]
    # the hung job's culprit and its blocking call, said first ([high] where the node read the socket's peer) or
    # after the place where the stacks part ([medium] where it could not)
    assert re.match(rf"hangscope: Job {re.escape(a)} \(ranks 0-3 on node\[01-02\]\) is hung: rank 3 (\(pid "
                    rf"{culprit.pid} on {culprit.node}\) is blocked in `socket.recv` at `StreamingLoader._recv_exact`"
                    r"|is in `StreamingLoader._recv_exact` .*its main thread is blocked in `socket.recv`)", stdout), stdout
    assert f"Job {b} (ranks 0-3 on node[01-02]) is progressing, not hung." in stdout, stdout
    first = analysis["findings"][0]
    assert first["ranks"] == [[culprit.node, culprit.pid]] and first["title"].startswith(f"job {a}: rank 3")
    assert "`StreamingLoader._recv_exact`" in first["title"], first["title"]
    b_keys = {(r.node, r.pid) for r in snap.ranks if r.job == b}  # type: ignore[attr-defined]
    for f in analysis["findings"]:
        if f["culprit"] and f["confidence"] != "low":
            assert not b_keys & {tuple(k) for k in f["ranks"]}, f  # nothing blames the healthy job's ranks


def test_job_picks_one_job(two_jobs, tmp_path) -> None:
    cluster, hung, healthy = two_jobs
    a = store_of(hung, cluster)
    port = a.rsplit(":", 1)[1]
    stdout, snap, _ = hangscope(cluster, tmp_path, "--job", port)
    assert {r.job for r in snap.ranks} == {a}  # type: ignore[attr-defined]
    # the hung job's culprit and its blocking call: `socket.recv` in its loader, said first ([high] where the node
    # read the socket's peer) or after the place where the stacks part ([medium] where it could not)
    culprit = hung.ranks[3]
    assert re.match(rf"hangscope: Rank 3 (\(pid {culprit.pid} on {culprit.node}\) is blocked in `socket.recv` at "
                    r"`StreamingLoader._recv_exact`|is in `StreamingLoader._recv_exact` .*its main thread is blocked "
                    r"in `socket.recv`)", stdout), stdout
