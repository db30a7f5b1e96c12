"""hangscope watch, live on the test cluster with the demo job (4 nodes x 2 ranks, gloo) training ~10 s and then
hanging in the dataloader scenario (rank 7 blocks reading its next batch, the others wait in all_reduce):

- the hang is captured within --stall + one interval of it (plus the snapshot's own time) and the capture's
  headline names the culprit; the job is still followed after, and when it ends the watch ends (exit 0);
- --on-hang gets the bundle's path, and a script named with shell metacharacters (in the frames, and so in the
  headline the hook gets in its environment) runs nothing.
One job serves both (test_cli_watch.py and the SLURM cluster's test cover --once).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

import jobs as jobs_mod
from cluster import Cluster
from jobs import REPO, Job
from test_watch_cluster import EVERY, STALL, watching  # noqa: F401 (watching: the fixture)

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]


@pytest.fixture(scope="module")
def cluster(cluster_factory: Callable[..., Cluster]) -> Iterator[Cluster]:
    built = cluster_factory(4)
    try:
        yield built
    finally:
        built.close()


def _hang_job(cluster: Cluster, script: Optional[Path] = None) -> Job:
    """The demo job training ~10 s (40 steps of 0.25 s) and then hanging in the dataloader scenario; returns as
    soon as it is launched (the watch must see it train first)."""
    delay = ["--step-delay", "0.25"]
    extra = ["--scenario", "dataloader", "--hang-step", "40", *delay] if script is not None else delay
    return jobs_mod._launch(cluster.nodes[:4], "dataloader", 2, None, 40, extra, standalone=False, script=script)


def _hung_at(job: Job) -> float:
    """When the job hung: every rank's ready line is written just before the call it hangs in."""
    job.wait_ready(240)
    job.wait_blocked(120)
    return job.ready_file.stat().st_mtime


def test_a_job_that_hangs_is_captured_in_time_on_hang_runs_and_its_end_ends_the_watch(
        watching, cluster: Cluster, tmp_path: Path) -> None:  # noqa: F811
    """One hanging job serves both halves (each job start is a dozen torch interpreters on this 2-core machine):

    - the hang is captured within --stall + one interval, the capture's headline names the culprit, the job is
      still followed after it, and when the job ends the watch ends (exit 0);
    - --on-hang gets the bundle's path and the headline; the job's script is named with shell metacharacters, so
      its frames, and so the headline the hook gets in its environment, carry them; the hook (a shell of the
      user's, quoting its variables) is executed without a shell of hangscope's, so nothing in them runs."""
    trap = tmp_path / "trap"
    trap.mkdir()
    script = trap / "hang $(touch PWNED1) `touch PWNED2`; touch PWNED3 | touch PWNED4.py"
    shutil.copy(REPO / "app" / "demo" / "job.py", script)
    os.chmod(trap, 0o755)
    seen = tmp_path / "seen"
    job = _hang_job(cluster, script)
    try:
        hook = (f"sh -c 'printf \"%s\\n%s\\n\" \"$HANGSCOPE_BUNDLE\" \"$HANGSCOPE_HEADLINE\" > {seen}' "
                f"--ignored-arg")
        run = watching("--every", str(EVERY), "--stall", str(STALL), "--wait-start", "240", "--on-hang", hook)
        hung = _hung_at(job)
        run.wait_for(r"captured \(hang\)", STALL + 180, "the capture")
        stalled = next(s for s in run.history() if any(j["status"] == "stalled" for j in s["jobs"].values()))
        detected = stalled["t"] - hung
        (bundle,) = run.captures()
        doc = json.loads((bundle / "watch.json").read_text())
        print(f"\nhang to detection {detected:.1f} s (limit {STALL + EVERY:g} s + the sample's own time); "
              f"the capture took {doc['took']:.1f} s")
        assert detected <= STALL + EVERY + 3.0, f"detected {detected:.1f} s after the hang"
        assert "Rank 7" in doc["headline"] and "_recv_exact" in doc["headline"], doc["headline"]
        run.wait_for(r"--on-hang sh exited 0", 30, "the hook's end")
        assert run.proc.poll() is None, "a hung job is still followed after its capture"
    finally:
        job.stop()
    run.wait_for(r"has ended", 60, "the job's end")
    assert run.wait_exit(30) == 0
    assert "captured (hang)" in run.text() and len(run.captures()) == 1
    got_bundle, headline = seen.read_text().split("\n", 1)
    assert got_bundle == str(bundle)
    assert "PWNED" in headline, f"the script's name is in the headline: {headline}"
    for where in (trap, tmp_path, REPO, Path("/")):
        assert not list(where.glob("PWNED*")), f"a command from remote text ran in {where}"
