"""The README's first command: `hangscope demo` starts a local gloo job that hangs and names the culprit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.torch
def test_demo_finds_the_rank_one_iteration_ahead_and_stops_the_job(torch_support):
    res = subprocess.run([sys.executable, "-m", "app", "demo", "--print"], capture_output=True, text=True,
                         cwd=REPO, timeout=300, stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 0, res.stderr[-3000:]
    # the default scenario: rank 3 skipped one all_reduce and waits on the same line one step ahead
    assert "rank 3 is 1 iteration ahead (step=4 vs 3)" in res.stdout, res.stdout
    assert "step=3: ranks 0-2; step=4: rank 3" in res.stdout
    assert "job stopped" in res.stderr
    pids = [line.split("ranks ", 1)[1].rstrip(")").split(", ") for line in res.stderr.splitlines()
            if "the job is hung" in line][0]
    assert len(pids) == 4
    assert not [p for p in pids if _is_demo_rank(p)], "the demo's ranks outlived it"



@pytest.mark.torch
def test_the_demo_runs_a_blocking_operation_scenario_and_says_what_its_culprit_waits_for(torch_support):
    """`--scenario flock` (one of the wait model's kinds): the headline says the lock file and the process that
    holds it, and the holder (a helper the demo started) goes with the job."""
    res = subprocess.run([sys.executable, "-m", "app", "demo", "--scenario", "flock", "--print"], capture_output=True,
                         text=True, cwd=REPO, timeout=300, stdin=subprocess.DEVNULL,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 0, res.stderr[-3000:]
    head = " ".join(res.stdout.split("Who waits for whom", 1)[0].split())
    assert head.startswith("hangscope: Rank 3 (pid "), head
    assert "is blocked in `fcntl.flock` at `build_dataset_cache`" in head and "dataset.lock" in head, head
    assert "held by pid" in head and "sleep 86400" in head, head
    assert "job stopped" in res.stderr

def _is_demo_rank(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"demo/job.py" in f.read()
    except OSError:
        return False


@pytest.mark.torch
def test_a_failing_demo_job_shows_the_ranks_own_error_and_keeps_its_log(torch_support):
    from app.demo.runner import JobFailed, start_local_job

    # a real failure inside the ranks: job.py refuses a culprit that is not a rank of the job (its own stderr)
    job = start_local_job("skip", 2, extra_args=["--culprit", "99"])
    try:
        with pytest.raises(JobFailed) as failed:
            job.wait_hung(timeout=240)
    finally:
        job.stop()
    message = str(failed.value)
    assert message.startswith("the job exited with code ")
    # the rank's own words come first, not only torchrun's "exitcode: 1" summary
    assert "wrote to stderr:\n" in message and "--culprit 99 is not a rank of this 2-rank job" in message
    assert message.index("--culprit 99") < message.index("the job's output ends with")
    # the log outlives stop(): the user can still read all of it
    assert f"the whole log is kept in {job.log_file}" in message
    assert os.path.isfile(job.log_file) and "--culprit 99" in Path(job.log_file).read_text()
    import shutil
    shutil.rmtree(job.workdir)
