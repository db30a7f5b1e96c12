"""Golden snapshots of every hang scenario, recorded on the test cluster (tests/support/record_scenarios.py), analysed
again: the exact classes, findings (kind, confidence, ranks, order), iteration splits and progress.

Each golden pair is what `hangscope HOSTS --snapshot` saw of a real torch gloo job on 2-3 nodes: the second
sample (<scenario>.json) and the first (<scenario>.earlier.json, given as history, as the CLI does). Node
names and pids are the cluster's. When an analysis change moves one of these, check the new diagnosis against
the scenario before changing the expectation here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

import pytest

from app.analysis import Analysis, analyze
from app.analysis.text import summary_text
from app.model import Snapshot
from app.model.codec import snapshot_from_json

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "scenarios"
SCENARIOS = ("skip", "dataloader", "die", "netcut", "healthy", "lock", "deadlock", "order", "uneven", "stopped",
             "frozen", "spawn", "twojobs", "slow", "missing", "mismatch", "gil", "native", "pipe", "fsstall")
SCENARIOS += ("gpu_xid",)  # GPU evidence: a FAKE GPU fault on the culprit's node (tests/support/gpu_fakes.py)
SCENARIOS += ("nanogpt-healthy", "nanogpt-stopped", "lightning-healthy", "lightning-frozen")  # real scripts (tests/oss)
# development scenarios of the wait model (issue 24; tests/support/record_scenarios.py DEVELOPMENT): the five classes it names
# first, then one per kind of resource of app/analysis/sites.py
DEVELOPMENT = ("frozen_private", "frozen_private_v2", "startup", "shutdown", "loaderlock", "throttled_hidden",
               "executor", "event", "queue", "service", "subprocess", "flock", "storekey", "poll", "spin", "pdb",
               "sighandler", "asyncio", "selflock")
SCENARIOS += DEVELOPMENT
HUNG = tuple(n for n in SCENARIOS if not n.endswith("healthy") and n not in ("slow", "throttled_hidden"))


@dataclass(frozen=True)
class Expected:
    classes: tuple  # (size, rank numbers, collective), largest first
    findings: tuple  # (kind, confidence, rank numbers), in order
    splits: tuple  # (class index, iteration split text)
    progress: str  # every rank's status between the two samples ("progressing/stuck": two jobs, one of each)
    title: str  # the first finding's title starts with this
    says: tuple = ()  # words the verdict must contain: the culprit, its blocking operation, what it waits for
    not_said: tuple = ()  # words it must not contain (a thread that cannot release the wait)


EXPECTED = {
    "skip": Expected(
        classes=((4, (0, 1, 2, 3), "all_reduce"),),
        findings=(("iteration_split", "high", (2,)),),
        splits=((0, "step=3: ranks 0-1,3; step=4: rank 2"),),
        progress="stuck", title="rank 2 is 1 iteration ahead (step=4 vs 3) in `all_reduce`, at job.py:"),
    "dataloader": Expected(
        classes=((3, (0, 2, 3), "all_reduce"), (1, (1,), None)),
        # the stacks single rank 1 out; its main thread is blocked in a socket recv (its loader's peer was not
        # read: no releaser, so the wait is [medium] beside the stacks' [high])
        findings=(("minority_stack", "high", (1,)), ("blocked", "medium", (1,))),
        # the culprit's train() sits on its for-header fetching batch 3; `got` counts bytes read in _recv_exact
        splits=((0, "step=3: ranks 0,2-3"), (1, "step=3, got=0: rank 1")),
        progress="stuck", title="rank 1 is in `StreamingLoader._recv_exact` (job.py:"),
    "die": Expected(
        classes=((3, (0, 1, 2), "all_reduce"),),
        findings=(("missing_ranks", "high", ()), ("all_identical", "high", (0, 1, 2))),
        splits=((0, "step=3: ranks 0-2"),),
        progress="stuck", title="rank 3 not found (WORLD_SIZE=4)"),
    "netcut": Expected(
        classes=((3, (0, 1, 2), "all_reduce"),),
        findings=(("network_stall", "high", ()), ("all_identical", "high", (0, 1, 2))),
        splits=((0, "step=5: ranks 0-2"),),
        progress="stuck", title="every stalled socket involves node02: node02 (or its link) is the problem"),
    "healthy": Expected(
        classes=((3, (0, 2, 3), "all_reduce"), (1, (1,), None)),
        # one sample catches rank 1 between steps; the two samples show the job moving, so that is no lead
        findings=(("progressing", "high", (0, 1, 2, 3)), ("blocked", "low", (1,)), ("minority_stack", "low", (1,))),
        splits=((0, "step=28: ranks 0,2-3"), (1, "step=27: rank 1")),
        progress="progressing", title="the job is progressing: 4 of 4 ranks changed stack or iteration"),
    "lock": Expected(
        classes=((3, (0, 2, 3), "all_reduce"), (1, (1,), None)),
        # the stacks single rank 1 out; its threads say why: the lock its main thread needs is held by its
        # checkpoint-writer, which waits for an upload that never completes
        findings=(("lock_wait", "high", (1,)), ("minority_stack", "high", (1,))),
        splits=((0, "step=3: ranks 0,2-3"), (1, "step=3: rank 1")),
        progress="stuck", title="rank 1's main thread waits for `_metrics_lock`, which its thread "
                                "`checkpoint-writer` holds while it is in `CheckpointWriter.save` (job.py:"),
    "deadlock": Expected(
        classes=((3, (0, 1, 3), "all_reduce"), (1, (2,), None)),
        findings=(("lock_wait", "high", (2,)), ("minority_stack", "high", (2,))),
        splits=((0, "step=3: ranks 0-1,3"), (1, "step=3: rank 2")),
        progress="stuck", title="rank 2 is deadlocked: its thread `checkpoint-writer` and main thread wait for "
                                "each other's locks"),
    "order": Expected(
        classes=((4, (0, 1, 2, 3), "all_reduce"),),
        # one stack, one line: only the loop variable differs, and the list it runs over says why
        findings=(("iteration_split", "high", (1,)),),
        splits=((0, 'name="embed": ranks 0,2-3; name="attn": rank 1'),),
        progress="stuck", title='rank 1 iterates `names` in another order than 3 others: name="attn" where they '
                                'have name="embed" in `all_reduce`, at job.py:'),
    "uneven": Expected(
        classes=((3, (0, 1, 3), None), (1, (2,), "all_reduce")),
        # rank 2's data ran out: it left the training loop for evaluate()'s all_reduce, while the others wait in
        # DDP's gradient all_reduce inside backward (no torch.distributed frame there: collective None)
        findings=(("minority_stack", "high", (2,)),),
        splits=((0, "step=3: ranks 0-1,3"),),
        progress="stuck", title="rank 2 has left the loop `for step, batch in enumerate(loader)` (job.py:"),
    "stopped": Expected(
        classes=((3, (0, 1, 2), "all_reduce"), (1, (3,), None)),
        # stopped between two steps: the others went on into the next step's all_reduce and wait there
        findings=(("stopped", "high", (3,)), ("minority_stack", "high", (3,))),
        splits=((0, "step=4: ranks 0-2"), (1, "step=3: rank 3")),
        progress="stuck", title="rank 3 is stopped (SIGSTOP or job control); the other 3 ranks wait for it; "
                                "`kill -CONT 59` on node02 resumes it"),
    "frozen": Expected(
        classes=((3, (0, 1, 3), "all_reduce"), (1, (2,), None)),
        findings=(("frozen", "high", (2,)), ("minority_stack", "high", (2,))),
        splits=((0, "step=4: ranks 0-1,3"), (1, "step=3: rank 2")),
        progress="stuck", title="rank 2 is frozen by the cgroup freezer (v2 cgroup /hangscope-frozen-"),
    "spawn": Expected(
        classes=((3, (0, 1, 3), "all_reduce"), (1, (2,), None)),
        # numbered from the spawn target's `rank` argument (no RANK in the environment); rank 0 also runs the store
        # its main thread waits on an Event no other thread of it can set: the wait model names it first
        findings=(("blocked", "high", (2,)), ("minority_stack", "high", (2,)), ("thread_count", "low", (0,))),
        splits=(),
        progress="stuck", title="rank 2's main thread is blocked in `Event.wait` at `demo_basic` (spawn_job.py:28)"),
    "twojobs": Expected(
        # the classes are the whole node's picture (both jobs); findings are per job, the hung job first
        classes=((4, (0, 1, 1, 2), "all_reduce"), (3, (0, 2, 3), None), (1, (3,), None)),
        findings=(("minority_stack", "high", (3,)), ("blocked", "medium", (3,)), ("progressing", "high", (0, 1, 2, 3)),
                  ("minority_stack", "low", (1,)),
                  ("several_jobs", "high", (0, 1, 2, 3, 0, 1, 2, 3))),
        splits=((0, "step=3: ranks 0-2; step=17: rank 1"), (1, "step=16: ranks 0,2-3"), (2, "step=3, got=0: rank 3")),
        progress="progressing/stuck", title="job 198.18.3.11:47113: rank 3 is in `StreamingLoader._recv_exact` "
                                            "(job.py:152) while 3 others wait in `all_reduce`"),
    "slow": Expected(
        classes=((2, (0, 2), None), (1, (1,), None), (1, (3,), None)),
        # training on: the stacks differ from moment to moment (low), node02's cgroup throttles its ranks
        findings=(("progressing", "high", (0, 1, 2, 3)), ("slow_node", "high", (2, 3)), ("minority_stack", "low", (1,)),
                  ("minority_stack", "low", (3,)), ("no_locals", "low", ())),
        splits=((0, "no loop variable had a readable value"), (1, "no loop variable had a readable value"),
                (2, "no loop variable had a readable value")),
        progress="progressing", title="the job is progressing: 4 of 4 ranks moved between samples"),
    "missing": Expected(
        classes=((2, (0, 1), "all_reduce"),),
        findings=(("outside_peer", "medium", ()), ("missing_ranks", "low", ())),
        splits=((0, "step=3: ranks 0-1"),),
        progress="stuck", title="ranks 2-3 are not in the snapshot: the job runs on node02 (198.18.3.12) too, which "
                                "the hosts list leaves out"),
    "mismatch": Expected(
        classes=((3, (0, 2, 3), "all_reduce"), (1, (1,), "all_gather")),
        # one rank gathers where the others all_reduce, on the same group: neither can complete
        findings=(("different_collective", "high", (1,)),),
        splits=((0, "step=3: ranks 0,2-3"), (1, "step=3: rank 1")),
        progress="stuck", title="rank 1 is in `all_gather` (distributed_c10d.py:4287) while 3 others wait in "
                                "`all_reduce`"),
    "gil": Expected(
        classes=((3, (0, 1, 3), "all_reduce"), (1, (2,), None)),
        # py-spy: its main thread owns the GIL; /proc: it sleeps in pause(); its shard reader cannot run
        findings=(("gil_held", "high", (2,)), ("minority_stack", "high", (2,))),
        splits=((0, "step=3: ranks 0-1,3"), (1, "step=3: rank 2")),
        progress="stuck", title="rank 2's main thread holds the GIL while blocked in native code called from "
                                "`native_wait` (job.py:250): it sleeps in `pause`"),
    "native": Expected(
        classes=((3, (0, 1, 2), "all_reduce"), (1, (3,), None)),
        findings=(("native_call", "high", (3,)), ("minority_stack", "high", (3,))),
        splits=((0, "step=3: ranks 0-2"), (1, "step=3: rank 3")),
        progress="stuck", title="rank 3's main thread is inside a native call that does not return, made at "
                                "`native_wait` (job.py:250): it sleeps in `pause` with the GIL released"),
    "pipe": Expected(
        classes=((3, (0, 2, 3), "all_reduce"), (1, (1,), None)),
        # /proc: write() with the kernel in (anon_)pipe_write; the pipe's reader from /proc/*/fd
        findings=(("pipe_write", "high", (1,)), ("minority_stack", "high", (1,))),
        splits=((0, "step=3: ranks 0,2-3"), (1, "step=3: rank 1")),
        progress="stuck", title="rank 1's main thread is blocked writing to a full pipe in `LogShipper.log` "
                                "(job.py:277): pid 83 `sleep 86400` (its child), which holds its read end, does "
                                "not read"),
    "fsstall": Expected(
        classes=((3, (0, 1, 3), "all_reduce"), (1, (2,), None)),
        # the process state (D, with the file it waits on) outranks where its stack is
        findings=(("uninterruptible", "high", (2,)), ("minority_stack", "high", (2,))),
        splits=((0, "step=3: ranks 0-1,3"), (1, "step=3: rank 2")),
        progress="stuck", title="rank 2 is in uninterruptible sleep (D): waiting on I/O or a driver "
                                "(/tmp/hangscope-stall-"),
}
EXPECTED["gpu_xid"] = Expected(
    classes=((3, (0, 1, 2), "all_reduce"), (1, (3,), None)),
    # rank 3 never returns from device_synchronize; its node's (FAKE) kernel log has a fresh Xid 79 for the GPU
    # nvidia-smi's process list puts it on, NCCL RAS counts one AllReduce fewer for it in both samples, and a
    # week-old Xid 63 on the other GPU is said to predate the hang
    findings=(("gpu_fault", "high", (3,)), ("nccl_ras", "high", (3,)), ("blocked", "high", (3,)),
              ("minority_stack", "high", (3,)), ("gpu_fault", "low", ())),
    splits=((0, "step=3: ranks 0-2"), (1, "step=3: rank 3")),
    progress="stuck", title="rank 3 on node02: its GPU 1 (0000:5d:00) reported Xid 79, GPU has fallen off the bus")
# Real open-source training scripts, unmodified, 4 nodes x 2 ranks (tests/support/record_oss.py). nanoGPT's loop and its
# counters are at module level: no loop variable is readable. One sample caught rank 0 in its forward while the
# others were in backward; the samples show every rank moving, so that is no lead.
EXPECTED["nanogpt-healthy"] = Expected(
    classes=((7, (1, 2, 3, 4, 5, 6, 7), None), (1, (0,), None)),
    findings=(("progressing", "high", (0, 1, 2, 3, 4, 5, 6, 7)), ("minority_stack", "low", (0,)),
              ("no_locals", "low", ())),
    splits=((0, "no loop variable had a readable value"), (1, "no loop variable had a readable value")),
    progress="progressing", title="the job is progressing: 8 of 8 ranks moved between samples")
# the others wait in DDP's all_reduce inside backward, at the stopped rank's line: the state is the answer
EXPECTED["nanogpt-stopped"] = Expected(
    classes=((8, (0, 1, 2, 3, 4, 5, 6, 7), None),),
    findings=(("stopped", "high", (5,)), ("all_identical", "low", (0, 1, 2, 3, 4, 5, 6, 7)), ("no_locals", "low", ())),
    splits=((0, "no loop variable had a readable value"),),
    progress="stuck", title="rank 5 is stopped (SIGSTOP or job control); the other 7 ranks wait for it; `kill -CONT")
EXPECTED["lightning-healthy"] = Expected(
    classes=((8, (0, 1, 2, 3, 4, 5, 6, 7), None),),
    findings=(("progressing", "high", (0, 1, 2, 3, 4, 5, 6, 7)), ("all_identical", "low", (0, 1, 2, 3, 4, 5, 6, 7))),
    splits=((0, "epoch=0, batch_idx=2: ranks 0-7"),),
    progress="progressing", title="the job is progressing: 8 of 8 ranks moved between samples")
EXPECTED["lightning-frozen"] = Expected(
    classes=((8, (0, 1, 2, 3, 4, 5, 6, 7), None),),
    findings=(("frozen", "high", (5,)), ("all_identical", "low", (0, 1, 2, 3, 4, 5, 6, 7))),
    splits=((0, "epoch=0, batch_idx=3: ranks 0-7"),),
    progress="stuck", title="rank 5 is frozen by the cgroup freezer (v2 cgroup /hangscope-test-")

# The development scenarios, each checked by hand against its set-up (app/demo/job.py, tests/support/record_scenarios.py).
# Where today's analysis is wrong, the expectation below is the right one and the scenario is in WRONG_NOW: its
# tests are expected to fail (strict: they turn red once the analysis gets it right, to be moved out of WRONG_NOW).
EXPECTED["frozen_private"] = Expected(
    classes=((3, (0, 2, 3), "all_reduce"), (1, (1,), "all_reduce")),
    # a v1 freezer on a node that cannot see its cgroup: this recording froze rank 1 inside its own `all_reduce`
    # (its main thread D in the freezer's wait, its other threads D in `__refrigerator`): frozen; its stack alone
    # differs only below the collective, so the stacks single it out at [low]
    findings=(("frozen", "high", (1,)), ("minority_stack", "low", (1,))),
    splits=((0, "step=4: ranks 0,2-3"), (1, "step=4: rank 1")),
    progress="stuck", title="rank 1 is frozen by the cgroup freezer", says=("rank 1", "frozen", "cgroup freezer"),
    not_said=("uninterruptible",))
EXPECTED["frozen_private_v2"] = Expected(
    classes=((3, (0, 1, 3), "all_reduce"), (1, (2,), None)),
    # node01's ranks waited for a CPU while the recording ran beside other work: a [low] slow node, below the freezer
    findings=(("frozen", "high", (2,)), ("minority_stack", "high", (2,)), ("slow_node", "low", (0, 1))),
    splits=((0, "step=4: ranks 0-1,3"), (1, "step=3: rank 2")),
    progress="stuck", title="rank 2 is frozen by the cgroup freezer (asleep in the kernel's freezer wait `get_signal`; "
                            "the node's view of the cgroup file system does not show which cgroup)",
    says=("rank 2", "frozen", "cgroup freezer"))
EXPECTED["startup"] = Expected(
    classes=(),
    # torchrun --nnodes 4 on node01-node03 (node ranks 0-2); node04, in the hosts list, runs none
    findings=(("launch_incomplete", "high", ()), ("launchers_only", "high", ()), ("missing_ranks", "medium", ())),
    splits=(),
    progress="", title="job 198.18.4.11:55383 never started: its launchers were told --nnodes 4 and run as node ranks "
                       "0-2, so the rendezvous waits for node rank 3 (node04",
    says=("node04", "node rank 3", "rendezvous"))
EXPECTED["shutdown"] = Expected(
    classes=((3, (0, 1, 3), "all_reduce"), (1, (2,), None)),
    findings=(("blocked", "high", (2,)), ("minority_stack", "high", (2,))),
    # rank 2's path has loops only in threading.py (_shutdown's): a library's loop is no iteration of the job's
    splits=((0, "step=3: ranks 0-1,3"),),
    progress="stuck", title="rank 2's main thread is blocked in `interpreter shutdown`, its main program has ended",
    # the error that ended it (its stderr file's RuntimeError) and the one non-daemon thread (`_shutdown`'s `locks`
    # holds one lock); `shard-reader` is a daemon thread, which the interpreter does not wait for
    says=("rank 2", "main program", "RuntimeError", "metrics-uploader"), not_said=("shard-reader",))
EXPECTED["loaderlock"] = Expected(
    classes=((3, (0, 2, 3), "all_reduce"), (1, (1,), None)),
    findings=(("blocked", "high", (1,)), ("minority_stack", "high", (1,))),
    splits=((0, "step=3: ranks 0,2-3"), (1, "step=3: rank 1")),
    progress="stuck", title="rank 1's main thread is blocked in `DataLoader next batch` at `train_patterns` (job.py:710)",
    says=("rank 1", "DataLoader", "time.sleep", ".lock"))
EXPECTED["throttled_hidden"] = Expected(
    classes=((3, (1, 2, 3), None), (1, (0,), None)),
    # node01 cannot read its cgroup's counters: slow from its ranks' time waiting for a CPU; the sample caught
    # rank 0 a step ahead, between iterations (a [low] stack and split: the job moves)
    findings=(("progressing", "high", (0, 1, 2, 3)), ("slow_node", "high", (0, 1)), ("minority_stack", "low", (0,)),
              ("iteration_split", "low", (1,))),
    splits=((0, "micro_step=3: ranks 2-3; micro_step=2: rank 1"), (1, "iter_num=15, micro_step=1: rank 0")),
    progress="progressing", title="the job is progressing: 4 of 4 ranks moved between samples",
    says=("progressing", "node01 is slow"))
EXPECTED["executor"] = Expected(
    classes=((3, (1, 2, 3), "all_reduce"), (1, (0,), None)),
    findings=(("blocked", "high", (0,)), ("minority_stack", "high", (0,)), ("slow_node", "low", (0, 1))),
    splits=((0, "step=3: ranks 1-3"), (1, "step=3: rank 0")),
    progress="stuck", title="rank 0's main thread is blocked in `Future.result` at `AsyncCheckpointer.save` (job.py:522)",
    says=("rank 0", "Future.result", "ckpt-upload", "recv"))
EXPECTED["event"] = Expected(
    classes=((3, (0, 1, 2), "all_reduce"), (1, (3,), None)),
    findings=(("blocked", "high", (3,)), ("minority_stack", "high", (3,))),
    splits=((0, "step=3: ranks 0-2"), (1, "step=3: rank 3")),
    progress="stuck", title="rank 3's main thread is blocked in `Event.wait` at `train_patterns` (job.py:721)",
    # its setter, thread `shard-lister`, died (KeyError); `shard-reader` (the loader's) never sets it
    says=("rank 3", "Event.wait", "lister.ready"), not_said=("shard-reader",))
EXPECTED["queue"] = Expected(
    classes=((3, (0, 2, 3), "all_reduce"), (1, (1,), None)),
    findings=(("blocked", "high", (1,)), ("minority_stack", "high", (1,)), ("thread_count", "low", (1,))),
    splits=((0, "step=3: ranks 0,2-3"), (1, "step=3: rank 1")),
    progress="stuck", title="rank 1's main thread is blocked in `queue.Queue.get` at `train_patterns` (job.py:709)",
    # its producer, thread `batch-producer`, has ended (11 threads where the others have 12); `shard-reader` never puts
    says=("rank 1", "queue.Queue.get", "shards"), not_said=("shard-reader",))
EXPECTED["service"] = Expected(
    classes=((3, (0, 1, 3), "all_reduce"), (1, (2,), None)),
    findings=(("blocked", "high", (2,)), ("minority_stack", "high", (2,))),
    splits=((0, "step=3: ranks 0-1,3"), (1, "step=3: rank 2")),
    progress="stuck", title="rank 2's main thread is blocked in `socket.recv` at `report_metrics` (job.py:563)",
    # the peer: the metrics agent on its own node, 127.0.0.1:44815, pid 407 (its socket's inode in pid 407's fds)
    says=("rank 2", "socket.recv", "127.0.0.1:44815", "pid 407"))
EXPECTED["subprocess"] = Expected(
    classes=((3, (1, 2, 3), "all_reduce"), (1, (0,), None)),
    findings=(("blocked", "high", (0,)), ("minority_stack", "high", (0,))),
    splits=((0, "step=3: ranks 1-3"), (1, "step=3: rank 0")),
    progress="stuck", title="rank 0's main thread is blocked in `subprocess.run` at `run_hook` (job.py:568)",
    says=("rank 0", "subprocess.run", "tail -f"))
EXPECTED["flock"] = Expected(
    classes=((3, (0, 1, 2), "all_reduce"), (1, (3,), None)),
    findings=(("blocked", "high", (3,)), ("minority_stack", "high", (3,))),
    splits=((0, "step=3: ranks 0-2"), (1, "step=3: rank 3")),
    progress="stuck", title="rank 3's main thread is blocked in `fcntl.flock` at `build_dataset_cache` (job.py:575)",
    # the lock file (its fd's path) and its holder (/proc/locks), `flock ... sleep 86400` on node02
    says=("rank 3", "fcntl.flock", "dataset.lock", "held by pid", "sleep 86400"))
EXPECTED["storekey"] = Expected(
    classes=((3, (0, 1, 3), "all_reduce"), (1, (2,), None)),
    # its main thread's store.wait: [medium] beside the stacks, since which rank should set the key is not known
    findings=(("minority_stack", "high", (2,)), ("blocked", "medium", (2,))),
    splits=((0, "step=3: ranks 0-1,3"), (1, "step=3: rank 2")),
    progress="stuck", title="rank 2 is in `collect_eval` (job.py:587) while 3 others wait in `all_reduce`",
    # store.wait for eval/3/rank0-3 (the `keys` local); the ranks wrote eval/4/rank* (a near-miss)
    says=("rank 2", "store", "eval/3/rank"))
EXPECTED["poll"] = Expected(
    classes=((3, (0, 2, 3), "all_reduce"), (1, (1,), None)),
    findings=(("blocked", "high", (1,)), ("minority_stack", "high", (1,)), ("still_running", "high", (1,))),
    splits=((0, "step=3: ranks 0,2-3"), (1, "step=3, attempt=8: rank 1")),
    progress="progressing/stuck", title="rank 1's main thread is sleeping in `time.sleep` at `wait_for_commit` (job.py:596)",
    # what it polls for: the checkpoint's COMMITTED marker (the loop's `if os.path.exists(...)`)
    says=("rank 1", "time.sleep", "COMMITTED"))
EXPECTED["spin"] = Expected(
    classes=((3, (0, 1, 2), "all_reduce"), (1, (3,), None)),
    # rank 3 spins (state R both samples, same frame, the GIL held) on a 2-core machine under load: 36 % of a core;
    # its node's ranks waiting for a CPU are the spin's doing, not a slow node: no [high] slow node (here [low])
    findings=(("blocked", "high", (3,)), ("minority_stack", "high", (3,)), ("slow_node", "low", (2, 3)),
              ("thread_count", "low", (3,))),
    splits=((0, "step=3: ranks 0-2"), (1, "step=3: rank 3")),
    progress="stuck", title="rank 3's main thread is spinning on a CPU at `BufferedLog.flush` (job.py:621)",
    says=("rank 3", "spin", "self.flushed"))
EXPECTED["pdb"] = Expected(
    classes=((3, (0, 1, 3), "all_reduce"), (1, (2,), None)),
    findings=(("blocked", "high", (2,)), ("minority_stack", "high", (2,))),
    splits=((0, "step=3: ranks 0-1,3"), (1, "step=3: rank 2")),
    progress="stuck", title="rank 2's main thread is blocked in `pdb prompt` at `inspect_step` (job.py:628)",
    says=("rank 2", "pdb", "breakpoint()"))
EXPECTED["sighandler"] = Expected(
    classes=((3, (1, 2, 3), "all_reduce"), (1, (0,), None)),
    findings=(("blocked", "high", (0,)), ("minority_stack", "high", (0,))),
    splits=((0, "step=3: ranks 1-3"), (1, "step=3: rank 0")),
    progress="stuck", title="rank 0's main thread is blocked in `Event.wait` at `PreemptionSaver.on_notice` (job.py:642)",
    # a SIGUSR1 handler (its `signum` is 10) on top of the step it interrupted: only that step, below it on the
    # same thread, sets `step_done`
    says=("rank 0", "signal handler", "SIGUSR1", "step_done"), not_said=("shard-reader",))
EXPECTED["asyncio"] = Expected(
    classes=((3, (0, 1, 2), "all_reduce"), (1, (3,), None)),
    findings=(("minority_stack", "high", (3,)), ("blocked", "medium", (3,))),
    splits=((0, "step=3: ranks 0-2"), (1, "step=3: rank 3")),
    progress="stuck", title="rank 3 is in `EvalClient.score` (job.py:654) while 3 others wait in `all_reduce`",
    says=("rank 3", "asyncio", "event loop"))
EXPECTED["selflock"] = Expected(
    classes=((3, (0, 2, 3), "all_reduce"), (1, (1,), None)),
    findings=(("minority_stack", "high", (1,)), ("lock_wait", "low", (1,)), ("slow_node", "low", (0, 1))),
    splits=((0, "step=3: ranks 0,2-3"), (1, "step=3: rank 1")),
    progress="stuck", title="rank 1 is in `flush_step_times` (job.py:674) while 3 others wait in `all_reduce`",
    says=("rank 1", "_stats_lock", "itself"))
# For the lead: development scenarios whose diagnosis is wrong today, and how (bench/diagnose.py says the same).
WRONG_NOW = {
    "shutdown": "names the daemon `shard-reader` beside `metrics-uploader` as the threads the one it waits for is among: "
                "which one is the non-daemon thread is not in the stacks (the `locks` local says how many)",
}

# ... and those of them whose findings (kinds, confidences) are wrong too, not only the headline's words
WRONG_FINDINGS: dict = {}


def _cases(names: tuple, wrong: dict) -> list:
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=f"analysis wrong today: {wrong[n]}"))
            if n in wrong else n for n in names]


@lru_cache(maxsize=None)
def load(name: str) -> tuple[Snapshot, Snapshot, Optional[dict]]:
    snap, stored = snapshot_from_json((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    earlier, _ = snapshot_from_json((GOLDEN / f"{name}.earlier.json").read_text(encoding="utf-8"))
    return snap, earlier, stored


@lru_cache(maxsize=None)
def analysed(name: str) -> Analysis:
    snap, earlier, _ = load(name)
    return analyze(snap, history=[earlier])


def numbers(snap: Snapshot, keys: tuple) -> tuple:
    by_key = {(r.node, r.pid): r.rank for r in snap.ranks}
    return tuple(by_key[tuple(k)] for k in keys)


def test_every_scenario_has_a_golden_pair() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.json")) == sorted(
        f"{n}{suffix}.json" for n in SCENARIOS for suffix in ("", ".earlier"))
    assert set(EXPECTED) == set(SCENARIOS)


@pytest.mark.parametrize("name", _cases(SCENARIOS, WRONG_FINDINGS))
def test_classes_findings_and_iteration_splits(name: str) -> None:
    snap, _, _ = load(name)
    a, want = analysed(name), EXPECTED[name]
    assert tuple((c.size, tuple(c.numbers), c.collective) for c in a.classes) == want.classes
    assert tuple((f.kind, f.confidence, numbers(snap, f.ranks)) for f in a.findings) == want.findings
    assert tuple((s.class_index, s.text()) for s in a.iteration_splits) == want.splits
    assert "/".join(sorted({p.status for p in a.progress})) == want.progress and len(a.progress) == len(snap.ranks)
    assert a.findings[0].title.startswith(want.title), a.findings[0].title


@pytest.mark.parametrize("name", _cases(DEVELOPMENT, WRONG_NOW))
def test_the_headline_names_the_culprit_its_blocking_operation_and_what_it_waits_for(name: str) -> None:
    """The verdict (the headline) of a development scenario says the words of its truth, and none it rules out."""
    want, verdict = EXPECTED[name], analysed(name).verdict
    assert want.says, name
    missing = [w for w in want.says if w.lower() not in verdict.lower()]
    wrong = [w for w in want.not_said if w.lower() in verdict.lower()]
    assert not missing and not wrong, f"missing {missing}, wrongly says {wrong}: {verdict}"


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_recording_was_diagnosed_as_it_is_now(name: str) -> None:
    """The stored analysis is what the recorder concluded live; the same culprit comes out again (the kind of its
    first finding may be a newer one about the same ranks: the wait model's "blocked")."""
    snap, _, stored = load(name)
    assert stored is not None
    first, now = stored["findings"][0], analysed(name).findings[0]
    assert first["kind"] == now.kind or (now.kind == "blocked" and
                                         tuple(map(tuple, first["ranks"])) == tuple(map(tuple, now.ranks)))
    if snap.ranks:  # a job with no rank yet (startup) has no Flight Recorder to read
        assert stored["flight"]["state"] == "unused" and analysed(name).flight is not None


def test_the_culprits_are_named_where_they_ran() -> None:
    skip, dataloader, die = analysed("skip"), analysed("dataloader"), analysed("die")
    assert skip.findings[0].ranks_label == "rank 2 on node02"
    assert dataloader.findings[0].ranks_label == "rank 1 on node01"
    assert "node02: 1 of 2" in die.findings[0].detail and die.findings[0].nodes == "node02"
    netcut = analysed("netcut").findings[0]
    assert netcut.nodes == "node02" and "RTO backoff" in netcut.detail


@pytest.mark.parametrize("name", HUNG)
def test_without_history_one_sample_still_names_each_culprit(name: str) -> None:
    """--load of a single snapshot: no progress, the same lead for every hung scenario."""
    snap, _, _ = load(name)
    findings = analyze(snap).findings
    if name == "gpu_xid":  # GPU evidence from one sample is capped at [medium]: the stack leads, same rank
        assert findings[0].ranks == analysed(name).findings[0].ranks, name
        assert any(f.kind == "gpu_fault" and f.ranks == findings[0].ranks for f in findings), name
        return
    assert findings[0].kind == EXPECTED[name].findings[0][0], (name, findings[0])


def test_summaries_say_it_in_plain_words() -> None:
    texts = {name: " ".join(summary_text(load(name)[0], analysed(name), width=120).split()) for name in SCENARIOS}
    assert texts["skip"].startswith("hangscope: Rank 2 is 1 iteration ahead (step=4 vs 3)")
    assert "iterations: step=3: ranks 0-1,3; step=4: rank 2" in texts["skip"]
    assert texts["die"].startswith("hangscope: Rank 3 not found (WORLD_SIZE=4); the other 3 ranks wait for it in "
                                      "`all_reduce`.")
    assert texts["netcut"].startswith("hangscope: Every stalled socket involves node02")
    assert texts["healthy"].startswith("hangscope: The job is progressing")
    assert "Progress over samples: 4 ranks stuck for up to" in texts["skip"]
    for name, text in texts.items():  # none of these jobs runs with the Flight Recorder: said once, no finding
        if name == "startup":  # no rank yet: no Flight Recorder to speak of
            continue
        assert text.count("Flight recorder: not used by this job") == 1
