"""The blind process set's scenarios: how each one is set up on the test cluster, started, and held hung.

Each scenario is bench/blind/procs/train.py (a gloo job, 4 nodes x 2 ranks, torchrun on every node of a
tests/support/cluster.py cluster) with one feature switched on and the circumstances that make one rank block on
another process it started or talks to (a site tool that writes more than usual, a filter fed more than a pipe
holds, a lock held at fork, a writer process that died, a stalled node daemon, an evaluator that crashes at start,
a coprocess that buffers its answer, a child that cannot exit). `live(cluster, spec)` starts it, returns once it is
hung for good (tests/support/jobs.py's wait-until-still logic, never a sleep), and kills everything in `finally`.

What each scenario is (the culprit, the blocking call, what it waits for, who could release it) is written in
truth.json, from this set-up; nothing here reads how hangscope analyses a snapshot.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for _p in (str(REPO), str(REPO / "tests"), str(REPO / "tests" / "support")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import jobs  # noqa: E402
from cluster import Cluster, Node  # noqa: E402
from jobs import PYTHON, Job, _main_thread, start_job  # noqa: E402
from record_scenarios import others_still  # noqa: E402

TRAIN = HERE / "train.py"
SERVICES = HERE / "services.py"
NODES, RANKS_PER_NODE = 4, 2
START_TIMEOUT = 180.0  # seconds for torch to start on 8 ranks of a loaded 2-core machine


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
    notes: List[str] = field(default_factory=list)  # what the set-up did, for the record (pids, addresses)

    def node(self, name: str) -> Node:
        return self.cluster[name]

    def host_pid(self, rank: int) -> int:
        assert self.job is not None
        return self.job.ranks[rank].host_pid

    def log(self, name: str) -> str:
        assert self.job is not None
        with contextlib.suppress(OSError):
            return (self.job.workdir / f"{name}.log").read_text(errors="replace")
        return ""

    def service(self, node: Optional[Node], argv: Sequence[str]) -> subprocess.Popen:
        """Start services.py (on `node`, or on the login side when None); returns once it printed `ready`;
        killed when the scenario ends."""
        cmd = [PYTHON, "-u", str(SERVICES), *argv]
        proc = (node.spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) if node is not None else
                subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True))

        def stop() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
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
    culprits: tuple  # the ranks that block in the scenario's resource (truth.json has the same)
    feature: str  # train.py --feature
    args: List[str] = field(default_factory=list)
    ready_step: int = 3
    prepare: Optional[Callable[[Ctx], None]] = None  # before the job starts
    after: Optional[Callable[[Ctx], None]] = None  # once every rank is at its ready step, before the final wait
    wait: str = "blocked"  # blocked: every rank's main thread still in one call; others: all but the culprit
    stdin: str = ""  # the launchers' stdin: "" /dev/null, "pipe" (nobody writes), "pty" (a terminal nobody types in)


# --- the scenarios ---------------------------------------------------------------------------------------------

def fake_tool(ctx: Ctx, name: str, scripts: dict) -> None:
    """Install a FAKE site tool `name` on the PATH of each node in `scripts` (node name -> the script's text)."""
    for node_name, text in scripts.items():
        path = ctx.node(node_name).bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
        ctx.stack.callback(path.unlink, missing_ok=True)


def _py(body: str) -> str:
    return f"#!{PYTHON}\n" + body


AUDIT_OK = _py("""# FAKE site tool (bench/blind/procs): check a sample shard, print a summary
import json, sys
n = sum(1 for line in open(sys.argv[1]) if json.loads(line))
print(f"ok: {n} records")
""")
AUDIT_VERBOSE = _py("""# FAKE site tool (bench/blind/procs), node01's newer version: also warns, on stderr, about every value
# stored as a JSON float without an explicit dtype (thousands of lines for a shard)
import json, sys
n = 0
for n, line in enumerate(open(sys.argv[1]), 1):
    for j, _ in enumerate(json.loads(line)["x"]):
        print(f"shard-audit: warning: record {n} field x[{j}]: float value without dtype, assuming float32 "
              "(deprecated since schema 4)", file=sys.stderr)
print(f"ok: {n} records")
""")


def prep_audit(ctx: Ctx) -> None:
    fake_tool(ctx, "shard-audit", {name: (AUDIT_VERBOSE if name == "node01" else AUDIT_OK)
                                   for name in ctx.cluster.names[:NODES]})
    ctx.notes.append("a FAKE `shard-audit` on every node's PATH; node01's (a newer version) writes one warning per "
                     "value to stderr, ~1 MB for a shard")


NORMALIZE = _py("""# FAKE site tool (bench/blind/procs): caption normalizer, a stdin -> stdout line filter
import sys
for line in sys.stdin:
    sys.stdout.write(" ".join(line.lower().replace(",", " ,").split()) + "\\n")
""")


def prep_normalize(ctx: Ctx) -> None:
    fake_tool(ctx, "text-normalize", {name: NORMALIZE for name in ctx.cluster.names[:NODES]})
    ctx.args += ["--long-rank", "3", "--text-kb", "1024"]
    ctx.notes.append("a FAKE `text-normalize` filter on every node's PATH; rank 3 has 1 MiB of captions a step, the "
                     "others 8 KiB")


def prep_pred_dump(ctx: Ctx) -> None:
    dumps = ctx.workdir / "dumps"
    dumps.mkdir()
    (dumps / "rank2").write_text('{"step": 0, "i": 0, "pred": [0.0], "y": [0.0]}\n')
    ctx.notes.append(f"{dumps / 'rank2'} is a file left by an earlier version of the script (it wrote "
                     "dumps/rank<R> as one file): rank 2's writer process cannot create dumps/rank2/ and dies")


def prep_shard_cache(ctx: Ctx) -> None:
    for name in ctx.cluster.names[:NODES]:
        ctx.service(ctx.node(name), ["shard-cache", "--port", "8731", *(["--stall"] if name == "node03" else [])])
    ctx.args += ["--port", "8731"]
    ctx.notes.append("a shard cache daemon on 127.0.0.1:8731 on every node; node03's backend is hung: it accepts "
                     "and reads requests but never answers")


EVAL_WORKER = _py("""# FAKE site tool (bench/blind/procs): the evaluator; reads its config, connects back to the trainer
import argparse, sys
from multiprocessing.connection import Client
ap = argparse.ArgumentParser()
ap.add_argument("--connect", required=True)
ap.add_argument("--config", default="/etc/evalsvc/eval.yaml")
args = ap.parse_args()
config = open(args.config).read()
conn = Client(args.connect, family="AF_UNIX", authkey=b"blind-eval")
while True:
    conn.recv()
""")


def prep_eval(ctx: Ctx) -> None:
    fake_tool(ctx, "eval-worker", {"node04": EVAL_WORKER})
    ctx.args += ["--side-rank", "7"]
    ctx.notes.append("a FAKE `eval-worker` on node04's PATH; its config /etc/evalsvc/eval.yaml does not exist on "
                     "node04, so it exits with FileNotFoundError before it connects")


VOCAB_FLUSHED = _py("""# FAKE site tool (bench/blind/procs): vocabulary lookup coprocess, one answer line per request line
import sys
for n, line in enumerate(sys.stdin):
    print(f"ok {n} " + ",".join(str(hash(w) % 50000) for w in line.split("tokens=")[-1].strip().split(",")),
          flush=True)
""")
VOCAB_BUFFERED = _py("""# FAKE site tool (bench/blind/procs), node04's rewritten version: same protocol, but it writes its answers
# through its own stream on fd 1 and no longer flushes them (a stream on a pipe is block-buffered)
import os, sys
out = os.fdopen(sys.stdout.fileno(), "w")
for n, line in enumerate(sys.stdin):
    out.write(f"ok {n} " + ",".join(str(hash(w) % 50000) for w in line.split("tokens=")[-1].strip().split(",")) + "\\n")
""")


def prep_vocab(ctx: Ctx) -> None:
    fake_tool(ctx, "vocab-lookup", {name: (VOCAB_BUFFERED if name == "node04" else VOCAB_FLUSHED)
                                    for name in ctx.cluster.names[:NODES]})
    ctx.notes.append("a FAKE `vocab-lookup` coprocess on every node's PATH; node04's does not flush its answers")


SPECS: List[Spec] = [
    Spec("popen_wait_stderr_full", (0,), "audit", prepare=prep_audit),
    Spec("join_before_queue_get", (1,), "shard_index", ["--big-rank", "1"]),
    Spec("mpqueue_put_writer_died", (2,), "pred_dump", prepare=prep_pred_dump),
    Spec("stdin_write_filter_blocked", (3,), "normalize", prepare=prep_normalize),
    Spec("apply_async_stalled_daemon", (4,), "manifest", prepare=prep_shard_cache),
    Spec("executor_fork_held_lock", (5,), "feature_stats", ["--side-rank", "5"]),
    Spec("coprocess_unflushed_reply", (6,), "vocab", prepare=prep_vocab),
    Spec("listener_accept_child_crashed", (7,), "async_eval", prepare=prep_eval),
]
BY_NAME = {s.name: s for s in SPECS}


class _Launch:
    """A cluster node as tests/support/jobs.py's Place whose launches get `stdin` (a pipe or a terminal)."""

    def __init__(self, node: Node, stdin: int) -> None:
        self._node, self._stdin = node, stdin

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    def spawn(self, argv: Any, env: Any = None, cwd: str = "/", **popen_kw: Any) -> subprocess.Popen:
        popen_kw.setdefault("stdin", self._stdin)
        return self._node.spawn(argv, env=env, cwd=cwd, **popen_kw)


def _start(ctx: Ctx, wait: bool) -> Job:
    spec = ctx.spec
    args = ["--feature", spec.feature, "--workdir", str(ctx.workdir), "--ready-step", str(spec.ready_step),
            *spec.args, *ctx.args]
    if not spec.stdin:
        return start_job(ctx.cluster, spec.name, nodes=NODES, ranks_per_node=RANKS_PER_NODE, timeout=START_TIMEOUT,
                         extra_args=args, wait=wait, script=TRAIN)
    if spec.stdin == "pipe":
        fd, keep = os.pipe()  # the launching session holds the write end and never writes
    else:
        keep, fd = os.openpty()  # the terminal the job was started from; nobody types in it
    ctx.stack.callback(os.close, keep)
    try:
        places = [_Launch(node, fd) for node in ctx.cluster.nodes[:NODES]]
        job = jobs._launch(places, spec.name, RANKS_PER_NODE, None, spec.ready_step, args, standalone=False,
                           script=TRAIN)
    finally:
        os.close(fd)
    return jobs._finish(job, START_TIMEOUT, wait)


@contextlib.contextmanager
def live(cluster: Cluster, spec: Spec) -> Iterator[Ctx]:
    """The scenario's job, hung; everything it started is killed and removed on exit."""
    with contextlib.ExitStack() as stack:
        # a neutral name: the headline may quote paths under it, and the scenario's name holds scoring words
        # (the first run's workdirs were named hangscope-blind-<scenario>-*; see FIRST-RUN.md)
        workdir = Path(tempfile.mkdtemp(prefix="hangscope-blind-job-"))
        workdir.chmod(0o755)
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        ctx = Ctx(cluster, spec, workdir, stack)
        if spec.prepare is not None:
            spec.prepare(ctx)
        blocked_at_start = spec.wait == "blocked" and spec.after is None
        ctx.job = _start(ctx, wait=blocked_at_start)
        stack.callback(ctx.job.stop)
        if spec.after is not None:
            spec.after(ctx)
        if spec.wait == "blocked":
            if not blocked_at_start:
                ctx.job.wait_blocked(timeout=120)
        else:
            for culprit in spec.culprits:
                others_still(ctx.job, culprit, timeout=120)
        for culprit in spec.culprits:  # the culprit is where the set-up put it: at its ready step, alive
            if _main_thread(ctx.host_pid(culprit)) is None:
                raise RuntimeError(f"{spec.name}: rank {culprit} exited:\n{ctx.job.log_tail()}")
        yield ctx
