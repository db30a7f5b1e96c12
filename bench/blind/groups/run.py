#!/usr/bin/env python3
"""The blind groups set, live: hung gloo jobs whose ranks call collectives that do not match (wrong group, wrong
type, swapped order, unmatched send/recv, an extra collective, a skipped subgroup collective, a broadcast src that
differs, a late new_group), each on the 4-node test cluster; the real CLI run against it as a user runs it; its
headline scored against truth.json (scoring.py).

Needs root (tests/support/cluster.py's network-namespace cluster) and torch. One cluster, one job at a time; each
job is stopped (every process it started killed) before the next starts.

    python3 bench/blind/groups/run.py [NAME ...] [--report FILE] [--keep DIR]
    python3 bench/blind/groups/run.py --list
    python3 bench/blind/groups/run.py [NAME ...] --check   # set-up only: each job brought to its state, no hangscope

For each scenario: `hangscope HOSTS --print --snapshot FILE` (the CLI's defaults); the headline is its first
printed paragraph; the snapshot's analysis gives the findings (for the wrong-[high] count).
--keep DIR (default bench/blind/groups/data) keeps DIR/<name>.txt (the CLI's output and the set-up's notes) and
DIR/<name>.snapshot.json.gz.
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

from scenarios import BY_NAME, NODES, RANKS_PER_NODE, REPO, SPECS, Ctx, live, node_of, still_in_state  # noqa: E402
from scoring import Score, details, headlines, judge, load_truth, table  # noqa: E402

from cluster import build_cluster, run_login  # noqa: E402

CLI_TIMEOUT = 240.0


def hangscope() -> List[str]:
    """This checkout's CLI (run with cwd=REPO, `-m app` imports REPO's app/ first): not the venv's `hangscope`
    script, which is the editable install of whichever checkout installed it. The first run of this set used that
    script from a second worktree, and so ran the main checkout's code, not the worktree's (AFTER.md)."""
    return [sys.executable, "-m", "app"]


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


def diagnose(ctx: Ctx, work: Path, keep: Path) -> tuple:
    name = ctx.spec.name
    hosts = work / f"{name}-hosts.txt"
    hosts.write_text("".join(f"{n} slots={RANKS_PER_NODE}\n" for n in ctx.cluster.names[:NODES]))
    snap = work / f"{name}.snapshot.json"
    started = time.monotonic()
    res = run_login([*hangscope(), str(hosts), "--print", "--snapshot", str(snap)], ctx.cluster,
                    timeout=CLI_TIMEOUT, cwd=str(REPO))
    seconds = time.monotonic() - started
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
    ap.add_argument("--keep", type=Path, metavar="DIR", default=HERE / "data",
                    help="where the CLI's output and snapshots go (default: bench/blind/groups/data)")
    args = ap.parse_args(argv)
    truth = load_truth()
    if args.list:
        for spec in SPECS:
            t = truth[spec.name]
            print(f"{spec.name:24} culprit rank {spec.culprit} ({node_of(spec.culprit)}) "
                  f"{'FR ' if spec.fr else '   '} {t['mechanism']}")
        return 0
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown scenario {', '.join(unknown)} (see --list)")
    specs = [BY_NAME[n] for n in args.names] if args.names else SPECS
    for spec in specs:
        t = truth.get(spec.name)
        if t is None or t["culprit"] != [spec.culprit] or t["flight_recorder"] != spec.fr:
            raise SystemExit(f"truth.json disagrees with the set-up of {spec.name}")
    scores: List[Score] = []
    work = Path(tempfile.mkdtemp(prefix="hangscope-groups-run-"))
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
                        if args.check:
                            time.sleep(3)  # as long as a short hangscope run, roughly: is the state lasting?
                            note = still_in_state(ctx)
                            print(f"   check: {note or 'still in its state'}", flush=True)
                            continue
                        headline, analysis, seconds = diagnose(ctx, work, args.keep)
                        note = still_in_state(ctx)
                    score = judge(spec.name, truth[spec.name], headline, analysis, seconds, state_note=note)
                except Exception as exc:  # one scenario's failure is reported, the others still run
                    traceback.print_exc()
                    score = judge(spec.name, truth[spec.name], "", None, error=f"{type(exc).__name__}: {exc}"[:300])
                scores.append(score)
                print(f"   culprit right: {score.culprit_right}, mechanism right: {score.mechanism_right}, "
                      f"wrong high: {score.wrong_high}; {score.headline or score.error}", flush=True)
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
            f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
            f"{len(scores)} scenario(s)\n\n{out}\n\n## First findings\n\n{details(scores)}\n\n## Headlines\n\n{headlines(scores)}\n", encoding="utf-8")
    return 0 if all(not s.error for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
