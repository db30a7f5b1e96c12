"""Live hang scenarios on the test cluster, and the recorder of their golden snapshots (tests/data/scenarios/).

Each scenario is the demo torch job (app/demo/job.py, gloo) hung in one way on a few nodes of a test cluster:
`start(cluster, scenario)` launches it and returns once it hangs (netcut: once a node is cut off with
iptables inside its network namespace, ssh from the login side still allowed); `diagnose()` runs the real
CLI, `hangscope HOSTS --snapshot out.json`, against it. tests/live/test_scenarios.py asserts on those runs.

Run as a script (root: the cluster needs network namespaces), this module re-records the goldens that
tests/analysis/test_golden.py asserts on, one job at a time on one 3-node cluster:

    python3 tests/support/record_scenarios.py [--out tests/data/scenarios] [SCENARIO ...]   # default: all of them
    python3 tests/support/record_scenarios.py --nodes 4 --ranks-per-node 2 ...            # another size (bench/live_classes.py)

For each scenario it takes two samples one second apart with the CLI's own default options (locals on) and
writes <scenario>.json (the second sample with its analysis, app.model.codec.snapshot_to_json) and
<scenario>.earlier.json (the first sample, without locals and source lines: tests/analysis/test_golden.py passes it as
history, so progress is judged as the CLI judges it). Node names and pids come from the cluster. Check each new diagnosis by hand before
updating the expectations in tests/analysis/test_golden.py: the goldens are the analysis's regression net.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

SUPPORT = Path(__file__).resolve().parent  # tests/support: the helpers (cluster, jobs) and job scripts
TESTS = SUPPORT.parent
REPO = TESTS.parent
for _p in (str(REPO), str(SUPPORT)):  # as a script: the repo (app) and the tests' helpers (cluster, jobs)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cluster import UNHURRIED_LOGIN, Cluster, Node, build_cluster, run_login  # noqa: E402
from jobs import JOB_SCRIPT, MARK, PYTHON, Job, RankLoc, _finish, _free_port, _launch, _main_thread, start_job  # noqa: E402
from cpu_cap import CpuCap, CpuFavour  # noqa: E402
from waiting import wait_until  # noqa: E402

from app.model import Snapshot, ThreadStack  # noqa: E402
from app.model.codec import snapshot_from_json, snapshot_to_json  # noqa: E402

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
    cut: Optional[str] = None  # netcut: the node cut off from the others; slow: the node throttled
    step: int = 3  # the step K at which the job hangs
    job: str = ""  # the demo job's --scenario, when it is not `name` (a hold applied to a healthy job)
    hold: str = ""  # done to the culprit once the job trains: "stop" (SIGSTOP), "freeze" (cgroup freezer);
    #                 "throttle": node `cut`'s ranks capped to 10 % of a CPU (a slow node, no hang)
    leave_out: str = ""  # a node of the job that the hosts list leaves out
    second: str = ""  # a second job of this demo scenario on the same nodes (two jobs)
    spawn: bool = False  # tests/support/spawn_job.py on the first node: mp.spawn, nodes x ranks_per_node ranks there
    script: str = ""  # another training script in tests/support/ than the demo job (ddp_train.py)
    stall: bool = False  # a stalled FUSE file system on the culprit's node (tests/support/fuse_stall.py): --stall-file
    freezer: int = 0  # hold "freeze": the cgroup freezer's version (1: freezer.state, 2: cgroup.freeze; 0: v2 if any)
    hide: bool = False  # the held or throttled node (the culprit's, or `cut`) sees no cgroup file system: an empty
    #                     tmpfs over its /sys/fs/cgroup, as in a container whose cgroup view is not the host's
    settle: str = ""  # "others": the culprit never sleeps in one call (a spin, a poll loop): wait for the others only
    stdin_pipe: bool = False  # the launchers' (so the ranks') stdin is a pipe nobody writes, as from a terminal
    helper: str = ""  # a process of the culprit's node the job uses: "agent" (a metrics agent that never answers,
    #                   --service) or "flock" (another process holding the dataset-cache lock, --lock-file)
    launchers: int = 0  # start-up: torchrun on only the first `launchers` nodes of `nodes` (--nnodes nodes): no rank

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
    # the classes that were live only (issue 17 cases 1-3, 5-7), and new ones
    "stopped": Scenario("stopped", 2, 2, culprit=3, job="healthy", hold="stop"),
    "frozen": Scenario("frozen", 2, 2, culprit=2, job="healthy", hold="freeze"),
    "spawn": Scenario("spawn", 1, 4, culprit=2, spawn=True),
    "twojobs": Scenario("twojobs", 2, 2, culprit=3, job="dataloader", second="healthy"),
    "slow": Scenario("slow", 2, 2, cut="node02", hold="throttle", script="ddp_train.py"),
    "missing": Scenario("missing", 2, 2, culprit=3, job="dataloader", leave_out="node02"),
    "mismatch": Scenario("mismatch", 2, 2, culprit=1),
    "gil": Scenario("gil", 2, 2, culprit=2),
    "native": Scenario("native", 2, 2, culprit=3),
    "pipe": Scenario("pipe", 2, 2, culprit=1),
    "fsstall": Scenario("fsstall", 2, 2, culprit=2, stall=True),
}
SCENARIOS["gpu_xid"] = Scenario("gpu_xid", 2, 2, culprit=3)  # GPU evidence: a FAKE GPU fault (tests/support/gpu_fakes.py)
# Development scenarios for the wait model (issue 24): the five classes it names first, then one per kind of resource
# of app/analysis/sites.py that the classes above leave out. Each is one blocking operation of a real library
# (app/demo/job.py's train_patterns), its culprit spread over the ranks.
DEVELOPMENT = {
    # held by the freezer on a node whose /sys/fs/cgroup is not the host's (v1: D in __refrigerator; v2: get_signal)
    "frozen_private": Scenario("frozen_private", 2, 2, culprit=1, job="healthy", hold="freeze", freezer=1, hide=True),
    "frozen_private_v2": Scenario("frozen_private_v2", 2, 2, culprit=2, job="healthy", hold="freeze", freezer=2,
                                  hide=True),
    # torchrun --nnodes 4 started on node01-node03 only (node ranks 0-2): the rendezvous waits for node rank 3
    "startup": Scenario("startup", 4, 2, launchers=3),
    "shutdown": Scenario("shutdown", 2, 2, culprit=2),
    "loaderlock": Scenario("loaderlock", 2, 2, culprit=1),
    # node01's ranks capped to 10 % of a CPU, node01 blind to its cgroups: slow, from CPU time per wall second
    "throttled_hidden": Scenario("throttled_hidden", 2, 2, cut="node01", hold="throttle", script="ddp_train.py",
                                 hide=True),
    "executor": Scenario("executor", 2, 2, culprit=0),
    "event": Scenario("event", 2, 2, culprit=3),
    "queue": Scenario("queue", 2, 2, culprit=1),
    "service": Scenario("service", 2, 2, culprit=2, helper="agent"),
    "subprocess": Scenario("subprocess", 2, 2, culprit=0),
    "flock": Scenario("flock", 2, 2, culprit=3, helper="flock"),
    "storekey": Scenario("storekey", 2, 2, culprit=2),
    "poll": Scenario("poll", 2, 2, culprit=1, settle="others"),
    "spin": Scenario("spin", 2, 2, culprit=3, settle="others"),
    "pdb": Scenario("pdb", 2, 2, culprit=2, stdin_pipe=True),
    "sighandler": Scenario("sighandler", 2, 2, culprit=0),
    "asyncio": Scenario("asyncio", 2, 2, culprit=3),
    "selflock": Scenario("selflock", 2, 2, culprit=1),
}
SCENARIOS.update(DEVELOPMENT)
# CLI options a scenario needs beyond the defaults: the gloo demo maps no libnccl, so GPU evidence is forced
CLI_EXTRA: dict[str, tuple[str, ...]] = {"gpu_xid": ("--gpu-evidence",)}


@dataclass
class Running:
    """A started scenario job, and the iptables rules to take back when it stops."""

    scenario: Scenario
    job: Job
    cluster: Cluster
    rules: list[tuple[Node, tuple[str, ...]]] = field(default_factory=list)
    fakes: list[Path] = field(default_factory=list)  # FAKE tools placed on nodes for this scenario, removed at stop
    undo: list[Any] = field(default_factory=list)  # callables that release what was done to the job, in order
    others: list[Job] = field(default_factory=list)  # a second job on the same nodes

    @property
    def names(self) -> list[str]:
        return self.cluster.names[:1 if self.scenario.spawn else self.scenario.nodes]

    def stop(self) -> None:
        """Restore the network first (the job's processes then die on a normal network), release a held rank
        (thaw, continue), then stop the jobs."""
        try:
            for node, rule in reversed(self.rules):
                node.iptables("-D", *rule)
            self.rules.clear()
            while self.undo:
                with contextlib.suppress(Exception):
                    self.undo.pop()()
        finally:
            try:
                for other in self.others:
                    other.stop()
            finally:
                try:
                    self.job.stop()
                finally:
                    for path in self.fakes:
                        path.unlink(missing_ok=True)
                    self.fakes.clear()


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


def others_still(job: Job, held: int, timeout: float = 60) -> None:
    """Wait until every rank but `held` sits still in one syscall, seen the same twice: they wait for it."""
    seen: dict[int, Any] = {}

    def still() -> bool:
        ok = True
        for rank, loc in job.ranks.items():
            if rank == held:
                continue
            sample = _main_thread(loc.host_pid)
            if sample is None:
                raise RuntimeError(f"rank {rank} exited:\n{job.log_tail()}")
            ok = ok and seen.get(rank) == sample and sample[1] != "running"
            seen[rank] = sample
        return ok

    wait_until(still, timeout, "the other ranks to block waiting for the held one", interval=0.5)


def freeze(pid: int, version: int = 0) -> Any:
    """Freeze a process with the cgroup freezer (`version` 2: cgroup.freeze, 1: a v1 freezer cgroup; 0: v2 where
    this machine has it); returns the thaw."""
    from workers import pstate

    v2, v1 = pstate.cgroup_mounts()[0], pstate.cgroup_mounts()[1].get("freezer", "")
    version = version or (2 if v2 else 1)
    if not (v2 if version == 2 else v1):
        raise RuntimeError(f"no cgroup v{version} freezer on this machine")
    v1 = v1 if version == 1 else ""
    v2 = v2 if version == 2 else ""
    mount = v2 or v1
    if not mount:
        raise RuntimeError("no cgroup freezer on this machine")
    group = Path(mount) / f"hangscope-frozen-{os.urandom(4).hex()}"
    group.mkdir()
    control, on, off = (("cgroup.freeze", "1", "0") if version == 2 else ("freezer.state", "FROZEN", "THAWED"))
    home = next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if (line.startswith("0::") if version == 2 else "freezer" in line.split(":")[1].split(",")))
    (group / "cgroup.procs").write_text(str(pid))
    (group / control).write_text(on)

    def frozen() -> bool:
        if version == 2:
            return "frozen 1" in (group / "cgroup.events").read_text().splitlines()
        return (group / "freezer.state").read_text().strip() == "FROZEN"

    def thaw() -> None:
        (group / control).write_text(off)
        with contextlib.suppress(OSError):
            (Path(mount) / home.lstrip("/") / "cgroup.procs").write_text(str(pid))
        wait_until(lambda: not (group / "cgroup.procs").read_text().strip(), 15, "the freezer cgroup emptied")
        group.rmdir()

    try:
        wait_until(frozen, 15, f"cgroup v{version} frozen")
    except BaseException:
        thaw()
        raise
    return thaw


def start_spawn(cluster: Cluster, scenario: Scenario, timeout: float) -> Job:
    """tests/support/spawn_job.py (mp.spawn, no rank environment) on the first node, hung: rank `culprit` never reaches
    the second all_reduce."""
    node = cluster.nodes[0]
    world = scenario.nodes * scenario.ranks_per_node
    workdir = Path(tempfile.mkdtemp(prefix="hangscope-spawn-"))
    workdir.chmod(0o755)
    mark = os.urandom(4).hex()
    job = Job(scenario.name, scenario.culprit, 0, world, [node], workdir, f"{MARK}={mark}")
    ready = workdir / "ready.jsonl"
    with open(workdir / f"{node.name}.log", "wb") as log:
        job.launchers.append(node.spawn([PYTHON, str(SUPPORT / "spawn_job.py"), str(world), str(_free_port(node)),
                                         str(ready), str(scenario.culprit)],
                                        env={MARK: mark, "OMP_NUM_THREADS": "1"}, stdout=log,
                                        stderr=subprocess.STDOUT))
    try:
        def all_ready() -> bool:
            if job.launchers[0].poll() is not None:
                raise RuntimeError(f"the spawn job exited:\n{job.log_tail()}")
            return ready.exists() and len(ready.read_text().splitlines()) >= world

        wait_until(all_ready, timeout, "every spawned rank to be ready", interval=0.2)
        for line in ready.read_text().splitlines():
            d = json.loads(line)
            pid = int(d["pid"])
            host_pid = next(p.host_pid for p in node.procs() if p.pid == pid)
            job.ranks[int(d["rank"])] = RankLoc(node.name, pid, int(d["rank"]), host_pid, 0, "all_reduce")
        job.wait_blocked(timeout=60)
    except BaseException:
        job.stop()
        raise
    return job


def start_stall(running: Running, node: Node) -> str:
    """A FUSE file system that never answers (tests/support/fuse_stall.py), mounted in `node`'s mount namespace; the path
    of its one file. Stopped (and unmounted) with the scenario."""
    mnt = Path(tempfile.mkdtemp(prefix="hangscope-stall-"))
    mnt.chmod(0o755)
    proc = node.spawn([PYTHON, "-u", str(SUPPORT / "fuse_stall.py"), str(mnt)], stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT)

    def stop() -> None:
        proc.kill()
        proc.wait(timeout=15)
        node.run(["umount", "-l", str(mnt)], check=False)
        with contextlib.suppress(OSError):
            mnt.rmdir()

    running.undo.insert(0, stop)  # last: after the job's ranks are gone (stop() pops from the end)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode(errors="replace").strip()
    if line != "ready":
        raise RuntimeError(f"fuse_stall did not start on {node.name}: {line!r}")
    return str(mnt / "stalled")


def hide_cgroups(node: Node) -> Any:
    """Cover the node's cgroup file systems with an empty tmpfs (its own mount namespace only): the node can no
    longer read any cgroup's files, as in a container with a private cgroup view. Returns the undo."""
    node.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "nocgroups", "/sys/fs/cgroup"])
    return lambda: node.run(["umount", "/sys/fs/cgroup"], check=False)


class PipedStdin:
    """A node whose processes started by spawn() read their stdin from a pipe that nobody writes (as from a
    terminal nobody types in): the Popen keeps the write end open."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self.spawned: list[subprocess.Popen[Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    def spawn(self, argv: Any, env: Any = None, cwd: str = "/", **popen_kw: Any) -> subprocess.Popen[Any]:
        popen_kw["stdin"] = subprocess.PIPE
        self.spawned.append(self._node.spawn(argv, env=env, cwd=cwd, **popen_kw))
        return self.spawned[-1]

    def close(self) -> None:
        """Close the write ends (the readers see end of file)."""
        for proc in self.spawned:
            if proc.stdin is not None:
                proc.stdin.close()


# the node's metrics agent when it has stopped answering: it accepts connections and never replies (the same
# program as app/demo/job.py's STALLED_AGENT, which the demo starts when no --service is given)
STALLED_AGENT = ("import socket, sys\n"
                 "s = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n"
                 "print(s.getsockname()[1], flush=True)\n"
                 "held = []\n"
                 "while True:\n"
                 "    held.append(s.accept())\n")


def start_helper(running: Running, node: Node, kind: str) -> list[str]:
    """A process of `node` that the culprit will use, not started by the job: the job's extra arguments."""
    if kind == "agent":
        proc = node.spawn([PYTHON, "-c", STALLED_AGENT, "0"], stdout=subprocess.PIPE)
    else:
        path = Path(tempfile.mkdtemp(prefix="hangscope-cache-")) / "dataset.lock"
        path.parent.chmod(0o755)
        proc = node.spawn(["flock", "--no-fork", str(path), "sh", "-c", "echo held; exec sleep 86400"],
                          stdout=subprocess.PIPE)  # one process: killed with its nsenter (pdeathsig)

    def stop() -> None:
        proc.kill()
        proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()
        if kind == "flock":
            shutil.rmtree(path.parent, ignore_errors=True)

    running.undo.insert(0, stop)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode(errors="replace").strip()
    if kind == "agent":
        if not line.isdigit():
            raise RuntimeError(f"the agent did not start on {node.name}: {line!r}")
        return ["--service", f"127.0.0.1:{line}"]
    if line != "held":
        raise RuntimeError(f"the lock holder did not start on {node.name}: {line!r}")
    return ["--lock-file", str(path)]


def start_launchers_only(cluster: Cluster, scenario: Scenario, timeout: float) -> Job:
    """torchrun with --nnodes `nodes` on the first `launchers` nodes only (static rendezvous at node01): they wait
    in their rendezvous for the node ranks that never start; the job has no rank."""
    places = cluster.nodes[:scenario.launchers]
    workdir = Path(tempfile.mkdtemp(prefix="hangscope-startup-"))
    workdir.chmod(0o755)
    mark = os.urandom(4).hex()
    job = Job(scenario.name, None, 0, scenario.world_size, list(places), workdir, f"{MARK}={mark}")
    master = places[0]
    port = _free_port(master)
    try:
        for index, node in enumerate(places):
            argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(scenario.nodes), "--node-rank", str(index),
                    "--master-addr", master.ip, "--master-port", str(port),
                    "--nproc-per-node", str(scenario.ranks_per_node), str(JOB_SCRIPT), "--scenario", "healthy"]
            with open(workdir / f"{node.name}.log", "wb") as log:
                job.launchers.append(node.spawn(argv, env={MARK: mark, "OMP_NUM_THREADS": "1"}, stdout=log,
                                                stderr=subprocess.STDOUT))

        def joined() -> bool:
            for proc in job.launchers:
                if proc.poll() is not None:
                    raise RuntimeError(f"a launcher exited with {proc.returncode}:\n{job.log_tail()}")
            out = master.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"]).stdout
            return len({line.split()[-1].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}) >= len(places)

        wait_until(joined, timeout, f"{len(places)} launchers connected to the rendezvous store", interval=0.5)
        time.sleep(2)  # each agent on to its wait for the missing node
    except BaseException:
        job.stop()
        raise
    return job


def start(cluster: Cluster, scenario: Scenario, timeout: float = 120) -> Running:
    """The scenario's job, hung (healthy, slow: training); stop() it when done."""
    if scenario.spawn:
        return Running(scenario, start_spawn(cluster, scenario, timeout), cluster)
    if scenario.launchers:
        return Running(scenario, start_launchers_only(cluster, scenario, timeout), cluster)
    extra: list[str] = []
    pre: list[Any] = []
    if scenario.helper:
        assert scenario.culprit is not None
        holder = Running(scenario, None, cluster)  # type: ignore[arg-type]
        try:
            extra += start_helper(holder, cluster.nodes[scenario.culprit // scenario.ranks_per_node], scenario.helper)
        finally:
            pre += holder.undo
    if scenario.stall:
        assert scenario.culprit is not None
        node = cluster.nodes[scenario.culprit // scenario.ranks_per_node]
        holder = Running(scenario, None, cluster)  # type: ignore[arg-type]
        extra += ["--stall-file", start_stall(holder, node)]
        pre = holder.undo
    if scenario.hold:
        extra += ["--step-delay", "0.2"]
    script = SUPPORT / scenario.script if scenario.script else None
    wait = script is None and not scenario.settle
    try:
        if scenario.stdin_pipe:
            piped = [PipedStdin(n) for n in cluster.nodes[:scenario.nodes]]
            pre.insert(0, lambda: [p.close() for p in piped])  # the last undo, before the job stops
            job = _finish(_launch(piped, scenario.name, scenario.ranks_per_node, scenario.culprit, scenario.step,
                                  extra, standalone=False), timeout, wait)
        else:
            job = start_job(cluster, scenario.job or scenario.name, nodes=scenario.nodes,
                            ranks_per_node=scenario.ranks_per_node, culprit=None if script else scenario.culprit,
                            step=scenario.step, timeout=timeout, extra_args=[] if script else extra, script=script,
                            wait=wait)
    except BaseException:
        for undo in reversed(pre):
            undo()
        raise
    running = Running(scenario, job, cluster, undo=pre)
    try:
        if scenario.cut is not None and scenario.hold != "throttle":
            cut_between_steps(running, scenario.cut)
            job.wait_blocked(timeout=60)  # every rank now waits for data that cannot arrive
        if scenario.name == "gpu_xid":
            from gpu_fakes import install_gpu_xid
            running.fakes = install_gpu_xid(cluster, job, scenario.culprit or 0, running.names)
        if scenario.second:
            running.others.append(start_job(cluster, scenario.second, nodes=scenario.nodes,
                                            ranks_per_node=scenario.ranks_per_node, timeout=timeout,
                                            extra_args=["--step-delay", "0.2"]))
        if scenario.hold in ("stop", "freeze"):
            assert scenario.culprit is not None
            pid = job.ranks[scenario.culprit].host_pid
            if scenario.hold == "stop":
                os.kill(pid, signal.SIGSTOP)
                running.undo.append(lambda: os.kill(pid, signal.SIGCONT))
            else:
                running.undo.append(freeze(pid, scenario.freezer))
            if scenario.hide:
                running.undo.append(hide_cgroups(cluster[job.ranks[scenario.culprit].node]))
            others_still(job, scenario.culprit)
        if scenario.hold == "throttle":
            cap = CpuCap(0.10).__enter__()
            running.undo.append(lambda: cap.__exit__(None, None, None))
            # the other nodes' ranks as if on cores of their own: served first on this shared machine, so that
            # node `cut` is slow relative to them whatever load the machine carries (tests/support/cpu_cap.py)
            favoured = CpuFavour().__enter__()
            running.undo.append(lambda: favoured.__exit__(None, None, None))
            for loc in job.ranks.values():
                (cap if loc.node == scenario.cut else favoured).add(loc.host_pid)
            if scenario.hide:
                assert scenario.cut is not None
                running.undo.append(hide_cgroups(cluster[scenario.cut]))
            time.sleep(2)  # the cap is felt at once; a few periods make it visible in the counters
        if scenario.settle == "others":
            assert scenario.culprit is not None
            others_still(job, scenario.culprit)
    except BaseException:
        running.stop()
        raise
    return running


@contextlib.contextmanager
def started(cluster: Cluster, scenario: Scenario, timeout: float = 120) -> Iterator[Running]:
    running = start(cluster, scenario, timeout)
    try:
        yield running
    finally:
        running.stop()


def hosts_text(running: Running) -> str:
    sc = running.scenario
    # slots only where one job fills the nodes: two jobs share them; mp.spawn puts every rank on one node
    slots = "" if (sc.second or sc.spawn) else f" slots={sc.ranks_per_node}"
    return "".join(f"{name}{slots}\n" for name in running.names if name != sc.leave_out)


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
    extra = (*CLI_EXTRA.get(running.scenario.name, ()), *extra)
    # --raw: a recording is the data the analysis replays (tests/data/scenarios), not a file to share
    res = run_login([sys.executable, "-m", "app", str(hosts), "--snapshot", str(out), "--raw", *UNHURRIED_LOGIN,
                     *extra], running.cluster,
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
    from app.cli.headless import session_options
    from app.hosts import parse_hosts
    from app.session import Session

    args = build_parser().parse_args(["hosts.txt", "-F", str(running.cluster.ssh_config),
                                      *CLI_EXTRA.get(running.scenario.name, ())])
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
    (tests/model/test_interning.py checks an exact round trip)."""
    for path in sorted(folder.glob("*.json")):
        text = path.read_text(encoding="utf-8")
        snap, analysis = snapshot_from_json(text)
        new = snapshot_to_json(snap, analysis) + ("\n" if text.endswith("\n") else "")
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"refreshed {path}")
    return 0


def sized(scenario: Scenario, nodes: Optional[int], ranks_per_node: Optional[int]) -> Scenario:
    """The scenario on another number of nodes and ranks per node (its culprit, cut and left-out node kept)."""
    return dataclasses.replace(scenario, nodes=nodes or scenario.nodes,
                               ranks_per_node=ranks_per_node or scenario.ranks_per_node)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                    help=f"one or more of {', '.join(SCENARIOS)} (default: all)")
    ap.add_argument("--out", type=Path, default=GOLDEN_DIR, help=f"output directory ({GOLDEN_DIR})")
    ap.add_argument("--refresh", action="store_true",
                    help="re-dump the recorded snapshots in --out with today's model (after a model change) "
                         "instead of recording new ones; no cluster needed")
    ap.add_argument("--nodes", type=int, help="run each scenario on this many nodes (default: its own)")
    ap.add_argument("--ranks-per-node", type=int, help="and this many ranks per node")
    args = ap.parse_args(argv)
    if args.refresh:
        return refresh(args.out)
    names = args.scenarios or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    chosen = [sized(SCENARIOS[n], args.nodes, args.ranks_per_node) for n in names]
    with build_cluster(max(s.nodes for s in chosen)) as cluster:
        for scenario in chosen:
            with started(cluster, scenario) as running:
                for path in record(running, args.out):
                    size = path.stat().st_size
                    json.loads(path.read_text(encoding="utf-8"))  # whole and valid before the next job
                    print(f"  wrote {path} ({size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
