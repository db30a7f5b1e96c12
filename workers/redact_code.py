"""The pattern net over Python-shaped text: source lines, loop headers and locals' reprs (workers/codetext.py).

Only the inside of a literal or a comment is ever replaced, so `key = batch['input_ids']` stays exactly that and
`os.environ["WANDB_API_KEY"] = "hf_..."` becomes `os.environ["WANDB_API_KEY"] = "***"`. A literal is hidden when
one of the names it belongs to says secret (workers/secretnames.py): a strong name always, a weak one unless the
literal is safe by the default-deny rule; a flag before it in a sequence (`"--password", "x"`, `"-p", "x"`,
`"-u", "user:pw"`); a call that authenticates (`smtp.login(user, "x")`, `hmac.new(b"k", ...)`). Any other
literal, and every comment, is free text for the text rules; the code between them gets the rules that cannot
mistake code for a value (token shapes, URL credentials, entropy, a password word in prose).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Callable, Dict, List, Optional

    TextRule = Callable[..., str]  # workers.redact.redact_text(text, hits, code=...)

from workers.codetext import split_literal, tokens
from workers.codetext import owners as literal_owners
from workers.lazyre import lazy
from workers.secretnames import MASK, secret_name, secret_value, strength

# Calls whose arguments are credentials, by a word of the callee's name (besides names that say secret).
_AUTH_CALLS = frozenset({"login", "logon", "signin", "authenticate", "authorize", "auth", "hmac", "basicauth"})
_SPLIT = lazy(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_USER_FLAGS = frozenset({"-u", "--user", "--proxy-user", "-U"})


def _auth_call(callee: str) -> bool:
    words = [w.lower() for w in _SPLIT.split(callee) if w]
    return strength(callee) == 2 or any(w in _AUTH_CALLS for w in words)


def _number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _hidden_by(owner: str, content: str, kind: str) -> str:
    """"" (keep), "all" (hide the literal) or "pair" (hide what follows user: in it)."""
    if owner.endswith("()"):
        return "all" if kind == "str" and _auth_call(owner[:-2]) else ""
    if owner.startswith("-"):
        if not owner.startswith("--") and len(owner) > 2:
            return ""  # `-pSECRET`, `-vvv`: a flag with its value glued on owns nothing after it
        if owner in _USER_FLAGS:
            return "pair" if ":" in content and not _number(content.rpartition(":")[2]) else ""
        if owner == "-p":
            return "" if _number(content) or content.startswith("/") else "all"
    if kind == "num":
        return "all" if strength(owner) == 2 else ""
    return "all" if secret_name(owner) and secret_value(owner, content) else ""


def redact(text: str, text_rule: TextRule, hits: Optional[Dict[str, int]] = None, outer: Optional[str] = None,
           code: bool = True) -> str:
    """text with its literals and comments redacted in place. outer: the name the whole text is the value of (a
    local's name for its repr). code=False (a repr): the text between literals gets the full text rules, since a
    repr may print `password=x` without quotes."""
    if not text:
        return text
    toks = tokens(text)
    if not any(t.kind in ("str", "num", "comment") for t in toks):
        return text_rule(text, hits, code=code)
    out: List[str] = []
    done = 0
    for i, t in enumerate(toks):
        if t.kind == "comment":
            new = "#" + text_rule(t.text[1:], hits)
        elif t.kind in ("str", "num"):
            new = _literal(toks, i, text_rule, hits, outer)
        else:
            continue
        if t.start > done:
            out.append(text_rule(text[done:t.start], hits, code=code))
        out.append(new)
        done = t.end
    if done < len(text):
        out.append(text_rule(text[done:], hits, code=code))
    return "".join(out)


def _literal(toks: list, i: int, text_rule: TextRule, hits: Optional[Dict[str, int]], outer: Optional[str]) -> str:
    t = toks[i]
    if t.kind == "num":
        prefix, content, close = "", t.text, ""
    else:
        prefix, content, close = split_literal(t.text)
    if not content or content == MASK:
        return t.text
    names = literal_owners(toks, i)
    if names is not None and outer:
        names.append(outer)
    for owner in names or ():
        how = _hidden_by(owner, content, t.kind)
        if how:
            _count(hits, "secret-literal")
            if how == "pair":
                return prefix + content.partition(":")[0] + ":" + MASK + close
            return prefix + MASK + close
    if t.kind == "num":
        return t.text
    if glued_password(content):  # one element of a command list: `"-pSECRET"`
        _count(hits, "secret-flag")
        return prefix + "-p" + MASK + close
    return prefix + text_rule(content, hits) + close


# -pthread, -pipe, -pedantic, -pie, -pg (compilers), -print, -python: not a password glued to -p
GLUED_P_FLAGS = frozenset({"thread", "ipe", "edantic", "ie", "g", "rint", "ython"})


def glued_password(arg: str) -> bool:
    """`-pSECRET`: mysql's password glued to its flag (three characters or more: `-pv` is two switches)."""
    rest = arg[2:]
    return (arg.startswith("-p") and len(rest) >= 3 and rest[0] not in "=-" and rest != MASK
            and rest.split("=")[0] not in GLUED_P_FLAGS and not _number(rest))


def _count(hits: Optional[Dict[str, int]], rule: str) -> None:
    if hits is not None:
        hits[rule] = hits.get(rule, 0) + 1
