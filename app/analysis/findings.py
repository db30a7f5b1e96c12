"""Findings: the facts of the analysis as sentences, the form every screen and report reads.

A Finding is what the text layer (app/analysis/prose) writes for one typed Fact (app/analysis/facts.py): the
same kind, subject and strength, with a title (one sentence), a detail (what differs, with the frames on both
sides), and why that confidence. Nothing in the analysis reads a Finding's text: the wait graph, the
calibration and the culprit are computed from the facts before any sentence exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from app.analysis.facts import KINDS, ORDER, Confidence, FactKind
from app.analysis.fold import RankKey

__all__ = ["Finding", "FindingKind", "Confidence", "KINDS"]

FindingKind = FactKind
KIND_ORDER: Tuple[str, ...] = ORDER


@dataclass(frozen=True)
class Finding:
    kind: FactKind
    title: str  # one sentence: "rank 5 is in `next_batch` (loader.py:31) while 7 others wait in `all_reduce`"
    detail: str  # what is different, in plain words, with the frames on both sides
    confidence: Confidence
    reason: str  # why that confidence
    ranks: Tuple[RankKey, ...] = ()
    ranks_label: str = ""  # `ranks 0-6,8-15 on node[01-04]`: for display
    nodes: str = ""  # `node[01-04]`: for display
    culprit: bool = True  # False for notes about the data (incomplete, cannot tell)
    class_index: Optional[int] = None
