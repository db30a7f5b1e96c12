"""The Textual TUI: the only package that imports textual. `run_tui(source, ...)` is the entry point."""

from __future__ import annotations

from typing import Any


def run_tui(source: Any, **kwargs: Any) -> int:
    """See app.ui.run.run_tui; imported lazily so that `--fps` is applied before Textual loads."""
    from app.ui.run import run_tui as run

    return run(source, **kwargs)


def run_watch_tui(make_watcher: Any, **kwargs: Any) -> int:
    """See app.ui.watch.run_watch_tui (`hangscope watch --tui`); imported lazily like run_tui."""
    from app.ui.watch import run_watch_tui as run

    return run(make_watcher, **kwargs)
