"""Discovery without a rank environment, on real processes of this machine: torch.multiprocessing.spawn ranks
(tests/support/spawn_job.py) are found as spawn children with torch loaded (not the launcher, not its resource
tracker, not a data-loader worker they spawn), and with no rank at all, python processes with torch loaded are
listed as candidates with how to pick one. The scans see only the processes of each test (a source that lists
just those pids, everything else read from the real /proc), so other jobs on this machine cannot interfere."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jobs import SpawnJob
from waiting import wait_until
from workers import discover, procinfo, pstate

pytestmark = pytest.mark.torch


class OnlyThese(procinfo.ProcfsSource):
    """/proc, listing only the given processes and their descendants."""

    def __init__(self, roots: list) -> None:
        self.roots = roots

    def pids(self) -> list:
        kids: dict = {}
        for pid in procinfo.all_pids():
            try:
                kids.setdefault(int(procinfo.stat_fields(pid)[3]), []).append(pid)
            except (procinfo.Gone, OSError, IndexError, ValueError):
                continue
        out, todo = [], list(self.roots)
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo += kids.get(pid, [])
        return sorted(out)


def test_spawned_ranks_are_found_by_what_they_are(local_spawn_job: SpawnJob) -> None:
    launcher, pids = local_spawn_job.launcher, local_spawn_job.ranks
    scan = discover.Scan(OnlyThese([launcher.pid]), me=-1)
    found = {r["pid"]: r for r in scan.ranks()}
    assert sorted(found) == sorted(pids.values()), "the ranks only: not the launcher nor the resource tracker"
    tree = OnlyThese([launcher.pid]).pids()
    assert len(tree) >= 4  # launcher, resource tracker, 2 ranks: the others were really there and left out
    for pid in pids.values():
        r = found[pid]
        assert r["found_by"] == "multiprocessing spawn child with torch loaded"
        assert r["rank"] is None and r["rank_evidence"] == ""  # not invented: read from locals later
        assert r["launcher_pid"] == launcher.pid
    assert any("torch.multiprocessing.spawn" in n and "--locals" in n for n in scan.notes), scan.notes


def test_with_no_rank_the_python_processes_with_torch_are_listed_as_candidates() -> None:
    pytest.importorskip("torch")
    code = "import torch, sys, time; print('ready', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        scan = discover.Scan(OnlyThese([proc.pid]), me=-1)
        assert scan.ranks() == []
        (note,) = scan.notes
        assert f"pid {proc.pid} (" in note and "import torch" in note and "--pid PID" in note
    finally:
        proc.kill()
        proc.wait()


def test_the_file_a_blocked_call_is_on_is_read_from_proc() -> None:
    # a real thread blocked in read() on a pipe: the syscall and the fd's target, without attaching
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", f"import os; os.read({r}, 1)"], pass_fds=(r,))
    try:
        read_nr = b"0" if os.uname().machine == "x86_64" else b"63"
        wait_until(lambda: procinfo.read_file(f"/proc/{proc.pid}/syscall").split()[0] == read_nr,
                   what="child blocked in read")
        call, on = pstate._waits_on(proc.pid, proc.pid)
        assert call == "read" and on == os.readlink(f"/proc/{os.getpid()}/fd/{r}") and on.startswith("pipe:[")
    finally:
        proc.kill()
        proc.wait()
        os.close(r)
        os.close(w)
