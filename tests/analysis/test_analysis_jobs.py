"""Jobs: each rank's job from the best evidence it carries, a snapshot of several jobs analysed job by job (the
verdict says which is hung, with its own culprit, and which progresses; nothing about one job's ranks is
concluded from the other's), and --job picking one."""

from __future__ import annotations

import dataclasses

import pytest

from analysis_snapshots import LOADING, job, snapshot
from app.decode import replies as parse
from app.analysis import analyze
from app.errors import InputError
from app.cli.headless import pick_job
from app.model import RankSnapshot


def discovered(**item: object) -> RankSnapshot:
    return parse.rank_from_discover("node02", dict({"pid": 42, "start_time": 1}, **item))


@pytest.mark.parametrize("item, expected", [
    ({"master_addr": "10.0.0.1", "master_port": 29500, "env": [["TORCHELASTIC_RUN_ID", "none"]]},
     ("10.0.0.1:29500", "MASTER_ADDR:MASTER_PORT")),
    ({"master_addr": "127.0.0.1", "master_port": 29500}, ("127.0.0.1:29500 on node02", "MASTER_ADDR:MASTER_PORT")),
    ({"env": [["TORCHELASTIC_RUN_ID", "none"]], "launcher": "torchrun", "launcher_pid": 7},
     ("torchrun pid 7 on node02", "launcher process")),
    ({"env": [["TORCHELASTIC_RUN_ID", "run-17"]]}, ("elastic run run-17", "TORCHELASTIC_RUN_ID")),
    ({"env": [["SLURM_JOB_ID", "4242"], ["SLURM_STEP_ID", "0"]]}, ("SLURM job 4242.0", "SLURM_JOB_ID, SLURM_STEP_ID")),
    ({}, ("", "")),
], ids=["store", "loopback-store", "elastic-none-then-launcher", "elastic-run", "slurm", "nothing"])
def test_the_job_comes_from_the_best_evidence(item: dict, expected: tuple) -> None:
    r = discovered(**item)
    assert (r.job, r.job_evidence) == expected


def two_jobs() -> list:
    hung = [dataclasses.replace(r, job="10.0.0.1:29500") for r in job(4, 2, rank3=LOADING)]
    healthy = [dataclasses.replace(r, job="10.0.0.1:29510", pid=r.pid + 100) for r in job(4, 2)]
    return hung + healthy


def moved(ranks: list) -> list:
    """The healthy job's ranks a moment later: somewhere else in their loop."""
    return [dataclasses.replace(r, threads=tuple(dataclasses.replace(t, frames=LOADING) for t in r.threads))
            if r.job == "10.0.0.1:29510" else r for r in ranks]


def test_two_jobs_are_analysed_each_on_its_own() -> None:
    ranks = two_jobs()
    earlier, later = snapshot(ranks, taken_at=1000.0), snapshot(moved(ranks), taken_at=1002.0)
    a = analyze(later, history=[earlier])
    assert a.verdict.startswith("Job 10.0.0.1:29500 (ranks 0-3 on node[01-02]) is hung: rank 3 is in `next_batch`")
    assert a.verdict.endswith("Job 10.0.0.1:29510 (ranks 0-3 on node[01-02]) is progressing, not hung.")
    healthy = {(r.node, r.pid) for r in ranks if r.job == "10.0.0.1:29510"}
    top = a.findings[0]
    assert top.title.startswith("job 10.0.0.1:29500: rank 3 is in") and top.ranks == (("node02", 1003),)
    for f in a.findings:
        assert not (f.culprit and f.confidence != "low" and healthy & set(f.ranks)), f
    # merged, the same ranks would mix: the healthy job's moving ranks read as "still running" culprits
    merged = analyze(dataclasses.replace(later, ranks=tuple(dataclasses.replace(r, job="") for r in later.ranks)),
                     history=[dataclasses.replace(earlier, ranks=tuple(dataclasses.replace(r, job="")
                                                                         for r in earlier.ranks))])
    assert any(healthy & set(f.ranks) for f in merged.findings if f.culprit)


def test_job_picks_one_job_by_name_or_a_part_that_names_one() -> None:
    snap = snapshot(two_jobs())
    one, _ = pick_job(snap, (), "29510")
    assert {r.job for r in one.ranks} == {"10.0.0.1:29510"} and len(one.ranks) == 4
    assert analyze(one).verdict.startswith("All 4 ranks wait in `all_reduce`")
    with pytest.raises(InputError, match="more than one job.*10.0.0.1:29500; 10.0.0.1:29510"):
        pick_job(snap, (), "10.0.0.1")
    with pytest.raises(InputError, match="names no job"):
        pick_job(snap, (), "29999")


def test_a_file_written_before_ranks_carried_their_job_gets_it_from_what_they_hold() -> None:
    from pathlib import Path

    from app.cli.headless import load_snapshot

    path = Path(__file__).resolve().parents[1] / "data" / "scenarios" / "dataloader.json"
    assert '"job": ""' in path.read_text()  # recorded before: the field is empty in the file
    snap = load_snapshot(str(path))
    (job_key,) = {r.job for r in snap.ranks}
    r = snap.ranks[0]
    assert job_key == f"{r.master_addr}:{r.master_port}" and r.job_evidence == "MASTER_ADDR:MASTER_PORT"
    one, _ = pick_job(snap, (), str(r.master_port))
    assert len(one.ranks) == len(snap.ranks)
