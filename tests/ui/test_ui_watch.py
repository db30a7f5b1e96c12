"""`hangscope watch --tui`, driven by the real Watcher over a fake session that plays a job training then
hanging: the jobs with their rate as a sparkline, the nodes of the job under the cursor each with theirs, what
the watch said, the capture, and Enter on it opening the capture's snapshot (the opener injected)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, List

from app.model import CollectOptions, ProgressCounters, Snapshot, TcpSocket
from app.session.session import WorkerCost
from app.ui.watch import WatchApp
from app.watch import OutDir, WatchOptions, Watcher
from test_ui_support import build_snapshot, screen_text, until

JOB = "10.0.0.1:29500"
SIZE = (140, 44)


class FakeSession:
    """Plays a 2-node job whose sockets move for `moving` samples and then never again."""

    def __init__(self, moving: int) -> None:
        self.moving = moving
        self.samples = 0
        self.options = dataclasses.make_dataclass("O", [("collect", CollectOptions)])(CollectOptions(locals=True))
        self.base = build_snapshot(nodes=2, per_node=2, culprit=3)
        self.closed = False

    def _ranks(self, at: float, sent: int) -> tuple:
        out = []
        for r in self.base.ranks:
            sock = TcpSocket(local=f"10.0.0.{r.rank}:4000", peer="10.0.0.9:5000", state="ESTABLISHED",
                             bytes_acked=sent * (1 + (r.rank or 0) % 2), bytes_received=sent)
            out.append(dataclasses.replace(r, job=JOB, master_port=29500, sockets=(sock,),
                                           counters=ProgressCounters(at=at, state="S", utime=1.0, stime=0.0)))
        return tuple(out)

    async def sample(self) -> Snapshot:
        self.samples += 1
        at = time.time()
        sent = 1_000_000 * min(self.samples, self.moving)  # a job's data: above control traffic (BULK_RATE)
        ranks = tuple(dataclasses.replace(r, threads=(), collected=False) for r in self._ranks(at, sent))
        return Snapshot(taken_at=at, nodes=self.base.nodes, ranks=ranks)

    def pg_timeouts(self) -> dict:
        return {}

    def worker_costs(self) -> dict:
        return {n.name: WorkerCost(0.001 * self.samples, None, 42) for n in self.base.nodes}

    def use(self, collect: CollectOptions) -> None:
        self.options.collect = collect

    async def snapshot(self) -> Snapshot:
        return dataclasses.replace(self.base, taken_at=time.time(), ranks=self._ranks(time.time(), 1_000_000 * self.moving))

    async def refresh(self, **_: Any) -> Snapshot:
        return await self.snapshot()

    def cancel(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


async def test_the_watch_screen_shows_the_jobs_rates_the_capture_and_opens_it(tmp_path: Path) -> None:
    session = FakeSession(moving=4)
    out = OutDir(str(tmp_path / "out"), 5)
    out.prepare()
    opened: List[str] = []

    async def opener(path: str) -> None:
        opened.append(path)

    options = WatchOptions(every=0.5, stall=1.5, slow=0.5, keep=5, out=str(tmp_path / "out"))
    app = WatchApp(lambda on_event: Watcher(session, options, CollectOptions(locals=True), out, on_event),
                   title="hosts.txt", opener=opener)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.watcher is not None and len(app.watcher.captures) == 1, "a capture", 60)
        await pilot.pause()
        text = screen_text(app)
        assert "hangscope watch" in text and "hosts.txt" in text and "1 capture" in text
        assert JOB in text and "stalled" in text
        assert any(ch in text for ch in "▂▃▄▅▆▇█"), "the job's rate over time as a sparkline"
        assert "node01" in text and "node02" in text, "the job's nodes, each with its own"
        said = "\n".join(app.said)
        assert "has made no progress for" in said and "captured (hang)" in said, said
        capture = app.watcher.captures[0]
        assert os.path.isdir(capture.path)
        await pilot.press("c")
        await pilot.press("enter")
        await until(pilot, lambda: opened, "the capture to be opened")
        assert opened == [f"{capture.path}/snapshot.json"]
        await pilot.press("q")
    assert session.closed, "quitting closes the workers"


async def test_ctrl_c_quits_the_watch_screen_as_q_does(tmp_path: Path) -> None:
    """In raw mode Ctrl+C is a key: Textual's own binding only says how to quit; the watch quits on it, closing
    its workers (the blind inputs-w set: a watch TUI kept running through Ctrl+C)."""
    session = FakeSession(moving=100)
    out = OutDir(str(tmp_path / "out"), 5)
    out.prepare()
    options = WatchOptions(every=0.5, stall=60, slow=0.0, keep=5, out=str(tmp_path / "out"))
    app = WatchApp(lambda on_event: Watcher(session, options, CollectOptions(locals=True), out, on_event))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.watcher is not None and session.samples >= 1, "a first sample", 30)
        await pilot.press("ctrl+c")
        await until(pilot, lambda: session.closed, "the watch to close its workers", 10)
    assert app.return_code == 0 and session.closed


async def test_a_capture_that_cannot_be_opened_here_says_why_and_how(tmp_path: Path) -> None:
    """Enter opens a capture by handing the terminal to `hangscope --load`; where the terminal cannot be handed over
    (Textual's headless driver, as some terminals), or the viewer fails, the watch says so with the command to run,
    instead of coming back as if nothing had been asked."""
    session = FakeSession(moving=4)
    out = OutDir(str(tmp_path / "out"), 5)
    out.prepare()
    options = WatchOptions(every=0.5, stall=1.5, slow=0.5, keep=5, out=str(tmp_path / "out"))
    app = WatchApp(lambda on_event: Watcher(session, options, CollectOptions(locals=True), out, on_event))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.watcher is not None and len(app.watcher.captures) == 1, "a capture", 60)
        capture = app.watcher.captures[0]
        await pilot.press("c")
        await pilot.press("enter")
        await until(pilot, lambda: any("could not open the capture" in x for x in app.said), "the failure said")
        said = "\n".join(app.said)
        assert f"open it with `hangscope --load {capture.path}/snapshot.json`" in said, said
        await pilot.press("q")
