"""Worker timings on this machine: hello, discovery (psutil and /proc), dumps of N plain-Python ranks.

    python3 bench/worker.py [N]      (default 32 ranks; prints a table, median of 5 runs each)

"start to hello, CPU" is the worker as hangscope ships it (the first stage, the payload on stdin, the node's
/usr/bin/python3 -I -S): the CPU seconds (user + system) of the whole start, from exec to the hello and EOF,
the mean over 20 starts. It is what every node pays at every session before its first request.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
sys.path.insert(0, os.path.join(HERE, ".."))

from worker_client import WorkerProc  # noqa: E402
from worker_targets import start_rank  # noqa: E402


def timed(fn, runs: int = 5) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def start_cpu(runs: int = 20) -> float:
    """Mean CPU seconds of one shipped worker's start (exec, payload, imports, hello, exit at EOF)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        WorkerProc(python="/usr/bin/python3", isolated=True).close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / runs


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    ranks = []
    try:
        for i in range(n):
            ranks.append(start_rank(i))
        rows = []

        def hello() -> None:
            WorkerProc().close()

        rows.append(("worker start to hello (python3 -m workers)", timed(hello)))
        rows.append(("worker start to hello, CPU (as shipped: stage + payload, mean of 20)", start_cpu()))
        with WorkerProc() as w, WorkerProc(python="/usr/bin/python3", isolated=True) as wi:
            rows.append(("discover, psutil (%d ranks)" % n, timed(lambda: w.call("discover"))))
            rows.append(("discover, /proc only", timed(lambda: wi.call("discover"))))
            items, _ = w.call("discover")
            mine = {r.pid for r in ranks}
            targets = [{"pid": i["pid"], "start_time": i["start_time"]} for i in items if i["pid"] in mine]
            for conc in (1, 2, 4):
                rows.append(("dump %d ranks, concurrency %d" % (n, conc),
                             timed(lambda conc=conc: w.call("dump", {"targets": targets, "concurrency": conc}))))
            rows.append(("dump %d ranks, --locals + loops + source" % n,
                         timed(lambda: w.call("dump", {"targets": targets, "locals": True, "loops": True}))))
            rows.append(("dump 1 rank, --native", timed(lambda: w.call("dump", {"targets": targets[:1],
                                                                                "native": True}))))
            rows.append(("strace 1 rank, seconds=0.5", timed(lambda: w.call(
                "strace", dict(targets[0], seconds=0.5)), runs=3)))
        print("| measurement (%d cpus) | median seconds |\n|---|---|" % os.cpu_count())
        for name, secs in rows:
            print("| %s | %.3f |" % (name, secs))
    finally:
        for r in ranks:
            r.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
