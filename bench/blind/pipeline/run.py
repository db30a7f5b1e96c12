#!/usr/bin/env python3
"""The blind pipeline-parallel set, live: each scenario's job hung on the test cluster, the real CLI run against it as
a user runs it, its headline scored against truth.json.

hangscope is imported from PYTHONPATH (the frozen copy under test): run with PYTHONPATH=/work/wt-blind. The CLI and
the recorder both import `app` from there (checked: the run stops if `app` would come from elsewhere), and the CLI
runs from a neutral folder so that the current directory does not shadow PYTHONPATH.

Needs root (the network-namespace cluster of tests/support/cluster.py) and torch. One 4-node cluster, one job at a
time; each job is stopped (everything it started killed) before the next starts.

    sudo PYTHONPATH=/work/wt-blind /work/venv/bin/python bench/blind/pipeline/run.py --check > bench/blind/pipeline/data/check.txt
    sudo PYTHONPATH=/work/wt-blind /work/venv/bin/python bench/blind/pipeline/run.py --record bench/blind/pipeline/data --report FILE
    sudo PYTHONPATH=/work/wt-blind /work/venv/bin/python bench/blind/pipeline/run.py NAME ...      # some scenarios, no recording

--check: set-up only (py-spy dumps of the culprits, their descendants, the node services they wait on, and one
other rank; no hangscope). Otherwise for each scenario: `hangscope HOSTS --print --snapshot FILE` (one run, the
CLI's defaults); the headline is the verdict it prints first (its first paragraph, joined). With --record DIR:
DIR/live/<name>.txt (the CLI's output), DIR/live/<name>.snapshot.json.gz (the CLI's snapshot, gzipped; score.py
re-runs `hangscope --load` on it), and DIR/<name>.json.gz + DIR/<name>.earlier.json.gz as
tests/support/record_scenarios.py records them (two samples as the CLI takes them).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import resource
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


from scenarios import BY_NAME, NODES, REPO, RANKS_PER_NODE, SPECS, Ctx, live, node_of  # noqa: E402
from scoring import Score, headlines, judge, load_truth, table  # noqa: E402

# the code under test comes from PYTHONPATH, ahead of the repository that scenarios.py put first on sys.path
_UNDER_TEST = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p, "app").is_dir()]
if not _UNDER_TEST:
    raise SystemExit("set PYTHONPATH to the hangscope copy under test (e.g. PYTHONPATH=/work/wt-blind)")
if "app" in sys.modules:
    raise SystemExit(f"app was imported before PYTHONPATH could take effect: {sys.modules['app'].__file__}")
for _p in reversed(_UNDER_TEST):
    sys.path.insert(0, _p)
import app  # noqa: E402

APP_FILE = app.__file__
if not any(APP_FILE.startswith(str(Path(p).resolve()) + os.sep) or APP_FILE.startswith(p.rstrip("/") + "/")
           for p in _UNDER_TEST):
    raise SystemExit(f"app comes from {APP_FILE}, not from PYTHONPATH {_UNDER_TEST}")

from cluster import build_cluster, run_login  # noqa: E402
from record_scenarios import Running, Scenario, hosts_text, record  # noqa: E402
from testenv import PYSPY, SCRIPTS  # noqa: E402

CLI_TIMEOUT = 240.0


def running_of(ctx: Ctx) -> Running:
    """The scenario as tests/support/record_scenarios.py knows one (its hosts file, its recorder)."""
    assert ctx.job is not None
    return Running(Scenario(ctx.spec.name, NODES, RANKS_PER_NODE, culprit=ctx.spec.culprits[0]), ctx.job,
                   ctx.cluster)


def hangscope() -> List[str]:
    found = shutil.which("hangscope", path=str(SCRIPTS))
    return [found] if found else [sys.executable, "-m", "app"]


def cli_app_file(ctx: Ctx) -> str:
    """Where the CLI's `app` comes from: the same interpreter, environment and (neutral) folder as the CLI run."""
    folder = tempfile.mkdtemp(prefix="hangscope-blind-where-")
    try:
        res = run_login([sys.executable, "-c", "import app; print(app.__file__)"], ctx.cluster, timeout=60,
                        cwd=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return res.stdout.strip() or res.stderr.strip()[-300:]


def check(ctx: Ctx) -> None:
    """The culprits' stacks, straight from py-spy, each thread's kernel wait, and their descendants' (set-up check:
    no hangscope)."""
    for rank in ctx.spec.culprits:
        pid = ctx.host_pid(rank)
        for p in [pid, *_descendants(pid)]:
            cmd = _read(f"/proc/{p}/cmdline").replace(chr(0), " ").strip()[:400]
            head = f"rank {rank} (host pid {pid}, {node_of(rank)})" if p == pid else f"descendant of rank {rank}: {p}"
            out = subprocess.run([str(PYSPY), "dump", "--pid", str(p)], capture_output=True, text=True, timeout=60)
            print(f"--- {head}: {cmd!r} ---\n{out.stdout}{out.stderr}")
            for tid in sorted(Path(f"/proc/{p}/task").iterdir(), key=lambda d: int(d.name)):
                print(f"  thread {tid.name} {_read(f'{tid}/comm')!r}: state {_stat_state_of(tid)}, "
                      f"wchan {_read(f'{tid}/wchan')!r}, syscall {_read(f'{tid}/syscall')[:60]!r}")


def check_services(ctx: Ctx) -> None:
    """The node processes the set-up started that the culprit waits on (py-spy, kernel waits)."""
    for p in ctx.extra.get("dump", []):
        cmd = _read(f"/proc/{p}/cmdline").replace(chr(0), " ").strip()[:400]
        if _stat_state_of(Path(f"/proc/{p}")) in ("T", "t"):  # py-spy's ptrace would let a stopped process go on
            print(f"--- node service: {p}: {cmd!r} (stopped: not dumped) ---")
        else:
            out = subprocess.run([str(PYSPY), "dump", "--pid", str(p)], capture_output=True, text=True, timeout=60)
            print(f"--- node service: {p}: {cmd!r} ---\n{out.stdout}{out.stderr}")
        for tid in sorted(Path(f"/proc/{p}/task").iterdir(), key=lambda d: int(d.name)):
            print(f"  thread {tid.name} {_read(f'{tid}/comm')!r}: state {_stat_state_of(tid)}, "
                  f"wchan {_read(f'{tid}/wchan')!r}, syscall {_read(f'{tid}/syscall')[:60]!r}")


def check_other(ctx: Ctx) -> None:
    """One of the other ranks (4 ranks after the first culprit): where it waits (its main thread, py-spy), and the
    first culprit's pipeline neighbours."""
    world = NODES * RANKS_PER_NODE
    first = ctx.spec.culprits[0]
    others = [(first + 4) % world, first - RANKS_PER_NODE, first + RANKS_PER_NODE, first ^ 1]
    for rank in dict.fromkeys(r for r in others if 0 <= r < world and r not in ctx.spec.culprits):
        pid = ctx.host_pid(rank)
        out = subprocess.run([str(PYSPY), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        main = out.stdout.split('"MainThread"', 1)[-1].split("\n\n", 1)[0]
        print(f"--- another rank: rank {rank} (host pid {pid}, {node_of(rank)}), its main thread:{main}\n")


def _stat_state_of(task: Path) -> str:
    stat = _read(f"{task}/stat")
    return stat.rsplit(")", 1)[-1].split()[0] if stat else "?"


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""


def _descendants(pid: int) -> List[int]:
    out: List[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for tid in (Path(f"/proc/{p}/task").iterdir() if Path(f"/proc/{p}/task").exists() else ()):
            kids = [int(c) for c in _read(f"{tid}/children").split()]
            out += kids
            todo += kids
    return out


def printed_headline(stdout: str) -> str:
    """The verdict as --print prints it: its first paragraph (wrapped to the terminal's width, continuation lines
    indented), joined into one line, without the `hangscope: ` it starts with."""
    lines: List[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line.strip())
    text = " ".join(lines)
    return text[len("hangscope: "):] if text.startswith("hangscope: ") else text


def diagnose(ctx: Ctx, work: Path, record_dir: Optional[Path]) -> tuple:
    running = running_of(ctx)
    name = ctx.spec.name
    run_dir = Path(tempfile.mkdtemp(dir=work))  # neutral names: the scenario's name holds scoring words
    hosts = run_dir / "hosts.txt"
    hosts.write_text(hosts_text(running))
    snap = run_dir / "snapshot.json"
    started = time.monotonic()
    res = run_login([*hangscope(), str(hosts), "--print", "--snapshot", str(snap)], ctx.cluster,
                    timeout=CLI_TIMEOUT, cwd=str(run_dir))  # not the repository: its app/ would shadow PYTHONPATH
    seconds = time.monotonic() - started
    headline = printed_headline(res.stdout)
    if record_dir is not None:
        live_dir = record_dir / "live"
        live_dir.mkdir(parents=True, exist_ok=True)
        (live_dir / f"{name}.txt").write_text(
            f"$ hangscope HOSTS --print --snapshot FILE   (exit {res.returncode}, {seconds:.1f} s; "
            f"app: {cli_app_file(ctx)})\n"
            f"{res.stdout}\n--- stderr ---\n{res.stderr}", encoding="utf-8")
        if snap.exists():  # gzipped: the CLI's snapshots are the bulk of a recording (gunzip for --load)
            with open(snap, "rb") as src, gzip.GzipFile(live_dir / f"{name}.snapshot.json.gz", "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
        for path in record(running, record_dir):  # gzipped: data/ stays small
            with open(path, "rb") as src, gzip.GzipFile(f"{path}.gz", "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
            path.unlink()
    if not res.stdout.strip():
        raise RuntimeError(f"hangscope printed nothing (exit {res.returncode}): {res.stderr[-2000:]}")
    if snap.exists():  # the printed verdict is scored; say so when the snapshot's reads otherwise
        from app.model.codec import snapshot_from_json

        _, analysis = snapshot_from_json(snap.read_text(encoding="utf-8"))
        verdict = str((analysis or {}).get("verdict") or "").strip()
        if verdict and verdict.splitlines()[0].strip() != headline:
            print(f"   note: the snapshot's verdict differs from the printed one: {verdict!r}", flush=True)
    return headline, seconds, res


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"some of {', '.join(BY_NAME)} (default: all)")
    ap.add_argument("--record", type=Path, metavar="DIR", help="also record the snapshots into DIR")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the table and headlines (markdown)")
    ap.add_argument("--check", action="store_true", help="set-up check: py-spy dumps of the culprits, no hangscope")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown scenario {', '.join(unknown)}")
    specs = [BY_NAME[n] for n in args.names] if args.names else SPECS
    # --check runs before truth.json is written (it only proves the hangs with py-spy)
    truth = load_truth() if (HERE / "truth.json").exists() else {}
    for spec in specs:
        if args.check and not truth:
            break
        t = truth.get(spec.name)
        if t is None or sorted(t["culprit"]) != sorted(spec.culprits) or t["node"] != node_of(spec.culprits[0]):
            raise SystemExit(f"truth.json disagrees with the set-up of {spec.name}")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core files from anything the set-ups start
    scores: List[Score] = []
    notes = {}
    app_where: List[str] = []
    work = Path(tempfile.mkdtemp(prefix="hangscope-blind-run-"))
    started_at = datetime.datetime.now(datetime.timezone.utc)
    try:
        with build_cluster(NODES) as cluster:
            for spec in specs:
                print(f"== {spec.name} ", flush=True)
                t0 = time.monotonic()
                try:
                    with live(cluster, spec) as ctx:
                        print(f"   hung after {time.monotonic() - t0:.0f} s", flush=True)
                        if not app_where:
                            app_where.append(cli_app_file(ctx))
                            print(f"   the CLI's app: {app_where[0]} (this process's: {APP_FILE})", flush=True)
                        notes[spec.name] = ctx.notes
                        if args.check:
                            print("--- set-up ---\n" + "\n".join(ctx.notes), flush=True)
                            check(ctx)
                            check_services(ctx)
                            check_other(ctx)
                            print("--- the job's output (last lines) ---\n" + ctx.job.log_tail(), flush=True)
                            continue
                        headline, seconds, _ = diagnose(ctx, work, args.record)
                    score = judge(spec.name, headline, truth[spec.name], seconds)
                except Exception as exc:  # one scenario's failure is reported, the others still run
                    traceback.print_exc()
                    if args.check:
                        print(f"   CHECK FAILED: {type(exc).__name__}: {exc}"[:2000], flush=True)
                        continue
                    score = judge(spec.name, "", truth[spec.name], error=f"{type(exc).__name__}: {exc}"[:300])
                scores.append(score)
                print(f"   {score.headline or score.error}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.check:
        return 0
    out = table(scores)
    print("\n" + out + "\n\nheadlines:\n" + headlines(scores))
    if args.report:
        args.report.write_text(f"started {started_at:%Y-%m-%d %H:%M} UTC\n\nhangscope's app (the CLI's): "
                               f"{app_where[0] if app_where else '?'}; the recorder's: {APP_FILE}\n\n"
                               f"{out}\n\n## Headlines\n\n"
                               f"{headlines(scores)}\n", encoding="utf-8")
    if args.record:
        (args.record / "notes.json").write_text(json.dumps(notes, indent=1) + "\n", encoding="utf-8")
    return 0 if all(not s.error for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
