"""Remote text made safe to show in Textual: cleaned by app.printable (control characters replaced by visible
pictures, length capped), as rich Text.

Everything a node sends (process names, frames, locals, env, cmdline, strace/gdb output) goes through here
before it reaches a widget. rich.text.Text never interprets markup, so `[bold]` stays literal; the
replacements below stop a name like "\\x1b]0;x\\x07" from retitling the terminal or moving the cursor.
"""

from __future__ import annotations

import secrets
from typing import Optional

from rich.style import Style
from rich.text import Text

from app.printable import NAME_LIMIT, clean
from workers.cleartext import keyed_token, share_name
from workers.tooltext import gdb_thread_names

__all__ = ["NAME_LIMIT", "VALUE_LIMIT", "LINE_LIMIT", "clean", "literal", "lines", "counted", "run_name",
           "gdb_lines"]

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


# Names a job chooses while it runs (a thread's name, its OS name in /proc and in gdb's thread headers, a helper
# process's comm) are free text the job's code may fill with anything. On the screen they follow the default-deny
# rule of what is shared (workers/cleartext.py share_name): a name in a name's shape (`MainThread`, `pt_autograd_0`,
# `Thread-3 (_worker)`, `python3`) is shown, any other name as its length and a hash keyed per TUI session, so
# equal names still look equal across ranks and tabs, and a name nobody can read is not put on a screen that
# may be shared as a screenshot.
_SESSION_KEY = secrets.token_bytes(16)


def _hide(kind: str, text: str) -> str:
    return keyed_token(_SESSION_KEY, kind, text)


def run_name(text: str) -> str:
    """A name the job chose at run time, as the screen shows it (see above)."""
    return share_name(text, _hide) if text else text


def gdb_lines(text: str) -> Text:
    """gdb's output as lines() shows it, the thread names in its thread headers shown by run_name."""
    return lines(gdb_thread_names(text, run_name))


def counted(n: int, word: str, plural: str = "") -> str:
    """`1 node`, `2 nodes`, `0 ranks`: the noun agrees with the number."""
    return f"{n} {word if n == 1 else (plural or word + 's')}"
