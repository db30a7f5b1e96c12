"""What hangscope watch costs and how fast it catches a hang, on the test cluster (4 nodes x 2 ranks, gloo).

Three measurements, each printed as a table (needs root: network namespaces; not part of the test suite):

- overhead: a healthy DDP job (tests/ddp_train.py) alternately without and with `hangscope watch` (its default
  30 s interval unless --every), --runs times each, --window seconds each; the job's step rate from its own log
  (rank 0 prints its iteration every 10), medians; the watch's CPU per node per interval: what the worker and
  the sshd carrying it report (history.jsonl), and the same read from /proc on the host (every process of the
  node that is not the job's, less the same without the watch), and the login side's CPU.
- hang: the demo job training ~10 s and then hanging (dataloader scenario), watched with --every/--stall
  (30/120 s, the defaults, unless given); the time from the hang (the ranks' ready lines, written just before
  the call they hang in) to the sample that declared the stall, and what the capture itself took; --hangs runs.
- soak (--soak SECONDS): the healthy job watched with the defaults for that long: captures (must be none), the
  watch's memory and open files over the run, its history's size, the CPU per node.

    sudo python3 bench/watch.py                          # overhead (3 x 2 x 120 s) and 2 hangs, defaults
    sudo python3 bench/watch.py --only hang --hangs 3 --every 10 --stall 30
    sudo python3 bench/watch.py --only soak --soak 1800  # 30 minutes on a healthy job
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "support")]

import cluster as cluster_mod  # noqa: E402
import jobs as jobs_mod  # noqa: E402

DDP = Path(jobs_mod.__file__).resolve().parent / "ddp_train.py"
CLK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def last_iter(job: jobs_mod.Job) -> Optional[int]:
    """The job's latest iteration, from rank 0's own log line (`iter N: ...`): nothing reads the ranks."""
    try:
        text = (job.workdir / f"{job.places[0].name}.log").read_text(errors="replace")
    except OSError:
        return None
    found = re.findall(r"^iter (\d+):", text, re.MULTILINE)
    return int(found[-1]) if found else None


def step_rate(job: jobs_mod.Job, seconds: float) -> float:
    i0, t0 = last_iter(job), time.monotonic()
    time.sleep(seconds)  # a measurement window
    i1, t1 = last_iter(job), time.monotonic()
    if i0 is None or i1 is None:
        raise RuntimeError(f"the job's log has no iteration lines:\n{job.log_tail()}")
    return (i1 - i0) / (t1 - t0)


def cpu_of(host_pid: int) -> float:
    try:
        fields = Path(f"/proc/{host_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / CLK
    except (OSError, IndexError, ValueError):
        return 0.0


def node_other_cpu(cluster: cluster_mod.Cluster, mark: str) -> Dict[str, float]:
    """Per node, the CPU seconds so far of every process that is not the job's (sshd, the worker, tini)."""
    needle = mark.encode()
    out = {}
    for node in cluster.nodes:
        total = 0.0
        for p in node.procs():
            try:
                if needle in Path(f"/proc/{p.host_pid}/environ").read_bytes().split(b"\0"):
                    continue
            except OSError:
                continue
            total += cpu_of(p.host_pid)
        out[node.name] = total
    return out


class Watch:
    def __init__(self, cluster: cluster_mod.Cluster, out: Path, *args: str) -> None:
        self.out = out
        self.logfile = out.with_suffix(".log")
        hosts = cluster.hosts_file(out.parent)
        with open(self.logfile, "wb") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "app", "watch", str(hosts), "--out", str(out),
                                          "--connect-timeout", "30", *args], env=cluster.env(), stdout=f,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(ROOT))

    def text(self) -> str:
        return self.logfile.read_text(errors="replace")

    def history(self) -> List[dict]:
        rows = []
        for name in ("history.1.jsonl", "history.jsonl"):
            p = self.out / name
            if p.exists():
                rows += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        return rows

    def wait_for(self, pattern: str, timeout: float) -> Optional[re.Match]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = re.search(pattern, self.text())
            if m or self.proc.poll() is not None:
                return m
            time.sleep(0.5)
        return None

    def rss_files(self) -> Tuple[int, int]:
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
            rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) * 1024  # type: ignore[union-attr]
            files = len(os.listdir(f"/proc/{self.proc.pid}/fd"))
            return rss, files
        except (OSError, AttributeError):
            return 0, 0

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def mean(values: List[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def overhead(cluster: cluster_mod.Cluster, work: Path, runs: int, window: float, every: float) -> None:
    job = jobs_mod.start_job(cluster, "ddp-train", nodes=4, ranks_per_node=2, script=DDP, wait=False, timeout=300)
    try:
        time.sleep(20)  # the job's first steps (warm-up) are not its rate
        without, with_, node_cost, host_cost, login_cost, samples = [], [], [], [], [], 0
        for run in range(runs):
            rate = step_rate(job, window)
            without.append(rate)
            log(f"run {run + 1}: without the watch {rate:.2f} it/s (load {load()})")
            before = node_other_cpu(cluster, job.mark)
            idle = {n: v for n, v in before.items()}
            w = Watch(cluster, work / f"overhead-{run}", "--every", str(every), "--stall", str(max(120, every * 4)))
            t0 = time.monotonic()
            rate = step_rate(job, window)
            login = cpu_of(w.proc.pid)
            elapsed = time.monotonic() - t0
            after = node_other_cpu(cluster, job.mark)
            with_.append(rate)
            w.stop()
            hist = w.history()
            samples += len(hist)
            node_cost += [share for row in hist for share in row["cost"].values()]
            # the same from the host's /proc: what every non-job process of each node used in the window
            host_cost += [(after[n] - idle[n]) / elapsed for n in after]
            login_cost.append(login / max(len(hist), 1))
            if "capturing" in w.text():
                log("a capture on a healthy job:\n" + w.text())
            log(f"run {run + 1}: with the watch {rate:.2f} it/s, {len(hist)} samples")
        base = median(without)
        print(f"\n## overhead: healthy DDP job, 4 nodes x 2 ranks, --every {every:g} s; {runs} runs of {window:g} s "
              f"each way; load {load()}")
        print("| measure | median | min | max |\n|---|---|---|---|")
        print(f"| step rate without the watch (it/s) | {base:.2f} | {min(without):.2f} | {max(without):.2f} |")
        print(f"| step rate with the watch (it/s) | {median(with_):.2f} | {min(with_):.2f} | {max(with_):.2f} |")
        print(f"| change with the watch | {(median(with_) - base) / base:+.1%} | | |")
        # the mean over intervals is the share over the whole window (a sample's CPU is counted in 10 ms ticks)
        print(f"| watch CPU per node, worker + sshd (self-reported, % of a core; mean) | {mean(node_cost):.3%} | "
              f"{min(node_cost, default=0):.3%} | {max(node_cost, default=0):.3%} |")
        print(f"| watch CPU per node, every non-job process, host /proc (% of a core) | {median(host_cost):.3%} | "
              f"{min(host_cost):.3%} | {max(host_cost):.3%} |")
        print(f"| login-side CPU per sample (s) | {median(login_cost):.3f} | {min(login_cost):.3f} | "
              f"{max(login_cost):.3f} |")
        print(f"| samples | {samples} | | |")
    finally:
        job.stop()


def hang(cluster: cluster_mod.Cluster, work: Path, runs: int, every: float, stall: float) -> None:
    rows = []
    for run in range(runs):
        job = jobs_mod._launch(cluster.nodes[:4], "dataloader", 2, None, 40, ["--step-delay", "0.25"],
                               standalone=False)
        try:
            w = Watch(cluster, work / f"hang-{run}", "--every", str(every), "--stall", str(stall), "--wait-start",
                      "300")
            job.wait_ready(300)
            job.wait_blocked(120)
            hung = job.ready_file.stat().st_mtime
            m = w.wait_for(r"captured \(hang\) in ([0-9.]+) s", stall * 5 + every * 2 + 300)
            if m is None:
                log(f"hang run {run + 1}: no capture\n{w.text()}")
                continue
            stalled = next(s for s in w.history() if any(j["status"] == "stalled" for j in s["jobs"].values()))
            capture = next(p for p in w.out.iterdir() if p.is_dir())
            doc = json.loads((capture / "watch.json").read_text())
            rows.append((stalled["t"] - hung, float(m.group(1)), "Rank 7" in doc["headline"]))
            log(f"hang run {run + 1}: detected {rows[-1][0]:.1f} s after the hang, capture {rows[-1][1]:.1f} s")
            w.stop()
        finally:
            job.stop()
    print(f"\n## hang to capture: demo job (dataloader scenario), --every {every:g} --stall {stall:g}; load {load()}")
    print("| run | hang -> stall declared (s) | capture took (s) | hang -> capture written (s) | bound: stall + every (s) "
          "| culprit named |\n|---|---|---|---|---|---|")
    for i, (detect, took, named) in enumerate(rows, 1):
        print(f"| {i} | {detect:.1f} | {took:.1f} | {detect + took:.1f} | {stall + every:g} | {'yes' if named else 'no'} |")
    if rows:
        print(f"| median | {median([r[0] for r in rows]):.1f} | {median([r[1] for r in rows]):.1f} | "
              f"{median([r[0] + r[1] for r in rows]):.1f} | | |")


def soak(cluster: cluster_mod.Cluster, work: Path, seconds: float, every: float) -> None:
    job = jobs_mod.start_job(cluster, "ddp-train", nodes=4, ranks_per_node=2, script=DDP, wait=False, timeout=300)
    try:
        w = Watch(cluster, work / "soak", "--every", str(every))
        t0 = time.monotonic()
        it0 = last_iter(job)
        marks: List[Tuple[float, int, int]] = []
        while time.monotonic() - t0 < seconds and w.proc.poll() is None:
            time.sleep(min(60.0, seconds / 10))
            rss, files = w.rss_files()
            marks.append((time.monotonic() - t0, rss, files))
            log(f"soak {marks[-1][0]:.0f} s: rss {rss / 1e6:.1f} MB, {files} fds, load {load()}")
        it1 = last_iter(job)
        elapsed = time.monotonic() - t0
        login = cpu_of(w.proc.pid)
        text = w.text()
        alive = w.proc.poll() is None
        code = w.stop()
        hist = w.history()
        cost = [share for row in hist for share in row["cost"].values()]
        captures = [p for p in w.out.iterdir() if p.is_dir()]
        hsize = sum(p.stat().st_size for p in w.out.glob("history*.jsonl"))
        print(f"\n## soak: healthy DDP job watched {elapsed / 60:.1f} min, --every {every:g} s, --stall 120 (defaults); "
              f"load {load()}")
        print("| measure | value |\n|---|---|")
        print(f"| captures (false: the job is healthy) | {len(captures)} |")
        print(f"| 'capturing' said | {text.count('capturing')} |")
        print(f"| watch still running at the end | {'yes' if alive else 'no'} (exit {code} on SIGINT) |")
        print(f"| samples | {len(hist)} |")
        print(f"| job step rate over the soak (it/s) | {((it1 or 0) - (it0 or 0)) / elapsed:.2f} |")
        print(f"| watch CPU per node, worker + sshd (% of a core): mean over the soak / worst interval | "
              f"{mean(cost):.3%} / {max(cost, default=0):.3%} |")
        print(f"| login-side CPU, whole soak (s) | {login:.1f} |")
        print(f"| login RSS first / last (MB) | {marks[0][1] / 1e6:.1f} / {marks[-1][1] / 1e6:.1f} |")
        print(f"| login open fds first / last | {marks[0][2]} / {marks[-1][2]} |")
        print(f"| history on disk (bytes) | {hsize} |")
    finally:
        job.stop()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--only", choices=("overhead", "hang", "soak"), action="append")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--window", type=float, default=120.0)
    p.add_argument("--every", type=float, default=30.0)
    p.add_argument("--stall", type=float, default=120.0)
    p.add_argument("--hangs", type=int, default=2)
    p.add_argument("--soak", type=float, default=0.0, metavar="SECONDS")
    args = p.parse_args(argv)
    only = set(args.only or (["overhead", "hang"] + (["soak"] if args.soak else [])))
    work = Path(f"/tmp/hangscope-bench-watch-{os.getpid()}")
    work.mkdir(mode=0o700)
    cluster = cluster_mod.build_cluster(4)
    t0 = time.time()
    try:
        print(f"# bench/watch.py on {os.cpu_count()} cores, load at start {load()}")
        if "overhead" in only:
            overhead(cluster, work, args.runs, args.window, args.every)
        if "hang" in only:
            hang(cluster, work, args.hangs, args.every, args.stall)
        if "soak" in only:
            soak(cluster, work, args.soak or 1800.0, args.every)
    finally:
        cluster.close()
        usage = os.times()
        print(f"\nbench wall {time.time() - t0:.0f} s; its own CPU {usage.user + usage.system:.1f} s, children "
              f"{usage.children_user + usage.children_system:.1f} s; load at end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
