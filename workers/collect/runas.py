"""Running tools through `sudo -n` when asked (never a password prompt), and recognising sudo's refusals."""

from __future__ import annotations

import json
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Dict, List, Optional

from workers.collect.guard import CollectError
from workers.procinfo import parse_environ
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


# Run under sudo by the node's own python: reads the environments this user may not, prints them as JSON.
# They stay on the node: discovery keeps only allowlisted names.
_READ_ENVIRONS = ("import base64, json, sys\n"
                  "out = {}\n"
                  "for p in sys.argv[1:]:\n"
                  "    try:\n"
                  "        with open('/proc/%s/environ' % int(p), 'rb') as f:\n"
                  "            out[p] = base64.b64encode(f.read(4 << 20)).decode()\n"
                  "    except (OSError, ValueError):\n"
                  "        pass\n"
                  "sys.stdout.write(json.dumps(out))\n")


def read_environs(req: Request, pids: List[int], notes: List[str]) -> Dict[int, Dict[str, str]]:
    """Environments of other users' processes read through `sudo -n`; problems become notes."""
    try:
        argv = prefix(req, True) + [sys.executable or "python3", "-I", "-S", "-c", _READ_ENVIRONS]
    except CollectError as exc:
        notes.append(exc.message)
        return {}
    res = req.run(argv + [str(p) for p in pids], 10.0, max_stdout=64 << 20)
    err = res.stderr.decode("utf-8", "replace")
    if res.returncode != 0 or res.timed_out:
        notes.append("reading other users' processes with sudo failed: %s"
                     % (sudo_error(err) or err.strip()[:200] or "timed out"))
        return {}
    try:
        raw = json.loads(res.stdout.decode("utf-8", "replace"))
        import base64

        return {int(p): parse_environ(base64.b64decode(v)) for p, v in raw.items()}
    except (ValueError, TypeError, AttributeError):
        notes.append("reading other users' processes with sudo gave unreadable output")
        return {}
