"""scontrol/squeue output of several SLURM versions (tests/data/slurm) becomes the job a user means."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from app.slurm.job import SlurmError, gpus_from_tres, job_from_text, parse_json, parse_text
from app.slurm.resolve import job_id_from, resolve_job

DATA = Path(__file__).parent.parent / "data" / "slurm"


def text_job(name: str, job_id: str):
    recs = parse_text((DATA / name).read_text())
    return [job_from_text(r, job_id) for r in recs]


def test_real_22_05_text_is_a_running_two_node_job() -> None:
    [job] = text_job("scontrol-22.05.8-running.txt", "1")
    assert (job.job_id, job.name, job.state, job.user) == ("1", "wrap", "RUNNING", "root")
    assert job.nodelist == "node[02-03]" and job.num_nodes == 2 and job.batch_host == "node02"
    assert job.start_time == "2026-11-21T10:46:50" and job.gpus_per_node is None and job.running


def test_real_22_05_squeue_json_matches_its_text() -> None:
    [job] = parse_json((DATA / "squeue-json-22.05.8-running.json").read_text(), "1", "squeue --json")
    [text] = text_job("scontrol-22.05.8-running.txt", "1")
    assert (job.job_id, job.name, job.state, job.user, job.nodelist, job.num_nodes) == \
        (text.job_id, text.name, text.state, text.user, text.nodelist, text.num_nodes)
    assert job.start_time == datetime.datetime.fromtimestamp(1795258010).strftime("%Y-%m-%dT%H:%M:%S")
    assert parse_json((DATA / "squeue-json-22.05.8-running.json").read_text(), "2", "squeue --json") == []


def test_23_11_text_with_gpus_and_hostile_name_and_comment() -> None:
    [job] = text_job("scontrol-23.11-gpu-running.txt", "4242")
    assert job.gpus_per_node == 8 and job.user == "alice"
    # a Comment holding "NodeList=... JobState=..." must not override the real fields
    assert job.nodelist == "gpu-a[001-002,010]" and job.state == "RUNNING" and job.num_nodes == 3
    assert job.name.startswith("llama")


def test_20_11_pending_job_has_no_nodes_and_old_gres_spelling() -> None:
    [job] = text_job("scontrol-20.11-pending.txt", "777")
    assert job.state == "PENDING" and job.reason == "Resources" and not job.running
    assert job.nodelist == "" and job.num_nodes == 4 and job.gpus_per_node == 2 and job.start_time == ""


def test_21_08_array_job_gives_one_record_per_task() -> None:
    jobs = text_job("scontrol-21.08-array.txt", "900")
    assert [(j.job_id, j.nodelist) for j in jobs] == [("901", "n[1-2]"), ("902", "n[3-4]")]


def test_24_05_json_state_lists_and_set_numbers() -> None:
    [job] = parse_json((DATA / "scontrol-json-24.05-running.json").read_text(), "123456", "scontrol --json")
    assert (job.state, job.user, job.nodelist, job.num_nodes, job.gpus_per_node) == \
        ("RUNNING", "dana", "dgx-b[07-08]", 2, 8)
    assert job.start_time.startswith("2024-06-01")


def test_23_02_json_error_is_an_unknown_job() -> None:
    with pytest.raises(SlurmError) as err:
        parse_json((DATA / "scontrol-json-23.02-unknown.json").read_text(), "55", "scontrol --json")
    assert err.value.problem == "unknown_job" and "Invalid job id" in str(err.value)


def test_not_json_is_bad_output() -> None:
    with pytest.raises(SlurmError) as err:
        parse_json("slurm_load_jobs error: Unable to contact slurm controller", "1", "squeue --json")
    assert err.value.problem == "bad_output"


@pytest.mark.parametrize("per_node,alloc,nodes,want", [
    ("gres/gpu:8", "", "", 8), ("gres:gpu:4", "", "", 4), ("gpu:2", "", "", 2), ("gres/gpu:a100:4", "", "", 4),
    ("gres/gpu:h100:8,gres/nic:1", "", "", 8), ("gres/gpu:a100:4(IDX:0-3)", "", "", 4),
    ("", "cpu=2,gres/gpu=16,node=2", "2", 8), ("", "cpu=2,node=2", "2", None), ("gres/nic:1", "", "", None)])
def test_gpus_per_node_spellings(per_node: str, alloc: str, nodes: str, want: int | None) -> None:
    assert gpus_from_tres(per_node, alloc, nodes) == want


def test_control_characters_in_names_are_neutralised() -> None:
    [rec] = parse_text("JobId=5 JobName=x\x1b[2Jevil\n   JobState=RUNNING Reason=None\n   NodeList=n1\n")
    job = job_from_text(rec, "5")
    assert "\x1b" not in job.name and job.name.startswith("x?")


def test_job_id_comes_from_the_allocation_or_is_refused() -> None:
    assert job_id_from(None, {"SLURM_JOB_ID": "42"}) == "42"
    assert job_id_from("900_3", {}) == "900_3"
    for bad in ("", "12;rm -rf /", "$(id)", "-1"):
        with pytest.raises(SlurmError):
            job_id_from(bad or None, {})


def test_no_scontrol_on_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SlurmError) as err:
        resolve_job("1", {"PATH": str(tmp_path)})
    assert err.value.problem == "no_slurm" and "scontrol" in str(err.value) and err.value.hint
