"""Redaction of secrets before anything leaves the node: command lines, environment values, free text.

Values are replaced by `***`, names are kept, so a reader still sees *that* a token was passed. The rules
err on the side of hiding: a false positive costs a little context, a false negative leaks a credential.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import List, Sequence

MASK = "***"

# Flag / variable names are split into words (dashes, underscores, dots, camelCase); a word that is one of
# these, or ends with one of the compound suffixes, marks the value as secret. Whole words keep harmless
# names apart: --keyframes, --max-tokens (a count), --tokenizer (a path), --author.
_SECRET_WORDS = {"apikey", "token", "secret", "password", "passwd", "pwd", "passphrase", "credential",
                 "credentials", "authorization", "cookie", "privatekey"}
# Ambiguous words: `--num-key-value-heads 8` is a model size, not a key. Under these names a plain number or
# boolean is kept; anything else is masked.
_WEAK_WORDS = {"key", "auth", "pat", "sas"}
_SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "apikey", "credential", "credentials", "auth")
_SECRET_PREFIXES = ("secret", "password", "passwd", "credential", "apikey", "authtoken")

_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

# Values shaped like well-known credentials, found anywhere inside a string.
_TOKEN_PATTERNS = [
    re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),  # GitHub fine-grained
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub classic, OAuth, app tokens
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),  # JWT
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),  # Slack
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"),  # OpenAI / Anthropic style API keys
    re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"),  # GitLab
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),  # Google API keys
]
# scheme://user:password@host -> scheme://user:***@host (also an empty user: redis://:pw@host)
_URL_CREDENTIALS = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)([^\s/@]+)(@)")
# NAME=value pairs inside longer text (a shell command in `bash -c "..."`, a python -c program)
_INLINE_ASSIGN = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_.-]*)(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&|)]+)")


_STRENGTH: dict = {}  # name -> _strength; the same few local and variable names come back on every frame


def _strength(name: str) -> int:
    """2: the name says secret; 1: it may (weak word); 0: harmless."""
    known = _STRENGTH.get(name)
    if known is None:
        if len(_STRENGTH) > 4096:
            _STRENGTH.clear()
        known = _STRENGTH[name] = _word_strength(name)
    return known  # type: ignore[no-any-return]


def _word_strength(name: str) -> int:
    found = 0
    for word in _WORD_SPLIT.split(name.lstrip("-")):
        w = word.lower()
        if w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) or w.startswith(_SECRET_PREFIXES):
            return 2
        if w in _WEAK_WORDS:
            found = 1
    return found


def secret_name(name: str) -> bool:
    """Whether a flag or variable name says its value may be a secret (HF_TOKEN, --api-key, --hf_token)."""
    return _strength(name) > 0


def secret_value(name: str, value: str) -> bool:
    """Whether `value`, given under `name`, must be masked."""
    strength = _strength(name)
    if strength == 1:
        return not (_is_number(value) or value.lower() in ("true", "false", "yes", "no", "none", ""))
    return strength == 2


# Each local of each frame goes through here: one scan for any shape's prefix, and the patterns one by one
# (as before: a shape can start inside another's run) only on text that has one.
_ANY_PREFIX = re.compile(r"PRIVATE KEY-----|hf_|github_pat_|gh[pousr]_|AKIA|ASIA|eyJ|xox[abposr]-|sk-|glpat-|AIza")
_URL_HINT = "://"


def redact_text(text: str) -> str:
    """Mask credential-shaped values and URL passwords anywhere in free text (tool output, locals)."""
    if _ANY_PREFIX.search(text):
        for pattern in _TOKEN_PATTERNS:
            text = pattern.sub(MASK, text)
    if _URL_HINT not in text:
        return text
    return _URL_CREDENTIALS.sub(lambda m: m.group(1) + MASK + m.group(3), text)


def _redact_assignments(text: str) -> str:
    def repl(m: "re.Match[str]") -> str:
        value = m.group(3).strip("\"'")
        return m.group(1) + m.group(2) + MASK if secret_value(m.group(1), value) else m.group(0)

    return _INLINE_ASSIGN.sub(repl, text)


def redact_argv(argv: Sequence[str]) -> List[str]:
    """A command line with secret flag values, NAME=value secrets, URL passwords and token shapes masked."""
    out: List[str] = []
    pending = ""  # a secret-named flag whose value is the next argument
    for arg in argv:
        if pending:
            flag, pending = pending, ""
            # A following flag means the secret-named one was a switch (--use-auth --lr 0.1): keep it.
            if not arg.startswith("-") or _is_number(arg):
                out.append(MASK if secret_value(flag, arg) else arg)
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
        out.append(redact_text(_redact_assignments(arg)))
    return out


def redact_env_value(name: str, value: str) -> str:
    return MASK if secret_value(name, value) else redact_text(value)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True
