"""Score hangscope's headline on the blind process-state cases (cases.py). Prints a markdown table and totals;
always exits 0. Run from the repository root: python bench/blind/states/score.py"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
for p in (os.path.join(ROOT, "tests", "support"), ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)
sys.path.insert(0, HERE)

from app.analysis import analyze  # noqa: E402
import app  # noqa: E402

from cases import build_cases  # noqa: E402

_MENTION = re.compile(r"\branks?\s+((?:\d+(?:\s*[-\u2013]\s*\d+)?)(?:\s*(?:,|and|&)\s*\d+(?:\s*[-\u2013]\s*\d+)?)*)",
                      re.IGNORECASE)


def named_ranks(text: str) -> set:
    """Rank numbers a headline names: "rank 5", "ranks 2 and 6", "ranks 4-7", "ranks 1, 3 and 5"."""
    out: set = set()
    for m in _MENTION.finditer(text):
        for part in re.split(r"\s*(?:,|and|&)\s*", m.group(1)):
            part = part.strip()
            if not part:
                continue
            rng = re.fullmatch(r"(\d+)\s*[-\u2013]\s*(\d+)", part)
            if rng:
                a, b = int(rng.group(1)), int(rng.group(2))
                if 0 <= b - a <= 4096:
                    out.update(range(a, b + 1))
            elif part.isdigit():
                out.add(int(part))
    return out


def structured_culprits(analysis, snap) -> set:
    """The rank numbers the analysis names as its culprit(s), however this version exposes them."""
    by_key = {(r.node, r.pid): r.rank for r in snap.ranks}
    nums: set = set()
    for c in getattr(analysis, "culprits", None) or ():
        who = getattr(c, "who", None)
        numbers = getattr(who, "numbers", None)
        if numbers:
            nums.update(n for n in numbers if n is not None)
        else:
            for k in getattr(who, "keys", ()) or ():
                if by_key.get(tuple(k)) is not None:
                    nums.add(by_key[tuple(k)])
    if nums:
        return nums
    f = getattr(analysis, "culprit_finding", None)
    if f is None:
        f = next((x for x in analysis.findings if getattr(x, "culprit", False)), None)
    if f is not None:
        for k in getattr(f, "ranks", ()) or ():
            if by_key.get(tuple(k)) is not None:
                nums.add(by_key[tuple(k)])
    return nums


def has(text: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.search(pattern[3:], text, re.IGNORECASE) is not None
    return pattern.lower() in text.lower()


def score(case) -> dict:
    try:
        a = analyze(case.snapshot, history=list(case.history))
    except Exception:
        return {"error": traceback.format_exc(limit=3).strip().splitlines()[-1], "headline": "",
                "culprit_ok": False, "words_ok": False, "got": set()}
    headline = a.verdict or ""
    want = set(case.culprits)
    got = structured_culprits(a, case.snapshot)
    named = named_ranks(headline)
    if case.culprit_mode == "any":
        culprit_ok = bool(got) and got <= want and bool(named & want)
    else:
        culprit_ok = got == want and want <= named
    missing = [g for g in case.must if not any(has(headline, alt) for alt in g)]
    bad = [p for p in case.must_not if has(headline, p)]
    return {"error": "", "headline": headline, "culprit_ok": culprit_ok, "words_ok": not missing and not bad,
            "got": got, "named": named, "missing": missing, "bad": bad}


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main() -> int:
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except Exception:
        commit = "?"
    print(f"app imported from: {os.path.dirname(os.path.abspath(app.__file__))}  (HEAD {commit})\n")
    cases = build_cases()
    rows = []
    print("| case | class | expected | culprit right? | words right? | headline |")
    print("|---|---|---|---|---|---|")
    for c in cases:
        r = score(c)
        rows.append((c, r))
        exp = ", ".join(map(str, c.culprits)) + (" (any)" if c.culprit_mode == "any" else "")
        if r["error"]:
            cul, words, head = "ERROR", "ERROR", r["error"]
        else:
            got = ",".join(map(str, sorted(r["got"]))) or "-"
            cul = ("yes" if r["culprit_ok"] else "NO") + f" (got {got})"
            words = "yes" if r["words_ok"] else "NO" + (f" missing {r['missing']}" if r["missing"] else "") + (
                f" has {r['bad']}" if r["bad"] else "")
            head = r["headline"]
        head = head if len(head) <= 140 else head[:139] + "\u2026"
        print(f"| {c.name} | {c.cls} | rank {exp} | {cell(cul)} | {cell(words)} | {cell(head)} |")
    n = len(rows)
    cul = sum(r["culprit_ok"] for _, r in rows)
    words = sum(r["words_ok"] for _, r in rows)
    both = sum(r["culprit_ok"] and r["words_ok"] for _, r in rows)
    errs = sum(bool(r["error"]) for _, r in rows)
    print(f"\n**Totals: {both}/{n} fully right; culprit right {cul}/{n}; words right {words}/{n}; errors {errs}.**\n")
    print("| class | fully right |")
    print("|---|---|")
    for cls in dict.fromkeys(c.cls for c, _ in rows):
        sel = [r for c, r in rows if c.cls == cls]
        print(f"| {cls} | {sum(r['culprit_ok'] and r['words_ok'] for r in sel)}/{len(sel)} |")
    wrong = [(c, r) for c, r in rows if not (r["culprit_ok"] and r["words_ok"])]
    if wrong:
        print("\nWrong cases (full headlines):\n")
        for c, r in wrong:
            print(f"- {c.name}: {r['error'] or r['headline']}")
    return 0


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
    sys.exit(0)
