"""Live: the whole job, not only its ranks (issue 16.3), and how close together a pass's dumps are (16.8).

One 4-node test cluster holds a torchrun job of 8 ranks (tests/support/loader_job.py) whose ranks each read through a
DataLoader with 2 worker processes (fork: they inherit the rank's RANK environment), 24 torch processes in all;
the culprit's workers never return a batch, so the culprit waits in the DataLoader while the others wait for it
in all_reduce. `hangscope HOSTS --print --snapshot --export` over real SSH must find 8 ranks (not 24), carry the
workers as the ranks' children and torchrun as the launcher above them, dump the culprit's workers (its rank
waits on them) and not the others', and record each rank dump's start and end and the pass's skew.
Beside it, on node04, a second torchrun (2 nodes expected, only one started) waits in its rendezvous: a job with
a launcher and no rank yet, picked with --job, is reported as such, its launcher dumped.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

from app.model import Snapshot
from app.model.codec import snapshot_from_json
from cluster import UNHURRIED_LOGIN, Cluster, run_login
from waiting import wait_until
from jobs import MARK, PYTHON, Job, _free_port, _kill_marked, start_job

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "loader_job.py"
CULPRIT = 5
pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]


@pytest.fixture(scope="module")
def loader_job(cluster_factory: Callable[..., Cluster]) -> Iterator[tuple[Cluster, Job, dict[int, list[int]]]]:
    cluster = cluster_factory(4)
    job = start_job(cluster, "loader", nodes=4, ranks_per_node=2, culprit=CULPRIT, step=3, timeout=180,
                    script=SCRIPT, extra_args=["--hang-step", "3", "--culprit", str(CULPRIT)])
    try:
        workers = {int(line["rank"]): [int(w) for w in line["workers"]] for line in job.read_ready()}
        yield cluster, job, workers
    finally:
        job.stop()
        cluster.close()


def hangscope(cluster: Cluster, tmp: Path, *flags: str, hosts: list[str] | None = None,
              expect: int = 0) -> tuple[str, Snapshot, Path]:
    hosts_file = tmp / "hosts.txt"
    hosts_file.write_text("".join(f"{n}\n" for n in hosts or cluster.names))
    out, export = tmp / "snap.json", tmp / "report"
    res = run_login([sys.executable, "-m", "app", str(hosts_file), *UNHURRIED_LOGIN, "--print", "--force", "--snapshot", str(out),
                     "--export", str(export), *flags], cluster, timeout=300, cwd=str(REPO))
    assert res.returncode == expect, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res.stdout, snapshot_from_json(out.read_text())[0], export


@pytest.fixture(scope="module")
def picture(loader_job, tmp_path_factory) -> tuple[str, Snapshot, Path]:
    cluster, _, _ = loader_job
    return hangscope(cluster, tmp_path_factory.mktemp("loader"))


def test_ranks_with_data_loader_workers_are_8_ranks_with_their_workers_under_them(loader_job, picture) -> None:
    _, job, workers = loader_job
    stdout, snap, _ = picture
    assert sorted(r.rank for r in snap.ranks) == list(range(8)), "8 ranks, not the 24 torch processes"
    assert {(r.node, r.pid) for r in snap.ranks} == {(loc.node, loc.pid) for loc in job.ranks.values()}
    by_rank = {r.rank: r for r in snap.ranks}
    children = {(p.node, p.pid): p for p in snap.processes if p.role == "child"}
    launchers = [p for p in snap.processes if p.role == "launcher"]
    for number, pids in workers.items():
        r = by_rank[number]
        assert sorted(r.children) == sorted(pids), (number, r.children, pids)
        for pid in pids:
            child = children[(r.node, pid)]
            assert child.of == (r.pid,) and child.job == r.job
    # torchrun's agent on each node, above that node's two ranks
    assert sorted(p.node for p in launchers) == sorted(cluster_names(snap))
    for p in launchers:
        assert p.kind == "torchrun" and sorted(p.of) == sorted(r.pid for r in snap.ranks if r.node == p.node)
        assert all(r.launcher_pid == p.pid for r in snap.ranks if r.node == p.node)
    # the tree as printed: torchrun, then its ranks, each with its workers indented below it
    lines = stdout.split("Processes of the job", 1)[1].splitlines()
    culprit = by_rank[CULPRIT]
    at = next(i for i, line in enumerate(lines) if f"rank {CULPRIT} (pid {culprit.pid})" in line)
    indent = len(lines[at]) - len(lines[at].lstrip())
    above = next(line for line in reversed(lines[:at]) if len(line) - len(line.lstrip()) < indent)
    assert "torchrun pid" in above, lines
    below = lines[at + 1:at + 3]
    assert all(len(line) - len(line.lstrip()) > indent for line in below), lines
    assert {int(line.split(" pid ")[1].split()[0]) for line in below} == set(workers[CULPRIT])


def cluster_names(snap: Snapshot) -> list[str]:
    return [n.name for n in snap.nodes]


def test_the_workers_a_rank_waits_on_are_dumped_and_no_others(loader_job, picture) -> None:
    _, _, workers = loader_job
    stdout, snap, _ = picture
    culprit = next(r for r in snap.ranks if r.rank == CULPRIT)
    assert any(f.function.endswith("._try_get_data") for t in culprit.threads for f in t.frames)
    for p in snap.processes:
        if p.role != "child":
            continue
        if (p.node, p.of) == (culprit.node, (culprit.pid,)):
            assert p.why_dumped == "its rank waits on it" and p.collected, p
            assert p.kind == "data-loader worker"
            main = next(t for t in p.threads if t.is_main)
            assert any(f.function.endswith("__getitem__") and f.filename.endswith("loader_job.py") for f in main.frames)
        else:
            assert not p.collected and p.why_dumped == "" and not p.threads, p  # their ranks wait in all_reduce
    assert "data-loader worker pid" in stdout and "dumped: its rank waits on it" in stdout


def test_each_dump_is_timed_and_the_pass_skew_reported(picture) -> None:
    stdout, snap, export = picture
    starts = [r.dump_started for r in snap.ranks]
    assert all(s is not None for s in starts)
    assert all(r.dump_ended is not None and r.dump_ended >= r.dump_started for r in snap.ranks)  # type: ignore
    assert snap.dump_skew == pytest.approx(max(starts) - min(starts), abs=1e-5)  # type: ignore[type-var]
    assert snap.taken_at - 1 <= min(starts) <= snap.taken_at + snap.duration  # type: ignore[type-var]
    line = f"the 8 rank dumps on 4 nodes started within {snap.dump_skew:.3f} s of each other"
    assert line in " ".join(stdout.split()), stdout
    assert line in " ".join((export / "summary.md").read_text().split())


@pytest.fixture
def waiting_launcher(loader_job) -> Iterator[tuple[Cluster, str]]:
    """torchrun on node04 for a job of 2 nodes whose other node never starts: it waits in its rendezvous."""
    cluster, _, _ = loader_job
    node = cluster.nodes[3]
    mark = secrets.token_hex(4)
    port = _free_port(node)
    workdir = Path(tempfile.mkdtemp(prefix="hangscope-rdzv-"))
    log = open(workdir / "log", "wb")  # noqa: SIM115 (closed in finally)
    argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "0", "--master_addr", node.ip,
            "--master_port", str(port), "--nproc_per_node", "2", str(SCRIPT)]
    proc = node.spawn(argv, env={MARK: mark, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT)
    try:
        # the agent listens on its store once it waits for the other node
        wait_until(lambda: proc.poll() is None and str(port) in node.run(["ss", "-ltn"]).stdout, 60,
             "torchrun's store to listen")
        yield cluster, f"{node.ip}:{port}"
    finally:
        wait_until(lambda: not _kill_marked([node], f"{MARK}={mark}"), 15, "the waiting torchrun to die")
        proc.wait(timeout=15)
        log.close()


def test_a_job_with_a_launcher_and_no_rank_yet_is_a_job(waiting_launcher, tmp_path) -> None:
    cluster, endpoint = waiting_launcher
    stdout, snap, _ = hangscope(cluster, tmp_path, "--job", endpoint, hosts=[cluster.names[3]], expect=1)
    assert snap.ranks == ()
    (launcher,) = [p for p in snap.processes if p.role == "launcher"]
    assert launcher.kind == "torchrun" and launcher.job == endpoint and launcher.of == ()
    assert launcher.why_dumped == "no rank of it exists yet" and launcher.collected
    assert "no rank processes were found" not in stdout.lower()
    assert stdout.startswith(f"hangscope: Job {endpoint} has 1 launcher on {cluster.names[3]} and no rank yet"), stdout
    assert f"torchrun pid {launcher.pid}" in stdout
    code = json.dumps([f.function for t in launcher.threads for f in t.frames])
    assert "rendezvous" in code or "barrier" in code or "_store" in code, code
