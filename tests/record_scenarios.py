"""Live hang scenarios on the test cluster, and the recorder of their golden snapshots (tests/data/scenarios/).

Each scenario is the demo torch job (app/demo/job.py, gloo) hung in one way on a few nodes of a test cluster:
`start(cluster, scenario)` launches it and returns once it hangs (netcut: once a node is cut off with
iptables inside its network namespace, ssh from the login side still allowed); `diagnose()` runs the real
CLI, `hangscope HOSTS --snapshot out.json`, against it. tests/test_scenarios.py asserts on those runs.

Run as a script (root: the cluster needs network namespaces), this module re-records the goldens that
tests/test_golden.py asserts on, one job at a time on one 3-node cluster:

    python3 tests/record_scenarios.py [--out tests/data/scenarios] [SCENARIO ...]   # default: all five

For each scenario it takes two samples one second apart with the CLI's own default options (locals on) and
writes <scenario>.json (the second sample with its analysis, app.model.snapshot_to_json) and
<scenario>.earlier.json (the first sample, without locals and source lines: tests/test_golden.py passes it as
history, so progress is judged as the CLI judges it). Node names and pids come from the cluster. Check each new diagnosis by hand before
updating the expectations in tests/test_golden.py: the goldens are the analysis's regression net.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
for _p in (str(REPO), str(TESTS)):  # as a script: the repo (app) and tests/ helpers (cluster, jobs)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cluster import Cluster, Node, build_cluster, run_login  # noqa: E402
from jobs import Job, _main_thread, start_job  # noqa: E402
from waiting import wait_until  # noqa: E402

from app.model import Snapshot, ThreadStack, snapshot_from_json, snapshot_to_json  # noqa: E402

GOLDEN_DIR = TESTS / "data" / "scenarios"
CLI_TIMEOUT = 180.0
_SLEEP_SYSCALL = {"x86_64": "230", "aarch64": "115"}  # clock_nanosleep: time.sleep between training steps


@dataclass(frozen=True)
class Scenario:
    """One way to hang: the demo job's scenario on `nodes` x `ranks_per_node` ranks."""

    name: str  # app/demo/job.py --scenario
    nodes: int
    ranks_per_node: int
    culprit: Optional[int] = None  # the rank that misbehaves; None for healthy and netcut
    cut: Optional[str] = None  # netcut: the node cut off from the others
    step: int = 3  # the step K at which the job hangs

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


# Culprits are neither always the last rank nor always on the last node, so a rule that guesses "the last
# one" cannot pass. netcut needs three nodes: with two, both ends of every stalled socket are equally suspect.
SCENARIOS = {
    "skip": Scenario("skip", 2, 2, culprit=2),
    "dataloader": Scenario("dataloader", 2, 2, culprit=1),
    "die": Scenario("die", 2, 2, culprit=3),
    "netcut": Scenario("netcut", 3, 1, cut="node02"),
    "healthy": Scenario("healthy", 2, 2),
    "lock": Scenario("lock", 2, 2, culprit=1),
    "deadlock": Scenario("deadlock", 2, 2, culprit=2),
    "order": Scenario("order", 2, 2, culprit=1),
    "uneven": Scenario("uneven", 2, 2, culprit=2),
}


@dataclass
class Running:
    """A started scenario job, and the iptables rules to take back when it stops."""

    scenario: Scenario
    job: Job
    cluster: Cluster
    rules: list[tuple[Node, tuple[str, ...]]] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return self.cluster.names[:self.scenario.nodes]

    def stop(self) -> None:
        """Restore the network first (the job's processes then die on a normal network), then the job."""
        try:
            for node, rule in reversed(self.rules):
                node.iptables("-D", *rule)
            self.rules.clear()
        finally:
            self.job.stop()


def cut_off(cluster: Cluster, name: str, others: Sequence[str]) -> list[tuple[Node, tuple[str, ...]]]:
    """Drop everything between node `name` and the `others`, inside its network namespace; the login side's
    address (ssh, hangscope) is untouched. Returns the rules added, for removal."""
    node = cluster[name]
    rules: list[tuple[Node, tuple[str, ...]]] = []
    try:
        for other in others:
            ip = cluster[other].ip
            for rule in (("INPUT", "-s", ip, "-j", "DROP"), ("OUTPUT", "-d", ip, "-j", "DROP")):
                node.iptables("-A", *rule)
                rules.append((node, rule))
    except BaseException:
        for n, rule in reversed(rules):
            n.iptables("-D", *rule)
        raise
    return rules


def cut_between_steps(running: Running, name: str) -> None:
    """Cut node `name` off while no collective is in flight: every rank asleep between two steps, held there by
    SIGSTOP for the moment of the cut, so every rank's next all_reduce runs into it. A cut in the middle of an
    all_reduce stalls only the links that still had data to send (seen: node01-node02 alone, for node02 cut
    off from node01 and node03), and the sockets then name a link, not the node."""
    pids = [loc.host_pid for loc in running.job.ranks.values()]
    sleeping = _SLEEP_SYSCALL.get(platform.machine(), "230")
    others = [n for n in running.names if n != name]

    def asleep(state: str) -> bool:
        return all((_main_thread(p) or ("", ""))[:2] == (state, sleeping) for p in pids)

    deadline = time.monotonic() + 60
    while True:
        wait_until(lambda: asleep("S"), max(1.0, deadline - time.monotonic()), "every rank asleep between two steps",
             interval=0.002)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: all((_main_thread(p) or ("",))[0] == "T" for p in pids), 10, "the ranks to stop")
            if asleep("T"):  # none woke up between the check and its stop
                running.rules = cut_off(running.cluster, name, others)
                return
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)


def start(cluster: Cluster, scenario: Scenario, timeout: float = 120) -> Running:
    """The scenario's job, hung (healthy: training); stop() it when done."""
    job = start_job(cluster, scenario.name, nodes=scenario.nodes, ranks_per_node=scenario.ranks_per_node,
                    culprit=scenario.culprit, step=scenario.step, timeout=timeout)
    running = Running(scenario, job, cluster)
    try:
        if scenario.cut is not None:
            cut_between_steps(running, scenario.cut)
            job.wait_blocked(timeout=60)  # every rank now waits for data that cannot arrive
    except BaseException:
        running.stop()
        raise
    return running


@contextlib.contextmanager
def started(cluster: Cluster, scenario: Scenario) -> Iterator[Running]:
    running = start(cluster, scenario)
    try:
        yield running
    finally:
        running.stop()


def hosts_text(running: Running) -> str:
    return "".join(f"{name} slots={running.scenario.ranks_per_node}\n" for name in running.names)


@dataclass(frozen=True)
class Diagnosis:
    """One run of `hangscope HOSTS --snapshot FILE`: its exit code, printed summary and snapshot file."""

    returncode: int
    stdout: str
    stderr: str
    snapshot: Snapshot
    analysis: dict[str, Any]
    seconds: float

    def finding(self, kind: str) -> dict[str, Any]:
        found = [f for f in self.analysis["findings"] if f["kind"] == kind]
        assert found, f"no {kind} finding in {[f['kind'] for f in self.analysis['findings']]}\n{self.stdout}"
        return found[0]


def diagnose(running: Running, workdir: Path, *extra: str) -> Diagnosis:
    """The real CLI, as a user runs it on the login node against the scenario's nodes."""
    hosts = workdir / f"{running.scenario.name}-hosts.txt"
    hosts.write_text(hosts_text(running))
    out = workdir / f"{running.scenario.name}.json"
    started_at = time.monotonic()
    res = run_login([sys.executable, "-m", "app", str(hosts), "--snapshot", str(out), *extra], running.cluster,
                    timeout=CLI_TIMEOUT, cwd=str(REPO))
    seconds = time.monotonic() - started_at
    if not out.exists():
        raise AssertionError(f"no snapshot written; exit {res.returncode}\n{res.stdout}\n{res.stderr}")
    snap, analysis = snapshot_from_json(out.read_text(encoding="utf-8"))
    assert analysis is not None
    return Diagnosis(res.returncode, res.stdout, res.stderr, snap, analysis, seconds)


def record(running: Running, out_dir: Path) -> list[Path]:
    """Two samples as the CLI takes them (its own parser and options), written as the golden pair."""
    from app.analysis import analyze
    from app.cli import build_parser
    from app.headless import session_options
    from app.hosts import parse_hosts
    from app.session import Session

    args = build_parser().parse_args(["hosts.txt", "-F", str(running.cluster.ssh_config)])
    hosts = list(parse_hosts(hosts_text(running), "scenario").hosts)

    async def two_samples() -> tuple[Snapshot, Snapshot]:
        session = Session(hosts, session_options(args))
        try:
            first = await session.snapshot()
            await asyncio.sleep(args.interval)
            return first, await session.refresh()
        finally:
            await session.close()

    earlier, snap = asyncio.run(two_samples())
    assert args.samples == 2, "the CLI's default changed: record as many samples as it takes"
    analysis = analyze(snap, history=[earlier])
    out_dir.mkdir(parents=True, exist_ok=True)
    name = running.scenario.name
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.earlier.json"]
    paths[0].write_text(snapshot_to_json(snap, analysis.to_dict()) + "\n", encoding="utf-8")
    paths[1].write_text(snapshot_to_json(lean(earlier)) + "\n", encoding="utf-8")
    print(f"{name}: {analysis.verdict}")
    for f in analysis.findings:
        print(f"  [{f.confidence}] {f.kind}: {f.title}")
    return paths


def lean(snap: Snapshot) -> Snapshot:
    """An earlier sample as progress reads it: frames without their locals and source lines (the loop
    iteration, which progress compares, is kept on each frame)."""
    def frames(t: ThreadStack) -> ThreadStack:
        return dataclasses.replace(t, frames=tuple(dataclasses.replace(f, locals=(), source=()) for f in t.frames))
    return dataclasses.replace(snap, ranks=tuple(dataclasses.replace(r, threads=tuple(map(frames, r.threads)))
                                                 for r in snap.ranks))


def refresh(folder: Path) -> int:
    """Load and dump every recorded snapshot in `folder`, so the files match what today's model writes
    (tests/test_interning.py checks an exact round trip)."""
    for path in sorted(folder.glob("*.json")):
        text = path.read_text(encoding="utf-8")
        snap, analysis = snapshot_from_json(text)
        new = snapshot_to_json(snap, analysis) + ("\n" if text.endswith("\n") else "")
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"refreshed {path}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                    help=f"one or more of {', '.join(SCENARIOS)} (default: all)")
    ap.add_argument("--out", type=Path, default=GOLDEN_DIR, help=f"output directory ({GOLDEN_DIR})")
    ap.add_argument("--refresh", action="store_true",
                    help="re-dump the recorded snapshots in --out with today's model (after a model change) "
                         "instead of recording new ones; no cluster needed")
    args = ap.parse_args(argv)
    if args.refresh:
        return refresh(args.out)
    names = args.scenarios or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    with build_cluster(max(SCENARIOS[n].nodes for n in names)) as cluster:
        for name in names:
            with started(cluster, SCENARIOS[name]) as running:
                for path in record(running, args.out):
                    size = path.stat().st_size
                    json.loads(path.read_text(encoding="utf-8"))  # whole and valid before the next job
                    print(f"  wrote {path} ({size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
