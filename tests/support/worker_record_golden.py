"""Re-record the golden worker outputs in tests/data/ from a real hung torch job (not a test module).

    python3 tests/support/worker_record_golden.py

Starts the demo job (`skip` scenario: 2 gloo ranks under torchrun --standalone, rank 1 one step ahead),
drives a real worker over the protocol, and writes what it answered: hello, discover, dumps (plain,
--locals with loops, --native), strace, gdb, a ptrace-denied dump as another user, and a --locals dump
of the `dataloader` scenario (a rank blocked fetching its next batch). tests/decode/test_parse.py
asserts the parsed model of these files.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))  # tests/support: the helpers
TESTS = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(TESTS))

import jobs  # noqa: E402
from worker_client import WorkerProc  # noqa: E402

DATA = os.path.join(TESTS, "data")


def save(name: str, value: object) -> None:
    path = os.path.join(DATA, name)
    with open(path, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


def record_dataloader() -> None:
    """The `dataloader` scenario: rank 1 blocks fetching its next batch, on the for-loop's header line."""
    job = jobs.start_local_job("dataloader", nproc=2, culprit=1)
    try:
        with WorkerProc() as w:
            items, _ = w.call("discover")
            pids = {r.host_pid for r in job.ranks.values()}
            ranks = sorted((i for i in items if i["pid"] in pids), key=lambda i: i["rank"])
            targets = [{"pid": r["pid"], "start_time": r["start_time"]} for r in ranks]
            items, done = w.call("dump", {"targets": targets, "locals": True, "loops": True}, timeout=120)
            save("worker_dump_torch_dataloader.json", {"discover": ranks, "items": sorted(items, key=lambda i: i["pid"]),
                                                       "done": done})
    finally:
        job.stop()


def main() -> int:
    job = jobs.start_local_job("skip", nproc=2)
    try:
        with WorkerProc() as w:
            save("worker_hello.json", w.hello)
            items, done = w.call("discover")
            pids = {r.host_pid for r in job.ranks.values()}
            ranks = sorted((i for i in items if i["pid"] in pids), key=lambda i: i["rank"])
            save("worker_discover_torch.json", {"items": ranks, "done": done})
            targets = [{"pid": r["pid"], "start_time": r["start_time"]} for r in ranks]
            for name, opts in (("plain", {}), ("locals", {"locals": True, "loops": True, "source_context": 2}),
                               ("native", {"native": True})):
                items, done = w.call("dump", dict(opts, targets=targets), timeout=120)
                save("worker_dump_torch_%s.json" % name, {"items": sorted(items, key=lambda i: i["pid"]),
                                                          "done": done})
            _, done = w.call("strace", dict(targets[0], seconds=1.0, max_lines=400), timeout=60)
            save("worker_strace_torch.json", done)
            _, done = w.call("gdb", dict(targets[0], timeout=60), timeout=90)
            save("worker_gdb_torch.json", done)
        record_dataloader()
        with open(os.path.join(os.path.dirname(os.path.realpath(sys.executable)), "py-spy"), "rb") as f:
            pyspy = f.read()
        import base64
        import hashlib

        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        with WorkerProc(python="/usr/bin/python3", isolated=True, prefix=as_nobody) as w:
            w.call("push_tool", {"name": "py-spy", "data_b64": base64.b64encode(pyspy).decode(),
                                 "sha256": hashlib.sha256(pyspy).hexdigest()})
            items, done = w.call("dump", {"targets": targets[:1]})
            save("worker_dump_denied.json", {"items": items, "done": done})
    finally:
        job.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
