"""Each scenario recorded on the test cluster, opened in the TUI: the answer is on the first screen, and
the cursor starts on the culprit, so a new user finds it without knowing any key."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.model.codec import snapshot_from_json
from app.ui.app import HangscopeApp
from app.ui.source import ReplaySource
from test_ui_support import screen_text, settle

DATA = Path(__file__).resolve().parents[1] / "data" / "scenarios"

# scenario -> (text of the verdict on screen, the rank the cursor must start on, or None)
EXPECTED = {
    "dataloader": ("Rank 1 is in `StreamingLoader._recv_exact`", 1),
    "skip": ("Rank 2 is 1 iteration ahead (step=4 vs 3)", 2),
    "die": ("Rank 3 not found (WORLD_SIZE=4)", None),
    "netcut": ("node02 (or its link) is the problem", None),
    "healthy": ("The job is progressing", None),
}


def load(name: str):
    return snapshot_from_json((DATA / f"{name}.json").read_text())[0]


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
async def test_the_scenario_is_answered_on_the_first_screen(scenario):
    verdict, culprit = EXPECTED[scenario]
    samples = [load(f"{scenario}.earlier"), load(scenario)]  # two samples, as a live session takes them
    app = HangscopeApp(ReplaySource(samples))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("R")  # the second sample: progress between samples becomes known
        await settle(pilot)
        await pilot.press("y")  # refreshing pauses each rank briefly: the app asks first
        await settle(pilot)
        text = " ".join(screen_text(app).split())
        assert verdict in text, text
        status = str(app.main.query_one("#status").render())
        if culprit is not None:
            assert status.startswith(f"rank {culprit} ") and "suspect" in status, status
        await pilot.press("q")
