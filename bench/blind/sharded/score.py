#!/usr/bin/env python3
"""The blind sharded set, offline: re-run hangscope's `--load FILE --print` on each recorded snapshot (the live CLI's
own, data/live/<name>.snapshot.json.gz, decompressed and piped to `--load -`) and score its headline against
truth.json (the same table as run.py). No root, no cluster.

    python3 bench/blind/sharded/score.py [--data bench/blind/sharded/data] [NAME ...]
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))

from scoring import Score, headlines, judge, load_truth, table  # noqa: E402

DATA = HERE / "data"


def printed_headline(stdout: str) -> str:
    """The first paragraph of --print, joined into one line, without a leading `hangscope: `."""
    lines: List[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line.strip())
    text = " ".join(lines)
    return text[len("hangscope: "):] if text.startswith("hangscope: ") else text


def snapshot_of(data: Path, name: str) -> Optional[Path]:
    for path in (data / "live" / f"{name}.snapshot.json.gz", data / "live" / f"{name}.snapshot.json"):
        if path.exists():
            return path
    return None


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="*", metavar="NAME")
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args(argv)
    truth = load_truth()
    names = args.names or [n for n in truth if snapshot_of(args.data, n) is not None]
    missing = [n for n in names if n not in truth or snapshot_of(args.data, n) is None]
    if missing:
        ap.error(f"no truth or no recording in {args.data} for: {', '.join(missing)}")
    scores: List[Score] = []
    for name in names:
        path = snapshot_of(args.data, name)
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        started = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "app", "--load", "-", "--print"], input=raw,
                             capture_output=True, cwd=str(REPO), timeout=300)
        out = res.stdout.decode("utf-8", "replace")
        headline = printed_headline(out)
        err = "" if headline else f"exit {res.returncode}: {res.stderr.decode('utf-8', 'replace')[-300:]}"
        scores.append(judge(name, headline, truth[name], time.monotonic() - started, err))
    print(table(scores) + "\n\nheadlines (offline, --load --print):\n" + headlines(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
