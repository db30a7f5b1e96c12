"""PyTorch's Flight Recorder in the analysis: each rank's last collective per process group, and who lags.

A rank whose record shows fewer collectives issued in a process group than most ranks of that group has not
reached the collective the others wait in. Ranks are compared per group with the group's most common
count (a rank can be behind in one group and ahead in another: one that skipped a step). A job without the
recorder gets one line saying so, never a finding per rank: hangscope never requires it.

Two rules say why, where the records tell it (both as `collective_lag`, with `FlightEvidence.stage`):

- **Elsewhere** (stage "issued", `elsewhere` set): a rank behind in one group that issued a collective in another
  group which no other rank's record holds waits there: the ranks call collectives of different groups (a member
  of that other group waits in the first group for it: a cycle). Its own record, not a vote, says so.
- **Not started** (stage "started"): every rank issued collective #n of a group, the recorder marks when each
  began on the GPU (NCCL with TORCH_NCCL_ENABLE_TIMING; gloo never marks a start), and a few ranks' GPUs have
  not begun it while the others' have: those GPUs still run work queued before it (a kernel that does not end, a
  wait on another stream or event), and the others wait in the collective on their GPUs for them. Their hosts
  look alike (all in the synchronisation): only this tells them apart.

Three more compare what the ranks issued, as PyTorch's own Flight Recorder analyser does (sequence numbers, then
the collective at the same number):

- **Ahead** (stage "ahead"): a few ranks issued more collectives in a group than the rest and wait in the last
  one: they issued one the others have not (an extra collective on a branch only they take), or the rest is held
  before it. Never [high]: the record alone does not say which.
- **Crossed** (stage "crossed"): ranks behind in one group wait in a second one, where other ranks are behind,
  which wait in the first: members of both groups that call the two groups' collectives in opposite orders (a
  cycle). The records do not say which order was meant: both sides are named.
- **Another collective** (stage "op"): the ranks issued the same number of collectives, but at that number a
  few issued another one (a barrier where the rest all_reduce, a swapped pair): the collectives do not match, and
  each side waits for the other.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Dict, List, Literal, Optional, Sequence, Tuple

from app.analysis.columns import Facts, facts_of
from app.analysis.facts import Confidence, Evidence, Fact, ranks_who
from app.analysis.fold import RankKey, count_phrase, describe, fold_ints, keys_of, sort_ranks
from app.analysis.frames import clean
from app.model import FlightGroup, FlightRecord, RankSnapshot

ENABLE_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
HOW_TO = ("gloo dumps no record by itself: run the training under torch.distributed.elastic.control_plane."
          "worker_main() with TORCH_WORKER_SERVER_SOCKET set to a path of its own for each rank, and hangscope "
          "reads the record from that socket")
MAX_ROWS = 8
MAX_SIDES = 64  # sets of lagging ranks searched for crossed pairs
_name = itemgetter(0)

FlightState = Literal["unused", "no_record", "recorded"]


@dataclass(frozen=True)
class FlightRow:
    """Ranks whose records agree, and their last collective per process group."""

    ranks: Tuple[RankKey, ...]
    label: str  # `ranks 0-2 on node[01-02]`
    text: str  # `pg 1: #3 issued, #2 completed (gloo:all_reduce); pg 2: #2 issued, #2 completed`


@dataclass(frozen=True)
class FlightSummary:
    state: FlightState
    line: str  # the one line the summary prints
    enabled: int = 0  # ranks whose environment enables the recorder
    recorded: int = 0  # ranks whose record was read
    rows: Tuple[FlightRow, ...] = ()


def group_text(g: FlightGroup) -> str:
    """`pg 1: #3 issued, #2 completed (gloo:all_reduce)`; the name of the group's newest collective only when
    it has not completed."""
    name = f" {clean(g.name, 40)}" if g.name else ""
    issued = f"#{g.last_enqueued}" if g.last_enqueued is not None else "none"
    done = f"#{g.last_completed}" if g.last_completed is not None else "none"
    pending = g.last_enqueued is not None and g.last_enqueued != g.last_completed and g.last_collective
    return f"pg {clean(g.pg_id, 40)}{name}: {issued} issued, {done} completed" + (
        f" ({clean(g.last_collective, 60)})" if pending else "")


def rank_text(record: Optional[FlightRecord]) -> str:
    """One rank's record in a line, for the rank's detail next to its stack (TUI, report)."""
    if record is None:
        return ""
    if not record.source:
        return "flight recorder enabled, no record read" + (f": {clean(record.notes[0], 200)}" if record.notes
                                                             else "")
    return "; ".join(map(group_text, record.groups)) or "flight recorder: no collective recorded yet"


def _enabled_names(envs: Sequence[Tuple[Tuple[str, str], ...]]) -> List[str]:
    # every rank's allowlisted env in one C-level sweep (100k ranks: a few ms)
    names = set(map(_name, chain.from_iterable(envs)))
    return [n for n in ENABLE_VARS if n in names]


def _enabled(r: RankSnapshot) -> bool:
    for n in ENABLE_VARS:
        v = r.env_value(n)
        if v is not None and v.strip().isdigit() and int(v) > 0:
            return True
    return r.flight is not None


def flight_analysis(ranks: Sequence[RankSnapshot], known: Optional[Facts] = None
                    ) -> Tuple[Optional[FlightSummary], List[Fact]]:
    """The summary line (None without ranks) and a finding per group of ranks that lag. `known`: the ranks'
    columns when the caller has read them already."""
    if not ranks:
        return None, []
    f = facts_of(ranks, known)
    if not any(f.flight) and not _enabled_names(f.env):
        return FlightSummary("unused", "Flight recorder: not used by this job (no TORCH_FR_BUFFER_SIZE or "
                             "TORCH_NCCL_TRACE_BUFFER_SIZE in the ranks' environment)"), []
    enabled = [r for r in ranks if _enabled(r)]
    recorded = [r for r in enabled if r.flight is not None and r.flight.source]
    if not recorded:
        note = next((n for r in enabled if r.flight for n in r.flight.notes), "")
        why = f" ({clean(note, 200)})" if note else ""
        return FlightSummary("no_record", f"Flight recorder: enabled on {count_phrase(len(enabled))} but no record "
                             f"could be read{why}; {HOW_TO}", len(enabled)), []
    sources = sorted({"their worker servers" if r.flight.source == "worker_server" else "dump files"
                      for r in recorded if r.flight is not None})
    line = (f"Flight recorder: last collective per process group, from {' and '.join(sources)} of "
            f"{len(recorded)} of {count_phrase(len(enabled))} that enable it")
    return (FlightSummary("recorded", line, len(enabled), len(recorded), _rows(recorded)),
            lag_findings(recorded, complete=len(recorded) == len(ranks)))


def _rows(ranks: Sequence[RankSnapshot]) -> Tuple[FlightRow, ...]:
    by_text: Dict[str, List[RankSnapshot]] = defaultdict(list)
    for r in ranks:
        by_text[rank_text(r.flight)].append(r)
    rows = sorted(by_text.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return tuple(FlightRow(keys_of(sort_ranks(rs)), describe(sort_ranks(rs)), text) for text, rs in rows[:MAX_ROWS])


@dataclass(frozen=True)
class FlightEvidence(Evidence):
    """Ranks behind in a process group by the recorder's own sequence numbers: (pg, theirs here, the usual) for
    every group where they differ, the group they lag in, and how many ranks are at the usual count there."""

    devs: Tuple[Tuple[str, int, int], ...]
    pg: str
    issued: int
    usual: int
    others: int
    names: Tuple[Tuple[str, str], ...] = ()  # pg -> its newest collective's profiling name
    # "issued": fewer collectives issued; "started": as many issued, but its GPU has not started the last one
    # (issued/usual are then the started counts); "ahead": more issued than the rest; "op": as many issued, but
    # another collective at the last number
    stage: str = "issued"
    # collectives these ranks issued that no other rank's record holds: (pg, seq, profiling name); the group they
    # wait in instead of the one they lag in
    elsewhere: Tuple[Tuple[str, int, str], ...] = ()
    records: int = 0  # ranks whose record was read (the "no other rank" of `elsewhere` is among these)
    complete: bool = False  # every rank of the job had its record read
    op: str = ""  # stage "op": the collective these ranks issued at #usual (`names` holds the others')
    # stage "crossed": the rank numbers of the two sides; elsewhere: (group, #) each side waits in, in that order
    sides: Tuple[Tuple[Optional[int], ...], Tuple[Optional[int], ...]] = ((), ())


def group_key(g: FlightGroup) -> str:
    """One group across ranks. A rank's `pg_id` counts only the groups it is a member of, so two ranks in other
    subgroups (a TP group each) give the same id to different groups; torch's group name and its members (as
    PyTorch's own analyser joins them) name one group on every rank. Older records have neither: their id."""
    if g.global_name:
        return g.global_name + ("|" + ",".join(map(str, g.members)) if g.members else "")
    return g.pg_id


def _label(g: FlightGroup, world: int) -> str:
    """How a group is called in sentences: its description (`tp_b`), else torch's name, else the rank's own id;
    with its members when it is not every rank's group."""
    base = (g.name if g.name not in ("", "undefined", "default_pg") else "") or g.global_name or g.pg_id
    if g.members and len(g.members) < world:
        base += f" (ranks {fold_ints(sorted(g.members))})"
    return clean(base, 80)


def _keys(record: FlightRecord, grouped: Dict[str, FlightGroup]) -> Dict[str, str]:
    """This record's group ids -> group_key (`grouped`: its groups by group_key)."""
    out = {g.pg_id: k for k, g in grouped.items()}
    for e in record.entries:  # a group whose status line is missing: its entries still name it
        if e.pg_id not in out and e.pg_name:
            out[e.pg_id] = e.pg_name
    return out


def _issued(record: FlightRecord, grouped: Dict[str, FlightGroup]) -> Dict[str, Tuple[int, str]]:
    """group_key -> (the newest collective's sequence number this rank issued, its profiling name), from the
    groups' counts and the entries (NCCL's own recorder lists a group's entries where its status line has no
    count)."""
    keys = _keys(record, grouped)
    out: Dict[str, Tuple[int, str]] = {}
    for k, g in grouped.items():
        if g.last_enqueued is not None:
            out[k] = (g.last_enqueued, g.last_collective)
    for e in record.entries:
        k = keys.get(e.pg_id, e.pg_id)
        if not e.is_p2p and e.collective_seq_id > out.get(k, (0, ""))[0]:
            out[k] = (e.collective_seq_id, e.profiling_name)
    return out


def _elsewhere(grouped: Sequence[Dict[str, FlightGroup]], issued: Sequence[Dict[str, Tuple[int, str]]],
               members: Sequence[int], lag_pg: str, by_pg: Dict[str, List[int]]) -> Tuple[Tuple[str, int, str], ...]:
    """The collectives `members` issued in groups other than `lag_pg` that no other rank's record holds (a
    group's sequence number beyond every other rank's there): where they wait instead. `issued`: _issued() per
    rank; `by_pg`: each group's sequence numbers over all ranks, sorted (one bisect per group, not a scan)."""
    mine = [issued[i] for i in members]
    if not mine or len(members) == len(issued):
        return ()
    out = []
    for pg in sorted(set(mine[0]).intersection(*mine[1:]) - {lag_pg}):
        seq = min(m[pg][0] for m in mine)
        values = by_pg[pg]
        reached = len(values) - bisect_left(values, seq)  # ranks that issued #seq or later there, members too
        groups = [grouped[i].get(pg) for i in members]
        if (seq > 0 and reached == len(mine) and all(_open(g, seq) for g in groups)
                and all(g is not None and len(g.members) != 1 for g in groups)):  # a group of one waits for nobody
            out.append((pg, seq, mine[0][pg][1]))
    return tuple(out)


def _confidence(n: int, others: int) -> Confidence:
    if n == others:
        return "low"
    if n * 3 <= others:
        return "high"
    return "medium"


def lag_findings(ranks: Sequence[RankSnapshot], complete: bool = False) -> List[Fact]:
    """Ranks that issued fewer collectives in a group than most of the group's ranks did (and where they wait
    instead, when their records say), and ranks whose GPU has not started a collective the others' GPUs have
    (the module doc). `complete`: `ranks` are all the job's ranks (every record was read)."""
    counts: Dict[str, Dict[int, int]] = defaultdict(dict)  # group_key -> rank index -> last enqueued
    names: Dict[str, str] = {}
    labels: Dict[str, str] = {}
    grouped: List[Dict[str, FlightGroup]] = []  # per rank: its groups by group_key (the key made once)
    for i, r in enumerate(ranks):
        assert r.flight is not None
        grouped.append({})
        for g in r.flight.groups:
            k = group_key(g)
            grouped[i][k] = g
            labels.setdefault(k, _label(g, len(ranks)))
            if g.last_enqueued is not None:
                counts[k][i] = g.last_enqueued
                if g.last_collective:
                    names.setdefault(k, g.last_collective)
    usual: Dict[str, int] = {}
    for pg, values in counts.items():
        tally = Counter(values.values()).most_common()
        top = tally[0][1]
        usual[pg] = max(v for v, n in tally if n == top)  # a tie: the furthest count is the one others wait in
    deviations: Dict[Tuple[Tuple[str, int, int], ...], List[int]] = defaultdict(list)
    for i in range(len(ranks)):
        mine = tuple((pg, values[i], usual[pg]) for pg, values in sorted(counts.items())
                     if i in values and values[i] != usual[pg])
        if any(v < u for _, v, u in mine):
            deviations[mine].append(i)
    issued_by = [_issued(r.flight, grouped[i]) if r.flight is not None else {} for i, r in enumerate(ranks)]
    by_pg: Dict[str, List[int]] = defaultdict(list)
    for one in issued_by:
        for pg, (seq, _) in one.items():
            by_pg[pg].append(seq)
    for seqs in by_pg.values():
        seqs.sort()
    out: List[Fact] = []
    crossed = _crossed(ranks, grouped, deviations, issued_by, labels, complete)
    paired = {tuple(m) for f_members in crossed for m in f_members[1]}
    out += [f for f, _ in crossed]
    for devs, members in sorted(deviations.items(), key=lambda kv: len(kv[1])):
        if tuple(members) in paired:
            continue  # said as one of a crossed pair
        rs = sort_ranks(ranks[i] for i in members)
        pg, issued, theirs = next(d for d in devs if d[1] < d[2])
        others = sum(1 for v in counts[pg].values() if v == theirs)
        conf = _confidence(len(rs), others)
        elsewhere = _elsewhere(grouped, issued_by, members, pg, by_pg)
        if elsewhere and complete and len(rs) < others:
            conf = "high"  # their own records put them in a collective no other rank issued: not a vote
        label = labels.get
        out.append(Fact("collective_lag", ranks_who(keys_of(rs), tuple(r.rank for r in rs)), conf,
                        FlightEvidence(tuple((label(p, p), v, u) for p, v, u in devs), label(pg, pg), issued,
                                       theirs, others,
                                       tuple((label(p, p), names[p]) for p, _, _ in devs if p in names),
                                       elsewhere=tuple((label(p, p), q, n) for p, q, n in elsewhere),
                                       records=len(ranks), complete=complete)))
    lagging = {i for members in deviations.values() for i in members}
    ahead, odd = _ahead(ranks, grouped, counts, usual, issued_by, lagging, complete, labels)
    out += ahead
    odd |= lagging
    out += _other_op(ranks, grouped, counts, usual, issued_by, odd, complete, labels)
    return out + _not_started(ranks, grouped, counts, usual, names, odd, complete, labels)


def _crossed(ranks: Sequence[RankSnapshot], grouped: Sequence[Dict[str, FlightGroup]],
             deviations: Dict[Tuple[Tuple[str, int, int], ...], List[int]],
             issued_by: Sequence[Dict[str, Tuple[int, str]]], labels: Dict[str, str], complete: bool
             ) -> List[Tuple[Fact, Tuple[List[int], List[int]]]]:
    """Two sets of ranks, each behind in the group where the other waits (the module doc's "crossed"): members of
    both groups that call their collectives in opposite orders. One fact for both sides."""
    sides = []  # (members, the group they lag in, their count there, {group: the open collective's number})
    for devs, members in deviations.items():
        pg, v, _ = next(d for d in devs if d[1] < d[2])
        waits = []
        for i in members:
            waits.append({k: seq for k, (seq, _) in issued_by[i].items() if k != pg and _open(grouped[i].get(k), seq)})
        common = {k: min(w[k] for w in waits) for k in set(waits[0]).intersection(*waits[1:])} if waits else {}
        sides.append((members, pg, v, common))
    out: List[Tuple[Fact, Tuple[List[int], List[int]]]] = []
    used: set = set()
    if len(sides) > MAX_SIDES:
        return out  # scattered lags: pairs are not looked for (quadratic)
    for a in range(len(sides)):
        for b in range(a + 1, len(sides)):
            (ma, ga, va, wa), (mb, gb, vb, wb) = sides[a], sides[b]
            if a in used or b in used or ga == gb:
                continue
            # a waits in gb at #wa[gb], which b has not issued (b is at vb there), and the other way round
            if gb in wa and ga in wb and vb < wa[gb] and va < wb[ga]:
                used.update((a, b))
                if min(ranks[i].rank or 0 for i in mb) < min(ranks[i].rank or 0 for i in ma):
                    (ma, ga, va, wa), (mb, gb, vb, wb) = (mb, gb, vb, wb), (ma, ga, va, wa)
                # ma lags in ga (at #va) and waits in gb (#wa[gb]); mb lags in gb (#vb) and waits in ga (#wb[ga])
                rs = sort_ranks(ranks[i] for i in ma + mb)
                e = FlightEvidence(((labels[ga], va, wb[ga]), (labels[gb], vb, wa[gb])), labels[ga], va, wb[ga],
                                   len(mb), ((labels[gb], issued_by[ma[0]][gb][1]),
                                             (labels[ga], issued_by[mb[0]][ga][1])),
                                   stage="crossed", elsewhere=((labels[gb], wa[gb], ""), (labels[ga], wb[ga], "")),
                                   records=len(ranks), complete=complete,
                                   sides=(tuple(ranks[i].rank for i in ma), tuple(ranks[i].rank for i in mb)))
                out.append((Fact("collective_lag", ranks_who(keys_of(rs), tuple(r.rank for r in rs)),
                                 "high" if complete else "medium", e), (ma, mb)))
    return out


def _ahead(ranks: Sequence[RankSnapshot], grouped: Sequence[Dict[str, FlightGroup]],
           counts: Dict[str, Dict[int, int]], usual: Dict[str, int],
           issued_by: Sequence[Dict[str, Tuple[int, str]]], lagging: set, complete: bool,
           labels: Dict[str, str]) -> Tuple[List[Fact], set]:
    """A minority that issued more collectives in a group than the rest and has not completed the last one (the
    module doc's "ahead"): [medium] at most. The facts, and the indices of the ranks they name."""
    groups: Dict[Tuple[str, int, int], List[int]] = defaultdict(list)
    for pg, values in sorted(counts.items()):
        for i, v in values.items():
            if v > usual[pg] and i not in lagging and _open(grouped[i].get(pg), v):
                groups[(pg, v, usual[pg])].append(i)
    out, named = [], set()
    for (pg, v, u), members in sorted(groups.items(), key=lambda kv: len(kv[1])):
        others = sum(1 for x in counts[pg].values() if x == u)
        if len(members) >= others:
            continue
        named.update(members)
        rs = sort_ranks(ranks[i] for i in members)
        name = issued_by[members[0]].get(pg, (0, ""))[1]
        out.append(Fact("collective_lag", ranks_who(keys_of(rs), tuple(r.rank for r in rs)),
                        "medium" if len(members) * 3 <= others else "low",
                        FlightEvidence(((labels[pg], v, u),), labels[pg], v, u, others,
                                       ((labels[pg], name),) if name else (), stage="ahead", records=len(ranks),
                                       complete=complete)))
    return out, named


def _open(g: Optional[FlightGroup], seq: int) -> bool:
    """The rank has not completed its collective #seq of the group (it waits in it, or has not begun)."""
    return g is not None and (g.last_completed is None or g.last_completed < seq)


def _other_op(ranks: Sequence[RankSnapshot], grouped: Sequence[Dict[str, FlightGroup]],
              counts: Dict[str, Dict[int, int]], usual: Dict[str, int],
              issued_by: Sequence[Dict[str, Tuple[int, str]]], odd: set, complete: bool,
              labels: Dict[str, str]) -> List[Fact]:
    """At a group's usual number, a minority whose collective there is another than the rest's (the module doc's
    "another collective"); none where the collective completed on any of them."""
    out = []
    for pg, values in sorted(counts.items()):
        n = usual[pg]
        by_op: Dict[str, List[int]] = defaultdict(list)
        for i, v in values.items():
            seq, name = issued_by[i].get(pg, (0, ""))
            if v == n and seq == n and name and i not in odd:
                if not _open(grouped[i].get(pg), n):
                    by_op = {}
                    break  # one of them finished #n: whatever they issued there, it matched
                by_op[name].append(i)
        if len(by_op) < 2:
            continue
        tally = sorted(by_op.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        major, majority = tally[0]
        for name, members in tally[1:]:
            if len(members) >= len(majority):
                continue
            rs = sort_ranks(ranks[i] for i in members)
            out.append(Fact("collective_lag", ranks_who(keys_of(rs), tuple(r.rank for r in rs)),
                            _confidence(len(members), len(majority)),
                            FlightEvidence(((labels[pg], n, n),), labels[pg], n, n, len(majority),
                                           ((labels[pg], major),), stage="op", records=len(ranks),
                                           complete=complete, op=name)))
    return out


def _not_started(ranks: Sequence[RankSnapshot], grouped: Sequence[Dict[str, FlightGroup]],
                 counts: Dict[str, Dict[int, int]], usual: Dict[str, int],
                 names: Dict[str, str], lagging: set, complete: bool, labels: Dict[str, str]) -> List[Fact]:
    """Ranks that issued a group's usual collective #n whose GPU has not started it, where the others' GPUs
    have and none has completed it (the module doc's second rule). Only where every such rank's record tracks
    starts: gloo's never does, nor NCCL's without TORCH_NCCL_ENABLE_TIMING."""
    out = []
    for pg, values in sorted(counts.items()):
        n = usual[pg]
        at = [i for i, v in values.items() if v == n and i not in lagging]
        started: Dict[int, Optional[int]] = {}
        for i in at:
            g = grouped[i][pg]  # it counted there: the group is in its record
            if g.last_completed is not None and g.last_completed >= n:
                started = {}
                break  # someone finished it: not a collective the group is stuck in
            started[i] = g.last_started
        if not started or any(v is None for v in started.values()):
            continue
        behind = [i for i, v in started.items() if v is not None and v < n]
        began = len(started) - len(behind)
        if not behind or not began or len(behind) >= began:
            continue
        rs = sort_ranks(ranks[i] for i in behind)
        first = min(v for i, v in started.items() if i in behind and v is not None)
        out.append(Fact("collective_lag", ranks_who(keys_of(rs), tuple(r.rank for r in rs)),
                        _confidence(len(rs), began),
                        FlightEvidence(((labels[pg], first, n),), labels[pg], first, n, began,
                                       ((labels[pg], names[pg]),) if pg in names else (), stage="started",
                                       records=len(ranks), complete=complete)))
    return out
