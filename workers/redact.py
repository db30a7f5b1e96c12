"""The pattern net: secrets masked before anything leaves the node, in every string of every message the worker
sends. What the TUI and --print show; the export bundle and --snapshot add the default-deny rule on top
(app/report/share.py).

One net, used twice: here on the node (`redact_message` over each reply, plus the name-aware calls for command
lines, environment values and locals) and on the login side (app/report/redact.py, which imports these rules and
counts what they replace) over everything printed.

By structure first: a flag, variable, dict key, JSON field, keyword argument, subscript, annotated assignment or
header whose name says secret (workers/secretnames.py) has its value replaced whatever the value's shape; a value
under an ambiguous name (`key`, `token_count`) only when the default-deny rule does not find it safe. Short
flags that carry passwords (`-p v`, `-pSECRET`, `-u user:pw`); URL credentials (a password holding `@`, a token
as the URL's user, `user/pw@host`, random path segments and query values); a password word followed by its value
in prose (`password hunter2`, netrc lines). Code (source lines, locals' reprs: workers/redact_code.py) is read as
tokens, so only the inside of a literal is ever replaced and a line keeps its shape. By pattern second: well-known
token shapes (cloud keys, GitHub, GitLab, Slack, Stripe, OpenAI, Hugging Face, JWTs, PEM private keys,
vendor-prefixed hex tokens) and long high-entropy strings, in paths too.

Values are replaced by `***`, names are kept, so a reader still sees *that* a token was passed. What is never
touched: a frame's function and module name (code, not data: `keys`, `get_token` are functions); a file name is a
path, checked for token shapes only. strace payloads and gdb strings are not text at all
(workers/tooltext.py).
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Sequence

from workers import redact_code
from workers.cleartext import clear_value, clear_word, high_entropy
from workers.lazyre import lazy
from workers.secretnames import MASK, PASSWORD_ABROAD, secret_name, secret_value, strength

__all__ = ["MASK", "secret_name", "secret_value", "high_entropy", "redact_text", "redact_named", "redact_argv",
           "redact_env_value", "redact_message", "redact_source", "redact_path"]

# -- token shapes -------------------------------------------------------------------------------------------
# Values shaped like well-known credentials, found anywhere inside a string: one alternation, one pass; the
# group that matched names the rule (the login side counts by rule).
_SHAPES = lazy("|".join("(?P<%s>%s)" % (name, pattern) for name, pattern in (
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
    # a vendor's prefix glued to a long hex secret (`dapi` + 32 hex, `dop_v1_` + 64 hex): the prefix holds a
    # letter no hex digest has, so a bare digest (a commit, a run id) is not one
    ("prefixed_token", r"\b(?=[a-z]{0,7}[g-z])[a-z]{2,8}(?:_v\d+_|_|-)?[0-9a-f]{32,}\b"),
    # kubeadm's bootstrap token (`kubeadm join --token abcdef.0123456789abcdef`): 6 and 16 of [a-z0-9], a digit
    # and a letter in the secret half
    ("kube_bootstrap_token", r"\b[a-z0-9]{6}\.(?=[a-z]{0,15}[0-9])(?=[0-9]{0,15}[a-z])[a-z0-9]{16}\b"),
    # age's (SOPS's) secret key: its fixed prefix, then bech32
    ("age_secret_key", r"\bAGE-SECRET-KEY-1[02-9AC-HJ-NP-Z]{50,}"),
    ("basic_auth", r"(?<=\bBasic )[A-Za-z0-9+/]{8,}={0,2}"),
    ("bearer_token", r"(?<=\bBearer )[A-Za-z0-9._~+/=-]{6,}"),
)), re.S)
# A cheap test first: only text with one of these can hold a shape.
_ANY_PREFIX = lazy(r"PRIVATE KEY|hf_|gh[pousr]_|github_pat_|gl[a-z]{1,3}-|A[KSGIRNBC][IS]A|eyJ|xox|sk|rk_|pk_"
                   r"|whsec_|AIza|npm_|pypi-|SG\.|Basic |Bearer |slack|[0-9a-f]{32}|AGE-SECRET-KEY-"
                   r"|\b[a-z0-9]{6}\.[a-z0-9]{16}\b")

# -- URLs -----------------------------------------------------------------------------------------------------
# scheme://user:password@host -> scheme://user:***@host. The password runs to the *last* `@` of the authority
# (a password may hold `@`); an empty user too (redis://:pw@host).
_URL_CREDENTIALS = lazy(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@\"'`<>\\]*:)"
                        r"(?P<pw>[^\s/?#\"'`<>\\]+)(?=@[^\s@/?#\"'`<>\\]+(?:[/?#\s\"'`<>\\,;)\]}]|$))")
# scheme://USER@host with no password: USER is a token unless it reads like a user name (git@, alice@)
_URL_USER = lazy(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s:/?#@\"'`<>\\]+)(?=@[^\s@/?#\"'`<>\\]+)")
# user/password@host (Oracle, DB2 connect strings); not a package at a version (`org/pkg@v1.2`)
_DSN = lazy(r"(?<![\w/.:@%$-])(?P<user>[A-Za-z_][\w$#.-]{0,63})/(?P<pw>[^\s/@\"'`<>]{1,200})"
            r"@(?!v?\d+(?:\.\d+)*\b)(?=[A-Za-z0-9\[])")
# the path and query of a URL: a segment or a query value that is not safe by the default-deny rule and long
# enough to carry a token (a webhook's token, a presigned signature) is masked
_URL_REST = lazy(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#\"'`<>\\]+)(?P<rest>[/?][^\s\"'`<>\\]*)")
_SEGMENT = lazy(r"(?<=[/=&?])[^/?&=#;]{16,}")

# -- structure: a secret-named name, then its value -----------------------------------------------------------
# A value: a quoted string (also strace's escaped quotes, Python's b''/r''/f'', a Markdown code span), a
# tuple/list/dict with one level of nesting, a call, an auth scheme and its credential, or a bare run up to the
# next delimiter (strace's \r \n escapes end it too).
_Q = (r"(?:\\\"(?:(?!\\\").){0,1000}?\\\"|[bBrRuUfF]{0,2}\"(?:[^\"\\\n]|\\.){0,1000}\""
      r"|[bBrRuUfF]{0,2}'(?:[^'\\\n]|\\.){0,1000}'|`[^`\n]{0,1000}`)")
_NEST = r"(?:[^()\[\]{}\n]|\([^()\n]*\)|\[[^\[\]\n]*\]|\{[^{}\n]*\})"
_VALUE = (r"(?P<val>" + _Q + r"|0x[0-9a-fA-F]+[ \t]+" + _Q +  # gdb: a char* argument is an address and its text
          r"|\(" + _NEST + r"{0,1000}\)|\[" + _NEST + r"{0,1000}\]|\{" + _NEST + r"{0,1000}\}"
          r"|[A-Za-z_][\w.]*\(" + _NEST + r"{0,1000}\)"
          r"|(?:Bearer|Basic|Token|Digest|Bot|Negotiate|token|bearer|basic)[ \t]+(?:(?!\\[rnt\"'])[^\s\"',;&|)\]}<])+"
          r"|(?:(?!\\[rnt\"'])[^\s\"'`,;&|)\]}<])+)")
# "name": value / 'name': value / \"name\": value / ("name", value) / ["--flag", value] / cfg["name"] = value:
# dict reprs, JSON, strace'd JSON, pairs, command lists, subscript assignments.
_KEYVAL = lazy(r"(?P<q>\\?[\"'])(?P<name>-{0,2}[A-Za-z_][\w .-]{0,80}?)(?P=q)\]?\s*(?::|=>?|,)\s*" + _VALUE)
# name=value, name = value, name: value, name: Type = value, name == value (kwargs, assignments, headers,
# env, log lines, YAML).
_ESC = r"(?<=\\[nrt])"  # just after an escaped newline or tab in a repr or strace string: a new field starts
_ASSIGN = lazy(r"(?:" + _ESC + r"|(?<![\w\\/.-]))(?P<name>[A-Za-z_][\w.-]*?)(?P<sep>\s*(?::\s*[A-Za-z_][\w.\[\], |]*?\s+)?==?\s*"
               r"|[ \t]*:[ \t]*)(?!=)" + _VALUE)
# --flag value / --flag=value in free text (a shell command, a -c program). A value after a space never starts
# with "-" (that is the next flag), so "--use-auth --token x" still reaches --token.
_FLAG = lazy(r"(?P<flag>(?:" + _ESC + r"|(?<![\w\\-]))--?[A-Za-z][\w.-]*)(?P<sep>=|[ \t]+(?!-))" + _VALUE)
# NAME value: an upper-case secret name, a space, its value (AWS_SECRET_ACCESS_KEY wJal..., PASS x in a
# protocol line); and NCCL's echo of its environment ("NCCL_IB_AUTH_TOKEN set by environment to x").
_SPACED = lazy(r"(?:" + _ESC + r"|(?<![\w\\/.-]))(?P<name>[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]|PASS|PASSWORD|PASSWD|TOKEN|SECRET|APIKEY)"
               r"(?P<sep>[ \t]+(?:set by environment to[ \t]+)?)(?![-=:])" + _VALUE)
# A password word in prose, then its value: "password hunter2", "(passcode 4821)", "password is x", a netrc
# line's "password x". Only words that mean nothing else (`pass`, `token`, `secret` begin ordinary sentences).
_PROSE = lazy(r"(?i)(?P<name>\b(?:password|passwd|passcode|passphrase|passkey)s?)(?P<sep>[ \t]+(?:(?:is|was|of|"
              r"for [\w.@-]+|:)[ \t]+)?)(?![-=:])" + _VALUE)
_PROSE_KEEP = frozenset({"is", "was", "are", "were", "for", "of", "to", "in", "on", "and", "or", "not", "the", "a",
                         "an", "with", "from", "required", "missing", "invalid", "incorrect", "wrong", "expired",
                         "changed", "reset", "set", "must", "should", "will", "has", "have", "had", "be", "been",
                         "file", "prompt", "authentication", "auth", "login", "field", "policy", "length", "hash",
                         "none", "null", "empty", "needed", "given", "provided", "protected", "manager", "store",
                         "if", "else", "then", "as", "by", "at", "when", "that", "this", "it", "into",
                         "true", "false", "argument", "parameter", "option", "variable", "env"})
# A protocol's login command, in a line of text or a thread name (the bytes on a socket are not text at all:
# workers/tooltext.py): everything after the verb to the end of the line is its credentials.
_PROTOCOL = lazy(r"(?<![\w-])(?P<name>AUTH|LOGIN|PASS|addauth)(?P<sep>[ \t]+)"
                 r"(?P<val>(?:(?!\\[rn])[^\r\n\"'])+)")
# Headers whose whole value (to the end of the line or the string) is a credential.
_SCHEME = r"(?:Bearer|Basic|Token|Digest|Bot|Negotiate|AWS4-HMAC-SHA256|token|bearer|basic)"
_HEADER = lazy(r"(?i)(?P<name>\b(?:set-)?cookie|\bproxy-authorization|\bauthorization)"
               r"(?P<sep>[ \t]*:[ \t]*(?:" + _SCHEME + r"[ \t]+)?)"
               r"(?P<val>(?:(?!\\[rnt\"']|&(?:quot|#x27|#39|lt|gt);)[^\n\"'<])+)")

# -- short flags that carry a password --------------------------------------------------------------------------
# `-p VALUE` (sshpass, redis-cli -a's cousins, mysql's spaced form), `-pVALUE` (mysql), `-u user:pw` / `--user
# user:pw` (curl, wget). A number after -p is a port (`ssh -p 22`), a path a directory (`mkdir -p /x`).
_SHORT_P = lazy(r"(?<![\w\\/.-])-p(?P<sep>[ \t]+(?!-)|)(?P<val>(?P<q>\\?[\"'`])[^\s\"'`]+(?P=q)"
                r"|[^\s\"'`,;&|)\]}<]+)")
# (in a command list's repr, `'-u', 'user:pw'`: the flag's closing quote and the comma are its separator)
_USER_PAIR = lazy(r"(?<![\w\\/.-])(?P<flag>-u|--user|--proxy-user|-U)"
                  r"(?P<sep>[ \t]+|=|\\?[\"'`][ \t]*,[ \t]*)(?P<q>\\?[\"'`]?)"
                  r"(?P<user>[^\s:\"'`]+):(?P<val>[^\s\"'`]+)")

# -- long high-entropy strings ---------------------------------------------------------------------------------
_CANDIDATE = lazy(r"(?:" + _ESC + r"|(?<![\w+=\\-]))[A-Za-z0-9+_-]{20,}={0,2}(?![\w+=-])")
# base64 with `/` in it (an AWS secret key): judged whole, a path's components never look this random together
_CANDIDATE_B64 = lazy(r"(?<![\w+=/\\-])[A-Za-z0-9+/]{28,}={0,2}(?![\w+=/-])")
# A run of 12+ letters and digits mixing upper and lower case that the default-deny rule does not read as a name:
# a token glued to a word (`uploader-<token>`), a directory named after one, an OS thread name (15 characters at
# most). With digits in it, that is enough; of letters alone, it must also switch case as often as random letters
# do and not be mostly words (`GruvboxDarkStyle`, `NetFxSdkVersion` read as CamelCase and stay): measured on the
# 80,000 mixed-case identifiers of the stdlib, site-packages and torch's headers, 0.05 % masked (half of them
# base64 test data), and 6 in 10 random letter tokens of 12-20 characters.
_MIXED = lazy(r"(?<![A-Za-z0-9])[A-Za-z0-9]{12,}(?![A-Za-z0-9])")
_WORDISH = lazy(r"[A-Z]?[a-z]{3,}|[A-Z]{3,}(?![a-z])")


def _random_letters(token: str) -> bool:
    """Mixed-case letters that read like random ones: case switches at 30 % of the places or more, and less than
    half of the letters in word-like runs (the high-entropy rule's CamelCase test)."""
    switches = sum(1 for a, b in zip(token, token[1:]) if a.isupper() != b.isupper())
    if switches < 0.3 * (len(token) - 1):
        return False
    return sum(len(w) for w in _WORDISH.findall(token)) < 0.5 * len(token)
_SRI = lazy(r"sha(?:256|384|512)-[A-Za-z0-9+/]+=*")


def _ents(text: str, hits: Optional[Dict[str, int]]) -> str:
    def sub(m: "re.Match[str]") -> str:
        token = m.group(0)
        if not high_entropy(token):
            return token
        _count(hits, "high-entropy")
        return MASK

    def mixed(m: "re.Match[str]") -> str:
        token = m.group(0)
        if token.isdigit() or token.islower() or token.isupper() or clear_word(token):
            return token
        if not any(c.isdigit() for c in token) and not _random_letters(token):
            return token
        _count(hits, "random-token")
        return MASK

    if "/" in text and len(text) >= 28:
        text = _CANDIDATE_B64.sub(sub, text)
    text = _CANDIDATE.sub(sub, text)
    if len(text) < 12:
        return text
    if "sha" not in text:
        return _MIXED.sub(mixed, text)
    # a Subresource Integrity / CSP hash (`sha256-<base64>`) is a public digest: left as it is
    out, done = [], 0
    for m in _SRI.finditer(text):
        out.append(_MIXED.sub(mixed, text[done:m.start()]) + m.group(0))
        done = m.end()
    return "".join(out) + _MIXED.sub(mixed, text[done:])


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
    if len(val) - i >= 2 and val[i] in "'\"`" and val[-1] == val[i]:
        return val[: i + 1], val[i + 1:-1], val[-1]
    return "", val, ""


_ALREADY = lazy(r"(?:" + _SCHEME + r"\s+)?(?:\*\*\*)?[\s:,;]*")
_CALL = lazy(r"[A-Za-z_][\w.]*\(.*\)", re.S)


def _hidden(inner: str) -> bool:
    """Nothing left to hide: empty, or only the marker (after an auth scheme)."""
    return _ALREADY.fullmatch(inner) is not None


def _code_value(val: str) -> bool:
    """A bare value that is the head of an expression (`batch[`, `cfg.`): code, not a value."""
    return val.endswith(("[", "(", "."))


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
        if name in _SHORT_PASSWORD:  # `'-p', 'value'` in a command list's repr
            keep = _hidden(inner) or _is_number(inner) or inner.startswith(("/", "-"))
        else:
            keep = (location or _hidden(inner) or _code_value(val) or not secret_name(name)
                    or not secret_value(name, inner) or (strength(name) == 1 and _CALL.fullmatch(val) is not None))
        if pattern is _PROSE and not keep:
            keep = inner.lower().strip(".,;:!?()") in _PROSE_KEEP
        if keep:
            pos = m.start("val") if m.start("val") > m.start() else m.start() + 1
            continue
        _count(hits, rule)
        out.append(text[done:m.start("val")] + pre + MASK + post)
        done = pos = m.end()
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _short_flags(text: str, hits: Optional[Dict[str, int]]) -> str:
    def p(m: "re.Match[str]") -> str:
        pre, inner, post = _unquote(m.group("val"))
        if _hidden(inner) or _is_number(inner) or inner.startswith("/") or inner in redact_code.GLUED_P_FLAGS:
            return m.group(0)
        if not m.group("sep") and (len(inner) < 3 or not pre and inner.startswith(("-", "="))):
            return m.group(0)  # -pv (two switches), -p=...
        _count(hits, "secret-flag")
        return "-p" + m.group("sep") + pre + MASK + post

    def u(m: "re.Match[str]") -> str:
        if m.group("val") == MASK or _is_number(m.group("val")):  # user:pw, never host:port
            return m.group(0)
        _count(hits, "secret-flag")
        return m.group(0)[:m.start("val") - m.start()] + MASK

    if "-p" in text:
        text = _SHORT_P.sub(p, text)
    if "-u" in text or "-U" in text or "--user" in text or "--proxy-user" in text:
        text = _USER_PAIR.sub(u, text)
    return text


def _urls(text: str, hits: Optional[Dict[str, int]]) -> str:
    def cred(m: "re.Match[str]") -> str:
        if m.group("pw") == MASK:
            return m.group(0)
        _count(hits, "url-password")
        return m.group("head") + MASK

    def user(m: "re.Match[str]") -> str:
        u = m.group("user")
        if u == MASK or (len(u) <= 32 and clear_word(u)):
            return m.group(0)
        _count(hits, "url-password")
        return m.group("head") + MASK

    def rest(m: "re.Match[str]") -> str:
        def seg(s: "re.Match[str]") -> str:
            v = s.group(0)
            if MASK in v or clear_value(v):
                return v
            _count(hits, "url-token")
            return MASK
        return m.group("head") + _SEGMENT.sub(seg, m.group("rest"))

    text = _URL_CREDENTIALS.sub(cred, text)
    text = _URL_USER.sub(user, text)
    return _URL_REST.sub(rest, text)


def _dsn(text: str, hits: Optional[Dict[str, int]]) -> str:
    def sub(m: "re.Match[str]") -> str:
        if m.group("pw") == MASK or "://" in text[max(0, m.start() - 12):m.start()]:
            return m.group(0)
        _count(hits, "url-password")
        return m.group("user") + "/" + MASK + "@"
    return _DSN.sub(sub, text)


# Every secret name holds one of these (workers/secretnames.py): text without any cannot match a structural
# rule, and most text (frames, paths, numbers, syscalls) has none.
_ABROAD = "|".join(sorted((re.escape(w) for w in PASSWORD_ABROAD), key=len, reverse=True))
_ABROAD_SPACED = r"mot.de.passe|mật.khẩu|mat.khau|kata.sandi"  # PASSWORD_ABROAD's words written apart
_NAME_HINT = lazy(r"pass|pw|secret|token|key|auth|cred|cookie|session|sig|salt|nonce|licen|cert|pin|otp|dsn"
                  r"|jwt|csrf|xsrf|bearer|psk|priv|ticket|netrc|hmac|" + _ABROAD_SPACED +
                  r"|كلمة.(?:المرور|السر)|" + _ABROAD)  # searched in the lower-cased text
# The word for password in another language, then its value after a colon, maybe a few words on (a comment
# `# contraseña de respaldo: x`, `пароль от стенда: x`, `密码：x`): the value is masked, the words before kept.
_PROSE_ABROAD = lazy(r"(?i)(?P<name>(?:" + _ABROAD + "|" + _ABROAD_SPACED + r"))"
                     r"(?P<sep>[^\n:：=\"']{0,40}?[ \t]*[:：][ \t]*)(?![-=:])" + _VALUE)
_PAT_HINT = lazy(r"PAT|SAS|(?<![A-Za-z])[PpSs]a[ts](?![a-z])")


def redact_text(text: str, hits: Optional[Dict[str, int]] = None, code: bool = False) -> str:
    """Mask secrets anywhere in free text (tool output, locals' reprs, names, error messages): token shapes, URL
    credentials, credential headers, secret-named values, short password flags, password words in prose, long
    high-entropy strings. `hits`, when given, counts the replacements by rule. code=True: the text is the code
    between the literals of a source line (workers/redact_code.py): names there are code, so only the shapes,
    URLs, prose and entropy rules apply."""
    if not text:
        return text
    if _ANY_PREFIX.search(text):
        def shape(m: "re.Match[str]") -> str:
            _count(hits, str(m.lastgroup).replace("_", "-"))
            return MASK
        text = _SHAPES.sub(shape, text)
    if "://" in text:
        text = _urls(text, hits)
    if "@" in text and "/" in text:
        text = _dsn(text, hits)
    if not code and "-" in text:
        text = _short_flags(text, hits)
    lower = text.lower()
    if _NAME_HINT.search(lower) is None and _PAT_HINT.search(text) is None:  # no name in it can say secret
        return _ents(text, hits)
    if "pass" in lower:
        text = _named(_PROSE, text, "secret-prose", hits)
    if ":" in text or "：" in text:
        text = _named(_PROSE_ABROAD, text, "secret-prose", hits)
    if not code:
        if ":" in text:
            text = _named(_HEADER, text, "auth-header", hits)
        if "-" in text:
            text = _named(_FLAG, text, "secret-flag", hits, "flag")
        if "=" in text or ":" in text:
            text = _named(_ASSIGN, text, "secret-assignment", hits)
        if "'" in text or '"' in text:
            text = _named(_KEYVAL, text, "secret-key-value", hits)
    if " " in text or "\t" in text:
        text = _named(_SPACED, text, "secret-assignment", hits)
        if "AUTH" in text or "LOGIN" in text or "PASS" in text or "addauth" in text:
            text = _protocol(text, hits)
    return _ents(text, hits)


def _protocol(text: str, hits: Optional[Dict[str, int]]) -> str:
    def sub(m: "re.Match[str]") -> str:
        val = m.group("val").rstrip()
        if _hidden(val) or val.lower() in _PROSE_KEEP:
            return m.group(0)
        _count(hits, "protocol-login")
        return m.group("name") + m.group("sep") + MASK + m.group("val")[len(val):]
    return _PROTOCOL.sub(sub, text)


def redact_named(name: str, value: str, hits: Optional[Dict[str, int]] = None, rule: str = "secret-local") -> str:
    """A value under a name (a local, an env variable, a loop variable): all of it when the name says secret, else
    read as Python's repr (its literals by the names they sit under, the rest as free text)."""
    inner = _unquote(value.strip())[1]
    if inner.strip() and secret_value(name, inner):
        _count(hits, rule)
        return MASK
    return redact_code.redact(value, redact_text, hits, outer=name, code=False)


def redact_source(line: str, hits: Optional[Dict[str, int]] = None) -> str:
    """One line of source (or a loop's header): its literals by what they are assigned to, keyed by or passed as;
    its comments as free text; its code as code. The line keeps its shape."""
    return redact_code.redact(line, redact_text, hits, code=True)


def redact_path(path: str, hits: Optional[Dict[str, int]] = None) -> str:
    """A file name: each component checked for token shapes and randomness (a directory named after a token), never
    for names (a file called `token_utils.py` is code)."""
    if not path:
        return path
    out = path
    if _ANY_PREFIX.search(out):
        def shape(m: "re.Match[str]") -> str:
            _count(hits, str(m.lastgroup).replace("_", "-"))
            return MASK
        out = _SHAPES.sub(shape, out)
    parts = out.split("/")
    for i, part in enumerate(parts):
        if len(part) >= 16:
            parts[i] = _ents(part, hits)
    return "/".join(parts)


def redact_arg(arg: str, hits: Optional[Dict[str, int]] = None) -> str:
    """One element of a command line on its own: `-pSECRET`, NAME=value, a URL, a token."""
    if redact_code.glued_password(arg):
        _count(hits, "secret-flag")
        return "-p" + MASK
    return redact_text(arg, hits)


_SHORT_PASSWORD = frozenset({"-p", "--passwd"})  # a short flag whose next argument is a password
_USER_FLAGS = frozenset({"-u", "--user", "--proxy-user", "-U"})  # ... whose next argument may be user:password


def redact_argv(argv: Sequence[str], hits: Optional[Dict[str, int]] = None) -> List[str]:
    """A command line with secret flag values, NAME=value secrets, URL passwords and token shapes masked."""
    out: List[str] = []
    pending = ""  # a secret-named flag whose value is the next argument
    for arg in argv:
        if pending:
            flag, pending = pending, ""
            # A following flag means the secret-named one was a switch (--use-auth --lr 0.1): keep it.
            if not arg.startswith("-") or _is_number(arg):
                if flag in _USER_FLAGS:
                    user, colon, _ = arg.partition(":")
                    masked = colon and arg != user + ":" + MASK and not _is_number(arg.rpartition(":")[2])
                    if masked:
                        _count(hits, "secret-flag")
                    out.append(user + ":" + MASK if masked else redact_text(arg, hits))
                    continue
                if flag in _SHORT_PASSWORD and (_is_number(arg) or arg.startswith("/")):
                    out.append(redact_text(arg, hits))  # a port, a directory
                    continue
                hide = secret_value(flag, arg) or flag in _SHORT_PASSWORD
                if hide and arg != MASK:
                    _count(hits, "secret-flag")
                out.append(MASK if hide else redact_text(arg, hits))
                continue
        if redact_code.glued_password(arg):
            _count(hits, "secret-flag")
            out.append("-p" + MASK)  # `-pSECRET`: its value is glued on, the next argument is not it
            continue
        if arg.startswith("-") and len(arg) > 1 and not _is_number(arg):
            name, eq, value = arg.partition("=")
            if name in _SHORT_PASSWORD or name in _USER_FLAGS:
                if not eq:
                    out.append(arg)
                    pending = name
                    continue
            if secret_name(name):
                if not eq:
                    out.append(arg)
                    pending = name
                else:
                    hide = secret_value(name, value)
                    if hide and value != MASK:
                        _count(hits, "secret-flag")
                    out.append(name + "=" + (MASK if hide else redact_text(value, hits)))
                continue
        out.append(redact_arg(arg, hits))
    return out


def redact_env_value(name: str, value: str) -> str:
    return MASK if secret_value(name, value) else redact_text(value)


# -- every message --------------------------------------------------------------------------------------------
# Code, not data: a frame's function and module name are never secrets (`keys`, `get_token`); its file is a path.
_CODE_KEYS = frozenset({"module"})
_PATH_KEYS = frozenset({"filename", "short_filename"})
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
    the message has it: a local's repr under its name, a `[name, value]` pair, a dict key that says secret, source
    lines and loop headers as code, file names as paths."""
    return _walk(msg, "", False)


def _walk(obj: Any, key: str, frame: bool) -> Any:
    if isinstance(obj, str):
        if key in _CODE_KEYS or (frame and key == "name"):
            return obj
        if key in _PATH_KEYS or (key == "path" and obj.startswith("/")):
            return redact_path(obj)
        if key in ("header", "items"):
            return redact_source(obj)
        return _text_memo(obj)
    if isinstance(obj, dict):
        if key == "source" and all(isinstance(v, dict) for v in obj.values()):
            # {file: {line: text}}: the frames' source lines
            return {redact_path(f) if isinstance(f, str) else f: {n: redact_source(t) if isinstance(t, str)
                                                                   else _walk(t, "", False) for n, t in v.items()}
                    for f, v in obj.items()}
        is_frame = "filename" in obj and ("line" in obj or "lineno" in obj)
        local_name = obj.get("name") if "repr" in obj and isinstance(obj.get("name"), str) else None
        out = {}
        for k, v in obj.items():
            sk = k if isinstance(k, str) else str(k)
            if local_name is not None and sk == "repr" and isinstance(v, str):
                out[k] = redact_named(local_name, v)
            elif isinstance(v, (str, int, float)) and not isinstance(v, bool) and strength(sk) \
                    and secret_value(sk, str(v)):
                out[k] = MASK  # {"password": ...} in a record, a JSON body, a Flight Recorder field
            else:
                out[k] = _walk(v, sk, is_frame)
        if key == "loops":  # {"file:line": [...]}: keyed by file names
            out = {redact_path(k) if isinstance(k, str) else k: v for k, v in out.items()}
        return out
    if isinstance(obj, (list, tuple)):
        if key in ("cmdline", "argv") and all(isinstance(a, str) for a in obj):
            return redact_argv(obj)
        if len(obj) == 2 and isinstance(obj[0], str) and isinstance(obj[1], str) and strength(obj[0]):
            return [obj[0], redact_named(obj[0], obj[1], rule="secret-env")]  # an env pair
        return [_walk(v, key, False) for v in obj]
    return obj


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True
