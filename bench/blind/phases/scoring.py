"""Scoring hangscope's verdict against the phases set's truth.json (rules as bench/blind/activity/scoring.py's).

The verdict is the first paragraph `hangscope --print` prints (the headline); the snapshot's analysis gives the
findings (kind, confidence) and the per-rank progress it saw.

  verdict right, hung job:        the headline does not call the job progressing (healthy, making progress).
  verdict right, progressing job: the headline calls it progressing (healthy, making progress; not negated), does
                                  not call it hung (hung, stuck, deadlock, no progress, a rank that the others "wait
                                  for"...) unless it also says it progresses, and no finding of confidence "high"
                                  names a culprit. (Tightened after the first run: the rule then did not require
                                  the first condition; see bench/blind/activity/FIRST-RUN.md.)
  culprit right (hung jobs only): the first rank the headline names ("Rank N") is one of the culprits (the ranks that
                                  left the loop or skipped the collective); where the headline names no rank, the
                                  first finding's text's first rank.
  slow named (progressing jobs, recorded, not scored): whether the headline, else any finding, names a slow node
                                  ("node03") or a slow rank ("rank 6", "ranks 4, 6").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
TRUTH = HERE / "truth.json"

_NEG = r"(?:no|not|never|without|isn'?t|is not|are not|aren'?t|stopped|lack of|zero)\s+(?:\w+\s+)?"
# the job called progressing (healthy); a negated form does not count
PROGRESS = re.compile(r"\b(progress(?:es|ing|ed)?|made progress|healthy|advanc(?:es|ing|ed)|still (?:training|stepping)"
                      r"|keeps? training|not hung|no hang|isn'?t hung|is not hung)\b", re.I)
NEG_PROGRESS = re.compile(_NEG + r"(?:progress|advanc|training|healthy)", re.I)
# the job called hung (or a rank named as what the others wait for)
HUNG = re.compile(r"\b(hung|hangs?|hanging|stuck|deadlock(?:ed)?|stalled|no progress|not progressing|never"
                  r"|is blocked|are blocked|wait(?:s|ing)? for it|others? wait)\b", re.I)
NOT_HUNG = re.compile(r"\b(not hung|no hang|isn'?t hung|is not hung|not stuck|not a hang)\b", re.I)
RANK = re.compile(r"\brank\s+(\d+)\b", re.I)


def load_truth(path: Path = TRUTH) -> Dict[str, dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return {entry["name"]: entry for entry in data["scenarios"]}


def called_progressing(headline: str) -> bool:
    text = NEG_PROGRESS.sub(" ", headline)
    return bool(PROGRESS.search(text))


def called_hung(headline: str) -> bool:
    text = NOT_HUNG.sub(" ", headline)
    return bool(HUNG.search(text)) or bool(NEG_PROGRESS.search(headline))


def first_rank(text: str) -> Optional[int]:
    m = RANK.search(text)
    return int(m.group(1)) if m else None


def high_culprit_finding(findings: Sequence[dict]) -> Optional[dict]:
    """A finding of confidence high that names a culprit (its `culprit` flag; where it has none, a kind that is not a
    statement of progress)."""
    for f in findings:
        if str(f.get("confidence", "")).lower() != "high":
            continue
        flag = f.get("culprit")
        if flag is True or (flag is None and not re.search(r"progress|healthy|running|ok\b", str(f.get("kind", "")))):
            return f
    return None


@dataclass
class Score:
    name: str
    kind: str  # hung / progressing
    headline: str
    verdict_right: bool
    culprit_right: Optional[bool]  # None for progressing jobs
    first_finding: str = ""
    progress: str = ""
    seconds: Optional[float] = None
    error: str = ""
    state_note: str = ""  # the job was not in its state any more after hangscope ran
    slow_named: str = "-"  # progressing jobs: "headline", "finding" or "no"


def finding_text(f: dict) -> str:
    return json.dumps(f, sort_keys=True)


def judge(name: str, truth: dict, headline: str, analysis: Optional[dict], seconds: Optional[float] = None,
          error: str = "", state_note: str = "") -> Score:
    analysis = analysis or {}
    findings = list(analysis.get("findings") or [])
    first = findings[0] if findings else {}
    first_desc = (f"{first.get('kind', '-')} [{first.get('confidence', '-')}]"
                  f"{' culprit' if first.get('culprit') else ''}: {first.get('title', '')}" if first else "-")
    prog = analysis.get("progress")
    prog_desc = _progress_summary(prog)
    if error:
        return Score(name, truth["kind"], headline, False, False if truth["hung"] else None, first_desc, prog_desc,
                     seconds, error, state_note)
    if truth["hung"]:
        verdict = not called_progressing(headline)
        rank = first_rank(headline)
        if rank is None and first:
            rank = first_rank(finding_text(first))
        culprit: Optional[bool] = rank in truth["culprit"]
    else:  # it must say the job progresses: a headline that offers a "likely lead" and no word on progress is a
        # hang diagnosis too (first run: long_compute's "all 8 ranks are spinning on a CPU", culprit [medium])
        says_hung = called_hung(headline) and not called_progressing(headline)
        verdict = called_progressing(headline) and not says_hung and high_culprit_finding(findings) is None
        culprit = None
    score = Score(name, truth["kind"], headline, verdict, culprit, first_desc, prog_desc, seconds, "", state_note)
    if not truth["hung"]:
        score.slow_named = ("headline" if names_slow(headline, truth) else
                            "finding" if any(names_slow(finding_text(f), truth) for f in findings) else "no")
    return score


RANKS_LIST = re.compile(r"\branks?\s+((?:\d+(?:\s*(?:,|and|&)\s*)?)+)", re.I)


def names_slow(text: str, truth: dict) -> bool:
    """The text names one of the truth's slow nodes or slow ranks."""
    if any(re.search(rf"\b{node}\b", text) for node in truth.get("slow_nodes", [])):
        return True
    slow = set(truth.get("slow_ranks", []))
    for m in RANKS_LIST.finditer(text):
        if slow & {int(d) for d in re.findall(r"\d+", m.group(1))}:
            return True
    return False


def _progress_summary(prog: Any) -> str:
    """The per-rank statuses of analysis.progress, counted (its shape is read loosely: a dict or list of ranks)."""
    if not prog:
        return "-"
    counts: Dict[str, int] = {}

    def add(entry: Any) -> None:
        if isinstance(entry, dict):
            status = entry.get("status") or entry.get("state") or "?"
        else:
            status = entry
        counts[str(status)] = counts.get(str(status), 0) + 1

    if isinstance(prog, dict):
        ranks = prog.get("ranks") if isinstance(prog.get("ranks"), (list, dict)) else prog
        for v in (ranks.values() if isinstance(ranks, dict) else ranks):
            add(v)
    elif isinstance(prog, list):
        for v in prog:
            add(v)
    return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))


def _yn(v: Optional[bool]) -> str:
    return "-" if v is None else ("yes" if v else "no")


def _cell(text: str, width: int = 90) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= width else text[:width - 1] + "…"


def table(scores: Sequence[Score], truth: Dict[str, dict]) -> str:
    lines = ["| scenario | kind | truth | verdict right | culprit right | slow named | headline start |",
             "|---|---|---|---|---|---|---|"]
    for s in scores:
        t = truth[s.name]
        tr = (f"hung, rank {', '.join(map(str, t['culprit']))} ({', '.join(t['culprit_nodes'])})" if t["hung"] else
              f"progressing, slow rank {', '.join(map(str, t['slow_ranks']))} ({', '.join(t['slow_nodes'])})")
        if s.error:
            lines.append(f"| {s.name} | {s.kind} | {tr} | error | {'error' if t['hung'] else '-'} | - | "
                         f"ERROR: {_cell(s.error)} |")
            continue
        head = _cell(s.headline) + (f" (note: {_cell(s.state_note, 60)})" if s.state_note else "")
        lines.append(f"| {s.name} | {s.kind} | {tr} | {_yn(s.verdict_right)} | {_yn(s.culprit_right)} | "
                     f"{s.slow_named} | {head} |")
    n = len(scores)
    v = sum(s.verdict_right for s in scores)
    hung = [s for s in scores if truth[s.name]["hung"]]
    c = sum(bool(s.culprit_right) for s in hung)
    prog = [s for s in scores if not truth[s.name]["hung"]]
    lines += ["",
              f"verdict right: {v}/{n} (hung jobs {sum(s.verdict_right for s in hung)}/{len(hung)}, "
              f"progressing jobs {sum(s.verdict_right for s in prog)}/{len(prog)})",
              f"culprit right: {c}/{len(hung)} (hung jobs)",
              f"slow node or rank named (progressing jobs, not scored): "
              f"{sum(s.slow_named in ('headline', 'finding') for s in prog)}/{len(prog)}"]
    return "\n".join(lines)


def details(scores: Sequence[Score]) -> str:
    out: List[str] = ["| scenario | first finding | analysis.progress | hangscope s |", "|---|---|---|---|"]
    for s in scores:
        secs = f"{s.seconds:.1f}" if s.seconds is not None else "-"
        out.append(f"| {s.name} | {_cell(s.first_finding, 110)} | {_cell(s.progress, 80)} | {secs} |")
    return "\n".join(out)


def headlines(scores: Sequence[Score]) -> str:
    out = ["```text"]
    for s in scores:
        out.append(f"{s.name}: " + (f"ERROR: {s.error}" if s.error else s.headline))
    out.append("```")
    return "\n".join(out)
