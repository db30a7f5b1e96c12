"""The first screen gives the answer, and the small things a user trips over on the way (issue 14): pilot tests
on recorded jobs (tests/data/scenarios, real py-spy output of the test cluster's hung gloo jobs) and built ones.

What a real terminal shows of the same screens is checked in ui/test_ui_tmux.py."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from app.model import Frame, Local, ThreadStack
from app.model.codec import snapshot_from_json
from app.ui import rank_text
from app.ui.app import HangscopeApp
from app.ui.grid_model import SYMBOLS, Cell
from app.ui.screens.dialogs import HELP, HelpScreen, PathScreen
from app.ui.screens.diff import DiffScreen
from app.ui.screens.drill import TABS, DrillScreen
from app.ui.source import ReplaySource, loaded_source
from app.ui.widgets.rank_grid import RankGrid
from test_ui_support import build_snapshot, screen_text, settle

DATA = Path(__file__).parent.parent / "data" / "scenarios"
README = Path(__file__).resolve().parents[2] / "README.md"


def recorded(name: str) -> HangscopeApp:
    snap, _ = snapshot_from_json((DATA / f"{name}.json").read_text())
    return HangscopeApp(loaded_source(snap), title=f"{name}.json")


def line_with(text: str, *parts: str) -> str:
    """The screen line that holds every part, in that order (side by side)."""
    pattern = ".*".join(re.escape(p) for p in parts)
    found = [line for line in text.splitlines() if re.search(pattern, line)]
    assert found, f"no line holds {parts}:\n{text}"
    return found[0]


# -- the first screen ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(160, 50), (120, 36)])
async def test_a_small_job_gets_a_small_grid_and_the_evidence_beside_it(size):
    """4 ranks: the grid is as large as its 2 nodes x 2 ranks need; the findings read on one line each; the
    culprit's loop values stand beside the majority's from the first frame without a key pressed."""
    app = recorded("skip")
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        grid = app.main.grid
        assert grid.region.height == 2 + 1 + 2  # two nodes, the header, the border
        assert grid.region.width <= size[0] * 0.35
        text = screen_text(app)
        assert "1. rank 2 is 1 iteration ahead (step=4 vs 3) in `all_reduce`, at job.py:188" in text
        assert "evidence: rank 2 against the majority" in text
        line_with(text, "rank 2 (node02 pid 14)", "rank 0 (node01 pid 16)")  # the two sides' heads
        line_with(text, "step = 4", "step = 3")  # the loop counter, side by side
        assert "≠" not in text.split("evidence:")[1].split("nodes:")[0]  # the same path: no divergence row


async def test_the_evidence_starts_where_the_paths_part():
    app = recorded("dataloader")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "paths part after main job.py:242" in text
        line_with(text, "main job.py:242", "main job.py:242")  # the last frame both share ...
        line_with(text, "≠", "train job.py:188", "train job.py:202")  # ... then where they part
        line_with(text, "StreamingLoader._recv_exact job.py:128", "wrapper")
        line_with(text, "step = 2", "step = 3")  # the loop values that differ, where the paths part
        assert "<module> job.py:247" not in text.split("evidence:")[1]  # the shared outer frames stay out


async def test_at_80x24_the_answer_and_the_cursor_on_the_culprit_fit():
    app = recorded("dataloader")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "Rank 1 is in `StreamingLoader._recv_exact`" in text  # the verdict
        assert "1. rank 1 is in `StreamingLoader._recv_exact`" in text  # the first finding
        assert "│node01  ● [▲]" in text  # the culprit's cell, bracketed, the cursor on it
        cell = app.main.grid.current
        assert cell is not None and cell.rank is not None and cell.rank.rank == 1
        assert "evidence: rank 1 against the majority" in text
        line_with(text, "≠", "train job.py:188", "train job.py:202")
        assert "? help" in text.splitlines()[-1]  # the footer keeps the key to every other key


async def test_a_large_job_keeps_its_grid_within_its_share():
    snap = build_snapshot(nodes=40, per_node=64, scenario="barrier", culprit=2000)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        grid = app.main.grid
        assert grid.region.width <= 160 * 0.45 + 1 and grid.region.height <= 50 * 0.6
        text = screen_text(app)
        assert "evidence: rank 2000 against the majority" in text
        cell = grid.current
        assert cell is not None and cell.rank is not None and cell.rank.rank == 2000
        assert "[▲]" in text  # the cursor's cell scrolled into view


async def test_no_single_culprit_says_so_in_the_evidence():
    app = recorded("netcut")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        assert "no rank stands out on its stack: ranks 0-2 on node[01-03]" in screen_text(app)


# -- the rank view's tabs ------------------------------------------------------------------------------------


async def test_rank_view_tabs_with_tab_the_arrows_and_digits():
    app = HangscopeApp(ReplaySource([build_snapshot(nodes=2, per_node=2, culprit=3)]))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        assert isinstance(app.screen, DrillScreen)
        tabs = app.screen.query_one("#drill-tabs")
        steps = [("tab", "locals"), ("tab", "source"), ("right", "strace"), ("left", "source"),
                 ("shift+tab", "locals"), ("left", "threads"), ("left", "env"), ("7", "env"), ("1", "threads"),
                 ("3", "source")]
        for key, tab in steps:
            await pilot.press(key)
            assert tabs.active == f"tab-{tab}", key
        footer = screen_text(app).splitlines()[-1]
        assert f"1-{len(TABS)} tab" in footer and "? help" in footer


async def test_digits_of_the_tabs_are_in_help_and_readme():
    for i, (_, label, _) in enumerate(TABS, 1):
        assert f"{i} {label}" in HELP
    keys = README.read_text().split("Keys:")[1].split("\n\n")[0]
    assert "`1`-`7`" in keys and "Tab" in keys


async def test_help_marks_a_suspect_as_the_grid_draws_it():
    drawn = RankGrid._cell_text(Cell("class", klass=0, suspect=True), marked=False)
    assert drawn == f"[{SYMBOLS[0]}]" and drawn in HELP
    assert not re.search(r"\[[^\]]\] marks a suspect", HELP.replace(drawn, ""))  # no other glyph claims it


async def test_a_whole_class_is_not_called_suspect_for_one_of_its_ranks():
    app = recorded("skip")  # one class of 4 ranks; rank 2 of it is a step ahead
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "● 4 ranks 0-3 on node[01-02]  incl. 1 suspect" in text
        assert "node[01-02]  suspect" not in text


# -- the filter box and the export ---------------------------------------------------------------------------


async def test_esc_in_the_filter_box_clears_the_filter():
    app = HangscopeApp(ReplaySource([build_snapshot(nodes=4, per_node=2)]))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        box = app.main.query_one("#filter")
        assert "Esc clears" in box.placeholder
        await pilot.press("slash", *"node02", "enter")
        assert len(app.main.grid.model.rows) == 1
        await pilot.press("slash")  # the box again, with the filter in it ...
        assert box.has_class("-shown") and box.value == "node02"
        await pilot.press("escape")  # ... and Esc there clears it, as the box says
        assert app.query_text == "" and len(app.main.grid.model.rows) == 4
        assert not box.has_class("-shown") and app.focused is app.main.grid


async def test_the_export_notice_names_the_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = HangscopeApp(ReplaySource([build_snapshot(nodes=2, per_node=2, culprit=3)]))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("e")
        assert isinstance(app.screen, PathScreen)
        await pilot.press("ctrl+a", "ctrl+k", *"rep", "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        messages = [n.message for n in app._notifications]
    assert (tmp_path / "rep" / "summary.md").exists()
    assert any(m.startswith(f"{tmp_path / 'rep'}: ") and " files" in m for m in messages), messages
    assert os.path.isabs(str(tmp_path))


# -- threads, plurals, the diff ------------------------------------------------------------------------------


def test_every_tab_lists_threads_in_the_same_order_main_first():
    snap = build_snapshot(nodes=1, per_node=1, culprit=0)
    r = snap.ranks[0]
    main, helper = r.threads
    helper = ThreadStack(helper.tid, name="loader", frames=(
        Frame("fetch", "/job/loader.py", 12, locals=(Local("i", "3"),), source=((12, "x = q.get()"),)),))
    r = replace(r, threads=(helper, main))  # as py-spy may list them: the helper first
    for render in (rank_text.threads_text, rank_text.locals_text, rank_text.proc_text):
        text = render(r).plain
        assert text.index(f"thread {main.tid}") < text.index(f"thread {helper.tid}"), render
    locals_text = rank_text.locals_text(r).plain
    assert locals_text.index("train") < locals_text.index("fetch")  # MainThread's frames first
    source_text = rank_text.source_text(r).plain
    assert source_text.index("train.py") < source_text.index("loader.py")


async def test_one_node_one_rank_read_in_the_singular():
    app = HangscopeApp(ReplaySource([build_snapshot(nodes=1, per_node=1, culprit=0)]))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "  1 node  1 rank  snapshot" in text and "(1 rank)" in text
        assert "1 nodes" not in text and "1 ranks" not in text


async def test_the_diff_never_breaks_a_name_at_80x24():
    snap = build_snapshot(nodes=2, per_node=2, scenario="skip", culprit=3)
    ranks = list(snap.ranks)
    for i, cls in ((0, "torch._C._distributed_c10d.ProcessGroupGloo"),
                   (3, "torch._C._distributed_c10d.ProcessGroupNCCL")):
        r = ranks[i]
        main = r.threads[0]
        frames = list(main.frames)
        frames[2] = replace(frames[2], locals=frames[2].locals + (Local("groups", f"[<{cls} at 0x7f02{i}>, ...]"),))
        ranks[i] = replace(r, threads=(replace(main, frames=tuple(frames)),) + r.threads[1:])
    snap = replace(snap, ranks=tuple(ranks))
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        r0, r3 = snap.rank_by_number(0), snap.rank_by_number(3)
        app.main.grid.move_to((r0.node, r0.pid))
        await pilot.press("space")
        app.main.grid.move_to((r3.node, r3.pid))
        await pilot.press("space", "d")
        assert isinstance(app.screen, DiffScreen)
        text = screen_text(app)
        words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)
        assert "ProcessGroupGloo" in words and "ProcessGroupNCCL" in words  # whole, on one line each
        assert "_distributed_c10d" in words
        assert "step = 5" in text and "step = 6" in text
        assert "? help" in text.splitlines()[-1]


async def test_help_opens_from_the_footer_key_at_80x24():
    app = HangscopeApp(ReplaySource([build_snapshot(nodes=2, per_node=2, culprit=3)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "? help" in screen_text(app).splitlines()[-1]
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)


def test_the_locals_tab_advises_locals_only_when_they_were_off():
    snap = build_snapshot(nodes=1, per_node=1, culprit=0, locals_=False)
    r = snap.ranks[0]
    assert "--locals" in rank_text.locals_text(r, collected=False).plain
    said = rank_text.locals_text(r, collected=True).plain
    assert "--locals" not in said and "key L" not in said and "collected with locals" in said


async def test_the_rank_view_knows_locals_were_collected():
    snap = build_snapshot(nodes=1, per_node=2, culprit=0, locals_=False)
    snap = replace(snap, options=replace(snap.options, locals=True))  # collected with locals, none readable
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("enter", "2")
        text = screen_text(app)
        assert "collected with locals" in text and "--locals" not in text
