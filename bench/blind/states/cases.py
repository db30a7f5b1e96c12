"""Blind cases for hangscope's process-state diagnosis: a rank held by its process state (stopped, traced, frozen,
D, zombie) versus a momentary stop of hangscope's own tool, and the mixed situations in between.

Written from the problem statement and the data model only (app/model/*.py, tests/support/analysis_snapshots.py,
README.md); the analysis code and its tests were not read. Every job has 8 ranks; unless a case says otherwise all
ranks wait in the same `all_reduce` and pids are 1000 + rank.

TAXONOMY
--------
class      | what really happened                                                  | expected culprit | headline must say
-----------|-----------------------------------------------------------------------|------------------|----------------------------------
ext-stop   | someone sent the rank SIGSTOP / Ctrl-Z (state T, hold "stopped")       | the stopped rank | stopped / SIGSTOP (+ how to resume)
ext-trace  | a debugger or strace outside hangscope holds it in a tracing stop      | the traced rank  | gdb / strace / traced / tracer
           | (state t, TracerPid set, tracer_ours False), or its tracer has no name |                  |
ext-freeze | cgroup freezer: v1 (D, __refrigerator), v2 (S, do_freezer_trap or      | the frozen rank  | frozen / freezer (+ thaw / unpause)
           | get_signal), a paused docker container                                 |                  |
ext-dstate | uninterruptible sleep D on NFS (a data read, a checkpoint write)      | the D rank       | uninterruptible / D state / NFS / the file
ext-zombie | the rank's process exited and is a zombie (Z)                          | the zombie rank  | zombie / exited / defunct / dead
ext-legacy | an old snapshot with no hold reading at all: letters T on process and  | the T rank       | stopped
           | threads, in two samples (capital T is not a ptrace stop)               |                  |
own-tool   | hangscope's own py-spy/strace attached while letters or the hold were  | the real culprit | the real culprit's story (other
           | read: letters 't' with no hold, TracerPid set while sleeping (ours or  | elsewhere (other | collective, iteration ahead, data
           | another user's passing py-spy), hold "traced" with tracer_ours True,   | collective, one  | loader); never "rank N is stopped/
           | a rank hangscope resumed; the job's real culprit is another rank       | step ahead, ...) | traced" for the touched rank
mixed      | several ranks stopped; a whole node frozen; a stopped rank plus an odd | see each case    | see each case
           | stack elsewhere; letters T while the hold reads sleeping; hold traced  |                  |
           | by gdb while the letters read S; a transient 't' plus a real SIGSTOP   |                  |

Truth per case: `culprit` (a rank number or a list), `culprit_mode` ("all": the analysis's culprits are exactly
these ranks; "any": a non-empty subset of them), `must` (groups of alternatives: the headline contains at least one
alternative of every group, case-insensitive), `must_not` (patterns that mean a wrong blame; "re:" starts a regular
expression, anything else is a plain case-insensitive substring).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

from analysis_snapshots import ALL_REDUCE, BARRIER, LOADING, in_step, stack  # type: ignore[import-not-found]
from app.model import (CollectOptions, Frame, NodeStatus, ProcessHold, RankSnapshot, Snapshot,
                       ThreadStack)

SERIALIZATION = "/opt/venv/lib/python3.11/site-packages/torch/serialization.py"
MODEL = "/home/alice/model.py"

FORWARD = stack(f"forward ({MODEL}:88)", "_call_impl (/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py:1750)",
                "train (job.py:56)", "<module> (job.py:120)")
NFS_READ = stack("read_shard (loader.py:44)", "next_batch (loader.py:31)", "train (job.py:55)", "<module> (job.py:120)")
CKPT_WRITE = stack(f"_save ({SERIALIZATION}:1210)", f"save ({SERIALIZATION}:965)", "checkpoint (job.py:70)",
                   "train (job.py:66)", "<module> (job.py:120)")


@dataclass
class Case:
    name: str
    cls: str
    story: str
    snapshot: Snapshot
    culprit: Union[int, List[int]]
    must: List[List[str]]
    must_not: List[str] = field(default_factory=list)
    history: List[Snapshot] = field(default_factory=list)
    culprit_mode: str = "all"

    @property
    def culprits(self) -> List[int]:
        return [self.culprit] if isinstance(self.culprit, int) else list(self.culprit)


# ---------------------------------------------------------------------------------------------------- builders

_HOLD_FIELDS = {f.name for f in dataclasses.fields(ProcessHold)}


def hold(**kw: object) -> ProcessHold:
    """A ProcessHold; fields this version of the model does not have (tracer_ours before 7a7aa50) are left out:
    that version cannot be told what it has no field for."""
    return ProcessHold(**{k: v for k, v in kw.items() if k in _HOLD_FIELDS})  # type: ignore[arg-type]


def mk(number: int, node: str, frames: Sequence[Frame] = ALL_REDUCE, *, state: str = "S", tstate: Optional[str] = None,
       wchan: str = "", twchan: Optional[str] = None, pid: Optional[int] = None, world: int = 8,
       extra_threads: Sequence[ThreadStack] = (), **kw: object) -> RankSnapshot:
    pid = pid if pid is not None else 1000 + number
    main = ThreadStack(tid=pid, name="MainThread", frames=tuple(frames), is_main=True,
                       state=tstate if tstate is not None else state,
                       wchan=twchan if twchan is not None else wchan)
    return RankSnapshot(node=node, pid=pid, start_time=1, rank=number, local_rank=None, world_size=world,
                        state=state, wchan=wchan, num_threads=1 + len(extra_threads), collected=True,
                        threads=(main, *extra_threads), **kw)  # type: ignore[arg-type]


def node_of(r: int, per_node: int) -> str:
    return f"node{r // per_node + 1:02d}"


def ranks(per_node: int = 4, frames: Tuple[Frame, ...] = ALL_REDUCE, **odd: RankSnapshot) -> List[RankSnapshot]:
    """8 plain sleeping ranks in `frames`, with the ranks given as rank<N>=RankSnapshot replaced."""
    out = []
    for r in range(8):
        out.append(odd.get(f"rank{r}") or mk(r, node_of(r, per_node), frames))
    return out


def snap(rs: Sequence[RankSnapshot], *, taken_at: float = 1000.0, locals: bool = False) -> Snapshot:
    names = sorted({r.node for r in rs})
    return Snapshot(taken_at=taken_at, duration=2.0, options=CollectOptions(locals=locals),
                    nodes=tuple(NodeStatus(n, state="done", ranks_found=sum(r.node == n for r in rs)) for n in names),
                    ranks=tuple(rs))


def step_ranks(step: int, per_node: int = 4, **odd: object) -> List[RankSnapshot]:
    """8 ranks in all_reduce at training step `step`; rank<N>=int puts rank N at another step, rank<N>=dict
    passes extra keywords to mk for that rank (with 'step' for its step)."""
    out = []
    for r in range(8):
        o = odd.get(f"rank{r}")
        kw: dict = {}
        s = step
        if isinstance(o, int):
            s = o
        elif isinstance(o, dict):
            kw = dict(o)
            s = kw.pop("step", step)
        out.append(mk(r, node_of(r, per_node), in_step(ALL_REDUCE, s), **kw))
    return out


def stopped(r: int, node: str, frames: Tuple[Frame, ...] = ALL_REDUCE, *, by: str = "SIGSTOP", tty: bool = False,
            pid: Optional[int] = None) -> RankSnapshot:
    return mk(r, node, frames, state="T", wchan="do_signal_stop", pid=pid,
              hold=hold(kind="stopped", stopped_by=by, tty=tty, wchan="do_signal_stop"))


def traced(r: int, node: str, tracer: str, tracer_pid: int, *, ours: bool = False, state: str = "t",
           frames: Tuple[Frame, ...] = ALL_REDUCE) -> RankSnapshot:
    return mk(r, node, frames, state=state, wchan="ptrace_stop" if state == "t" else "",
              hold=hold(kind="traced", stopped_by="tracer", tracer_pid=tracer_pid, tracer=tracer, tracer_ours=ours,
                        wchan="ptrace_stop"))


# ------------------------------------------------------------------------------------------------------- cases

def build_cases() -> List[Case]:
    cases: List[Case] = []
    add = cases.append

    # ---- ext-stop
    add(Case("ext-sigstop", "ext-stop", "rank 5 got SIGSTOP (kill -STOP), no terminal",
             snap(ranks(rank5=stopped(5, "node02"))), 5,
             [["stopped", "sigstop"], ["kill -cont", "sigcont", "resume"]],
             ["re:\\brank [0-46-7] is\\b"]))

    rs = ranks(per_node=2, rank7=stopped(7, "node04", pid=4242))
    early = ranks(per_node=2, rank7=stopped(7, "node04", pid=4242))
    add(Case("ext-sigstop-4nodes-history", "ext-stop", "rank 7 (pid 4242, node04) SIGSTOPped, in both samples",
             snap(rs, taken_at=1000.0), 7, [["stopped", "sigstop"], ["4242"]],
             ["re:\\brank [0-6] is\\b"], history=[snap(early, taken_at=970.0)]))

    add(Case("ext-ctrl-z", "ext-stop", "rank 2 run in a terminal and suspended with Ctrl-Z (SIGTSTP)",
             snap(ranks(rank2=stopped(2, "node01", by="SIGTSTP", tty=True))), 2,
             [["stopped", "sigtstp", "ctrl-z", "job control", "terminal", "suspended"],
              ["fg", "kill -cont", "sigcont", "resume"]],
             ["re:\\brank [013-7] is\\b"]))

    add(Case("ext-sigstop-odd-stack", "ext-stop", "rank 3 SIGSTOPped inside the model's forward, before all_reduce",
             snap(ranks(rank3=stopped(3, "node01", FORWARD))), 3, [["stopped", "sigstop"]],
             ["re:\\brank [0-24-7] is\\b"]))

    # ---- ext-trace
    add(Case("ext-gdb", "ext-trace", "a person attached gdb (pid 4321) to rank 6 and left it at the prompt",
             snap(ranks(rank6=traced(6, "node02", "gdb", 4321))), 6,
             [["gdb", "debugger"], ["detach", "quit", "4321", "exit"]],
             ["re:\\brank [0-57] is\\b"]))

    add(Case("ext-strace-stopped", "ext-trace", "rank 1 is in a tracing stop under a foreign strace (pid 5555)",
             snap(ranks(rank1=traced(1, "node01", "strace", 5555))), 1,
             [["strace", "traced", "tracer", "ptrace"]],
             ["re:\\brank [02-7] is\\b"]))

    add(Case("ext-tracer-unnamed", "ext-trace",
             "rank 4 in a tracing stop; TracerPid 31337 but its command could not be read (tracer gone/unreadable)",
             snap(ranks(rank4=traced(4, "node02", "", 31337))), 4,
             [["traced", "tracer", "ptrace", "debugger", "31337"]],
             ["re:\\brank [0-35-7] is\\b"]))

    # ---- ext-freeze
    v1 = mk(4, "node02", state="D", wchan="__refrigerator",
            hold=hold(kind="frozen", freezer="v1", cgroup="/job42", freezer_state="FROZEN", wchan="__refrigerator",
                      thaw="echo THAWED > /sys/fs/cgroup/freezer/job42/freezer.state"))
    add(Case("ext-freezer-v1", "ext-freeze", "rank 4's cgroup v1 freezer set to FROZEN",
             snap(ranks(rank4=v1)), 4, [["frozen", "freezer"], ["thaw"]], ["re:\\brank [0-35-7] is\\b"]))

    v2 = mk(7, "node02", state="S", wchan="do_freezer_trap",
            hold=hold(kind="frozen", freezer="v2", cgroup="/system.slice/slurmstepd.scope/job_42/step_0/user/task_7",
                      freezer_state="FROZEN", wchan="do_freezer_trap",
                      thaw="echo 0 > /sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/user/task_7/cgroup.freeze"))
    add(Case("ext-freezer-v2", "ext-freeze", "rank 7's cgroup v2 cgroup.freeze set to 1 (letters S, do_freezer_trap)",
             snap(ranks(rank7=v2)), 7, [["frozen", "freezer"], ["thaw", "cgroup.freeze", "echo 0"]],
             ["re:\\brank [0-6] is\\b"]))

    dock = mk(3, "node01", state="S", wchan="get_signal",
              hold=hold(kind="frozen", freezer="v2", cgroup="/system.slice/docker-abc123def456.scope",
                        freezer_state="FROZEN", wchan="get_signal",
                        thaw="echo 0 > /sys/fs/cgroup/system.slice/docker-abc123def456.scope/cgroup.freeze",
                        container="docker unpause abc123def456"), in_container=True)
    add(Case("ext-docker-pause", "ext-freeze", "rank 3 runs in a docker container that was `docker pause`d",
             snap(ranks(rank3=dock)), 3, [["frozen", "paused", "freezer"], ["unpause", "thaw"]],
             ["re:\\brank [0-24-7] is\\b"]))

    # ---- ext-dstate
    nfs = mk(6, "node02", NFS_READ, state="D", wchan="rpc_wait_bit_killable",
             hold=hold(kind="disk_sleep", wchan="rpc_wait_bit_killable", syscall="read",
                       waits_on="/mnt/nfs/data/shard-0042.bin"))
    add(Case("ext-dstate-nfs-read", "ext-dstate", "rank 6 stuck in D reading a shard from a hung NFS server",
             snap(ranks(rank6=nfs)), 6,
             [["uninterruptible", "d state", "d-state", "disk", "nfs", "shard-0042", "(d)"]],
             ["re:\\brank [0-57] is\\b"]))

    ck = mk(0, "node01", CKPT_WRITE, state="D", wchan="nfs_wait_on_request",
            hold=hold(kind="disk_sleep", wchan="nfs_wait_on_request", syscall="write",
                      waits_on="/mnt/nfs/ckpt/step1000.pt"))
    add(Case("ext-dstate-ckpt-write", "ext-dstate", "rank 0 stuck in D writing its checkpoint to NFS",
             snap(ranks(rank0=ck)), 0,
             [["uninterruptible", "d state", "d-state", "disk", "nfs", "step1000.pt", "(d)"]],
             ["re:\\brank [1-7] is\\b"]))

    # ---- ext-zombie
    z = RankSnapshot(node="node01", pid=1002, start_time=1, rank=2, world_size=8, state="Z", num_threads=1,
                     collected=False, threads=(), hold=hold(kind="zombie"))
    add(Case("ext-zombie", "ext-zombie", "rank 2 died (segfault) and is a zombie its launcher has not reaped",
             snap(ranks(rank2=z)), 2, [["zombie", "exited", "defunct", "dead", "died", "exit"]],
             ["re:\\brank [013-7] is\\b"]))

    # ---- ext-legacy (old snapshot, no hold reading anywhere)
    def legacy5() -> RankSnapshot:
        return mk(5, "node02", state="T", wchan="do_signal_stop")
    add(Case("ext-legacy-letters-T", "ext-legacy",
             "old worker (no hold reading); rank 5 shows T on the process and its threads in both samples",
             snap(ranks(rank5=legacy5()), taken_at=1000.0), 5, [["stopped", "sigstop"]],
             ["re:\\brank [0-46-7] is\\b"], history=[snap(ranks(rank5=legacy5()), taken_at=970.0)]))

    # ---- own-tool: hangscope's own stop must not be blamed
    add(Case("own-transient-t-odd-collective", "own-tool",
             "py-spy was attached to rank 0 when its letters were read (t, no hold); rank 3 is in barrier",
             snap(ranks(rank0=mk(0, "node01", state="t", wchan="ptrace_stop"),
                        rank3=mk(3, "node01", BARRIER))), 3,
             [["barrier", "rank 3"]],
             ["re:\\brank 0\\b", "traced", "stopped"]))

    add(Case("own-transient-t-ahead", "own-tool",
             "letters t on rank 5 from hangscope's py-spy; rank 2 is one step ahead (step=101 vs 100)",
             snap(step_ranks(100, rank5={"state": "t", "wchan": "ptrace_stop"}, rank2=101), locals=True), 2,
             [["ahead", "iteration", "step"]],
             ["re:\\brank 5\\b", "traced", "stopped"]))

    add(Case("own-transient-two-ranks", "own-tool",
             "both nodes' py-spy attached at the same moment: ranks 0 and 4 show t; rank 6 is in barrier",
             snap(ranks(rank0=mk(0, "node01", state="t", wchan="ptrace_stop"),
                        rank4=mk(4, "node02", state="t", wchan="ptrace_stop"),
                        rank6=mk(6, "node02", BARRIER))), 6,
             [["barrier", "rank 6"]],
             ["re:\\brank 0\\b", "re:\\brank 4\\b", "traced", "stopped"]))

    add(Case("own-thread-letter-only", "own-tool",
             "only rank 1's main thread shows t (process S, no hold); rank 5 is still in the data loader",
             snap(ranks(rank1=mk(1, "node01", tstate="t", twchan="ptrace_stop"),
                        rank5=mk(5, "node02", LOADING))), 5,
             [["next_batch", "loader", "data"]],
             ["re:\\brank 1\\b", "traced", "stopped"]))

    add(Case("own-tracerpid-sleeping-ours", "own-tool",
             "hold read while hangscope's py-spy was attaching to rank 2 (sleeping, TracerPid 7001 ours); "
             "rank 7 is in barrier",
             snap(ranks(rank2=mk(2, "node01", state="t", wchan="ptrace_stop",
                                 hold=hold(kind="sleeping", tracer_pid=7001, tracer="py-spy", tracer_ours=True,
                                           wchan="futex_wait_queue")),
                        rank7=mk(7, "node02", BARRIER))), 7,
             [["barrier", "rank 7"]],
             ["re:\\brank 2\\b", "traced", "stopped", "py-spy"]))

    add(Case("own-tracerpid-sleeping-foreign", "own-tool",
             "another user's py-spy dump was attaching to rank 2 (sleeping, TracerPid 7002 not ours, letters S); "
             "rank 4 is in barrier",
             snap(ranks(rank2=mk(2, "node01",
                                 hold=hold(kind="sleeping", tracer_pid=7002, tracer="py-spy", tracer_ours=False,
                                           wchan="futex_wait_queue")),
                        rank4=mk(4, "node02", BARRIER))), 4,
             [["barrier", "rank 4"]],
             ["re:\\brank 2\\b", "traced", "stopped"]))

    add(Case("own-hold-traced-ours", "own-tool",
             "rank 1's hold was read inside hangscope's own py-spy stop (traced, tracer_ours); rank 6 is in barrier",
             snap(ranks(rank1=traced(1, "node01", "py-spy", 7003, ours=True),
                        rank6=mk(6, "node02", BARRIER))), 6,
             [["barrier", "rank 6"]],
             ["re:\\brank 1\\b", "traced", "stopped", "py-spy"]))

    now = step_ranks(100, rank0=101, rank3={"state": "t", "wchan": "ptrace_stop",
                                            "hold": hold(kind="traced", stopped_by="tracer", tracer_pid=7004,
                                                         tracer="strace", tracer_ours=True, wchan="ptrace_stop")})
    before = step_ranks(100, rank0=101)
    add(Case("own-hold-traced-ours-ahead-history", "own-tool",
             "hangscope's own strace held rank 3 when its hold was read; rank 0 is one step ahead in both samples",
             snap(now, taken_at=1000.0, locals=True), 0, [["ahead", "iteration", "step"]],
             ["re:\\brank 3\\b", "traced", "stopped", "strace"],
             history=[snap(before, taken_at=970.0, locals=True)]))

    add(Case("own-resumed", "own-tool",
             "hangscope found rank 2 left stopped after its tool and resumed it (resumed=True); rank 5 is in barrier",
             snap(ranks(rank2=mk(2, "node01", resumed=True), rank5=mk(5, "node02", BARRIER))), 5,
             [["barrier", "rank 5"]],
             ["re:\\brank 2\\b", "traced", "stopped"]))

    # ---- mixed
    add(Case("mix-two-stopped", "mixed", "ranks 2 and 6 were both SIGSTOPped",
             snap(ranks(rank2=stopped(2, "node01"), rank6=stopped(6, "node02"))), [2, 6],
             [["stopped", "sigstop"]],
             ["re:\\brank [013457] is\\b"]))

    def frozen_node(r: int) -> RankSnapshot:
        return mk(r, "node02", state="S", wchan="do_freezer_trap",
                  hold=hold(kind="frozen", freezer="v2", cgroup="/system.slice/slurmstepd.scope/job_42",
                            freezer_state="FROZEN", wchan="do_freezer_trap",
                            thaw="echo 0 > /sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/cgroup.freeze"))
    add(Case("mix-node-frozen", "mixed", "the job's cgroup on node02 was frozen (scontrol suspend): ranks 4-7",
             snap(ranks(**{f"rank{r}": frozen_node(r) for r in range(4, 8)})), [4, 5, 6, 7],
             [["frozen", "freezer"], ["thaw", "cgroup.freeze", "echo 0", "resume"]],
             ["re:\\brank [0-3] is\\b"]))

    add(Case("mix-stopped-plus-odd-stack", "mixed",
             "rank 1 is SIGSTOPped in all_reduce and rank 6 is in barrier: both hold the job; either is a fair lead",
             snap(ranks(rank1=stopped(1, "node01"), rank6=mk(6, "node02", BARRIER))), [1, 6],
             [["stopped", "sigstop", "barrier"]],
             ["re:\\brank [02-57] is\\b"], culprit_mode="any"))

    add(Case("mix-letters-T-hold-sleeping", "mixed",
             "rank 1's letters say T but its hold (read first) says sleeping, no tracer; rank 6 is in barrier",
             snap(ranks(rank1=mk(1, "node01", state="T", wchan="do_signal_stop",
                                 hold=hold(kind="sleeping", wchan="futex_wait_queue")),
                        rank6=mk(6, "node02", BARRIER))), 6,
             [["barrier", "rank 6"]],
             ["re:\\brank 1\\b", "stopped"]))

    add(Case("mix-hold-gdb-letters-S", "mixed",
             "rank 3's hold says traced by gdb (pid 888, not ours) but its letters read S later (gdb let it run "
             "for a moment); nothing else differs",
             snap(ranks(rank3=traced(3, "node01", "gdb", 888, state="S"))), 3,
             [["gdb", "debugger"]],
             ["re:\\brank [0-24-7] is\\b"]))

    add(Case("mix-transient-plus-real-stop", "mixed",
             "rank 0 shows t from hangscope's py-spy (no hold), rank 5 is really SIGSTOPped",
             snap(ranks(rank0=mk(0, "node01", state="t", wchan="ptrace_stop"), rank5=stopped(5, "node02"))), 5,
             [["stopped", "sigstop"]],
             ["re:\\brank 0\\b", "traced"]))

    return cases
