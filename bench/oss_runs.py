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

    python3 bench/oss_runs.py [--runs 20] [--slow-runs 5] [--kinds nanogpt lightning] [--json OUT] [--keep DIR]
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
for _p in (str(REPO), str(REPO / "tests" / "support")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cluster import Cluster, build_cluster, run_login  # noqa: E402
from cpu_cap import CpuCap  # noqa: E402
from oss_jobs import KINDS, iterations, start_oss_job  # noqa: E402

from app.model.codec import snapshot_from_json  # noqa: E402

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
    return {"seconds": seconds, "verdict": analysis["verdict"], "findings": analysis["findings"],
            "progress": analysis["progress"], "ranks": len(snap.ranks), "exit": res.returncode, "file": out}


def _common(r: Dict[str, Any]) -> List[str]:
    """What is wrong for a job that trains: the ranks not all found, not called progressing, a culprit."""
    wrong = []
    if r["ranks"] != 8:
        wrong.append(f"{r['ranks']} of 8 ranks found")
    if not r["verdict"].startswith("The job is progressing"):
        wrong.append("not called progressing")
    blamed = [f["title"] for f in r["findings"] if f["culprit"] and f["kind"] != "slow_node"
              and f["confidence"] != "low"]
    wrong += [f"culprit finding: {t}" for t in blamed]
    return wrong


def healthy_wrong(r: Dict[str, Any]) -> List[str]:
    wrong = _common(r)
    stuck = [p for p in r["progress"] if p["status"] == "stuck"]
    if stuck:
        wrong.append(f"{len(stuck)} rank(s) stuck")
    wrong += [f"slow finding: {f['title']}" for f in r["findings"] if f["kind"] == "slow_node"]
    return wrong


def slow_wrong(r: Dict[str, Any]) -> List[str]:
    slow = [f["nodes"] for f in r["findings"] if f["kind"] == "slow_node"]
    return _common(r) + ([] if slow == [SLOW] else [f"slow nodes named: {slow}"])


def bench(cluster: Cluster, kind: str, runs: int, slow_runs: int, work: Path,
          keep: Optional[Path]) -> List[Dict[str, Any]]:
    rows = []
    job = start_oss_job(cluster, kind)
    try:
        for condition, count, judge in (("healthy", runs, healthy_wrong), ("node04 at 10% CPU", slow_runs,
                                                                             slow_wrong)):
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
                    r["wrong"] = judge(r)
                    r["right"] = not r["wrong"]
                    results.append(r)
                    print(f"  {kind} {condition} run {i + 1}: {'right' if r['right'] else 'WRONG'} "
                          f"{r['seconds']:.1f} s: {r['verdict'][:110]}", flush=True)
                    for why in r["wrong"]:
                        print(f"    wrong: {why}", flush=True)
                    saved = r.pop("file", None)
                    if saved is not None and keep is not None and r["wrong"]:
                        keep.mkdir(parents=True, exist_ok=True)
                        saved.rename(keep / f"{kind}-{condition.split()[0]}-{i + 1}.json")
                    elif saved is not None:
                        saved.unlink()
                last = iterations(job, kind)
            finally:
                if cap is not None:
                    cap.__exit__(None, None, None)
            rows.append({"script": kind, "condition": condition, "runs": count,
                         "right": sum(r["right"] for r in results),
                         "median_s": statistics.median(r["seconds"] for r in results),
                         "iterations": f"{first}->{last}" if first >= 0 else "n/a",
                         "wrong": [f"{r['verdict']} ({'; '.join(r['wrong'])})" for r in results if r["wrong"]]})
    finally:
        job.stop()
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=20, help="healthy runs per script (20)")
    ap.add_argument("--slow-runs", type=int, default=5, help="runs with node04 throttled, per script (5)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--keep", type=Path, help="keep the snapshot of every wrong run in this folder")
    args = ap.parse_args(argv)
    rows: List[Dict[str, Any]] = []
    with build_cluster(4) as cluster, tempfile.TemporaryDirectory(prefix="hangscope-oss-bench-") as tmp:
        for kind in args.kinds:
            rows += bench(cluster, kind, args.runs, args.slow_runs, Path(tmp), args.keep)
    print("\n| script | condition | runs | right | median CLI time (s) | rank 0's logged iterations (Lightning's: "
          "every 200th) |")
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
