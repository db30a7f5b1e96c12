"""Module globals read from a rank's memory (workers/collect/pyglobals.py) on real processes whose loop runs at
module level (tests/support/globals_target_prog.py): the counter as it moves, under every CPython found here; a str's
text never; a held process never; the layout probe run once per interpreter binary, and as the rank's user
under a root worker; and through the worker's dump op, as `global` locals of the `<module>` frame."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import testenv
from waiting import wait_until
from worker_client import WorkerProc
from worker_targets import Target, proc_state, readable_copy, untouched, wait_blocked
from workers import procinfo
from workers.collect import pyglobals
from workers.request import Request, Worker

PROG = str(Path(__file__).resolve().parents[1] / "support" / "globals_target_prog.py")
SECRET = "S3cr3t" * 6  # the text of the target's hf_token global


@pytest.fixture(autouse=True)
def fresh_probe_cache() -> Iterator[None]:
    """Each test sees whether it ran the probe itself: nothing learnt by an earlier test is reused."""
    pyglobals._cache.clear()
    yield
    pyglobals._cache.clear()


def request() -> Request:
    return Request(Worker(lambda msg: None, {}), 1, "dump", {})


def python_of(version: str) -> str:
    python = testenv.other_python(version) if version else sys.executable
    if not python:
        pytest.skip(f"no python{version} here")
    return python


def counting(python: str, counter: Path) -> Target:
    return Target([python, PROG, "count", str(counter)])


def written(counter: Path) -> int:
    return int(counter.read_bytes().strip() or b"0")


@pytest.mark.parametrize("version", ["", "3.9", "3.10", "3.12", "3.13"])
def test_a_top_level_counter_is_read_from_memory_as_it_moves(version: str, tmp_path: Path) -> None:
    counter = tmp_path / "iter_num"
    with counting(python_of(version), counter) as t:
        req = request()
        before = written(counter)
        got = pyglobals.collect(req, t.pid, ["iter_num", "lr", "hf_token", "mode", "not_there"])
        after = written(counter)
        assert got["error"] == "", got
        value = int(got["values"]["iter_num"])
        # the child writes each value right after counting it: memory holds what the file says, or one more
        assert before <= value <= after + 1, (before, value, after)
        # other types by their type's name only: a str's text never leaves the process
        assert got["values"]["lr"] == "<float>"
        assert got["values"]["hf_token"] == got["values"]["mode"] == "<str>"
        assert SECRET not in json.dumps(got)
        assert got["absent"] == ["not_there"] and "not_there" not in got["values"]
        ran, read = got["actions"]
        assert ran.startswith("ran its python (") and "-I -S" in ran and "reads only its own memory" in ran
        assert read.startswith(f"read 5 globals of __main__ from memory (/proc/{t.pid}/mem, ")
        assert read.endswith("; not stopped)")
        assert untouched(t.pid)

        wait_until(lambda: written(counter) > value + 20, 30, "the counter to move on")
        again = pyglobals.collect(req, t.pid, ["iter_num"])
        assert int(again["values"]["iter_num"]) > value + 20
        assert [a.split(" (")[0] for a in again["actions"]] == ["read 1 global of __main__ from memory"]
        assert untouched(t.pid)


def test_a_dict_rewritten_while_it_is_read_gives_true_values_or_none_never_garbage(tmp_path: Path) -> None:
    """The rank adds, rebinds and deletes hundreds of globals per iteration (its dict is resized and its
    entries rewritten under the reader): each read gives iter_num as it was at some moment of the read, or
    says the dict changed; never another number."""
    counter = tmp_path / "iter_num"
    with Target([sys.executable, PROG, "churn", str(counter)]) as t:
        req = request()
        seen: List[int] = []
        changed = 0
        deadline = time.monotonic() + 30
        while (len(seen) < 50 or changed < 5) and time.monotonic() < deadline:
            before = written(counter)
            got = pyglobals.collect(req, t.pid, ["iter_num", "lr"])
            after = written(counter)
            if got["error"]:
                assert got["error"].endswith("changed on each of 3 reads"), got
                changed += 1
                continue
            assert got["absent"] == [] and "iter_num" in got["values"], got
            value = int(got["values"]["iter_num"])
            assert before <= value <= after + 1, (before, value, after)
            assert got["values"]["lr"] == "<float>"
            seen.append(value)
        assert len(seen) >= 10 and seen == sorted(seen), (len(seen), changed)  # a loaded machine reads slowly
        assert untouched(t.pid)


def test_a_stopped_rank_is_not_read_and_is_left_as_it_was(tmp_path: Path) -> None:
    counter = tmp_path / "iter_num"
    with counting(sys.executable, counter) as t:
        os.kill(t.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: proc_state(t.pid) == "T", 20, "the rank to stop")
            got = pyglobals.collect(request(), t.pid, ["iter_num"])
            assert got["values"] == {} and got["actions"] == [], got
            assert got["error"].startswith("the process is stopped by a signal (SIGSTOP"), got
            assert proc_state(t.pid) == "T"  # still stopped: hangscope neither read nor resumed it
        finally:
            os.kill(t.pid, signal.SIGCONT)
        wait_until(lambda: proc_state(t.pid) != "T", 20, "the rank to run again")
        got = pyglobals.collect(request(), t.pid, ["iter_num"])
        assert got["error"] == "" and int(got["values"]["iter_num"]) >= 1
        assert untouched(t.pid)


def test_ranks_sharing_a_binary_share_one_probe_run(tmp_path: Path) -> None:
    targets = [counting(sys.executable, tmp_path / f"c{i}") for i in range(3)]
    try:
        req = request()
        results: Dict[int, Dict[str, Any]] = {}

        def read(pid: int) -> None:
            results[pid] = pyglobals.collect(req, pid, ["iter_num"])

        threads = [threading.Thread(target=read, args=(t.pid,)) for t in targets]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert sorted(results) == sorted(t.pid for t in targets)
        assert all(r["error"] == "" and int(r["values"]["iter_num"]) >= 1 for r in results.values()), results
        runs = [a for r in results.values() for a in r["actions"] if a.startswith("ran its python")]
        assert len(runs) == 1, results
        assert all(untouched(t.pid) for t in targets)
    finally:
        for t in targets:
            t.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="a root worker and a rank of another user need root")
def test_a_root_worker_runs_the_probe_as_the_rank_user_never_as_root() -> None:
    system_python = "/usr/bin/python3"  # one that user nobody may run (this environment's may sit under /root)
    if not os.access(system_python, os.X_OK):
        pytest.skip("no /usr/bin/python3")
    nobody = 65534
    # a copy of the program that user nobody can read: the checkout may sit in a folder only root may enter
    with readable_copy(PROG) as prog, Target(["setpriv", f"--reuid={nobody}", f"--regid={nobody}",
                                             "--clear-groups", system_python, prog, "block"]) as t:
        pid = int(t.ready[0])
        wait_blocked(pid)
        assert procinfo.status_field(pid, "Uid").split()[0] == str(nobody)
        got = pyglobals.collect(request(), pid, ["step", "batch", "iter_num"])
        assert got["error"] == "", got
        assert got["values"] == {"step": "3", "batch": "<str>", "iter_num": "4"}
        assert f", as uid {nobody}," in got["actions"][0], got["actions"]
        assert untouched(pid)


def test_a_program_that_is_not_a_python_binary_is_never_started() -> None:
    with Target(["sh", "-c", "echo ready $$; exec sleep 60"]) as t:
        got = pyglobals.collect(request(), t.pid, ["iter_num"])
        assert got["values"] == {} and got["actions"] == []
        assert "is not a python interpreter binary" in got["error"], got


def module_frame(item: Dict[str, Any]) -> Dict[str, Any]:
    (main,) = [th for th in item["pyspy"] if th["os_thread_id"] == item["pid"]]  # unnamed: no threading module
    return next(f for f in main["frames"] if f["name"] == "<module>")


def dump(w: WorkerProc, pid: int, **opts: object) -> Dict[str, Any]:
    items, done = w.call("dump", dict({"targets": [{"pid": pid, "start_time": procinfo.start_time(pid)}]}, **opts))
    assert done["type"] == "done" and len(items) == 1, done
    return items[0]


def test_the_dump_adds_the_module_loop_globals_to_the_module_frame() -> None:
    with Target([sys.executable, PROG, "block"]) as t, WorkerProc() as w:
        pid = int(t.ready[0])
        wait_blocked(pid)
        item = dump(w, pid, locals=True, loops=True)
        assert item["ok"] and item["error"] is None, item
        frame = module_frame(item)
        (loop,) = [lp for lp in item["loops"][f"{PROG}:{frame['line']}"] if lp["kind"] == "for"]
        assert loop["variables"] == ["step", "batch"] and loop["counters"] == ["iter_num"]
        globals_ = [lc for lc in frame["locals"] if lc.get("global")]
        assert globals_ == [{"name": "step", "repr": "3", "arg": False, "global": True},
                            {"name": "batch", "repr": "<str>", "arg": False, "global": True},
                            {"name": "iter_num", "repr": "4", "arg": False, "global": True}]
        reads = [a for a in item["actions"] if "globals of __main__" in a]
        assert len(reads) == 1 and reads[0].startswith(f"read 3 globals of __main__ from memory (/proc/{pid}/mem, ")
        assert item["actions"].index(reads[0]) > next(i for i, a in enumerate(item["actions"])
                                                      if a.startswith("py-spy dump"))  # after the stacks
        assert SECRET not in json.dumps(item)
        assert untouched(pid)

        # without --locals nothing is read, and the actions say so by saying nothing
        bare = dump(w, pid, locals=False, loops=True)
        assert not any(lc.get("global") for lc in module_frame(bare).get("locals") or [])
        assert not any("globals" in a or "ran its python" in a for a in bare["actions"]), bare["actions"]
        assert untouched(pid)


def test_the_dump_of_a_stopped_rank_notes_why_its_globals_were_not_read() -> None:
    with Target([sys.executable, PROG, "block"]) as t, WorkerProc() as w:
        pid = int(t.ready[0])
        wait_blocked(pid)
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: proc_state(pid) == "T", 20, "the rank to stop")
            item = dump(w, pid, locals=True, loops=True)
            assert item["ok"], item  # py-spy --nonblocking still gave the stack: not a failed dump
            assert not any(lc.get("global") for lc in module_frame(item).get("locals") or [])
            notes: List[str] = item["notes"]
            assert any(n.startswith("globals of __main__ (step, batch, iter_num) not read: the process is stopped")
                       for n in notes), notes
            assert not any("globals" in a or "ran its python" in a for a in item["actions"]), item["actions"]
            assert proc_state(pid) == "T"
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: untouched(pid), 20, "the rank to run again")


# The worker's side under the nodes' oldest python3: stdlib only, isolated, the repo put on sys.path by code.
READ_UNDER = ("import json, sys; sys.path.insert(0, %r)\n"
              "from workers.collect import pyglobals\n"
              "from workers.request import Request, Worker\n"
              "req = Request(Worker(lambda msg: None, {}), 1, 'dump', {})\n"
              "print(json.dumps(pyglobals.collect(req, int(sys.argv[1]), ['iter_num', 'hf_token'])))\n")


def test_the_worker_side_reads_under_the_oldest_supported_python(tmp_path: Path) -> None:
    """A python 3.9 worker reads a rank of this environment's python (another CPython: the probe, not the
    worker, knows the rank's layout)."""
    python = python_of("3.9")
    counter = tmp_path / "iter_num"
    with counting(sys.executable, counter) as t:
        before = written(counter)
        out = subprocess.run([python, "-I", "-S", "-c", READ_UNDER % str(Path(__file__).resolve().parents[2]),
                              str(t.pid)], capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["error"] == "", got
        assert int(got["values"]["iter_num"]) >= before and got["values"]["hf_token"] == "<str>"
        assert got["actions"][0].startswith("ran its python (")
        assert untouched(t.pid)


def test_the_cli_tells_which_rank_is_an_iteration_ahead_from_module_globals(tmp_path: Path) -> None:
    """End to end: two ranks of a script whose loop runs at module level, blocked on the same line one step
    apart; only their globals tell them apart, and `hangscope --print` says which one is ahead."""
    from worker_targets import rank_env

    repo = Path(__file__).resolve().parents[2]
    with Target([sys.executable, PROG, "block", "3"], env=rank_env(0)) as r0, \
            Target([sys.executable, PROG, "block", "4"], env=rank_env(1)) as r1:
        pids = [int(r0.ready[0]), int(r1.ready[0])]
        for pid in pids:
            wait_blocked(pid)
        out = subprocess.run([sys.executable, "-m", "app", "--pid", str(pids[0]), "--pid", str(pids[1]), "--print"],
                             capture_output=True, text=True, timeout=120, cwd=repo,
                             env=dict(os.environ, PYTHONPATH=str(repo), NO_COLOR="1"))
        assert all(untouched(pid) for pid in pids)
    text = " ".join(out.stdout.split())
    assert "rank 1 is 1 iteration ahead (step=4 vs 3)" in text, out.stdout + out.stderr
    assert "step=3, iter_num=4: rank 0; step=4, iter_num=5: rank 1" in text, out.stdout


def test_a_value_read_torn_once_is_read_again_and_one_that_reads_wrong_every_time_is_a_fault() -> None:
    """An int freed and a new one built at the same address, bound to the same name, reads torn while it is being
    written, and everything is in place again afterwards (the CI run of 8eb2e59: "an int digit of 0xa36cd2b0"
    under the churn test above). Such a read is read again; only a value that reads the same wrong way on every
    attempt is a fault. On this process's own memory, with its own layout (the probe's calibration)."""
    import ctypes

    from workers.collect import pyglobals_probe as probe

    cal = probe.calibrate()
    assert cal["ok"], cal
    runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    types = {"int": id(int), "bool": id(bool), "dict": id(dict), "str": id(str), "module": id(type(sys))}
    main = sys.modules["__main__"].__dict__
    main["_hangscope_torn"] = 12345678901234567890  # an int object of its own
    try:
        with probe.Memory("self") as mem:
            reader = probe.Reader(mem, probe.Layout.from_dict(cal["layout"]), runtime, types)
            real, calls = reader.text, []

            def torn_once(obj: int, typ: int) -> str:
                calls.append(obj)
                if len(calls) == 1:
                    raise probe.Fault("an int digit of 0xa36cd2b0")
                return real(obj, typ)

            reader.text = torn_once  # type: ignore[method-assign]
            assert reader.globals(["_hangscope_torn"])["values"] == {"_hangscope_torn": "12345678901234567890"}

            def always(obj: int, typ: int) -> str:
                raise probe.Fault("an int digit of 0x7fffffff")

            reader.text = always  # type: ignore[method-assign]
            with pytest.raises(probe.Fault, match="0x7fffffff"):
                reader.globals(["_hangscope_torn"])

            # the same fault on every read while a thread of the target is runnable: a writer preempted halfway
            # (a loaded node, the CI run of 6a48838 with this very digit error three times): not the object's
            # fault, a change not yet finished
            mem.runnable = lambda: True  # type: ignore[method-assign]
            with pytest.raises(probe.Changed, match="changed on each of 3 reads"):
                reader.globals(["_hangscope_torn"])
    finally:
        main.pop("_hangscope_torn", None)


def test_a_target_is_runnable_while_a_thread_of_it_spins_and_not_while_all_sleep() -> None:
    """What judges a read that faulted the same way each time: the target's threads' states, read from /proc."""
    from workers.collect import pyglobals_probe as probe

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    spinner = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                                "threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
                                "time.sleep(60)"])
    try:
        wait_until(lambda: proc_state(sleeper.pid) == "S", 20, "the sleeper to sleep")
        with probe.Memory(sleeper.pid) as mem:
            assert not mem.runnable()
        with probe.Memory(spinner.pid) as mem:
            wait_until(mem.runnable, 20, "a thread of the spinner to run")  # its main thread sleeps
        with probe.Memory("self") as mem:
            assert not mem.runnable()  # the reader's own memory has no other writer
    finally:
        for p in (sleeper, spinner):
            p.kill()
            p.wait()
