#!/usr/bin/env python3
"""The blind process set, offline: re-analyse the recorded snapshots with today's code and score each verdict
against truth.json (the same table as run.py). No root, no cluster; seconds.

    python3 bench/blind/procs/score.py [--data bench/blind/procs/data] [NAME ...]
    python3 bench/blind/procs/score.py --selfcheck     # the truth's words against location-only headlines

For each scenario it loads DIR/<name>.json (the later sample) and DIR/<name>.earlier.json (the first one; either
may be gzipped, <name>.json.gz, as data/ keeps them), calls
the project's public entry point, `app.analysis.analyze(snapshot, history=[earlier]).verdict`, and scores that.
The live runner (run.py, the CLI's first printed line) is the reference; this is for speed.

--selfcheck: for every recorded scenario, a headline that only names where the culprit is (its rank, node and
main thread's frames, function and file:line) must not be counted as naming the mechanism. It checks the truth's
word lists, not hangscope.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from scoring import Score, headlines, judge, load_truth, says, table  # noqa: E402

DATA = HERE / "data"


def recorded(data: Path, stem: str) -> Optional[Path]:
    """DIR/<stem>.json, or its gzipped copy DIR/<stem>.json.gz (how data/ keeps them), or None."""
    for path in (data / f"{stem}.json", data / f"{stem}.json.gz"):
        if path.exists():
            return path
    return None


def read_recording(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8")


def load_pair(data: Path, name: str):
    from app.model.codec import snapshot_from_json

    path = recorded(data, name)
    assert path is not None
    snap, _ = snapshot_from_json(read_recording(path))
    earlier_path = recorded(data, f"{name}.earlier")
    earlier = None
    if earlier_path is not None:
        earlier, _ = snapshot_from_json(read_recording(earlier_path))
    return snap, earlier


def location_only(snap, truth: dict) -> str:
    """What a headline that only names a location says: the culprit, its node, its main thread's frames (with
    "blocked", which every headline says: a resource word must not match inside it, as "lock" did)."""
    rank = truth["culprit"][0]
    r = next((r for r in snap.ranks if r.rank == rank), None)
    if r is None:
        return f"rank {rank} ({truth['node']})"
    main = next((t for t in r.threads if t.is_main), r.threads[0] if r.threads else None)
    frames = "; ".join(f"{f.function} ({f.filename}:{f.line})" for f in (main.frames if main else ()))
    return f"rank {rank} ({truth['node']}) is blocked (stuck) in {frames}; the other ranks wait for it"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="*", metavar="NAME")
    ap.add_argument("--data", type=Path, default=DATA, help=f"the recorded snapshots ({DATA})")
    ap.add_argument("--selfcheck", action="store_true", help="check the truth's words against location-only headlines")
    args = ap.parse_args(argv)
    truth = load_truth()
    names = args.names or [n for n in truth if recorded(args.data, n) is not None]
    missing = [n for n in names if n not in truth or recorded(args.data, n) is None]
    if missing:
        ap.error(f"no truth or no recording in {args.data} for: {', '.join(missing)}")
    if args.selfcheck:
        bad = 0
        for name in names:
            snap, _ = load_pair(args.data, name)
            loc = location_only(snap, truth[name])
            res = says(loc, truth[name]["resource_words"])
            ok = res is None and says(loc, truth[name]["culprit_words"]) is not None
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {name}: resource word {res!r} in: {loc}")
        return 1 if bad else 0
    from app.analysis import analyze

    scores: List[Score] = []
    for name in names:
        snap, earlier = load_pair(args.data, name)
        started = time.monotonic()
        try:
            verdict = analyze(snap, history=[earlier] if earlier is not None else []).verdict
            scores.append(judge(name, str(verdict).splitlines()[0] if verdict else "", truth[name],
                                time.monotonic() - started))
        except Exception as exc:  # a crash on one recording is a result, not the end of the run
            scores.append(judge(name, "", truth[name], time.monotonic() - started, f"{type(exc).__name__}: {exc}"))
    print(table(scores) + "\n\nheadlines (offline verdicts):\n" + headlines(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
