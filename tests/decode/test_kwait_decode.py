"""A thread's kernel wait (workers/collect/kwait.py's "waits") decoded into ThreadStack.waits: hostile values are
dropped or bounded, never raised on; the fields round-trip through snapshot files, validate against the committed
schema, and files written before they existed still load."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema

from app.decode import replies as parse
from app.decode.kwait import MAX_FDS, MAX_OTHERS, kernel_wait
from app.model import KernelWait, OtherEnd, RankSnapshot, Snapshot, ThreadStack, WaitFd
from app.model.codec import snapshot_from_json, snapshot_to_json

ROOT = Path(__file__).resolve().parents[2]

GOOD = {"syscall": "read", "family": "fd", "fd": 3,
        "fds": [{"fd": 3, "access": "read", "target": "pipe:[42]", "kind": "pipe", "complete": True,
                 "others": [{"pid": 7, "comm": "sleep", "state": "S", "ppid": 6, "wchan": "hrtimer_nanosleep",
                             "cmdline": ["sleep", "9"], "role": "writer", "fd": 4, "own": False}]}]}


def dumped(waits: object, cpu_time: object = 1.5) -> ThreadStack:
    item = {"procfs": {"threads": [{"tid": 6, "state": "S", "comm": "python", "syscall": "read", "waits": waits,
                                    "cpu_time": cpu_time}]}}
    (thread,) = parse.apply_dump(RankSnapshot(node="n", pid=6, start_time=1), item).threads  # type: ignore[arg-type]
    return thread


def test_a_wait_decodes_into_the_model() -> None:
    t = dumped(GOOD)
    assert t.cpu_time == 1.5 and t.waits == KernelWait(
        syscall="read", family="fd", fd=3,
        fds=(WaitFd(fd=3, target="pipe:[42]", kind="pipe", access="read",
                    others=(OtherEnd(role="writer", pid=7, comm="sleep", state="S", ppid=6, wchan="hrtimer_nanosleep",
                                     cmdline=("sleep", "9"), fd=4),)),))
    assert t.waits.others[0].pid == 7 and not t.waits.fds[0].nobody


def test_hostile_values_are_dropped_or_bounded_and_never_raise() -> None:
    huge = "x" * (10 << 20)
    hostile_end = {"role": ["writer"], "pid": 7}
    ends = [{"role": "child", "pid": 9, "comm": huge, "state": {"a": 1}, "ppid": -1, "cmdline": [huge, 3, None] * 100,
             "exit_code": 300, "exit_signal": huge, "core_dumped": "yes", "own": 1, "fd": 1 << 40, "lock": huge},
            hostile_end, {"role": "writer", "pid": True}, {"role": "writer", "pid": -4},
            {"role": "writer", "pid": 1 << 70}, {"role": "boss", "pid": 3}, None, "x", 5]
    raw = {"syscall": huge, "family": "fd", "fd": 1 << 40, "fds_total": -3, "timeout": math.nan, "child_pid": 1.5,
           "children": ends, "lock_type": "EVIL", "lock_mode": ["READ"], "path": huge, "address": "0x; rm -rf /",
           "notes": [huge] * 100 + [3],
           "fds": [{"fd": "3", "kind": "pipe!", "access": {"read": 1}, "proto": "tcp\n", "local": huge,
                    "send_q": -1, "recv_q": 1 << 64, "others": ends * 10, "complete": "no", "controlling": 1,
                    "foreground": "true", "notes": "not a list"}] * (MAX_FDS * 4) + [None, [], "fd"]}
    t = dumped(raw, cpu_time=math.inf)
    w = t.waits
    assert w is not None and t.cpu_time is None
    assert len(w.syscall) == 40 and w.fd is None and w.fds_total is None and w.timeout is None
    assert w.child_pid is None and w.lock_type == "" and w.lock_mode == "" and len(w.path) == 1000
    assert w.address == "" and len(w.notes) == 8 and all(len(n) == 300 for n in w.notes)
    assert len(w.fds) == MAX_FDS
    f = w.fds[0]
    assert (f.fd, f.kind, f.access, f.proto, len(f.local), f.send_q, f.recv_q) == (None, "", "", "", 300, None, None)
    assert f.complete is True and f.controlling is None and f.foreground is None and f.notes == ()
    (child,) = w.children  # of the first 8 entries, only the one well-formed end survives, bounded
    assert len(f.others) == 1 and f.others[0] == child
    assert (child.pid, len(child.comm), child.state, child.ppid, child.exit_code, len(child.exit_signal)) == \
        (9, 64, "", None, None, 20)
    assert len(child.cmdline) == 6 and all(len(a) == 200 for a in child.cmdline)  # 16 taken, their strings kept
    assert child.core_dumped is False and child.own is False and child.fd is None and len(child.lock) == 100
    for bad in (None, [], "fd", 3, {"family": ["fd"]}, {"family": "telepathy"}, {"family": None}):
        assert kernel_wait(bad) is None
    assert dumped({"family": "futex", "address": "0x7f00dead", "timeout": -1}).waits == KernelWait(
        syscall="", family="futex", address="0x7f00dead", timeout=-1.0)
    assert dumped({"family": "sleep", "timeout": -2}).waits.timeout is None  # type: ignore[union-attr]
    assert dumped(GOOD, cpu_time=True).cpu_time is None and dumped(GOOD, cpu_time=-1).cpu_time is None
    assert len(kernel_wait({"family": "wait", "children": [{"role": "child", "pid": p} for p in range(1, 100)]})
               .children) == MAX_OTHERS  # type: ignore[union-attr]


def snapshot_with_waits() -> Snapshot:
    thread = dumped({**GOOD, "timeout": -1, "notes": ["a note"]})
    lock = dumped({"syscall": "flock", "family": "lock", "fd": 5, "lock_type": "FLOCK", "lock_mode": "WRITE",
                   "path": "/ckpt/lock", "fds": [{"fd": 5, "access": "lock", "kind": "file", "target": "/ckpt/lock",
                                                  "others": [{"role": "holder", "pid": 8, "lock": "FLOCK WRITE 0-EOF"}]}]})
    zombie = dumped({"syscall": "wait4", "family": "wait", "child_pid": -1, "children": [
        {"role": "child", "pid": 9, "state": "Z", "exit_signal": "SIGKILL"}, {"role": "child", "pid": 10, "state": "Z",
                                                                            "exit_code": 3}]})
    rank = RankSnapshot(node="n", pid=6, start_time=1, rank=0, threads=(thread, lock, zombie))
    return Snapshot(taken_at=1.0, ranks=(rank,))


def test_waits_round_trip_through_a_snapshot_file_and_validate_against_the_schema() -> None:
    snap = snapshot_with_waits()
    text = snapshot_to_json(snap)
    schema = json.loads((ROOT / "docs" / "snapshot.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads(text))
    back, _ = snapshot_from_json(text)
    assert back == snap
    threads = back.ranks[0].threads
    assert threads[1].waits is not None and threads[1].waits.fds[0].others[0].lock == "FLOCK WRITE 0-EOF"
    assert [(c.exit_signal, c.exit_code) for c in threads[2].waits.children] == [("SIGKILL", None), ("", 3)]  # type: ignore[union-attr]


def test_a_snapshot_written_before_the_waits_existed_still_loads() -> None:
    doc = json.loads(snapshot_to_json(snapshot_with_waits()))
    for t in doc["snapshot"]["ranks"][0]["threads"]:
        del t["waits"], t["cpu_time"]
    back, _ = snapshot_from_json(json.dumps(doc))
    assert all(t.waits is None and t.cpu_time is None for t in back.ranks[0].threads)
    assert [t.tid for t in back.ranks[0].threads] == [6, 6, 6]


def test_a_sleeps_polled_files_are_bounded_absolute_files_of_a_sleep_only() -> None:
    """KernelWait.watched: the first 3 entries a node sends, each kept only as an absolute path of kind file, only
    on a sleep; anything else is dropped."""
    good = {"fd": None, "target": "/ckpt/COMMITTED", "kind": "file", "access": "read", "complete": True,
            "others": [{"role": "writer", "pid": 7, "comm": "cp", "state": "S"}]}
    raw = {"syscall": "clock_nanosleep", "family": "sleep", "timeout": 1.0,
           "watched": [good, {**good, "target": "relative/path"}, {**good, "kind": "pipe"}, "x", good, good, good]}
    w = kernel_wait(raw)
    assert w is not None
    assert [f.target for f in w.watched] == ["/ckpt/COMMITTED"] and w.watched[0].others[0].pid == 7
    w = kernel_wait({**raw, "watched": [good] * 5})
    assert w is not None and len(w.watched) == 3
    assert kernel_wait({**raw, "family": "fd", "syscall": "read"}).watched == ()  # type: ignore[union-attr]
    assert kernel_wait({**raw, "watched": "nope"}).watched == ()  # type: ignore[union-attr]
