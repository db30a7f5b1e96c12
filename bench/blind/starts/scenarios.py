"""The blind start-up set's scenarios: how each one is set up on the test cluster, started, and held hung.

Each scenario is bench/blind/starts/train.py (a gloo job, 4 nodes x 2 ranks, torchrun on every node of a
tests/support/cluster.py cluster) with one start-up feature switched on and the circumstances that make one rank hang
before or around its first step (in its set-up, in what the ranks share through files, locks and the c10d store)
while the others wait for it (in init_process_group, a barrier, a collective, new_group). `live(cluster, spec)`
starts it, returns once it is hung for good (wait-until logic: every waiting rank's main thread still in one call,
seen the same twice, and the culprit's threads unchanged for SETTLE seconds, or for a culprit that polls, the others
only; never a sleep that hopes), and kills everything in `finally` (the job, the node services, the node-local
folders it used).

What each scenario is (the culprit, the blocking call, what it waits for, who could release it) is written in
truth.json, from this set-up; nothing here reads how hangscope analyses a snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(REPO / "tests"), str(REPO / "tests" / "support")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cluster import Cluster, Node  # noqa: E402
from jobs import PYTHON, Job, _main_thread, start_job  # noqa: E402
from waiting import wait_until  # noqa: E402

TRAIN = HERE / "train.py"
SERVICES = HERE / "services.py"
NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE
START_TIMEOUT = 180.0  # seconds for torch to start on 8 ranks of a loaded 2-core machine
SETTLE = 3.0  # seconds the culprit's threads must sit unchanged to count as hung for good
SETTLE_TIMEOUT = 120.0
# the node-local folders train.py uses (each node has its own /run); removed on every node after each scenario
NODE_LOCAL = ("/run/train-stage", "/run/kernel-cache", "/run/train-data", "/run/tokenizer")


def node_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE + 1:02d}"


@dataclass
class Ctx:
    """One scenario being set up and run: its cluster, its shared folder, the job's arguments, the job."""

    cluster: Cluster
    spec: "Spec"
    workdir: Path
    stack: contextlib.ExitStack
    args: List[str] = field(default_factory=list)
    job: Optional[Job] = None
    launch: Any = None  # the cluster the launchers are started on (one node's launcher with a held stdin), or None
    notes: List[str] = field(default_factory=list)  # what the set-up did, for the record (pids, addresses)
    extra: Dict[str, Any] = field(default_factory=dict)

    def node(self, name: str) -> Node:
        return self.cluster[name]

    def host_pid(self, rank: int) -> int:
        assert self.job is not None
        return self.job.ranks[rank].host_pid

    def node_sh(self, name: str, script: str) -> None:
        """A shell command inside node `name` (its own /run)."""
        self.node(name).run(["sh", "-c", script])

    def service(self, node: Node, argv: Sequence[str]) -> subprocess.Popen:
        """Start services.py on `node`; returns once it printed `ready`; killed when the scenario ends."""
        proc = node.spawn([PYTHON, "-u", str(SERVICES), *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        def stop() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=15)
            if proc.stdout is not None:
                proc.stdout.close()

        self.stack.callback(stop)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode(errors="replace").strip()
        if line != "ready":
            raise RuntimeError(f"services.py {' '.join(argv)} did not start: {line!r}")
        return proc


@dataclass
class Spec:
    name: str
    culprits: tuple  # the ranks that hang (truth.json has the same)
    feature: str  # train.py --feature
    args: List[str] = field(default_factory=list)
    prepare: Optional[Callable[[Ctx], None]] = None  # before the job starts
    polls: bool = False  # the culprit polls (wakes up every second): hung for good once the others sit still


# --- the set-ups -------------------------------------------------------------------------------------------------

def prep_eval(ctx: Ctx) -> None:
    """Every rank's held-out shard, eval/rank<R>.pt (64 samples); every scenario has them."""
    import torch

    folder = ctx.workdir / "eval"
    folder.mkdir()
    for rank in range(WORLD):
        gen = torch.Generator().manual_seed(50_000 + rank)
        x = torch.randn(64, 16, generator=gen)
        torch.save({"x": x, "y": x.sum(dim=1, keepdim=True) * 0.1}, folder / f"rank{rank}.pt")


def _rec_file(records: List[bytes], bad_offset: Optional[int] = None) -> bytes:
    """A raw corpus file as train.py's decoder reads it: count, offset table (8 bytes each), records (2-byte
    length + bytes)."""
    head = 4 + 8 * len(records)
    body, offsets = b"", []
    for rec in records:
        offsets.append(head + len(body))
        body += len(rec).to_bytes(2, "little") + rec
    if bad_offset is not None:
        offsets[-1] = bad_offset
    return (len(records).to_bytes(4, "little") + b"".join(o.to_bytes(8, "little") for o in offsets) + body)


def prep_corpus(ctx: Ctx) -> None:
    folder = ctx.workdir / "raw"
    folder.mkdir()
    for i in range(6):
        records = [f"the quick brown fox {i} jumps over record {j}".encode() for j in range(50)]
        (folder / f"part-{i:03d}.rec").write_bytes(_rec_file(records, bad_offset=(1 << 44) if i == 3 else None))
    ctx.notes.append("raw/part-003.rec's offset table is corrupt (its last record's offset is 2**44): the decoder "
                     "that reads it, a worker of rank 0's preprocessing pool, dies of SIGSEGV")


def prep_feature_cache(ctx: Ctx) -> None:
    import torch

    for name in ctx.cluster.names[1:NODES]:
        folder = ctx.workdir / "cache" / name
        folder.mkdir(parents=True)
        shards = []
        for i in range(4):
            torch.save(torch.randn(32, 16), folder / f"shard-{i}.pt")
            shards.append(f"shard-{i}.pt")
        (folder / "index.json").write_text(json.dumps({"shards": shards, "vocab": 16}))
        (folder / ".lock").touch()
    ctx.notes.append("cache/node02..node04 are built (index.json); cache/node01 is cold: node01's local rank 0 "
                     "(rank 0) builds it, holding cache/node01/.lock (flock) across the vocabulary all_reduce")


def prep_no_eval_shard(ctx: Ctx) -> None:
    (ctx.workdir / "eval" / "rank2.pt").unlink()
    ctx.notes.append("eval/rank2.pt is missing: rank 2 skips dist.new_group (the evaluation group), the others call it")


def shard_names(world: int = WORLD, skip: int = 3, count: int = 14) -> List[str]:
    """Data-shard names none of which hashes (crc32 % world, train.py's assignment) to rank `skip`, every other
    rank getting at least one."""
    names: List[str] = []
    seen = set()
    i = 0
    while len(names) < count or len(seen) < world - 1:
        name = f"train-{i:05d}.bin"
        owner = zlib.crc32(name.encode()) % world
        if owner != skip:
            names.append(name)
            seen.add(owner)
        i += 1
    return names


def prep_shards(ctx: Ctx) -> None:
    folder = ctx.workdir / "shards"
    folder.mkdir()
    for name in shard_names():
        (folder / name).write_bytes(b"\0" * 256)
    ctx.notes.append("shards/: names of which none hashes to rank 3 (crc32 % 8): rank 0 publishes no "
                     "data/shards/rank3 key")


def prep_stage(ctx: Ctx) -> None:
    import torch

    folder = ctx.workdir / "data"
    folder.mkdir()
    for i in range(3):
        torch.save(torch.randn(64, 16), folder / f"part-{i:03d}.pt")
    ctx.service(ctx.node("node03"), ["stage-cache", "--stage-dir", "/run/train-stage"])
    ctx.notes.append("node03: a process left from an earlier attempt's staging holds /run/train-stage/.lock "
                     "(lockf, POSIX record lock) and never finishes; node03's local rank 0 (rank 4) stages there")


def prep_kernel_cache(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        devices = [0] if name == "node03" else [0, 1]
        lines = "; ".join(f"echo '{{\"fused_linear_relu\": {{\"tile\": 32}}, \"fused_mse\": {{\"tile\": 16}}}}' "
                          f"> /run/kernel-cache/dev{d}.json" for d in devices)
        ctx.node_sh(name, f"mkdir -p /run/kernel-cache && {lines}")
    ctx.notes.append("/run/kernel-cache/dev<N>.json on every node for devices 0 and 1, except node03's dev1: rank 5 "
                     "(node03, local rank 1) autotunes on import")


def prep_extract(ctx: Ctx) -> None:
    with zipfile.ZipFile(ctx.workdir / "data.zip", "w") as z:
        for i in range(4):
            z.writestr(f"train/part-{i:03d}.csv", "".join(f"{j},{j * 0.5}\n" for j in range(200)))
    ctx.node_sh("node04", "mkdir -p /run/train-data/train && printf '0,0.0\\n1,0.5\\n' > "
                          "/run/train-data/train/part-000.csv")
    read_end, write_end = os.pipe()

    def close() -> None:
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):
                os.close(fd)

    ctx.stack.callback(close)
    ctx.launch = StdinCluster(ctx.cluster, "node04", read_end)
    ctx.notes.append("node04: /run/train-data holds a partial extraction from an earlier attempt (no .complete "
                     "stamp); node04's torchrun has a pipe as stdin whose writing end stays open (as an ssh session's)")


def prep_tokenizer(ctx: Ctx) -> None:
    vocab = {f"tok{i}": i for i in range(2000)}
    text = json.dumps({"version": "1.0", "vocab": vocab})
    (ctx.workdir / "tokenizer.json").write_text(text)
    ctx.node_sh("node04", f"mkdir -p /run/tokenizer && head -c 4096 {ctx.workdir / 'tokenizer.json'} > "
                          f"/run/tokenizer/tokenizer.json")
    ctx.notes.append("node04: /run/tokenizer/tokenizer.json is the first 4096 bytes of the tokenizer (an earlier "
                     "copy cut short): local rank 0 (rank 6) sees it exists, local rank 1 (rank 7) waits for it "
                     "to parse")


class StdinNode:
    """A node whose spawned processes (the launcher) get `fd` as stdin."""

    def __init__(self, node: Node, fd: int) -> None:
        self._node, self._fd = node, fd

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    def spawn(self, argv: Any, *a: Any, **popen_kw: Any) -> subprocess.Popen:
        popen_kw.update(stdin=self._fd)
        return self._node.spawn(argv, *a, **popen_kw)


class StdinCluster:
    """The cluster, with one node's launcher started with a held stdin."""

    def __init__(self, cluster: Cluster, name: str, fd: int) -> None:
        self._cluster = cluster
        self._wrapped = {name: StdinNode(cluster[name], fd)}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    def __getitem__(self, name: str) -> Any:
        return self._wrapped.get(name) or self._cluster[name]

    @property
    def nodes(self) -> List[Any]:
        return [self._wrapped.get(n.name, n) for n in self._cluster.nodes]


# --- hung for good --------------------------------------------------------------------------------------------

Sample = Tuple[str, str, int, int]
# threads that wake up on their own in a hung rank: gloo's transport loop sits in epoll_wait with a timeout;
# left out of the settle check (x86_64: epoll_wait, epoll_pwait)
POLLING = {"232", "281"}


def _task(path: str) -> Optional[Sample]:
    try:
        stat = Path(f"{path}/stat").read_text().rsplit(")", 1)[1].split()
        syscall = Path(f"{path}/syscall").read_text().split()[0]
        status = Path(f"{path}/status").read_text()
    except (OSError, IndexError):
        return None
    switches = sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
    return stat[0], syscall, int(stat[11]) + int(stat[12]), switches


def threads_of(pid: int) -> Dict[str, Sample]:
    out: Dict[str, Sample] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            sample = _task(f"/proc/{pid}/task/{tid}")
            if sample is not None and sample[1] not in POLLING:
                out[tid] = sample
    return out


def all_still(ctx: Ctx, timeout: float) -> None:
    """Until every rank's main thread (but a polling culprit's) sits in one system call, seen the same twice
    0.5 s apart."""
    assert ctx.job is not None
    seen: Dict[int, Any] = {}
    skip = set(ctx.spec.culprits) if ctx.spec.polls else set()

    def still() -> bool:
        ok = True
        for rank, loc in ctx.job.ranks.items():
            sample = _main_thread(loc.host_pid)
            if sample is None:
                raise RuntimeError(f"{ctx.spec.name}: rank {rank} exited:\n{ctx.job.log_tail()}")
            if rank in skip:
                continue
            ok = ok and seen.get(rank) == sample and sample[1] != "running"
            seen[rank] = sample
        return ok

    wait_until(still, timeout, "every waiting rank's main thread to sit still in one call", interval=0.5)


def wait_settled(ctx: Ctx) -> None:
    """Until the culprit's threads are unchanged for SETTLE seconds."""
    spec = ctx.spec
    seen: Dict[int, Tuple[Dict[str, Sample], float]] = {}

    def settled() -> bool:
        now, ok = time.monotonic(), True
        for rank in spec.culprits:
            pid = ctx.host_pid(rank)
            if _main_thread(pid) is None:
                raise RuntimeError(f"{spec.name}: rank {rank} exited:\n{ctx.job.log_tail() if ctx.job else ''}")
            sample = threads_of(pid)
            if rank not in seen or seen[rank][0] != sample:
                seen[rank] = (sample, now)
            ok = ok and now - seen[rank][1] >= SETTLE
        return ok

    try:
        wait_until(settled, SETTLE_TIMEOUT, "the culprit's threads to settle", interval=0.25)
    except TimeoutError as exc:
        moving = {r: threads_of(ctx.host_pid(r)) for r in spec.culprits}
        raise TimeoutError(f"{exc}: {moving}") from None


def wait_polling(ctx: Ctx) -> None:
    """A polling culprit: alive, and seen asleep between two polls (clock_nanosleep, x86_64 230) within 10 s."""
    spec = ctx.spec

    def asleep() -> bool:
        ok = True
        for rank in spec.culprits:
            sample = _main_thread(ctx.host_pid(rank))
            if sample is None:
                raise RuntimeError(f"{spec.name}: rank {rank} exited:\n{ctx.job.log_tail() if ctx.job else ''}")
            ok = ok and sample[1] == "230"
        return ok

    wait_until(asleep, 10, "the polling culprit asleep between two polls", interval=0.1)


# --- the scenarios ------------------------------------------------------------------------------------------------

SPECS: List[Spec] = [
    Spec("pool_map_worker_segfault", (0,), "preprocess", prepare=prep_corpus),
    Spec("flock_sibling_holds_over_allreduce", (1,), "feature_cache", prepare=prep_feature_cache),
    Spec("new_group_skipped_by_one_rank", (2,), "eval_group", prepare=prep_no_eval_shard),
    Spec("store_get_key_never_set", (3,), "shard_assign", prepare=prep_shards),
    Spec("lockf_stale_holder_before_init", (4,), "local_stage", prepare=prep_stage),
    Spec("import_lock_autotune_thread", (5,), "fused_kernels", prepare=prep_kernel_cache),
    Spec("unzip_prompt_on_held_stdin", (6,), "extract_data", prepare=prep_extract),
    Spec("poll_for_truncated_tokenizer", (7,), "tokenizer_copy", prepare=prep_tokenizer, polls=True),
]
BY_NAME = {s.name: s for s in SPECS}


def _start(ctx: Ctx) -> Job:
    spec = ctx.spec
    args = ["--feature", spec.feature, "--workdir", str(ctx.workdir), *spec.args, *ctx.args]
    # the job's name (Job.scenario) names nothing the nodes see; the workdir below is neutral too
    return start_job(ctx.launch or ctx.cluster, "blind", nodes=NODES, ranks_per_node=RANKS_PER_NODE,
                     timeout=START_TIMEOUT, extra_args=args, wait=False, script=TRAIN)


def _clean_nodes(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        with contextlib.suppress(Exception):
            ctx.node(name).run(["rm", "-rf", *NODE_LOCAL], check=False)


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    """The scenario's job, hung for good; everything it started is killed and removed on exit."""
    with contextlib.ExitStack() as stack:
        # a neutral name: the headline may quote paths under it, and the scenario's name holds scoring words
        workdir = Path(tempfile.mkdtemp(prefix="hangscope-blind-job-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir, stack)
        _clean_nodes(ctx)
        stack.callback(_clean_nodes, ctx)
        prep_eval(ctx)
        if spec.prepare is not None:
            spec.prepare(ctx)
        ctx.job = _start(ctx)
        stack.callback(ctx.job.stop)
        all_still(ctx, timeout=120)
        if spec.polls:
            wait_polling(ctx)
        else:
            wait_settled(ctx)
        for culprit in spec.culprits:  # the culprit is where the set-up put it: alive
            if _main_thread(ctx.host_pid(culprit)) is None:
                raise RuntimeError(f"{spec.name}: rank {culprit} exited:\n{ctx.job.log_tail()}")
        ctx.notes.append(f"culprit host pid(s): {[ctx.host_pid(r) for r in spec.culprits]}")
        yield ctx
