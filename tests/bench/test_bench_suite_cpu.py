"""bench/suite_cpu.py, where the suite's CPU goes: the kernel's process accounting records are read as linux/acct.h
writes them, and `--acct` counts the CPU of a process too short-lived for the /proc sampler to see."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "suite_cpu.py"


def _module():
    spec = importlib.util.spec_from_file_location("suite_cpu_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _comp_t(ticks: int) -> int:
    """Encode as the kernel does (kernel/acct.c encode_comp_t): 13 bits of mantissa, rounded, base-8 exponent."""
    exp, rnd = 0, 0
    while ticks > 0x1FFF:
        rnd = ticks & 4
        ticks >>= 3
        exp += 1
    if rnd and ticks + 1 > 0x1FFF:
        ticks >>= 3
        exp += 1
    return (exp << 13) + ticks


def test_acct_v3_records_are_read_with_their_pid_start_cpu_and_name(tmp_path: Path) -> None:
    suite_cpu = _module()
    path = tmp_path / "pacct"
    rec = struct.Struct("<BBHIIIIIIf8H16s")
    assert rec.size == 64  # sizeof(struct acct_v3)
    with open(path, "wb") as f:
        # user 1.25 s + system 0.5 s; then 120 s + 3 s, past comp_t's 13-bit mantissa (8191 ticks)
        f.write(rec.pack(0, 3, 0, 0, 0, 0, 4242, 1, 1_800_000_000, 175.0, _comp_t(125), _comp_t(50),
                         0, 0, 0, 0, 0, 0, b"python3\0\0\0\0\0\0\0\0\0"))
        f.write(rec.pack(0, 3, 0, 0, 0, 0, 4243, 4242, 1_800_000_005, 12300.0, _comp_t(12000), _comp_t(300),
                         0, 0, 0, 0, 0, 0, b"pt_elastic".ljust(16, b"\0")))
        f.write(rec.pack(0, 2, 0, 0, 0, 0, 1, 0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, b"v2".ljust(16, b"\0")))  # skipped
    got = suite_cpu.read_acct(str(path))
    assert [(pid, start, comm) for pid, start, _, comm in got] == [(4242, 1.8e9, "python3"),
                                                                   (4243, 1.8e9 + 5, "pt_elastic")]
    assert got[0][2] == pytest.approx(1.75)
    assert got[1][2] == pytest.approx(123.0, rel=0.002)  # comp_t keeps 13 bits: ~0.1 % at two minutes


def test_a_record_is_matched_to_its_sampled_command_line_and_the_rest_counted_by_name() -> None:
    suite_cpu = _module()
    # sampled: pid 1 started at boot + 1 tick, 0.5 s used before the run, 2.0 s at its last sample
    seen = {"1:1": [2.0, "python3 -c burn", 0.5]}
    boot = suite_cpu.boot_time()
    exact = suite_cpu.with_records(seen, [(1, float(int(boot + 1 / suite_cpu.TICK)), 3.0, "python3"),  # btime truncated
                                   (1, boot + 500.0, 0.2, "python3"),  # the same pid reused later: another process
                                   (99999999, 0.0, 0.04, "sshd")])
    assert exact["1:1"][0] == pytest.approx(3.5)  # its exit record, plus what it had used before the run
    assert sorted(v[1] for k, v in exact.items() if k != "1:1") == ["(never sampled) python3", "(never sampled) sshd"]
    assert seen["1:1"][0] == 2.0  # the sampled figures are left as they were
    assert suite_cpu.kind("(never sampled) sshd") == "sshd"
    assert suite_cpu.kind("(never sampled) ip") == "short-lived (never sampled): ip"


BURN = ("import subprocess, sys, time\n"
        "def burn(seconds):\n"
        "    end = time.process_time() + seconds\n"
        "    while time.process_time() < end:\n"
        "        pass\n"
        "burn(0.3)\n"
        # five children of ~0.05 s each: gone between the sampler's reads (0.5 s apart), or nearly so
        "for _ in range(5):\n"
        "    child = subprocess.Popen([sys.executable, '-S', '-c', 'import time\\nend = time.process_time() + 0.04\\n"
        "while time.process_time() < end: pass'])\n"
        "    print('child', child.pid, flush=True)\n"
        "    child.wait()\n")


@pytest.fixture(scope="module")
def accounting() -> None:
    """The kernel's process accounting: one file per machine, and what these tests count is machine-wide. Tests
    that switch it run one after another: a module-scoped fixture puts them in one xdist worker
    (tests/support/xdist_groups.py); run side by side, one switched the other's accounting to its own file."""
    if os.geteuid() != 0:
        pytest.skip("acct(2) needs root (CAP_SYS_PACCT)")


def test_acct_counts_the_processes_the_sampler_misses(accounting: None, tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    done = subprocess.run([sys.executable, str(BENCH), "--acct", "--json", str(out), "--", sys.executable, "-c",
                           BURN], capture_output=True, text=True, timeout=120, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"process accounting: \d+ exit records; CPU \d+ s recorded against \d+ s sampled", done.stdout)
    counted = json.loads(out.read_text())
    # every process of the machine is counted: the children are told apart by their pids
    pids = [int(pid) for pid in re.findall(r"^child (\d+)$", done.stdout, re.M)]
    assert len(pids) == 5, done.stdout
    burner = [cpu - first for cpu, cmd, first in counted.values() if "burn(0.3)" in cmd]
    children = [cpu - first for key, (cpu, cmd, first) in counted.items() if int(key.split(":")[0]) in pids]
    # the records' user and system times are the kernel's tick-based estimates (as /proc's are), which a loaded
    # machine moves by tens of percent (0.24 s for 0.3 s burned, beside two CPU burners): counted, and of the
    # burn's order, not to the millisecond
    assert len(burner) == 1 and burner[0] >= 0.1, burner
    # each child burned 0.04 s of CPU by its own clock: every one has its exit record, whether or not the sampler
    # saw it (the sampler alone saw 1 or 2 of the 5)
    assert len(children) == 5 and sum(children) > 0.05, children


def test_a_run_inside_another_reads_its_accounting_and_leaves_it_on(accounting: None, tmp_path: Path) -> None:
    """Under `suite_cpu.py --acct -- make test` the suite runs this file's tests, which run suite_cpu.py --acct
    again: the inner run must count from the outer's records and not switch the outer's accounting off."""
    inner = tmp_path / "inner.json"
    after = ("import subprocess, sys\n"
             f"subprocess.run([sys.executable, {str(BENCH)!r}, '--acct', '--json', {str(inner)!r}, '--', "
             f"sys.executable, '-c', {BURN!r}], check=True)\n"
             "for _ in range(5):  # after the inner run: still accounted for the outer one\n"
             "    child = subprocess.Popen([sys.executable, '-S', '-c', 'pass'])\n"
             "    print('after', child.pid, flush=True)\n"
             "    child.wait()\n")
    outer = tmp_path / "outer.json"
    done = subprocess.run([sys.executable, str(BENCH), "--acct", "--json", str(outer), "--", sys.executable, "-c",
                           after], capture_output=True, text=True, timeout=120, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    pids = [int(p) for p in re.findall(r"^child (\d+)$", done.stdout, re.M)]
    counted = json.loads(inner.read_text())
    assert len([k for k in counted if int(k.split(":")[0]) in pids]) == 5, done.stdout  # the inner run's records
    later = [int(p) for p in re.findall(r"^after (\d+)$", done.stdout, re.M)]
    outer_keys = {int(k.split(":")[0]) for k in json.loads(outer.read_text())}
    # processes of ~20 ms, after the inner run ended: only their exit records can have put all five there
    assert len(later) == 5 and set(later) <= outer_keys, (later, done.stdout)
