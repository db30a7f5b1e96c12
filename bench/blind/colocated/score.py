#!/usr/bin/env python3
"""The blind co-located set, offline: re-run hangscope on the recorded snapshots and score each headline against
truth.json (the same table as run.py). No root, no cluster; seconds.

    PYTHONPATH=/work/wt-blind /work/venv/bin/python bench/blind/colocated/score.py [--data DIR] [NAME ...]
    PYTHONPATH=/work/wt-blind /work/venv/bin/python bench/blind/colocated/score.py --analyze   # recorded pairs, app.analysis
    /work/venv/bin/python bench/blind/colocated/score.py --selfcheck        # the truth's words, no hangscope

Default: for each scenario, DIR/live/<name>.snapshot.json.gz (the snapshot the live CLI wrote) is unzipped to a
temporary file and `python -m app --load FILE --print` is run on it (from a neutral folder, so that PYTHONPATH's app
is the one run); the headline is the first paragraph it prints, scored. --analyze instead loads DIR/<name>.json.gz
(the later sample) and DIR/<name>.earlier.json.gz and scores `app.analysis.analyze(snapshot, history=[earlier])`.
The pids that truth.json's words refer to ({role.pid}) come from DIR/notes.json, written by the live run.

--selfcheck: from DIR/check.txt (run.py --check's dumps, taken before any hangscope run) and DIR/notes.json: a
headline that only names the blocked rank and where its main thread is (its frames) must not count as naming the
resource, nor the culprit where the culprit is another process; one that only says a rank is stuck and the others wait
for it must name neither operation nor resource.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scoring import Score, fill, headlines, judge, load_truth, says, table  # noqa: E402

DATA = HERE / "data"


def recorded(data: Path, stem: str) -> Optional[Path]:
    for path in (data / f"{stem}.json", data / f"{stem}.json.gz"):
        if path.exists():
            return path
    return None


def read_recording(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8")


def printed_headline(stdout: str) -> str:
    lines: List[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line.strip())
    text = " ".join(lines)
    return text[len("hangscope: "):] if text.startswith("hangscope: ") else text


def load_print(path: Path) -> Tuple[str, str]:
    with tempfile.TemporaryDirectory(prefix="hangscope-score-") as tmp:
        plain = Path(tmp) / "snapshot.json"
        plain.write_text(read_recording(path), encoding="utf-8")
        res = subprocess.run([sys.executable, "-m", "app", "--load", str(plain), "--print"], capture_output=True,
                             text=True, timeout=300, cwd=tmp, stdin=subprocess.DEVNULL)
    if not res.stdout.strip():
        raise RuntimeError(f"hangscope --load printed nothing (exit {res.returncode}): {res.stderr[-1500:]}")
    return printed_headline(res.stdout), res.stdout


_FRAME = re.compile(r"^    (\S.*) \((.+):(\d+)\)$")


def location_from_check(check: Path, name: str, truth: dict) -> Optional[str]:
    """A headline that names only the first blocked rank, its node, its command line and its main thread's frames."""
    text = check.read_text(encoding="utf-8", errors="replace")
    start = text.find(f"== {name} ")
    if start < 0:
        return None
    block = text[start:].split("\n== ", 1)[0]
    rank = truth["blocked"][0]
    m = re.search(rf"^--- rank {rank} \((node\d+)\) of the job \(host pid \d+, node pid (\d+)\): '(.*)'$", block, re.M)
    if m is None:
        return None
    frames: List[str] = []
    in_main = False
    for line in block[m.end():].splitlines():
        if line.startswith("Thread "):
            if in_main:
                break
            in_main = '"MainThread"' in line
            continue
        f = _FRAME.match(line)
        if in_main and f:
            frames.append(f"{f.group(1)} ({f.group(2)}:{f.group(3)})")
        elif in_main and frames and not line.strip():
            break
    where = "; ".join(frames) if frames else "(no Python frames: not dumped)"
    return (f"rank {rank} (pid {m.group(2)} on {m.group(1)}, `{m.group(3)}`) is blocked (stuck) in {where}; "
            f"the other ranks wait for it")


def generic_headline(truth: dict) -> str:
    rank = truth["blocked"][0]
    return (f"Rank {rank} (pid 4242) is blocked (stuck, hung, not progressing) in its own code; the other ranks wait "
            f"for it. Next: see what it waits for and who should release it.")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="*", metavar="NAME")
    ap.add_argument("--data", type=Path, default=DATA, help=f"the recordings ({DATA})")
    ap.add_argument("--analyze", action="store_true", help="score app.analysis.analyze on the recorded pairs")
    ap.add_argument("--verbose", action="store_true", help="print each --load run's whole output")
    ap.add_argument("--selfcheck", action="store_true", help="check the truth's words (check.txt, notes.json)")
    args = ap.parse_args(argv)
    truth = load_truth()
    notes_path = args.data / "notes.json"
    facts = json.loads(notes_path.read_text()) if notes_path.exists() else {}
    if args.selfcheck:
        bad = 0
        for name in args.names or list(truth):
            t = truth[name]
            loc = location_from_check(args.data / "check.txt", name, t)
            if loc is None:
                print(f"BAD {name}: no dump of its blocked rank in check.txt")
                bad += 1
                continue
            f = facts.get(name)
            res = says(loc, fill(t["resource_words"], f))
            cul = says(loc, fill(t["culprit_words"], f))
            ok = res is None and (cul is None if t.get("culprit_role") else cul is not None)
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {name}: resource word {res!r}, culprit word {cul!r} in: {loc}")
            empty = generic_headline(t)
            words = says(empty, fill(t["operation_words"], f)) or says(empty, fill(t["resource_words"], f))
            bad += words is not None
            print(f"{'ok ' if words is None else 'BAD'} {name}: operation/resource word {words!r} in the generic one")
        return 1 if bad else 0
    if args.analyze:
        names = args.names or [n for n in truth if recorded(args.data, n) is not None]
    else:
        names = args.names or [n for n in truth if recorded(args.data / "live", f"{n}.snapshot") is not None]
    if not names:
        ap.error(f"no recording in {args.data}")
    scores: List[Score] = []
    for name in names:
        started = time.monotonic()
        try:
            if args.analyze:
                from app.analysis import analyze
                from app.model.codec import snapshot_from_json

                snap, _ = snapshot_from_json(read_recording(recorded(args.data, name)))  # type: ignore[arg-type]
                earlier_path = recorded(args.data, f"{name}.earlier")
                history = [snapshot_from_json(read_recording(earlier_path))[0]] if earlier_path else []
                verdict = analyze(snap, history=history).verdict
                headline = str(verdict).splitlines()[0] if verdict else ""
            else:
                path = recorded(args.data / "live", f"{name}.snapshot")
                if path is None:
                    raise RuntimeError("no live snapshot recorded")
                headline, out = load_print(path)
                if args.verbose:
                    print(f"== {name}\n{out}")
            scores.append(judge(name, headline, truth[name], time.monotonic() - started, facts=facts.get(name)))
        except Exception as exc:
            scores.append(judge(name, "", truth[name], time.monotonic() - started, f"{type(exc).__name__}: {exc}",
                                facts=facts.get(name)))
    kind = "app.analysis.analyze on the recorded pairs" if args.analyze else "hangscope --load FILE --print"
    print(table(scores) + f"\n\nheadlines ({kind}):\n" + headlines(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
