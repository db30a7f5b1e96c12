"""Builds the letter-bigram table of workers/cleartext_model.py: how names in Python code are spelled.

The default-deny rule (workers/cleartext.py) shows a run of letters in clear only when it reads like a name, and
"reads like a name" is measured: the average number of bits per letter the run costs under a bigram model of the
letter runs of names (identifiers split at `_` and camelCase, comments and docstrings included) in the Python
standard library and the ML libraries a training job imports. Random letters cost ~5.3-5.8 bits each; names
~3.9 (median). Each distinct run counts 1 + ln(occurrences): a name used everywhere (`value`) weighs more than one
seen once, but not thousands of times more (that would leave the table to `self`).

    python3 bench/cleartext_model.py            # print the table's Python source (paste it into the module)
    python3 bench/cleartext_model.py --check    # rejection rates of real runs and acceptance of random ones

It reads the sources of whatever is installed in this interpreter (the run that wrote the committed table: Python
3.11's standard library with torch, deepspeed, transformers, huggingface_hub, accelerate and numpy).
"""

from __future__ import annotations

import argparse
import collections
import glob
import math
import os
import random
import re
import string
import sys
import sysconfig

ALPHABET = "^" + string.ascii_lowercase + "$"  # ^ and $: a run's start and end
PACKAGES = ("torch", "deepspeed", "huggingface_hub", "accelerate", "transformers", "numpy")
RUN = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def runs() -> collections.Counter:
    roots = [sysconfig.get_paths()["stdlib"]]
    site = sysconfig.get_paths()["purelib"]
    for p in sys.path:
        if p.endswith("site-packages"):
            site = p
    roots += [os.path.join(site, p) for p in PACKAGES if os.path.isdir(os.path.join(site, p))]
    seen: collections.Counter = collections.Counter()
    for root in roots:
        for f in glob.glob(root + "/**/*.py", recursive=True):
            try:
                with open(f, encoding="utf-8") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError):
                continue
            for word in re.findall(r"[A-Za-z]+", text):
                for run in RUN.findall(word):
                    seen[run.lower()] += 1
    return seen


def table(seen: collections.Counter) -> str:
    counts: collections.Counter = collections.Counter()
    for r, k in seen.items():
        s = "^" + r + "$"
        for a, b in zip(s, s[1:]):
            counts[a + b] += 1 + math.log(k)
    cells = []
    for a in ALPHABET[:-1]:
        total = sum(counts[a + b] for b in ALPHABET[1:]) + 27 * 0.5
        for b in ALPHABET[1:]:
            bits = -math.log2((counts[a + b] + 0.5) / total)
            cells.append(chr(48 + min(74, round(bits * 4))))  # quarter bits, one printable character each
    return "".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    seen = runs()
    if not args.check:
        t = table(seen)
        print("BIGRAM_BITS = (  # (27 x 27): -log2 P(next | letter) in quarter bits, chr(48 + q); bench/cleartext_model.py")
        for i in range(0, len(t), 81):
            print("    %r" % t[i:i + 81])
        print(")")
        return
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from workers.cleartext import letters_read_like_a_name

    real = [r for r, k in seen.items() if k >= 3 and len(r) >= 4]
    random.seed(7)
    print("length  real runs rejected  random runs accepted")
    for n in (4, 5, 6, 7, 8, 10, 12, 16, 24):
        rs = [r for r in real if len(r) == n] or real
        rejected = sum(not letters_read_like_a_name(r) for r in rs) / len(rs)
        rand = ["".join(random.choice(string.ascii_lowercase) for _ in range(n)) for _ in range(4000)]
        accepted = sum(letters_read_like_a_name(r) for r in rand) / len(rand)
        print("%6d  %18.3f  %20.3f" % (n, rejected, accepted))


if __name__ == "__main__":
    main()
