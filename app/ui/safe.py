"""Remote text made safe to show in Textual: cleaned by app.printable (control characters replaced by visible
pictures, length capped), as rich Text.

Everything a node sends (process names, frames, locals, env, cmdline, strace/gdb output) goes through here
before it reaches a widget. rich.text.Text never interprets markup, so `[bold]` stays literal; the
replacements below stop a name like "\\x1b]0;x\\x07" from retitling the terminal or moving the cursor.
"""

from __future__ import annotations

from typing import Optional

from rich.style import Style
from rich.text import Text

from app.printable import NAME_LIMIT, clean

__all__ = ["NAME_LIMIT", "VALUE_LIMIT", "LINE_LIMIT", "clean", "literal", "lines", "counted"]

VALUE_LIMIT = 400  # a local's repr, an env value
LINE_LIMIT = 2000  # one line of source, strace or gdb output


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
