"""The rank grid widget: keyboard and mouse, what a move repaints, and glyphs that read without colour."""

from __future__ import annotations

from app.ui.app import HangscopeApp
from app.ui.screens.drill import DrillScreen
from app.ui.source import ReplaySource
from app.ui.widgets.rank_grid import RankGrid
from test_ui_support import build_snapshot, screen_text, settle

SIZE = (120, 36)


def status(app: HangscopeApp) -> str:
    return str(app.main.query_one("#status").render())


async def test_hover_names_the_rank_and_clicks_move_then_drill():
    snap = build_snapshot(nodes=4, per_node=2, scenario="barrier", culprit=6)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        grid = app.main.grid
        label_w = grid._label_w
        # border (1) + node name column, then 3 columns per cell; row 0 is the header
        cell = (1 + label_w + 3 * 1 + 1, 1 + 1 + 1)  # node02, local rank 1: rank 3
        await pilot.hover(RankGrid, offset=cell)
        await pilot.pause()
        assert status(app).startswith("rank 3  node02  pid 4121  ● class 1 (7 ranks)  all_reduce")
        assert grid.cursor == (3, 0)  # hovering does not move the cursor
        await pilot.click(RankGrid, offset=cell)
        assert grid.cursor == (1, 1)
        await pilot.click(RankGrid, offset=cell)  # a click on the cursor's cell drills in
        assert isinstance(app.screen, DrillScreen) and app.screen.rank.rank == 3


async def test_keys_move_within_rows_and_across_nodes():
    snap = build_snapshot(nodes=3, per_node=4)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        grid = app.main.grid
        grid.move_to((snap.ranks[0].node, snap.ranks[0].pid))
        await pilot.press("right", "right", "down")
        assert grid.current.rank.rank == 6
        await pilot.press("end")
        assert grid.current.rank.rank == 7
        await pilot.press("right")  # the row's edge: stays
        assert grid.current.rank.rank == 7
        await pilot.press("down", "down", "home")
        assert grid.current.rank.rank == 8
        assert status(app).startswith("rank 8  node03")


async def test_a_cursor_move_over_4096_ranks_repaints_two_lines():
    snap = build_snapshot(nodes=512, per_node=8, scenario="barrier", culprit=4000, locals_=False)
    app = HangscopeApp(ReplaySource([snap]))
    rendered = []
    original = RankGrid.render_line

    def counting(self, y):
        rendered.append(y)
        return original(self, y)

    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        grid = app.main.grid
        RankGrid.render_line = counting  # type: ignore[method-assign]
        try:
            for key in ("up", "right", "up", "left", "down"):
                rendered.clear()
                await pilot.press(key)
                await pilot.pause()
                assert 1 <= len(rendered) <= 2, (key, rendered)  # the row left and the row entered
            rendered.clear()
            await pilot.press("pageup")  # scrolling repaints what is visible, still not the 512 rows
            await pilot.pause()
            assert len(rendered) <= grid.size.height + 2
        finally:
            RankGrid.render_line = original  # type: ignore[method-assign]


async def test_classes_read_without_colour(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    snap = build_snapshot(nodes=4, per_node=2, scenario="dataloader", culprit=5, failed=(3,))
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "node01  ●  ●" in text and "node03  ● [▲]" in text  # the suspect: its own glyph, bracketed
        assert "node04  ✗  ✗" in text
        assert "● 5 ranks 0-4 on node[01-03]" in text and "▲ 1 rank 5 on node03  suspect" in text


async def test_header_and_node_names_stay_when_the_cells_scroll():
    snap = build_snapshot(nodes=3, per_node=64, scenario="barrier", culprit=150)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        grid = app.main.grid
        assert grid.scroll_offset.x > 0  # the suspect sits at local rank 22: scrolled into view
        text = screen_text(app)
        header = next(line for line in text.splitlines() if line.startswith("│node "))
        shown = [int(n) for n in header.split("│")[1].split()[1:]]  # the grid's own columns
        assert shown[0] > 0 and 22 in shown and shown == list(range(shown[0], shown[0] + len(shown))), header
        assert "│node03  ●  ●" in text and "[▲]" in text
        await pilot.press("home")
        assert grid.scroll_offset.x == 0
