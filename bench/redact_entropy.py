"""How well the high-entropy rule of workers/redact.py tells random secrets from code (not in the suite).

Detection: random tokens (base62 and base64url, lengths 20 to 64, seeded) in free text, the share replaced.
False positives: every candidate token (a run of 20+ letters, digits, _ + - not inside a path) in torch's Python
sources, the recorded worker replies in tests/data and this kernel's /proc/kallsyms: the ones the rule flags.

    python bench/redact_entropy.py
"""

from __future__ import annotations

import glob
import os
import random
import string
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workers import redact


def main() -> None:
    rng = random.Random(1)
    b62 = string.ascii_letters + string.digits
    print("| alphabet | length | detected |\n|---|---|---|")
    for name, alpha in (("base62", b62), ("base64url", b62 + "_-")):
        for n in (20, 24, 32, 40, 64):
            toks = ["".join(rng.choice(alpha) for _ in range(n)) for _ in range(2000)]
            hit = sum(redact.redact_text(" x " + t + " y ") == " x *** y " for t in toks) / len(toks)
            print(f"| {name} | {n} | {hit:.1%} |")
    cand = set()
    sources = []
    try:
        import torch

        sources += glob.glob(os.path.dirname(torch.__file__) + "/**/*.py", recursive=True)
    except ImportError:
        print("(torch not installed: its sources are not scanned)")
    sources += [f for f in glob.glob(os.path.join(os.path.dirname(__file__), "..", "tests", "data", "**", "*.json"),
                                     recursive=True) if not f.endswith("secrets_corpus.json")]  # planted secrets
    sources += ["/proc/kallsyms"]
    for f in sources:
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                cand.update(redact._CANDIDATE.findall(fh.read()))
        except OSError:
            continue
    flagged = sorted(t for t in cand if redact.high_entropy(t))
    print(f"\ncandidate tokens in code and symbols: {len(cand)}; flagged as secrets: {len(flagged)}")
    for t in flagged:
        print("  ", t)


if __name__ == "__main__":
    main()
