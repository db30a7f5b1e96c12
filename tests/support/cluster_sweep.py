"""Names, run locks and the leftover-sweeper of the network-namespace test cluster (root only).

Every cluster gets a random run id that is part of every name it creates (bridge, veths, netns, temp dir),
and holds an flock on /run/hangscope-testcluster/<rid>.lock for its lifetime. The kernel drops the lock when
the owning process dies however it dies, so "lock file present but lockable" means "crashed run": the sweeper
removes that run's leftovers, and never touches a run whose lock is held (a parallel test session).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Iterator

LOCK_DIR = Path("/run/hangscope-testcluster")
BRIDGE_PREFIX = "hsbr"  # + rid: "hsbr1a2b3c" (interface names must stay under 16 bytes)
VETH_PREFIX = "hsv"  # + rid + node index: "hsv1a2b3c007"
NETNS_PREFIX = "hscl-"  # + rid + "-" + node name
_RID = re.compile(r"^[0-9a-f]{6}$")


def new_run_id() -> str:
    return secrets.token_hex(3)


def bridge_name(rid: str) -> str:
    return f"{BRIDGE_PREFIX}{rid}"


def veth_name(rid: str, index: int) -> str:
    return f"{VETH_PREFIX}{rid}{index:03d}"


def netns_name(rid: str, node: str) -> str:
    return f"{NETNS_PREFIX}{rid}-{node}"


@contextlib.contextmanager
def alloc_lock() -> Iterator[None]:
    """Serialises sweeping and subnet allocation between test sessions running at the same time."""
    LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(LOCK_DIR / "alloc.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class RunLock:
    """The flock that marks a run as alive; its file records what to remove if the run crashes."""

    def __init__(self, rid: str, workdir: Path) -> None:
        self.path = LOCK_DIR / f"{rid}.lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(self.fd, json.dumps({"pid": os.getpid(), "workdir": str(workdir)}).encode())

    def release(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = -1


def _run_is_alive(rid: str) -> bool:
    path = LOCK_DIR / f"{rid}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)


def list_netns() -> list[str]:
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_links() -> list[str]:
    out = _ip("-o", "link", "show").stdout
    names = []
    for line in out.splitlines():
        # "7: hsv1a2b3c001@if2: <BROADCAST,..." -> "hsv1a2b3c001"
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def rid_of(name: str) -> str | None:
    """The run id inside one of our names, or None for names that are not ours."""
    for prefix in (NETNS_PREFIX, BRIDGE_PREFIX, VETH_PREFIX):
        if name.startswith(prefix):
            rid = name[len(prefix):len(prefix) + 6]
            return rid if _RID.match(rid) else None
    return None


def kill_netns_processes(ns: str) -> None:
    """SIGKILL every process in a netns (a node's PID-1 among them, which takes its whole PID namespace)."""
    out = _ip("netns", "pids", ns).stdout
    for word in out.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(word), signal.SIGKILL)


def remove_run(rid: str, netns: list[str], links: list[str]) -> None:
    """Remove what one run created: processes in its netns, the netns, its links and its temp dir."""
    for ns in netns:
        if rid_of(ns) == rid:
            kill_netns_processes(ns)
            _ip("netns", "del", ns)
    for link in links:
        if rid_of(link) == rid:
            _ip("link", "del", link)
    lock = LOCK_DIR / f"{rid}.lock"
    with contextlib.suppress(OSError, ValueError):
        workdir = json.loads(lock.read_text() or "{}").get("workdir")
        if workdir and Path(workdir).name.startswith(f"hangscope-cluster-{rid}-"):
            shutil.rmtree(workdir, ignore_errors=True)
    with contextlib.suppress(OSError):
        lock.unlink()


def sweep_stale() -> list[str]:
    """Remove the leftovers of crashed runs (call with alloc_lock held); returns the run ids swept."""
    netns, links = list_netns(), list_links()
    rids = {rid_of(name) for name in netns + links}
    rids |= {p.stem for p in LOCK_DIR.glob("*.lock") if _RID.match(p.stem)}
    swept = []
    for rid in sorted(r for r in rids if r):
        if not _run_is_alive(rid):
            remove_run(rid, netns, links)
            swept.append(rid)
    return swept


def used_subnets() -> set[str]:
    """The /24 prefixes of 198.18.0.0/15 already on an interface here, e.g. {"198.18.7"}."""
    out = _ip("-o", "-4", "addr", "show").stdout
    return set(re.findall(r"inet (198\.1[89]\.\d+)\.\d+/", out))


def free_subnet() -> str:
    """A free /24 of the RFC 2544 benchmarking range (never 10/8, 172.16/12 or 192.168/16)."""
    used = used_subnets()
    for second in (18, 19):
        for third in range(256):
            prefix = f"198.{second}.{third}"
            if prefix not in used:
                return prefix
    raise RuntimeError("no free /24 left in 198.18.0.0/15 for a test cluster")
