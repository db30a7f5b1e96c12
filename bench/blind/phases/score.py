#!/usr/bin/env python3
"""Re-score kept CLI runs (run.py --keep DIR: DIR/<name>.txt and DIR/<name>.snapshot.json.gz) with today's scoring
rules, without running anything: `python3 bench/blind/phases/score.py [--data DIR] [NAME ...]`.
The headlines are the ones the CLI printed then; only the scoring is today's."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scoring import details, headlines, judge, load_truth, table  # noqa: E402


def printed_headline(stdout: str) -> str:  # as run.py reads it
    lines = []
    for line in stdout.splitlines():
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line.strip())
    text = " ".join(lines)
    return text[len("hangscope: "):] if text.startswith("hangscope: ") else text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--data", type=Path, default=HERE / "data" / "first-run")
    args = ap.parse_args()
    truth = load_truth()
    scores = []
    for name in args.names or list(truth):
        txt = args.data / f"{name}.txt"
        if not txt.exists():
            continue
        body = txt.read_text(encoding="utf-8").split("\n", 1)[1].split("\n--- stderr ---", 1)[0]
        snap = args.data / f"{name}.snapshot.json.gz"
        analysis: dict = {}
        if snap.exists():
            with gzip.open(snap) as f:
                analysis = json.load(f).get("analysis") or {}
        scores.append(judge(name, truth[name], printed_headline(body), analysis))
    print(table(scores, truth) + "\n\n" + details(scores) + "\n\n" + headlines(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
