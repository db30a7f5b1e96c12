"""run_tui's set-up and the UI's import contract, each checked in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def python(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_the_ui_core_and_the_cli_entry_do_not_import_textual():
    # What builds the screens' data (and the entry point the CLI imports) must not pull Textual in: the
    # headless modes stay light, and --fps must be set before Textual reads it at import.
    out = python("import sys\n"
                 "import app.ui, app.ui.view, app.ui.grid_model, app.ui.rank_text, app.ui.safe, app.ui.source\n"
                 "print('textual' in sys.modules)")
    assert out == "False"


def test_fps_and_animations_reach_textual_before_it_loads():
    out = python("from app.ui.run import configure\n"
                 "configure(5, animations=False)\n"
                 "import textual.constants, textual.screen\n"
                 "c = textual.constants\n"
                 "print(c.MAX_FPS, textual.screen.UPDATE_PERIOD, c.TEXTUAL_ANIMATIONS)")
    assert out == "5 0.2 none"


def test_fps_is_applied_when_textual_was_already_imported():
    out = python("import textual.screen, textual.constants\n"
                 "from app.ui.run import configure\n"
                 "configure(12, animations=True)\n"
                 "print(textual.constants.MAX_FPS, round(textual.screen.UPDATE_PERIOD, 4))")
    assert out == "12 0.0833"
