"""Real open-source training scripts, unmodified, as jobs on the test cluster (tests/oss/README.md).

- nanoGPT's train.py (tests/oss/nanogpt/), configured by a config file in nanoGPT's own format
  (tests/oss/nanogpt_cpu_ddp.py: DDP with gloo on CPU, a tiny model) and `--key=value` flags, on a data set
  written here in nanoGPT's format (train.bin/val.bin of uint16 tokens, meta.pkl with the vocabulary size).
- Lightning Fabric's language-model example (tests/oss/lightning_lm/train.py), launched by Fabric's own CLI
  (`python -m lightning.fabric.cli --accelerator=cpu --strategy=ddp --devices=2 --num-nodes=4 ...`), which
  starts torchrun; its WikiText2 data set reads ./data/wikitext-2.txt, written here (random words).

Neither script writes the ready lines the demo job does: a job is ready once its rank 0 has logged training
iterations, and its ranks are found on the nodes by the job's mark in their environment and RANK=.
Each returned Job is tests/support/jobs.py's: stop() kills every process of the job by its mark.
"""

from __future__ import annotations

import contextlib
import pickle
import random
import re
import secrets
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from cluster import Cluster, Node
from jobs import MARK, PYTHON, REPO, Job, RankLoc, _free_port, _main_thread
from waiting import wait_until

OSS = REPO / "tests" / "oss"
NANOGPT_DIR = OSS / "nanogpt"
NANOGPT_CONFIG = OSS / "nanogpt_cpu_ddp.py"
LIGHTNING_SCRIPT = OSS / "lightning_lm" / "train.py"
VOCAB = 256


@dataclass(frozen=True)
class Kind:
    """One of the real scripts: how to launch it on a node and when its job is training."""

    name: str
    script: Path
    # argv for node `index` of `nodes` (rendezvous at master_ip:port); cwd where it runs
    argv: Callable[[int, int, int, str, int, Path, Sequence[str]], list[str]]
    cwd: Callable[[Path], Path]
    prepare: Callable[[Path], None]  # writes the data set under the job's workdir
    trained: "re.Pattern[str]"  # rank 0's log line that says an iteration finished; group 1: its number
    ready_after: int  # iterations logged before the job counts as training


def _nanogpt_data(workdir: Path) -> None:
    """nanoGPT's data set format (data/*/prepare.py): uint16 token ids in train.bin and val.bin, meta.pkl."""
    data = workdir / "data"
    data.mkdir()
    rng = random.Random(1337)
    for name, count in (("train.bin", 200_000), ("val.bin", 20_000)):
        tokens = bytearray()
        for _ in range(count):
            tokens += rng.randrange(VOCAB).to_bytes(2, "little")
        (data / name).write_bytes(bytes(tokens))
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": VOCAB}, f)
    (workdir / "out").mkdir()


def _nanogpt_argv(index: int, nodes: int, per_node: int, master: str, port: int, workdir: Path,
                  flags: Sequence[str]) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node_rank", str(index),
            "--master_addr", master, "--master_port", str(port), "--nproc_per_node", str(per_node),
            str(NANOGPT_DIR / "train.py"), str(NANOGPT_CONFIG), f"--dataset={workdir / 'data'}",
            f"--out_dir={workdir / 'out'}", *flags]


def _lightning_data(workdir: Path) -> None:
    """WikiText2 (lightning.pytorch.demos) reads ./data/wikitext-2.txt, words split on spaces, a line each;
    random words from a small vocabulary, enough for epochs of ~55 steps per rank at 8 ranks."""
    data = workdir / "data"
    data.mkdir()
    rng = random.Random(42)
    words = [f"w{i}" for i in range(60)]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 25))) for _ in range(30_000)]
    (data / "wikitext-2.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _lightning_argv(index: int, nodes: int, per_node: int, master: str, port: int, workdir: Path,
                    flags: Sequence[str]) -> list[str]:
    return [PYTHON, "-m", "lightning.fabric.cli", "--accelerator=cpu", "--strategy=ddp", f"--devices={per_node}",
            f"--num-nodes={nodes}", f"--node-rank={index}", f"--main-address={master}", f"--main-port={port}",
            *flags, str(LIGHTNING_SCRIPT)]


KINDS = {
    "nanogpt": Kind("nanogpt", NANOGPT_DIR / "train.py", _nanogpt_argv, lambda workdir: NANOGPT_DIR, _nanogpt_data,
                    re.compile(r"^iter (\d+): loss", re.M), 5),
    # the example logs every 200 iterations; its first line comes after every rank's first step
    "lightning": Kind("lightning", LIGHTNING_SCRIPT, _lightning_argv, lambda workdir: workdir, _lightning_data,
                      re.compile(r"^epoch: \d+ - iteration: (\d+) - loss", re.M), 0),
}


def start_oss_job(cluster: Cluster, kind: str, nodes: int = 4, ranks_per_node: int = 2,
                  flags: Sequence[str] = (), node_flags: Mapping[int, Sequence[str]] | None = None,
                  timeout: float = 300) -> Job:
    """The real script `kind` on the first `nodes` nodes, `ranks_per_node` ranks each; returns once it trains.
    `node_flags`: extra flags for some nodes (by index), as a job launched with other options on one node."""
    spec = KINDS[kind]
    places = cluster.nodes[:nodes]
    workdir = Path(tempfile.mkdtemp(prefix=f"hangscope-{kind}-"))
    workdir.chmod(0o755)
    job = Job(kind, None, 0, nodes * ranks_per_node, list(places), workdir, f"{MARK}={secrets.token_hex(4)}")
    env = {MARK: job.mark.split("=", 1)[1], "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        spec.prepare(workdir)
        port = _free_port(places[0])
        for index, place in enumerate(places):
            argv = spec.argv(index, nodes, ranks_per_node, places[0].ip, port, workdir,
                             [*flags, *(node_flags or {}).get(index, ())])
            with open(workdir / f"{place.name}.log", "wb") as log:
                job.launchers.append(place.spawn(argv, env=env, cwd=str(spec.cwd(workdir)), stdout=log,
                                                 stderr=subprocess.STDOUT))
        wait_training(job, spec, timeout)
        find_ranks(job, spec, timeout=30)
    except BaseException:
        job.stop()
        raise
    return job


def iterations(job: Job, kind: str) -> int:
    """The last iteration number rank 0 has logged (-1 before the first)."""
    log = _read(job.workdir / f"{job.places[0].name}.log")
    found = KINDS[kind].trained.findall(log)
    return int(found[-1]) if found else -1


def wait_training(job: Job, spec: Kind, timeout: float) -> None:
    def training() -> bool:
        for proc in job.launchers:
            if proc.poll() is not None:
                raise RuntimeError(f"a launcher exited with {proc.returncode} before the job trained:\n"
                                   f"{job.log_tail()}")
        return iterations(job, spec.name) >= spec.ready_after

    try:
        wait_until(training, timeout, f"{spec.name} to log iteration {spec.ready_after}", interval=0.5)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; job output:\n{job.log_tail()}") from None


def find_ranks(job: Job, spec: Kind, timeout: float) -> None:
    """Every rank of the job, by its mark and RANK= in its environment, and the script on its command line."""
    needle = job.mark.encode()
    script = str(spec.script).encode()

    def found() -> bool:
        job.ranks.clear()
        for place in job.places:
            assert isinstance(place, Node)
            for proc in place.procs():
                try:
                    environ = Path(f"/proc/{proc.host_pid}/environ").read_bytes().split(b"\0")
                    cmdline = Path(f"/proc/{proc.host_pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if needle not in environ or script not in cmdline:
                    continue
                env = dict(e.split(b"=", 1) for e in environ if b"=" in e)
                if b"RANK" in env and b"LOCAL_RANK" in env:
                    job.ranks[int(env[b"RANK"])] = RankLoc(place.name, proc.pid, int(env[b"LOCAL_RANK"]),
                                                           proc.host_pid, 0, "training")
        return sorted(job.ranks) == list(range(job.world_size))

    wait_until(found, timeout, f"the {job.world_size} ranks of {spec.name}", interval=0.5)


def cpu_ticks(job: Job) -> dict[int, int]:
    """Each rank's main-thread CPU ticks (utime + stime) now; a rank that is gone reads -1."""
    return {rank: (_main_thread(loc.host_pid) or ("", "", -1, 0))[2] for rank, loc in job.ranks.items()}


def wait_iterations(job: Job, more: int, timeout: float = 120) -> int:
    """Wait until rank 0 has logged `more` further iterations; returns the last one."""
    start = iterations(job, job.scenario)
    wait_until(lambda: iterations(job, job.scenario) >= start + more, timeout,
               f"{job.scenario} to log {more} more iterations", interval=0.2)
    return iterations(job, job.scenario)


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")
    return ""
