"""Test helper (engineer B's worker tests): start stand-in rank processes and wait, with deadlines, until
they are blocked; every one is killed (with its whole process group) when the context ends."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Optional, Sequence

from waiting import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
PROG = os.path.join(HERE, "worker_target_prog.py")
READ_SYSCALLS = {"0", "63"}  # read(2) on x86_64, aarch64


class Target:
    """A process group started from argv; `ready` holds the words after "ready" on its first line."""

    def __init__(self, argv: Sequence[str], env: Optional[Dict[str, str]] = None, timeout: float = 30) -> None:
        self.proc = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        try:
            self.ready = self._ready_line(timeout)
        except BaseException:
            self.kill()
            raise

    def _ready_line(self, timeout: float) -> List[str]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("target %r not ready in %ss" % (self.proc.args, timeout))
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("target exited before it was ready: %r" % (self.proc.args,))
            buf += chunk
        words = buf.split(b"\n", 1)[0].decode().split()
        assert words[0] == "ready", words
        return words[1:]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        if self.proc.stdout is not None:  # a failed test's traceback would keep the pipe open otherwise
            self.proc.stdout.close()

    def __enter__(self) -> "Target":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


@contextlib.contextmanager
def readable_copy(path: str) -> Iterator[str]:
    """A copy of the program file `path` that every user can read, in a temp folder of its own (0755, under
    the system's temp dir, never the checkout) that is removed when the context ends: a target started as
    another user must not need to read the checkout, which may sit in a 0700 folder (root's home)."""
    folder = tempfile.mkdtemp(prefix="hangscope-prog-")
    try:
        os.chmod(folder, 0o755)
        copy = os.path.join(folder, os.path.basename(path))
        shutil.copyfile(path, copy)
        os.chmod(copy, 0o644)
        yield copy
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def rank_env(rank: int, **extra: str) -> Dict[str, str]:
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    env.update(extra)
    return env


def start_rank(rank: int = 0, args: Sequence[str] = (), python: str = sys.executable,
               prefix: Sequence[str] = (), **env: str) -> Target:
    t = Target([*prefix, python, PROG, "rank", *args], env=rank_env(rank, **env))
    wait_blocked(int(t.ready[0]))
    return t


def proc_state(pid: int) -> str:
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def tracer_pid(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    return 0


def wait_blocked(pid: int, timeout: float = 20) -> None:
    """Poll until every thread of pid sits in read(2): then its stacks are deterministic."""

    def blocked() -> bool:
        try:
            calls = []
            for tid in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/syscall" % (pid, tid)) as f:
                    calls.append(f.read().split()[0])
        except OSError:
            return False
        return bool(calls) and all(c in READ_SYSCALLS for c in calls)

    wait_until(blocked, timeout, "pid %d to block in read" % pid, interval=0.01)


def copy_as(tmp: str, name: str) -> str:
    """The target program under another file name (a launcher recognised by its script name)."""
    path = os.path.join(tmp, name)
    shutil.copy(PROG, path)
    return path




def alive(pid: int) -> bool:
    try:
        return proc_state(pid) not in ("Z", "X")
    except OSError:
        return False


def untouched(pid: int) -> bool:
    """Not stopped and not traced: what every tool must leave behind."""
    return proc_state(pid) not in ("T", "t") and tracer_pid(pid) == 0


def without_sudo(tmp_dir: str) -> list:
    """An argv prefix that runs a command as on a node with no sudo: in a private mount namespace where an
    empty, non-executable file covers every sudo on PATH. Needs root (mount namespaces)."""
    return without_tool(tmp_dir, "sudo")


def without_tool(tmp_dir: str, name: str) -> list:
    """An argv prefix that runs a command as on a node without the tool `name`: in a private mount namespace
    an empty, non-executable file covers it on PATH and in the system directories. Needs root."""
    import shutil

    empty = os.path.join(tmp_dir, "no-" + name)
    open(empty, "w").close()
    os.chmod(empty, 0o644)
    dirs = os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
    covered = sorted({os.path.realpath(p) for d in dirs for p in [os.path.join(d, name)] if os.path.exists(p)}
                     | {shutil.which(name) or ""} - {""})
    mounts = " && ".join(f'mount --bind "$0" {c}' for c in covered) or "true"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts + ' && exec "$@"', empty]
