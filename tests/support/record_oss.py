"""Record golden snapshots of the real open-source training scripts (tests/oss/README.md) into tests/data/scenarios/.

Each scenario is one of the scripts, unmodified, as a DDP job of 4 nodes x 2 ranks (gloo on CPU) on a 4-node
test cluster (tests/support/oss_jobs.py), healthy or held from outside:

    nanogpt-healthy     nanoGPT's train.py, training
    nanogpt-stopped     nanoGPT, rank 5 stopped with SIGSTOP; the others wait in DDP's all_reduce in backward
    lightning-healthy   Lightning Fabric's language-model example, training
    lightning-frozen    Lightning, rank 5 frozen by a cgroup v2 freezer; the others wait in backward

Recorded as tests/support/record_scenarios.py records the demo job's scenarios (its record(): two samples with the
CLI's own options, <name>.json and <name>.earlier.json). Run as root:

    python3 tests/support/record_oss.py [--out tests/data/scenarios] [SCENARIO ...]   # default: all four

Check each diagnosis by hand before changing the expectations in tests/analysis/test_golden.py and bench/diagnose.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Iterator, Optional, Sequence

SUPPORT = Path(__file__).resolve().parent  # tests/support: the helpers (cluster, jobs) and job scripts
TESTS = SUPPORT.parent
REPO = TESTS.parent
for _p in (str(REPO), str(SUPPORT), str(TESTS / "live")):  # live: the held-rank helpers of its tests
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cluster import Cluster, build_cluster  # noqa: E402
from jobs import Job  # noqa: E402
from oss_jobs import start_oss_job  # noqa: E402
from record_scenarios import GOLDEN_DIR, Running, Scenario, record  # noqa: E402

HELD = 5
SCENARIOS = {  # name: (script, how it is held)
    "nanogpt-healthy": ("nanogpt", None),
    "nanogpt-stopped": ("nanogpt", "stop"),
    "lightning-healthy": ("lightning", None),
    "lightning-frozen": ("lightning", "freeze"),
}


@contextlib.contextmanager
def held(job: Job, how: Optional[str]) -> Iterator[None]:
    """Hold rank HELD as `how` says (None: leave the job training), until the block ends."""
    if how is None:
        yield
        return
    from test_oss_cluster import others_blocked  # the live tests' own wait: the others block for the held rank
    from test_cluster_held import frozen

    pid = job.ranks[HELD].host_pid
    others = [r for r in job.ranks if r != HELD]
    if how == "stop":
        os.kill(pid, signal.SIGSTOP)
        try:
            others_blocked(job, others)
            yield
        finally:
            os.kill(pid, signal.SIGCONT)
    else:
        with frozen(pid, 2):
            others_blocked(job, others)
            yield


def record_all(cluster: Cluster, names: Sequence[str], out: Path) -> None:
    by_script: dict[str, list[str]] = {}
    for name in names:
        by_script.setdefault(SCENARIOS[name][0], []).append(name)
    for script, wanted in by_script.items():
        job = start_oss_job(cluster, script, nodes=4, ranks_per_node=2)
        try:
            for name in wanted:
                running = Running(Scenario(name, 4, 2, culprit=HELD if SCENARIOS[name][1] else None), job, cluster)
                with held(job, SCENARIOS[name][1]):
                    for path in record(running, out):
                        json.loads(path.read_text(encoding="utf-8"))
                        print(f"  wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
        finally:
            job.stop()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"of {', '.join(SCENARIOS)} (default: all)")
    ap.add_argument("--out", type=Path, default=GOLDEN_DIR, help=f"output directory ({GOLDEN_DIR})")
    args = ap.parse_args(argv)
    unknown = [n for n in args.scenarios if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    with build_cluster(4) as cluster:
        record_all(cluster, args.scenarios or list(SCENARIOS), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
