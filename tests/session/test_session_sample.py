"""Session.sample(): the cheap sample hangscope watch takes, on this machine (the local transport): discovery
only, the ranks' counters and sockets, no stacks, no ptrace (the rank is never traced, never stopped); the
worker's own CPU and the script's process-group timeout come back beside it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

from app.session import Session, SessionOptions

SCRIPT = """
import datetime, time
def init_process_group(*a, **k): pass
init_process_group("gloo", timeout=datetime.timedelta(minutes=9))
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


def test_a_sample_reads_counters_without_stacks_and_never_traces_the_rank(tmp_path: Path) -> None:
    (tmp_path / "rank.py").write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, "rank.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=dict(os.environ, RANK="0", WORLD_SIZE="1",
                                                               MASTER_ADDR="127.0.0.1", MASTER_PORT="29998"))
    traced = []
    stop = threading.Event()

    def watch_tracer() -> None:  # the rank's TracerPid, read all along: a ptrace attach would show here
        while not stop.is_set():
            try:
                with open(f"/proc/{proc.pid}/status") as f:
                    traced.extend(line for line in f if line.startswith("TracerPid:") and line.split()[1] != "0")
            except OSError:
                return
            stop.wait(0.002)

    async def main() -> tuple:
        session = Session(None, SessionOptions(pids=(proc.pid,)))
        try:
            first = await session.sample()
            second = await session.sample()
            return first, second, session.worker_costs(), session.pg_timeouts()
        finally:
            await session.close()

    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        spy = threading.Thread(target=watch_tracer)
        spy.start()
        try:
            first, second, costs, timeouts = asyncio.run(main())
        finally:
            stop.set()
            spy.join()
        assert [r.pid for r in second.ranks] == [proc.pid]
        r = second.ranks[0]
        assert not r.collected and r.threads == () and r.counters is not None and r.job
        assert second.ranks[0].counters.at > first.ranks[0].counters.at
        assert traced == [], "a cheap sample never attaches to the rank"
        (node, cost), = costs.items()
        assert cost.worker_cpu is not None and cost.worker_cpu > 0 and cost.pid
        (key, timeout), = timeouts.items()
        assert key[1] == proc.pid and timeout.seconds == 540 and timeout.where == "rank.py:4"
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=10)
