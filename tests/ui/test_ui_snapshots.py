"""Snapshot tests (pytest-textual-snapshot) of the main screens at 80x24 and 160x50, pinned to Textual 8.2.8.

Baselines live in __snapshots__/test_ui_snapshots/<test>.svg. A failing test writes snapshot_report.html with
the baseline and the new screen side by side. To accept new baselines after a deliberate change, look at them
and run
    python3 -m pytest tests/ui/test_ui_snapshots.py --snapshot-update
"""

from __future__ import annotations

import time

import pytest
import textual

from app.ui.app import HangscopeApp
from app.ui.source import ReplaySource
from test_ui_support import build_snapshot, settle, with_hostile_names

TEXTUAL_VERSION = "8.2.8"
SIZES = [(80, 24), (160, 50)]
size_ids = pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")


@pytest.fixture(autouse=True)
def pinned():
    """Baselines hold for one Textual version, one time zone (snapshot times are shown in local time) and one
    screen hash key."""
    assert textual.__version__ == TEXTUAL_VERSION, "baselines are pinned to one Textual version"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TZ", "UTC")
        # the hash a name that reads like no name is shown with is keyed per TUI session (app/ui/safe.py): one
        # key for every baseline
        mp.setattr("app.ui.safe._SESSION_KEY", b"baseline-key-16b")
        time.tzset()
        yield
    time.tzset()


def barrier_app() -> HangscopeApp:
    return HangscopeApp(ReplaySource([build_snapshot(nodes=6, per_node=4, scenario="barrier", culprit=13,
                                                     failed=(4, 5))]), title="hosts.txt")


async def ready(pilot) -> None:
    await settle(pilot)


def at(rank: int):
    async def run(pilot) -> None:
        await settle(pilot)
        app = pilot.app
        r = app.history[-1].rank_by_number(rank)
        app.main.grid.move_to((r.node, r.pid))
        await pilot.pause()
    return run


def mark(first: int, second: int):
    async def run(pilot) -> None:
        await at(first)(pilot)
        await pilot.press("space")
        await at(second)(pilot)
        await pilot.press("space")
    return run


@size_ids
def test_main_screen(snap_compare, size):
    assert snap_compare(barrier_app(), terminal_size=size, run_before=ready)


@size_ids
def test_drill_down(snap_compare, size):
    assert snap_compare(barrier_app(), terminal_size=size, run_before=at(13), press=["enter"])


@size_ids
def test_diff(snap_compare, size):
    app = HangscopeApp(ReplaySource([build_snapshot(nodes=4, per_node=4, scenario="skip", culprit=9)]))
    assert snap_compare(app, terminal_size=size, run_before=mark(0, 9), press=["d"])


@size_ids
def test_tree(snap_compare, size):
    app = HangscopeApp(ReplaySource([build_snapshot(nodes=4, per_node=4, scenario="dataloader", culprit=6)]))
    assert snap_compare(app, terminal_size=size, run_before=ready, press=["t"])


@size_ids
def test_hostile_names(snap_compare, size):
    snap = with_hostile_names(build_snapshot(nodes=2, per_node=2, scenario="barrier", culprit=0))
    assert snap_compare(HangscopeApp(ReplaySource([snap])), terminal_size=size, run_before=at(0), press=["enter"])


def test_too_small(snap_compare):
    assert snap_compare(barrier_app(), terminal_size=(50, 12), run_before=ready)
