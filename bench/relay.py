"""Benchmark: one picture of every rank on N fake nodes, direct (one SSH connection per node) against relays.

A REAL run, not a simulation: the network-namespace SSH test cluster (tests/support/cluster.py) with the largest
node count given, one stand-in rank per node (bench/stand_in_rank.py), node-to-node ssh allowed
(Cluster.allow_node_ssh) so that relays can reach their children. For each size (the first N nodes of that
cluster) and each mode, in turn, an in-process Session takes a cold snapshot (connect, worker start, discovery,
dumps) and a warm refresh on the same connections, then closes; every rank of the N nodes must be seen.

  off     every node direct over SSH (--relay off)
  relay   relays of width auto_width(N) (~sqrt(N)), whatever N (the threshold does not apply)
  W       relays of width W

Recorded per run: wall seconds (login side), the login process's own CPU seconds (time.process_time: the
hangscope side alone; every node process runs outside it), the CPU of every process of the run (bench + nodes,
a cpuacct cgroup, as bench/snapshot.py), ranks seen, and the 1-minute load average before the run. All fake
nodes share this machine's cores: node-side work (sshd, the relays' own ssh clients, the workers) competes with
the login side here, which it does not on a real cluster. Needs root.

    python3 bench/relay.py [--sizes 16,32,64,128,200] [--modes off,relay] [--repeat 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "support"), os.path.join(ROOT, "bench")]

import cluster as cluster_mod  # noqa: E402
from snapshot import CpuMeter, start_ranks  # noqa: E402
from app.hosts import HostSpec  # noqa: E402
from app.model import CollectOptions  # noqa: E402
from app.session import Session, SessionOptions  # noqa: E402
from app.transport.relay import RelayOptions  # noqa: E402
from app.transport.relay.transport import auto_width  # noqa: E402


def relay_options(mode: str, n: int) -> RelayOptions | None:
    if mode == "off":
        return None
    width = auto_width(n) if mode == "relay" else int(mode)
    return RelayOptions(width=width, threshold=2)


async def one_run(c: cluster_mod.Cluster, n: int, mode: str, meter: CpuMeter) -> Dict[str, Any]:
    names = c.names[:n]
    opts = SessionOptions(collect=CollectOptions(locals=True), ssh_config=(str(c.ssh_config),),
                          connect_timeout=60.0, relay=relay_options(mode, n))
    session = Session([HostSpec(name=name, host=name, slots=1) for name in names], opts)
    row: Dict[str, Any] = {"nodes": n, "mode": mode, "load": os.getloadavg()[0]}
    try:
        m0, t0, p0 = meter.seconds(), time.monotonic(), time.process_time()
        snap = await session.snapshot()
        row.update(cold=time.monotonic() - t0, cold_login_cpu=time.process_time() - p0,
                   cold_all_cpu=meter.seconds() - m0,
                   cold_seen=sum(1 for r in snap.ranks if r.threads),
                   cold_failed=sorted(f"{s.name}: {s.error.code}" for s in snap.nodes if s.error is not None)[:5])
        m0, t0, p0 = meter.seconds(), time.monotonic(), time.process_time()
        snap = await session.refresh()
        row.update(warm=time.monotonic() - t0, warm_login_cpu=time.process_time() - p0,
                   warm_all_cpu=meter.seconds() - m0, warm_seen=sum(1 for r in snap.ranks if r.threads))
        relay = getattr(session._connector, "_relay", None)
        row["relays"] = len(relay.relays) if relay is not None else 0
    finally:
        t0 = time.monotonic()
        await session.close()
        row["close"] = time.monotonic() - t0
    return row


def table(rows: List[Dict[str, Any]]) -> str:
    head = ("| nodes | mode | relays | cold s | cold login CPU s | cold all CPU s | ranks seen cold | warm s "
            "| warm login CPU s | ranks seen warm | close s | load 1m |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['nodes']} | {r['mode']} | {r.get('relays', '-')} | {r.get('cold', float('nan')):.2f} "
                     f"| {r.get('cold_login_cpu', float('nan')):.2f} | {r.get('cold_all_cpu', float('nan')):.2f} "
                     f"| {r.get('cold_seen', '-')}/{r['nodes']} | {r.get('warm', float('nan')):.2f} "
                     f"| {r.get('warm_login_cpu', float('nan')):.2f} | {r.get('warm_seen', '-')}/{r['nodes']} "
                     f"| {r.get('close', float('nan')):.2f} | {r['load']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,32,64,128,200", help="node counts; the cluster has the largest")
    parser.add_argument("--modes", default="off,relay", help="off, relay (width ~sqrt(N)) or a width, comma-separated")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", metavar="FILE", help="also write every row as JSON")
    args = parser.parse_args()
    problem = cluster_mod.support_problem()
    if problem:
        sys.exit(problem)
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cpus; a REAL run on "
          f"{max(sizes)} fake nodes x 1 stand-in rank", flush=True)
    meter = CpuMeter()
    rows: List[Dict[str, Any]] = []
    t_build = time.monotonic()
    try:
        with cluster_mod.build_cluster(max(sizes)) as c:
            c.allow_node_ssh()
            start_ranks(c, 1)
            for node in c.nodes:
                for proc in node.procs():
                    meter.add(proc.host_pid)
            print(f"# cluster of {len(c.nodes)} nodes up with their ranks in {time.monotonic() - t_build:.0f} s",
                  flush=True)
            for n in sizes:
                for _ in range(args.repeat):
                    for mode in modes:
                        rows.append(asyncio.run(one_run(c, n, mode, meter)))
                        print(table(rows[-1:]).splitlines()[2], flush=True)
                        if args.json:
                            Path(args.json).write_text(json.dumps(rows, indent=1))
    finally:
        meter.close()
    print(table(rows))


if __name__ == "__main__":
    main()
