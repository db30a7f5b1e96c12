"""Where a command's CPU goes, by kind of process: run it, sample every process's CPU time from /proc twice a
second, and print a table (CPU seconds, processes, share) when it ends.

    python3 bench/suite_cpu.py [--json FILE] -- python -m pytest -q      # the suite, as `make test` runs it

Every process on the machine is counted (a test cluster's sshds and ranks are not the command's descendants):
run it on an otherwise quiet machine. A process is counted from its first sample to its last: one that lives under half a second may be missed, and a
process's last half second may be; processes that were running before the command are counted only for what
they used during it. Kinds are read from the command line (torch ranks of the demo job, torchrun agents,
xdist workers, hangscope's CLI and workers, ...). This machine's speed varies with its host: compare kinds within
one run, or runs made back to back.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import threading
from typing import Dict, List, Tuple

TICK = os.sysconf("SC_CLK_TCK")
KINDS: List[Tuple[str, str]] = [  # (regular expression on the command line, kind): the first that matches
    (r"torch\.distributed\.run .*--standalone|torchrun .*--standalone", "torchrun agent (local, --standalone)"),
    (r"torch\.distributed\.run|torchrun", "torchrun agent (multi-node)"),
    (r"lightning\.fabric\.cli", "Lightning launcher"),
    (r"exec\(eval\(sys\.stdin\.readline\(\)\)\)", "pytest-xdist worker (tests run in-process)"),
    (r"-m pytest", "pytest"),
    (r"app/demo/job\.py", "demo job rank (app/demo/job.py)"),
    (r"The GPU test program", "GPU test program"),
    (r"ddp_train\.py|--width \d+ --batch \d+ --step-delay", "ddp_train.py rank"),
    (r"nanogpt|train\.py", "nanoGPT rank"),
    (r"-m app\b", "hangscope CLI"),
    (r"import (binascii|base64),zlib;exec\(", "hangscope worker or relay (on a node)"),
    (r"py-spy", "py-spy"),
    (r"^sshd|/sshd", "sshd"),
    (r"spawn_main", "multiprocessing spawn child"),
    (r"tests/support/(\w+)\.py", "tests/support/\\1"),
    (r"chrom", "chromium"),
    (r"slurm", "SLURM"),
    (r"strace|gdb", "strace or gdb"),
]


def kind(cmdline: str) -> str:
    for pattern, name in KINDS:
        m = re.search(pattern, cmdline)
        if m:
            return m.expand(name)
    first = cmdline.split()[0] if cmdline.split() else "(kernel thread or unreadable)"
    return "other: " + os.path.basename(first)[:40]


def sample(seen: Dict[str, list], me: int, start: float) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            key = f"{pid}:{fields[19].decode()}"
            if key in seen:
                seen[key][0] = cpu
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read(600).replace(b"\0", b" ").decode("utf-8", "replace").strip()
            older = int(fields[19]) / TICK < start  # running before the command: count only what it uses now
            seen[key] = [cpu, cmd, cpu if older else 0.0]
        except (OSError, IndexError, ValueError):
            pass  # gone between listdir and open


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE", help="also write every process seen: [cpu, cmdline, cpu at start]")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --")
    with open("/proc/uptime") as f:
        start = float(f.read().split()[0])
    seen: Dict[str, list] = {}
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            sample(seen, os.getpid(), start)
            done.wait(0.5)

    sampler = threading.Thread(target=loop, daemon=True)
    sampler.start()
    try:
        code = subprocess.call(command)
    finally:
        done.set()
        sampler.join()
        sample(seen, os.getpid(), start)
    totals: Dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for cpu, cmd, first in seen.values():
        row = totals[kind(cmd)]
        row[0] += cpu - first
        row[1] += 1
    total = sum(row[0] for row in totals.values()) or 1.0
    print("\n| CPU s | processes | share | kind |\n|---|---|---|---|")
    for name, (cpu, count) in sorted(totals.items(), key=lambda item: -item[1][0]):
        if cpu >= 1.0:
            print(f"| {cpu:.0f} | {count} | {100 * cpu / total:.1f} % | {name} |")
    print(f"| {total:.0f} | {len(seen)} | | every process seen |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(seen, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
