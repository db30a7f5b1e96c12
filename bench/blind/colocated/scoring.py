"""Scoring a headline (hangscope's verdict, the first paragraph of `--print`) against the blind co-located set's
truth.json.

A headline matches a word list when it contains any of its alternatives, case-insensitively, on word boundaries:
an alternative that starts (ends) with a letter, digit or underscore does not match where one precedes (follows)
it, so "lock" does not match inside "blocked" or "_tstate_lock", "rank 1" not inside "rank 12", "tty" not inside
"n_tty_write". Three lists per scenario: the culprit,
the blocking operation, and the resource it waits for / who could release it. The mechanism is named when both
the operation and the resource are.

A word may name a process of the run by placeholder, filled from the run's facts (run.py's notes, data/notes.json
offline): "{evaluator.proc}" matches where the headline gives the pid (as the node sees it) of the extra process of
role `evaluator` (or "{rank5.proc}", rank 5's) with that process's node as the nearest node name within 80 characters
(pids are per node); "{evaluator.pid}" / "{evaluator.node}" inside a word are replaced by the value. A word whose
placeholder has no value is dropped.
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


_PLACE = re.compile(r"\{(\w+)\.(pid|node)\}")


def fill(words: Iterable[str], facts: Optional[dict]) -> List[str]:
    """The words with their placeholders filled from the run's facts (roles, ranks)."""
    out: List[str] = []
    for word in words:
        missing = False

        def sub(m: "re.Match[str]") -> str:
            nonlocal missing
            who, what = m.group(1), m.group(2)
            if who.startswith("rank") and who[4:].isdigit():
                value = ((facts or {}).get("ranks") or {}).get(who[4:], {}).get(what)
            else:
                value = ((facts or {}).get("roles") or {}).get(who, {}).get(what)
            if not value:
                missing = True
                return ""
            return str(value)

        text = _PLACE.sub(sub, word)
        if not missing:
            out.append(text)
    return out


_NODE = re.compile(r"node\d\d")


def names_process(headline: str, word: str, facts: Optional[dict]) -> bool:
    """"{role.proc}": the headline names that process by its pid ("pid N", "PID N", "N (" ...), with its own node
    the nearest node name around it (pids are per node: the same number names another process on another node)."""
    m = re.fullmatch(r"\{(\w+)\.proc\}", word)
    if m is None:
        return False
    who = m.group(1)
    if who.startswith("rank") and who[4:].isdigit():
        info = ((facts or {}).get("ranks") or {}).get(who[4:], {})
    else:
        info = ((facts or {}).get("roles") or {}).get(who, {})
    pid, node = info.get("pid"), info.get("node")
    if not pid or not node:
        return False
    for hit in re.finditer(rf"(?<![\w.]){pid}(?![\w])", headline):
        nodes = [(abs(n.start() - hit.start()), n.group()) for n in _NODE.finditer(headline)
                 if abs(n.start() - hit.start()) <= 80]
        if nodes and min(nodes)[1] == node:
            return True
    return False


def says_in(headline: str, words: Iterable[str], facts: Optional[dict]) -> Optional[str]:
    words = list(words)
    for word in words:
        if word.endswith(".proc}") and names_process(headline, word, facts):
            return word
    return says(headline, fill([w for w in words if not w.endswith(".proc}")], facts))


def judge(name: str, headline: str, truth: dict, seconds: Optional[float] = None, error: str = "",
          facts: Optional[dict] = None) -> Score:
    return Score(name, headline,
                 says_in(headline, truth["culprit_words"], facts) is not None,
                 says_in(headline, truth["operation_words"], facts) is not None,
                 says_in(headline, truth["resource_words"], facts) is not None,
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
