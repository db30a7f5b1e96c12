"""Remote text made safe to show: control characters and escape sequences replaced, length capped, as Text.

Everything a node sends (process names, frames, locals, env, cmdline, strace/gdb output) goes through here
before it reaches a widget. rich.text.Text never interprets markup, so `[bold]` stays literal; the
replacements below stop a name like "\\x1b]0;x\\x07" from retitling the terminal or moving the cursor.
"""

from __future__ import annotations

import re
from typing import Optional

from rich.style import Style
from rich.text import Text

NAME_LIMIT = 160  # a frame, function or process name in a list or a cell status line
VALUE_LIMIT = 400  # a local's repr, an env value
LINE_LIMIT = 2000  # one line of source, strace or gdb output

# C0 controls, DEL and C1 controls become their visible "control picture" (U+2400 + code) or U+FFFD;
# bidi overrides/isolates are replaced too so remote text cannot reorder what the user reads.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _picture(match: "re.Match[str]") -> str:
    ch = match.group()
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)  # ␛ for ESC, ␇ for BEL, ␊ for LF
    if code == 0x7F:
        return "\u2421"  # ␡
    return "\ufffd"


def clean(text: object, limit: Optional[int] = NAME_LIMIT) -> str:
    """One line of remote text as a plain, printable string of at most `limit` characters."""
    s = text if isinstance(text, str) else str(text)
    if limit is not None and len(s) > limit:
        # Cut before replacing so a 10 MB value costs no more than `limit` characters of work.
        s = s[: max(limit - 1, 0)] + "\u2026"
    s = s.replace("\t", "    ")
    return _CONTROL.sub(_picture, s)


def literal(text: object, limit: Optional[int] = NAME_LIMIT, style: str | Style = "") -> Text:
    """Remote text as a Text that is shown exactly as written (never parsed as markup), on one line."""
    return Text(clean(text, limit), style=style, no_wrap=True, overflow="ellipsis", end="")


def lines(text: str, *, max_lines: int = 5000, limit: int = LINE_LIMIT) -> Text:
    """Multi-line remote output (strace, gdb) as one Text, each line cleaned and capped."""
    out = Text(no_wrap=True, overflow="ellipsis", end="")
    raw = text.splitlines()
    for i, line in enumerate(raw[:max_lines]):
        if i:
            out.append("\n")
        out.append(clean(line, limit))
    if len(raw) > max_lines:
        out.append(f"\n\u2026 {len(raw) - max_lines} more lines not shown", style="dim")
    return out


def counted(n: int, word: str, plural: str = "") -> str:
    """`1 node`, `2 nodes`, `0 ranks`: the noun agrees with the number."""
    return f"{n} {word if n == 1 else (plural or word + 's')}"
