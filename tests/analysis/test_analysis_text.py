"""The headless summary and the stored analysis: what the CLI prints, hostile remote text, JSON, and speed."""

from __future__ import annotations

import json
import time

from analysis_snapshots import ALL_REDUCE, LOADING, failed, in_step, job, nodes_of, rank, snapshot, stack
from app.analysis import analyze
from app.analysis.text import node_failures, summary_text
from app.model import ErrorInfo, Frame, RankSnapshot
from app.model.codec import snapshot_from_json, snapshot_to_json


def test_summary_has_verdict_findings_classes_and_node_failures() -> None:
    ranks = list(job(12, 4, rank5=LOADING))[:8]
    err = ErrorInfo("ptrace_denied", "Operation not permitted", hint="set ptrace_scope")
    ranks[7] = RankSnapshot(node="node02", pid=1007, start_time=1, rank=7, world_size=12, error=err)
    nodes = nodes_of(ranks) + (failed("node03", "connect_timeout"), failed("node04", "connect_timeout"))
    snap = snapshot(ranks, nodes)
    text = summary_text(snap, analyze(snap), width=100)
    lines = text.splitlines()
    assert lines[0] == "hangscope: Rank 5 is in `next_batch` (loader.py:31) while 6 others wait in `all_reduce`; what its"
    assert "Findings, most likely culprit first:" in lines
    assert "   1. [high] rank 5 is in `next_batch` (loader.py:31) while 6 others wait in `all_reduce`" in lines
    assert "Stacks: 7 of 8 ranks in 2 groups (largest first):" in lines
    assert "     6  ranks 0-4,6 on node[01-02]" in lines
    assert "        all_reduce (distributed_c10d.py:2950) <- wrapper (c10d_logger.py:81) <- train (job.py:57)" in lines
    assert "        next_batch (loader.py:31) <- train (job.py:55)" in lines
    assert lines[-3:] == ["Nodes:", "  node[03-04]: connect timeout", "  node02: ptrace denied (rank 7)"]
    assert all(len(line) <= 100 for line in lines)


def test_a_finding_about_one_rank_started_by_srun_gives_its_slurm_task_ids() -> None:
    slurm = (("SLURM_PROCID", "5"), ("SLURM_NODEID", "1"), ("SLURM_LOCALID", "1"))
    ranks = [rank(r, f"node{r // 4 + 1:02d}", LOADING if r == 5 else ALL_REDUCE, world=8,
                  env=(("RANK", str(r)), *(((k, str(r if k == "SLURM_PROCID" else v)) for k, v in slurm))))
             for r in range(8)]
    snap = snapshot(ranks)
    analysis = analyze(snap)
    lines = summary_text(snap, analysis, width=100).splitlines()
    assert analysis.findings[0].ranks == (("node02", 1005),)
    at = lines.index("   1. [high] rank 5 is in `next_batch` (loader.py:31) while 7 others wait in `all_reduce`")
    assert "      RANK 5: SLURM_PROCID=5 SLURM_NODEID=1 SLURM_LOCALID=1" in lines[at:]
    # only the rank a finding names alone: no other rank's task ids are listed
    assert sum(1 for line in lines if "SLURM_PROCID=" in line) == 1
    # without srun's environment, no such line
    plain = snapshot([rank(r, f"node{r // 4 + 1:02d}", LOADING if r == 5 else ALL_REDUCE, world=8)
                      for r in range(8)])
    assert "SLURM_PROCID" not in summary_text(plain, analyze(plain))


def test_node_failures_aggregate_by_kind() -> None:
    err = ErrorInfo("ptrace_denied", "denied")
    ranks = [RankSnapshot(node=f"node{n:02d}", pid=p, start_time=1, rank=(n - 3) * 2 + p, error=err)
             for n in range(3, 8) for p in (0, 1)]
    snap = snapshot(ranks, [failed("node01", "auth_failed"), failed("node02", "lost", state="partial")])
    assert node_failures(snap) == ["node01: auth failed", "node02: lost (partial data)",
                                   "node[03-07]: ptrace denied (ranks 0-9)"]


def test_hostile_remote_text_cannot_reach_the_terminal() -> None:
    evil = Frame("\x1b]0;owned\x07train\x1b[2J", "/tmp/\u202eevil.py", 3)
    ranks = list(job(4, 4)) + [rank(4, "node02", (evil,) + ALL_REDUCE[-1:], world=5)]
    snap = snapshot(ranks)
    a = analyze(snap)
    text = summary_text(snap, a)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\u241b]0;owned\u2407train\u241b[2J" in text  # shown, as visible pictures
    for f in a.findings:
        assert "\x1b" not in f.title + f.detail


def test_to_dict_is_json_and_rides_in_the_snapshot_file() -> None:
    snap = snapshot([rank(r, "n1", in_step(ALL_REDUCE, 7 if r == 2 else 6), world=4) for r in range(4)], locals=True)
    a = analyze(snap, history=[snap])
    doc = a.to_dict()
    loaded, stored = snapshot_from_json(snapshot_to_json(snap, doc))
    assert stored == json.loads(json.dumps(doc))
    assert stored["verdict"] == a.verdict and stored["findings"][0]["kind"] == "iteration_split"
    assert stored["classes"][0]["ranks"] == [["n1", 1000], ["n1", 1001], ["n1", 1002], ["n1", 1003]]
    root = stored["tree"]["nodes"][0]
    assert root["count"] == 4 and root["label"] == "ranks 0-3 on n1" and root["frame"] is None
    assert stored["tree"]["nodes"][root["children"][0]]["frame"]["function"] == "<module>"
    assert stored["iteration_splits"][0]["text"] == "step=6: ranks 0-1,3; step=7: rank 2"
    assert {p["status"] for p in stored["progress"]} == {"unknown"}  # the same sample twice: no time passed
    assert analyze(loaded).verdict == a.verdict


def test_many_distinct_stacks_stay_fast() -> None:
    # quadratic work per class or per rank would show here: 3,000 ranks, each on its own path, 60 frames deep
    deep = tuple(Frame(f"layer{i}", f"/opt/venv/lib/python3.11/site-packages/m/l{i}.py", i + 1) for i in range(56))
    ranks = [rank(r, f"node{r // 8:03d}", stack(f"step{r} (job.py:{r + 1})") + deep + ALL_REDUCE[-3:], world=3000)
             for r in range(3000)]
    snap = snapshot(ranks)
    started = time.process_time()
    a = analyze(snap)
    summary_text(snap, a)
    a.to_dict()
    assert len(a.classes) == 3000
    assert time.process_time() - started < 10.0  # ~0.3 s here; generous for a loaded 2-core machine


def test_notes_from_many_nodes_are_capped_and_say_how_many_more() -> None:
    """A large job's nodes each with a note (e.g. reached directly because its relay could not ssh to it): the
    summary lists 20 and says how many it left out, not a line per node and not a silent cut."""
    import dataclasses

    ranks = job(100, per_node=4)
    nodes = tuple(dataclasses.replace(n, warnings=("reached directly: its relay could not ssh to it",))
                  for n in nodes_of(ranks))
    snap = snapshot(ranks, nodes)
    text = summary_text(snap, analyze(snap))
    assert text.count("reached directly") == 20
    assert "and 5 more (the snapshot file has every node's)" in text
