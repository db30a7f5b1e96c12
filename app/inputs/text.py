"""Text arguments (paths, names, patterns, commands): never empty or blank (an empty string is not "not given"),
never a control character (a name that breaks a one-line message or a terminal), bounded in length.

`text_arg(flag)` is the argparse `type=` of every such flag; it raises TextError (an InputError), which argparse
passes on unchanged, so the message is one line naming the flag.
"""

from __future__ import annotations

import re
import shlex
from typing import Callable

from app.errors import InputError

MAX_TEXT = 4096  # PATH_MAX: no path or name on a command line is longer
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class TextError(InputError):
    """A text argument that is empty, blank, too long or holds a control character."""


def check_text(value: str, flag: str, *, max_len: int = MAX_TEXT) -> str:
    """`value` unchanged when it is usable text for `flag`; TextError otherwise."""
    if not value.strip():
        raise TextError(f"{flag} is empty" if not value else f"{flag} is blank ({value!r})")
    if len(value) > max_len:
        raise TextError(f"{flag} is {len(value)} characters long; the limit is {max_len}")
    bad = _CONTROL.search(value)
    if bad:
        raise TextError(f"{flag} {_clip(value)!r} holds the control character U+{ord(bad.group()):04X}")
    return value


def text_arg(flag: str, *, max_len: int = MAX_TEXT) -> Callable[[str], str]:
    """An argparse `type=` for a text flag (its name as the user writes it: `--snapshot`, `HOSTS`)."""
    def parse(value: str) -> str:
        return check_text(value, flag, max_len=max_len)
    parse.__name__ = "text"
    return parse


def python_command(value: str) -> str:
    """`--python`: an interpreter and its flags (`python3 -I -S`), split like a shell would split it, never run
    through one. Its first word is a program, never an option."""
    check_text(value, "--python")
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise TextError(f"--python {_clip(value)!r}: {exc}") from None
    if not words:
        raise TextError(f"--python {value!r} names no interpreter")
    if words[0].startswith("-"):
        raise TextError(f"--python {_clip(value)!r} starts with an option; it must start with the interpreter, "
                        "e.g. 'python3 -S' or /opt/py/bin/python3")
    return value


def _clip(text: str) -> str:
    return text if len(text) <= 80 else text[:80] + "..."
