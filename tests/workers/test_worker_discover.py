"""Discovery through the real worker: ranks by environment and parentage, helpers, launchers, secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from worker_client import WorkerProc
from worker_targets import PROG, Target, copy_as, start_rank, wait_blocked, without_sudo
from workers import discover, procinfo
from waiting import wait_until

SECRET_TOKEN = "hf_" + "Q" * 34
SECRET_PASSWORD = "hunter2-very-secret"


def discover_all(w: WorkerProc, **args: object) -> tuple:
    items, done = w.call("discover", dict(args))
    assert done["type"] == "done", done
    return {i["pid"]: i for i in items}, done["data"]


def test_rank_found_and_data_loader_child_is_not_a_rank() -> None:
    with start_rank(1, ["--helper"]) as t, WorkerProc() as w:
        rank_pid, helper_pid = int(t.ready[0]), int(t.ready[1])
        ranks, done = discover_all(w)
        assert rank_pid in ranks and helper_pid not in ranks
        r = ranks[rank_pid]
        assert (r["rank"], r["local_rank"], r["world_size"]) == (1, 1, 2)
        assert r["children"] == [helper_pid]
        assert r["start_time"] == procinfo.start_time(rank_pid)
        assert r["state"] == "S" and r["num_threads"] == 2 and r["rss"] > 1 << 20
        assert r["exe"] == os.path.realpath(sys.executable) and r["uid"] == os.getuid()
        assert r["cmdline"][1:] == [PROG, "rank", "--helper"]
        assert ("RANK", "1") in [tuple(e) for e in r["env"]]
        assert r["in_container"] is False and r["nspid"] is None
        assert done["count"] == len(ranks) and done["scanned"] > 0 and done["unreadable"] == 0


def test_launcher_is_named_and_not_counted(tmp_path: str) -> None:
    # torchrun started by srun carries SLURM_PROCID like its ranks; it is the launcher, not a rank.
    script = copy_as(str(tmp_path), "torchrun")
    env = dict(os.environ, SLURM_PROCID="0")
    with Target([sys.executable, script, "launcher", "2"], env=env) as t, WorkerProc() as w:
        launcher_pid, kids = int(t.ready[0]), [int(p) for p in t.ready[1:]]
        for k in kids:
            wait_blocked(k)
        ranks, _ = discover_all(w)
        assert launcher_pid not in ranks
        assert sorted(r["rank"] for p, r in ranks.items() if p in kids) == [0, 1]
        for k in kids:
            r = ranks[k]
            assert r["launcher"] == "torchrun" and r["launcher_pid"] == launcher_pid
            assert (r["master_addr"], r["master_port"], r["local_world_size"]) == ("127.0.0.1", 29555, 2)


def test_secrets_in_argv_and_environment_never_leave_the_node() -> None:
    env = {"HF_TOKEN": SECRET_TOKEN, "NCCL_IB_AUTH_TOKEN": SECRET_PASSWORD, "NCCL_DEBUG": "INFO",
           "AWS_SECRET_ACCESS_KEY": SECRET_PASSWORD}
    with start_rank(0, ["--password", SECRET_PASSWORD, "--hf_token=" + SECRET_TOKEN, "--lr", "0.1"], **env) \
            as t, WorkerProc() as w:
        items, done = w.call("discover")
        text = json.dumps(items) + json.dumps(done)
        assert SECRET_PASSWORD not in text and SECRET_TOKEN not in text
        r = {i["pid"]: i for i in items}[int(t.ready[0])]
        assert r["cmdline"][-6:] == ["rank", "--password", "***", "--hf_token=***", "--lr", "0.1"]
        env_out = dict(tuple(e) for e in r["env"])
        assert env_out["NCCL_IB_AUTH_TOKEN"] == "***" and env_out["NCCL_DEBUG"] == "INFO"
        assert "HF_TOKEN" not in env_out and "AWS_SECRET_ACCESS_KEY" not in env_out  # not allowlisted


def test_the_workers_own_tree_is_skipped_even_with_rank_variables() -> None:
    # e.g. the worker run by hand inside an srun allocation: its shell and itself carry SLURM_PROCID.
    with WorkerProc(env={"RANK": "0", "SLURM_PROCID": "0"}) as w:
        ranks, _ = discover_all(w)
        assert w.proc.pid not in ranks


def test_pids_argument_reports_exactly_those() -> None:
    with start_rank(0, ["--helper"]) as t, WorkerProc() as w:
        helper_pid = int(t.ready[1])
        ranks, done = discover_all(w, pids=[helper_pid, 999999999])
        assert list(ranks) == [helper_pid] and done["count"] == 1


def test_match_picks_processes_by_command_line_leaving_their_launcher_out(tmp_path) -> None:
    """--match: python processes whose command line matches, rank environment or not; the launcher whose own
    command line names the same words is left out, as is hangscope's own process passing the pattern."""
    tag = f"hsmatch-{os.getpid()}"
    plain_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    script = copy_as(str(tmp_path), "mylauncher")
    with Target([sys.executable, PROG, "rank", tag], env=plain_env) as plain, \
            Target([sys.executable, script, "launcher", "2", tag], env=plain_env) as launched, \
            Target([sys.executable, PROG, "busy", "--match", tag], env=plain_env) as asking, WorkerProc() as w:
        plain_pid, launcher_pid = int(plain.ready[0]), int(launched.ready[0])
        kids = sorted(int(p) for p in launched.ready[1:])
        wait_blocked(plain_pid)
        unmatched, _ = discover_all(w)
        assert plain_pid not in unmatched  # no rank environment, no torch: discovery alone skips it
        ranks, done = discover_all(w, match=f"rank {tag}$")
        assert sorted(ranks) == sorted([plain_pid] + kids), ranks.keys()
        assert launcher_pid not in ranks and int(asking.ready[0]) not in ranks
        assert sorted(ranks[k]["rank"] for k in kids) == [0, 1] and ranks[plain_pid]["rank"] is None
        assert ranks[plain_pid]["found_by"] == "--match" and ranks[kids[0]]["found_by"] == "rank environment"
        assert done["count"] == 3
        wide, _ = discover_all(w, match=tag)  # the launcher's line matches too: it is above the kids, left out
        assert launcher_pid not in wide and set(kids) <= set(wide)
        none, done = discover_all(w, match="no-such-process-xyz")
        assert none == {} and any("matching --match no-such-process-xyz" in n for n in done["notes"])
        items, bad = w.call("discover", {"match": "train(["})
        assert bad["type"] == "error" and "not a regular expression" in bad["message"], bad


def test_psutil_and_procfs_find_the_same_ranks() -> None:
    with start_rank(0, ["--helper"]) as t0, start_rank(1) as t1:
        by_source = []
        for src in (procinfo.PsutilSource(), procinfo.ProcfsSource()):
            found = discover.Scan(src, me=-1).ranks()  # the targets are in this test's own tree
            by_source.append({r["pid"]: r for r in found if r["pid"] in (t0.pid, t1.pid)})
        assert len(by_source[0]) == 2
        assert by_source[0] == by_source[1]
        # and through the worker: a stdlib-only worker (no psutil) reports what a psutil one does
        with WorkerProc() as w, WorkerProc(python="/usr/bin/python3", isolated=True) as wi:
            assert w.hello["psutil"] and not wi.hello["psutil"]
            a, _ = discover_all(w)
            b, _ = discover_all(wi)
            moving = ("cpu_time", "counters")  # read at different moments: they move (slow vs stuck)
            for pid in (t0.pid, t1.pid):
                assert {k: v for k, v in a[pid].items() if k not in moving} == \
                    {k: v for k, v in b[pid].items() if k not in moving}
                assert set(a[pid]["counters"]) == set(b[pid]["counters"]), "the same counters either way"
                assert a[pid]["counters"]["cgroup"] == b[pid]["counters"]["cgroup"] or \
                    a[pid]["counters"]["cgroup"]["path"] == b[pid]["counters"]["cgroup"]["path"]


def test_a_process_gone_mid_scan_is_gone_for_both_sources() -> None:
    t = start_rank(0)
    pid = t.pid
    t.kill()
    for src in (procinfo.PsutilSource(), procinfo.ProcfsSource()):
        with pytest.raises(procinfo.Gone):
            src.read(pid)


def test_other_users_processes_are_counted_as_unreadable() -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to run the worker as another user")
    with start_rank(0) as t, WorkerProc(python="/usr/bin/python3", isolated=True,
                                        prefix=["setpriv", "--reuid=65534", "--regid=65534",
                                                "--clear-groups"]) as w:
        ranks, done = discover_all(w)
        assert t.pid not in ranks
        assert done["unreadable"] >= 1
        assert any("could not be inspected" in n and "--sudo" in n for n in done["notes"])


def test_sudo_for_other_users_processes_needs_sudo(tmp_path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to run the worker as another user")
    with start_rank(0) as t, WorkerProc(python="/usr/bin/python3", isolated=True,
                                        prefix=[*without_sudo(str(tmp_path)), "setpriv", "--reuid=65534",
                                                "--regid=65534", "--clear-groups"]) as w:
        assert w.hello["tools"]["sudo"] is None, "a node without sudo"
        ranks, done = discover_all(w, sudo=True)
        assert t.pid not in ranks and done["unreadable"] >= 1
        assert any("sudo is not on this node" in n for n in done["notes"])


def _image(pid: int) -> tuple:
    """The process image as the worker's cache tells it (its start time and procinfo.exec_key)."""
    try:
        fields = procinfo.stat_fields(pid)
        return fields[21], procinfo.exec_key(fields)
    except (OSError, IndexError, procinfo.Gone):
        return ()


class CountingSource:
    """The /proc reader, counting full reads: what a refresh with the worker's cache must not repeat."""

    name = "procfs"

    def __init__(self) -> None:
        self.inner = procinfo.ProcfsSource()
        self.reads: list = []
        self.listed: list = []  # the pids of each scan
        self.images: list = []  # pid -> (start time, executable) at each scan
        self.failed: list = []  # the pids each scan failed to read

    def changed(self) -> set:
        """The pids of the last scan that are new since the one before, or ran another image at some moment of
        the two scans (as each began and as each ended): a process that exec'd while a scan ran is a new process
        to the cache too, whichever side of our own look at it the exec fell."""
        looks = self.images[-4:]  # the scan before (begin, end), this one (begin, end)
        new = {pid for pid in self.listed[-1] if len({look.get(pid) for look in looks}) > 1}
        return new | self.failed[-2]  # a process the scan before could not read (it exited, or exec'd) is not known


    def pids(self) -> list:
        self.listed.append(set(self.inner.pids()))
        self.failed.append(set())
        # each process's image as listed: other work on the machine (another xdist worker's jobs, other users)
        # execs processes between two scans, and a new image is a new process to the cache (read again, rightly)
        self.observe()
        return sorted(self.listed[-1])

    def observe(self) -> None:
        """The images of the listed processes now (at a scan's beginning, and again at its end)."""
        self.images.append({pid: _image(pid) for pid in self.listed[-1]})

    def read(self, pid: int, with_environ: bool = True, stat=None):  # type: ignore[no-untyped-def]
        self.reads.append(pid)
        try:
            return self.inner.read(pid, with_environ=with_environ, stat=stat)
        except Exception:
            self.failed[-1].add(pid)
            raise


def test_a_refresh_reads_only_new_processes_in_full_and_sees_ranks_come_and_go() -> None:
    cache = discover.ProcCache()
    src = CountingSource()

    def scan() -> dict:
        src.reads.clear()
        try:
            return {r["pid"]: r for r in discover.Scan(src, me=-1, cache=cache).ranks()}
        finally:
            src.observe()

    with start_rank(0, ["--helper"]) as t0:
        first = scan()
        assert t0.pid in first and t0.pid in src.reads
        again = scan()
        # only processes that did not exist at the first scan are read in full (this machine starts others
        # meanwhile); everything that was there comes from the cache
        assert set(src.reads) <= src.changed(), "a known process was read again"
        assert t0.pid not in src.reads
        volatile = {"cpu_time", "rss", "state", "wchan", "num_threads"}
        assert {k: v for k, v in again[t0.pid].items() if k not in volatile} == \
            {k: v for k, v in first[t0.pid].items() if k not in volatile}
        with start_rank(1) as t1:
            found = scan()
            assert t1.pid in found and t1.pid in src.reads and t0.pid not in src.reads
            assert found[t1.pid]["rank"] == 1
        gone = scan()
        assert t1.pid not in gone and t0.pid in gone
    assert t0.pid not in scan()


EXEC_INTO_RANK = """
import os, sys, time
ready, go, prog = sys.argv[1:4]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
env = dict(os.environ, RANK="3", LOCAL_RANK="0", WORLD_SIZE="4")
os.execve(sys.executable, [sys.executable, prog, "rank"], env)
"""


def test_a_python_process_that_execs_into_a_rank_is_found_on_the_next_refresh(tmp_path) -> None:
    # python exec'ing python keeps its pid, start time and comm: the cache must still see a new image
    ready, go = str(tmp_path / "ready"), str(tmp_path / "go")
    # started through a shell that exits, so the process is not in this test's (the worker's) tree
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    out = subprocess.run(["sh", "-c", '"$0" -c "$1" "$2" "$3" "$4" >/dev/null 2>&1 & echo $!', sys.executable,
                          EXEC_INTO_RANK, ready, go, PROG], env=env, capture_output=True, text=True, check=True)
    pid = int(out.stdout.split()[0])
    try:
        with WorkerProc() as w:
            wait_until(lambda: os.path.exists(ready), 20, "the process to start")
            before, _ = discover_all(w)
            assert pid not in before, "no rank environment yet"
            open(go, "w").close()
            after = wait_until(lambda: (lambda found: found if pid in found else None)(discover_all(w)[0]), 20,
                               "the exec'd rank to be found", interval=0.05)
            assert after[pid]["rank"] == 3 and after[pid]["cmdline"][1:] == [PROG, "rank"]
    finally:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def test_collect_discovers_then_dumps_what_it_found_in_one_request() -> None:
    # the session's one request per pass: rank items, one `discovered`, then a dump item per rank
    with start_rank(0) as t0, start_rank(1) as t1, WorkerProc() as w:
        items, done = w.call("collect", {"pids": [t0.pid, t1.pid], "locals": True, "loops": True,
                                         "source_context": 1})
        assert done["type"] == "done", done
        kinds = [next(iter(i)) for i in items]
        assert kinds == ["rank", "rank", "discovered", "dump", "dump"], kinds
        assert {i["rank"]["pid"] for i in items[:2]} == {t0.pid, t1.pid}
        assert items[2]["discovered"]["count"] == 2
        dumps = {i["dump"]["pid"]: i["dump"] for i in items[3:]}
        assert set(dumps) == {t0.pid, t1.pid} and all(d["ok"] for d in dumps.values())
        assert dumps[t0.pid]["start_time"] == procinfo.start_time(t0.pid)
        assert done["data"]["discover"]["count"] == 2 and done["data"]["dump"]["count"] == 2
        # nothing found: no dumps, still one `discovered` and a done
        items, done = w.call("collect", {"pids": [999999999]})
        assert [next(iter(i)) for i in items] == ["discovered"] and done["data"]["dump"]["count"] == 0
