"""Processes of a node that the blind start-up set's training job meets, started by the harness
(bench/blind/starts/scenarios.py) inside a node:

  stage-cache --stage-dir DIR   what is left of an earlier attempt's staging on the node: a process that took the
                                stage directory's lock (DIR/.lock, a POSIX record lock, lockf) to stage the dataset
                                and never got further (its copy stalled); it holds the lock until it is killed

Prints `ready` on stdout once it holds what it holds.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import threading


def stage_cache(stage_dir: str) -> None:
    os.makedirs(stage_dir, exist_ok=True)
    lock = open(os.path.join(stage_dir, ".lock"), "a+")  # noqa: SIM115 (held until killed)
    fcntl.lockf(lock, fcntl.LOCK_EX)
    with open(os.path.join(stage_dir, "part-000.pt.partial"), "wb") as f:
        f.write(b"\0" * 4096)
    print("ready", flush=True)
    threading.Event().wait()  # the copy that never finishes: the lock stays held


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("stage-cache")
    s.add_argument("--stage-dir", required=True)
    args = ap.parse_args()
    stage_cache(args.stage_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
