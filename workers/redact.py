"""Redaction of secrets before anything leaves the node: every string of every message the worker sends.

One redactor, used twice: here on the node (`redact_message` over each reply, plus the name-aware calls for
command lines, environment values and locals) and on the login side (app/report/redact.py, which imports these
rules and counts what they replace) over everything printed or written.

By structure first: a flag, variable, dict key, JSON field, keyword argument, annotated assignment or header whose
name says secret (pass, pwd, pw, secret, token, key, auth, cred, cookie, session, signature, ...) has its value
replaced whatever the value's shape (a string, a tuple of user and password, a dict, a call); URL credentials;
Authorization / X-Api-Key / Cookie headers. By pattern second: well-known token shapes (cloud keys, GitHub,
GitLab, Slack, Stripe, OpenAI, Hugging Face, JWTs, PEM private keys, basic-auth) and long high-entropy strings.

Values are replaced by `***`, names are kept, so a reader still sees *that* a token was passed. The rules err on
the side of hiding: a false positive costs a little context, a false negative leaks a credential. What is never
touched: a frame's function name, file name and module (code, not data; `keys`, `get_token` are functions),
numbers under ambiguous names (`num_key_value_heads 8`), paths.
"""

from __future__ import annotations

import math
import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Sequence

MASK = "***"

# Flag / variable names are split into words (dashes, underscores, dots, camelCase); a word that is one of
# these, or ends with one of the compound suffixes, marks the value as secret. Whole words keep harmless
# names apart: --keyframes, --max-tokens (a count), --tokenizer (a path), --author, passes.
_SECRET_WORDS = {"apikey", "token", "secret", "secrets", "password", "passwd", "passwords", "pwd", "pw", "pass",
                 "passphrase", "credential", "credentials", "cred", "creds", "authorization", "cookie", "cookies",
                 "privatekey", "signature", "accesskey", "secretkey", "sessionid", "sessiontoken", "bearer",
                 "authtoken", "xsrf", "csrf", "jwt", "pin", "otp", "apitoken", "dsn"}
# Ambiguous words: `--num-key-value-heads 8` is a model size, not a key. Under these names a plain number,
# boolean, None, object repr or path is kept; anything else is masked.
_WEAK_WORDS = {"key", "auth", "pat", "sas", "session", "sig", "salt", "nonce", "license", "cert", "keys"}
_SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "apikey", "credential", "credentials", "pwd",
                    "cookie", "signature")
_SECRET_PREFIXES = ("secret", "password", "passwd", "credential", "apikey", "authtoken", "passw")
# Two adjacent words that together say secret: API_KEY, access-key, private_key, X-Api-Key, session_id.
_SECRET_PAIRS = {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("session", "id"),
                 ("session", "key"), ("auth", "key"), ("signing", "key"), ("encryption", "key"),
                 ("master", "key"), ("client", "key"), ("sas", "key"), ("account", "key"), ("shared", "key")}
# Words that never make a name secret even though they end like one (bypass, compass).
_NOT_SECRET = {"bypass", "compass", "keyframes", "keyboard", "monkey", "donkey", "turkey", "hockey", "passes",
               "passage", "passenger", "passthrough", "passive", "pinned", "pinning", "pins", "keys"}

_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

_STRENGTH: dict = {}  # name -> _strength; the same few local and variable names come back on every frame


def _strength(name: str) -> int:
    """2: the name says secret; 1: it may (weak word); 0: harmless."""
    known = _STRENGTH.get(name)
    if known is None:
        if len(_STRENGTH) > 4096:
            _STRENGTH.clear()
        known = _STRENGTH[name] = _word_strength(name)
    return known


def _word_strength(name: str) -> int:
    found = 0
    # creds2, token_1, pw0: a number at the end of a word does not change what it names
    words = [w.lower().rstrip("0123456789") or w for w in _WORD_SPLIT.split(name.lstrip("-")) if w]
    for i, w in enumerate(words):
        if w in _NOT_SECRET:
            continue
        if w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) or w.startswith(_SECRET_PREFIXES):
            return 2
        if i + 1 < len(words) and (w, words[i + 1]) in _SECRET_PAIRS:
            return 2
        if w in _WEAK_WORDS or (w.endswith(("pass", "auth")) and len(w) > 4):
            found = 1
    return found


def secret_name(name: str) -> bool:
    """Whether a flag or variable name says its value may be a secret (HF_TOKEN, --api-key, --hf_token)."""
    return _strength(name) > 0


_HARMLESS_WEAK = re.compile(
    r"(?:[-+]?(?:\d[\d_]*(?:\.\d*)?(?:[eE][-+]?\d+)?|0[xX][0-9a-fA-F]+|\.\d+)|True|False|None|true|false|yes|no"
    r"|none|null|nan|inf|lambda|self|"
    r"<[^\n]{0,200} at 0x[0-9a-fA-F]+>|<(?:built-in |bound )?(?:function|method|module|class)[^\n]{0,200}>"
    r"|/[\w./+-]*"  # an absolute path
    r"|[(\[](?:\s*-?\d+\s*,?)*[)\]]|torch\.Size\(\[[\d, ]*\]\)"  # shapes
    r")")


def secret_value(name: str, value: str) -> bool:
    """Whether `value`, given under `name`, must be masked."""
    strength = _strength(name)
    if strength == 1:
        v = value.strip()
        return not (v == "" or v == MASK or _HARMLESS_WEAK.fullmatch(v) is not None)
    return strength == 2 and value != MASK


# -- token shapes -------------------------------------------------------------------------------------------
# Values shaped like well-known credentials, found anywhere inside a string: one alternation, one pass; the
# group that matched names the rule (the login side counts by rule).
_SHAPES = re.compile("|".join("(?P<%s>%s)" % (name, pattern) for name, pattern in (
    ("private_key", r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?"
                    r"(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)"),
    ("hf_token", r"\bhf_[A-Za-z0-9]{20,}"),
    ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
    ("gitlab_token", r"\bgl(?:pat|dt|rt|ptt|cbt|oas)-[A-Za-z0-9_-]{20,}"),
    ("aws_access_key", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ABIA|ACCA)[0-9A-Z]{16}\b"),
    ("jwt", r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
            r"\.[A-Za-z0-9_-]*"),
    ("slack_token", r"\bxox[abposre]-[A-Za-z0-9-]{10,}|hooks\.slack\.com/services/[A-Za-z0-9/]+"),
    ("stripe_key", r"\b(?:sk|rk|pk|whsec)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("openai_key", r"\bsk-(?:proj-|ant-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
    ("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}"),
    ("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b"),
    ("pypi_token", r"\bpypi-AgE[A-Za-z0-9_-]{50,}"),
    ("sendgrid_key", r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"),
    ("basic_auth", r"(?<=\bBasic )[A-Za-z0-9+/]{8,}={0,2}"),
    ("bearer_token", r"(?<=\bBearer )[A-Za-z0-9._~+/=-]{6,}"),
)), re.S)
# A cheap test first: only text with one of these can hold a shape.
_ANY_PREFIX = re.compile(r"PRIVATE KEY|hf_|gh[pousr]_|github_pat_|gl[a-z]{1,3}-|A[KSGIRNBC][IS]A|eyJ|xox|sk|rk_|pk_"
                         r"|whsec_|AIza|npm_|pypi-|SG\.|Basic |Bearer |slack")

# scheme://user:password@host -> scheme://user:***@host (also an empty user: redis://:pw@host)
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@\"'<>\\]*:)(?P<pw>[^\s@/\"'<>\\]+)(?=@)")

# -- structure: a secret-named name, then its value -----------------------------------------------------------
# A value: a quoted string (also strace's escaped quotes and Python's b''/r''/f''), a tuple/list/dict with one
# level of nesting, a call, an auth scheme and its credential, or a bare run up to the next delimiter (strace's
# \r \n escapes end it too).
_Q = r"(?:\\\"(?:(?!\\\").){0,1000}?\\\"|[bBrRuUfF]{0,2}\"(?:[^\"\\\n]|\\.){0,1000}\"|[bBrRuUfF]{0,2}'(?:[^'\\\n]|\\.){0,1000}')"
_NEST = r"(?:[^()\[\]{}\n]|\([^()\n]*\)|\[[^\[\]\n]*\]|\{[^{}\n]*\})"
_VALUE = (r"(?P<val>" + _Q + r"|0x[0-9a-fA-F]+[ \t]+" + _Q +  # gdb: a char* argument is an address and its text
          r"|\(" + _NEST + r"{0,1000}\)|\[" + _NEST + r"{0,1000}\]|\{" + _NEST + r"{0,1000}\}"
          r"|[A-Za-z_][\w.]*\(" + _NEST + r"{0,1000}\)"
          r"|(?:Bearer|Basic|Token|Digest|Bot|Negotiate|token|bearer|basic)[ \t]+(?:(?!\\[rnt\"'])[^\s\"',;&|)\]}<])+"
          r"|(?:(?!\\[rnt\"'])[^\s\"',;&|)\]}<])+)")
# "name": value / 'name': value / \"name\": value / ("name", value): dict reprs, JSON, strace'd JSON, pairs.
_KEYVAL = re.compile(r"(?P<q>\\?[\"'])(?P<name>[A-Za-z_][\w .-]{0,80}?)(?P=q)\s*(?::|=>?|,)\s*" + _VALUE)
# name=value, name = value, name: value, name: Type = value, name == value (kwargs, assignments, headers,
# env, log lines, YAML).
_ESC = r"(?<=\\[nrt])"  # just after an escaped newline or tab in a repr or strace string: a new field starts
_ASSIGN = re.compile(r"(?:" + _ESC + r"|(?<![\w\\/.-]))(?P<name>[A-Za-z_][\w.-]*?)(?P<sep>\s*(?::\s*[A-Za-z_][\w.\[\], |]*?\s+)?==?\s*"
                     r"|[ \t]*:[ \t]*)(?!=)" + _VALUE)
# --flag value / --flag=value in free text (a shell command, a -c program). A value after a space never starts
# with "-" (that is the next flag), so "--use-auth --token x" still reaches --token.
_FLAG = re.compile(r"(?P<flag>(?:" + _ESC + r"|(?<![\w\\-]))--?[A-Za-z][\w.-]*)(?P<sep>=|[ \t]+(?!-))" + _VALUE)
# NAME value: an upper-case secret name, a space, its value (AWS_SECRET_ACCESS_KEY wJal..., PASS x in a
# protocol line); and NCCL's echo of its environment ("NCCL_IB_AUTH_TOKEN set by environment to x").
_SPACED = re.compile(r"(?:" + _ESC + r"|(?<![\w\\/.-]))(?P<name>[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]|PASS|PASSWORD|PASSWD|TOKEN|SECRET|APIKEY)"
                     r"(?P<sep>[ \t]+(?:set by environment to[ \t]+)?)(?![-=:])" + _VALUE)
# Headers whose whole value (to the end of the line or the string) is a credential.
_SCHEME = r"(?:Bearer|Basic|Token|Digest|Bot|Negotiate|AWS4-HMAC-SHA256|token|bearer|basic)"
_HEADER = re.compile(r"(?i)(?P<name>\b(?:set-)?cookie|\bproxy-authorization|\bauthorization)"
                     r"(?P<sep>[ \t]*:[ \t]*(?:" + _SCHEME + r"[ \t]+)?)"
                     r"(?P<val>(?:(?!\\[rnt\"']|&(?:quot|#x27|#39|lt|gt);)[^\n\"'<])+)")

# -- long high-entropy strings ---------------------------------------------------------------------------------
_CANDIDATE = re.compile(r"(?:" + _ESC + r"|(?<![\w+=/\\-]))[A-Za-z0-9+_-]{20,}={0,2}(?![\w+=-])")


def _entropy(s: str) -> float:
    n = len(s)
    counts: Dict[str, int] = {}
    for c in s:
        counts[c] = counts.get(c, 0) + 1
    return -sum(k / n * math.log2(k / n) for k in counts.values())


_CASE_RUN = re.compile(r"[a-z]{8,}|[A-Z]{8,}")
_WORDISH = re.compile(r"[A-Z]?[a-z]{3,}|[A-Z]{3,}(?![a-z])")


def _klass(c: str) -> int:
    return 0 if c.islower() else 1 if c.isupper() else 2 if c.isdigit() else 3


def high_entropy(token: str) -> bool:
    """A long random-looking string: upper and lower case letters and digits mixed, switching between them as
    often as random text does, near the entropy of random text of its length. Identifiers and symbols
    (HUF_decompress4X1_usingDTable, entry_SYSCALL_64_after_hwframe: words, long same-case runs) and hex hashes
    (one case) do not qualify."""
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


def _ents(text: str, hits: Optional[Dict[str, int]]) -> str:
    def sub(m: "re.Match[str]") -> str:
        token = m.group(0)
        if not high_entropy(token):
            return token
        _count(hits, "high-entropy")
        return MASK

    return _CANDIDATE.sub(sub, text)


# -- free text ------------------------------------------------------------------------------------------------


def _count(hits: Optional[Dict[str, int]], rule: str) -> None:
    if hits is not None:
        hits[rule] = hits.get(rule, 0) + 1


def _unquote(val: str) -> "tuple[str, str, str]":
    """(opening quote, inner text, closing quote) of a matched value; no quotes for a bare or container value."""
    if val.startswith('\\"') and val.endswith('\\"') and len(val) >= 4:
        return '\\"', val[2:-2], '\\"'
    i = 0
    while i < 2 and i < len(val) and val[i] in "bBrRuUfF":
        i += 1
    if len(val) - i >= 2 and val[i] in "'\"" and val[-1] == val[i]:
        return val[: i + 1], val[i + 1:-1], val[-1]
    return "", val, ""


_ALREADY = re.compile(r"(?:" + _SCHEME + r"\s+)?(?:\*\*\*)?[\s:,;]*")


def _hidden(inner: str) -> bool:
    """Nothing left to hide: empty, or only the marker (after an auth scheme)."""
    return _ALREADY.fullmatch(inner) is not None


def _named(pattern: "re.Pattern[str]", text: str, rule: str, hits: Optional[Dict[str, int]],
           group: str = "name") -> str:
    """Replace the value of each secret-named match. A match whose name is harmless is kept and its value
    scanned again (`note: password=x`: the harmless `note:` must not hide the `password=` inside)."""
    out: List[str] = []
    done = pos = 0
    while True:
        m = pattern.search(text, pos)
        if m is None:
            break
        name, val = m.group(group).strip(), m.group("val")
        pre, inner, post = _unquote(val)
        # file.py:12, module.attr: (the quoted-key rule has no separator group: `"train.py", line 9`)
        location = group == "name" and "." in name and "=" not in (m.groupdict().get("sep") or "")
        if location or _hidden(inner) or not secret_name(name) or not secret_value(name, inner):
            pos = m.start("val") if m.start("val") > m.start() else m.start() + 1
            continue
        _count(hits, rule)
        out.append(text[done:m.start("val")] + pre + MASK + post)
        done = pos = m.end()
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


# Every secret name holds one of these (see _SECRET_WORDS, _WEAK_WORDS, _SECRET_PAIRS): text without any cannot
# match a structural rule, and most text (frames, paths, numbers, syscalls) has none.
_NAME_HINT = re.compile(r"pass|pw|secret|token|key|auth|cred|cookie|session|sig|salt|nonce|licen|cert|pin|otp|dsn"
                        r"|jwt|csrf|xsrf|bearer")  # searched in the lower-cased text
_PAT_HINT = re.compile(r"PAT|SAS|(?<![A-Za-z])[PpSs]a[ts](?![a-z])")


def redact_text(text: str, hits: Optional[Dict[str, int]] = None) -> str:
    """Mask secrets anywhere in free text (tool output, locals' reprs, source lines, names, error messages):
    token shapes, URL passwords, credential headers, secret-named values, long high-entropy strings. `hits`,
    when given, counts the replacements by rule."""
    if not text:
        return text
    if _ANY_PREFIX.search(text):
        def shape(m: "re.Match[str]") -> str:
            _count(hits, str(m.lastgroup).replace("_", "-"))
            return MASK
        text = _SHAPES.sub(shape, text)
    if "://" in text:
        def url(m: "re.Match[str]") -> str:
            if m.group("pw") == MASK:
                return m.group(0)
            _count(hits, "url-password")
            return m.group("head") + MASK
        text = _URL_CREDENTIALS.sub(url, text)
    if _NAME_HINT.search(text.lower()) is None and _PAT_HINT.search(text) is None:  # no name in it can say secret: only the high-entropy scan is left
        return _ents(text, hits)
    if ":" in text:
        text = _named(_HEADER, text, "auth-header", hits)
    if "-" in text:
        text = _named(_FLAG, text, "secret-flag", hits, "flag")
    if "=" in text or ":" in text:
        text = _named(_ASSIGN, text, "secret-assignment", hits)
    if " " in text or "\t" in text:
        text = _named(_SPACED, text, "secret-assignment", hits)
    if "'" in text or '"' in text:
        text = _named(_KEYVAL, text, "secret-key-value", hits)
    return _ents(text, hits)


def redact_named(name: str, value: str, hits: Optional[Dict[str, int]] = None, rule: str = "secret-local") -> str:
    """A value under a name (a local, an env variable, a loop variable): all of it when the name says secret,
    else the free-text rules."""
    inner = _unquote(value.strip())[1]
    if inner.strip() and secret_value(name, inner):
        _count(hits, rule)
        return MASK
    return redact_text(value, hits)


def redact_argv(argv: Sequence[str]) -> List[str]:
    """A command line with secret flag values, NAME=value secrets, URL passwords and token shapes masked."""
    out: List[str] = []
    pending = ""  # a secret-named flag whose value is the next argument
    for arg in argv:
        if pending:
            flag, pending = pending, ""
            # A following flag means the secret-named one was a switch (--use-auth --lr 0.1): keep it.
            if not arg.startswith("-") or _is_number(arg):
                out.append(MASK if secret_value(flag, arg) else redact_text(arg))
                continue
        if arg.startswith("-") and len(arg) > 1 and not _is_number(arg):
            name, eq, value = arg.partition("=")
            if secret_name(name):
                if not eq:
                    out.append(arg)
                    pending = name
                else:
                    out.append(name + "=" + (MASK if secret_value(name, value) else redact_text(value)))
                continue
        out.append(redact_text(arg))
    return out


def redact_env_value(name: str, value: str) -> str:
    return MASK if secret_value(name, value) else redact_text(value)


# -- every message --------------------------------------------------------------------------------------------
# Code, not data: a frame's function, file and module name are never secrets (`keys`, `get_token`), and the
# protocol's own bookkeeping keys hold no remote text.
_CODE_KEYS = frozenset({"filename", "short_filename", "module"})
_MEMO: Dict[str, str] = {}
_MEMO_MAX = 8192


def _text_memo(s: str) -> str:
    out = _MEMO.get(s)
    if out is None:
        out = redact_text(s)
        if len(s) <= 2048:
            if len(_MEMO) >= _MEMO_MAX:
                _MEMO.clear()
            _MEMO[s] = out
    return out


def redact_message(msg: Any) -> Any:
    """Every string of a reply, redacted: the one pass before anything leaves the node. Structure is used where
    the message has it: a local's repr under its name, a `[name, value]` pair, a dict key that says secret."""
    return _walk(msg, "", False)


def _walk(obj: Any, key: str, frame: bool) -> Any:
    if isinstance(obj, str):
        if key in _CODE_KEYS or (frame and key == "name"):
            return obj
        return _text_memo(obj)
    if isinstance(obj, dict):
        is_frame = "filename" in obj and ("line" in obj or "lineno" in obj)
        local_name = obj.get("name") if "repr" in obj and isinstance(obj.get("name"), str) else None
        out = {}
        for k, v in obj.items():
            sk = k if isinstance(k, str) else str(k)
            if local_name is not None and sk == "repr" and isinstance(v, str):
                out[k] = redact_named(local_name, v)
            elif isinstance(v, (str, int, float)) and not isinstance(v, bool) and _strength(sk) \
                    and secret_value(sk, str(v)):
                out[k] = MASK  # {"password": ...} in a record, a JSON body, a Flight Recorder field
            else:
                out[k] = _walk(v, sk, is_frame)
        return out
    if isinstance(obj, (list, tuple)):
        if key in ("cmdline", "argv") and all(isinstance(a, str) for a in obj):
            return redact_argv(obj)
        if len(obj) == 2 and isinstance(obj[0], str) and isinstance(obj[1], str) and _strength(obj[0]):
            return [obj[0], redact_named(obj[0], obj[1], rule="secret-env")]  # an env pair
        return [_walk(v, key, False) for v in obj]
    return obj


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True
