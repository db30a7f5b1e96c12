"""A cgroup that caps processes to a share of one CPU, for the slow-node tests (tests/live/test_oss_cluster.py,
tests/live/test_watch_cluster.py, the throttled scenarios): a node whose ranks are throttled, as a noisy neighbour or
a wrong cgroup limit does; and one that favours processes (CpuFavour), for the others of such a job: on the test
cluster every node shares this machine's cores, so on a loaded machine the other nodes' ranks would wait for a CPU
too, which a real cluster's nodes, each with its own cores, do not. The slow node must be slow relative to them
whatever else the machine runs."""

from __future__ import annotations

import contextlib
import secrets

from waiting import wait_until
from pathlib import Path


class CpuCap:
    """A cgroup that caps its processes to `share` of one CPU: v2 cpu.max where the cpu controller is on the
    unified hierarchy, else v1 cpu.cfs_quota_us. Created here, emptied and removed on exit."""

    PERIOD_US = 100_000
    PREFIX = "hangscope-slow"

    def __init__(self, share: float) -> None:
        self.quota = int(self.PERIOD_US * share)
        name = f"{self.PREFIX}-{secrets.token_hex(3)}"
        v2 = Path("/sys/fs/cgroup")
        if "cpu" in _read(v2 / "cgroup.controllers").split():
            self.root, self.v2 = v2, True
        else:
            self.root, self.v2 = Path("/sys/fs/cgroup/cpu"), False
        self.path = self.root / name

    def __enter__(self) -> CpuCap:
        self.path.mkdir()
        if self.v2:
            (self.path / "cpu.max").write_text(f"{self.quota} {self.PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(self.quota))
        return self

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def __exit__(self, *exc: object) -> None:
        for line in _read(self.path / "cgroup.procs").split():
            with contextlib.suppress(OSError):
                (self.root / "cgroup.procs").write_text(line)  # back to the root: uncapped

        def removed() -> bool:
            try:
                self.path.rmdir()
                return True
            except OSError:
                return False

        wait_until(removed, 10, f"{self.path} to be removed (its processes moved out)", interval=0.1)


class CpuFavour(CpuCap):
    """A cgroup whose processes the scheduler serves first (the largest weight, no cap): v2 cpu.weight, v1
    cpu.shares. They still wait for a CPU now and then, but not for the other work of a loaded machine."""

    PREFIX = "hangscope-favoured"

    def __init__(self) -> None:
        super().__init__(1.0)

    def __enter__(self) -> CpuFavour:
        self.path.mkdir()
        if self.v2:
            (self.path / "cpu.weight").write_text("10000")  # the default is 100
        else:
            (self.path / "cpu.shares").write_text(str(100 * 1024))  # the default is 1024
        return self


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
