#!/usr/bin/env python3
"""The blind elastic set, live: each scenario's torchrun job hung on the test cluster, the real CLI run against it as
a user runs it, its headline scored against truth.json.

Needs root (the network-namespace cluster of tests/support/cluster.py) and torch: run it with the python that has
hangscope and torch installed. One 4-node cluster, one job at a time; each job is stopped (everything it started
killed) before the next starts.

    sudo /work/venv/bin/python bench/blind/elastic/run.py [NAME ...] [--record DIR] [--report FILE]
    sudo /work/venv/bin/python bench/blind/elastic/run.py [NAME ...] --check   # set-up only: py-spy, no hangscope

For each scenario: `hangscope HOSTS --print --snapshot FILE` (one run, the CLI's defaults); the headline is the
first paragraph it prints. With --record, also DIR/<name>.json and DIR/<name>.earlier.json as
tests/support/record_scenarios.py records them (score.py re-analyses them offline), DIR/live/<name>.txt (the CLI's
output) and DIR/live/<name>.snapshot.json.gz (the CLI's snapshot, gzipped: gunzip it for `hangscope --load`).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
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

from scenarios import BY_NAME, NODES, REPO, RANKS_PER_NODE, SPECS, Ctx, live  # noqa: E402
from scoring import Score, headlines, judge, load_truth, table  # noqa: E402

from cluster import build_cluster, run_login  # noqa: E402
from record_scenarios import Running, Scenario, hosts_text, record  # noqa: E402
from testenv import PYSPY, SCRIPTS  # noqa: E402

CLI_TIMEOUT = 240.0


def running_of(ctx: Ctx) -> Running:
    return Running(Scenario(ctx.spec.name, NODES, RANKS_PER_NODE, culprit=ctx.spec.rank), ctx.job, ctx.cluster)


def hangscope() -> List[str]:
    found = shutil.which("hangscope", path=str(SCRIPTS))
    return [found] if found else [sys.executable, "-m", "app"]


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""


def _state(task: str) -> str:
    stat = _read(f"{task}/stat")
    return stat.rsplit(")", 1)[-1].split()[0] if stat else "?"


def dump(pid: int, head: str, main_only: bool = False) -> None:
    """py-spy --nonblocking (never ptrace: a stopped process stays stopped), and each thread's kernel wait."""
    cmd = _read(f"/proc/{pid}/cmdline").replace(chr(0), " ").strip()[:300]
    out = subprocess.run([str(PYSPY), "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                         timeout=60)
    text = out.stdout + out.stderr
    if main_only:
        text = "Thread" + text.split("Thread", 1)[-1].split("\n\n", 1)[0] if "Thread" in text else text
    print(f"--- {head} (host pid {pid}, state {_state(f'/proc/{pid}')}): {cmd!r} ---\n{text}")
    if not main_only:
        for tid in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda d: int(d.name)):
            print(f"  thread {tid.name} {_read(f'{tid}/comm')!r}: state {_state(str(tid))}, "
                  f"wchan {_read(f'{tid}/wchan')!r}, syscall {_read(f'{tid}/syscall')[:60]!r}")


def check(ctx: Ctx) -> None:
    job = ctx.job
    assert job is not None
    for pid in ctx.culprit_pids:
        dump(pid, "CULPRIT")
    for pid in ctx.extra.get("dump", []):
        if pid not in ctx.culprit_pids:
            dump(pid, "set-up process")
    for a in job.agents():
        if a.host_pid not in ctx.culprit_pids:
            dump(a.host_pid, f"launcher on {a.node}", main_only=True)
    for w in sorted(job.workers(), key=lambda w: w.rank or 0):
        if w.host_pid not in ctx.culprit_pids:
            dump(w.host_pid, f"rank {w.rank} on {w.node} (restart {w.env.get('TORCHELASTIC_RESTART_COUNT')})",
                 main_only=True)
    print("--- job processes ---")
    for p in job.procs():
        print(f"  {p.node} {p.host_pid} {p.state} rank={p.rank} group_rank={p.env.get('GROUP_RANK')} "
              f"{p.cmdline[:120]!r}")


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


def diagnose(ctx: Ctx, work: Path, record_dir: Optional[Path]) -> tuple:
    running = running_of(ctx)
    name = ctx.spec.name
    run_dir = Path(tempfile.mkdtemp(dir=work))
    hosts = run_dir / "hosts.txt"
    hosts.write_text(hosts_text(running))
    snap = run_dir / "snapshot.json"
    started = time.monotonic()
    res = run_login([*hangscope(), str(hosts), "--print", "--snapshot", str(snap)], ctx.cluster,
                    timeout=CLI_TIMEOUT, cwd=str(REPO))
    seconds = time.monotonic() - started
    headline = printed_headline(res.stdout)
    if record_dir is not None:
        live_dir = record_dir / "live"
        live_dir.mkdir(parents=True, exist_ok=True)
        (live_dir / f"{name}.txt").write_text(
            f"$ hangscope HOSTS --print --snapshot FILE   (exit {res.returncode}, {seconds:.1f} s)\n"
            f"{res.stdout}\n--- stderr ---\n{res.stderr}", encoding="utf-8")
        if snap.exists():
            with open(snap, "rb") as src, gzip.GzipFile(live_dir / f"{name}.snapshot.json.gz", "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
        try:
            for path in record(running, record_dir):
                with open(path, "rb") as src, gzip.GzipFile(f"{path}.gz", "wb", mtime=0) as dst:
                    shutil.copyfileobj(src, dst)
                path.unlink()
        except Exception as exc:  # the live headline is the result; a failed re-recording is noted
            print(f"   note: recording for score.py failed: {type(exc).__name__}: {exc}", flush=True)
    if not res.stdout.strip():
        raise RuntimeError(f"hangscope printed nothing (exit {res.returncode}): {res.stderr[-2000:]}")
    return headline, seconds, res


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"some of {', '.join(BY_NAME)} (default: all)")
    ap.add_argument("--record", type=Path, metavar="DIR", help="also record the snapshots into DIR")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the table and headlines (markdown)")
    ap.add_argument("--check", action="store_true", help="set-up check: py-spy dumps, no hangscope")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown scenario {', '.join(unknown)}")
    specs = [BY_NAME[n] for n in args.names] if args.names else SPECS
    truth = load_truth()
    for spec in specs:
        t = truth.get(spec.name)
        if t is None or t["culprit_process"] != spec.culprit or t["node"] != spec.node:
            raise SystemExit(f"truth.json disagrees with the set-up of {spec.name}")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    scores: List[Score] = []
    notes = {}
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
                        notes[spec.name] = ctx.notes
                        if args.check:
                            for note in ctx.notes:
                                print(f"   note: {note}")
                            check(ctx)
                            print("--- the launchers' logs (last lines) ---\n" + ctx.job.log_tail(12), flush=True)
                            continue
                        headline, seconds, _ = diagnose(ctx, work, args.record)
                    score = judge(spec.name, headline, truth[spec.name], seconds)
                except Exception as exc:
                    traceback.print_exc()
                    score = judge(spec.name, "", truth[spec.name], error=f"{type(exc).__name__}: {exc}"[:300])
                scores.append(score)
                print(f"   {score.headline or score.error}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.check:
        return 0 if all(not s.error for s in scores) else 1
    out = table(scores)
    print("\n" + out + "\n\nheadlines:\n" + headlines(scores))
    if args.report:
        args.report.write_text(f"started {started_at:%Y-%m-%d %H:%M} UTC\n\n{out}\n\n## Headlines\n\n"
                               f"{headlines(scores)}\n", encoding="utf-8")
    if args.record:
        (args.record / "notes.json").write_text(json.dumps(notes, indent=1) + "\n", encoding="utf-8")
    return 0 if all(not s.error for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
