#!/usr/bin/env python3
"""The blind pipeline-parallel set, offline: re-run hangscope on the recorded snapshots and score each headline
against truth.json (the same table as run.py). No root, no cluster; seconds.

    PYTHONPATH=/work/wt-blind /work/venv/bin/python bench/blind/pipeline/score.py --data bench/blind/pipeline/data [NAME ...]
    PYTHONPATH=/work/wt-blind /work/venv/bin/python bench/blind/pipeline/score.py --analyze   # the recorded pairs via app.analysis
    /work/venv/bin/python bench/blind/pipeline/score.py --selfcheck --from-check   # the truth's words, no hangscope

hangscope is imported from PYTHONPATH when it is set (the copy under test: /work/wt-blind for the first run), else
from this repository; `--load` runs from a neutral folder so the current directory does not shadow PYTHONPATH, and
the app it used is printed.

Default: for each scenario, DIR/live/<name>.snapshot.json.gz (the snapshot the live CLI wrote) is unzipped to a
temporary file and `python -m app --load FILE --print` is run on it; the headline is the first paragraph it prints
(as run.py takes it), scored. --analyze instead loads DIR/<name>.json.gz (the later sample) and
DIR/<name>.earlier.json.gz (the first) and scores `app.analysis.analyze(snapshot, history=[earlier]).verdict`.

--selfcheck: a headline that only names where the culprit is (rank, node, command line, main thread's frames with
their source lines) must not count as naming the resource, and one that only says a rank is stuck and the others
wait for it must name neither operation nor resource. With --from-check it reads the culprits' main-thread stacks
from the py-spy dumps of `run.py --check` (data/check.txt): no hangscope at all, so it ran before the first run.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)
_UNDER_TEST = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p, "app").is_dir()]
for _p in reversed(_UNDER_TEST):  # the copy under test ahead of this repository
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


def _source_line(filename: str, line: int) -> str:
    """The text of a frame's line: the set's own files here, the standard library's and torch's from the
    interpreter that runs this (the job's own)."""
    import linecache
    import sysconfig

    for folder in (HERE, Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])):
        path = folder / filename
        if path.exists():
            return linecache.getline(str(path), line).strip()
    return ""


def _location_text(rank: int, truth: dict, frames: Sequence[Tuple[str, str, int]], cmdline: str) -> str:
    """What a headline that only names a location says: the culprit, its node, its command line, its main thread's
    frames with their lines' text (with "blocked", which every headline says: a resource word must not match
    inside it, as "lock" did)."""
    where = "; ".join(f"{fn} ({fname}:{line}) `{_source_line(fname, line)}`" for fn, fname, line in frames)
    return (f"rank {rank} ({truth['node']}, `{cmdline}`) is blocked (stuck) in {where}; the other ranks wait for "
            f"it")


def generic_headline(truth: dict) -> str:
    """A headline that only says a rank is stuck and the others wait for it."""
    rank = truth["culprit"][0]
    # no collective or p2p call named: those are the operations or resources of several scenarios of this set
    return (f"Rank {rank} (pid 4242 on {truth['node']}) is blocked (stuck, hung, not progressing) in its own code; "
            f"the other 7 ranks wait for it in a collective call. Next: see what it waits for and who should release "
            f"it; give the call a timeout.")


def location_only(snap, truth: dict) -> str:
    rank = truth["culprit"][0]
    r = next((r for r in snap.ranks if r.rank == rank), None)
    if r is None:
        return f"rank {rank} ({truth['node']})"
    main = next((t for t in r.threads if t.is_main), r.threads[0] if r.threads else None)
    frames = [(f.function, f.filename, f.line) for f in (main.frames if main else ())]
    cmdline = " ".join(getattr(r, "cmdline", None) or ())
    return _location_text(rank, truth, frames, cmdline)


_FRAME = re.compile(r"^    (\S.*) \((.+):(\d+)\)$")


def location_from_check(check: Path, name: str, truth: dict) -> Optional[str]:
    """location_only from the py-spy dump of the culprit's main thread in run.py --check's output."""
    text = check.read_text(encoding="utf-8", errors="replace")
    start = text.find(f"== {name} ")
    if start < 0:
        return None
    block = text[start:].split("\n== ", 1)[0]
    rank = truth["culprit"][0]
    m = re.search(rf"^--- rank {rank} \(host pid \d+, \w+\): .*\nProcess \d+: (.*)$", block, re.M)
    if m is None:
        return None
    cmdline = m.group(1)
    frames: List[Tuple[str, str, int]] = []
    in_main = False
    for line in block[m.end():].splitlines():
        if line.startswith("Thread "):
            if in_main:
                break
            in_main = '"MainThread"' in line
            continue
        f = _FRAME.match(line)
        if in_main and f:
            frames.append((f.group(1), f.group(2), int(f.group(3))))
        elif in_main and frames and not line.strip():
            break
    return _location_text(rank, truth, frames, cmdline)


def printed_headline(stdout: str) -> str:
    """The verdict as --print prints it: its first paragraph joined into one line, without `hangscope: ` (as
    run.py takes it)."""
    lines: List[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line.strip())
    text = " ".join(lines)
    return text[len("hangscope: "):] if text.startswith("hangscope: ") else text


def _cli_env() -> dict:
    """The environment of `python -m app`: PYTHONPATH as given (the copy under test), else this repository."""
    env = dict(os.environ)
    if not _UNDER_TEST:
        env["PYTHONPATH"] = str(REPO)
    return env


def cli_app_file() -> str:
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hangscope-score-") as tmp:
        res = subprocess.run([sys.executable, "-c", "import app; print(app.__file__)"], capture_output=True,
                             text=True, timeout=60, cwd=tmp, env=_cli_env())
    return res.stdout.strip() or res.stderr.strip()[-300:]


def load_print(path: Path) -> Tuple[str, str]:
    """`python -m app --load FILE --print` on a (gzipped) snapshot: (headline, full output)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hangscope-score-") as tmp:
        plain = Path(tmp) / "snapshot.json"
        plain.write_text(read_recording(path), encoding="utf-8")
        res = subprocess.run([sys.executable, "-m", "app", "--load", str(plain), "--print"], capture_output=True,
                             text=True, timeout=300, cwd=tmp, stdin=subprocess.DEVNULL,
                             env=_cli_env())
    if not res.stdout.strip():
        raise RuntimeError(f"hangscope --load printed nothing (exit {res.returncode}): {res.stderr[-1500:]}")
    return printed_headline(res.stdout), res.stdout


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="*", metavar="NAME")
    ap.add_argument("--data", type=Path, default=DATA, help=f"the recorded snapshots ({DATA})")
    ap.add_argument("--analyze", action="store_true",
                    help="score app.analysis.analyze on the recorded pair instead of `--load --print`")
    ap.add_argument("--verbose", action="store_true", help="print each --load run's whole output")
    ap.add_argument("--selfcheck", action="store_true", help="check the truth's words against location-only headlines")
    ap.add_argument("--from-check", action="store_true", help="--selfcheck from DIR/check.txt (run.py --check's dumps)")
    args = ap.parse_args(argv)
    truth = load_truth()
    if args.selfcheck and args.from_check:
        names = args.names or list(truth)
        missing = [n for n in names if n not in truth]
    elif args.selfcheck or args.analyze:
        names = args.names or [n for n in truth if recorded(args.data, n) is not None]
        missing = [n for n in names if n not in truth or recorded(args.data, n) is None]
    else:
        names = args.names or [n for n in truth if recorded(args.data / "live", f"{n}.snapshot") is not None]
        missing = [n for n in names if n not in truth or recorded(args.data / "live", f"{n}.snapshot") is None]
    if missing:
        ap.error(f"no truth or no recording in {args.data} for: {', '.join(missing)}")
    if not names:
        ap.error(f"no recording in {args.data}")
    if args.selfcheck:
        bad = 0
        for name in names:
            if args.from_check:
                loc = location_from_check(args.data / "check.txt", name, truth[name])
                if loc is None:
                    print(f"BAD {name}: no dump of its culprit in {args.data / 'check.txt'}")
                    bad += 1
                    continue
            else:
                snap, _ = load_pair(args.data, name)
                loc = location_only(snap, truth[name])
            res = says(loc, truth[name]["resource_words"])
            ok = res is None and says(loc, truth[name]["culprit_words"]) is not None
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {name}: resource word {res!r} in: {loc}")
            empty = generic_headline(truth[name])
            words = says(empty, truth[name]["operation_words"]) or says(empty, truth[name]["resource_words"])
            bad += words is not None
            print(f"{'ok ' if words is None else 'BAD'} {name}: operation/resource word {words!r} in: {empty}")
        return 1 if bad else 0
    scores: List[Score] = []
    for name in names:
        started = time.monotonic()
        try:
            if args.analyze:
                from app.analysis import analyze

                snap, earlier = load_pair(args.data, name)
                verdict = analyze(snap, history=[earlier] if earlier is not None else []).verdict
                headline = str(verdict).splitlines()[0] if verdict else ""
            else:
                path = recorded(args.data / "live", f"{name}.snapshot")
                assert path is not None
                headline, out = load_print(path)
                if args.verbose:
                    print(f"== {name}\n{out}")
            scores.append(judge(name, headline, truth[name], time.monotonic() - started))
        except Exception as exc:  # a crash on one recording is a result, not the end of the run
            scores.append(judge(name, "", truth[name], time.monotonic() - started, f"{type(exc).__name__}: {exc}"))
    kind = "app.analysis.analyze on the recorded pairs" if args.analyze else "hangscope --load FILE --print"
    import app

    where = app.__file__ if args.analyze else cli_app_file()
    print(f"hangscope's app: {where}\n\n" + table(scores) + f"\n\nheadlines ({kind}):\n" + headlines(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
