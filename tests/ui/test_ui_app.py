"""Pilot tests of the whole app fed by a ReplaySource: what a user sees and what reaches the session."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re


from app.model import JobProcess, NodeStatus, rank_key
from app.model.codec import snapshot_from_json
from app.session import NodeUpdate, RankUpdate, SnapshotDone
from app.ui.app import HangscopeApp
from app.ui.screens.dialogs import ConfirmScreen, HelpScreen, PathScreen
from app.ui.screens.diff import DiffScreen
from app.ui.screens.drill import DrillScreen
from app.ui.screens.gpu import GpuUnavailableScreen
from app.ui.screens.too_small import TooSmallScreen
from app.ui.screens.tree import TreeScreen
from app.ui.screens.waits import WaitsScreen
from app.ui.source import ReplaySource, loaded_source
from app.ui.widgets.rank_grid import RankGrid
from test_ui_support import build_snapshot, later, screen_text, settle, until, with_hostile_names

SIZE = (120, 36)


def grid_of(app: HangscopeApp) -> RankGrid:
    return app.main.grid


def at_rank(app: HangscopeApp, rank: int) -> None:
    r = app.history[-1].rank_by_number(rank)
    assert grid_of(app).move_to((r.node, r.pid))


async def test_opens_on_the_culprit_and_the_status_line_names_it():
    snap = build_snapshot(nodes=4, per_node=2, scenario="barrier", culprit=6)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        text = screen_text(app)
        # the verdict: rank 6 waits in a barrier past the end of the step loop the others are still in
        assert "Rank 6 has left the loop" in text and "rank 6 is in `barrier`" in text
        assert "[▲]" in text  # the suspect's cell: its class glyph, bracketed
        status = str(app.main.query_one("#status").render())
        assert "rank 6  node04  pid 4142  ▲ class 2 (1 rank)  suspect  barrier distributed_c10d.py:4159" in status
        await pilot.press("up")
        status = str(app.main.query_one("#status").render())
        assert status.startswith("rank 4  node03") and "● class 1 (7 ranks)" in status
        await pilot.press("q")
    assert app.return_code == 0


async def test_enter_drills_into_the_rank_with_every_tab():
    snap = build_snapshot(nodes=2, per_node=2, culprit=3, strace=True, gdb=True)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 3)
        await pilot.press("enter")
        assert isinstance(app.screen, DrillScreen)
        text = screen_text(app)
        assert "rank 3  on node02  pid 4121" in text and "train  train.py:43  [step=6]" in text
        for key, expected in (("2", "step   = 6"), ("3", "→    43"), ("4", "blocked in futex(FUTEX_WAIT_BITSET)"),
                              ("5", "ProcessGroupGloo::AsyncWork::wait"), ("6", "wchan futex_do_wait"),
                              ("7", "WORLD_SIZE=4")):
            await pilot.press(key)
            await pilot.pause()
            assert expected in screen_text(app), key
        await pilot.press("escape")
        assert app.screen is app.main


async def test_the_process_tab_shows_the_ranks_launcher_above_and_its_workers_below():
    snap = build_snapshot(nodes=2, per_node=2, culprit=3)
    r3 = next(r for r in snap.ranks if r.rank == 3)
    mates = tuple(r.pid for r in snap.ranks if r.node == r3.node)
    snap = dataclasses.replace(snap, processes=(
        JobProcess(node=r3.node, pid=4000, start_time=1, role="launcher", kind="torchrun", ppid=1, of=mates,
                   job=r3.job, state="S", wchan="do_wait"),
        JobProcess(node=r3.node, pid=4500, start_time=1, role="child", kind="data-loader worker", ppid=r3.pid,
                   of=(r3.pid,), job=r3.job, state="S"),
        JobProcess(node="node01", pid=4501, start_time=1, role="child", kind="data-loader worker", ppid=r3.pid,
                   of=(r3.pid,), job=r3.job, state="S")))  # same parent pid on another node: not this rank's
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 3)
        await pilot.press("enter", "6")
        await pilot.pause()
        text = screen_text(app)
        assert "In the job (launchers above, children below)" in text
        lines = [line.strip() for line in text.splitlines()]
        at = next(i for i, line in enumerate(lines) if line.startswith("torchrun pid 4000"))
        assert lines[at + 1].startswith(f"rank 3 (pid {r3.pid})") and lines[at + 1].endswith("(this rank)")
        assert lines[at + 2].startswith("data-loader worker pid 4500")
        assert "pid 4501" not in text


async def test_diff_of_two_marked_ranks_calls_out_the_iteration():
    snap = build_snapshot(nodes=2, per_node=2, culprit=3)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 0)
        await pilot.press("space")
        at_rank(app, 3)
        await pilot.press("space", "d")
        assert isinstance(app.screen, DiffScreen)
        text = screen_text(app)
        assert "rank 0 is 1 iteration behind rank 3 (step=5 vs 6)" in text
        # the value on each side, in the ranks' own columns, on one line
        assert re.search(r"^ .*step = 5 .*step = 6 *$", text, re.MULTILINE), text
        await pilot.press("escape", "space", "d")  # one mark left: rank 3 against its class majority
        assert "rank 3 is 1 iteration ahead of rank 0 (step=6 vs 5)" in screen_text(app)


async def test_diff_against_the_majority_marks_the_first_divergence():
    snap = build_snapshot(nodes=2, per_node=2, scenario="dataloader", culprit=1)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 1)
        await pilot.press("d")
        text = screen_text(app)
        assert "first divergence at depth 2: train train.py:40  vs  train train.py:43" in text
        assert "≠" in text


async def test_filter_by_node_then_escape_clears_it():
    snap = build_snapshot(nodes=4, per_node=2)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("slash", *"node02", "enter")
        assert [r.name for r in grid_of(app).model.rows] == ["node02"]
        assert "filter: node02" in screen_text(app)
        await pilot.press("slash", "ctrl+a", *"barrier", "enter")  # no rank is in a barrier
        assert grid_of(app).model.rows == []
        await pilot.press("escape")
        assert len(grid_of(app).model.rows) == 4 and app.query_text == ""


async def test_choosing_a_class_highlights_its_ranks():
    snap = build_snapshot(nodes=4, per_node=2, scenario="dataloader", culprit=2)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 0)
        await pilot.press("c", "down", "enter")  # the second class: the rank in the DataLoader
        grid = grid_of(app)
        assert grid.focus_class == 1
        assert grid.current.rank.rank == 2  # the cursor went to the class
        await pilot.press("enter")  # again: the highlight goes
        assert grid.focus_class is None


async def test_refresh_asks_first_then_history_tells_stuck_from_progressing():
    first = build_snapshot(nodes=2, per_node=2, locals_=True)
    second = later(first, 252, advance=[2])
    source = ReplaySource([first, second])
    app = HangscopeApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("R")
        assert isinstance(app.screen, ConfirmScreen)
        assert "node01: py-spy dump --json --locals --pid 4100" in screen_text(app)
        await pilot.press("y")
        await settle(pilot)
        assert [c[0] for c in source.calls] == ["snapshot", "refresh"]
        assert "snapshot 2/2" in screen_text(app)
        at_rank(app, 0)
        await pilot.pause()
        assert "stuck for 4m12s" in str(app.main.query_one("#status").render())
        at_rank(app, 2)
        await pilot.pause()
        assert "progressing" in str(app.main.query_one("#status").render())
        await pilot.press("left_square_bracket")
        assert "snapshot 1/2" in screen_text(app)
        await pilot.press("r")  # consent was given once: no second question
        await settle(pilot)
        assert source.calls[-1] == ("refresh", (("node02", 4114),))  # the rank under the cursor


async def test_a_failed_node_shows_its_reason_and_remedy():
    snap = build_snapshot(nodes=6, per_node=2, failed=(2, 3, 4))
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "node[03-05]: failed: ptrace denied (ptrace_scope=1)" in text
        assert "→ ptrace is not allowed" in text
        assert "nodes: 3 failed, 3 done" in text
        assert "✗ failed: ptrace denied" in text  # the node's row in the grid
        await pilot.press("q")
    assert app.return_code == 1  # partial


async def test_too_small_terminal_shows_the_size_it_needs():
    app = HangscopeApp(ReplaySource([build_snapshot()]))
    async with app.run_test(size=(50, 12)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, TooSmallScreen)
        assert "terminal 50x12: hangscope needs at least 60x16" in screen_text(app)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.screen is app.main
        assert "Rank 5 is 1 iteration ahead" in screen_text(app)


async def test_hostile_remote_text_is_shown_literally():
    snap = with_hostile_names(build_snapshot(nodes=2, per_node=2, scenario="barrier", culprit=0))
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 0)
        await pilot.pause()
        status = str(app.main.query_one("#status").render())
        assert "[bold]evil[/ ␛]0;pwned␇x.py:7" in status
        await pilot.press("enter")
        text = screen_text(app)
        assert "[bold]evil[/" in text and "␛]0;pwned␇" in text and "\x1b" not in text
        # the 10 kB thread name reads like no name: its length and a hash, as in a shared file (a few characters)
        assert re.search(r"<str len=10000 #[0-9a-f]{8}>", text) and "N" * 20 not in text
        await pilot.press("2")
        assert "[/]␛[31mred␛[0m" in screen_text(app)


async def test_first_ctrl_c_cancels_and_keeps_what_arrived_second_aborts():
    snap = build_snapshot(nodes=2, per_node=2)
    gate = asyncio.Event()

    class Slow(ReplaySource):
        async def snapshot(self, options=None):
            self._emit(NodeUpdate(dataclasses.replace(snap.nodes[0], state="collecting")))
            self._emit(RankUpdate(snap.ranks[0]))
            await gate.wait()
            kept = dataclasses.replace(snap, ranks=snap.ranks[:1], interrupted=True)
            self._emit(SnapshotDone(kept))
            return kept

        def cancel(self):
            super().cancel()
            gate.set()

    source = Slow([snap])
    app = HangscopeApp(source)
    async with app.run_test(size=SIZE) as pilot:
        # the streamed rank is drawn on the live-redraw timer
        await until(pilot, lambda: list(grid_of(app).model.ranks()), "the streamed rank in the grid")
        assert "collecting…" in screen_text(app)
        assert [r.rank for r in grid_of(app).model.ranks()] == [0]
        await pilot.press("ctrl+c")
        await settle(pilot)
        assert source.cancelled == 1
        assert "interrupted" in screen_text(app) and app.history[-1].interrupted
        await pilot.press("ctrl+c")
    assert app.return_code == 130
    assert source.closed


async def test_palette_lists_every_action_and_opens_gpu_tests():
    app = HangscopeApp(ReplaySource([build_snapshot()]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p", *"GPU tests")
        await until(pilot, lambda: "GPU tests (G)" in screen_text(app), "the palette's hit")
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, GpuUnavailableScreen)  # a recording: the tests need live nodes
        assert "hangscope hosts.txt --test sanity" in screen_text(app)
        await pilot.press("escape", "question_mark")
        assert isinstance(app.screen, HelpScreen)


def _no_rank_repr(monkeypatch) -> None:
    """A rank formatted whole is a bug at scale: Textual describes a worker by repr() of its work unless told
    otherwise, which for a thread handed a snapshot was every rank (seconds and gigabytes at 100,000 ranks)."""
    from app.model import RankSnapshot

    def refuse(self) -> str:
        raise AssertionError("a rank was formatted with repr()")

    monkeypatch.setattr(RankSnapshot, "__repr__", refuse)


async def test_export_writes_the_report_bundle(tmp_path, monkeypatch):
    snap = build_snapshot(nodes=2, per_node=2, culprit=3)
    app = HangscopeApp(ReplaySource([snap]))
    target = tmp_path / "report"
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        _no_rank_repr(monkeypatch)
        await pilot.press("e")
        assert isinstance(app.screen, PathScreen)
        await pilot.press("ctrl+a", "ctrl+k", *str(target), "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
    assert os.stat(target).st_mode & 0o777 == 0o700
    loaded, analysis = snapshot_from_json((target / "snapshot.json").read_text())
    assert loaded.ranks[3].threads[0].frames[2].iteration == (("step", "6"),)
    assert analysis is not None and "Rank 3" in analysis["verdict"]
    assert (target / "report.html").exists() and (target / "summary.md").exists()


async def test_strace_and_gdb_ask_then_fill_the_drill_down():
    recorded = build_snapshot(nodes=1, per_node=2, strace=True, gdb=True)
    plain = build_snapshot(nodes=1, per_node=2)
    source = ReplaySource([plain, recorded])
    app = HangscopeApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 1)
        await pilot.press("enter", "4")
        assert "Not collected. Press s" in screen_text(app)
        await pilot.press("s")
        assert "node01: strace -f -tt -p 4107" in screen_text(app)
        await pilot.press("y")
        await settle(pilot)
        assert source.calls[-1] == ("strace", ((("node01", 4107),), 2.0))
        assert "blocked in futex(FUTEX_WAIT_BITSET)" in screen_text(app)
        await pilot.press("g")
        assert "gdb -p 4107 -batch" in screen_text(app)
        await pilot.press("n")  # declined: nothing runs
        assert source.calls[-1][0] == "strace"


async def test_tree_view_counts_ranks_per_frame():
    snap = build_snapshot(nodes=4, per_node=2, scenario="dataloader", culprit=5)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("t")
        assert isinstance(app.screen, TreeScreen)
        text = screen_text(app)
        assert "8 all stacks" in text
        assert "7 all_reduce distributed_c10d.py:2501" in text
        assert "1 train train.py:40  rank 5 on node03" in text


async def test_a_loaded_snapshot_has_nothing_to_collect():
    source = loaded_source(build_snapshot())
    app = HangscopeApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "(loaded file)" in screen_text(app)
        await pilot.press("R", "w")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert source.calls == [("snapshot", None)] and not app.watching


async def test_watch_samples_without_pausing_the_ranks():
    snap = build_snapshot(nodes=1, per_node=2)
    source = ReplaySource([snap])
    app = HangscopeApp(source, interval=30)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.watching and "watch 30s" in screen_text(app)
        app._watch_tick()  # what the interval timer calls
        await settle(pilot)
        kind, _ = source.calls[-1]
        assert kind == "refresh" and source.options.nonblocking and not source.options.native
        await pilot.press("w")
        assert not app.watching


async def test_events_stream_into_the_grid_before_the_snapshot_is_done():
    app = HangscopeApp(ReplaySource([build_snapshot()]), start=False)
    async with app.run_test(size=SIZE) as pilot:
        app.collecting = True  # as while a snapshot() is in flight
        app._on_source_event(NodeUpdate(NodeStatus(name="gpu7", state="connecting")))
        snap = build_snapshot(nodes=1, per_node=2, prefix="gpu")
        for r in snap.ranks:
            app._on_source_event(RankUpdate(r))
        grid = grid_of(app)
        await until(pilot, lambda: len(grid.model.rows) == 2, "the live redraw")
        assert [r.name for r in grid.model.rows] == ["gpu7", "gpu01"]
        assert {c.kind for c in grid.model.rows[1].cells} == {"pending"}
        assert "gpu7: connecting" in screen_text(app)


async def test_a_flood_of_session_events_is_applied_in_few_messages_newest_first_and_in_pass_order(monkeypatch):
    # A 12,500-node pass emits ~260,000 node and rank updates: one app message each cost more than the redraws
    # they fed. They join one batch until it is applied; a finished snapshot closes the batch, so what comes
    # after it (the next pass) is not wiped when the snapshot is added.
    import app.ui.core as core

    applied = []
    real = core.HangscopeCore.on_session_batch

    def counting(self, message):
        applied.append(len(message.events))
        real(self, message)

    monkeypatch.setattr(core.HangscopeCore, "on_session_batch", counting)
    app = HangscopeApp(ReplaySource([build_snapshot()]), start=False)
    async with app.run_test(size=SIZE) as pilot:
        app.collecting = True
        first = build_snapshot(nodes=1, per_node=2, prefix="gpu")
        for state in ("connecting", "discovering", "collecting"):
            app._on_source_event(NodeUpdate(NodeStatus(name="gpu7", state=state)))
        for _ in range(500):  # the same two ranks again and again: the newest of each is what counts
            for r in first.ranks:
                app._on_source_event(RankUpdate(r))
        app._on_source_event(SnapshotDone(first))
        app._on_source_event(NodeUpdate(NodeStatus(name="gpu8", state="connecting")))  # the next pass begins
        await until(pilot, lambda: len(app.history) == 1 and applied == [3, 1], "the batches and the snapshot")
        assert app.live_nodes == {"gpu8": NodeStatus(name="gpu8", state="connecting")}, app.live_nodes
        assert not app.live_ranks


async def test_a_large_snapshot_is_analysed_in_a_thread_while_the_app_takes_keys(monkeypatch):
    # At 100,000 ranks the analysis takes seconds; on the event loop the app took no key meanwhile. A snapshot of
    # THREADED_VIEW_RANKS or more is analysed in a thread (here 1: every snapshot), against the samples before
    # it as the history holds them; until it lands the last picture stays, keys work, and a collection waits.
    import threading

    import app.ui.core as core

    release = threading.Event()
    calls = []
    real = core.build_view

    def slow(snap, earlier=()):
        calls.append((snap.taken_at, [e.taken_at for e in earlier]))
        assert release.wait(30), "the test never released the analysis"
        return real(snap, earlier)

    monkeypatch.setattr(core, "THREADED_VIEW_RANKS", 1)
    monkeypatch.setattr(core, "build_view", slow)
    _no_rank_repr(monkeypatch)
    first = build_snapshot(nodes=2, per_node=2)
    second = later(first, 10)
    app = HangscopeApp(ReplaySource([first, second]), start=False)
    async with app.run_test(size=SIZE) as pilot:
        app._on_source_event(SnapshotDone(first))
        await until(pilot, lambda: "analysing 4 ranks" in screen_text(app), "the analysis under way")
        assert not app.history
        await pilot.press("question_mark")  # a key, taken while the analysis runs
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        await pilot.press("escape")
        assert not app.start_collection("refresh")  # its snapshot is not in the history yet
        release.set()
        await until(pilot, lambda: len(app.history) == 1 and "snapshot 1/1" in screen_text(app), "the picture")
        app._on_source_event(SnapshotDone(second))
        await until(pilot, lambda: len(app.history) == 2 and "snapshot 2/2" in screen_text(app), "the second")
        assert "analysing" not in screen_text(app)
    assert calls == [(first.taken_at, []), (second.taken_at, [first.taken_at])]


async def test_history_is_bounded_by_the_ranks_it_holds(monkeypatch):
    import app.ui.core as app_module

    monkeypatch.setattr(app_module, "HISTORY_RANKS", 8)  # 4-rank snapshots: 2 fit, the floor keeps 3
    first = build_snapshot(nodes=2, per_node=2)
    source = ReplaySource([later(first, 10 * i) for i in range(6)])
    app = HangscopeApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for _ in range(5):
            app._watch_tick()  # a watch sample: never asks, never pauses the ranks
            await settle(pilot)
        assert len(app.history) == 3 and app.position == 2
        assert [s.taken_at - first.taken_at for s in app.history] == [30, 40, 50]
        assert "snapshot 3/3" in screen_text(app)
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert "snapshot 1/3" in screen_text(app)


async def test_who_waits_for_whom_shows_the_graph_and_enter_goes_to_the_culprit():
    snap = build_snapshot(nodes=2, per_node=2, culprit=3)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 0)
        await pilot.press("W")
        await pilot.pause()
        assert isinstance(app.screen, WaitsScreen)
        text = screen_text(app)
        graph = app.current_view.analysis.waits[0]
        assert f"culprit [{graph.confidence}]: " in text and "next: " in text
        assert re.search(r"ranks? 0-2 .*→ rank 3 .*iteration", text), text
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is app.main
        cell = grid_of(app).current
        assert cell is not None and cell.key == next(rank_key(r) for r in snap.ranks if r.rank == 3)


def test_every_palette_entry_is_an_app_action():
    from app.ui.commands import ACTIONS

    for name, _, action, _ in ACTIONS:
        assert hasattr(HangscopeApp, "action_" + action.split("(")[0]), name


async def test_d_in_the_drill_down_diffs_against_the_majority():
    snap = build_snapshot(nodes=2, per_node=2, culprit=2)
    app = HangscopeApp(ReplaySource([snap]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 2)
        await pilot.press("enter", "d")
        assert isinstance(app.screen, DiffScreen)
        assert "rank 2 is 1 iteration ahead of rank 0 (step=6 vs 5)" in screen_text(app)
        await pilot.press("escape", "escape", "ctrl+p", *"filter")
        await until(pilot, lambda: "Filter ranks (/)" in screen_text(app), "the palette's hit")
        await pilot.press("enter")
        await pilot.pause()
        assert app.main.query_one("#filter").has_class("-shown")


def _with_local(rank, name: str, value: str):
    """The rank with one more local in its main thread's `train` frame (what the node kept back in a large job)."""
    from app.model import Local
    threads = []
    for t in rank.threads:
        frames = tuple(dataclasses.replace(f, locals=f.locals + (Local(name, value),)) if f.function == "train" else f
                       for f in t.frames)
        threads.append(dataclasses.replace(t, frames=frames))
    return dataclasses.replace(rank, threads=tuple(threads))


async def test_a_large_jobs_rank_view_reads_every_local_from_the_node():
    """Past 64 nodes a pass carries only the locals the analysis reads; drilling into a rank asks its node for the
    rest (Session.detail) and the Locals tab shows them, saying so while they are read."""
    from app.model import CollectOptions
    snap = build_snapshot(nodes=2, per_node=2, culprit=3)
    snap = dataclasses.replace(snap, options=CollectOptions(locals=True))
    rank = snap.rank_by_number(3)
    full = _with_local(rank, "grad_norm_history", "[0.91, 0.88, 0.87]")
    source = ReplaySource([snap], details={rank_key(rank): full})
    app = HangscopeApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 3)
        await pilot.press("enter", "2")
        await until(pilot, lambda: "grad_norm_history" in screen_text(app), "the locals read from the node")
        assert ("detail", (rank_key(rank),)) in source.calls
        text = screen_text(app)
        assert "grad_norm_history = [0.91, 0.88, 0.87]" in text and re.search(r"step +=  ?6", text), text
        assert "being read from" not in text  # the note goes once they are there
        await pilot.press("escape")
        at_rank(app, 2)
        other = app.current_rank()
        await pilot.press("enter", "2")
        await until(pilot, lambda: ("detail", (rank_key(other),)) in source.calls, "the second rank's detail")
        await settle(pilot)
        assert "the node sent no other locals for this rank" in screen_text(app)  # nothing more: said, not hidden


async def test_a_small_jobs_rank_view_asks_no_node_for_locals():
    snap = build_snapshot(nodes=2, per_node=2, culprit=3)
    source = ReplaySource([snap])  # every local travelled with the pass
    app = HangscopeApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        at_rank(app, 3)
        await pilot.press("enter", "2")
        await settle(pilot)
        assert "step   = 6" in screen_text(app)
        assert not [c for c in source.calls if c[0] == "detail"]
