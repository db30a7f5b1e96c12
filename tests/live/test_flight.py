"""PyTorch's Flight Recorder, when a job runs with it: read on the node, parsed, compared between ranks, shown.

Live: a 2-rank local gloo job (`dataloader`: rank 1 blocks reading its batch at step 3, rank 0 waits in that
step's all_reduce) run under torch's worker_main() (app/demo/job.py --worker-server), read through the real
worker protocol. Dump files are written here from that job's own record, as torch writes them (JSON, or a
pickle of the same plain data); a pickle that references a global is the one fake: no job writes such a file.
"""

from __future__ import annotations

import http.client
import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import jobs
from procstate import wait_exec
from app.decode import replies as parse
from app.analysis import analyze
from app.analysis.flight import flight_analysis, rank_text
from app.analysis.prose import render
from app.analysis.text import summary_text
from app.model import CollectOptions, FlightGroup, FlightRecord, RankSnapshot, Snapshot
from app.decode.flight import flight_record
from worker_client import WorkerProc
from workers.collect import flight

# --- live: a job that serves its record --------------------------------------------------------------------


@pytest.fixture(scope="module")
def job(torch_support: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[jobs.Job]:
    sockets = tmp_path_factory.mktemp("fr")
    started = jobs.start_local_job("dataloader", nproc=2, culprit=1, extra_args=["--worker-server", str(sockets)])
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def collected(job: jobs.Job) -> Snapshot:
    """Both ranks discovered and dumped by the real worker, parsed as the session parses them."""
    pids = {loc.host_pid for loc in job.ranks.values()}
    with WorkerProc() as w:
        found, done = w.call("discover", {"pids": sorted(pids)})
        assert done["type"] == "done", done
        ranks = {i["pid"]: parse.rank_from_discover("local", i) for i in found if i["pid"] in pids}
        items, done = w.call("dump", {"targets": [{"pid": r.pid, "start_time": r.start_time}
                                                  for r in ranks.values()]})
        assert done["type"] == "done", done
    dumped = tuple(sorted((parse.apply_dump(ranks[i["pid"]], i) for i in items), key=lambda r: r.rank or 0))
    return Snapshot(taken_at=time.time(), options=CollectOptions(), ranks=dumped)


def test_each_rank_serves_its_own_record_with_its_sequence_numbers(job: jobs.Job, collected: Snapshot) -> None:
    r0, r1 = collected.ranks
    assert (r0.env_value("TORCH_WORKER_SERVER_SOCKET") or "").endswith("/rank0.sock"), r0.env
    for r in (r0, r1):
        assert r.flight is not None and r.flight.source == "worker_server", r.flight
        assert r.flight.path == r.env_value("TORCH_WORKER_SERVER_SOCKET") and r.flight.version
    g0 = {g.pg_id: g for g in r0.flight.groups}  # type: ignore[union-attr]
    g1 = {g.pg_id: g for g in r1.flight.groups}  # type: ignore[union-attr]
    # steps 0-3 alternate between groups 1 and 2; rank 0 issued step 3's all_reduce, rank 1 never got there
    assert (g0["1"].last_enqueued, g0["1"].last_completed, g0["2"].last_enqueued, g0["2"].last_completed) == (2, 2, 2, 1)
    assert (g1["1"].last_enqueued, g1["1"].last_completed, g1["2"].last_enqueued, g1["2"].last_completed) == (2, 2, 1, 1)
    assert g0["2"].last_collective == "gloo:all_reduce" and r0.flight.entries[-1].collective_seq_id == 2  # type: ignore[union-attr]
    # torch's own name of each group, read from the entries (the same on every rank, where ids need not be)
    assert [(g0[p].global_name, g1[p].global_name) for p in ("1", "2")] == [("1", "1"), ("2", "2")]
    assert rank_text(r0.flight) == ("pg 1: #2 issued, #2 completed; pg 2: #2 issued, #1 completed "
                                    "(gloo:all_reduce)")
    for loc in job.ranks.values():  # asking the ranks' own servers left them as they were: alive and waiting
        assert jobs._main_thread(loc.host_pid) is not None


def test_the_rank_behind_is_flagged_and_every_rank_shown_next_to_the_stacks(collected: Snapshot) -> None:
    a = analyze(collected)
    lag = next(f for f in a.findings if f.kind == "collective_lag")
    assert lag.title == "rank 1 is behind in process group 2: last collective issued #1 where 1 other is at #2"
    assert lag.ranks == ((collected.ranks[1].node, collected.ranks[1].pid),)
    assert lag.confidence == "low", "two ranks: either may be the odd one"
    assert "behind in pg 2: #1 vs #2 (gloo:all_reduce)" in lag.detail
    # the recorder's sequence numbers, the stacks and the rank's own wait name the same rank; the headline leads
    # with why (its main thread blocked reading its loader's socket), and the graph keeps the recorder's edge
    stack = next(f for f in a.findings if f.kind == "minority_stack")
    first = a.findings[0]
    assert first.kind == "blocked" and first.ranks == stack.ranks == lag.ranks, first
    assert "`socket.recv` at `StreamingLoader._recv_exact`" in first.title, first.title
    assert a.culprit is not None and a.culprit.fact.kind == "blocked"
    edges = " ".join(f"{e.kind}: {e.evidence}" for e in a.waits[0].edges)
    assert "pg 2: seq #1 vs #2" in edges, edges
    text = " ".join(summary_text(collected, a, width=200).split())
    assert ("Flight recorder: last collective per process group, from their worker servers of 2 of 2 ranks "
            "that enable it:") in text
    assert "rank 0 on local: pg 1: #2 issued, #2 completed; pg 2: #2 issued, #1 completed (gloo:all_reduce)" in text
    assert "rank 1 on local: pg 1: #2 issued, #2 completed; pg 2: #1 issued, #1 completed" in text
    stored = a.to_dict()["flight"]
    assert stored["state"] == "recorded" and stored["recorded"] == 2


@pytest.fixture(scope="module")
def set_in_python(torch_support: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Snapshot]:
    """A job whose ranks set TORCH_WORKER_SERVER_SOCKET in os.environ just before worker_main(), as many
    training scripts do: the Flight Recorder is on (launch environment), the socket is not in /proc/PID/environ."""
    sockets = tmp_path_factory.mktemp("fr-in-python")
    started = jobs.start_local_job("dataloader", nproc=2, culprit=1, extra_env={"TORCH_FR_BUFFER_SIZE": "2000"},
                                   extra_args=["--worker-server", str(sockets), "--worker-server-set-in-python"])
    try:
        pids = {loc.host_pid for loc in started.ranks.values()}
        with WorkerProc() as w:
            found, done = w.call("discover", {"pids": sorted(pids)})
            assert done["type"] == "done", done
            ranks = {i["pid"]: parse.rank_from_discover("local", i) for i in found if i["pid"] in pids}
            items, done = w.call("dump", {"targets": [{"pid": r.pid, "start_time": r.start_time}
                                                      for r in ranks.values()]})
            assert done["type"] == "done", done
        dumped = tuple(sorted((parse.apply_dump(ranks[i["pid"]], i) for i in items), key=lambda r: r.rank or 0))
        yield Snapshot(taken_at=time.time(), options=CollectOptions(), ranks=dumped)
        for loc in started.ranks.values():  # asking their listening sockets left the ranks alive and waiting
            assert jobs._main_thread(loc.host_pid) is not None
    finally:
        started.stop()


def test_a_worker_server_set_inside_python_is_found_by_its_listening_socket(set_in_python: Snapshot) -> None:
    r0, r1 = set_in_python.ranks
    for rank, r in ((0, r0), (1, r1)):
        assert r.env_value("TORCH_WORKER_SERVER_SOCKET") is None, "set in os.environ only: not in environ"
        assert r.flight is not None and r.flight.source == "worker_server", r.flight
        assert r.flight.path.endswith(f"/rank{rank}.sock"), r.flight.path
        assert any("found by its listening socket" in n for n in r.flight.notes), r.flight.notes
    g0 = {g.pg_id: g for g in r0.flight.groups}  # type: ignore[union-attr]
    g1 = {g.pg_id: g for g in r1.flight.groups}  # type: ignore[union-attr]
    assert (g0["2"].last_enqueued, g1["2"].last_enqueued) == (2, 1)  # the record itself, as with the env var
    lag = next(f for f in analyze(set_in_python).findings if f.kind == "collective_lag")
    assert lag.ranks == ((r1.node, r1.pid),)


@pytest.fixture
def impostor(job: jobs.Job, tmp_path: Path) -> Iterator[subprocess.Popen]:
    """A process claiming rank 0's socket in its environment, and a dump-file prefix under tmp_path."""
    env = dict(os.environ, RANK="0", TORCH_FR_BUFFER_SIZE="2000", TORCH_WORKER_SERVER_SOCKET=_socket_of(job, 0),
               TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "fr_trace_"))
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], env=env,
                          stdin=subprocess.PIPE) as proc:  # the with closes its stdin pipe too
        try:
            wait_exec(proc.pid)  # its environment is what the tests read
            yield proc
        finally:
            proc.kill()


def _socket_of(job: jobs.Job, rank: int) -> str:
    env = Path(f"/proc/{job.ranks[rank].host_pid}/environ").read_bytes().split(b"\0")
    return next(e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"TORCH_WORKER_SERVER_SOCKET="))


def _live_record(job: jobs.Job) -> dict:
    """Rank 0's record as its server gives it, untrimmed (what torch writes to a dump file as JSON)."""
    fd = os.open(_socket_of(job, 0), os.O_PATH)
    try:
        return flight._decode(_post(fd))
    finally:
        os.close(fd)


def _post(fd: int) -> bytes:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)

    class Connection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = s

    try:
        s.connect(f"/proc/self/fd/{fd}")
        conn = Connection("localhost", timeout=5)
        conn.request("POST", flight.HANDLER)
        return conn.getresponse().read()
    finally:
        s.close()


def test_a_socket_the_rank_does_not_listen_on_is_not_asked(impostor: subprocess.Popen) -> None:
    got = flight.collect(impostor.pid)
    assert got is not None and got["record"] is None and got["source"] == ""
    assert any("does not listen on it" in n for n in got["notes"]), got["notes"]
    assert any("not written (gloo writes none by itself)" in n for n in got["notes"]), got["notes"]
    summary, findings = flight_analysis([_rank(impostor.pid, flight_record(got))])
    assert summary is not None and summary.state == "no_record" and findings == []
    assert "enabled on 1 rank but no record could be read" in summary.line and "worker_main()" in summary.line


def test_dump_files_as_torch_writes_them_json_or_plain_pickle(job: jobs.Job, impostor: subprocess.Popen,
                                                              tmp_path: Path) -> None:
    record = _live_record(job)
    path = tmp_path / "fr_trace_0"
    for data in (json.dumps(record).encode(), pickle.dumps(record, protocol=2)):
        path.write_bytes(data)
        got = flight.collect(impostor.pid)
        assert got is not None and got["source"] == "dump_file" and got["path"] == str(path), got
        assert got["written_at"] == pytest.approx(path.stat().st_mtime)
        parsed = flight_record(got)
        assert parsed is not None and {g.pg_id: g.last_enqueued for g in parsed.groups} == {"1": 2, "2": 2}


def test_dump_files_that_must_not_be_read(job: jobs.Job, impostor: subprocess.Popen, tmp_path: Path) -> None:
    path = tmp_path / "fr_trace_0"
    witness = tmp_path / "code-ran"
    # the one fake: a pickle that would run a command; no job writes such a file, an attacker could
    path.write_bytes(b"cos\nsystem\n(S'touch %s'\ntR." % str(witness).encode())
    assert _notes(impostor) == ["neither JSON nor a plain-data pickle (UnpicklingError)"]
    assert not witness.exists()
    path.write_text(json.dumps(_live_record(job)))
    old = time.time() - 3600
    os.utime(path, (old, old))
    assert _notes(impostor) == ["older than the rank: left by an earlier run"]
    path.unlink()
    path.symlink_to("/etc/passwd")
    assert _notes(impostor)[0].startswith("cannot open: ")


def _notes(proc: subprocess.Popen) -> list[str]:
    got = flight.collect(proc.pid)
    assert got is not None and got["record"] is None
    return [n.split(": ", 1)[1] for n in got["notes"] if n.startswith("dump file ")]


def _rank(pid: int, record: Any, rank: int = 0) -> RankSnapshot:
    return RankSnapshot(node="local", pid=pid, start_time=1, rank=rank, world_size=2, collected=True,
                        env=(("TORCH_FR_BUFFER_SIZE", "2000"),), flight=record)


# --- pure: parsing and comparing records ------------------------------------------------------------------


def record(**pgs: tuple) -> FlightRecord:
    """pg id -> (last enqueued, last completed)."""
    return FlightRecord("worker_server", "/s", groups=tuple(
        FlightGroup(pg.lstrip("g"), last_enqueued=e, last_completed=c, last_collective="gloo:all_reduce")
        for pg, (e, c) in pgs.items()))


def test_parsing_takes_json_strings_and_pickle_integers_and_ignores_junk() -> None:
    for status in ({"last_enqueued_collective": "7", "last_completed_collective": "6",
                    "last_started_collective": "-1"},
                   {"last_enqueued_collective": 7, "last_completed_collective": 6, "last_started_collective": -1}):
        raw = {"source": "dump_file", "path": "/tmp/fr_3", "written_at": 5.0, "notes": [],
               "record": {"version": "2.10", "pg_status": {"0": status, 1: "junk"},
                          "entries": [{"pg_id": 0, "collective_seq_id": 7, "profiling_name": "gloo:barrier",
                                       "record_id": 9}, {"collective_seq_id": "x"}, "junk"]}}
        r = flight_record(raw)
        assert r is not None and r.written_at == 5.0 and len(r.entries) == 1
        assert r.groups == (FlightGroup("0", "", 7, None, 6, "gloo:barrier"),)
    assert flight_record(None) is None and flight_record("junk") is None
    empty = flight_record({"enabled": {"TORCH_FR_BUFFER_SIZE": "1"}, "record": None, "notes": ["why"]})
    assert empty is not None and empty.source == "" and empty.notes == ("why",)


def test_each_group_is_named_as_torch_names_it_on_every_rank_with_its_members() -> None:
    """pg_status is keyed by the rank's own group id (it counts only the groups the rank is a member of), pg_config
    by torch's group name: the entries (pg_id and process_group's name, as the worker sends them) join the two.
    The members are read as digits, never evaluated."""
    raw = {"source": "worker_server", "path": "/s", "notes": [],
           "record": {"pg_status": {"0": {"last_enqueued_collective": 4}, "1": {"last_enqueued_collective": 3}},
                      "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"},
                                    "3": {"name": "3", "desc": "tp_b", "ranks": "[4, 5, 6, 7]"}},
                      "entries": [{"pg_id": 0, "pg_name": "0", "collective_seq_id": 4, "record_id": 1},
                                  {"pg_id": 1, "pg_name": "3", "collective_seq_id": 3, "record_id": 2}]}}
    r = flight_record(raw)
    assert r is not None
    g = {x.pg_id: x for x in r.groups}
    assert (g["1"].name, g["1"].global_name, g["1"].members) == ("tp_b", "3", (4, 5, 6, 7))
    assert (g["0"].global_name, g["0"].members) == ("0", tuple(range(8)))
    for hostile in ("[4, __import__('os')]", "4, 5", "[" + ", ".join(["1"] * 200_000) + "]", 7):
        raw["record"]["pg_config"]["3"]["ranks"] = hostile  # type: ignore[index]
        r = flight_record(raw)
        assert r is not None and {x.pg_id: x for x in r.groups}["1"].members == ()


def test_a_few_ranks_behind_in_one_group_and_ahead_in_another() -> None:
    """The skip scenario with the recorder: the culprit skipped step K's collective in one group and issued
    step K+1's in the other."""
    ranks = [_rank(100 + i, record(g1=(3, 3), g2=(2, 1)), rank=i) for i in range(4)]
    ranks[2] = _rank(102, record(g1=(4, 3), g2=(1, 1)), rank=2)
    found = flight_analysis(ranks)[1]
    assert len(found) == 1
    f = render(found[0])  # the detector's fact, in the words a finding shows
    assert f.title == ("rank 2 is behind in process group 2: last collective issued #1 where 3 others are at #2, "
                       "and waits in process group 1's collective #4 (gloo:all_reduce) instead, which no other rank "
                       "has issued")
    assert f.confidence == "high" and f.ranks == (("local", 102),)
    assert f.detail.startswith("Flight recorder: ahead in pg 1: #4 vs #3 (gloo:all_reduce); behind in pg 2: "
                               "#1 vs #2 (gloo:all_reduce).")


def test_equal_records_flag_nobody_and_a_job_without_the_recorder_gets_one_line() -> None:
    same = [_rank(100 + i, record(g0=(5, 5)), rank=i) for i in range(3)]
    summary, found = flight_analysis(same)
    assert found == [] and summary is not None and len(summary.rows) == 1
    assert summary.rows[0].label == "ranks 0-2 on local"
    plain = [RankSnapshot(node="n", pid=i, start_time=1, rank=i) for i in range(3)]
    summary, found = flight_analysis(plain)
    assert found == [] and summary is not None and summary.state == "unused"
    assert summary.line == ("Flight recorder: not used by this job (no TORCH_FR_BUFFER_SIZE or "
                            "TORCH_NCCL_TRACE_BUFFER_SIZE in the ranks' environment)")
    assert flight_analysis([]) == (None, [])
