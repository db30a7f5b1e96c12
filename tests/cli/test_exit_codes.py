"""Issue 19 item 6: exit codes agree with the README. 0 only when every rank of the job was collected; 1 when
a node failed, a rank was not dumped, ranks are missing from WORLD_SIZE or a rank is gone since an earlier
sample; 3 when nothing was collected; each non-zero code with a line on stderr saying why."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import pytest

from app.cli.headless import EXIT_NOTHING, EXIT_OK, EXIT_PARTIAL, report
from test_report_build import make_snapshot

REPO = Path(__file__).resolve().parents[2]


def _report(snap, history=()):
    return report(snap, history=history, out=io.StringIO())


def test_every_rank_collected_is_0_and_says_nothing(capsys) -> None:
    assert _report(make_snapshot("barrier")) == EXIT_OK
    assert capsys.readouterr().err == ""


def test_ranks_missing_from_world_size_are_partial(capsys) -> None:
    snap = make_snapshot("barrier")
    snap = dataclasses.replace(snap, ranks=tuple(r for r in snap.ranks if r.rank not in (6, 7)))
    assert snap.complete  # every node answered and every rank it found was dumped
    assert _report(snap) == EXIT_PARTIAL
    assert "hangscope: partial: ranks 6-7 not found (WORLD_SIZE=8)" in capsys.readouterr().err


def test_a_rank_gone_since_an_earlier_sample_is_partial(capsys) -> None:
    earlier = make_snapshot("barrier")
    current = dataclasses.replace(earlier, taken_at=earlier.taken_at + 2,
                                  ranks=tuple(r for r in earlier.ranks if r.rank != 3))
    assert _report(current, history=[earlier]) == EXIT_PARTIAL
    assert "1 rank(s) gone since an earlier sample" in capsys.readouterr().err


def test_a_failed_node_is_partial(capsys) -> None:
    assert _report(make_snapshot("barrier", failed_node=True)) == EXIT_PARTIAL
    assert "hangscope: partial: 1 node(s) failed or were cut short" in capsys.readouterr().err


@pytest.mark.parametrize("failed, expect", [
    (False, "nothing was collected: no rank was found (2 node(s) answered)"),
    (True, "nothing was collected: no rank was found (2 node(s) answered, 1 failed)"),
])
def test_no_rank_at_all_is_nothing_collected_3(capsys, failed, expect) -> None:
    snap = dataclasses.replace(make_snapshot("barrier", failed_node=failed), ranks=())
    assert _report(snap) == EXIT_NOTHING == 3
    assert f"hangscope: {expect}" in capsys.readouterr().err


def test_readme_and_help_state_the_same_codes() -> None:
    readme = (REPO / "README.md").read_text()
    line = " ".join(readme[readme.index("Exit codes:"):readme.index("The TUI needs a terminal")].split())
    for code, words in (("0", "every rank collected"), ("1", "partial"), ("2", "bad input"),
                        ("3", "nothing"), ("130", "interrupted")):
        assert re.search(rf"`{code}` {words}", line), (code, line)
    from app.cli import EXAMPLES

    for code, words in (("0", "every rank collected"), ("1", "partial"), ("2", "bad input"), ("3", "nothing"),
                        ("130", "interrupted")):
        assert re.search(rf"\b{code} {words}", " ".join(EXAMPLES.split())), (code, words)
