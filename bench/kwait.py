"""What reading the blocked threads' waits (workers/collect/kwait.py) adds to a dump's /proc read, on this machine.

    python3 bench/kwait.py [RUNS]      (default 50; prints a table of medians of the CPU time spent)

Two stand-in ranks of 20 threads: one like a torch rank (every thread in a futex or a condition wait: nothing to
read beyond the syscall line procfs already reads), one whose threads block on everything kwait names (pipes,
TCP to a local server, poll, epoll, wait4, a FIFO open, sleeps, futexes). Timed: procfs.collect alone, then with
kwait.annotate on a warm request cache (the cost per rank once the request's /proc/*/fd scan exists), and the
scan itself (paid once per request, by the first rank that needs an other end).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from workers import pstate  # noqa: E402
from workers.collect import fdindex, kwait, procfs  # noqa: E402

RANK = r'''
import os, select, socket, subprocess, sys, threading, time
mode, fifo = sys.argv[1], sys.argv[2]
n = 20
def futex():
    threading.Event().wait()
blockers = [futex] * (n - 1)
if mode == "mixed":
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(8)
    r, w = os.pipe()
    kid = subprocess.Popen(["sleep", "86400"])
    def recv():
        socket.create_connection(srv.getsockname()).recv(1)
    def poll():
        c = socket.create_connection(srv.getsockname()); c.settimeout(1000); c.recv(1)
    def epoll():
        e = select.epoll(); e.register(r, select.EPOLLIN); e.poll()
    def pipe():
        os.read(r, 1)
    def wait():
        os.waitpid(kid.pid, 0)
    def sleep():
        time.sleep(86400)
    def opener():
        open(fifo, "rb")
    blockers = [recv, recv, poll, poll, epoll, pipe, pipe, wait, sleep, opener] + [futex] * (n - 11)
for f in blockers:
    threading.Thread(target=f, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
'''


def median_ms(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    """The median CPU time of fn in this process, in ms: on a machine other jobs load, wall time mostly measures
    them (what the worker does is reads of /proc: its system time counts)."""
    samples = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        samples.append(time.process_time() - t0)
    return statistics.median(samples) * 1000


def paired_ms(base, more, runs: int) -> tuple:  # type: ignore[no-untyped-def]
    """(median of base, median of more), their runs interleaved so that both see the same load."""
    a, b = [], []
    for _ in range(runs):
        a.append(median_ms(base, 1))
        b.append(median_ms(more, 1))
    return statistics.median(a), statistics.median(b)


def blocked(pid: int) -> bool:
    threads = procfs.collect(pid)["threads"]
    return len(threads) >= 20 and all(t["state"] == "S" for t in threads)


def rank_rows(mode: str, pid: int, runs: int) -> list:
    info = pstate.read(pid)
    cache: dict = {}
    kwait.annotate(cache, pid, procfs.collect(pid)["threads"], info)  # warms the scan when it is needed
    waiting = sum(1 for t in procfs.collect(pid)["threads"] if t["syscall"] != "futex")
    base, more = paired_ms(lambda: procfs.collect(pid),
                           lambda: kwait.annotate(cache, pid, procfs.collect(pid)["threads"], info), runs)
    return [("%s rank (20 threads, %d not in a futex): procfs.collect" % (mode, waiting), base),
            ("  procfs.collect + kwait.annotate (warm request cache)", more)]


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    tmp = tempfile.mkdtemp()
    ranks = []
    try:
        for mode in ("futex", "mixed"):
            fifo = os.path.join(tmp, mode + ".fifo")
            os.mkfifo(fifo)
            p = subprocess.Popen([sys.executable, "-c", RANK, mode, fifo], stdout=subprocess.PIPE,
                                 start_new_session=True)
            assert p.stdout is not None and p.stdout.readline().startswith(b"ready")
            deadline = time.monotonic() + 30
            while not blocked(p.pid):
                if time.monotonic() > deadline:
                    raise SystemExit("rank %s did not block" % mode)
                time.sleep(0.05)
            ranks.append((mode, p))
        rows = []
        for mode, p in ranks:
            rows.extend(rank_rows(mode, p.pid, runs))
        cold = fdindex.FdIndex()
        scan = median_ms(lambda: fdindex.FdIndex().holders("pipe:[0]"), max(3, runs // 10))
        cold.holders("pipe:[0]")
        rows.append(("the /proc/*/fd scan, once per request (%d processes)" % cold.scanned, scan))
        print("| measurement (%d cpus, median of %d) | CPU ms |\n|---|---|" % (os.cpu_count() or 0, runs))
        for name, ms in rows:
            print("| %s | %.2f |" % (name, ms))
    finally:
        for _, p in ranks:
            try:
                os.killpg(p.pid, 9)
            except OSError:
                pass
            p.wait()
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
