"""Soak: hangscope refreshing every 2 s for 30 minutes on a healthy 8-rank torch job (test cluster, 4 nodes x 2).

Measures what a user leaving hangscope open on a production job relies on: the job's step rate with hangscope
watching vs. without (a baseline window before and after), hangscope's memory (RSS) and open file count over
the run, the login side's event-loop lag (max and p99 per quarter: the loop the TUI draws from must never
freeze), that no rank is ever seen stopped or traced, and that nothing of hangscope stays on a node after it
exits. One node flaps: every minute its link to the login node goes down for --flap-down seconds (iptables DROP
of everything between it and the login address, in the node's namespace; the job's own traffic between nodes
is untouched, so the job keeps running) and comes back up; its ranks must come back on a later refresh of the
same watcher, without a restart. The watcher is a child process running the real Session loop the TUI's --refresh drives (non-blocking
py-spy sampling, locals, analysis with a bounded history), so its /proc numbers are hangscope's alone.
Needs root (network namespaces); not part of the test suite.

    sudo python3 bench/soak.py                      # the 30-minute run
    sudo python3 bench/soak.py --minutes 3 --baseline 45   # a short check that it works
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support")]

from testenv import PYSPY  # noqa: E402  (this environment's py-spy: a venv's, not the base interpreter's)


def job_step(host_pid: int) -> int:
    """train()'s `step` local, read without pausing the rank (py-spy --nonblocking; retried: a running rank's
    memory can change under the read)."""
    last = ""
    for _ in range(10):
        res = subprocess.run([str(PYSPY), "dump", "--nonblocking", "--locals", "--pid", str(host_pid)],
                             capture_output=True, text=True, timeout=30)
        if res.returncode == 0 and "    train (" in res.stdout:
            section = res.stdout.split("    train (", 1)[1]
            match = re.search(r"^\s+step: (\d+)$", section, re.MULTILINE)
            if match:
                return int(match.group(1))
        last = res.stderr or res.stdout[-400:]
    raise RuntimeError(f"could not read the step of pid {host_pid}: {last}")


def step_rate(host_pid: int, seconds: float) -> float:
    s0, t0 = job_step(host_pid), time.monotonic()
    time.sleep(seconds)  # a benchmark window, not a test waiting for something
    return (job_step(host_pid) - s0) / (time.monotonic() - t0)


def by_whom(findings: List[str], nodes: List[object]) -> tuple[List[str], List[str]]:
    """Split 'pid/tid: state X, tracer T' findings into those hangscope caused (a tracer inside a soak node, i.e.
    started by the watcher's worker, or a stop with no tracer) and those of other processes on this shared
    machine (e.g. a local test session that discovered every rank on the host)."""
    namespaces = set()
    for node in nodes:
        try:
            namespaces.add(os.readlink(f"/proc/{node.init_pid}/ns/pid"))  # type: ignore[attr-defined]
        except OSError:
            pass
    ours, others = [], []
    for finding in findings:
        tracer = int(finding.rsplit("tracer ", 1)[1])
        try:
            ns = os.readlink(f"/proc/{tracer}/ns/pid") if tracer else ""
            comm = Path(f"/proc/{tracer}/comm").read_text().strip() if tracer else ""
        except OSError:
            ns, comm = "?", "?"
        if tracer == 0 or ns in namespaces:
            ours.append(finding)
        else:
            others.append(f"{finding} ({comm or 'gone'}, outside the soak nodes)")
    return ours, others


def proc_numbers(pid: int) -> tuple[int, int]:
    """(RSS in kB, open file descriptors) of a live process."""
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


# -- the watcher (child process) -------------------------------------------------------------------------

async def watch(names: List[str], ssh_config: str, interval: float, seconds: float) -> None:
    from app.analysis import analyze
    from app.hosts import parse_hosts
    from app.model import CollectOptions
    from app.session import Session, SessionOptions

    hosts = parse_hosts("".join(f"{n}\n" for n in names), "soak").hosts
    options = SessionOptions(collect=CollectOptions(nonblocking=True, locals=True), ssh_config=(ssh_config,))
    session = Session(hosts, options)
    history: collections.deque = collections.deque(maxlen=30)  # the TUI bounds its history too
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    n = 0
    lags: List[float] = []

    async def lag_probe(period: float = 0.05) -> None:
        """How late the loop wakes a task that asked to sleep `period`: the delay a keypress or a repaint in the
        TUI would see."""
        while True:
            t = loop.time()
            await asyncio.sleep(period)
            lags.append(max(0.0, loop.time() - t - period))

    probe = asyncio.create_task(lag_probe())
    try:
        while loop.time() < end:
            tick = loop.time()
            snap = await (session.snapshot() if n == 0 else session.refresh())
            analysis = analyze(snap, history=list(history))
            history.append(snap)
            n += 1
            by_node = collections.Counter(r.node for r in snap.ranks)
            lag_ms = [round(x * 1000, 2) for x in lags]
            lags.clear()
            print(json.dumps({"n": n, "wall": time.time(), "ranks": len(snap.ranks), "complete": snap.complete,
                              "by_node": dict(by_node), "lag_ms": lag_ms,
                              "took": round(loop.time() - tick, 3), "findings": len(analysis.findings),
                              "errors": sorted({r.error.code for r in snap.ranks if r.error is not None}
                                               | {n.error.code for n in snap.nodes if n.error is not None})}),
                  flush=True)
            await asyncio.sleep(max(0.0, tick + interval - loop.time()))
    finally:
        probe.cancel()
        await session.close()


def p99(values: List[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)] if ordered else 0.0


class Flapper:
    """Takes `node`'s link to the login side down for `down` seconds once every `period` seconds, from `start`
    seconds in; records (down, up) wall times."""

    def __init__(self, node: object, login_ip: str, down: float, until: float, period: float = 60.0,
                 start: float = 20.0) -> None:
        self.node, self.down, self.period, self.start, self.until = node, down, period, start, until
        self.rules = [("INPUT", "-s", login_ip, "-j", "DROP"), ("OUTPUT", "-d", login_ip, "-j", "DROP")]
        self.events: List[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _set(self, on: bool) -> None:
        for rule in self.rules:
            self.node.iptables("-A" if on else "-D", *rule)  # type: ignore[attr-defined]

    def _run(self) -> None:
        t0 = time.monotonic()
        k = 0
        while self.start + k * self.period + self.down <= self.until and \
                not self.stop.wait(max(0.0, t0 + self.start + k * self.period - time.monotonic())):
            cut = time.time()
            self._set(True)
            try:
                self.stop.wait(self.down)
            finally:
                self._set(False)
            self.events.append((cut, time.time()))
            k += 1


def flap_recovery(lines: List[dict], events: List[tuple[float, float]], node: str, expect: int) -> List[object]:
    """Per flap: seconds from the link coming back up to the first refresh that again has all of the node's
    ranks (None: never within the run), and whether the node's ranks were missing while it was down."""
    out: List[object] = []
    for cut, up in events:
        back = next((x["wall"] for x in lines if x["wall"] >= up and x.get("by_node", {}).get(node, 0) == expect),
                    None)
        lost = any(cut <= x["wall"] <= up + 1 and x.get("by_node", {}).get(node, 0) < expect for x in lines)
        out.append({"down_s": round(up - cut, 1), "missed_while_down": lost,
                    "back_after_up_s": None if back is None else round(back - up, 1)})
    return out


# -- the run ---------------------------------------------------------------------------------------------

def soak(minutes: float, interval: float, baseline: float, flap_down: float) -> Dict[str, object]:
    import cluster as cluster_mod
    from faults_nodes import leftovers, stopped_or_traced
    from jobs import start_job

    with cluster_mod.build_cluster(4, prefix="soak") as c:
        job = start_job(c, "healthy", nodes=4, ranks_per_node=2, timeout=300)
        try:
            pids = [loc.host_pid for loc in job.ranks.values()]
            probe = job.ranks[min(job.ranks)].host_pid
            before = step_rate(probe, baseline)
            child = subprocess.Popen(
                [sys.executable, __file__, "--child", ",".join(c.names), "--ssh-config", str(c.ssh_config),
                 "--interval", str(interval), "--seconds", str(minutes * 60)],
                env=c.env(), stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
            lines: List[dict] = []
            reader = threading.Thread(target=lambda: lines.extend(json.loads(x) for x in child.stdout), daemon=True)
            reader.start()
            flapped = c.nodes[-1]
            # the last flap ends a minute before the watcher does: time for the ranks to come back
            flapper = Flapper(flapped, c.login_ip, flap_down, until=minutes * 60 - 60)
            if flap_down > 0:
                flapper.thread.start()
            mem: List[tuple[float, int, int]] = []
            bad: List[str] = []
            foreign: List[str] = []
            s0, t0 = job_step(probe), time.monotonic()
            next_mem = t0
            while child.poll() is None:
                ours, others = by_whom(stopped_or_traced(pids), c.nodes)
                bad += ours
                foreign += others
                if time.monotonic() >= next_mem:
                    try:
                        rss, fds = proc_numbers(child.pid)
                        mem.append((time.monotonic() - t0, rss, fds))
                    except (OSError, StopIteration):
                        pass
                    next_mem += 10
                time.sleep(0.5)  # sampling period of the stopped/traced check
            watched = (job_step(probe) - s0) / (time.monotonic() - t0)
            flapper.stop.set()
            if flap_down > 0:
                flapper.thread.join(flap_down + 30)
            reader.join(10)
            left_t0 = time.monotonic()
            while leftovers(c.nodes) and time.monotonic() - left_t0 < 10:
                time.sleep(0.1)
            left = leftovers(c.nodes)
            after = step_rate(probe, baseline)
            ours, others = by_whom(stopped_or_traced(pids), c.nodes)
            bad += ours
            foreign += others
        finally:
            job.stop()
    warm = next((m for m in mem if m[0] >= 60), mem[0]) if mem else (0, 0, 0)
    end = mem[-1] if mem else (0, 0, 0)
    base = (before + after) / 2
    took = sorted(x["took"] for x in lines) or [0.0]
    first = lines[0]["wall"] if lines else 0.0
    quarter = minutes * 15
    lag_q: List[List[float]] = [[], [], [], []]
    for x in lines:
        lag_q[min(3, int((x["wall"] - first) // quarter))] += x.get("lag_ms", [])
    name = flapped.name  # type: ignore[attr-defined]
    return {
        "minutes": minutes, "refreshes": len(lines), "child_exit": child.returncode,
        "incomplete_refreshes": sum(1 for x in lines if not x["complete"] or x["ranks"] != 8),
        "incomplete_why": sorted({e for x in lines for e in x["errors"]}),
        "refresh_median_s": took[len(took) // 2], "refresh_max_s": took[-1],
        "steps_per_s_before": round(before, 3), "steps_per_s_watched": round(watched, 3),
        "steps_per_s_after": round(after, 3), "step_rate_drop_pct": round(100 * (base - watched) / base, 2),
        "rss_kb_start": mem[0][1] if mem else 0, "rss_kb_warm": warm[1], "rss_kb_end": end[1],
        "rss_kb_max": max((m[1] for m in mem), default=0),
        "fds_start": mem[0][2] if mem else 0, "fds_warm": warm[2], "fds_end": end[2],
        "fds_max": max((m[2] for m in mem), default=0),
        "rss_kb_by_quarter": [next((m[1] for m in mem if m[0] >= q * minutes * 15), end[1]) for q in (1, 2, 3, 4)],
        "loop_lag_ms_max_by_quarter": [round(max(q, default=0.0), 1) for q in lag_q],
        "loop_lag_ms_p99_by_quarter": [round(p99(q), 1) for q in lag_q],
        "loop_lag_samples": sum(len(q) for q in lag_q),
        "flapping_node": name if flap_down > 0 else "",
        "flaps": flap_recovery(lines, flapper.events, name, 2),
        "stopped_or_traced_seen": bad[:10], "traced_by_other_processes": foreign[:5], "left_on_nodes": left,
    }


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (2)")
    p.add_argument("--baseline", type=float, default=120.0, help="seconds of step-rate baseline before and after")
    p.add_argument("--flap-down", type=float, default=40.0,
                   help="seconds each minute that one node's link to the login side is down (40; 0: no flapping)")
    p.add_argument("--child", metavar="NODES", help=argparse.SUPPRESS)
    p.add_argument("--ssh-config", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        asyncio.run(watch(args.child.split(","), args.ssh_config, args.interval, args.seconds))
        return 0
    result = soak(args.minutes, args.interval, args.baseline, args.flap_down)
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    flaps = result["flaps"]
    assert isinstance(flaps, list)
    ok = (result["step_rate_drop_pct"] < 2 and not result["stopped_or_traced_seen"] and not result["left_on_nodes"]
          and result["child_exit"] == 0 and all(f["back_after_up_s"] is not None for f in flaps))
    print("PASS" if ok else "FAIL (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
