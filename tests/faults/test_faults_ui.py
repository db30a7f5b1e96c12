"""Fault matrix, TUI: the row's exact terminal size (40x10) gets the size notice, also while collecting, and the
app recovers when the terminal grows, with the data it had or got meanwhile (fed as in test_ui_app)."""

from __future__ import annotations

from app.model import NodeStatus
from app.session import NodeUpdate, RankUpdate
from app.ui.app import HangscopeApp
from app.ui.screens.too_small import TooSmallScreen
from app.ui.source import ReplaySource
from test_ui_support import build_snapshot, screen_text, settle, until


async def test_a_40x10_terminal_gets_the_size_notice_then_recovers_when_resized() -> None:
    app = HangscopeApp(ReplaySource([build_snapshot()]))
    async with app.run_test(size=(40, 10)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, TooSmallScreen)
        assert "40x10" in screen_text(app) and "60x16" in screen_text(app)
        await pilot.resize_terminal(30, 8)  # smaller still: still the notice, no crash
        await pilot.pause()
        assert isinstance(app.screen, TooSmallScreen) and "30x8" in screen_text(app)
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        assert app.screen is app.main
        assert "Rank 5 is 1 iteration ahead" in screen_text(app)


async def test_resized_to_40x10_while_collecting_then_back_shows_what_arrived_meanwhile() -> None:
    app = HangscopeApp(ReplaySource([build_snapshot()]), start=False)
    async with app.run_test(size=(120, 36)) as pilot:
        app.collecting = True  # as while a snapshot() is in flight (events posted the way the source posts them)
        app._on_source_event(NodeUpdate(NodeStatus(name="gpu7", state="connecting")))
        await pilot.resize_terminal(40, 10)
        await pilot.pause()
        assert isinstance(app.screen, TooSmallScreen) and "40x10" in screen_text(app)
        for r in build_snapshot(nodes=1, per_node=2, prefix="gpu").ranks:  # arriving while the notice shows
            app._on_source_event(RankUpdate(r))
        await pilot.pause()
        await pilot.resize_terminal(120, 36)
        await until(pilot, lambda: app.screen is app.main and len(app.main.grid.model.rows) == 2, "recovered")
        assert [row.name for row in app.main.grid.model.rows] == ["gpu7", "gpu01"]
        assert "gpu7: connecting" in screen_text(app)
