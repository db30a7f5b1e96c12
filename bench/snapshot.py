"""Benchmark: one picture of every rank, hangscope against the manual recipes and the floor; prints a table.

On the network-namespace SSH test cluster (tests/support/cluster.py) with N nodes x R stand-in ranks
(bench/stand_in_rank.py), each repetition measures, one after the other, on the login side's wall clock:
  seq      the guide's recipe, node after node: ssh -F cfg NODE 'pgrep -f RANKS | xargs -I{} py-spy dump --pid {}'
  par      the same recipe on all nodes at once (background ssh clients; pdsh is not installed here)
  cli      the whole CLI: `python3 -m app HOSTS --snapshot FILE --samples 1` from process start to exit
  cli2     the same with the CLI's default two samples (no --samples): what a user who types nothing more waits
  cold     in-process Session.snapshot() on a new session: connect, worker start, discovery, dumps
  warm     Session.refresh() on the open connections and workers: discovery and dumps again
  floor    hangscope's own py-spy argv (dump --json --locals) on every rank, from the host, no SSH, as many
           at a time as there are cores; `1dump` is the slowest single dump among them
hangscope runs with its CLI defaults (locals, loop variables, source lines, sockets); the recipes print plain
stacks only. Every method must find every rank, or the run stops. The 1-minute load average is recorded
before each repetition: the machine's 2 cores are shared with whatever else runs. Needs root.

--bytecode first writes app/'s and workers/' bytecode caches (__pycache__, `python -m compileall`), as a pip
install does: without it, a checkout run with PYTHONDONTWRITEBYTECODE=1 (this environment) compiles ~130 modules
from source at every CLI start (~0.35 s of CPU), and the worker payload compiles workers/ on every run.

    python3 bench/snapshot.py [--sizes 4x4,8x4,16x4,32x4] [--repeat 3] [--skip seq,cli] [--bytecode] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "support")]

import cluster as cluster_mod  # noqa: E402
from waiting import wait_until  # noqa: E402
from app.hosts import HostSpec  # noqa: E402
from app.model import CollectOptions  # noqa: E402
from app.session import Session, SessionOptions  # noqa: E402

RANK_SCRIPT = Path(ROOT) / "bench" / "stand_in_rank.py"
# `[s]` keeps the pattern from matching the remote shell that runs the pipeline (its cmdline holds `[s]`)
RECIPE = "pgrep -f '[s]tand_in_rank' | xargs -I{} py-spy dump --pid {}"
METHODS = ("seq", "par", "cli", "cli2", "cold", "warm", "floor", "1dump")
PHASES = ("connect", "login", "start", "push", "discover", "dump")


class CpuMeter:
    """CPU seconds used by the bench and every node process (a cgroup v1 cpuacct group holds them all), so
    that other work on the machine does not count: the work each method costs, beside its wall time."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self) -> None:
        self.dir = self.ROOT / f"hangscope-bench-{os.getpid()}"
        self.ok = (self.ROOT / "cgroup.procs").exists()
        if self.ok:
            for stale in self.ROOT.glob("hangscope-bench-*"):  # left by a killed run; rmdir keeps busy ones
                try:
                    stale.rmdir()
                except OSError:
                    pass
            self.dir.mkdir(exist_ok=True)
            self.add(os.getpid())  # children started from now on (ssh, py-spy, the CLI) inherit it

    def add(self, pid: int) -> None:
        if self.ok:
            try:
                (self.dir / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass  # exited meanwhile

    def seconds(self) -> float:
        return int((self.dir / "cpuacct.usage").read_text()) / 1e9 if self.ok else float("nan")

    def close(self) -> None:
        if self.ok:
            (self.ROOT / "cgroup.procs").write_text(str(os.getpid()))
            try:
                self.dir.rmdir()
            except OSError:
                pass  # a straggler still in it: the next run removes the group


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _recipe_ranks(out: str) -> int:
    return out.count("Process ")  # py-spy dump prints one "Process PID: ..." header per target


class Bench:
    """One cluster with its ranks up; each method returns seconds and checks that every rank was seen."""

    def __init__(self, c: cluster_mod.Cluster, ranks_per_node: int, work: Path, meter: CpuMeter) -> None:
        self.c = c
        self.meter = meter
        self.session_cpu = (0.0, 0.0)  # the last session's (cold, warm) CPU seconds
        self.login_cpu: Dict[str, List[float]] = {"cold": [], "warm": []}  # this process only, per node
        self.expected = len(c.nodes) * ranks_per_node
        self.rpn = ranks_per_node
        self.work = work
        self.hosts = c.hosts_file(work)
        self.env = c.env()
        self.host_pids = self._host_pids()
        self.phases: Dict[str, List[float]] = {p: [] for p in PHASES}

    def _host_pids(self) -> List[int]:
        pids = []
        for node in self.c.nodes:
            pids += [p.host_pid for p in node.procs() if b"stand_in_rank" in _cmdline(p.host_pid)]
        if len(pids) != self.expected:
            raise RuntimeError(f"found {len(pids)} stand-in ranks, expected {self.expected}")
        return pids

    def _check(self, method: str, seen: int) -> None:
        if seen != self.expected:
            raise RuntimeError(f"{method}: saw {seen} of {self.expected} ranks")

    def seq(self) -> float:
        t0 = time.monotonic()
        seen = 0
        for node in self.c.names:
            done = subprocess.run(self.c.ssh_argv(node, RECIPE), env=self.env, capture_output=True, text=True,
                                  timeout=120, stdin=subprocess.DEVNULL)
            seen += _recipe_ranks(done.stdout)
        took = time.monotonic() - t0
        self._check("seq", seen)
        return took

    def par(self) -> float:
        t0 = time.monotonic()
        procs = [subprocess.Popen(self.c.ssh_argv(node, RECIPE), env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
                 for node in self.c.names]
        try:
            outs = [p.communicate(timeout=120)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        took = time.monotonic() - t0
        self._check("par", sum(_recipe_ranks(o) for o in outs))
        return took

    def cli(self, samples: int = 1) -> float:
        out = self.work / "snap.json"
        argv = [sys.executable, "-m", "app", str(self.hosts), "--snapshot", str(out), "--force",
                "-q", "-F", str(self.c.ssh_config)] + (["--samples", str(samples)] if samples != 2 else [])
        t0 = time.monotonic()
        done = subprocess.run(argv, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        took = time.monotonic() - t0
        if not out.exists():
            raise RuntimeError(f"cli: exit {done.returncode}, no snapshot: {done.stderr[-2000:]}")
        snap = json.loads(out.read_text())["snapshot"]
        self._check("cli", sum(1 for r in snap["ranks"] if r.get("threads")))
        out.unlink()
        return took

    async def session(self) -> tuple[float, float]:
        opts = SessionOptions(collect=CollectOptions(locals=True), ssh_config=(str(self.c.ssh_config),))
        session = Session([HostSpec(name=n, host=n, slots=self.rpn) for n in self.c.names], opts)
        try:
            c0, t0, p0 = self.meter.seconds(), time.monotonic(), time.process_time()
            snap = await session.snapshot()
            cold, cold_cpu = time.monotonic() - t0, self.meter.seconds() - c0
            self.login_cpu["cold"].append((time.process_time() - p0) / len(self.c.nodes))
            self._check("cold", sum(1 for r in snap.ranks if r.threads))
            for node in snap.nodes:
                for phase, secs in node.timings:
                    self.phases.setdefault(phase, []).append(secs)
            c0, t0, p0 = self.meter.seconds(), time.monotonic(), time.process_time()
            snap = await session.refresh()
            warm = time.monotonic() - t0
            self.login_cpu["warm"].append((time.process_time() - p0) / len(self.c.nodes))
            self.session_cpu = (cold_cpu, self.meter.seconds() - c0)
            self._check("warm", sum(1 for r in snap.ranks if r.threads))
        finally:
            await session.close()
        return cold, warm

    def floor(self) -> tuple[float, float]:
        def one(pid: int) -> float:
            t = time.monotonic()
            done = subprocess.run([str(cluster_mod.PYSPY), "dump", "--json", "--locals", "--pid", str(pid)],
                                  capture_output=True, timeout=60)
            if done.returncode != 0 or not done.stdout.startswith(b"["):
                raise RuntimeError(f"floor: py-spy on pid {pid}: {done.stderr[-500:]!r}")
            return time.monotonic() - t

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            each = list(pool.map(one, self.host_pids))
        return time.monotonic() - t0, max(each)


def start_ranks(c: cluster_mod.Cluster, rpn: int) -> None:
    ready = []
    world = len(c.nodes) * rpn
    for i, node in enumerate(c.nodes):
        for r in range(rpn):
            ready.append(c.workdir / f"ready-{node.name}-{r}")
            node.spawn(["/usr/bin/python3", str(RANK_SCRIPT), str(ready[-1])],
                       env={"RANK": str(i * rpn + r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world),
                            "LOCAL_WORLD_SIZE": str(rpn), "GROUP_RANK": str(i), "MASTER_ADDR": c.names[0],
                            "MASTER_PORT": "29500"})
    wait_until(lambda: all(p.exists() and p.read_text().endswith("\n") for p in ready), 180,
                     "stand-in ranks to block")


def measure(nodes: int, rpn: int, repeat: int, skip: set[str], meter: CpuMeter) -> Dict[str, Any]:
    samples: Dict[str, List[float]] = {m: [] for m in METHODS}
    cpu: Dict[str, List[float]] = {m: [] for m in METHODS}
    loads: List[float] = []
    with cluster_mod.build_cluster(nodes) as c, tempfile.TemporaryDirectory(prefix="hangscope-bench-") as tmp:
        os.environ["HOME"] = str(c.home)  # the in-process Session reads ~/.ssh like the CLI does
        os.environ.pop("SSH_AUTH_SOCK", None)
        start_ranks(c, rpn)
        for node in c.nodes:
            for proc in node.procs():  # sshd's sessions and everything they start inherit the group
                meter.add(proc.host_pid)
        b = Bench(c, rpn, Path(tmp), meter)
        steps: List[tuple[str, Callable[[], Any]]] = [
            ("seq", b.seq), ("par", b.par), ("cli", b.cli), ("cli2", lambda: b.cli(2)),
            ("cold", lambda: asyncio.run(b.session())), ("floor", b.floor)]
        for _ in range(repeat):
            loads.append(os.getloadavg()[0])
            for name, fn in steps:
                if name in skip:
                    continue
                c0 = meter.seconds()
                got = fn()
                cpu[name].append(meter.seconds() - c0)
                if name == "cold":
                    samples["cold"].append(got[0])
                    samples["warm"].append(got[1])
                    cpu["cold"][-1], _ = b.session_cpu  # without the warm pass and the close
                    cpu["warm"].append(b.session_cpu[1])
                elif name == "floor":
                    samples["floor"].append(got[0])
                    samples["1dump"].append(got[1])
                else:
                    samples[name].append(got)
        phases = {p: statistics.median(v) for p, v in b.phases.items() if v}
        login = {k: statistics.median(v) for k, v in b.login_cpu.items() if v}
    med = {m: statistics.median(v) for m, v in samples.items() if v}
    cpu_med = {m: statistics.median(v) for m, v in cpu.items() if v}
    return {"nodes": nodes, "rpn": rpn, "repeat": repeat, "median": med, "samples": samples, "cpu": cpu_med,
            "cpu_samples": cpu, "load": loads, "phases": phases, "login_cpu": login}


def _ratio(med: Dict[str, float], a: str, b: str) -> str:
    return f"{med[a] / med[b]:.2f}" if a in med and b in med and med[b] > 0 else "-"


def table(results: List[Dict[str, Any]]) -> str:
    head = ("| nodes x ranks | seq | par | cli | cli2 | cold | warm | floor | 1 dump | cold/par | cold/seq | cli/par "
            "| cli2/par | warm/floor | load 1m |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        med = r["median"]
        cells = [f"{med[m]:.2f}" if m in med else "-" for m in ("seq", "par", "cli", "cli2", "cold", "warm", "floor")]
        cells.append(f"{med['1dump'] * 1000:.0f} ms" if "1dump" in med else "-")
        cells += [_ratio(med, "cold", "par"), _ratio(med, "cold", "seq"), _ratio(med, "cli", "par"),
                  _ratio(med, "cli2", "par"), _ratio(med, "warm", "floor")]
        load = r["load"]
        cells.append(f"{min(load):.1f}-{max(load):.1f}")
        lines.append(f"| {r['nodes']} x {r['rpn']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("CPU seconds (bench + every node process, a cpuacct cgroup; median), the work each method costs:")
    for r in results:
        cm = r["cpu"]
        lines.append(f"  {r['nodes']:>3} x {r['rpn']}: "
                     + "  ".join(f"{m} {cm[m]:.2f}" for m in METHODS[:-1] if m in cm)
                     + (f"   cold/par {cm['cold'] / cm['par']:.2f}  warm/floor {cm['warm'] / cm['floor']:.2f}"
                        if {'cold', 'par', 'warm', 'floor'} <= set(cm) else ""))
    lines.append("")
    lines.append("Median seconds per node and phase of the cold Session (NodeStatus.timings):")
    for r in results:
        ph = r["phases"]
        lines.append(f"  {r['nodes']:>3} x {r['rpn']}: " + "  ".join(f"{p} {ph[p]:.3f}" for p in PHASES if p in ph)
                     + "   login-side CPU ms/node: "
                     + "  ".join(f"{k} {v * 1000:.1f}" for k, v in r["login_cpu"].items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4x4,8x4,16x4,32x4", help="NODESxRANKS,... (default 4x4,8x4,16x4,32x4)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per size; medians are reported (3)")
    parser.add_argument("--skip", default="", help="methods to leave out, e.g. seq,cli")
    parser.add_argument("--json", metavar="FILE", help="also write every sample as JSON")
    parser.add_argument("--bytecode", action="store_true",
                        help="write app/ and workers/ bytecode caches first, as an installed hangscope has them")
    args = parser.parse_args()
    if args.bytecode:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "app", "workers"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
    problem = cluster_mod.support_problem()
    if problem:
        sys.exit(problem)
    skip = {s for s in args.skip.split(",") if s}
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cpus, "
          f"median of {args.repeat}; seconds, login-side wall clock"
          + ("; app/ and workers/ bytecode cached (--bytecode)" if args.bytecode else ""), flush=True)
    results = []
    meter = CpuMeter()
    try:
        for size in args.sizes.split(","):
            n, r = (int(x) for x in size.split("x"))
            results.append(measure(n, r, args.repeat, skip, meter))
            print(table(results[-1:]).splitlines()[2], flush=True)
    finally:
        meter.close()
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
