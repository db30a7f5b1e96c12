"""Issue 25, lose nothing: a disk without room for the output (it was not full at the up-front check).

Through the real CLI, in a private mount namespace holding a 64 KiB tmpfs with an earlier output on it and 8 KiB
still free: the up-front check passes (the file system is neither full nor read-only); a bundle is measured
before its first byte and refused, a snapshot file (written as it is made, never held whole) fails when the disk
fills under its temporary name. What the user relies on: one line naming the path and "no space left" (for a
bundle, what it needs); exit 1 after a collection, with the data printed on stdout, and exit 2 with --load and
that line alone (nothing was collected: the output was all there was to do, the loaded file is still there); the
earlier file at that path unchanged, no partial bundle, no temporary file. A disk that fills during the write itself (after the measure) is the writer's: the earlier file
is unchanged and no temporary file is left (create-and-rename).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests" / "data" / "scenarios" / "skip.json"
pytestmark = pytest.mark.timeout(180)


def _in_a_nearly_full_tmpfs(full: Path, argv: list) -> subprocess.CompletedProcess:
    """Run `python -m app ARGV` where `full` is a fresh 64 KiB tmpfs holding out.json ("old") and a filler that
    leaves 4 KiB free (a one-rank snapshot is ~6 KiB); print the free KiB first (the premise), then the listing
    after the command."""
    script = (f"mount -t tmpfs -o size=64k tmpfs {full} && printf old > {full}/out.json && "
              f"dd if=/dev/zero of={full}/filler bs=4k count=14 2>/dev/null && "
              f"df -k --output=avail {full} | tail -1 >&2 && cd {REPO} && "
              f"{sys.executable} -m app {' '.join(argv)}; rc=$?; "
              f"echo \"@@ $rc\" >&2; for d in {full} {full}/bundle; do echo \"@@ $(ls -A $d 2>/dev/null | tr '\\n' ' ')\" >&2; "
              f"done; echo \"@@ $(cat {full}/out.json)\" >&2")
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=150, stdin=subprocess.DEVNULL)


def _outcome(res: subprocess.CompletedProcess) -> tuple:
    """(free KiB before, exit code, names in the tmpfs, names in its bundle/, out.json's content, hangscope's own
    stderr lines)."""
    lines = res.stderr.splitlines()
    free = int(lines[0])
    marks = [line[3:] for line in lines if line.startswith("@@ ")]
    own = [line for line in lines[1:] if not line.startswith("@@ ") and line.strip()]
    return free, int(marks[0]), sorted(marks[1].split()), sorted(marks[2].split()), marks[3], own


@pytest.fixture
def full(tmp_path: Path) -> Path:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private tmpfs")
    d = tmp_path / "full"
    d.mkdir()
    return d


def test_a_snapshot_without_room_keeps_the_old_file_and_prints_the_data(full: Path) -> None:
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        res = _in_a_nearly_full_tmpfs(full, ["--pid", str(target.pid), "--print", "--no-locals",
                                             "--snapshot", f"{full}/out.json", "--force"])
    finally:
        target.kill()
        target.wait()
    free, code, names, _, old, own = _outcome(res)
    assert 0 < free < 16, res.stderr  # room at the up-front check, not enough for a snapshot
    assert code == 1, res.stderr
    errors = [line for line in own if line.startswith("hangscope:")]
    assert len(errors) == 1 and f"{full}/out.json" in errors[0] and "no space left" in errors[0], own
    assert "Traceback" not in res.stderr
    assert "Findings" in res.stdout  # the collection is not lost: the summary is printed
    assert old == "old"  # the earlier snapshot is untouched, not truncated or half-replaced
    assert names == ["filler", "out.json"]  # no temporary file left


def test_an_export_without_room_writes_nothing_and_with_load_is_exit_2(full: Path) -> None:
    res = _in_a_nearly_full_tmpfs(full, ["--load", str(SNAPSHOT), "--export", f"{full}/bundle", "--tar"])
    free, code, names, bundle, old, own = _outcome(res)
    assert 0 < free < 16 and SNAPSHOT.stat().st_size > 16 * 1024, res.stderr
    assert code == 2, res.stderr
    errors = [line for line in own if line.startswith("hangscope:")]
    assert len(errors) == 1 and f"{full}/bundle" in errors[0] and "no space left" in errors[0], own
    assert "KiB free" in errors[0] and "nothing was written" in errors[0]
    assert "Traceback" not in res.stderr
    assert res.stdout == ""  # with --load a refusal is the only line (the loaded file is still there)
    assert old == "old"
    assert names == ["filler", "out.json"] and bundle == []  # no partial bundle, no tarball, no directory


def test_a_disk_that_fills_during_the_write_leaves_the_earlier_file_and_no_temporary(full: Path) -> None:
    """The writer itself, past the measure (as when another process fills the disk meanwhile): 64 KiB into the
    8 KiB left fails with ENOSPC at the write or the fsync, and the final name still holds the earlier file."""
    code = (f"import errno, os, sys; sys.path.insert(0, {str(REPO)!r}); from app.inputs import paths\n"
            f"dfd = os.open({str(full)!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
            f"try:\n paths.write_at(dfd, 'out.json', b'x' * 65536, replace=True)\n"
            f"except OSError as exc:\n print(errno.errorcode[exc.errno], file=sys.stderr)")
    script = (f"mount -t tmpfs -o size=64k tmpfs {full} && printf old > {full}/out.json && "
              f"dd if=/dev/zero of={full}/filler bs=4k count=14 2>/dev/null && "
              f"{sys.executable} -c \"$CODE\"; ls -A {full}; cat {full}/out.json")
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, CODE=code))
    assert res.stderr.strip() == "ENOSPC", res.stderr
    assert res.stdout.split() == ["filler", "out.json", "old"], res.stdout

