"""Scoring hangscope's headline against the groups set's truth.json. Written, with truth.json, before hangscope ran
on any scenario of this set; do not change it to fit a run (write a new rule version beside it, and say so).

The headline is the first paragraph `hangscope HOSTS --print --snapshot FILE` prints (run.py's printed_headline);
the snapshot's analysis gives the findings (kind, confidence, culprit flag, title), read loosely.

  culprit right:    the first "rank N" the headline names (singular "rank": "ranks 0-6 wait for rank 7" names 7) is
                    one of truth's culprits. A headline that names no rank is not right. For a cycle, the culprit is
                    the rank that broke the order; the other member (truth's cycle_with) does not count.
  mechanism right:  the headline matches every one of truth's mechanism_words lists: a list matches when the
                    headline contains any of its alternatives (case-insensitive; an alternative ending in a digit
                    does not match where a digit follows, "rank 1" is not "rank 12"; one starting with "re:" is a
                    regular expression). The lists name the collective/call the culprit is in and what is wrong
                    with it (the other group, the other collective, the peer, the order...).
  wrong high:       the worst outcome, counted on its own: a lead of confidence high that blames a rank that is not
                    a culprit. Either a finding of the snapshot's analysis with confidence "high" that is a culprit
                    finding (its `culprit` flag true; where it has no such flag, a kind that is not a statement of
                    progress) whose title names (first "rank N") a rank outside truth's culprits; or a headline that
                    marks itself high ("[high]", "(... high)", "; high") while its first rank is not a culprit.
  partner named:    (information, not scored) for a cycle, the headline names truth's cycle_with rank too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
TRUTH = HERE / "truth.json"

RANK = re.compile(r"\brank\s+(\d+)\b", re.I)
HEADLINE_HIGH = re.compile(r"\[\s*high\s*\]|\([^()]*\bhigh\s*\)|;\s*high\b|\bconfidence:?\s*high\b", re.I)
PROGRESS_KIND = re.compile(r"progress|healthy|running|ok\b", re.I)


def load_truth(path: Path = TRUTH) -> Dict[str, dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return {entry["name"]: entry for entry in data["scenarios"]}


def says(text: str, words: Iterable[str]) -> Optional[str]:
    """The first alternative the text contains, or None."""
    low = text.lower()
    for word in words:
        if word.startswith("re:"):
            if re.search(word[3:], text, re.I):
                return word
            continue
        w = word.lower()
        pattern = re.escape(w) + (r"(?!\d)" if w[-1:].isdigit() else "")
        if re.search(pattern, low):
            return word
    return None


def first_rank(text: str) -> Optional[int]:
    m = RANK.search(text)
    return int(m.group(1)) if m else None


def wrong_high_lead(headline: str, findings: Sequence[dict], culprits: Sequence[int]) -> str:
    """What makes a wrong high lead ("" when there is none)."""
    for f in findings:
        if not isinstance(f, dict) or str(f.get("confidence", "")).lower() != "high":
            continue
        flag = f.get("culprit")
        if flag is True or (flag is None and not PROGRESS_KIND.search(str(f.get("kind", "")))):
            rank = first_rank(str(f.get("title", ""))) if f.get("title") else None
            if rank is None:
                rank = first_rank(json.dumps(f, sort_keys=True))
            if rank is not None and rank not in culprits:
                return f"finding {f.get('kind', '?')} [high] blames rank {rank}"
    rank = first_rank(headline)
    if HEADLINE_HIGH.search(headline) and rank is not None and rank not in culprits:
        return f"headline marked high blames rank {rank}"
    return ""


@dataclass
class Score:
    name: str
    headline: str
    culprit_right: bool
    mechanism_right: bool
    wrong_high: bool
    missing: List[str]  # the mechanism lists not matched (their first alternative)
    partner_named: Optional[bool] = None
    high_why: str = ""
    first_finding: str = "-"
    seconds: Optional[float] = None
    error: str = ""
    state_note: str = ""


def judge(name: str, truth: dict, headline: str, analysis: Optional[dict], seconds: Optional[float] = None,
          error: str = "", state_note: str = "") -> Score:
    analysis = analysis or {}
    findings = [f for f in (analysis.get("findings") or []) if isinstance(f, dict)]
    first = findings[0] if findings else {}
    first_desc = (f"{first.get('kind', '-')} [{first.get('confidence', '-')}]"
                  f"{' culprit' if first.get('culprit') else ''}: {first.get('title', '')}" if first else "-")
    if error:
        return Score(name, headline, False, False, False, [], None, "", first_desc, seconds, error, state_note)
    culprits = list(truth["culprit"])
    culprit = first_rank(headline) in culprits
    missing = [words[0] for words in truth["mechanism_words"] if says(headline, words) is None]
    partner = None
    if truth.get("cycle_with"):
        partner = any(says(headline, [f"rank {p}"]) for p in truth["cycle_with"])
    why = wrong_high_lead(headline, findings, culprits)
    return Score(name, headline, culprit, not missing, bool(why), missing, partner, why, first_desc, seconds, "",
                 state_note)


def _yn(v: Optional[bool]) -> str:
    return "-" if v is None else ("yes" if v else "no")


def _cell(text: str, width: int = 400) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= width else text[:width - 1] + "…"


def table(scores: Sequence[Score], truth: Dict[str, dict]) -> str:
    lines = ["| scenario | truth | headline printed | culprit right | mechanism right | wrong-high |",
             "|---|---|---|---|---|---|"]
    for s in scores:
        t = truth[s.name]
        tr = (f"rank {', '.join(map(str, t['culprit']))} ({t['node']})"
              + (f" + cycle with rank {', '.join(map(str, t['cycle_with']))}" if t.get("cycle_with") else "")
              + f": {t['mechanism']}")
        if s.error:
            lines.append(f"| {s.name} | {_cell(tr)} | ERROR: {_cell(s.error)} | error | error | - |")
            continue
        head = _cell(s.headline) + (f" (note: {_cell(s.state_note, 80)})" if s.state_note else "")
        mech = _yn(s.mechanism_right) + ("" if s.mechanism_right else f" (missing: {', '.join(s.missing)})")
        high = "YES: " + s.high_why if s.wrong_high else "no"
        lines.append(f"| {s.name} | {_cell(tr)} | {head} | {_yn(s.culprit_right)} | {mech} | {high} |")
    n = len(scores)
    c = sum(s.culprit_right for s in scores)
    m = sum(s.mechanism_right for s in scores)
    both = sum(s.culprit_right and s.mechanism_right for s in scores)
    wh = sum(s.wrong_high for s in scores)
    err = sum(bool(s.error) for s in scores)
    cyc = [s for s in scores if s.partner_named is not None]
    lines += ["",
              f"culprit right: {c}/{n}; mechanism right: {m}/{n}; both: {both}/{n}; "
              f"wrong [high] lead: {wh}/{n}" + (f"; errors: {err}" if err else ""),
              f"(information) cycle partner named: {sum(bool(s.partner_named) for s in cyc)}/{len(cyc)}"]
    return "\n".join(lines)


def details(scores: Sequence[Score]) -> str:
    out: List[str] = ["| scenario | first finding of the snapshot | hangscope s |", "|---|---|---|"]
    for s in scores:
        secs = f"{s.seconds:.1f}" if s.seconds is not None else "-"
        out.append(f"| {s.name} | {_cell(s.first_finding, 200)} | {secs} |")
    return "\n".join(out)


def headlines(scores: Sequence[Score]) -> str:
    out = ["```text"]
    for s in scores:
        out.append(f"{s.name}: " + (f"ERROR: {s.error}" if s.error else s.headline))
    out.append("```")
    return "\n".join(out)
