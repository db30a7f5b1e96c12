"""The ranks' recent error output (RankSnapshot.output, read on their nodes: workers/collect/output.py), grouped
for showing: ranks that write to one file share one block, and the blocks of the ranks the analysis blames come
first. What a rank that is not where the others are printed last is often the whole answer (a traceback caught
and swallowed, an NCCL warning, an out-of-memory error); it is shown as evidence, never turned into a finding by
itself: an error in a log shared by every rank may be another rank's, and an old one may be from before the hang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from app.analysis.culprit import Culprit
from app.analysis.frames import clean
from app.analysis.fold import describe
from app.model import ErrorOutput, RankKey, RankSnapshot, Snapshot, rank_key

MAX_BLOCKS = 8


@dataclass(frozen=True)
class OutputBlock:
    label: str  # "rank 3 on node02", "ranks 0-7 on node02"
    source: str  # "its stderr (/var/log/job.log)", "their elastic error file (/tmp/err.json)"
    text: str  # remote text, redacted on the node: display literally
    age: float | None  # seconds since the file was last written, when it was read
    blamed: bool  # one of the ranks is a culprit of the analysis


def blamed_ranks(culprits: Iterable[Culprit]) -> list[RankKey]:
    """The ranks the analysis blames: its culprits' (Analysis.culprits), the same every screen marks."""
    return [k for c in culprits for k in c.ranks]


def blocks(snapshot: Snapshot, blamed: Iterable[RankKey] = ()) -> list[OutputBlock]:
    """One block per (node, file, text), blamed ranks first, then by rank number; at most MAX_BLOCKS."""
    culprits = set(blamed)
    groups: dict[tuple[str, str, str, str], list[tuple[RankSnapshot, ErrorOutput]]] = {}
    for r in snapshot.ranks:
        for o in r.output:
            groups.setdefault((r.node, o.source, o.path, o.text), []).append((r, o))
    out = []
    for (_, source, path, text), members in groups.items():
        ranks: Sequence[RankSnapshot] = [r for r, _ in members]
        several = len(ranks) > 1
        what = "elastic error file" if source == "error_file" else "stderr"
        ages = [o.age for _, o in members if o.age is not None]
        out.append(OutputBlock(label=describe(ranks), source=f"{'their' if several else 'its'} {what} ({clean(path, 300)})",
                               text=text, age=min(ages) if ages else None,
                               blamed=any(rank_key(r) in culprits for r in ranks)))
    out.sort(key=lambda b: (not b.blamed, b.label))
    return out[:MAX_BLOCKS]


def age_text(age: float | None) -> str:
    if age is None:
        return ""
    if age < 120:
        return f"written {age:.0f} s before it was read"
    if age < 7200:
        return f"written {age / 60:.0f} min before it was read"
    return f"written {age / 3600:.0f} h before it was read (it may predate the hang)"
