"""The watch is domain core: it, and the CLI's watch command, never import Textual (checked in a fresh
interpreter: the headless watch stays light, and --fps must be set before Textual loads)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_watch_and_its_command_do_not_import_textual() -> None:
    code = ("import sys\nimport app.watch, app.watch.capture, app.watch.loop, app.cli.watch, app.ui\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
