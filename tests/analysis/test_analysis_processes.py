"""The job's process tree, launchers without ranks, and the dump skew line (app/analysis/processes.py), on built
snapshots; the live counterparts are in tests/live/test_cluster_processes.py."""

from __future__ import annotations

from app.analysis import analyze, job_keys, only_job
from app.analysis.processes import LARGE_SKEW, rank_family, skew_line, tree_lines
from app.model import JobProcess, RankSnapshot, Snapshot
from app.decode.replies import launcher_job


def rank(pid: int, number: int, ppid: int, node: str = "n1", job: str = "10.0.0.1:29500") -> RankSnapshot:
    return RankSnapshot(node=node, pid=pid, start_time=1, rank=number, ppid=ppid, job=job, state="S")


def proc(pid: int, role: str, kind: str, ppid: int, of: tuple = (), node: str = "n1",
         job: str = "10.0.0.1:29500") -> JobProcess:
    return JobProcess(node=node, pid=pid, start_time=1, role=role, kind=kind, ppid=ppid, of=of, job=job,  # type: ignore[arg-type]
                      state="S")


def test_the_tree_puts_srun_above_torchrun_above_its_ranks_above_their_children() -> None:
    snap = Snapshot(taken_at=0.0, ranks=(rank(20, 0, 10), rank(21, 1, 10)),
                    processes=(proc(5, "launcher", "srun", 1, (20, 21)), proc(10, "launcher", "torchrun", 5, (20, 21)),
                               proc(30, "child", "data-loader worker", 20, (20,)),
                               proc(31, "child", "subprocess", 21, (21,))))
    lines = tree_lines(snap)
    assert [line.strip().split(" [")[0] for line in lines] == [
        "job 10.0.0.1:29500", "n1", "srun pid 5", "torchrun pid 10", "rank 0 (pid 20)", "data-loader worker pid 30",
        "rank 1 (pid 21)", "subprocess pid 31"]
    depth = [len(line) - len(line.lstrip()) for line in lines]
    assert depth == [0, 2, 4, 6, 8, 10, 8, 10]


def test_a_ranks_own_view_shows_its_launchers_above_and_only_its_children_below() -> None:
    r0, r1 = rank(20, 0, 10), rank(21, 1, 10)
    other_node = rank(20, 2, 10, node="n2")
    snap = Snapshot(taken_at=0.0, ranks=(r0, r1, other_node),
                    processes=(proc(5, "launcher", "srun", 1, (20, 21)), proc(10, "launcher", "torchrun", 5, (20, 21)),
                               proc(30, "child", "data-loader worker", 20, (20,)),
                               proc(31, "child", "subprocess", 21, (21,)),
                               proc(10, "launcher", "torchrun", 1, (20,), node="n2")))
    lines = rank_family(snap, r0)
    assert [line.strip().split(" [")[0] for line in lines] == [
        "srun pid 5", "torchrun pid 10", "rank 0 (pid 20)", "data-loader worker pid 30"]
    assert lines[2].endswith("(this rank)")
    assert [len(line) - len(line.lstrip()) for line in lines] == [0, 2, 4, 6]
    assert [line.strip().split(" [")[0] for line in rank_family(snap, other_node)] == [
        "torchrun pid 10", "rank 2 (pid 20)"]  # the same pids on another node are another family
    assert rank_family(Snapshot(taken_at=0.0, ranks=(r0,)), r0) == []  # nothing above or below: nothing to add


def test_a_job_with_launchers_and_no_rank_is_a_job_not_nothing_found() -> None:
    lone = proc(7, "launcher", "torchrun", 1, job="10.0.0.4:1234", node="n4")
    snap = Snapshot(taken_at=0.0, ranks=(rank(20, 0, 10),), processes=(proc(10, "launcher", "torchrun", 1, (20,)), lone))
    assert set(job_keys(snap)) == {"10.0.0.1:29500", "10.0.0.4:1234"}
    only = only_job(snap, "10.0.0.4:1234")
    assert only.ranks == () and only.processes == (lone,)
    a = analyze(only)
    assert a.findings[0].kind == "launchers_only"
    assert a.verdict == "Job 10.0.0.4:1234 has 1 launcher on n4 and no rank yet."
    assert "no rank processes were found" not in " ".join(f.title for f in a.findings)
    assert analyze(Snapshot(taken_at=0.0)).findings[0].kind == "no_data"  # nothing at all is still nothing


def test_a_launchers_job_comes_from_its_rendezvous_endpoint_or_its_store_address() -> None:
    def job(*argv: str) -> str:
        return launcher_job(JobProcess(node="n1", pid=9, start_time=1, role="launcher", kind="torchrun",
                                       cmdline=argv))[0]

    assert job("python", "-m", "torch.distributed.run", "--rdzv-endpoint=10.0.0.1:29400", "x.py") == "10.0.0.1:29400"
    assert job("torchrun", "--master_addr", "10.0.0.2", "--master_port", "5000", "x.py") == "10.0.0.2:5000"
    assert job("torchrun", "--rdzv_endpoint", "localhost:29400", "x.py") == "localhost:29400 on n1"
    assert job("torchrun", "--standalone", "x.py") == "torchrun pid 9 on n1"


def test_the_skew_line_says_how_far_apart_the_dumps_started_and_flags_a_large_one() -> None:
    ranks = tuple(RankSnapshot(node=f"n{i}", pid=i, start_time=1, rank=i, dump_started=100.0 + i * 0.01,
                               dump_ended=100.2 + i * 0.01) for i in range(4))
    line = skew_line(Snapshot(taken_at=0.0, ranks=ranks, dump_skew=0.03))
    assert line.startswith("Dump skew: the 4 rank dumps on 4 nodes started within 0.030 s of each other")
    assert "large" not in line
    assert "large" in skew_line(Snapshot(taken_at=0.0, ranks=ranks, dump_skew=LARGE_SKEW + 0.5))
    assert skew_line(Snapshot(taken_at=0.0, ranks=ranks[:1])) == ""


def test_a_launcher_whose_ranks_have_ended_stays_in_the_job_of_its_rendezvous() -> None:
    from app.decode.replies import process_jobs

    def launcher(node: str, pid: int, of: tuple, endpoint: str = "10.9.0.3:7000") -> JobProcess:
        return JobProcess(node=node, pid=pid, start_time=1, role="launcher", kind="torchrun", of=of,
                          cmdline=("torchrun", f"--rdzv_endpoint={endpoint}", "fit.py"))

    ranks = (rank(50, 4, 40, node="n2", job="10.9.0.3:7123"),)
    procs = [launcher("n1", 40, ()), launcher("n2", 40, (50,)), launcher("n3", 41, ()),
             launcher("n4", 42, (), endpoint="10.9.0.8:7000")]
    jobs = [job for job, _ in process_jobs(procs, ranks)]
    # the agents in their exit barrier (no rank left) are the job of the one that still serves a rank; another
    # rendezvous stays a job of its own
    assert jobs == ["10.9.0.3:7123", "10.9.0.3:7123", "10.9.0.3:7123", "10.9.0.8:7000"]
    assert [job for job, _ in process_jobs(procs, ())] == ["10.9.0.3:7000"] * 3 + ["10.9.0.8:7000"]
