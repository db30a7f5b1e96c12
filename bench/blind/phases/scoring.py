"""Scoring hangscope's verdict against the phases set's truth.json (rules as bench/blind/activity/scoring.py's).

The verdict is the first paragraph `hangscope --print` prints (the headline); the snapshot's analysis gives the
findings (kind, confidence) and the per-rank progress it saw.

  verdict right, hung job:        the headline does not call the job progressing (healthy, making progress).
  verdict right, progressing job: the headline calls it progressing (healthy, making progress; not negated), does
                                  not call it hung (hung, stuck, deadlock, no progress, a rank that the others "wait
                                  for"...) unless it also says it progresses, and no finding of confidence "high"
                                  names a culprit. (Tightened after the first run: the rule then did not require
                                  the first condition; see bench/blind/activity/FIRST-RUN.md.)
  culprit right (hung jobs only): the first rank(s) the headline names ("Rank N", "Ranks N-M", "ranks N, M") are
                                  among the culprits (the ranks that left the loop or skipped the collective); where
                                  the headline names no rank, the first finding's text's first rank(s). (Fixed after
                                  the first run, which read only the singular "Rank N": "Ranks 2-3 have left the
                                  loop" was scored as naming no culprit; see FIRST-RUN.md.)
  slow node named / slow rank named (progressing jobs, recorded, not scored): whether the headline, else any
                                  finding, names a slow node ("node03") / a slow rank (as a straggler or as a
                                  culprit alike). (Split after the first run, which recorded one column for both.)
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
# "Rank 5", "ranks 2-3", "ranks 4, 6 and 7": the numbers (and ranges) that follow
RANKS = re.compile(r"\branks?\s+(\d+(?:\s*[-\u2013]\s*\d+)?(?:\s*(?:,|and|&)\s*\d+(?:\s*[-\u2013]\s*\d+)?)*)\b",
                   re.I)


def load_truth(path: Path = TRUTH) -> Dict[str, dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return {entry["name"]: entry for entry in data["scenarios"]}


def called_progressing(headline: str) -> bool:
    text = NEG_PROGRESS.sub(" ", headline)
    return bool(PROGRESS.search(text))


def called_hung(headline: str) -> bool:
    text = NOT_HUNG.sub(" ", headline)
    return bool(HUNG.search(text)) or bool(NEG_PROGRESS.search(headline))


def _expand(group: str) -> List[int]:
    out: List[int] = []
    for part in re.split(r"\s*(?:,|and|&)\s*", group.strip()):
        lo, _, hi = re.sub(r"\s", "", part).replace("\u2013", "-").partition("-")
        if lo.isdigit():
            out.extend(range(int(lo), int(hi) + 1) if hi.isdigit() else [int(lo)])
    return out


def first_ranks(text: str) -> List[int]:
    """The ranks of the first "Rank N" / "Ranks N-M" / "ranks N, M" the text names ([] for none)."""
    m = RANKS.search(text)
    return _expand(m.group(1)) if m else []


def all_ranks(text: str) -> List[int]:
    return [r for m in RANKS.finditer(text) for r in _expand(m.group(1))]


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
    slow_node_named: str = "-"  # progressing jobs: "headline", "finding" or "no"
    slow_rank_named: str = "-"


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
        named = first_ranks(headline)
        if not named and first:
            named = first_ranks(finding_text(first))
        culprit: Optional[bool] = bool(named) and set(named) <= set(truth["culprit"])
    else:  # it must say the job progresses: a headline that offers a "likely lead" and no word on progress is a
        # hang diagnosis too (first run: long_compute's "all 8 ranks are spinning on a CPU", culprit [medium])
        says_hung = called_hung(headline) and not called_progressing(headline)
        verdict = called_progressing(headline) and not says_hung and high_culprit_finding(findings) is None
        culprit = None
    score = Score(name, truth["kind"], headline, verdict, culprit, first_desc, prog_desc, seconds, "", state_note)
    if not truth["hung"]:
        texts = [finding_text(f) for f in findings]
        for attr, test in (("slow_node_named", names_slow_node), ("slow_rank_named", names_slow_rank)):
            setattr(score, attr, "headline" if test(headline, truth) else
                    "finding" if any(test(t, truth) for t in texts) else "no")
    return score


def names_slow_node(text: str, truth: dict) -> bool:
    return any(re.search(rf"\b{node}\b", text) for node in truth.get("slow_nodes", []))


def names_slow_rank(text: str, truth: dict) -> bool:
    return bool(set(truth.get("slow_ranks", [])) & set(all_ranks(text)))


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
    lines = ["| scenario | kind | truth | verdict right | culprit right | slow node named | slow rank named | "
             "headline start |", "|---|---|---|---|---|---|---|---|"]
    for s in scores:
        t = truth[s.name]
        tr = (f"hung, rank {', '.join(map(str, t['culprit']))} ({', '.join(t['culprit_nodes'])})" if t["hung"] else
              f"progressing, slow rank {', '.join(map(str, t['slow_ranks']))} ({', '.join(t['slow_nodes'])})")
        if s.error:
            lines.append(f"| {s.name} | {s.kind} | {tr} | error | {'error' if t['hung'] else '-'} | - | - | "
                         f"ERROR: {_cell(s.error)} |")
            continue
        head = _cell(s.headline) + (f" (note: {_cell(s.state_note, 60)})" if s.state_note else "")
        lines.append(f"| {s.name} | {s.kind} | {tr} | {_yn(s.verdict_right)} | {_yn(s.culprit_right)} | "
                     f"{s.slow_node_named} | {s.slow_rank_named} | {head} |")
    n = len(scores)
    v = sum(s.verdict_right for s in scores)
    hung = [s for s in scores if truth[s.name]["hung"]]
    c = sum(bool(s.culprit_right) for s in hung)
    prog = [s for s in scores if not truth[s.name]["hung"]]
    lines += ["",
              f"verdict right: {v}/{n} (hung jobs {sum(s.verdict_right for s in hung)}/{len(hung)}, "
              f"progressing jobs {sum(s.verdict_right for s in prog)}/{len(prog)})",
              f"culprit right: {c}/{len(hung)} (hung jobs)",
              f"slow node named (progressing jobs, not scored): "
              f"{sum(s.slow_node_named in ('headline', 'finding') for s in prog)}/{len(prog)}, in the headline "
              f"{sum(s.slow_node_named == 'headline' for s in prog)}/{len(prog)}"]
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
