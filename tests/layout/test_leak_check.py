"""The suite's leak check (tests/support/leaks.py, conftest's autouse no_leaks) itself: it names and ends what a
test started, and nothing it did not, whatever the wall clock does meanwhile."""

from __future__ import annotations

import subprocess

import psutil
import psutil._pslinux as pslinux

import leaks


def test_only_what_started_after_the_picture_is_a_leak_even_when_the_wall_clock_steps(monkeypatch) -> None:
    """psutil's create time of a process is its start after boot plus the boot time, which the kernel derives
    from the wall clock: a clock step (a VM's clock set again, seen under load) moved it for every process at
    once, and the check took the session's clusters for leaks and killed them. The step is simulated by moving
    the boot time psutil reads by a second."""
    old = subprocess.Popen(["sleep", "60"])
    new = None
    try:
        before = leaks.picture()
        created = psutil.Process(old.pid).create_time()
        boot = pslinux.boot_time()
        monkeypatch.setattr(pslinux, "boot_time", lambda: boot + 1.0)
        assert psutil.Process(old.pid).create_time() == created + 1.0  # the simulated step is seen by psutil
        new = subprocess.Popen(["sleep", "60"])
        found = leaks.leaks_since(before, grace=0.2)
        assert found == [f"child process pid {new.pid} (sleep 60)"], found
        leaks.kill_leaked_children(before)
        assert new.wait(timeout=10) == -9  # what started after the picture is ended ...
        assert old.poll() is None  # ... and nothing older
    finally:
        for p in (old, new):
            if p is not None:
                p.kill()
                p.wait()
