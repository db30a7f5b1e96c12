"""Golden tests: the worker's recorded replies on a real hung 2-rank torch gloo job (tests/data/worker_*.json,
re-recorded with tests/support/worker_record_golden.py) parsed into the model."""

from __future__ import annotations

import json
import os

import pytest

from app.decode import replies as parse
from app.model import Local, LoopInfo, RankSnapshot
from app.model.codec import from_dict, to_dict

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
JOB = "app/demo/job.py"


def load(name: str) -> dict:
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


def ranks_with(dump_file: str) -> list[RankSnapshot]:
    disc = load("worker_discover_torch.json")["items"]
    items = {i["pid"]: i for i in load(dump_file)["items"]}
    return [parse.apply_dump(parse.rank_from_discover("node01", d), items[d["pid"]]) for d in disc]


def frame_named(rank: RankSnapshot, function: str):  # type: ignore[no-untyped-def]
    assert rank.main_thread is not None
    return next(f for f in rank.main_thread.frames if f.function == function)


def test_node_info_from_hello() -> None:
    info = parse.node_info(load("worker_hello.json"))
    assert info.hostname and info.python.startswith("3.") and info.uid == 0 and info.cpus >= 1
    assert info.psutil is True and info.ptrace_scope is None  # no Yama on the recording machine
    assert info.tool("py-spy") is not None and info.tool("py-spy").version == "py-spy 0.4.3"
    assert info.tool("nvidia-smi") is None
    assert dict(info.searched)["nvidia-smi"][-1].endswith("/nvidia-smi")


def test_discovered_ranks() -> None:
    r0, r1 = (parse.rank_from_discover("node01", d) for d in load("worker_discover_torch.json")["items"])
    assert (r0.rank, r1.rank, r0.world_size, r1.local_rank) == (0, 1, 2, 1)
    assert r0.launcher == "torchrun" and r0.launcher_pid == r1.launcher_pid == r0.ppid
    assert r0.master_addr == "localhost" and r0.master_port and r0.local_world_size == 2
    assert r0.cmdline[-6:] == ("--scenario", "skip", "--hang-step", "3", "--culprit", "1")
    assert r0.env_value("RANK") == "0" and r0.collected is False and r0.threads == ()
    assert r0.state == "S" and r0.wchan == "futex_do_wait" and r0.rss > 100 << 20 and r0.num_threads > 5
    established = [s for s in r0.sockets if s.state == "ESTABLISHED"]
    assert established and all(s.local.startswith("127.0.0.1:") and s.last_send_ms is not None
                               for s in established)
    assert any(s.state == "LISTEN" and s.peer == "0.0.0.0:0" for s in r0.sockets)


def test_plain_dump_stacks_innermost_first_merged_with_proc() -> None:
    r0, r1 = ranks_with("worker_dump_torch_plain.json")
    for r in (r0, r1):
        assert r.collected and r.error is None
        main = r.main_thread
        assert main is not None and main.is_main and main.name == "MainThread" and main.tid == r.pid
        names = [f.function for f in main.frames]
        assert names[0] == "all_reduce" and names[-1] == "<module>"
        assert names.index("sync_gradients") < names.index("train") < names.index("main")
        assert main.state == "S" and main.syscall == "futex" and main.wchan == "futex_do_wait"
        assert main.kernel_stack and main.kernel_stack[0].startswith("futex_")
        assert all(not f.native and not f.locals for f in main.frames)
        # gloo's own threads have no Python frames but are listed, with what /proc says
        gloo = [t for t in r.threads if t.name == "gloo_tcp_loop"]
        assert gloo and all(t.frames == () and t.syscall == "epoll_wait" for t in gloo)
    assert frame_named(r0, "train").line == frame_named(r1, "train").line  # same line on both ranks


def test_locals_give_loops_and_the_iteration_that_tells_the_ranks_apart() -> None:
    r0, r1 = ranks_with("worker_dump_torch_locals.json")
    t0, t1 = frame_named(r0, "train"), frame_named(r1, "train")
    assert t0.loops == (LoopInfo("for", 164, 183, "for step, batch in enumerate(loader):", ("step", "batch")),)
    assert t0.iteration == (("step", "3"),) and t1.iteration == (("step", "4"),)  # the culprit is a step ahead
    assert Local("rank", "1") in t1.locals
    assert any(ln == (t0.line, "        sync_gradients(model, groups[step % len(groups)])") for ln in t0.source)
    assert [n for n, _ in t0.source] == list(range(t0.line - 2, t0.line + 3))
    reader = next(t for t in r0.threads if t.name == "shard-reader")
    (wloop,) = reader.frames[0].loops
    assert wloop.kind == "while" and wloop.counters == ("index",)
    assert reader.frames[0].iteration[0][0] == "index"
    # object reprs differ on every rank (addresses) and never make it into an iteration coordinate
    for r in (r0, r1):
        for t in r.threads:
            for f in t.frames:
                assert all("0x" not in v for _, v in f.iteration)


def test_native_frames_are_marked() -> None:
    r0, _ = ranks_with("worker_dump_torch_native.json")
    frames = r0.main_thread.frames
    native = {f.function for f in frames if f.native}
    assert {"pthread_cond_wait", "c10d::Work::wait"} <= native
    assert all(f.module for f in frames if f.native)
    python = [f for f in frames if not f.native]
    assert [f.function for f in python][:1] == ["all_reduce"] and not any(f.source for f in frames if f.native)
    assert frames.index(next(f for f in frames if f.function == "c10d::Work::wait")) < \
        frames.index(python[0])  # innermost first: the C++ wait below the Python call


def test_denied_dump_keeps_proc_threads_and_the_error() -> None:
    disc = load("worker_discover_torch.json")["items"][0]
    item = load("worker_dump_denied.json")["items"][0]
    r = parse.apply_dump(parse.rank_from_discover("node01", disc), item)
    assert r.collected is False and r.error is not None and r.error.code == "ptrace_denied"
    assert "uid 65534" in r.error.message and "ptrace_scope" in r.error.hint
    assert len(r.threads) == r.num_threads and all(t.frames == () and t.state == "S" for t in r.threads)
    assert r.main_thread is not None and r.main_thread.tid == r.pid and r.main_thread.is_main
    assert {t.name for t in r.threads} >= {"python3", "gloo_tcp_loop", "pt_gloo_runloop"}


def test_strace_blocked_calls_and_counts() -> None:
    done = load("worker_strace_torch.json")
    res = parse.strace_result(done)
    assert res.truncated and res.seconds == 1.0 and res.output.count("[truncated") == 1
    by_tid = {t.tid: t for t in res.threads}
    main_tid = done["data"]["pid"]
    assert by_tid[main_tid].blocked_in == "futex(FUTEX_WAIT_BITSET)"
    pollers = [t for t in res.threads if t.blocked_in.startswith("epoll_wait(")]
    assert len(pollers) == 3 and all(t.calls > 10 and t.top[0][0] == "epoll_wait" for t in pollers)


def test_gdb_text_drops_the_auto_load_advice() -> None:
    text = parse.gdb_text(load("worker_gdb_torch.json"))
    assert "auto-load" not in text and "Thread 1 (Thread " in text
    assert "c10d::Work::wait" in text and "pthread_cond_wait" in text


def test_parsed_ranks_round_trip_through_json() -> None:
    for r in ranks_with("worker_dump_torch_locals.json") + ranks_with("worker_dump_torch_native.json"):
        assert from_dict(RankSnapshot, json.loads(json.dumps(to_dict(r)))) == r


@pytest.mark.parametrize("value, ok", [
    ("3", True), ("-1", True), ("0.5", True), ("1e-05", True), ('"train"', True), ("'val'", True),
    ("(0, 3)", True), ('(1, "a")', True), ("True", True),
    ("<Tensor at 0x7f30bb8245a0>", False), ("[1, 2]", False), ('"' + "x" * 60 + '"', False),
    ("{\"a\": 1}", False), ("None", False), ("(<Tensor at 0x1>, 2)", False),
])
def test_only_values_meaningful_across_ranks_form_iterations(value: str, ok: bool) -> None:
    assert parse.meaningful(value) is ok


def test_strace_without_thread_prefix_and_with_detach() -> None:
    out = ("10:00:00.000001 read(3,  <unfinished ...>\n"
           "[pid 12] 10:00:00.000002 futex(0x1, FUTEX_WAIT_PRIVATE, 2, NULL) = 0 <0.1>\n"
           "[pid 12] 10:00:00.000003 futex(0x1, FUTEX_WAIT_PRIVATE, 2, NULL <unfinished ...>\n"
           "[pid 13] 10:00:00.000004 epoll_wait(6, [], 64, 10) = 0 <0.01>\n"
           "[pid 13] 10:00:00.000005 <... epoll_wait resumed>[], 64, 10) = 0\n"
           "[pid 14] 10:00:00.000006 recvfrom(9, ")
    res = parse.strace_result({"pid": 11, "output": out, "seconds": 2, "truncated": False})
    by = {t.tid: t for t in res.threads}
    assert by[11].blocked_in == "read(3)" and by[12].blocked_in == "futex(FUTEX_WAIT)" and by[12].calls == 2
    assert by[13].blocked_in == "" and by[14].blocked_in == "recvfrom(9)"


def test_container_thread_ids_map_to_host_ids() -> None:
    # py-spy run inside the container's pid namespace reports ns-local ids; /proc gives both
    rank = RankSnapshot(node="n", pid=5000, start_time=1, nspid=1)
    item = {"pyspy": [{"thread_name": "MainThread", "os_thread_id": 1, "frames": []},
                      {"thread_name": "worker", "os_thread_id": 7, "frames": []}],
            "procfs": {"threads": [{"tid": 5000, "nstid": 1, "state": "S", "comm": "python"},
                                   {"tid": 5006, "nstid": 7, "state": "R", "comm": "python"}]}}
    r = parse.apply_dump(rank, item)
    assert [(t.tid, t.state, t.is_main) for t in r.threads] == [(5000, "S", True), (5006, "R", False)]


def test_hostile_types_do_not_crash_parsing() -> None:
    rank = parse.rank_from_discover("n", {"pid": "1; rm -rf /", "rank": True, "env": [["A"], 3, ["B", 2]],
                                          "cmdline": ["x", 5], "sockets": [1, {"local": 3}]})
    assert rank.pid == 0 and rank.rank is None and rank.env == () and rank.cmdline == ("x",)
    r = parse.apply_dump(rank, {"pyspy": [None, {"frames": [None, {"name": 3, "line": "x"}]}],
                                "error": "bad", "loops": [], "source": None})
    assert r.threads[0].frames[0].function == "" and r.error is None


def test_a_rank_fetching_its_next_batch_is_in_the_iteration_it_enters() -> None:
    # dataloader scenario: rank 1 blocks in next(loader) on the for-loop's header line, where `step` still
    # holds the previous iteration (2); it is entering step 3, the step the other rank waits in.
    d = load("worker_dump_torch_dataloader.json")
    items = {i["pid"]: i for i in d["items"]}
    r0, r1 = (parse.apply_dump(parse.rank_from_discover("node01", di), items[di["pid"]]) for di in d["discover"])
    t0, t1 = frame_named(r0, "train"), frame_named(r1, "train")
    assert t1.line == t1.loops[0].line and Local("step", "2") in t1.locals
    assert r1.main_thread.frames[0].function == "StreamingLoader._recv_exact"
    assert t0.iteration == t1.iteration == (("step", "3"),)


@pytest.mark.parametrize("header, local_vars, expected", [
    ("for step, batch in enumerate(loader):", {"step": "2", "batch": "(1, 2)"}, (("step", "3"),)),
    ("for i in range(0, 10, 2):", {"i": "4"}, (("i", "6"),)),
    ("for i in range(n, 0, -1):", {"i": "4"}, (("i", "3"),)),
    ("for i in range(0, n, k):", {"i": "4"}, ()),  # stride unknown: say nothing rather than guess
    ("for x in items:", {"x": "4"}, ()),  # the next item is not known yet
])
def test_iteration_on_a_for_header_is_the_one_being_entered(header: str, local_vars: dict, expected: tuple) -> None:
    loop = LoopInfo("for", 10, 20, header, tuple(local_vars))
    locs = [Local(k, v) for k, v in local_vars.items()]
    assert parse.iteration([loop], locs, line=10) == expected
    assert parse.iteration([loop], locs, line=12) == tuple((k, v) for k, v in local_vars.items())  # in the body


def test_module_globals_are_the_module_frames_locals_and_give_the_iteration() -> None:
    # the worker adds the `<module>` frame's loop globals (read from the rank's memory) as py-spy-shaped locals
    # (with "global": true, which a reader needs not: a module's locals are its globals)
    loop = {"kind": "while", "line": 5, "end_line": 9, "header": "while True:", "variables": [],
            "counters": ["iter_num"]}
    item = {"pyspy": [{"thread_name": None, "os_thread_id": 10, "frames": [
        {"name": "<module>", "filename": "/w/train.py", "line": 7, "locals": [
            {"name": "iter_num", "repr": "41", "arg": False, "global": True},
            {"name": "lr", "repr": "<float>", "arg": False, "global": "yes"}]}]}],
        "loops": {"/w/train.py:7": [loop]}}
    r = parse.apply_dump(RankSnapshot(node="n", pid=10, start_time=1), item)
    (frame,) = r.threads[0].frames
    assert frame.locals == (Local("iter_num", "41"), Local("lr", "<float>"))
    assert frame.iteration == (("iter_num", "41"),)
    assert from_dict(RankSnapshot, json.loads(json.dumps(to_dict(r)))) == r


def test_a_command_line_of_megabytes_is_read_bounded() -> None:
    # Linux lets a command line be megabytes (ARG_MAX); no summary, screen or snapshot file needs them all
    huge = [f"--arg{i}=" + "x" * 100_000 for i in range(10)] + [f"a{i}" for i in range(1000)]
    rank = parse.rank_from_discover("n", {"pid": 7, "cmdline": ["python", *huge], "exe": "/" + "p" * 100_000})
    assert len(rank.cmdline) == parse.MAX_ARGV and rank.cmdline[0] == "python"
    assert max(map(len, rank.cmdline)) == parse.MAX_ARG and len(rank.exe) == parse.MAX_ARG
    process = parse.process_from_discover("n", {"pid": 8, "role": "launcher", "cmdline": ["torchrun", *huge]})
    assert process is not None and len(process.cmdline) == parse.MAX_ARGV
    assert max(map(len, process.cmdline)) == parse.MAX_ARG
    # nor does the table of repeated lists keep the node's text of megabytes in a key
    from app.decode import kwait

    kwait._STR_TUPLES.clear()
    parse.rank_from_discover("n", {"pid": 9, "cmdline": ["python", *huge[:10]]})
    assert len(kwait._STR_TUPLES) == 0
    parse.rank_from_discover("n", {"pid": 9, "cmdline": ["python", "train.py"]})
    assert len(kwait._STR_TUPLES) == 1
