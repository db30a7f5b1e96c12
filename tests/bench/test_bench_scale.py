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
