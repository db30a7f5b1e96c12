#!/usr/bin/env python3
"""Real training scripts, healthy and slow, diagnosed again and again: how often `hangscope HOSTS --print` is right.

For each real open-source script the tests run unmodified (tests/oss/README.md: nanoGPT's train.py and Lightning
Fabric's language-model example), one DDP job of 4 nodes x 2 ranks (gloo, CPU) on a 4-node test cluster
(needs root, as the cluster tests do), then:
- `--runs` runs of the CLI against the healthy job: right when it says "progressing" with no [high] or [medium]
  culprit finding and no stuck rank;
- `--slow-runs` runs with node04's ranks capped to 10% of a CPU by a cgroup: right when it says "progressing"
  and names node04 slow (and no other node).
Prints one row per script and condition, with how many runs were right and the CLI's median time.

    python3 bench/oss_runs.py [--runs 20] [--slow-runs 5] [--kinds nanogpt lightning] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
for _p in (str(REPO), str(REPO / "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cluster import Cluster, build_cluster, run_login  # noqa: E402
from cpu_cap import CpuCap  # noqa: E402
from oss_jobs import KINDS, iterations, start_oss_job  # noqa: E402

from app.model import snapshot_from_json  # noqa: E402

SLOW = "node04"


def run_cli(cluster: Cluster, work: Path, index: int, *extra: str) -> Dict[str, Any]:
    hosts = work / "hosts.txt"
    hosts.write_text("".join(f"{n}\n" for n in cluster.names))
    out = work / f"snap-{index}.json"
    started = time.monotonic()
    res = run_login([sys.executable, "-m", "app", str(hosts), "--print", "--snapshot", str(out), *extra], cluster,
                    timeout=180, cwd=str(REPO))
    seconds = time.monotonic() - started
    if not out.exists():
        return {"seconds": seconds, "verdict": f"no snapshot (exit {res.returncode})", "findings": [],
                "progress": [], "ranks": 0, "exit": res.returncode}
    snap, analysis = snapshot_from_json(out.read_text(encoding="utf-8"))
    assert analysis is not None
    out.unlink()
    return {"seconds": seconds, "verdict": analysis["verdict"], "findings": analysis["findings"],
            "progress": analysis["progress"], "ranks": len(snap.ranks), "exit": res.returncode}


def healthy_right(r: Dict[str, Any]) -> bool:
    blamed = [f for f in r["findings"] if f["culprit"] and f["kind"] != "slow_node" and f["confidence"] != "low"]
    return (r["ranks"] == 8 and r["verdict"].startswith("The job is progressing") and not blamed
            and not any(p["status"] == "stuck" for p in r["progress"])
            and not any(f["kind"] == "slow_node" for f in r["findings"]))


def slow_right(r: Dict[str, Any]) -> bool:
    slow = [f["nodes"] for f in r["findings"] if f["kind"] == "slow_node"]
    blamed = [f for f in r["findings"] if f["culprit"] and f["kind"] != "slow_node" and f["confidence"] != "low"]
    return (r["ranks"] == 8 and r["verdict"].startswith("The job is progressing") and slow == [SLOW]
            and not blamed)


def bench(cluster: Cluster, kind: str, runs: int, slow_runs: int, work: Path) -> List[Dict[str, Any]]:
    rows = []
    job = start_oss_job(cluster, kind)
    try:
        for condition, count, right in (("healthy", runs, healthy_right), ("node04 at 10% CPU", slow_runs,
                                                                             slow_right)):
            if count <= 0:
                continue
            results = []
            cap = CpuCap(0.10) if condition != "healthy" else None
            if cap is not None:
                cap.__enter__()
                for loc in job.ranks.values():
                    if loc.node == SLOW:
                        cap.add(loc.host_pid)
                time.sleep(2)
            try:
                first = iterations(job, kind)
                for i in range(count):
                    r = run_cli(cluster, work, i, *(("--samples", "3") if cap is not None else ()))
                    r["right"] = right(r)
                    results.append(r)
                    print(f"  {kind} {condition} run {i + 1}: {'right' if r['right'] else 'WRONG'} "
                          f"{r['seconds']:.1f} s: {r['verdict'][:110]}", flush=True)
                last = iterations(job, kind)
            finally:
                if cap is not None:
                    cap.__exit__(None, None, None)
            rows.append({"script": kind, "condition": condition, "runs": count,
                         "right": sum(r["right"] for r in results),
                         "median_s": statistics.median(r["seconds"] for r in results),
                         "iterations": f"{first}->{last}" if first >= 0 else "n/a",
                         "wrong": [r["verdict"] for r in results if not r["right"]]})
    finally:
        job.stop()
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=20, help="healthy runs per script (20)")
    ap.add_argument("--slow-runs", type=int, default=5, help="runs with node04 throttled, per script (5)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    rows: List[Dict[str, Any]] = []
    with build_cluster(4) as cluster, tempfile.TemporaryDirectory(prefix="hangscope-oss-bench-") as tmp:
        for kind in args.kinds:
            rows += bench(cluster, kind, args.runs, args.slow_runs, Path(tmp))
    print("\n| script | condition | runs | right | median CLI time (s) | rank 0's logged iterations |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['script']} | {row['condition']} | {row['runs']} | {row['right']} | {row['median_s']:.1f} "
              f"| {row['iterations']} |")
    for row in rows:
        for verdict in row["wrong"]:
            print(f"wrong ({row['script']}, {row['condition']}): {verdict}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0 if all(row["right"] == row["runs"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
