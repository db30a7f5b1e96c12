#!/usr/bin/env python3
"""The blind co-located set, live: each scenario's job hung on the test cluster next to the other processes of its
nodes, the real CLI run against it as a user runs it, its headline scored against truth.json.

Needs root (the network-namespace cluster of tests/support/cluster.py) and torch. One 4-node cluster, one scenario at
a time; everything a scenario started is killed before the next starts. Run it with PYTHONPATH pointing at the copy of
hangscope under test (its `app` is what the CLI and the recorder import):

    PYTHONPATH=/work/wt-blind /work/venv/bin/python bench/blind/colocated/run.py --check > bench/blind/colocated/data/check.txt
    PYTHONPATH=/work/wt-blind /work/venv/bin/python bench/blind/colocated/run.py --record bench/blind/colocated/data --report FILE
    PYTHONPATH=/work/wt-blind /work/venv/bin/python bench/blind/colocated/run.py NAME ...   # some scenarios, no recording

--check: set-up only (py-spy dumps and /proc of the blocked ranks, of the extra processes, one other rank; locks and
sockets of the nodes involved; no hangscope). Otherwise for each scenario: `hangscope HOSTS --print --snapshot FILE`
(one run, the CLI's defaults; HOSTS lists the four node names, nothing else); the headline is the first paragraph it
prints. With --record DIR: DIR/live/<name>.txt (the CLI's output), DIR/live/<name>.snapshot.json.gz (its snapshot),
DIR/<name>.json.gz + DIR/<name>.earlier.json.gz (two samples as tests/support/record_scenarios.py records them) and
DIR/notes.json (the set-up's notes and the extra processes' pids, which truth.json's words refer to).
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
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scenarios import BY_NAME, NODES, SPECS, Ctx, live, node_of, node_pid, read, state_of  # noqa: E402
from scoring import Score, headlines, judge, load_truth, table  # noqa: E402

from cluster import build_cluster, run_login  # noqa: E402
from record_scenarios import Running, Scenario, record  # noqa: E402
from testenv import PYSPY, SCRIPTS  # noqa: E402

import app  # noqa: E402  (after record_scenarios: the one it uses)

CLI_TIMEOUT = 300.0
NEUTRAL = Path(tempfile.gettempdir())


def hangscope() -> List[str]:
    found = shutil.which("hangscope", path=str(SCRIPTS))
    return [found] if found else [sys.executable, "-m", "app"]


def hosts_text() -> str:
    return "".join(f"node{i:02d}\n" for i in range(1, NODES + 1))


def running_of(ctx: Ctx) -> Running:
    assert ctx.job is not None
    # second="x": hosts_text without slots (the nodes are shared), as this set's own hosts file
    return Running(Scenario(ctx.spec.name, NODES, 2, culprit=(ctx.spec.blocked or (None,))[0], second="x"), ctx.job,
                   ctx.cluster)


def _thread_lines(pid: int) -> str:
    out = []
    for tid in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda d: int(d.name)) if Path(f"/proc/{pid}/task").exists() else ():
        out.append(f"  thread {tid.name} {read(f'{tid}/comm')!r}: state {state_of(pid, int(tid.name))}, "
                   f"wchan {read(f'{tid}/wchan')!r}, syscall {read(f'{tid}/syscall')[:60]!r}")
    return "\n".join(out)


def _status(pid: int) -> str:
    keep = ("State", "TracerPid", "NSpid", "PPid")
    return ", ".join(line.replace("\t", " ") for line in read(f"/proc/{pid}/status").splitlines()
                     if line.split(":")[0] in keep)


def dump(pid: int, head: str, main_only: bool = False) -> None:
    cmd = read(f"/proc/{pid}/cmdline").replace(chr(0), " ").strip()[:300]
    print(f"--- {head} (host pid {pid}, node pid {node_pid(pid)}): {cmd!r}\n    {_status(pid)}")
    if state_of(pid) in ("T", "t"):
        print("    (stopped or traced: not dumped with py-spy, which would attach to it)")
    elif "python" in cmd:
        out = subprocess.run([str(PYSPY), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        text = out.stdout + out.stderr
        if main_only:
            text = '  MainThread' + text.split('"MainThread"', 1)[-1].split("\n\n", 1)[0]
        print(text.rstrip())
    print(_thread_lines(pid) if not main_only else "")
    env = read(f"/proc/{pid}/environ").split(chr(0))
    picked = [e for e in env if e.split("=")[0] in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                  "TORCHELASTIC_RUN_ID")]
    if picked:
        print("    env: " + " ".join(picked))


def check(ctx: Ctx) -> None:
    print("--- set-up ---\n" + "\n".join(ctx.notes), flush=True)
    for rank in ctx.spec.blocked:
        dump(ctx.host_pid(rank), f"rank {rank} ({node_of(rank)}) of the job")
    for role, info in ctx.roles.items():
        dump(info["host_pid"], f"extra process {role!r} on {info['node']}: {info['what']}")
    other = next(r for r in (7, 1, 6, 0) if r not in ctx.spec.blocked)
    dump(ctx.host_pid(other), f"another rank: rank {other} ({node_of(other)}), its main thread", main_only=True)
    nodes = sorted({node_of(r) for r in ctx.spec.blocked} | {i["node"] for i in ctx.roles.values()})
    print("--- /proc/locks ---\n" + read("/proc/locks"))
    sems = sorted(Path("/dev/shm").glob("sem.ring-node0*"))
    for sem in sems:  # a POSIX semaphore's value is the first int of its file; who maps it, from /proc/*/maps
        value = int.from_bytes(sem.read_bytes()[:4], "little")
        users = sorted(int(p.parent.name) for p in Path("/proc").glob("[0-9]*/maps")
                       if sem.name in read(str(p)))
        print(f"--- {sem}: value {value}; mapped by host pids {users} ---")
    for n in nodes:
        res = ctx.node(n).run(["ss", "-Htanpx"], check=False)
        lines = [line for line in res.stdout.splitlines() if "python" in line or "gdb" in line]
        print(f"--- sockets on {n} (ss -tanpx, python's) ---\n" + "\n".join(" ".join(line.split()) for line in lines[:40]))
    print("--- the job's output (last lines) ---\n" + ctx.job.log_tail(), flush=True)


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
    name = ctx.spec.name
    run_dir = Path(tempfile.mkdtemp(dir=work))  # neutral names: the scenario's name holds scoring words
    hosts = run_dir / "hosts.txt"
    hosts.write_text(hosts_text())
    snap = run_dir / "snapshot.json"
    started = time.monotonic()
    res = run_login([*hangscope(), str(hosts), "--print", "--snapshot", str(snap)], ctx.cluster,
                    timeout=CLI_TIMEOUT, cwd=str(NEUTRAL))
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
            for path in record(running_of(ctx), record_dir):
                with open(path, "rb") as src, gzip.GzipFile(f"{path}.gz", "wb", mtime=0) as dst:
                    shutil.copyfileobj(src, dst)
                path.unlink()
        except Exception:  # the recorder's samples are extra; the live CLI's run is what is scored
            traceback.print_exc()
    if not res.stdout.strip():
        raise RuntimeError(f"hangscope printed nothing (exit {res.returncode}): {res.stderr[-2000:]}")
    return headline, seconds, res


def facts_of(ctx: Ctx) -> Dict[str, object]:
    return {"notes": ctx.notes, "roles": ctx.roles,
            "ranks": {str(r): {"node": loc.node, "pid": node_pid(loc.host_pid)} for r, loc in ctx.job.ranks.items()}}


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
    print(f"app under test: {app.__file__} (PYTHONPATH={os.environ.get('PYTHONPATH', '')!r}); CLI: {hangscope()}",
          flush=True)
    pp = os.environ.get("PYTHONPATH", "")
    if pp and not app.__file__.startswith(pp.split(":")[0]):
        raise SystemExit(f"app comes from {app.__file__}, not from PYTHONPATH {pp}")
    truth = {} if args.check else load_truth()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    scores: List[Score] = []
    facts: Dict[str, object] = {}
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
                        facts[spec.name] = facts_of(ctx)
                        if args.check:
                            check(ctx)
                            continue
                        headline, seconds, _ = diagnose(ctx, work, args.record)
                    score = judge(spec.name, headline, truth[spec.name], seconds, facts=facts[spec.name])
                except Exception as exc:
                    traceback.print_exc()
                    if args.check:
                        print(f"   CHECK FAILED: {type(exc).__name__}: {exc}"[:3000], flush=True)
                        continue
                    score = judge(spec.name, "", truth[spec.name], error=f"{type(exc).__name__}: {exc}"[:300],
                                  facts=facts.get(spec.name))
                scores.append(score)
                print(f"   {score.headline or score.error}", flush=True)
                if args.record:  # after each scenario: score.py needs the pids the truth's words refer to
                    (args.record / "notes.json").write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.check:
        return 0
    out = table(scores)
    print("\n" + out + "\n\nheadlines:\n" + headlines(scores))
    if args.report:
        args.report.write_text(f"started {started_at:%Y-%m-%d %H:%M} UTC; app under test: {app.__file__}\n\n{out}\n\n"
                               f"## Headlines\n\n{headlines(scores)}\n", encoding="utf-8")
    if args.record:
        (args.record / "notes.json").write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
    return 0 if all(not s.error for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
