"""SVG snapshot tests of the main screens at 80x24 and 160x50, pinned to Textual 8.2.8.

The screenshots are taken exactly as pytest-textual-snapshot takes them (textual._doc.take_svg_screenshot,
the same id normalisation, baselines in __snapshots__/<module>/<test>.svg), but compared here: that plugin
pins syrupy 4.8.0, which requires pytest<9 and so cannot be installed next to this project's pytest 9.0.3.
To accept new baselines after a deliberate change, look at them and run
    HANGSCOPE_SNAPSHOT_UPDATE=1 python3 -m pytest tests/test_ui_snapshots.py
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
import time
from html import unescape
from pathlib import Path
from typing import Callable, Iterable, Optional, Tuple

import pytest
import textual
from textual._doc import take_svg_screenshot

from app.ui.app import HangscopeApp
from app.ui.source import ReplaySource
from tests.test_ui_support import build_snapshot, settle, with_hostile_names

TEXTUAL_VERSION = "8.2.8"
BASELINES = Path(__file__).parent / "__snapshots__" / "test_ui_snapshots"
SIZES = [(80, 24), (160, 50)]


def normalize_svg(svg: str) -> str:
    """pytest-textual-snapshot's normalisation: drop the per-render unique id."""
    return re.sub(r"\bterminal-\d+-([\w-]+)", r"terminal-\1", svg)


def svg_text(svg: str) -> str:
    """The characters of an SVG screenshot, line by line: what a failure shows as a diff."""
    rows = re.findall(r'<text class="[^"]*" x="[\d.]+" y="([\d.]+)"[^>]*>([^<]*)</text>', svg)
    lines: dict = {}
    for y, chars in rows:
        lines.setdefault(float(y), []).append(unescape(chars).replace("\xa0", " "))
    return "\n".join("".join(parts).rstrip() for _, parts in sorted(lines.items()))


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Snapshot times are shown in local time: pin the zone so the baselines do not depend on the machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def svg_snapshot(request):
    def compare(app: HangscopeApp, *, press: Iterable[str] = (), terminal_size: Tuple[int, int] = (80, 24),
                run_before: Optional[Callable] = None) -> bool:
        assert textual.__version__ == TEXTUAL_VERSION, "baselines are pinned to one Textual version"
        actual = normalize_svg(take_svg_screenshot(app=app, press=press, terminal_size=terminal_size,
                                                   run_before=run_before))
        path = BASELINES / f"{request.node.name}.svg"
        if os.environ.get("HANGSCOPE_SNAPSHOT_UPDATE") == "1" or not path.exists():
            if not path.exists() and os.environ.get("CI") and os.environ.get("HANGSCOPE_SNAPSHOT_UPDATE") != "1":
                pytest.fail(f"no baseline {path}: create it with HANGSCOPE_SNAPSHOT_UPDATE=1 and commit it")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual, encoding="utf-8")
            return True
        expected = normalize_svg(path.read_text(encoding="utf-8"))
        if actual == expected:
            return True
        failed = Path(tempfile.gettempdir()) / "hangscope-snapshots" / path.name
        failed.parent.mkdir(exist_ok=True)
        failed.write_text(actual, encoding="utf-8")
        diff = "\n".join(difflib.unified_diff(svg_text(expected).splitlines(), svg_text(actual).splitlines(),
                                              "baseline", "now", lineterm="", n=1))
        pytest.fail(f"screen differs from {path.name} (new one: {failed}); text diff (empty: colours or "
                    f"styles differ):\n{diff}")
    return compare


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


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_screen(svg_snapshot, size):
    assert svg_snapshot(barrier_app(), terminal_size=size, run_before=ready)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_drill_down(svg_snapshot, size):
    assert svg_snapshot(barrier_app(), terminal_size=size, run_before=at(13), press=["enter"])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_diff(svg_snapshot, size):
    app = HangscopeApp(ReplaySource([build_snapshot(nodes=4, per_node=4, scenario="skip", culprit=9)]))
    assert svg_snapshot(app, terminal_size=size, run_before=mark(0, 9), press=["d"])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_tree(svg_snapshot, size):
    app = HangscopeApp(ReplaySource([build_snapshot(nodes=4, per_node=4, scenario="dataloader", culprit=6)]))
    assert svg_snapshot(app, terminal_size=size, run_before=ready, press=["t"])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_hostile_names(svg_snapshot, size):
    snap = with_hostile_names(build_snapshot(nodes=2, per_node=2, scenario="barrier", culprit=0))
    assert svg_snapshot(HangscopeApp(ReplaySource([snap])), terminal_size=size, run_before=at(0), press=["enter"])


def test_too_small(svg_snapshot):
    assert svg_snapshot(barrier_app(), terminal_size=(50, 12), run_before=ready)
