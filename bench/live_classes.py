#!/usr/bin/env python3
"""Every hang class of the library, live: each class's job on the test cluster at 4 nodes x 2 ranks (8 ranks),
`hangscope HOSTS --print` run against it as a user runs it, its headline judged against the class's truth
(bench/diagnose.py's TRUTH: the culprit and the words of the cause), and the command's run time.

Needs root (the network-namespace cluster of tests/support/cluster.py) and torch. One job at a time on one 4-node
cluster; each job is stopped before the next starts. Not in the suite (it takes minutes).

    sudo python3 bench/live_classes.py [CLASS ...] [--nodes 4] [--ranks-per-node 2] [--json OUT]

Prints one row per class: class, right?, seconds, headline (and why not, when wrong); exits 1 when a headline
is wrong or a [high] finding is contradicted by the truth.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parent.parent
for p in (str(REPO), str(REPO / "tests" / "support"), str(REPO / "bench")):
    if p not in sys.path:
        sys.path.insert(0, p)

from cluster import build_cluster  # noqa: E402
from diagnose import TRUTH, judge_parts, said  # noqa: E402
from record_scenarios import SCENARIOS, diagnose, sized, started  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("classes", nargs="*", metavar="CLASS", help=f"some of {', '.join(SCENARIOS)} (default: all)")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--start-timeout", type=float, default=300,
                    help="seconds a class's job may take to start and hang (a loaded machine needs more)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--keep", type=Path, help="keep each class's hosts file and snapshot in this folder")
    args = ap.parse_args(argv)
    names = args.classes or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS or n not in TRUTH]
    if unknown:
        ap.error(f"unknown class {', '.join(unknown)}")
    rows = []
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hangscope-live-") as tmp, build_cluster(args.nodes) as cluster:
        work = args.keep or Path(tmp)
        for name in names:
            scenario = sized(SCENARIOS[name], args.nodes, args.ranks_per_node)
            started_at = time.monotonic()
            try:
                with started(cluster, scenario, args.start_timeout) as running:
                    setup = time.monotonic() - started_at
                    d = diagnose(running, work, "--print", "--force")
            except Exception as exc:  # a job that did not start is a row, not the end of the bench
                rows.append({"class": name, "right": False, "seconds": None, "headline": "",
                             "why": f"the job did not start: {str(exc).splitlines()[0][:200]}", "contradicted": []})
                print(f"{name}: {rows[-1]['why']}", flush=True)
                continue
            row = judge_parts(name, TRUTH[name], d.snapshot, d.analysis["verdict"], said(d.analysis["findings"]))
            rows.append({"class": name, "right": row.right, "seconds": round(d.seconds, 2), "headline": row.headline,
                         "why": row.why, "contradicted": list(row.contradicted), "ranks": len(d.snapshot.ranks),
                         "exit": d.returncode, "setup": round(setup, 1)})
            print(f"{name}: {'right' if row.right else 'WRONG'} in {d.seconds:.1f} s ({len(d.snapshot.ranks)} ranks, "
                  f"exit {d.returncode}): {row.headline[:160]}", flush=True)
    print(f"\n{'class':<10} {'right':<5} {'seconds':>7} {'ranks':>5}  headline")
    for r in rows:
        secs = f"{r['seconds']:.1f}" if r["seconds"] is not None else "-"
        lines = textwrap.wrap(r["headline"], 90) or [""]
        print(f"{r['class']:<10} {'yes' if r['right'] else 'NO':<5} {secs:>7} {r.get('ranks', 0):>5}  {lines[0]}")
        for line in lines[1:]:
            print(f"{'':<32}{line}")
        if not r["right"]:
            print(f"{'':<32}wrong: {r['why']}")
        for title in r["contradicted"]:
            print(f"{'':<32}contradicted [high]: {title}")
    right = sum(r["right"] for r in rows)
    timed = [r["seconds"] for r in rows if r["seconds"] is not None]
    print(f"\n{right} of {len(rows)} classes named right; `hangscope --print` took {min(timed, default=0):.1f}-"
          f"{max(timed, default=0):.1f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if right == len(rows) and not any(r["contradicted"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
