"""Remote text made inert for the report formats: control sequences stripped, Markdown and HTML escaped.

Everything a node sent (process names, frames, locals, env, cmdline, tool output) and every sentence the
analysis built from it passes through here before it is put into summary.md or report.html. Nothing here
builds markup from remote text without escaping it first.
"""

from __future__ import annotations

import html
import re
from typing import Iterator, Optional, Tuple

from app.printable import BIDI, C1, LINE_SEPARATORS

NAME = 200  # a frame, function, file or process name
VALUE = 400  # a local's repr, an env value, one cmdline argument
LINE = 2000  # one line of tool output or source

# Terminal escape sequences (CSI, OSC, other ESC sequences), then single C0/C1 controls, DEL, and the bidi
# controls that can reorder what a reader sees ("Trojan Source").
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?"
                      r"|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(f"[\x00-\x08\x0b-\x1f{C1}{BIDI}{LINE_SEPARATORS}]")  # app.printable's classes; LF kept
# Characters Markdown (CommonMark and GitHub's) interprets anywhere in a line; "-", "+", "=" and "1." only
# at the start of a block, handled by _MD_LEADING.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#!|~&])")
_MD_LEADING = re.compile(r"^(\s*)([-+=]|\d+(?=[.)]))")
_BACKTICKS = re.compile(r"`+")


def strip(text: object, limit: Optional[int] = NAME, *, multiline: bool = False) -> str:
    """Remote text without control sequences, tabs as spaces, at most `limit` characters (… when cut)."""
    s = text if isinstance(text, str) else str(text)
    if limit is not None and len(s) > limit:
        s = s[: max(limit - 1, 0)] + "\u2026"  # cut first so a 10 MB value costs `limit` characters of work
    s = _ESCAPES.sub("", s.replace("\r\n", "\n")).replace("\t", "    ")
    if not multiline:
        s = s.replace("\n", " ")
    return _CONTROLS.sub("", s)


# -- Markdown ------------------------------------------------------------------------------------------


def md(text: object, limit: Optional[int] = NAME) -> str:
    """Inline Markdown text: every character Markdown (or HTML inside Markdown) could interpret is escaped."""
    return _MD_LEADING.sub(_escape_leading, _MD_SPECIAL.sub(r"\\\1", strip(text, limit)))


def _escape_leading(m: "re.Match[str]") -> str:
    """`- x` -> `\\- x` (not a list item); `1. x` -> `1\\. x` (not an ordered list)."""
    mark = m.group(2)
    return m.group(1) + (mark + "\\" if mark[0].isdigit() else "\\" + mark)


def md_code(text: object, limit: Optional[int] = NAME) -> str:
    """An inline code span that no backtick in the text can close early."""
    s = strip(text, limit)
    if not s:
        return ""
    fence = "`" * (max((len(m) for m in _BACKTICKS.findall(s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ")) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_code_cell(text: object, limit: Optional[int] = NAME) -> str:
    """An inline code span inside a table cell. GitHub's tables split a row at every `|` not escaped, code spans
    included, and take `\\|` back to `|` before the span is read: so here, and only here, `|` is escaped."""
    return md_code(text, limit).replace("|", "\\|")


def md_block(text: str, lang: str = "", limit: Optional[int] = None) -> str:
    """A fenced code block that no line of the text can close: the fence is longer than any backtick run."""
    body = "\n".join(strip(line, LINE) for line in strip(text, limit, multiline=True).split("\n"))
    fence = "`" * max(3, max((len(m) for m in _BACKTICKS.findall(body)), default=0) + 1)
    return f"{fence}{lang}\n{body}\n{fence}"


def md_sentence(text: object, limit: Optional[int] = 2000) -> str:
    """An analysis sentence whose `backticked` parts are code: plain parts escaped, code parts as code spans."""
    return "".join(md_code(part, None) if code else md(part, None) for code, part in _segments(text, limit))


def md_cell(text: object, limit: Optional[int] = NAME) -> str:
    """Inline text for a Markdown table cell (md() already escapes `|`)."""
    return md(text, limit) or " "


# -- HTML ----------------------------------------------------------------------------------------------


def h(text: object, limit: Optional[int] = NAME, *, multiline: bool = False) -> str:
    """Remote text as HTML text or attribute value: stripped, then escaped (quotes included)."""
    return html.escape(strip(text, limit, multiline=multiline), quote=True)


def h_sentence(text: object, limit: Optional[int] = 2000) -> str:
    """An analysis sentence with its `backticked` parts as <code>, everything escaped."""
    return "".join(f"<code>{h(part, None)}</code>" if code else h(part, None) for code, part in _segments(text, limit))


def _segments(text: object, limit: Optional[int]) -> Iterator[Tuple[bool, str]]:
    """Alternate plain and code parts of a sentence. A stray backtick from remote text only shifts which
    parts render as code: every part is escaped either way."""
    s = strip(text, limit)
    parts = s.split("`")
    if len(parts) % 2 == 0:  # unbalanced: the last backtick is literal text
        parts[-2:] = [parts[-2] + "`" + parts[-1]]
    for i, part in enumerate(parts):
        if part:
            yield i % 2 == 1, part
