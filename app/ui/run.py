"""run_tui: the CLI's entry into the TUI. Sets frame rate and animations before Textual is imported."""

from __future__ import annotations

import os
import sys
from typing import Optional

EXIT_INTERRUPTED = 130


def configure(fps: Optional[int], *, animations: bool) -> None:
    """`--fps N` caps screen updates (slow links); animations off sends no intermediate frames at all.

    Textual reads both from the environment when it is first imported, which is why the CLI calls this
    before anything imports textual; a process that already imported it gets the module values patched.
    """
    if fps is not None:
        fps = max(1, int(fps))
        os.environ["TEXTUAL_FPS"] = str(fps)
    if not animations:
        os.environ["TEXTUAL_ANIMATIONS"] = "none"
    if fps is not None and "textual.screen" in sys.modules:
        import textual.constants
        import textual.screen

        textual.constants.MAX_FPS = fps  # type: ignore[misc]
        textual.screen.UPDATE_PERIOD = 1 / fps  # type: ignore[misc]


def run_tui(source, *, fps: Optional[int] = None, title: str = "", interval: Optional[float] = None,
            animations: Optional[bool] = None) -> int:
    """Run the TUI on `source` (a SessionSource) until the user quits; returns the process exit code:
    0 every rank collected, 1 partial, 130 aborted with a second Ctrl+C. A low `fps` also turns
    animations off unless `animations` says otherwise."""
    configure(fps, animations=animations if animations is not None else fps is None or fps >= 30)
    from app.ui.app import HangscopeApp

    app = HangscopeApp(source, interval=interval, title=title)
    if fps is not None and fps < 30 or animations is False:
        app.animation_level = "none"
    code = app.run()
    if code is None:
        # The app ended without choosing a code (a crash Textual already printed, or the terminal went away).
        return app.return_code if app.return_code is not None else 1
    return int(code)
