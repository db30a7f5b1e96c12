"""PyTorch's Flight Recorder in the analysis: each rank's last collective per process group, and who lags.

A rank whose record shows fewer collectives issued in a process group than most ranks of that group has not
reached the collective the others wait in. Ranks are compared per group with the group's most common
count (a rank can be behind in one group and ahead in another: one that skipped a step). A job without the
recorder gets one line saying so, never a finding per rank: hangscope never requires it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Dict, List, Literal, Optional, Sequence, Tuple

from app.analysis.columns import Facts, facts_of
from app.analysis.facts import Confidence, Evidence, Fact, ranks_who
from app.analysis.fold import RankKey, count_phrase, describe, keys_of, sort_ranks
from app.analysis.frames import clean
from app.model import FlightGroup, FlightRecord, RankSnapshot

ENABLE_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
HOW_TO = ("gloo dumps no record by itself: run the training under torch.distributed.elastic.control_plane."
          "worker_main() with TORCH_WORKER_SERVER_SOCKET set to a path of its own for each rank, and hangscope "
          "reads the record from that socket")
MAX_ROWS = 8
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
    return FlightSummary("recorded", line, len(enabled), len(recorded), _rows(recorded)), lag_findings(recorded)


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


def lag_findings(ranks: Sequence[RankSnapshot]) -> List[Fact]:
    """Ranks that issued fewer collectives in a group than most of the group's ranks did."""
    counts: Dict[str, Dict[int, int]] = defaultdict(dict)  # pg -> rank index -> last enqueued
    names: Dict[str, str] = {}
    for i, r in enumerate(ranks):
        assert r.flight is not None
        for g in r.flight.groups:
            if g.last_enqueued is not None:
                counts[g.pg_id][i] = g.last_enqueued
                if g.last_collective:
                    names.setdefault(g.pg_id, g.last_collective)
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
    out = []
    for devs, members in sorted(deviations.items(), key=lambda kv: len(kv[1])):
        rs = sort_ranks(ranks[i] for i in members)
        pg, issued, theirs = next(d for d in devs if d[1] < d[2])
        others = sum(1 for v in counts[pg].values() if v == theirs)
        conf: Confidence
        if len(rs) == others:
            conf = "low"
        elif len(rs) * 3 <= others:
            conf = "high"
        else:
            conf = "medium"
        out.append(Fact("collective_lag", ranks_who(keys_of(rs), tuple(r.rank for r in rs)), conf,
                        FlightEvidence(devs, pg, issued, theirs, others,
                                       tuple((p, names[p]) for p, _, _ in devs if p in names))))
    return out
