"""Fault matrix, TUI: the row's exact terminal size (40x10) gets the size notice, and the app recovers when the
terminal grows, with the data it had (the app is fed by a ReplaySource, as in test_ui_app)."""

from __future__ import annotations

from app.ui.app import HangscopeApp
from app.ui.screens.too_small import TooSmallScreen
from app.ui.source import ReplaySource
from tests.test_ui_support import build_snapshot, screen_text, settle


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
