"""Running tools through `sudo -n` when asked (never a password prompt), and recognising sudo's refusals."""

from __future__ import annotations

from typing import List, Optional

from workers.collect.guard import CollectError
from workers.request import Request

_PASSWORD_MARKERS = ("a password is required", "a terminal is required", "no tty present",
                     "no askpass program")


def prefix(req: Request, sudo: bool) -> List[str]:
    """[] or the sudo prefix; CollectError(tool_missing) when sudo was asked for and is not there."""
    if not sudo:
        return []
    tool, searched = req.worker.tools.find("sudo")
    if tool is None:
        raise CollectError("tool_missing", "--sudo was given but sudo is not on this node; searched: %s"
                           % ", ".join(searched))
    return [tool.path, "-n", "--"]


def sudo_error(stderr: str) -> Optional[str]:
    """The message when sudo refused to run without a password, else None."""
    for line in stderr.splitlines():
        low = line.lower()
        if low.startswith("sudo:") and any(m in low for m in _PASSWORD_MARKERS):
            return line.strip()
    return None
