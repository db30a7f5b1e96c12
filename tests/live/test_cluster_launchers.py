"""Live: one small hung job (2 ranks, tests/support/matrix_job.py) per way of launching torch ranks, all on one test
cluster node, and one `hangscope node01 --print --locals` over real SSH (issue 16.1, 16.3). Every rank is found,
numbered from the best evidence it carries (its environment, its command line, the job's store), the evidence
named; ranks with no rank environment at all are found by what they
are (spawn children, or by their connections to the job's store and to each other); each job's launcher is found
as its launcher and never counted as a rank; a rank in a container (its own PID and mount namespace) is found with
its pid inside. deepspeed runs on the CPU accelerator (DS_ACCELERATOR=cpu)."""

from __future__ import annotations

import json
import secrets
import shutil
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
from jobs import MARK, PYTHON, _free_port, _kill_marked

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "tests" / "support" / "matrix_job.py")
SPAWN = str(REPO / "tests" / "support" / "spawn_job.py")
BIN = Path(PYTHON).parent
pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]

# mode -> (launcher kind hangscope must name, rank evidence, how the rank was found)
EXPECT = {
    "torchrun": ("torchrun", "environment (RANK)", "rank environment"),
    "distributed.run": ("torchrun", "environment (RANK)", "rank environment"),
    "accelerate": ("accelerate", "environment (RANK)", "rank environment"),
    "deepspeed": ("deepspeed", "environment (RANK)", "rank environment"),
    "mpirun": ("mpirun", "environment (OMPI_COMM_WORLD_RANK)", "rank environment"),
    "container": ("torchrun", "environment (RANK)", "rank environment"),
    # no rank environment: the job's store numbers them (the target's `rank` argument agrees: --no-store shows it,
    # tests/live/test_cluster_spawn.py)
    "mp.spawn": ("python", "the process group's store (127.0.0.1:", "multiprocessing spawn child with torch loaded"),
    "multiprocessing": ("python", "the process group's store (127.0.0.1:", "connections: "),
    "subprocess": ("python", "command line (--rank)", "connections: "),
}


def argv_for(mode: str, ready: str, port: int) -> list[str]:
    run = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", SCRIPT, "rank", ready]
    if mode == "torchrun":
        return [str(BIN / "torchrun"), *run[3:]]
    if mode == "distributed.run":
        return run
    if mode == "container":  # its own PID and mount namespace, /proc mounted inside: pids there differ
        return ["unshare", "--pid", "--fork", "--mount-proc", *run]
    if mode == "accelerate":
        return [PYTHON, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
                "1", "--main_process_port", str(port), "--mixed_precision", "no", "--dynamo_backend", "no",
                SCRIPT, "rank", ready]
    if mode == "deepspeed":  # its runner starts deepspeed.launcher.launch, which starts the ranks
        return [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(port), SCRIPT, "rank", ready,
                str(port)]
    if mode == "mpirun":
        return [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                "-x", "MATRIX_MODE", "-x", "OMP_NUM_THREADS", "-x", MARK, PYTHON, SCRIPT, "rank", ready, str(port)]
    if mode == "mp.spawn":
        return [PYTHON, SPAWN, "2", str(port), ready]
    return [PYTHON, SCRIPT, mode, ready, str(port)]


@pytest.fixture(scope="module")
def matrix(cluster_factory: Callable[..., Cluster]) -> Iterator[tuple[Cluster, dict[str, dict[int, int]]]]:
    """(cluster, mode -> rank -> pid as the rank sees itself) with every job started and hung on node01."""
    cluster = cluster_factory(1)
    node = cluster.nodes[0]
    workdir = Path(tempfile.mkdtemp(prefix="hangscope-matrix-"))
    workdir.chmod(0o755)
    mark = secrets.token_hex(4)
    logs = []
    try:
        for mode in EXPECT:
            ready = str(workdir / f"{mode}.jsonl")
            log = open(workdir / f"{mode}.log", "wb")  # noqa: SIM115 (closed in the finally below)
            logs.append(log)
            env = {MARK: mark, "OMP_NUM_THREADS": "1", "MATRIX_MODE": mode, "DS_ACCELERATOR": "cpu"}
            node.spawn(argv_for(mode, ready, _free_port(node)), env=env, stdout=log, stderr=subprocess.STDOUT)

        def ranks_of(mode: str) -> dict[int, int]:
            path = workdir / f"{mode}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            return {int(d["rank"]): int(d["pid"]) for d in map(json.loads, lines)}

        def all_ready() -> bool:
            return all(len(ranks_of(mode)) == 2 for mode in EXPECT)

        try:
            wait_until(all_ready, 240, "every job's two ranks to be ready", interval=0.5)
        except TimeoutError:
            tails = {m: (workdir / f"{m}.log").read_text(errors="replace")[-1500:] for m in EXPECT
                     if len(ranks_of(m)) < 2}
            raise AssertionError(f"jobs not ready: {tails}") from None
        yield cluster, {mode: ranks_of(mode) for mode in EXPECT}
    finally:
        wait_until(lambda: not _kill_marked([node], f"{MARK}={mark}"), 20, "the matrix jobs to die")
        for log in logs:
            log.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def picture(matrix, tmp_path_factory) -> tuple[str, Snapshot]:
    cluster, _ = matrix
    tmp = tmp_path_factory.mktemp("matrix")
    hosts = tmp / "hosts.txt"
    hosts.write_text(f"{cluster.names[0]}\n")
    out = tmp / "snap.json"
    res = run_login([sys.executable, "-m", "app", str(hosts), *UNHURRIED_LOGIN, "--print", "--force", "--locals", "--samples", "1",
                     "--snapshot", str(out)], cluster, timeout=400, cwd=str(REPO))
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res.stdout, snapshot_from_json(out.read_text())[0]


@pytest.mark.parametrize("mode", list(EXPECT))
def test_each_launch_is_found_numbered_and_its_launcher_named(matrix, picture, mode: str) -> None:
    _, jobs = matrix
    _, snap = picture
    kind, evidence, found_by = EXPECT[mode]
    pids = jobs[mode]
    inside = mode == "container"
    found = {(r.nspid if inside else r.pid): r for r in snap.ranks}
    ranks = [found.get(pid) for pid in pids.values()]
    assert all(r is not None for r in ranks), (mode, pids, sorted(found))
    for number, pid in pids.items():
        r = found[pid]
        assert r.rank == number, (mode, r)
        if evidence.startswith("the process group's store"):  # its address and the rank's gloo address follow
            assert r.rank_evidence.startswith(evidence) and "said" not in r.rank_evidence, (mode, r)
        else:
            assert r.rank_evidence == evidence, (mode, r)
        assert r.found_by.startswith(found_by), (mode, r.found_by)
        assert r.launcher == kind, (mode, r.launcher)
        assert r.in_container == inside and (r.nspid is not None) == inside, (mode, r.nspid)
    # one job, its launcher above both ranks, and the launcher never a rank
    assert len({r.job for r in ranks}) == 1, [r.job for r in ranks]  # type: ignore[union-attr]
    launcher_pid = ranks[0].launcher_pid  # type: ignore[union-attr]
    launcher = next(p for p in snap.processes if p.pid == launcher_pid)
    assert launcher.role == "launcher" and launcher.kind == kind
    assert sorted(launcher.of) == sorted(r.pid for r in ranks)  # type: ignore[union-attr]
    assert launcher_pid not in {r.pid for r in snap.ranks}


def test_nothing_else_is_taken_for_a_rank(matrix, picture) -> None:
    _, jobs = matrix
    _, snap = picture
    assert len(snap.ranks) == 2 * len(jobs), sorted((r.pid, r.found_by, r.cmdline[:3]) for r in snap.ranks)
    assert len({r.job for r in snap.ranks}) == len(jobs)
