"""`make gpu-check` (bench/gpu_check.py) where no GPU is: it says so plainly, runs hangscope's GPU code against the
recorded fakes, writes its summary under $OUT, and passes.

The GPU path itself needs a GPU machine; `--rehearse` runs it on CPUs (gloo) by hand, not here: it starts torch
jobs for a minute or more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_without_a_gpu_it_says_so_and_checks_the_recorded_fakes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out))
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--no-gpu"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("NO GPU on "), done.stdout
    assert "The GPU tests and the NCCL job did NOT run" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpu"] is False and summary["facts"]["mode"] == "no-gpu"
    steps = {s["name"]: s["status"] for s in summary["steps"]}
    assert steps["the GPU tests' node reading (gpu_inventory) on fake tools"] == "pass", summary
    assert steps["the investigation's GPU evidence (collect) on fake tools"] == "pass", summary
    assert steps["NCCL_DEBUG=INFO logs (tests/data/nccl) parsed"] == "pass", summary
    assert not [s for s in summary["steps"] if s["status"] == "fail"]
    md = (out / "summary.md").read_text()
    assert md.startswith("# NO GPU on ") and "| step | result |" in md
    assert sorted(p.name for p in out.iterdir()) == ["steps.log", "summary.json", "summary.md"]
