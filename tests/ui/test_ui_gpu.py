"""The GPU tests from the TUI: G, choose, confirm, progress, results; for real where it is cheap.

Local tests run the real runner on this machine (a local worker, 2 gloo ranks with this interpreter's torch,
as tests/gpu/test_gpu_local.py does); the cluster test runs net and sanity over SSH from a TUI on the hung job.
Results that need what this machine cannot produce (a 6-node pair matrix, GPUs held by a job) are built from
real parts: the pair schedule fed with outcomes, inventories parsed from nvidia-smi output.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import secrets
import socket
import sys
from pathlib import Path
from typing import List, Optional

import pytest
from rich.console import Console

from app.gpu.inventory import GpusBusyError, busy, node_inventory
from app.gpu import model as gm
from app.gpu.model import GpuTestResults, NetReport, NodeNet, PortCheck, RankResult
from app.gpu.options import GpuTestOptions
from app.gpu.schedule import Outcome, PairIsolation
from app.hosts import HostSpec
from app.model.rank import rank_key
from app.session import SessionOptions
from app.ui.app import HangscopeApp
from app.ui.gpu_plan import Plan, Progress, default_nodes
from app.ui.screens.dialogs import ConfirmScreen, HelpScreen
from app.ui.screens.gpu import GpuProgressScreen, GpuSetupScreen, GpuUnavailableScreen
from app.ui.screens.gpu_results import GpuResultsScreen, result_parts
from app.ui.source import GpuAccess, LiveSource, ReplaySource, loaded_source
from app.ui.view import build_view
from test_ui_support import build_snapshot, screen_text, settle, until
from waiting import wait_until_async

SIZE = (130, 40)
PY = sys.executable  # has torch: it stands for the job's interpreter
NO_TORCH = "/usr/bin/python3"
MARK = b"NCCL_HANGSCOPE_UI_TEST="  # an extra setting passed to the test's ranks: finds what this test started


class LocalGpuSource(ReplaySource):
    """A recorded job whose GPU tests run for real on this machine (hosts None: a local worker)."""

    def __init__(self, options: GpuTestOptions, snapshot=None) -> None:
        super().__init__([snapshot or build_snapshot(nodes=2, per_node=2, culprit=3)])
        self.access = GpuAccess(None, SessionOptions(python=PY), options)

    def gpu_access(self) -> Optional[GpuAccess]:
        return self.access


def tagged(**kw) -> tuple[GpuTestOptions, bytes]:
    tag = secrets.token_hex(6)
    return GpuTestOptions(python=PY, env=(("NCCL_HANGSCOPE_UI_TEST", tag),), **kw), MARK + tag.encode()


def tagged_pids(needle: bytes) -> List[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                    found.append(int(name))
    return found


async def until_gone(needle: bytes, timeout: float = 20.0) -> List[int]:
    with contextlib.suppress(TimeoutError):  # polling under a deadline: the kernel reaps asynchronously
        await wait_until_async(lambda: not tagged_pids(needle), timeout, "the tagged processes to go", interval=0.1)
    return tagged_pids(needle)


def text_of(parts) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    for p in parts:
        console.print(p)
    return console.export_text()


# -- choosing the nodes ------------------------------------------------------------------------------------


def test_default_nodes_are_the_jobs_the_marked_ones_or_the_suspect_with_good_partners() -> None:
    snap = build_snapshot(nodes=8, per_node=2, culprit=5, failed=[6])  # rank 5 on node03; node07 failed
    view = build_view(snap)
    hosts = [f"node{i:02d}" for i in range(1, 10)]  # node09: in the hosts file, no ranks of the job
    job = [f"node{i:02d}" for i in (1, 2, 3, 4, 5, 6, 8)]
    assert default_nodes("sanity", hosts, view, set()) == job
    assert default_nodes("net", hosts, view, set()) == job
    assert default_nodes("pairs", hosts, view, set()) == ["node01", "node02", "node03", "node04"]
    marked = {("node05", 4150), ("node02", 4110)}
    assert default_nodes("pairs", hosts, view, marked) == ["node02", "node05"]
    assert default_nodes("bench", hosts, None, set()) == hosts  # nothing collected yet: every host


async def test_a_loaded_snapshot_says_the_tests_need_live_nodes() -> None:
    app = HangscopeApp(loaded_source(build_snapshot()))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("G")
        assert isinstance(app.screen, GpuUnavailableScreen)
        text = screen_text(app)
        assert "the GPU tests need live nodes" in text and "hangscope hosts.txt --test pairs" in text
        await pilot.press("escape", "question_mark")
        assert isinstance(app.screen, HelpScreen)


async def test_marked_ranks_choose_the_nodes_and_space_toggles_one() -> None:
    snap = build_snapshot(nodes=4, per_node=2, culprit=5)
    source = LocalGpuSource(GpuTestOptions(), snap)  # four hosts: only the setup is used, nothing connects
    source.access = GpuAccess([HostSpec(name=n.name, host=n.name) for n in snap.nodes], SessionOptions())
    app = HangscopeApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for rank in (snap.rank_by_number(2), snap.rank_by_number(7)):  # on node02 and node04
            assert app.main.grid.move_to((rank.node, rank.pid))
            await pilot.press("space")
        await pilot.press("G")
        text = screen_text(app)
        assert "sanity on 2 nodes: node02, node04" in text and "node04  marked" in text
        await pilot.press("p")  # marks win over the suspect's default for pairs
        assert "pairs on 2 nodes: node02, node04" in screen_text(app)
        assert "cannot be told from a slow node" in screen_text(app)  # fewer than 3 nodes: said before running
        await pilot.press("space")  # the list's first node: node01
        assert "pairs on 3 nodes: node01, node02, node04" in screen_text(app)
        await pilot.press("escape")
        assert app.screen is app.main and not app.gpu_tests.running


# -- running for real on this machine -----------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("torch_support")
async def test_bench_from_the_tui_shows_progress_then_ranks_and_busbw(tmp_path) -> None:
    options, needle = tagged(procs_per_node=2, sizes=(4096, 1 << 20), iters=3, warmup=1, timeout=30)
    app = HangscopeApp(LocalGpuSource(options))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("G")
        assert isinstance(app.screen, GpuSetupScreen)
        text = screen_text(app)
        assert socket.gethostname() in text and "sanity on 1 node" in text
        assert "Never starts on GPUs the hung job still holds" in text
        await pilot.press("b")
        assert "bench on 1 node" in screen_text(app)
        await pilot.press("enter")
        assert isinstance(app.screen, GpuProgressScreen)
        await until(pilot, lambda: "local 1" in screen_text(app) and "■" in screen_text(app),
                    "both ranks' phases on the progress screen", timeout=60)
        text = await results_with(pilot, app, lambda t: "peak busbw" in t, "the bench results", timeout=90)
        assert "GPU test bench on 1 node," in text and ": OK" in text
        assert "OK: all_reduce sum = world size 2" in text  # the verdict in words
        assert text.count("sum 2") == 2  # per rank: OK with the checked sum
        assert "busbw (GB/s)" in text and "4K" in text and "1M" in text and "peak busbw" in text
        await pilot.press("escape")
        assert app.screen is app.main
        await pilot.press("ctrl+p", *"GPU test results")
        await until(pilot, lambda: "GPU test results" in screen_text(app), "the palette's hit")
        await pilot.press("enter")
        await results_with(pilot, app, lambda t: "peak busbw" in t, "the results again")
        await pilot.press("escape", "e", "ctrl+a", "ctrl+k", *str(tmp_path / "report"), "enter")
        await app.workers.wait_for_complete()
    assert await until_gone(needle) == []
    saved = json.loads((tmp_path / "report" / "tests.json").read_text())  # the report carries the results
    assert saved["kind"] == "bench" and saved["ok"] and len(saved["runs"][0]["bench"]) == 2


@pytest.mark.timeout(60)
async def test_a_rank_that_cannot_start_is_shown_broken_with_its_error() -> None:
    app = HangscopeApp(LocalGpuSource(GpuTestOptions(python=NO_TORCH, timeout=30)))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("G", "enter")
        text = await results_with(pilot, app, lambda t: "last output lines:" in t, "the results", timeout=45)
        assert "PROBLEM FOUND" in text and "not started *" in text and "No module named" in text
        assert "last output lines:" in text


@pytest.mark.torch
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("torch_support")
async def test_cancel_stops_the_test_and_every_process_of_it() -> None:
    # a sweep far too long to finish: it is cancelled once the ranks are in it
    options, needle = tagged(procs_per_node=2, sizes=(64 << 20,), iters=100000, warmup=1, timeout=60)
    app = HangscopeApp(LocalGpuSource(options))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("G", "b", "enter")
        await until(pilot, lambda: screen_text(app).count("□□ bench") == 2, "both ranks in the sweep", timeout=90)
        assert len(tagged_pids(needle)) >= 3  # torchrun and its two ranks
        await pilot.press("escape")  # back to the grid: the test goes on ...
        assert app.screen is app.main and app.gpu_tests.running
        await pilot.press("G")  # ... and G shows its progress again, not a new setup
        assert isinstance(app.screen, GpuProgressScreen)
        await pilot.press("c")
        await results_with(pilot, app, lambda t: "INTERRUPTED" in t, "the interrupted results", timeout=60)
        assert not app.gpu_tests.running
    assert await until_gone(needle) == []


@pytest.mark.torch
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("torch_support")
async def test_quitting_while_a_test_runs_leaves_no_process_of_it() -> None:
    options, needle = tagged(procs_per_node=2, sizes=(64 << 20,), iters=100000, warmup=1, timeout=60)
    app = HangscopeApp(LocalGpuSource(options))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("G", "b", "enter")
        await until(pilot, lambda: len(tagged_pids(needle)) >= 3, "torchrun and its two ranks", timeout=90)
        await pilot.press("escape", "q")
    assert await until_gone(needle) == []


# -- what the results screen shows ------------------------------------------------------------------------


def test_the_pair_matrix_and_its_verdict_in_words() -> None:
    sched = PairIsolation([f"node0{i}" for i in range(1, 5)], singles=False)
    while tests := sched.next_round():  # node03's link is slow: every pair with it runs at a tenth
        for t in tests:
            sched.record(t, Outcome(status="ok", busbw=0.1 if "node03" in t else 1.0, run_id="-".join(t)))
    report = sched.report()
    results = GpuTestResults(kind="pairs", started_at=0, nodes=report.units, pairs=report, verdict=report.verdict)
    text = text_of(result_parts(results))
    assert "PROBLEM FOUND" in text and "verdict: node node03's link is slow" in text
    row = next(line for line in text.splitlines() if line.startswith("node03"))
    assert "slow 0.1" in row and "ok" not in row.replace("node03", "")


def test_reachability_table_and_remote_text_shown_literally() -> None:
    hostile = "[bold red]x[/]\x1b]0;owned\x07"
    net = NetReport(nodes=(NodeNet("node01", hostname=hostile),),
                    checks=(PortCheck("node01", "node02", 29500, "open", "10.0.0.2", 0.4),
                            PortCheck("node02", "node01", 29500, "closed", "10.0.0.1", error=hostile)),
                    findings=(f"node02 cannot reach node01:29500: closed {hostile}",))
    run = gm.TestRun("sanity-1", "sanity", ("node01",), "failed",
                  ranks=(RankResult("node01", 0, 0, "broken", "init_pg", error=hostile, culprit=True),),
                  log=(f"[node01:0] {hostile}",))
    text = text_of(result_parts(GpuTestResults(kind="net", started_at=0, net=net)))
    assert "node01  node02:29500  10.0.0.2  open" in text and "closed" in text
    assert "[bold red]x[/]␛]0;owned␇" in text and "\x1b" not in text
    text = text_of(result_parts(GpuTestResults(kind="sanity", started_at=0, runs=(run,))))
    assert "broken *" in text and "[bold red]x[/]␛]0;owned␇" in text and "\x1b" not in text


async def test_gpus_held_by_the_job_are_shown_and_nothing_runs_without_a_yes() -> None:
    # Busy GPUs cannot be produced on this CPU-only machine: the holders come from nvidia-smi's own output.
    inv = node_inventory("gpu01", {"smi": {
        "status": "ok", "via": "nvidia-smi", "gpu_fields": "index,uuid,name,memory.used,memory.total",
        "gpus_csv": "0, GPU-5f1b, NVIDIA H100 80GB HBM3, 79213, 81559\n",
        "app_fields": "pid,gpu_uuid,used_memory,process_name", "apps_csv": "2812731, GPU-5f1b, 79190, python3\n"}})
    app = HangscopeApp(LocalGpuSource(GpuTestOptions()))
    answers: list = []

    async def ask() -> None:
        answers.append(await app.gpu_tests._confirm_busy(GpusBusyError(busy([inv]))))

    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.run_worker(ask(), group="t")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
        text = screen_text(app)
        assert "1 GPU(s) are still held" in text and "gpu01: pid 2812731 python3 holds GPU-5f1b (79190 MiB)" in text
        await pilot.press("n")
        await settle(pilot)
    assert answers == [False]


def test_progress_text_follows_the_events() -> None:
    from app.gpu import events as ev

    p = Progress(Plan("pairs", ("a", "b", "c", "d")), started=0.0)
    p.apply(ev.RoundStarted("nodes", 2, (("a", "b"), ("c", "d"))))
    p.apply(ev.RunStarted("pair-1", "pair", ("a", "b"), "a", 29501))
    p.apply(ev.RankProgress("pair-1", "a", 0, 0, "init_pg"))
    p.apply(ev.RankProgress("pair-1", "b", 1, 0, "store_connect"))
    text = p.text(now=12.0).plain
    assert "nodes: round 2: a+b  c+d" in text and "running, 12 s" in text
    assert "pair-1  running  master a:29501" in text
    assert "rank 0    local 0   ■■■■■■□□□□□ init_pg" in text and "□ store_connect" in text


# -- on the SSH test cluster, from a TUI on the hung job ------------------------------------------------------


def cluster_test_processes(c) -> list:
    """Processes of any GPU test still present on the cluster's nodes (they carry the runner's mark)."""
    found = []
    for node in c.nodes:
        for p in node.procs():
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{p.host_pid}/environ").read_bytes().split(b"\0")
                if any(e.startswith(b"HANGSCOPE_GPUTEST=") for e in environ):
                    found.append((node.name, p.pid, p.comm))
    return found


async def setup_shown(pilot, app) -> str:
    """The GPU test setup's text once it is drawn with its plan: the plan line is filled in when the screen is
    mounted, which a loaded machine may not have done yet when the key press returns."""
    plan = re.compile(r"\b(sanity|bench|pairs|net) on \d+ nodes?\b")
    try:
        await until(pilot, lambda: isinstance(app.screen, GpuSetupScreen) and bool(plan.search(screen_text(app))),
                    "the GPU test setup with its plan", timeout=30)
    except TimeoutError:
        raise AssertionError(f"no GPU test setup with its plan after 30 s: {type(app.screen).__name__} shows\n"
                             f"{screen_text(app)}") from None
    return screen_text(app)


NET_ROW = re.compile(r"\s*node0\d\s+\S+:\d+\s")
SANITY_ROW = re.compile(r"\s*node0\d\s+\d+\s")


async def results_with(pilot, app, ready, what: str, timeout: float = 30) -> str:
    """The GPU test results' text once the screen is up and its picture holds `ready` (a predicate on the text):
    the screen is pushed before its content is laid out and drawn, so one picture, one deadline."""
    def drawn() -> bool:
        return isinstance(app.screen, GpuResultsScreen) and ready(screen_text(app))
    try:
        await until(pilot, drawn, what, timeout=timeout)
    except TimeoutError:
        raise AssertionError(f"no {what} after {timeout:.0f} s: {type(app.screen).__name__} shows\n"
                             f"{screen_text(app)}") from None
    return screen_text(app)


async def results_shown(pilot, app, row: re.Pattern, rows: int, what: str, timeout: float) -> str:
    """results_with(), ready once `rows` node rows are drawn (CI saw the net results screen with none of them yet)."""
    return await results_with(pilot, app, lambda text: sum(1 for line in text.splitlines() if row.match(line)) >= rows,
                              f"{what} with {rows} node rows", timeout=timeout)


@pytest.mark.cluster
@pytest.mark.torch
@pytest.mark.timeout(180)
async def test_from_the_suspect_in_the_grid_to_net_and_sanity_results_over_ssh(cluster, hung_job) -> None:
    hosts = [HostSpec(name=n, host=n, source="test") for n in cluster.names]
    options = SessionOptions(ssh_config=(str(cluster.ssh_config),), known_hosts=(str(cluster.known_hosts),),
                             identity=(str(cluster.key),), connect_timeout=10)
    app = HangscopeApp(LiveSource(hosts, options))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: bool(app.history) and not app.collecting, "the hung job's snapshot", timeout=60)
        await pilot.press("G")  # a suspect in the grid: pair isolation, on its node and healthy partners
        text = await setup_shown(pilot, app)
        assert "node03  suspect" in text and "pairs on 4 nodes: node01, node02, node03, node04" in text
        await pilot.press("n", "enter")  # the network check instead: does every node reach the job's master?
        text = await results_shown(pilot, app, NET_ROW, 4, "the net results", timeout=60)
        rows = [line for line in text.splitlines() if NET_ROW.match(line)]
        assert len(rows) == 4 and all(line.split()[3] == "open" for line in rows), text
        assert "every node reaches" in text and "NCCL would use eth0 on every node" in text
        await pilot.press("escape")
        # the results screen is gone before a key reaches the grid (on a loaded machine the marks went to it)
        await until(pilot, lambda: app.screen is app.main, "the main screen again", timeout=30)
        for node in ("node01", "node02"):  # mark a rank on each of two nodes: the test runs on their nodes
            rank = next(r for r in app.history[-1].ranks if r.node == node)
            assert app.main.grid.move_to((rank.node, rank.pid))
            await pilot.press("space")
            key = rank_key(rank)
            await until(pilot, lambda key=key: key in app.marked, f"{node}'s rank marked", timeout=30)
        await pilot.press("G")
        text = await setup_shown(pilot, app)
        assert "sanity on 2 nodes: node01, node02" in text, text
        await pilot.press("enter")  # the job's own python, taken from its ranks' /proc/PID/exe
        text = await results_shown(pilot, app, SANITY_ROW, 2, "the sanity results", timeout=120)
        assert "GPU test sanity on 2 nodes," in text and ": OK" in text, text
        assert "OK: all_reduce sum = world size 2, barrier passed (gloo)" in text
        assert text.count("sum 2") == 2 and "node02  1     0      OK" in text
    assert cluster_test_processes(cluster) == []
