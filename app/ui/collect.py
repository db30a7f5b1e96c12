"""Collection from the TUI: snapshots, refresh, watch mode, strace/gdb, export, and Ctrl+C.

Every collection runs in one exclusive Textual worker, so the screen stays live while nodes answer; results
arrive as session events (app.py). Anything that stops or traces ranks asks first and shows the command.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from functools import partial
from typing import List, Optional, Sequence

from textual.timer import Timer

from app.errors import HangscopeError
from app.model import CollectOptions
from app.printable import clock
from app.ui.core import HangscopeCore
from app.model import RankKey
from app.ui.safe import counted
from workers.protocol import pyspy_flags
from app.ui.screens.dialogs import ConfirmScreen, PathScreen

STRACE_SECONDS = 2.0
CLOSE_TIMEOUT = 5.0


def command_lines(kind: str, keys: Sequence[RankKey], options: CollectOptions, seconds: float = STRACE_SECONDS
                  ) -> List[str]:
    """What runs on each node, as a user would type it (the worker runs the equivalent, under a deadline)."""
    sudo = "sudo -n " if options.sudo else ""
    out = []
    for node, pid in keys:
        if kind == "strace":
            cmd = f"{sudo}strace -f -tt -p {pid}"
        elif kind == "gdb":
            cmd = f"{sudo}gdb -p {pid} -batch -iex 'set debuginfod enabled off' -ex 'thread apply all bt'"
        else:
            flags = "".join(f" {f}" for f in pyspy_flags(options.native, options.locals, options.nonblocking))
            cmd = f"{sudo}py-spy dump --json{flags} --pid {pid}"
        out.append(f"{node}: {cmd}")
    return out


class CollectMixin(HangscopeCore):
    def init_collect(self) -> None:
        self._watch_timer: Optional[Timer] = None
        self._interrupts = 0
        self._consented: set = set()  # kinds of stopping action the user already agreed to this session

    # -- running one collection ------------------------------------------------------------------------

    def start_collection(self, kind: str, *, ranks: Optional[List[RankKey]] = None,
                         options: Optional[CollectOptions] = None, seconds: float = STRACE_SECONDS) -> bool:
        if not self.source.live and kind != "snapshot":  # a loaded file is shown once, never collected
            self.notify("this is a loaded snapshot: there is nothing to collect", severity="warning")
            return False
        if self.collecting:
            self.notify(f"still {self.collecting_what}; Ctrl+C cancels it", severity="warning")
            return False
        if self.analysing:  # its snapshot is not in the history yet: what a collection would add or replace
            self.notify(f"still analysing {counted(len(self.analysing[0].ranks), 'rank')}", severity="warning")
            return False
        self.collecting = True
        self.collecting_what = {"snapshot": "collecting", "refresh": "refreshing", "watch": "sampling",
                                "strace": "running strace", "gdb": "running gdb"}[kind]
        self._update_topbar()
        self.run_worker(self._collect(kind, ranks, options, seconds), group="collect", exclusive=True,
                        exit_on_error=False)
        return True

    async def _collect(self, kind: str, ranks: Optional[List[RankKey]], options: Optional[CollectOptions],
                       seconds: float) -> None:
        src = self.source
        try:
            if kind == "snapshot":
                await src.snapshot(options)
            elif kind in ("refresh", "watch"):
                await src.refresh(ranks, options)
            elif kind == "strace":
                self.add_snapshot(await src.strace(ranks or [], seconds), replace=True)
            elif kind == "gdb":
                self.add_snapshot(await src.gdb(ranks or []), replace=True)
        except Exception as exc:  # a HangscopeError, or a bug in a layer below: say it, keep the screen usable
            self.show_error(exc)
        finally:
            self.collecting = False
            self.collecting_what = ""
            self._update_topbar()

    def _confirm_then(self, kind: str, title: str, effect: str, commands: List[str], run) -> None:
        """Ask once per kind of stopping action; later ones of the same kind run at once."""
        if kind in self._consented:
            run()
            return

        def answered(yes: Optional[bool]) -> None:
            if yes:
                self._consented.add(kind)
                run()
        self.push_screen(ConfirmScreen(title, effect, commands), answered)

    def _blocking(self, options: CollectOptions) -> bool:
        return not options.nonblocking

    # -- refresh and watch -----------------------------------------------------------------------------

    def action_refresh_rank(self) -> None:
        keys = self.targets()
        if keys:
            self._refresh(keys)

    def action_refresh_all(self) -> None:
        self._refresh(None)

    def _refresh(self, keys: Optional[List[RankKey]]) -> None:
        opts = self.source.options
        if not self.source.live:
            self.start_collection("refresh")  # says why not
            return
        if self._blocking(opts):
            shown = keys or [k for k in (self.current_view.ranks if self.current_view else {})]
            self._confirm_then("pyspy", "Refresh: py-spy pauses each rank briefly",
                               "py-spy reads the stacks of a paused rank (~10 ms each, ~0.5 s with native "
                               "frames); the rank resumes at once. Watch mode (w) samples without pausing.",
                               command_lines("pyspy", shown, opts),
                               lambda: self.start_collection("refresh", ranks=keys))
        else:
            self.start_collection("refresh", ranks=keys)

    def action_toggle_watch(self) -> None:
        self.set_watch(not self.watching)

    def set_watch(self, on: bool) -> None:
        if on and not self.source.live:
            self.notify("this is a loaded snapshot: there is nothing to watch", severity="warning")
            return
        self.watching = on
        if self._watch_timer is not None:
            self._watch_timer.stop()
            self._watch_timer = None
        if on:
            self.interval = self.interval or 10.0
            self._watch_timer = self.set_interval(self.interval, self._watch_tick)
            self.notify(f"watching: a non-blocking sample every {self.interval:g} s", timeout=3)
        self._update_topbar()

    def _watch_tick(self) -> None:
        if self.collecting or self.analysing:
            return  # the previous sample is still running or being analysed: skip, never queue up
        # Non-blocking sampling never pauses the ranks; py-spy refuses it with native frames.
        opts = dataclasses.replace(self.source.options, nonblocking=True, native=False)
        self.start_collection("watch", options=opts)

    # -- collect with other options ----------------------------------------------------------------------

    def action_collect_native(self) -> None:
        opts = dataclasses.replace(self.source.options, native=True, nonblocking=False)
        self._collect_with(opts, "native", "Collect with native frames",
                           "py-spy --native pauses each rank for ~0.5 s (longer with many threads) to read its C/C++ "
                           "frames.")

    def action_collect_locals(self) -> None:
        opts = dataclasses.replace(self.source.options, locals=True)
        self._collect_with(opts, "pyspy", "Collect with locals",
                           "py-spy --locals pauses each rank briefly to read its local variables (loop counters "
                           "tell iterations apart)." if not opts.nonblocking else "")

    def _collect_with(self, opts: CollectOptions, kind: str, title: str, effect: str) -> None:
        view = self.current_view
        keys = list(view.ranks) if view is not None else []
        if opts.nonblocking:
            self.start_collection("refresh", options=opts)
            return
        self._confirm_then(kind, title, effect, command_lines("pyspy", keys, opts),
                           lambda: self.start_collection("refresh", options=opts))

    # -- strace and gdb ----------------------------------------------------------------------------------

    def action_strace(self) -> None:
        keys = self.targets()
        if not keys:
            return
        self._confirm_then("strace", f"strace {counted(len(keys), 'rank')} for {STRACE_SECONDS:g} s",
                           f"strace attaches with ptrace for {STRACE_SECONDS:g} s: the ranks keep running but every "
                           "system call is traced (slower) until it detaches.",
                           command_lines("strace", keys, self.source.options),
                           lambda: self.start_collection("strace", ranks=keys))

    def action_gdb(self) -> None:
        keys = self.targets()
        if not keys:
            return
        self._confirm_then("gdb", f"gdb backtrace of {counted(len(keys), 'rank')}",
                           "gdb stops each rank for ~3 s (one at a time per node) and costs ~5 s of CPU; a rank "
                           "it leaves stopped is resumed. Ranks that are stopped, frozen or in D state are not "
                           "touched: gdb would wait on them.",
                           command_lines("gdb", keys, self.source.options),
                           lambda: self.start_collection("gdb", ranks=keys))

    # -- export ----------------------------------------------------------------------------------------

    def action_export(self) -> None:
        view = self.current_view
        if view is None:
            self.notify("nothing to export yet", severity="warning")
            return
        stamp = clock(view.snapshot.taken_at, "%Y%m%d-%H%M%S")
        self.push_screen(PathScreen("Export a report of this snapshot", f"hangscope-{stamp}",
                                    "A directory (created 0700): summary.md, report.html, snapshot.json, flame graphs "
                                    "and the last GPU test's results, safe to share: a value that is not a number, a name or a path of "
                                    "names is written as its type, length and a hash. `hangscope --load "
                                    "DIR/snapshot.json` reads it back."),
                         lambda path: self._export(path) if path else None)

    def _export(self, path: str) -> None:
        view = self.current_view
        if view is None:
            return
        history = self.earlier_samples()
        # Rendering the HTML of a large job takes a while: a thread keeps the screen responsive. A description of
        # its own: Textual describes a worker by repr() of its work otherwise, here of every rank and finding.
        self.run_worker(partial(self._export_in_thread, view.snapshot, view.analysis, os.path.expanduser(path),
                                history, self.gpu_results), thread=True, group="export", exit_on_error=False,
                        name="export", description=f"export to {path}")

    def _export_in_thread(self, snapshot, analysis, path: str, history, tests=None) -> None:
        from app.report import export_bundle

        try:
            result = export_bundle(snapshot, analysis, path, history=history, tests=tests)
        except HangscopeError as exc:
            self.call_from_thread(self.show_error, exc)
            return
        redacted = sum(result.redactions.values())
        note = f"; {counted(redacted, 'secret value')} redacted" if redacted else ""
        # The absolute path: the notice is read later, from wherever the user has moved on to.
        where = os.path.abspath(result.directory)
        self.call_from_thread(self.notify, f"{where}: {counted(len(result.paths), 'file')}{note}",
                              title="report exported", markup=False, timeout=10)

    # -- Ctrl+C and leaving ----------------------------------------------------------------------------

    def action_interrupt(self) -> None:
        self._interrupts += 1
        if self._interrupts >= 2:
            self.exit(return_code=130)
            return
        if self.collecting:
            self.source.cancel()
            self.notify("cancelled: what arrived is kept. Ctrl+C again aborts hangscope.", title="Ctrl+C",
                        timeout=8)
        else:
            self.notify("nothing is being collected. Ctrl+C again aborts; q quits.", title="Ctrl+C", timeout=8)

    async def on_unmount(self) -> None:
        if self._watch_timer is not None:
            self._watch_timer.stop()
        try:
            await asyncio.wait_for(self.source.close(), CLOSE_TIMEOUT)
        except (asyncio.TimeoutError, HangscopeError, OSError):
            pass  # leaving anyway: the workers exit on EOF when the process ends
