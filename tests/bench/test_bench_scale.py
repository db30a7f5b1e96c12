"""bench/scale.py, the SIMULATION of thousands of nodes (recorded replies replayed through the real login side),
still runs end to end at a small size: every simulated rank is decoded, both passes complete without a timeout,
and the table names what it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
