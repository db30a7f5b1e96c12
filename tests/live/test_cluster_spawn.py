"""Live: ranks started by torch.multiprocessing.spawn (PyTorch's DDP tutorial; tests/support/spawn_job.py) on a test
cluster node, `hangscope HOSTS --print` over real SSH. No rank has RANK/LOCAL_RANK/WORLD_SIZE in its
environment: discovery finds them as spawn children with torch loaded (not the launcher, not its resource
tracker), and each rank's number comes from the job's store (read-only), or with --no-store from the spawn
target's `rank` argument (--locals), the evidence named; with neither the ranks are still found, by pid, and the
number is left unknown, never invented."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

from app.model.codec import snapshot_from_json
from cluster import UNHURRIED_LOGIN, Cluster, run_login
from jobs import MARK, PYTHON, _free_port, _kill_marked
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "spawn_job.py"
WORLD = 4
pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]


@pytest.fixture(scope="module")
def spawn_job(cluster_factory: Callable[..., Cluster]) -> Iterator[tuple[Cluster, dict[int, int], int]]:
    """(cluster, rank -> pid in the node, the launcher's pid in the node) of a hung mp.spawn job on node01."""
    cluster = cluster_factory(1)
    node = cluster.nodes[0]
    workdir = Path(tempfile.mkdtemp(prefix="hangscope-spawn-"))
    workdir.chmod(0o755)
    ready = workdir / "ready.jsonl"
    mark = secrets.token_hex(4)
    with open(workdir / "log", "wb") as log:  # the launcher holds its own copy
        launcher = node.spawn([PYTHON, str(SCRIPT), str(WORLD), str(_free_port(node)), str(ready)],
                              env={MARK: mark, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT)
    try:
        def all_ready() -> bool:
            assert launcher.poll() is None, (workdir / "log").read_text()
            return ready.exists() and len(ready.read_text().splitlines()) >= WORLD

        wait_until(all_ready, 120, "every spawned rank to be ready", interval=0.2)
        ranks = {int(d["rank"]): int(d["pid"]) for d in map(json.loads, ready.read_text().splitlines())}
        parent = {int(line.split()[3]) for pid in ranks.values()
                  for line in [node.run(["cat", f"/proc/{pid}/stat"]).stdout]}
        assert len(parent) == 1
        yield cluster, ranks, parent.pop()
    finally:
        wait_until(lambda: not _kill_marked([node], f"{MARK}={mark}"), 15, "the spawn job to die")
        launcher.wait(timeout=15)
        cluster.close()


def hangscope(cluster: Cluster, tmp: Path, *flags: str) -> tuple[str, object]:
    hosts = tmp / "hosts.txt"
    hosts.write_text("".join(f"{n}\n" for n in cluster.names))
    out = tmp / "snap.json"
    res = run_login([sys.executable, "-m", "app", str(hosts), *UNHURRIED_LOGIN, "--print", "--force", "--snapshot", str(out), *flags],
                    cluster, timeout=240, cwd=str(REPO))
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res.stdout, snapshot_from_json(out.read_text())[0]


def test_spawned_ranks_are_found_and_numbered_from_the_jobs_store(spawn_job, tmp_path) -> None:
    cluster, pids, launcher = spawn_job
    stdout, snap = hangscope(cluster, tmp_path, "--locals")
    found = {r.pid: r for r in snap.ranks}  # type: ignore[attr-defined]
    assert sorted(found) == sorted(pids.values()), "the four ranks, not the launcher nor its resource tracker"
    for number, pid in pids.items():
        r = found[pid]
        assert r.env_value("RANK") is None  # really no rank environment
        assert r.found_by == "multiprocessing spawn child with torch loaded"
        assert (r.rank, r.world_size, r.local_rank) == (number, WORLD, number), r
        # the store outranks the spawn argument, which agrees here (it would say so otherwise)
        assert r.rank_evidence.startswith("the process group's store (127.0.0.1:"), r
        assert "said" not in r.rank_evidence, r
        assert r.launcher_pid == launcher
    # the analysis speaks of rank numbers, and names the one the others wait for
    # ... and why: its main thread blocked in `Event.wait` (nothing else in the process can set the event)
    assert re.match(rf"hangscope: Rank {WORLD - 1} \(pid \d+ on node0\d\) is blocked in `Event.wait` at "
                    r"`demo_basic` \(spawn_job.py:\d+\)", " ".join(stdout.split())), stdout


def test_without_the_store_the_number_comes_from_the_spawn_targets_rank_argument(spawn_job, tmp_path) -> None:
    cluster, pids, _ = spawn_job
    _, snap = hangscope(cluster, tmp_path, "--locals", "--no-store")
    found = {r.pid: r for r in snap.ranks}  # type: ignore[attr-defined]
    for number, pid in pids.items():
        r = found[pid]
        assert (r.rank, r.world_size, r.local_rank) == (number, WORLD, number), r
        assert r.rank_evidence == "the spawn target's `rank` argument (demo_basic, py-spy --locals)"


def test_with_neither_locals_nor_store_the_ranks_are_found_and_the_number_left_unknown(spawn_job, tmp_path) -> None:
    cluster, pids, _ = spawn_job
    _, snap = hangscope(cluster, tmp_path, "--no-locals", "--no-store")
    assert sorted(r.pid for r in snap.ranks) == sorted(pids.values())  # type: ignore[attr-defined]
    assert all(r.rank is None and r.rank_evidence == "" for r in snap.ranks)  # type: ignore[attr-defined]
    (node,) = snap.nodes  # type: ignore[attr-defined]
    assert any("spawn" in n and "store" in n and "--locals" in n for n in node.warnings), node.warnings
