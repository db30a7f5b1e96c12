"""bench/snapshot.py (`make bench-snapshot`) still runs end to end: every method sees every rank on a 2-node
cluster, the table has its ratios, the CPU meter's cgroup is removed; and a stand-in rank looks like a rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cluster as cluster_mod
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "snapshot.py"


def test_bench_snapshot_measures_every_method_on_a_small_cluster(tmp_path: Path) -> None:
    problem = cluster_mod.support_problem()
    if problem:
        pytest.skip(problem)
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(BENCH), "--sizes", "2x2", "--repeat", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 2 x 2 |" in done.stdout and "warm/floor" in done.stdout, done.stdout
    (result,) = json.loads(out.read_text())
    for method in ("seq", "par", "cli", "cold", "warm", "floor"):
        assert result["median"][method] > 0, method
    if Path("/sys/fs/cgroup/cpuacct/cgroup.procs").exists():
        assert result["cpu"]["cold"] > 0 and result["cpu"]["floor"] > 0
        assert not list(Path("/sys/fs/cgroup/cpuacct").glob("hangscope-bench-*")), "cgroup left behind"


def test_stand_in_rank_blocks_in_a_loop_with_its_step(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    env = dict(os.environ, RANK="4", LOCAL_RANK="0", WORLD_SIZE="8")
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "stand_in_rank.py"), str(ready)], env=env)
    try:
        wait_until(lambda: ready.exists() and ready.read_text().endswith("\n"), 30, "the rank to block")
        pid, step = (int(x) for x in ready.read_text().split())
        assert pid == proc.pid and step == 4 % 3 + 5
        dump = subprocess.run([str(cluster_mod.PYSPY), "dump", "--json", "--locals", "--pid", str(pid)],
                              capture_output=True, text=True, timeout=30)
        assert dump.returncode == 0, dump.stderr
        frames = [f for t in json.loads(dump.stdout) for f in t["frames"]]
        assert [f["name"] for f in frames[:3]] == ["all_reduce", "train", "<module>"]
        assert any(v["name"] == "step" and v["repr"] == str(step) for v in frames[1].get("locals") or [])
    finally:
        proc.kill()
        proc.wait()
