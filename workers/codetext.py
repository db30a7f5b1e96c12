"""Python-shaped text (a source line, a local's repr) as tokens, and for each literal the names it belongs to.

Two redactors read code through this module: the node's pattern net (workers/redact.py: a literal assigned to,
keyed by or passed as something secret is masked in place) and the bundle's default-deny rule
(app/report/share.py). Both change only the inside of literals and comments, so a line keeps its shape:
`key = batch['input_ids']` stays that, `os.environ["WANDB_API_KEY"] = "***"` keeps its target.

A literal's *owners*, innermost first: the keyword it is passed as (`login(password="x")`), the dict key it is the
value of, the subscript it is assigned through (`cfg["password"] = "x"`), the flag before it in a sequence
(`["psql", "--password", "x"]`), the function it is passed to (`smtp.login(user, "x")`), the target of the
statement (`creds = ("admin", "x")`). A literal that is itself a subscript key on the right-hand side
(`os.environ["HF_TOKEN"]`) is a name being read, not a value: it has no owners. Tokenizing is regular and
line-local (an unterminated string runs to the end of the line: one line of a multi-line literal).
"""

from __future__ import annotations

import re

from workers.lazyre import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import List, Optional, Tuple

_STRING = (r"[bBrRuUfF]{0,2}(?:'''(?:[^\\]|\\.)*?(?:'''|$)|\"\"\"(?:[^\\]|\\.)*?(?:\"\"\"|$)"
           r"|'(?:[^'\\\n]|\\.)*(?:'|$)|\"(?:[^\"\\\n]|\\.)*(?:\"|$))")
_TOKEN = lazy(
    r"(?P<str>" + _STRING + r")"
    r"|(?P<comment>#[^\n]*)"
    r"|(?P<num>(?:0[xXoObB][0-9a-fA-F_]+|\d[\d_]*(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)[jJlL]?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\*\*=?|//=?|->|:=|[-+*/%&|^<>!=]=|<<=?|>>=?|\.\.\.|\S)"
    r"|(?P<ws>\s+)", re.S)

OPEN, CLOSE = "([{", ")]}"
_NAMEISH = lazy(r"-{0,2}[A-Za-z_][\w.-]{0,80}")


class Token:
    __slots__ = ("kind", "text", "start", "end")

    def __init__(self, kind: str, text: str, start: int, end: int) -> None:
        self.kind, self.text, self.start, self.end = kind, text, start, end

    def __repr__(self) -> str:
        return "Token(%s, %r)" % (self.kind, self.text)


def tokens(text: str) -> List[Token]:
    """Every token but white space, with its span in the text."""
    out = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "op"
        if kind != "ws":
            out.append(Token(kind, m.group(0), m.start(), m.end()))
    return out


def split_literal(text: str) -> Tuple[str, str, str]:
    """A string literal as (prefix and opening quote, content, closing quote): `b'x'` -> ("b'", "x", "'")."""
    i = 0
    while i < len(text) and text[i] in "bBrRuUfF":
        i += 1
    q = text[i:i + 3] if text[i:i + 3] in ("'''", '"""') else text[i:i + 1]
    body = text[i + len(q):]
    close = q if body.endswith(q) and len(body) >= len(q) else ""
    return text[:i + len(q)], body[:len(body) - len(close)] if close else body, close


def literal_text(tok: Token) -> str:
    return split_literal(tok.text)[1] if tok.kind == "str" else tok.text


def _name_before(toks: List[Token], i: int) -> str:
    """The dotted name ending at toks[i] (`os.environ`, `settings.psk`), or ""."""
    parts: List[str] = []
    while i >= 0 and toks[i].kind == "name":
        parts.append(toks[i].text)
        if i >= 1 and toks[i - 1].text == ".":
            i -= 2
        else:
            break
    return ".".join(reversed(parts))


def _opener(toks: List[Token], i: int) -> int:
    """The index of the bracket that encloses toks[i] (-1: none on this line)."""
    depth = 0
    j = i - 1
    while j >= 0:
        t = toks[j].text
        if toks[j].kind == "op":
            if t in CLOSE:
                depth += 1
            elif t in OPEN:
                if depth == 0:
                    return j
                depth -= 1
        j -= 1
    return -1


def _matching_open(toks: List[Token], close: int) -> int:
    depth = 0
    for j in range(close, -1, -1):
        if toks[j].kind != "op":
            continue
        if toks[j].text in CLOSE:
            depth += 1
        elif toks[j].text in OPEN:
            depth -= 1
            if depth == 0:
                return j
    return -1


def _element_start(toks: List[Token], i: int, lo: int) -> int:
    """The first token of the element (between commas, at one depth) that holds toks[i], above index lo."""
    depth = 0
    j = i - 1
    while j > lo:
        t = toks[j]
        if t.kind == "op":
            if t.text in CLOSE:
                depth += 1
            elif t.text in OPEN:
                depth -= 1
            elif depth == 0 and t.text in (",", ";"):
                break
        j -= 1
    return j + 1


def _target(toks: List[Token], eq: int) -> str:
    """What the `=` at toks[eq] assigns to: a name, the last name of an attribute, the key of a subscript."""
    j = eq - 1
    if j >= 0 and toks[j].kind == "op" and toks[j].text == "]":
        k = _matching_open(toks, j)
        inner = toks[k + 1:j]
        if len(inner) == 1 and inner[0].kind in ("str", "name"):
            return literal_text(inner[0])
        return _name_before(toks, k - 1)
    if j >= 0 and toks[j].kind == "name":
        return _name_before(toks, j)
    return ""


def owners(toks: List[Token], i: int) -> Optional[List[str]]:
    """The names toks[i] (a literal) is the value of, innermost first; None for a subscript key being read."""
    out: List[str] = []
    pos = i
    if i + 1 < len(toks) and toks[i + 1].text == ":":
        o = _opener(toks, i)
        if o >= 0 and toks[o].text == "{":
            return None  # a dict's key: a name
    while True:
        open_ = _opener(toks, pos)
        start = _element_start(toks, pos, open_)
        annotated = ""
        # within the element: `name=`, `"key":`, `target =` right before the expression holding the literal
        for j in range(start, pos):
            t = toks[j]
            if t.kind != "op" or j == start:
                continue
            prev = toks[j - 1]
            if t.text == ":" and prev.kind == "str":
                out.append(literal_text(prev))  # "key": value
                break
            if t.text == ":" and prev.kind == "name":
                if open_ >= 0 and toks[open_].text == "{":
                    out.append(prev.text)  # {key: value}
                    break
                annotated = _name_before(toks, j - 1)  # `name: Type = value`
                continue
            if t.text in ("=", "+=", ":="):
                name = annotated or _target(toks, j)
                if name:
                    out.append(name)
                break
        if open_ < 0:
            return out
        bracket = toks[open_]
        before = toks[open_ - 1] if open_ >= 1 else None
        called = before is not None and (before.kind == "name" or before.text in (")", "]"))
        if bracket.text == "[" and called:
            if pos == i:
                return None  # a subscript key (`os.environ["HF_TOKEN"]`, `cfg["password"] = ...`): a name
            return out
        elif bracket.text == "(" and called and before is not None:
            callee = _name_before(toks, open_ - 1)
            if callee:
                out.append(callee + "()")
        elif bracket.text in "([":
            # a sequence: the element before this one, when it is a name or a flag (`("password", value)`,
            # `"--password", value`)
            prev_comma = start - 1
            if prev_comma > open_ and toks[prev_comma].text == ",":
                k = prev_comma - 1
                if toks[k].kind == "str" and _NAMEISH.fullmatch(literal_text(toks[k])):
                    out.append(literal_text(toks[k]))
        pos = open_
