"""bench/scale.py, the SIMULATION of thousands of nodes (recorded replies replayed through the real login side),
still runs end to end at a small size: every simulated rank is decoded, both passes complete without a timeout,
and the table names what it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "scale.py"


def test_bench_scale_replays_recorded_replies_through_the_login_side(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    done = subprocess.run([sys.executable, str(BENCH), "--sizes", "20", "--json", str(out)], capture_output=True,
                          text=True, timeout=240, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SIMULATION" in done.stdout and "| 20 x 8 (small) |" in done.stdout, done.stdout
    (row,) = json.loads(out.read_text())
    assert row["ranks_seen"] == 160, row
    assert row["pass1_failed"] == 0 and row["refresh_failed"] == 0, row
    assert row["headline"].startswith("hangscope:"), row
    assert row["bytes_node"] > 0 and row["cpu_ms_node"] > 0, row


def test_bench_scale_ui_times_the_tuis_first_picture_and_refresh_over_the_same_fake_nodes(tmp_path: Path) -> None:
    # --ui: the same SIMULATION through the TUI as `hangscope HOSTS` opens it: every simulated rank reaches the
    # app's snapshot, the verdict line names the lead, the refresh (R, confirmed) completes, nothing timed out.
    out = tmp_path / "scale-ui.json"
    done = subprocess.run([sys.executable, str(BENCH), "--sizes", "20", "--ui", "--json", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 20 x 8 (small, TUI) |" in done.stdout and "TUI first picture s" in done.stdout, done.stdout
    (row,) = json.loads(out.read_text())
    assert row["ranks_seen"] == 160 and row["pass1_timed_out"] == 0 and row["refresh_timed_out"] == 0, row
    assert row["refresh_ranks_seen"] == 160 and row["refresh_failed"] == 0, row
    assert row["first_picture_s"] > 0 and row["refresh_s"] > 0 and row["events"] >= 20 * (8 + 1), row
    assert "rank 1 (pid 58 on sim00000)" in row["verdict"], row


def test_bench_scale_floor_prices_what_the_pass_builds(tmp_path: Path) -> None:
    # The floor's "objects" row constructs, per rank, the model objects the real pass built (frames shared, as a
    # stack id wire shares them): every kind of a rank's parts is among them, the ranks it constructs equal the
    # snapshot's, and the table's floor is the sum of its parts.
    sys.path[:0] = [str(ROOT / "bench")]
    try:
        import scale_floor
    finally:
        del sys.path[0]
    snap, cpu = scale_floor.pass_one(4, "small")
    assert len(snap.ranks) == 32 and cpu > 0
    calls = scale_floor.constructions(snap.ranks)
    built = [make(**kw) for make, kw in calls]
    kinds = {type(b).__name__ for b in built}
    assert {"RankSnapshot", "TcpSocket", "ProgressCounters", "ThreadStack"} <= kinds, kinds
    ranks = [b for b in built if type(b).__name__ == "RankSnapshot"]
    assert ranks == list(snap.ranks)
    out = tmp_path / "floor.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "scale_floor.py"), "--nodes", "20", "--repeat", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SIMULATION" in done.stdout and "**floor: objects + analysis + parse**" in done.stdout, done.stdout
    row = json.loads(out.read_text())
    assert row["ranks"] == 160 and row["objects_per_rank"] >= 5, row
    assert all(row[k] > 0 for k in ("pass_us", "objects_us", "analysis_us", "parse_us")), row
    assert abs(row["floor_us"] - (row["objects_us"] + row["analysis_us"] + row["parse_us"])) < 1e-6, row


@pytest.mark.parametrize("shape, frames", [("deep_ranked", 50), ("small_ranked", 1)])
def test_bench_scale_ranked_shapes_give_each_simulated_rank_its_own_locals(tmp_path: Path, shape: str,
                                                                           frames: int) -> None:
    # The harsh shapes: a recording with the stand-in's `ready` argument (in every frame that keeps it: all of
    # the deep recursion's) ending in each rank's global number, as a job that passes its rank down its stack.
    # Two nodes' bytes for the same recorded rank differ in exactly that, in every such frame; the shape runs.
    sys.path[:0] = [str(ROOT / "bench")]
    try:
        import scale
    finally:
        del sys.path[0]
    rec = scale.load_recording(shape)
    dumps = [t for t in rec.after[0] if b'"dump"' in t and b'"ready"' in t]
    assert len(dumps) == scale.RANKS_RECORDED
    for node in (0, 5):
        values = {b"host": b"sim", b"node": node, b"world": 48, b"id": 1}
        values.update({b"r%d" % i: node * 8 + i for i in range(scale.RANKS_RECORDED)})
        ends = set()
        for line in dumps:
            kept = json.loads(line % values)["data"]["dump"]["threads"][0]["locals"]
            readies = {v for _, name, v, _ in kept if name == "ready"}
            assert len(readies) == 1 and sum(1 for _, name, _, _ in kept if name == "ready") > frames, readies
            ends.add(next(iter(readies)).rsplit("/", 1)[1])
        assert ends == {f'ready-{node * 8 + i}"' for i in range(scale.RANKS_RECORDED)}, ends
    out = tmp_path / "ranked.json"
    done = subprocess.run([sys.executable, str(BENCH), "--sizes", "4", "--shape", shape, "--json", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["ranks_seen"] == 32 and row["pass1_failed"] == 0 and row["refresh_failed"] == 0, row
