"""Remote text made printable: the control characters that must never reach a terminal or a reader, in one place.

Everything a node sends is hostile text. The UI (app/ui/safe.py, which adds what is Textual-specific), the
analysis (finding texts) and the reports (app/report/markup.py, which also strips escape sequences for
Markdown and HTML) all clean it with the character classes and `clean()` defined here.
"""

from __future__ import annotations

import re
from typing import Optional

NAME_LIMIT = 160  # a frame, function or process name in a list, a cell or a sentence

C0 = "\x00-\x08\x0a-\x1f"  # C0 controls except tab (LF included: one line)
C1 = "\x7f-\x9f"  # DEL and the C1 controls (0x9b is a one-byte CSI)
BIDI = "\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff"  # marks, overrides, isolates, BOM: no reordering ("Trojan Source")
LINE_SEPARATORS = "\u2028\u2029"

# C0 controls, DEL and C1 controls become their visible "control picture" (U+2400 + code) or U+FFFD;
# bidi overrides/isolates are replaced too so remote text cannot reorder what the user reads.
CONTROL = re.compile(f"[{C0}{C1}{BIDI}]")


def picture(match: "re.Match[str]") -> str:
    """The visible stand-in for one control character: ␛ for ESC, ␇ for BEL, ␊ for LF, ␡ for DEL, else U+FFFD."""
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)
    if code == 0x7F:
        return "\u2421"
    return "\ufffd"


def clean(text: object, limit: Optional[int] = NAME_LIMIT) -> str:
    """One line of remote text as a plain, printable string of at most `limit` characters (… when cut)."""
    s = text if isinstance(text, str) else str(text)
    if limit is not None and len(s) > limit:
        # Cut before replacing so a 10 MB value costs no more than `limit` characters of work.
        s = s[: max(limit - 1, 0)] + "\u2026"
    s = s.replace("\t", "    ")
    return CONTROL.sub(picture, s)


def clock(ts: float, fmt: str = "%H:%M:%S", *, utc: bool = False) -> str:
    """A time stamp (seconds since 1970) as text, or "?" when the platform cannot show it: a snapshot file may
    hold a time far outside the calendar (9e14 is the year 28 million), which must not end a screen or a report
    in a traceback."""
    import time

    try:
        return time.strftime(fmt, time.gmtime(ts) if utc else time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return "?"
