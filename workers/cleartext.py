"""The default-deny rule: which words of a value or a text may be shown in clear. Stdlib only.

What leaves the user's screen (the export bundle, a --snapshot file: app/report/share.py) carries a word only when
this rule says it is safe, and everything else as its type, length and a keyed hash; on the node, a value under an
ambiguous name (`key`, `token_count`, `auth_mode`: workers/redact.py) is kept only when it is safe by this rule.

A *word* is a run of ASCII letters, digits and `_ . + -`. It is clear when it is a number, or when each of its
parts (split at `_ . + -`) reads like a name: letter runs that read like words or acronyms (camelCase split,
a vowel in every five letters of a long run, no run longer than 24), at most two digit groups or single letters
(three in a part of at most five characters: `c10d`, `k8s`), and not the long random mixture of cases and digits
that credentials are made of. So `input_ids`, `layer3`, `v4`, `fp16`, `ProcessGroupGloo`, `eth0`, `10.0.0.1`,
`train_blind.py` and `/etc/ssl/private/node.pem` are clear; `pl001lh2vpm5`, `Tr0ub4dor`, `3fa9c1e2` (any hash or
uuid), `xkqpmwvtz` and every token shape are not. Text is judged word by word; everything between words
(spaces, quotes, brackets, `/ : = @ ,`) is structure and stays. A unit holding letters or digits outside ASCII
(a line of free text, a string literal, a comment) is not judged in parts at all: the name rules cannot read
a secret word in another language, so the whole unit is hidden.

What it does not decide: whether a name says secret (workers/redact.py does: a strong name hides any value, a
safe one included), and the structure of a channel (strace payloads, gdb strings: workers/tooltext.py).
"""

from __future__ import annotations

import math

from workers.cleartext_model import BIGRAM_BITS
from workers.lazyre import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    import re
    from typing import Callable, Dict

    Hide = Callable[[str, str], str]  # (kind, text) -> what is shown instead: "str", "bytes" or "text"

# What an earlier pass already put in place of a value: the node's marker and the bundle's keyed-hash token.
# Never judged again (a second pass over shared text changes nothing).
HIDDEN = lazy(r"\*\*\*|<(?:str|bytes|text) len=\d+ #[0-9a-f]{8}>")


def keyed_token(key: bytes, kind: str, text: str) -> str:
    """`<kind len=N #hash>`, what is shown for a word the rule does not let through: 8 hex digits of HMAC-SHA256
    under `key` (the bundle's, the file's or the TUI session's), so equal texts give equal tokens under one key.
    hmac is imported here, at the first token: it loads OpenSSL (~4 ms), which a worker, whose redaction never
    makes a token, does not otherwise need at its start."""
    import hmac

    digest = hmac.new(key, text.encode("utf-8", "surrogatepass"), "sha256").hexdigest()[:8]
    return "<%s len=%d #%s>" % (kind, len(text), digest)

WORD = lazy(r"[A-Za-z0-9_.+\-]+")
_PARTS = lazy(r"[_.+\-]+")
_RUNS = lazy(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_NUMBER = lazy(r"[-+]?(?:\d{1,20}(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d{1,3})?")
# An address or a flag word (0x7f3a9c2e4100, 0x0): a number, up to 64 bits. A longer hex string is a digest or a
# key, judged as letters and digits (and hidden).
_HEX = lazy(r"0[xX][0-9a-fA-F]{1,16}")
_VOWELS = frozenset("aeiouyAEIOUY")
MAX_RUN = 24  # letters in one run: longer ones are not names (camelCase and `_` split real ones)
MAX_WORD = 100


def _entropy(s: str) -> float:
    n = len(s)
    counts: Dict[str, int] = {}
    for c in s:
        counts[c] = counts.get(c, 0) + 1
    return -sum(k / n * math.log2(k / n) for k in counts.values())


_CASE_RUN = lazy(r"[a-z]{8,}|[A-Z]{8,}")
_WORDISH = lazy(r"[A-Z]?[a-z]{3,}|[A-Z]{3,}(?![a-z])")


def _klass(c: str) -> int:
    return 0 if c.islower() else 1 if c.isupper() else 2 if c.isdigit() else 3


def high_entropy(token: str) -> bool:
    """A long random-looking string: upper and lower case letters and digits mixed, switching between them as
    often as random text does, near the entropy of random text of its length. Identifiers and symbols
    (HUF_decompress4X1_usingDTable, entry_SYSCALL_64_after_hwframe: words, long same-case runs) and hex hashes
    (one case) do not qualify. The pattern net's test (workers/redact.py): a word this rule hides is not
    necessarily high-entropy, but every high-entropy word is hidden here too."""
    token = token.rstrip("=")
    if token.startswith(("sha256-", "sha384-", "sha512-")):
        return False  # a Subresource Integrity / CSP hash: a public digest
    n = len(token)
    if n < 20 or _CASE_RUN.search(token):
        return False
    kinds = [_klass(c) for c in token]
    if not (0 in kinds and 1 in kinds and 2 in kinds):
        return False
    switches = sum(1 for a, b in zip(kinds, kinds[1:]) if a != b)
    if switches < 0.45 * (n - 1):
        return False
    if sum(len(w) for w in _WORDISH.findall(token)) >= 0.5 * n:  # CamelCase words: FindBestMatch, TileS2GOp
        return False
    return _entropy(token) >= min(4.0, 0.8 * math.log2(n))


_ALPHABET = "^abcdefghijklmnopqrstuvwxyz$"
_INDEX = {c: i for i, c in enumerate(_ALPHABET)}
_BITS = "".join(BIGRAM_BITS)


def _bits(a: str, b: str) -> float:
    return (ord(_BITS[_INDEX[a] * 27 + _INDEX[b] - 1]) - 48) / 4.0


def letters_read_like_a_name(run: str) -> bool:
    """A run of letters spelled like the names in code: its average cost per letter under the bigram table of
    names (workers/cleartext_model.py) is low. Random letters cost ~5.3-5.8 bits each, names ~3.9; a short run
    is too short to tell (and carries little), so only runs of six letters or more are measured, more strictly as
    they grow (bench/cleartext_model.py --check prints the rates: 1-3 % of the runs seen in real code rejected,
    10-25 % of random runs accepted at 6-8 letters, 5 % at 10 and 1 % from 16: what this lets through is a short
    run of letters, a little entropy)."""
    n = len(run)
    if n < 6:
        return True
    s = "^" + run.lower() + "$"
    if any(c not in _INDEX for c in s):
        return False
    cost = sum(_bits(a, b) for a, b in zip(s, s[1:])) / (n + 1)
    return cost <= (5.0 if n < 8 else 4.8 if n < 12 else 4.7)


def _part_clear(part: str) -> bool:
    if part.isdigit():
        return len(part) <= 20
    if _HEX.fullmatch(part):
        return True
    runs = _RUNS.findall(part)
    if "".join(runs) != part:
        return False  # letters or digits outside ASCII
    junk = 0
    worded = False  # a run of five letters or more that reads like a word
    for run in runs:
        if run[0].isdigit() or len(run) == 1:
            junk += 1
            continue
        if len(run) > MAX_RUN:
            return False
        if not letters_read_like_a_name(run):
            return False  # letters in an order no name has
        vowels = sum(1 for c in run if c in _VOWELS)
        if vowels == 0:
            junk += 1  # `pl`, `vpm`, `Kq`: letters that are no syllable
        elif len(run) >= 5:
            worded = True
    if len(runs) > 1:  # camelCase read as one: random mixed case splits into humps too short to measure
        for letters in _LETTERS.findall(part):
            if not letters_read_like_a_name(letters):
                return False
    if len(_INNER_DIGITS.findall(part)) >= 2:
        return False  # names end in digits (`layer3`, `fp16`) or hold one group (`c10d`): not letters, digits, letters...
    return junk <= 2 or (junk == 3 and (len(part) <= 5 or worded))


_LETTERS = lazy(r"[A-Za-z]{6,}")
_INNER_DIGITS = lazy(r"(?<=[A-Za-z])[0-9]+(?=[A-Za-z])")


_MEMO: Dict[str, bool] = {}


def clear_word(word: str) -> bool:
    """Whether one word (letters, digits, `_ . + -`) may be shown: a number, or every part reads like a name."""
    known = _MEMO.get(word)
    if known is not None:
        return known
    if len(_MEMO) > 16384:
        _MEMO.clear()
    if not word or len(word) > MAX_WORD:
        ok = False
    elif _NUMBER.fullmatch(word) or _HEX.fullmatch(word):
        ok = True
    else:
        ok = all(_part_clear(p) for p in _PARTS.split(word) if p) and not high_entropy(word)
    _MEMO[word] = ok
    return ok


def foreign(text: str) -> bool:
    """Letters or digits outside ASCII: words the name rules cannot read (another language, another script)."""
    return not text.isascii() and any(c.isalnum() for c in text if ord(c) > 127)


# A generated passphrase: words and a number joined, then one symbol (`Lantern-tundra-4085?`, `Heron-velvet-1871!`):
# each part reads like a name, the whole is a password manager's output. Names of things do not end in `!?*#$%&^~`
# glued to a word with digits.
_PASSPHRASE = lazy(r"(?<![\w.+\-])(?=[\w.+\-]{0,200}?[A-Za-z]{2})(?=[\w.+\-]{0,200}?\d)[\w.+\-]{6,200}[!?*#$%&^~](?!\w)")
_SYMBOLS = frozenset("!?*#$%&^~")


def _passphrase_at(m: "re.Match[str]") -> bool:
    """The word matched is a passphrase's body: a symbol glued after it, then no word character."""
    text, end = m.string, m.end()
    return (end < len(text) and text[end] in _SYMBOLS and (end + 1 == len(text) or not text[end + 1].isalnum())
            and len(m.group(0)) >= 6 and any(c.isdigit() for c in m.group(0))
            and sum(c.isalpha() for c in m.group(0)) >= 2 and _PASSPHRASE.match(text, m.start()) is not None)


def clear_text(text: str) -> bool:
    """Every word of the text is clear, and none is foreign."""
    if foreign(text):
        return False
    rest = HIDDEN.sub(" ", text)
    if _PASSPHRASE.search(rest):
        return False
    return all(clear_word(w) for w in WORD.findall(rest))


_SPACE_OUTSIDE = lazy(r"(?<![,:])\s")  # a space that is not after a container's `,` or a dict's `:`
_OBJECT = lazy(r"<[^\n<>]{0,200} at 0x[0-9a-fA-F]+>|<(?:built-in |bound )?(?:function|method|module|class)"
               r"[^\n]{0,200}>")


def clear_value(value: str) -> bool:
    """A whole value may be shown: a number, boolean or None, an object's repr (`<Tensor at 0x...>`), a shape
    (`torch.Size([8, 128])`, `(8, 128)`), a name, a path or a URL without credentials, or a container of those.
    One word of prose is a value; a sentence is not (a value with spaces outside a container's separators)."""
    v = value.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"`":
        v = v[1:-1]
    if v == "" or HIDDEN.fullmatch(v):
        return True
    if _OBJECT.fullmatch(v):
        return True
    if _SPACE_OUTSIDE.search(v.strip()):
        return False
    return clear_text(v)


def share_words(text: str, hide: Hide, kind: str = "str") -> str:
    """Text with every word that is not clear replaced by hide(kind, word); structure between words kept."""
    out = []
    done = 0
    for m in HIDDEN.finditer(text):
        out.append(_words(text[done:m.start()], hide, kind))
        out.append(m.group(0))
        done = m.end()
    out.append(_words(text[done:], hide, kind))
    return "".join(out)


def _words(text: str, hide: Hide, kind: str) -> str:
    if not text:
        return text
    return WORD.sub(lambda m: m.group(0) if clear_word(m.group(0)) and not _passphrase_at(m) else hide(kind, m.group(0)),
                    text)


# -- values that no name explains --------------------------------------------------------------------------
# A name says what a value is (`step=12`, `--host node3`): under a harmless name, a value whose every word reads
# like a name is shown. A value with *no* name (a string passed positionally to a call, the word after a label in
# free text, a thread name) has only its own shape to speak for it, and a password made of words (`Hazel.Otter62`,
# `MossRiver7781`) has a name's shape word by word. So such a value is shown only in the shapes names of things
# take, judged whole (never split at a symbol, which would let `k#9Qw^zT` through as short harmless pieces):
# a number, a number with a unit (`600s`, `12GB`), or words of one kind joined by `_ . - + :`, each part
# digits only, or letters (lower, Capitalized, UPPER or CamelCase) with at most three digits after a single-case
# word (`rank0`, `layer12`, `gpt2`, `H100`). Everything else is hidden: symbols inside the run, digits between
# letters (`A7KQ`), a CamelCase or Capitalized word with digits glued on (`River7781`, `MossRiver77`), four
# digits or more after letters (`bluefin2024`).
_UNIT = lazy(r"\d+(?:\.\d+)?[A-Za-z]{1,3}")
_NAME_PART = lazy(r"(?:[a-z]+|[A-Z]+|[A-Z][a-z]+)[0-9]{0,3}|[0-9]+"  # rank0, H100, Llama3, 4096
                  r"|[A-Z]*(?:[A-Z][a-z]+)+[A-Z]*"  # CamelCase, acronyms in it: EvtHandlr, HTTPServer, WorkNCCL
                  r"|[a-z]{2,}(?:[A-Z]+[a-z]{2,})*[A-Z]*")  # camelCase: maxNorm, getHTTPResponse
_NAME_SEP = lazy(r"[_.+\-:]+")


def plain_value(run: str) -> bool:
    """A value without a name may be shown: a number (with a unit), or a name's shape (see above) whose every
    word the default-deny rule finds clear. `run` holds no white space."""
    if not run or HIDDEN.fullmatch(run):
        return True
    if _NUMBER.fullmatch(run) or _HEX.fullmatch(run) or _UNIT.fullmatch(run):
        return True
    parts = [p for p in _NAME_SEP.split(run) if p]
    if not parts or not all(_NAME_PART.fullmatch(p) for p in parts):
        return False
    return all(clear_word(w) for w in WORD.findall(run)) and not _PASSPHRASE.search(run)


# The value after a label in free text (`reason: x`, `user@host:x`, `ValueError: x`): what follows a colon up to
# the next white space, quote, bracket or separator (`=`: `name=x` is a name and its value, judged by the rules
# for those). A colon before `/` (a URL) or another colon (`::`) starts no
# value; nor does one inside a word-and-number pair (`file.py:12`, `cuda:0` give numbers: plain anyway).
_AFTER_LABEL = lazy(r"(?<=[:：])[ \t]*(?P<v>[^\s:：,;='\"`()\[\]{}<>/\\][^\s:：,;=&'\"`()\[\]{}<>\\]*)")


def share_labelled(line: str, hide: Hide) -> str:
    """Every value after a label that is not plain, hidden (whole: it may hold symbols)."""
    def sub(m: "re.Match[str]") -> str:
        v = m.group("v")
        if plain_value(v) or (v.endswith(".") and plain_value(v.rstrip("."))):  # a sentence's full stop
            return m.group(0)
        if not any(c.isalnum() for c in v):
            return m.group(0)  # punctuation (`while True:  # ...`, `x: -`): no data in it
        if "/" in v and clear_text(v):
            return m.group(0)  # a path after a label (`saved to: data/x.pt`)
        return m.group(0)[:m.start("v") - m.start()] + hide("str", v)
    if ":" not in line and "：" not in line:
        return line
    return _AFTER_LABEL.sub(sub, line)


def share_name(name: str, hide: Hide) -> str:
    """A thread's name or an OS thread's comm: shown only when every run of it (between spaces and brackets) is a
    name's shape (plain_value: `pin_memory`, `Thread-3 (worker)`, `ckpt-writer-rank0`, `pt_autograd_0`); any other
    name is hidden whole (a name set from a URL, a `user@host:password` or a token's first 15 bytes)."""
    if not name or HIDDEN.fullmatch(name):
        return name
    runs = [r for r in _NAME_RUNS.split(name) if r]
    if not foreign(name) and all(plain_value(r) for r in runs):
        return name
    return hide("str", name)


_NAME_RUNS = lazy(r"[\s()\[\]]+")


def share_line(line: str, hide: Hide) -> str:
    """One line of free text: hidden whole when it holds foreign words, else word by word, a value after a label
    only in a name's shape (plain_value)."""
    if foreign(line):
        return hide("text", line)
    return share_words(share_labelled(line, hide), hide)


def share_text(text: str, hide: Hide) -> str:
    """Free text (error output, a sentence, a thread name, a path), line by line."""
    if not text:
        return text
    if "\n" not in text:
        return share_line(text, hide)
    return "\n".join(share_line(line, hide) for line in text.split("\n"))
