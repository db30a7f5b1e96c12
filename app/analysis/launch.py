"""Ranks launched differently: a minority whose command line sets a flag to another value than the rest.

One node started with other training flags (`--gradient_accumulation_steps=32` where the others have 16) runs
another number of collectives per step, and the job hangs or diverges. Every rank's command line is in the
snapshot (redacted on the node), so comparing them is cheap: the ranks are grouped by their command line
(usually one group), each distinct one is read once, flags are compared key by key, and the keys that hold a
rank's own number by design (`--local_rank`, `--node_rank`, ...) or a redacted value are left out.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from operator import attrgetter
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from app.analysis.facts import Evidence, Fact, ranks_who
from app.model import RankSnapshot, rank_key
from workers.redact import redact_argv

_CMDLINE = attrgetter("cmdline")
_PER_RANK = re.compile(r"^-*(local[-_]?rank|node[-_]?rank|rank|group[-_]?rank|local[-_]?world[-_]?size|"
                       r"master[-_]?port|rdzv[-_]?id|port|seed|tracker[-_]?fd|pipe[-_]?handle|log[-_]?dir)$", re.I)


def flags(cmdline: Sequence[str]) -> Dict[str, str]:
    """`--key=value`, `--key value` and bare `--switch` of a command line (argv[0] left out), by key."""
    out: Dict[str, str] = {}
    args = list(cmdline[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and len(arg) > 1 and not _number(arg):
            key, sep, value = arg.partition("=")
            if not sep and i + 1 < len(args) and (not args[i + 1].startswith("-") or _number(args[i + 1])):
                value, i = args[i + 1], i + 1
            out[key] = value if (sep or value) else "(set)"
        i += 1
    return out


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class LaunchEvidence(Evidence):
    """A group of ranks whose command line sets flags to other values than the majority: (flag, theirs here,
    the majority's) for each, and how many ranks the job's command lines cover."""

    diff: Tuple[Tuple[str, str, str], ...]
    total: int
    few: bool  # a minority (a third or less): a suspect


def launch_facts(ranks: Sequence[RankSnapshot]) -> List[Fact]:
    """Ranks (a minority) whose flags differ from the majority's, one fact per kind of difference."""
    if len(set(map(_CMDLINE, ranks))) < 2:  # in C: the usual case, one command line for the whole job
        return []
    by_cmdline: Dict[Tuple[str, ...], List[RankSnapshot]] = {}
    for cmdline, r in zip(map(_CMDLINE, ranks), ranks):
        by_cmdline.setdefault(cmdline, []).append(r)
    if len(by_cmdline) < 2:
        return []
    # read through the pattern net first: a value it knows for a secret (`--password X`, a token) becomes `***`,
    # which no comparison shows (a snapshot file may hold a command line as it was typed)
    parsed = {c: flags(redact_argv(c)) for c in by_cmdline if c}
    if len(parsed) < 2:
        return []
    total = sum(len(by_cmdline[c]) for c in parsed)
    # `-c CODE` is code, not a flag (multiprocessing's spawn children carry their own pipe handles in it)
    keys = {k for f in parsed.values() for k in f if not _PER_RANK.match(k) and k != "-c"}
    majority: Dict[str, str] = {}
    for key in keys:
        votes: Counter = Counter()
        for c, f in parsed.items():
            value = f.get(key, "(not given)")
            if "***" not in value:
                votes[value] += len(by_cmdline[c])
        if votes:
            value, count = votes.most_common(1)[0]
            if count * 2 > total:  # a clear majority, or no lead to take
                majority[key] = value
    groups: Dict[Tuple[Tuple[str, str, str], ...], List[RankSnapshot]] = {}
    for c, f in parsed.items():
        diff = tuple(sorted((k, f.get(k, "(not given)"), v) for k, v in majority.items()
                            if f.get(k, "(not given)") != v and "***" not in f.get(k, "")))
        if diff:
            groups.setdefault(diff, []).extend(by_cmdline[c])
    out = []
    for diff, members in sorted(groups.items(), key=lambda kv: len(kv[1])):
        ordered = sorted(members, key=rank_key)
        few = len(members) * 3 <= total
        out.append(Fact("launch_differs", ranks_who(tuple(map(rank_key, ordered)), tuple(r.rank for r in ordered)),
                        "medium" if few else "low", LaunchEvidence(diff, total, few), culprit=few))
    return out


# torch.distributed's client of the job's store: init_process_group's env:// rendezvous (and a TCPStore made by the
# job) connect to host:port here, retrying with a sleep between tries while nothing accepts
_STORE_CONNECT = (("_create_c10d_store", "torch/distributed/rendezvous.py"),)


@dataclass(frozen=True)
class StoreEvidence(Evidence):
    """Ranks that try to reach the job's store at another address than the one their launcher gave them (MASTER_ADDR
    and MASTER_PORT in their environment as it started them), retrying: nothing listens where they connect."""

    connect: str  # host:port the ranks connect to (the call's own arguments)
    given: str  # MASTER_ADDR:MASTER_PORT of their environment
    total: int  # ranks of the job
    retrying: bool = False  # a rank was seen asleep between two connection attempts
    # some ranks are connected to another store than the one their job's other ranks use (split_store_facts)
    connected: bool = False
    holder: str = ""  # who listens where they are connected, when a process of the snapshot does ("pid 98 on node04 ...")


def _store_connect(r: RankSnapshot) -> Optional[Tuple[str, str, bool]]:
    """(host, port, retrying) of a rank whose main thread is creating its store client, from that call's arguments;
    retrying: it sleeps between connection attempts (nothing accepted the last one)."""
    t = r.main_thread
    if t is None:
        return None
    for f in t.frames[:64]:
        if f.native or not any(f.function.endswith(name) and f.filename.replace("\\", "/").endswith(path)
                               for name, path in _STORE_CONNECT):
            continue
        host = next((loc.repr for loc in f.locals if loc.name == "hostname"), "")
        port = next((loc.repr for loc in f.locals if loc.name == "port"), "")
        retrying = t.waits is not None and t.waits.family == "sleep"
        return host.strip("'\"")[:100], port[:10], retrying
    return None


def store_facts(ranks: Sequence[RankSnapshot]) -> List[Fact]:
    """Every rank stuck connecting to a store at another port (or host) than its launcher's: the job set its own
    MASTER_PORT/MASTER_ADDR (or passed them to init_process_group) where the launcher's store is elsewhere."""
    if not ranks or len(ranks) > 1 << 17:
        return []
    seen: Dict[Tuple[str, str], List[RankSnapshot]] = {}
    given: Counter = Counter()
    retrying = False
    for r in ranks:
        hit = _store_connect(r)
        if hit is None or not hit[1].isdigit() or r.master_port is None or not r.master_addr:
            return []  # a rank elsewhere, or without the launcher's address: not this class
        host, port, sleeps = hit
        retrying = retrying or sleeps
        if any(sock.state == "ESTABLISHED" and sock.peer.rsplit(":", 1)[-1] == port for sock in r.sockets):
            return []  # connected to it: something listens there
        if int(port) == r.master_port and host.lower() in (r.master_addr.lower(), ""):
            return []  # the launcher's own store: whatever keeps it from answering is another class
        seen.setdefault((host, port), []).append(r)
        given[f"{r.master_addr}:{r.master_port}"] += 1
    if len(seen) != 1 or len(given) != 1:
        return []
    (host, port), members = next(iter(seen.items()))
    ordered = sorted(members, key=rank_key)
    # no rank holds a connection to that address (each attempt's socket is closed before the next); a rank seen
    # asleep between two attempts makes it sure (a sample can also catch a thread restarting its sleep)
    return [Fact("store_differs", ranks_who(tuple(map(rank_key, ordered)), tuple(r.rank for r in ordered)),
                 "high" if retrying else "medium", StoreEvidence(f"{host}:{port}", given.most_common(1)[0][0],
                                                                 len(ranks), retrying))]


# the frames of a rank still joining its process group: init_process_group's rendezvous and the group's creation
_JOINING = frozenset({"init_process_group", "_new_process_group_helper", "_create_c10d_store", "_env_rendezvous_handler",
                      "rendezvous", "_store_based_barrier"})
Listeners = Mapping[Tuple[str, int], str]  # (node, port) -> who listens there, said ("pid 98 on node04 (...)")


def _joining(r: RankSnapshot) -> bool:
    t = r.main_thread
    return t is not None and any(not f.native and f.function.rsplit(".", 1)[-1] in _JOINING
                                 and "torch/distributed/" in f.filename.replace("\\", "/") for f in t.frames[:64])


def split_store_facts(ranks: Sequence[RankSnapshot], nodes_of: Mapping[str, str], listeners: Listeners) -> List[Fact]:
    """Ranks still joining their process group that hold no connection to their job's store (the port their
    environment gives, to which the job's other ranks are connected) but one to another address, all the same:
    they rendezvous in another store (MASTER_ADDR/MASTER_PORT changed inside the process: an env file it reads, a
    config, an init_method; a store left by an earlier run answers there), and the others wait for them.
    `nodes_of`: address -> node, `listeners`: who listens on a node's port (the whole snapshot's)."""
    if len(ranks) < 2 or len(ranks) > 1 << 17:
        return []
    inside, outside = [], []
    for r in ranks:
        if r.master_port is None:
            return []
        live = [x for x in r.sockets if x.state == "ESTABLISHED"]
        if any(x.peer.rsplit(":", 1)[-1] == str(r.master_port) for x in live):
            inside.append(r)
        elif _joining(r) and live:
            outside.append(r)
    if not inside or not outside or len(outside) >= len(inside):
        return []
    common = Counter(x.peer for r in outside for x in r.sockets if x.state == "ESTABLISHED").most_common(1)
    if not common or common[0][1] < len(outside):
        return []  # not one address that every such rank holds
    where = common[0][0]
    host, _, port = where.rpartition(":")
    holder = listeners.get((nodes_of.get(host.strip("[]"), ""), int(port))) if port.isdigit() else None
    given = Counter(f"{r.master_addr}:{r.master_port}" for r in inside).most_common(1)[0][0]
    ordered = sorted(outside, key=rank_key)
    return [Fact("store_differs", ranks_who(tuple(map(rank_key, ordered)), tuple(r.rank for r in ordered)),
                 "high" if holder else "medium",
                 StoreEvidence(where, given, len(ranks), connected=True, holder=holder or ""))]
