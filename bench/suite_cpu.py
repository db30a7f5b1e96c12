"""Where a command's CPU goes, by kind of process: run it, sample every process's CPU time from /proc twice a
second, and print a table (CPU seconds, processes, share) when it ends.

    python3 bench/suite_cpu.py [--json FILE] -- python -m pytest -q      # the suite, as `make test` runs it
    sudo python3 bench/suite_cpu.py --acct -- python -m pytest -q        # complete: the kernel's process accounting

Every process on the machine is counted (a test cluster's sshds and ranks are not the command's descendants):
run it on an otherwise quiet machine. A process is counted from its first sample to its last: one that lives under half a second may be missed, and a
process's last half second may be; processes that were running before the command are counted only for what
they used during it. Kinds are read from the command line (torch ranks of the demo job, torchrun agents,
xdist workers, hangscope's CLI and workers, ...). This machine's speed varies with its host: compare kinds within
one run, or runs made back to back.

--acct (root) also turns on the kernel's process accounting (acct(2), into a file of its own, off again when the
command ends): every process that ends during the run leaves a record of its CPU time (the user and system
time /proc shows, the kernel's tick-based figures, at its exit), however short it lived. A record is matched to
its sampled command line by pid and start time; a process never sampled (it lived under half a second) is
counted under its command name. Processes still running at the end (daemons)
keep their sampled CPU. The sampled total is printed beside the recorded one: the difference is what sampling
misses (mostly the last half second of busy short processes, such as CLI runs). While it runs it replaces any
process accounting the machine had, and leaves accounting off. Run inside another `--acct` run (the suite's own
test of this script, under `suite_cpu.py --acct -- make test`), it reads the outer run's file from where it
stands and leaves accounting alone (SUITE_CPU_ACCT). The kernel pauses accounting when the file's file system has
under 2 % free.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
from typing import Dict, List, Optional, Tuple

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


NEVER_SAMPLED = "(never sampled) "


def kind(cmdline: str) -> str:
    short = cmdline.startswith(NEVER_SAMPLED)  # only its command name is known (--acct)
    text = cmdline[len(NEVER_SAMPLED):] if short else cmdline
    for pattern, name in KINDS:
        m = re.search(pattern, text)
        if m:
            return m.expand(name)
    if short:
        return f"short-lived (never sampled): {text}"
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


ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")  # linux/acct.h struct acct_v3: 64 bytes a record
ACCT_ENV = "SUITE_CPU_ACCT"  # the accounting file of a suite_cpu --acct run, for the commands it runs
AHZ = 100  # the records' clock: comp_t user and system times are in 1/100 s


def comp_t(value: int) -> int:
    """linux/acct.h's comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_acct(path: str, offset: int = 0) -> List[Tuple[int, float, float, str]]:
    """(pid, start as seconds since the epoch, CPU seconds, command name) per acct v3 record of `path` from byte
    `offset` (a record boundary)."""
    out = []
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    for off in range(0, len(data) - ACCT_V3.size + 1, ACCT_V3.size):
        rec = ACCT_V3.unpack_from(data, off)
        if rec[1] & 0x0F != 3:  # ac_version (its high bit says the byte order): not a v3 record
            continue
        pid, btime, utime, stime, comm = rec[6], rec[8], rec[10], rec[11], rec[18]
        out.append((pid, float(btime), (comp_t(utime) + comp_t(stime)) / AHZ,
                    comm.split(b"\0", 1)[0].decode("utf-8", "replace")))
    return out


def set_acct(path: Optional[str]) -> None:
    """acct(2): account into `path`, or stop accounting (None). Needs CAP_SYS_PACCT (root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(path.encode() if path is not None else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"acct({path!r}): {os.strerror(err)}")


def boot_time() -> float:
    with open("/proc/stat") as f:
        return float(next(line.split()[1] for line in f if line.startswith("btime ")))


def with_records(seen: Dict[str, list], records: List[Tuple[int, float, float, str]]) -> Dict[str, list]:
    """The sampled processes with the CPU their exit records give, and the processes never sampled (one entry
    each, counted under their command name): the same [cpu, cmdline, cpu at start] entries as `seen`, keyed
    "PID:START_TICKS" or, never sampled, "PID:never-sampled-N"."""
    boot = boot_time()
    by_pid: Dict[int, List[Tuple[float, str]]] = collections.defaultdict(list)
    for key in seen:
        sampled_pid, ticks = key.split(":")
        by_pid[int(sampled_pid)].append((boot + int(ticks) / TICK, key))
    out = {key: list(entry) for key, entry in seen.items()}
    for n, (pid, start, cpu, comm) in enumerate(records):
        # the record's start is whole seconds (the exit time less the run time, each truncated: within 1 s of
        # the true start), the sampled one up to 1 s early (the boot time is whole seconds): the nearest sampled
        # start within 2.5 s is the same process
        near = [(abs(at - start), key) for at, key in by_pid.get(pid, []) if abs(at - start) <= 2.5]
        if near:
            entry = out[min(near)[1]]
            entry[0] = cpu + entry[2]  # what it used before the run stays out
        else:
            out[f"{pid}:never-sampled-{n}"] = [cpu, NEVER_SAMPLED + comm, 0.0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE", help="also write every process seen: [cpu, cmdline, cpu at start]")
    ap.add_argument("--acct", action="store_true", help="every process's CPU from the kernel's process accounting (root)")
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

    acct_file, acct_from, own = None, 0, False
    if args.acct:
        outer = os.environ.get(ACCT_ENV, "")
        if outer and os.path.isfile(outer):  # run under another suite_cpu --acct (its tests): read its file
            acct_file, acct_from = outer, os.path.getsize(outer) // ACCT_V3.size * ACCT_V3.size
        else:
            fd, acct_file = tempfile.mkstemp(prefix="suite-cpu-", suffix=".acct")
            os.close(fd)
            set_acct(acct_file)
            own = True
            os.environ[ACCT_ENV] = acct_file  # for the command: a nested run must not switch accounting off
    sampler = threading.Thread(target=loop, daemon=True)
    sampler.start()
    try:
        code = subprocess.call(command)
    finally:
        done.set()
        sampler.join()
        sample(seen, os.getpid(), start)
        if own:
            set_acct(None)
    counted = seen
    if acct_file is not None:
        records = read_acct(acct_file, acct_from)
        if own:
            os.unlink(acct_file)
        counted = with_records(seen, records)
        sampled = sum(cpu - first for cpu, _, first in seen.values())
        print(f"\nprocess accounting: {len(records)} exit records; CPU {sum(c - f for c, _, f in counted.values()):.0f} s "
              f"recorded against {sampled:.0f} s sampled")
    totals: Dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for cpu, cmd, first in counted.values():
        row = totals[kind(cmd)]
        row[0] += cpu - first
        row[1] += 1
    total = sum(row[0] for row in totals.values()) or 1.0
    print("\n| CPU s | processes | share | kind |\n|---|---|---|---|")
    for name, (cpu, count) in sorted(totals.items(), key=lambda item: -item[1][0]):
        if cpu >= 1.0:
            print(f"| {cpu:.0f} | {count} | {100 * cpu / total:.1f} % | {name} |")
    print(f"| {total:.0f} | {len(counted)} | | every process seen |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(counted, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
