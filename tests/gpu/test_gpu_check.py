"""`make gpu-check` (bench/gpu_check.py) where no GPU is: it says so plainly, runs hangscope's GPU code against the
recorded fakes, writes its summary under $OUT, and passes.

The GPU path itself needs a GPU machine; `--rehearse` runs it on CPUs (gloo) by hand, not here: it starts torch
jobs for a minute or more.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
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


def _gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", REPO / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_it_installs_every_pinned_login_dependency_and_nothing_already_at_its_pin() -> None:
    """On a GPU machine the check installs what hangscope needs before it runs hangscope: every dependency that
    pyproject.toml pins, read from pyproject.toml itself (the first H100 run of 2026-11-27 failed every hangscope
    step on `import orjson`: the check kept a list of its own that had not grown with pyproject.toml)."""
    gpu_check = _gpu_check_module()
    with open(REPO / "pyproject.toml", "rb") as f:
        declared = tomllib.load(f)["project"]["dependencies"]
    pins = gpu_check.pinned_dependencies()
    assert sorted(pins.values()) == sorted(d.split(";")[0].strip() for d in declared)
    # this venv was installed from pyproject.toml: nothing is missing here
    assert gpu_check.missing_pins(list(pins.values())) == []
    # a pin this python lacks, by name or by version, is missing; the others are not
    assert gpu_check.missing_pins(["orjson==0.0.1", "no-such-distribution-hs==1.0", pins["textual"]]) == [
        "orjson==0.0.1", "no-such-distribution-hs==1.0"]
