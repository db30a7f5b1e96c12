"""The command palette (Ctrl+P): every action of the TUI by name, with its key."""

from __future__ import annotations

from functools import partial
from typing import Tuple

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (name, key, app action, help): one row per action a user can take; the palette lists them all.
ACTIONS: Tuple[Tuple[str, str, str, str], ...] = (
    ("Drill into rank", "enter", "drill", "threads, locals, source, strace, gdb, /proc and env of the rank"),
    ("Diff ranks", "d", "diff", "the two marked ranks, or this rank against its class majority"),
    ("Merged stack tree", "t", "tree", "all ranks' stacks merged into one prefix tree (of the selected class)"),
    ("Who waits for whom", "W", "waits", "the wait graph: the culprit at its root, each wait with its evidence"),
    ("Mark rank", "space", "toggle_mark", "mark ranks to diff them or run strace/gdb on them"),
    ("Clear marks", "", "clear_marks", "unmark every rank"),
    ("Filter ranks", "/", "filter", "by rank (3, 0-7), pid (pid 4242), node (node02, node[01-04]) or frame text"),
    ("Refresh rank", "r", "refresh_rank", "collect this rank again"),
    ("Refresh all", "R", "refresh_all", "collect every rank again"),
    ("Watch", "w", "toggle_watch", "refresh at an interval without pausing the ranks (py-spy --nonblocking)"),
    ("Older snapshot", "[", "history(-1)", "step back through the snapshots taken so far"),
    ("Newer snapshot", "]", "history(1)", "step forward through the snapshots taken so far"),
    ("Collect with native frames", "N", "collect_native", "py-spy --native: C/C++ frames (pauses each rank)"),
    ("Collect with locals", "L", "collect_locals", "py-spy --locals: loop variables tell iterations apart"),
    ("strace ranks", "s", "strace", "strace the marked ranks (or this one) for a few seconds"),
    ("gdb backtrace", "g", "gdb", "gdb backtrace of the marked ranks (or this one): stops each ~3 s"),
    ("Export report", "e", "export", "write the report of this snapshot to a file"),
    ("GPU tests", "G", "gpu_tests", "run sanity, bandwidth, node-pair or network tests on the job's nodes"),
    ("GPU test results", "", "gpu_results", "the last GPU test's results (its progress while it runs)"),
    ("Classes panel", "c", "focus_panel('classes')", "equivalence classes, largest first"),
    ("Findings panel", "f", "focus_panel('findings')", "findings, most likely culprit first"),
    ("Nodes panel", "n", "focus_panel('nodes')", "node states and failure reasons"),
    ("Rank grid", "", "focus_panel('grid')", "back to the grid of ranks"),
    ("Cancel collection", "ctrl+c", "interrupt", "stop what is being collected and keep what arrived"),
    ("Help", "?", "help", "keys and what the screen shows"),
    ("Quit", "q", "quit_app", "leave hangscope"),
)


class HangscopeCommands(Provider):
    """Matches the query against the action names; each hit runs the app action."""

    def _title(self, name: str, key: str) -> str:
        return f"{name} ({key})" if key else name

    async def discover(self) -> Hits:
        for name, key, action, help_text in ACTIONS:
            yield DiscoveryHit(self._title(name, key), partial(self.app.run_action, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, key, action, help_text in ACTIONS:
            title = self._title(name, key)
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(self.app.run_action, action), help=help_text)
