#!/usr/bin/env python3
"""The blind phases set, live: ranks caught at different points of the training loop, in progressing jobs (a
straggler still in an earlier iteration, at a later or an earlier line) and in hung ones (a minority left a loop the
others are still in, or skipped a collective), each a real gloo job on the 4-node test cluster; the real CLI run
against it as a user runs it; the verdict scored against truth.json.

Needs root (tests/cluster.py's network-namespace cluster) and torch. One cluster, one job at a time; each job is
stopped (everything it started killed) before the next starts.

    python3 bench/blind/phases/run.py [NAME ...] [--report FILE] [--keep DIR]
    python3 bench/blind/phases/run.py --list
    python3 bench/blind/phases/run.py [NAME ...] --check   # set-up only: each job brought to its state, no hangscope

For each scenario: `hangscope HOSTS --print --snapshot FILE` (the CLI's defaults: 2 samples ~1 s apart); the
verdict is its first printed paragraph; the snapshot's analysis gives the findings and per-rank progress.
--keep DIR keeps DIR/<name>.txt (the CLI's output) and DIR/<name>.snapshot.json.gz.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scenarios import BY_NAME, NODES, RANKS_PER_NODE, REPO, SPECS, Ctx, live, still_in_state  # noqa: E402
from scoring import Score, details, headlines, judge, load_truth, table  # noqa: E402

from cluster import build_cluster, run_login  # noqa: E402
from testenv import SCRIPTS  # noqa: E402

CLI_TIMEOUT = 240.0


def hangscope() -> List[str]:
    found = shutil.which("hangscope", path=str(SCRIPTS))
    return [found] if found else [sys.executable, "-m", "app"]


def printed_headline(stdout: str) -> str:
    """The verdict as --print prints it: its first paragraph (wrapped; continuation lines indented), joined into one
    line, without the `hangscope: ` it starts with (as bench/blind/hangs/run.py reads it)."""
    lines: List[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line.strip())
    text = " ".join(lines)
    return text[len("hangscope: "):] if text.startswith("hangscope: ") else text


def analysis_of(path: Path) -> dict:
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data.get("analysis") or {} if isinstance(data, dict) else {}


def diagnose(ctx: Ctx, work: Path, keep: Optional[Path]) -> tuple:
    name = ctx.spec.name
    hosts = work / f"{name}-hosts.txt"
    hosts.write_text("".join(f"{n} slots={RANKS_PER_NODE}\n" for n in ctx.cluster.names[:NODES]))
    snap = work / f"{name}.snapshot.json"
    started = time.monotonic()
    res = run_login([*hangscope(), str(hosts), "--print", "--snapshot", str(snap)], ctx.cluster,
                    timeout=CLI_TIMEOUT, cwd=str(REPO))
    seconds = time.monotonic() - started
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{name}.txt").write_text(
            f"$ hangscope HOSTS --print --snapshot FILE   (exit {res.returncode}, {seconds:.1f} s)\n"
            f"{res.stdout}\n--- stderr ---\n{res.stderr}\n--- set-up notes ---\n" + "\n".join(ctx.notes) + "\n",
            encoding="utf-8")
        if snap.exists():
            with open(snap, "rb") as src, gzip.GzipFile(keep / f"{name}.snapshot.json.gz", "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
    if not res.stdout.strip():
        raise RuntimeError(f"hangscope printed nothing (exit {res.returncode}): {res.stderr[-2000:]}")
    return printed_headline(res.stdout), analysis_of(snap), seconds


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help="some of the scenarios (default: all; see --list)")
    ap.add_argument("--list", action="store_true", help="list the scenarios and their truth, run nothing")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the table and headlines (markdown)")
    ap.add_argument("--check", action="store_true",
                    help="set-up check only: bring each scenario to its state, wait 3 s, check it still is; no hangscope")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="keep the CLI's output and snapshot of each scenario")
    args = ap.parse_args(argv)
    truth = load_truth()
    if args.list:
        for spec in SPECS:
            t = truth[spec.name]
            what = (f"hung, culprit rank {spec.culprit} ({', '.join(t['culprit_nodes'])})" if spec.hung else
                    f"progressing, slow rank {spec.slow} ({', '.join(t['slow_nodes'])})")
            print(f"{spec.name:22} {what:44} {t['situation']}")
        return 0
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown scenario {', '.join(unknown)} (see --list)")
    specs = [BY_NAME[n] for n in args.names] if args.names else SPECS
    for spec in specs:
        t = truth.get(spec.name)
        if t is None or t["hung"] != spec.hung or (spec.hung and t["culprit"] != spec.culprit) or \
                (not spec.hung and t["slow_ranks"] != spec.slow):
            raise SystemExit(f"truth.json disagrees with the set-up of {spec.name}")
    scores: List[Score] = []
    work = Path(tempfile.mkdtemp(prefix="hangscope-phases-run-"))
    started_at = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    t_all = time.monotonic()
    try:
        with build_cluster(NODES) as cluster:
            for spec in specs:
                print(f"== {spec.name} ", flush=True)
                t0 = time.monotonic()
                try:
                    with live(cluster, spec) as ctx:
                        print(f"   in its state after {time.monotonic() - t0:.0f} s; " + "; ".join(ctx.notes),
                              flush=True)
                        steps_before = ctx.last_steps()
                        if args.check:
                            time.sleep(3)  # as long as a hangscope run, roughly: is the state lasting?
                            note = still_in_state(ctx, steps_before)
                            print(f"   check: {note or 'still in its state'}", flush=True)
                            continue
                        headline, analysis, seconds = diagnose(ctx, work, args.keep)
                        note = still_in_state(ctx, steps_before)
                    score = judge(spec.name, truth[spec.name], headline, analysis, seconds, state_note=note)
                except Exception as exc:  # one scenario's failure is reported, the others still run
                    traceback.print_exc()
                    score = judge(spec.name, truth[spec.name], "", None, error=f"{type(exc).__name__}: {exc}"[:300])
                scores.append(score)
                print(f"   verdict right: {score.verdict_right}, culprit right: {score.culprit_right}, "
                      f"slow node named: {score.slow_node_named}; "
                      f"{score.headline or score.error}", flush=True)
                if score.state_note:
                    print(f"   NOTE: {score.state_note}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    minutes = (time.monotonic() - t_all) / 60
    if args.check:
        print(f"set-up check done in {minutes:.1f} min")
        return 0
    load_after = os.getloadavg()
    out = table(scores, truth)
    print("\n" + out + "\n\n" + details(scores) + "\n\nheadlines:\n" + headlines(scores))
    if args.report:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
        args.report.write_text(
            f"started {started_at:%Y-%m-%d %H:%M} UTC, {minutes:.1f} min; commit {commit}; "
            f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
            f"(1/5/15 min before: {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
            f"after: {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f}); "
            f"{len(scores)} scenario(s)\n\n{out}\n\n## Findings and progress\n\n{details(scores)}\n\n"
            f"## Headlines\n\n{headlines(scores)}\n", encoding="utf-8")
    return 0 if all(not s.error for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
