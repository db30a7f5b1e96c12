"""hangscope watch: follow a running job with cheap samples (/proc and counters: no ptrace, no py-spy) and
capture the full evidence the moment it stalls or runs slow, before its own watchdog kills it.

Above the report and the session, below the UI and the CLI; nothing here imports Textual. Each concern in its own
module:

- options.py: WatchOptions and their ranges
- tracker.py: per job, progress or not, stalls, slow stretches, resumptions, ends (pure); events.py: what it says
- timeouts.py: the job's own watchdog, and the stall limit below it (pure)
- capture.py: the full snapshot and its bundle; outdir.py: the private, bounded --out directory and history
- hook.py: --on-hang, executed without a shell; loop.py: the Watcher that runs it all
"""

from __future__ import annotations

from app.watch.events import Event
from app.watch.loop import EXIT_NOTHING, EXIT_OK, EXIT_PARTIAL, Watcher
from app.watch.options import WatchOptions, check
from app.watch.outdir import OutDir

__all__ = ["EXIT_NOTHING", "EXIT_OK", "EXIT_PARTIAL", "Event", "OutDir", "WatchOptions", "Watcher", "check"]
