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
from operator import attrgetter
from typing import Dict, List, Sequence, Tuple

from app.analysis.findings import Confidence, Finding
from app.analysis.fold import describe_keys, fold_nodes
from app.analysis.frames import clean
from app.model import RankSnapshot

_CMDLINE = attrgetter("cmdline")
_PER_RANK = re.compile(r"^-*(local[-_]?rank|node[-_]?rank|rank|group[-_]?rank|local[-_]?world[-_]?size|"
                       r"master[-_]?port|rdzv[-_]?id|port|seed|tracker[-_]?fd|pipe[-_]?handle|log[-_]?dir)$", re.I)
MAX_KEYS = 4  # differing flags named in one finding


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


def launch_findings(ranks: Sequence[RankSnapshot]) -> List[Finding]:
    """Ranks (a minority) whose flags differ from the majority's, one finding per kind of difference."""
    if len(set(map(_CMDLINE, ranks))) < 2:  # in C: the usual case, one command line for the whole job
        return []
    by_cmdline: Dict[Tuple[str, ...], List[RankSnapshot]] = {}
    for cmdline, r in zip(map(_CMDLINE, ranks), ranks):
        by_cmdline.setdefault(cmdline, []).append(r)
    if len(by_cmdline) < 2:
        return []
    parsed = {c: flags(c) for c in by_cmdline if c}
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
        keys_ = tuple(sorted((r.node, r.pid) for r in members))
        numbers = tuple(r.rank for r in sorted(members, key=lambda r: (r.node, r.pid)))
        label = describe_keys(keys_, numbers)
        shown = ", ".join(f"{clean(k, 60)} {_value(mine)} where the others have {_value(theirs)}"
                          for k, mine, theirs in diff[:MAX_KEYS])
        more = f" and {len(diff) - MAX_KEYS} more" if len(diff) > MAX_KEYS else ""
        few = len(members) * 3 <= total
        conf: Confidence = "medium" if few else "low"
        reason = ("the same job's ranks normally run one command line; these few run another" if few else
                  "many ranks differ: the launch may set some flags per node on purpose")
        out.append(Finding("launch_differs", clean(f"{label} run with other flags than the other "
                                                   f"{total - len(members)} ranks: {shown}{more}", 300),
                           f"command lines differ in {len(diff)} flag{'s' if len(diff) != 1 else ''}: {shown}{more}. "
                           "Ranks launched with other training settings (accumulation steps, batch size, model "
                           "options) issue another number or order of collectives, and the job hangs where they "
                           "part: launch every node with the same flags.", conf, reason, keys_, label,
                           fold_nodes(k[0] for k in keys_), culprit=few))
    return out


def _value(v: str) -> str:
    return "unset" if v == "(not given)" else ("set" if v == "(set)" else f"`{clean(v, 60)}`")
