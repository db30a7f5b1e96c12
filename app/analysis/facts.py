"""Typed facts: what each detector concludes, as data. Every kind of fact is declared once, here, with all it means.

A detector returns `Fact`s: a kind, who it is about (`Who`: rank processes, rank numbers, node names, a thread,
a process beside the ranks, an address), how strong it is, and its evidence as a typed payload (`Evidence`, one
class per family of kinds, defined beside its detector). No fact holds a sentence: the wait graph
(app/analysis/graph.py) is built from these fields, the calibration (calibrate.py) weighs them, and the text
layer (app/analysis/prose/) writes every sentence last. Folded labels (`node[02-03]`, `ranks 0-3`) exist only
there: a fact names nodes and ranks one by one.

`KINDS` is the declaration of every kind: how strong its evidence is beside the others (`tier`), which edge of
the wait graph it makes, whether it is a suspect or a note on the data, whether the kernel itself reports it,
whether it reads a stall or a position into one sample (a moving job contradicts those), and its place in the
most-specific-first order. The text layer has a renderer for each kind (a test checks that none is missing).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Iterable, Literal, Optional, Sequence, Tuple, get_args

from app.analysis.fold import RankKey

Confidence = Literal["high", "medium", "low"]
STRENGTH = {"high": 0, "medium": 1, "low": 2}

FactKind = Literal[
    "progressing",  # samples over time show ranks moving: not hung
    "stopped",  # SIGSTOP / job control / tracing stop
    "frozen",  # the cgroup freezer holds the rank
    "launcher_held",  # a launcher of a job with no rank yet is stopped or traced: the rendezvous waits for it
    "exited",  # a rank is a zombie, or vanished between samples
    "uninterruptible",  # D state: I/O or a driver
    "gpu_fault",  # GPU evidence: a fresh Xid, ECC errors, nvidia-smi hung
    "nccl_ras",  # NCCL's RAS: ranks missing from a communicator, collective counts that differ
    "lock_wait",  # a thread blocked on a lock another thread of its rank holds (or a deadlock of threads)
    "p2p_wait",  # a rank blocked in send/recv for a peer that is elsewhere, or a cycle of p2p calls
    "gil_held",  # a thread holds the GIL while asleep in native code
    "pipe_write",  # a thread blocked writing to a full pipe nobody drains
    "native_call",  # the main thread inside a native call that does not return
    "blocked",  # a suspect's thread blocked in an operation whose releaser is known (the wait model)
    "slow_node",  # a node's ranks are held back
    "different_collective",  # some ranks wait in another collective than the rest
    "minority_stack",  # a small class of ranks is somewhere else than a dominant one
    "iteration_split",  # same place, different loop iteration
    "launch_differs",  # a few ranks run with other command-line flags than the rest
    "store_differs",  # every rank retries connecting to a store elsewhere than its launcher's (MASTER_ADDR/PORT)
    "launch_incomplete",  # the launchers' own flags name a node (rank) whose launcher is not running
    "rendezvous_differs",  # a launcher started with other rendezvous flags than the job's others
    "collective_lag",  # the Flight Recorder shows ranks that issued fewer collectives in a group
    "still_running",  # a few ranks change between samples while the rest are stuck
    "missing_ranks",  # rank numbers expected from WORLD_SIZE / slots not found
    "unfinished",  # the ranks still running while other nodes' launchers wait in torchrun's exit barrier
    "node_failed",  # a node could not be inspected
    "outside_peer",  # the ranks talk to addresses no inspected node has
    "network_stall",  # sockets retransmitting or peers silent
    "thread_count",  # ranks with another number of threads than the rest
    "dump_failed",  # stacks missing for some ranks
    "all_identical",  # every rank at the same place: stacks cannot tell the culprit
    "several_jobs",  # the snapshot holds ranks of more than one job
    "no_locals",  # loops on the path but no loop variables
    "launchers_only",  # a job's launchers run but no rank of it exists yet
    "no_data",  # nothing to analyse
]


@dataclass(frozen=True)
class KindInfo:
    """Everything a kind of fact means to the analysis."""

    tier: int  # evidence strength beyond confidence: 0 the kernel's word on a process ... 5 a note on the data
    edge: str  # the kind of wait-graph edge it makes: "the rest of the job waits for its subject because ..."
    evidence: str  # the Evidence class its facts carry
    state: str = ""  # a process state that holds its subject ("stopped", "frozen", "exited", "in D state")
    observed: bool = False  # the kernel's own report on a process: no other root makes it less true
    one_sample: bool = False  # read off one sample's stacks: a moving job's ranks are caught anywhere
    stall: bool = False  # reads a stall into one sample; sockets that move bytes contradict it
    moving: bool = False  # says how a job runs (slowly, with other flags), not that it is held
    explained_by_state: bool = False  # a rank held by its state (stopped, frozen) explains it by itself


_K = KindInfo
# In declaration order: FactKind's order is the most-specific-first order among equally strong facts.
KINDS: Dict[str, KindInfo] = {
    "progressing": _K(5, "progress", "ProgressEvidence", moving=True),
    "stopped": _K(0, "state", "StateEvidence", state="stopped", observed=True),
    "frozen": _K(0, "state", "StateEvidence", state="frozen", observed=True),
    "launcher_held": _K(0, "state", "HeldLauncherEvidence", state="stopped", observed=True),
    "exited": _K(0, "state", "StateEvidence", state="exited", observed=True),
    "uninterruptible": _K(1, "state", "StateEvidence", state="in D state", observed=True),
    "gpu_fault": _K(2, "gpu", "GpuEvidence"),
    "nccl_ras": _K(2, "gpu", "RasEvidence"),
    "lock_wait": _K(2, "lock", "LockEvidence"),
    "p2p_wait": _K(2, "p2p", "P2PEvidence"),
    "gil_held": _K(2, "native", "NativeEvidence", one_sample=True),
    "pipe_write": _K(2, "pipe", "NativeEvidence", one_sample=True),
    "native_call": _K(2, "native", "NativeEvidence", one_sample=True),
    "blocked": _K(2, "blocked", "WaitEvidence", one_sample=True),
    "slow_node": _K(4, "slow", "SlowEvidence", moving=True),
    "different_collective": _K(3, "stacks", "StackEvidence", one_sample=True),
    "minority_stack": _K(3, "stacks", "StackEvidence", one_sample=True),
    "iteration_split": _K(3, "iteration", "IterationEvidence", one_sample=True),
    "launch_differs": _K(3, "launch", "LaunchEvidence", moving=True),
    "store_differs": _K(2, "store", "StoreEvidence"),
    "launch_incomplete": _K(2, "rendezvous", "LaunchersEvidence"),
    "rendezvous_differs": _K(2, "rendezvous", "RendezvousEvidence"),
    "collective_lag": _K(2, "flight", "FlightEvidence", one_sample=True),
    "still_running": _K(4, "progress", "ProgressEvidence"),
    "missing_ranks": _K(2, "missing", "MissingEvidence"),
    "unfinished": _K(2, "exit barrier", "MissingEvidence"),
    "node_failed": _K(5, "node", "NodeEvidence"),
    "outside_peer": _K(4, "outside", "OutsideEvidence"),
    "network_stall": _K(4, "network", "NetworkEvidence", stall=True, explained_by_state=True),
    "thread_count": _K(5, "threads", "ThreadCountEvidence"),
    "dump_failed": _K(5, "dump", "DumpEvidence"),
    "all_identical": _K(5, "stacks", "IdenticalEvidence", stall=True, explained_by_state=True),
    "several_jobs": _K(5, "jobs", "JobsEvidence"),
    "no_locals": _K(5, "locals", "NoLocalsEvidence"),
    "launchers_only": _K(5, "rendezvous", "LaunchersEvidence"),
    "no_data": _K(5, "data", "NoDataEvidence"),
}
ORDER: Tuple[str, ...] = get_args(FactKind)
assert set(ORDER) == set(KINDS), "every kind is declared in KINDS"
OBSERVED_TIER = 1  # tiers up to this one are the kernel's own report on a process
DEFAULT_TIER = 3


def info(kind: str) -> KindInfo:
    return KINDS[kind]


def position(kind: str) -> int:
    return ORDER.index(kind) if kind in ORDER else len(ORDER)


@dataclass(frozen=True)
class Who:
    """Who a fact is about. Ranks by process (`keys`), with their numbers; rank numbers alone for ranks that
    were not found (`missing`); node names one by one; one thread of a single rank (`tid`); a process that is
    not a rank (`pid` on `nodes[0]`); an address no inspected node has."""

    keys: Tuple[RankKey, ...] = ()
    numbers: Tuple[Optional[int], ...] = ()  # parallel to keys when keys are given (None: no rank number)
    nodes: Tuple[str, ...] = ()
    tid: Optional[int] = None
    pid: Optional[int] = None
    addresses: Tuple[str, ...] = ()
    missing: bool = False

    @property
    def empty(self) -> bool:
        return not (self.keys or self.numbers or self.nodes or self.addresses)

    def overlaps(self, other: "Who") -> bool:
        """Whether two subjects speak of the same processes, rank numbers or (for a host) the same node."""
        if self.keys and other.keys and not set(self.keys).isdisjoint(other.keys):
            return True
        mine, theirs = set(self.numbers) - {None}, set(other.numbers) - {None}
        if mine and theirs and not mine.isdisjoint(theirs):
            return True
        hostish = not self.keys or not other.keys
        return hostish and bool(self.nodes) and bool(other.nodes) and not set(self.nodes).isdisjoint(other.nodes)


NOBODY = Who()  # the empty subject (a note about the data as a whole)


def ranks_who(keys: Sequence[RankKey], numbers: Sequence[Optional[int]]) -> Who:
    """The subject for rank processes: keys, their numbers (in parallel), their nodes in first-seen order."""
    nodes: Dict[str, None] = {}
    for k in keys:
        nodes.setdefault(k[0], None)
    return Who(tuple(keys), tuple(numbers), tuple(nodes))


def nodes_who(nodes: Iterable[str]) -> Who:
    """The subject for nodes (each once, in first-seen order)."""
    return Who(nodes=tuple(dict.fromkeys(nodes)))


class Evidence:
    """Base of every fact's typed payload (each family of kinds has its own subclass beside its detector)."""


# Why a fact's strength was changed after it was made: typed, rendered by the text layer.
CaveatCode = Literal[
    "progressing",  # the job moves between samples: a one-sample position is no lead
    "progressing_stall",  # the job moves: a stall read into one sample is contradicted
    "passing",  # a D state seen in one sample of ranks that moved between samples: a passing kernel wait
    "sockets_moved",  # the sockets of the named nodes moved bytes between samples
    "held",  # a held rank (stopped, frozen) silences its sockets and holds the others by itself
    "spinning",  # a rank spinning on the node takes its CPU
    "not_moving",  # nothing moves between samples: a slow node does not stop a job
    "not_progressing",  # a rank is held: the job as a whole does not progress
    "root_elsewhere",  # the wait graph's root is elsewhere
    "upstream",  # its subject waits for the wait graph's root, other ranks: it is held, not the cause
    "rival",  # evidence as strong points elsewhere
    "eased",  # the job progresses between samples: no [high] suspect
    "agrees",  # other evidence singles out the same ranks
    "disagrees",  # other evidence singles out other ranks
]


@dataclass(frozen=True)
class Caveat:
    """One reason a fact's strength moved (or was confirmed): `about` names who the caveat speaks of."""

    code: CaveatCode
    about: Who = field(default_factory=Who)
    kind: str = ""  # the kind of fact it rests on, when it rests on one


@dataclass(frozen=True)
class Fact:
    """One conclusion of one detector, as data."""

    kind: FactKind
    who: Who
    strength: Confidence
    data: Evidence
    culprit: bool = True  # a suspect; False for notes on the data (incomplete, cannot tell)
    class_index: Optional[int] = None  # the stack class it is about, when it is about one
    caveats: Tuple[Caveat, ...] = ()

    @property
    def info(self) -> KindInfo:
        return KINDS[self.kind]

    def weakened(self, strength: Confidence, caveat: Caveat, culprit: Optional[bool] = None) -> "Fact":
        return replace(self, strength=strength, caveats=self.caveats + (caveat,),
                       culprit=self.culprit if culprit is None else culprit)

    def noted(self, caveat: Caveat) -> "Fact":
        return replace(self, caveats=self.caveats + (caveat,))


def rank_of_fact(f: Fact) -> Tuple[int, int]:
    """(strength, tier): the surer and the more direct the evidence, the lower."""
    return STRENGTH[f.strength], f.info.tier


def ordered(facts: Tuple[Fact, ...], first: Tuple[Fact, ...] = ()) -> Tuple[Fact, ...]:
    """Most likely culprit first, and never a less sure fact before a surer one: by strength, and within one
    strength `first` (the fact at the wait graph's root), "progressing", then suspects, then notes."""
    lead = {id(f) for f in first}
    return tuple(sorted(facts, key=lambda f: (STRENGTH[f.strength], id(f) not in lead, _head(f), position(f.kind))))


def _head(f: Fact) -> int:
    return 0 if f.kind == "progressing" else (1 if f.culprit else 2)


def lead(facts: Tuple[Fact, ...]) -> Optional[Fact]:
    """The fact a verdict speaks of when no wait graph names a root: "progressing" when the job moves, else the
    surest suspect, else the surest note."""
    return min(facts, key=lambda f: (_head(f), STRENGTH[f.strength] if f.culprit else 0, position(f.kind)),
               default=None)
