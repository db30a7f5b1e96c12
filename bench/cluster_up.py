"""How long the network-namespace test cluster (tests/support/cluster.py) takes to come up and go down.

    sudo python3 bench/cluster_up.py [--nodes 2] [--repeat 5]

Prints the median and the worst of `repeat` builds (boot, sshd listening on every node) and closes (every node
gone, its netns and links removed), with the 1-minute load average, which these times follow. Measured here
rather than asserted in the suite: on a loaded machine the same build takes several times as long, and that says
nothing about whether the cluster is right (tests/live/test_cluster.py checks that).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests" / "support")]

import cluster as cluster_mod  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    problem = cluster_mod.support_problem()
    if problem:
        print(f"cluster_up: {problem}", file=sys.stderr)
        return 2
    ups, downs = [], []
    for _ in range(args.repeat):
        t0 = time.monotonic()
        built = cluster_mod.build_cluster(args.nodes)
        t1 = time.monotonic()
        built.close()
        ups.append(t1 - t0)
        downs.append(time.monotonic() - t1)
    print(f"| nodes | up median (s) | up worst (s) | down median (s) | load 1m |\n|---|---|---|---|---|\n"
          f"| {args.nodes} | {statistics.median(ups):.2f} | {max(ups):.2f} | {statistics.median(downs):.2f} "
          f"| {os.getloadavg()[0]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
