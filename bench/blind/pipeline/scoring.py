"""Scoring a headline (hangscope's verdict, the first line of `--print`) against the blind pipeline-parallel set's truth.json.

A headline matches a word list when it contains any of its alternatives, case-insensitively, on word boundaries:
an alternative that starts (ends) with a letter, digit or underscore does not match where one precedes (follows)
it, so "lock" does not match inside "blocked" or "_tstate_lock", "rank 1" not inside "rank 12", "tty" not inside
"n_tty_write". Three lists per scenario: the culprit,
the blocking operation, and the resource it waits for / who could release it. The mechanism is named when both
the operation and the resource are.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
TRUTH = HERE / "truth.json"
_WORD = re.compile(r"[a-z0-9_]")


def load_truth(path: Path = TRUTH) -> Dict[str, dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return {entry["name"]: entry for entry in data["scenarios"]}


def says(headline: str, words: Iterable[str]) -> Optional[str]:
    """The first alternative the headline contains, or None."""
    text = headline.lower()
    for word in words:
        w = word.lower()
        pattern = ((r"(?<![a-z0-9_])" if _WORD.match(w[:1]) else "") + re.escape(w)
                   + (r"(?![a-z0-9_])" if _WORD.match(w[-1:]) else ""))
        if re.search(pattern, text):
            return word
    return None


@dataclass
class Score:
    name: str
    headline: str
    culprit: bool
    operation: bool
    resource: bool
    seconds: Optional[float] = None
    error: str = ""

    @property
    def mechanism(self) -> bool:
        return self.operation and self.resource


def judge(name: str, headline: str, truth: dict, seconds: Optional[float] = None, error: str = "") -> Score:
    return Score(name, headline,
                 says(headline, truth["culprit_words"]) is not None,
                 says(headline, truth["operation_words"]) is not None,
                 says(headline, truth["resource_words"]) is not None,
                 seconds, error)


def _yn(ok: bool) -> str:
    return "yes" if ok else "no"


def table(scores: Sequence[Score]) -> str:
    """The markdown table and the totals."""
    lines = ["| scenario | culprit right | operation named | resource/releaser named | seconds |",
             "|---|---|---|---|---|"]
    for s in scores:
        secs = f"{s.seconds:.1f}" if s.seconds is not None else "-"
        if s.error:
            lines.append(f"| {s.name} | error | error | error | {secs} |")
            continue
        lines.append(f"| {s.name} | {_yn(s.culprit)} | {_yn(s.operation)} | {_yn(s.resource)} | {secs} |")
    n = len(scores)
    culprit = sum(s.culprit for s in scores)
    op = sum(s.operation for s in scores)
    res = sum(s.resource for s in scores)
    mech = sum(s.mechanism for s in scores)
    lines += ["",
              f"culprit rate: {culprit}/{n}" + (f" ({100 * culprit / n:.0f}%)" if n else ""),
              f"mechanism rate (operation AND resource named): {mech}/{n}" + (f" ({100 * mech / n:.0f}%)" if n else ""),
              f"  operation named: {op}/{n}; resource/releaser named: {res}/{n}"]
    return "\n".join(lines)


def headlines(scores: Sequence[Score]) -> str:
    """Each scenario's headline, verbatim, in a fenced block (headlines may hold backquotes)."""
    out: List[str] = ["```text"]
    for s in scores:
        out.append(f"{s.name}: " + (f"ERROR: {s.error}" if s.error else s.headline))
    out.append("```")
    return "\n".join(out)
