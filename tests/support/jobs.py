"""Start the demo job (app/demo/job.py) with torchrun on the test cluster or locally, and wait until it hangs.

`start_job(cluster, "dataloader", ...)` launches one torchrun per node (static rendezvous at node01), waits
for every rank's ready line (app/demo/job.py writes it just before the call it hangs in), then until every
rank's main thread really sleeps in the kernel, and returns a `Job` that knows each rank's node and pid.
`start_local_job(...)` does the same on this machine with `torchrun --standalone`, no SSH.
Every process of a job carries HANGSCOPE_TEST_JOB=<id> in its environment; stop() kills by that mark, which
also catches ranks that torchrun started in their own sessions.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from cluster import Cluster
from cluster_node import NodeProc
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO / "app" / "demo" / "job.py"
SPAWN_SCRIPT = REPO / "tests" / "support" / "spawn_job.py"
PYTHON = sys.executable  # the python with torch; the job's ranks run with it on every node
MARK = "HANGSCOPE_TEST_JOB"
FOREVER = ("healthy", "netcut")  # scenarios that keep training: ready means "trained a few steps"
BLOCKED_FOR = 0.3  # seconds a main thread must sit unchanged in one syscall to count as blocked


class Place(Protocol):
    """Where a job's launcher runs: a cluster Node, or this machine (LocalPlace)."""

    name: str

    def spawn(self, argv: Sequence[str] | str, env: Mapping[str, str] | None = None, cwd: str = "/",
              **popen_kw: Any) -> subprocess.Popen[Any]: ...

    def procs(self) -> list[NodeProc]: ...


class LocalPlace:
    """This machine as a Place: pids are host pids."""

    def __init__(self) -> None:
        self.name = socket.gethostname()

    def spawn(self, argv: Sequence[str] | str, env: Mapping[str, str] | None = None, cwd: str = "/",
              **popen_kw: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, cwd=cwd,
                                stdin=subprocess.DEVNULL, start_new_session=True, **popen_kw)

    def procs(self) -> list[NodeProc]:
        return [NodeProc(int(e.name), int(e.name), "") for e in os.scandir("/proc") if e.name.isdigit()]


@dataclass(frozen=True)
class RankLoc:
    """Where one rank of a job runs, and what its ready line said."""

    node: str  # the node's name ("localhost"-like hostname for a local job)
    pid: int  # as seen inside the node (what hangscope reports)
    local_rank: int
    host_pid: int  # as seen by the tests; 0 for a rank that had already exited
    step: int  # the loop step its ready line reported
    where: str  # all_reduce, data_loading, exit, training

    @property
    def pid_in_node(self) -> int:
        return self.pid


@dataclass
class Job:
    """A started demo job: its ranks (after wait_ready), its files under workdir, and stop()."""

    scenario: str
    culprit: int | None
    step: int  # the hang step K
    world_size: int
    places: list[Place]
    workdir: Path
    mark: str
    launchers: list[subprocess.Popen[Any]] = field(default_factory=list)
    ranks: dict[int, RankLoc] = field(default_factory=dict)

    @property
    def ready_file(self) -> Path:
        return self.workdir / "ready.jsonl"

    def node_of(self, rank: int) -> Any:
        """The Node (or LocalPlace) where `rank` runs."""
        return next(p for p in self.places if p.name == self.ranks[rank].node)

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for place in self.places:
            with contextlib.suppress(OSError):
                text = (self.workdir / f"{place.name}.log").read_text(errors="replace").splitlines()
                out.append(f"--- {place.name} ---\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    def read_ready(self) -> list[dict[str, Any]]:
        """The ready lines written so far (each is one atomic append, so a line is whole or absent)."""
        with contextlib.suppress(FileNotFoundError):
            return [json.loads(line) for line in self.ready_file.read_text().splitlines() if line.strip()]
        return []

    def wait_ready(self, timeout: float = 90) -> None:
        """Wait for every rank's ready line; fail with the job's output if a launcher exits first."""
        def ready() -> bool:
            for proc in self.launchers:
                if proc.poll() is not None:
                    raise RuntimeError(f"a launcher exited with {proc.returncode} before the job was ready:\n"
                                       f"{self.log_tail()}")
            return len(self.read_ready()) >= self.world_size

        try:
            wait_until(ready, timeout, f"{self.world_size} ready lines in {self.ready_file}", interval=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; got {len(self.read_ready())}; job output:\n{self.log_tail()}") from None
        by_name = {p.name: p for p in self.places}
        for line in self.read_ready():
            place = by_name.get(line["host"])
            if place is None:
                raise RuntimeError(f"a rank reported host {line['host']!r}, not one of {sorted(by_name)}")
            host_pid = 0
            with contextlib.suppress(ProcessLookupError):
                host_pid = _host_pid(place, int(line["pid"]))
            self.ranks[int(line["rank"])] = RankLoc(place.name, int(line["pid"]), int(line["local_rank"]),
                                                    host_pid, int(line["step"]), str(line["where"]))

    def wait_blocked(self, timeout: float = 60) -> None:
        """Wait until every live rank's main thread sleeps in one syscall, unchanged, and exited ranks are gone."""
        first_seen: dict[int, tuple[tuple[str, str, int, int], float]] = {}

        def all_blocked() -> bool:
            now, done = time.monotonic(), True
            for rank, loc in self.ranks.items():
                sample = _main_thread(loc.host_pid) if loc.host_pid else None
                if loc.where == "exit":
                    done = done and sample is None
                    continue
                if sample is None:
                    raise RuntimeError(f"rank {rank} (pid {loc.pid} on {loc.node}) exited:\n{self.log_tail()}")
                seen = first_seen.get(rank)
                if seen is None or seen[0] != sample:
                    first_seen[rank] = (sample, now)
                    seen = first_seen[rank]
                state, syscall = sample[0], sample[1]
                done = done and state in "SD" and syscall != "running" and now - seen[1] >= BLOCKED_FOR
            return done

        try:
            wait_until(all_blocked, timeout, "every rank to block", interval=0.05)
        except TimeoutError as exc:
            detail = {r: _main_thread(loc.host_pid) for r, loc in self.ranks.items() if loc.host_pid}
            raise TimeoutError(f"{exc}: {detail}\n{self.log_tail()}") from None

    def stop(self) -> None:
        """Kill every process of the job (launchers, ranks, helpers) on every node, then remove its files."""
        # the marked processes first (torchrun among them): each host-side nsenter then reaps its own child
        killed: set[int] = set()

        def all_dead() -> bool:
            killed.update(_kill_marked(self.places, self.mark))
            return not any(_alive(pid) for pid in killed)

        wait_until(all_dead, 15, f"the processes of job {self.mark} to die")
        for proc in self.launchers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _host_pid(place: Place, pid: int) -> int:
    for proc in place.procs():
        if proc.pid == pid:
            return int(proc.host_pid)
    raise ProcessLookupError(pid)


def _main_thread(host_pid: int) -> tuple[str, str, int, int] | None:
    """(state, syscall or "running", cpu ticks, context switches) of a process's main thread; None once gone.

    A thread blocked in one call keeps all four unchanged; a thread that keeps waking up (a healthy job's
    sleep between steps) changes its context-switch count every time, however short its work.
    """
    task = f"/proc/{host_pid}/task/{host_pid}"
    try:
        stat = Path(f"{task}/stat").read_text().rsplit(")", 1)[1].split()
        syscall = Path(f"{task}/syscall").read_text().split()[0]
        status = Path(f"{task}/status").read_text()
    except (OSError, IndexError):
        return None
    if stat[0] in "ZX":
        return None
    switches = sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
    return stat[0], syscall, int(stat[11]) + int(stat[12]), switches


def _alive(host_pid: int) -> bool:
    """Running or sleeping; a zombie has released everything (its sockets) and only waits to be reaped."""
    try:
        return Path(f"/proc/{host_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def _kill_marked(places: Sequence[Place], mark: str) -> set[int]:
    """SIGKILL every process whose environment carries `mark`; returns their host pids."""
    needle = mark.encode()
    found = set()
    for place in places:
        for proc in place.procs():
            try:
                environ = Path(f"/proc/{proc.host_pid}/environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found.add(proc.host_pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.host_pid, signal.SIGKILL)
    return found


def _free_port(place: Any) -> int:
    code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    if isinstance(place, LocalPlace):
        return int(subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True).stdout)
    return int(place.run([PYTHON, "-c", code]).stdout)


def _launch(places: Sequence[Place], scenario: str, ranks_per_node: int, culprit: int | None, step: int,
            extra_args: Sequence[str], standalone: bool, extra_env: Mapping[str, str] | None = None,
            script: Path | None = None) -> Job:
    workdir = Path(tempfile.mkdtemp(prefix="hangscope-job-"))
    workdir.chmod(0o755)
    if culprit is None and scenario not in FOREVER and script is None:
        culprit = len(places) * ranks_per_node - 1  # the job's own default: the last rank
    job = Job(scenario, culprit, step, len(places) * ranks_per_node, list(places), workdir,
              f"{MARK}={secrets.token_hex(4)}")
    master = places[0]
    rendezvous = (["--standalone"] if standalone else
                  ["--nnodes", str(len(places)), "--master_addr", master.ip, "--master_port", str(_free_port(master))])
    job_args = ["--scenario", scenario, "--hang-step", str(step), *extra_args] if script is None else [*extra_args]
    if culprit is not None and script is None:
        job_args += ["--culprit", str(culprit)]
    env = {"HANGSCOPE_READY_FILE": str(job.ready_file), MARK: job.mark.split("=", 1)[1],
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    try:
        for index, place in enumerate(places):
            node_rank = [] if standalone else ["--node_rank", str(index)]
            argv = [PYTHON, "-m", "torch.distributed.run", *rendezvous, *node_rank,
                    "--nproc_per_node", str(ranks_per_node), str(script or JOB_SCRIPT), *job_args]
            with open(workdir / f"{place.name}.log", "wb") as log:
                job.launchers.append(place.spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    except BaseException:
        job.stop()
        raise
    return job


def _finish(job: Job, timeout: float, wait: bool) -> Job:
    try:
        job.wait_ready(timeout)
        if wait and job.scenario not in FOREVER:
            job.wait_blocked(timeout)
    except BaseException:
        job.stop()
        raise
    return job


def start_job(cluster: Cluster, scenario: str, nodes: int = 4, ranks_per_node: int = 2,
              culprit: int | None = None, step: int = 3, timeout: float = 90,
              extra_args: Sequence[str] = (), wait: bool = True, script: Path | None = None) -> Job:
    """torchrun on the first `nodes` nodes; returns once all ranks are ready (and blocked, for hangs).
    `script`: another training script than the demo job, given only `extra_args`; it writes the same ready
    lines (tests/support/ddp_train.py); `scenario` then only names the job."""
    if nodes > len(cluster.nodes):
        raise ValueError(f"the cluster has {len(cluster.nodes)} nodes, not {nodes}")
    job = _launch(cluster.nodes[:nodes], scenario, ranks_per_node, culprit, step, extra_args, standalone=False,
                  script=script)
    return _finish(job, timeout, wait)


@dataclass
class SpawnJob:
    """A hung torch.multiprocessing.spawn job on this machine (tests/support/spawn_job.py): no rank environment;
    the last rank never reaches the second all_reduce, the others wait in it."""

    launcher: subprocess.Popen[Any]
    port: int  # its store's, on 127.0.0.1
    ranks: dict[int, int]  # rank -> pid

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.launcher.pid, signal.SIGKILL)
        self.launcher.wait()


def start_local_spawn_job(ready_dir: Path, world: int = 2, timeout: float = 120) -> SpawnJob:
    """mp.spawn of `world` ranks on this machine; returns once every rank has written its ready line."""
    ready = ready_dir / "spawn-ready.jsonl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = subprocess.Popen([PYTHON, str(SPAWN_SCRIPT), str(world), str(port), str(ready)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    job = SpawnJob(launcher, port, {})

    def lines() -> list[dict[str, Any]]:
        if launcher.poll() is not None:
            raise RuntimeError(f"the spawn job exited with {launcher.returncode} before its ranks were ready")
        with contextlib.suppress(FileNotFoundError):
            return [json.loads(line) for line in ready.read_text().splitlines() if line.strip()]
        return []

    try:
        wait_until(lambda: len(lines()) >= world, timeout, f"{world} spawned ranks ready")
        job.ranks = {int(d["rank"]): int(d["pid"]) for d in lines()}
    except BaseException:
        job.stop()
        raise
    return job


def start_local_job(scenario: str, nproc: int = 4, culprit: int | None = None, step: int = 3,
                    timeout: float = 90, extra_args: Sequence[str] = (), wait: bool = True,
                    extra_env: Mapping[str, str] | None = None) -> Job:
    """`torchrun --standalone` on this machine (no SSH); same Job as start_job, pids are host pids."""
    job = _launch([LocalPlace()], scenario, nproc, culprit, step, extra_args, standalone=True, extra_env=extra_env)
    return _finish(job, timeout, wait)
