"""Benchmark of a whole session over SSH: cold snapshot (connect, start workers, discover, dump) and warm
refresh (same connections and workers) on the network-namespace test cluster; prints a table.

Each node runs plain-Python stand-in ranks (torchrun's environment, blocked in recv()), ~13 MB each, so large
node counts fit in memory; all nodes share this machine's cores, so large runs are CPU-bound here. Needs root.

    sudo python3 bench/session.py [--sizes 4x2,32x4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import textwrap
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "support")]

import cluster as cluster_mod  # noqa: E402
from waiting import wait_until  # noqa: E402
from app.hosts import HostSpec  # noqa: E402
from app.session import Session, SessionOptions  # noqa: E402

STAND_IN_RANK = textwrap.dedent("""
    import socket, sys
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    peer = socket.create_connection(srv.getsockname()); conn, _ = srv.accept()
    open(sys.argv[1], "w").write("ready")
    conn.recv(1)
""")


async def _measure(c: cluster_mod.Cluster, ranks: int, repeat: int) -> Dict[str, List[float]]:
    out: Dict[str, List[float]] = {"cold": [], "warm": [], "cpu": []}
    for _ in range(repeat):
        cpu0 = time.process_time()
        session = Session([HostSpec(name=n, host=n, slots=ranks) for n in c.names], SessionOptions())
        try:
            t0 = time.monotonic()
            snap = await session.snapshot()
            out["cold"].append(time.monotonic() - t0)
            if not snap.complete:
                raise RuntimeError(f"incomplete: {[n.error for n in snap.nodes if n.error]}")
            t0 = time.monotonic()
            await session.refresh()
            out["warm"].append(time.monotonic() - t0)
        finally:
            await session.close()
        out["cpu"].append((time.process_time() - cpu0) / len(c.names) * 1000 / 2)  # ms per node per pass
    return out


def run(nodes: int, ranks: int, repeat: int) -> str:
    with cluster_mod.build_cluster(nodes) as c:
        os.environ["HOME"] = str(c.home)
        os.environ.pop("SSH_AUTH_SOCK", None)
        script = c.workdir / "rank.py"
        script.write_text(STAND_IN_RANK)
        ready = []
        for i, node in enumerate(c.nodes):
            for r in range(ranks):
                ready.append(c.workdir / f"ready-{node.name}-{r}")
                node.spawn(["/usr/bin/python3", str(script), str(ready[-1])],
                           env={"RANK": str(i * ranks + r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(nodes * ranks)})
        wait_until(lambda: all(p.exists() for p in ready), 120, "stand-in ranks to block")
        m = asyncio.run(_measure(c, ranks, repeat))
    med = {k: statistics.median(v) for k, v in m.items()}
    return (f"{nodes:>5} x {ranks:<3} {nodes * ranks:>6}  {med['cold']:>8.2f}  {min(m['cold']):>8.2f}  "
            f"{med['warm']:>8.2f}  {min(m['warm']):>8.2f}  {med['cpu']:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4x2,32x4", help="NODESxRANKS,... (default 4x2,32x4)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    problem = cluster_mod.support_problem()
    if problem:
        sys.exit(problem)
    print("nodes x rpn  ranks  cold med  cold min  warm med  warm min  login cpu ms/node/pass")
    for size in args.sizes.split(","):
        n, r = (int(x) for x in size.split("x"))
        print(run(n, r, args.repeat), flush=True)


if __name__ == "__main__":
    main()
