"""Processes of one GPU test, found by the mark in their environment, and the per-rank log files they write.

torchrun starts every rank in a new session, so killing torchrun's process group does not reach them; the
mark (HANGSCOPE_GPUTEST=<token>, inherited by everything the test starts) does, even for a rank that was
re-parented after its launcher died. Only processes whose environment we can read (our own user's) count.
"""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Dict, List, Optional, Tuple

MARK_ENV = "HANGSCOPE_GPUTEST"
MAX_LINE = 8192  # characters kept of one output line
_LOG = re.compile(r"attempt_(\d+)/(\d+)/(stdout|stderr)\.log$")


def marked_pids(token: str) -> List[int]:
    """Pids of live processes whose environment carries MARK_ENV=token."""
    needle = ("%s=%s" % (MARK_ENV, token)).encode()
    found = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(name))
    return found


def signal_marked(token: str, sig: int, skip: Tuple[int, ...] = ()) -> List[int]:
    """Send sig to every marked process except `skip`; returns the pids signalled."""
    sent = []
    for pid in marked_pids(token):
        if pid in skip:
            continue
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except OSError:
            pass
    return sent


def kill_marked(token: str, wait: float = 3.0) -> Tuple[List[int], List[int]]:
    """SIGKILL every marked process and wait until they are gone: (killed pids, pids still present)."""
    killed = signal_marked(token, signal.SIGKILL)
    deadline = time.monotonic() + wait
    left = killed
    while left and time.monotonic() < deadline:
        left = [p for p in left if _alive(p)]
        if left:
            time.sleep(0.02)  # a poll interval under a deadline: the kernel reaps asynchronously
    return killed, left


def _alive(pid: int) -> bool:
    """Present and not a zombie (a zombie holds nothing but its exit status)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class LogTails:
    """Follows torchrun's per-rank files (<log_dir>/<run>/attempt_N/<local_rank>/std{out,err}.log).

    torchrun writes each rank's output to its own files (`--redirects 3`); reading them here, rather than
    through torchrun's console tee, loses nothing when torchrun itself is killed at a deadline.
    """

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self._files: Dict[str, Tuple[int, str]] = {}  # path -> (local rank, stream)
        self._offsets: Dict[str, int] = {}
        self._partial: Dict[str, bytes] = {}

    def _discover(self) -> None:
        for root, _dirs, files in os.walk(self.log_dir):
            for name in files:
                path = os.path.join(root, name)
                if path in self._files:
                    continue
                m = _LOG.search(path.replace(os.sep, "/"))
                if m:
                    self._files[path] = (int(m.group(2)), "out" if m.group(3) == "stdout" else "err")

    def poll(self, final: bool = False) -> List[Tuple[str, Optional[int], str]]:
        """New complete lines as (stream, local rank, text); final=True also flushes unterminated ones."""
        self._discover()
        out: List[Tuple[str, Optional[int], str]] = []
        for path, (local_rank, stream) in sorted(self._files.items()):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read(4 << 20)
            except OSError:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + len(data)
            buf = self._partial.get(path, b"") + data
            lines = buf.split(b"\n")
            rest = lines.pop()
            if final and rest:
                lines.append(rest)
                rest = b""
            self._partial[path] = rest[-(4 * MAX_LINE):]
            for raw in lines:
                out.append((stream, local_rank, clean(raw)))
        return out


def clean(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").rstrip("\r")[:MAX_LINE]
