"""Ranks launched with other flags than the rest (issue 17: one node with other training flags was never named,
though every rank's command line was in the snapshot)."""

from __future__ import annotations

import dataclasses

from analysis_snapshots import ALL_REDUCE, job, rank, snapshot
from app.analysis import analyze
from app.analysis.launch import flags

TRAIN = ("/usr/bin/python3", "-u", "train.py", "config/train_gpt2.py", "--batch_size=4", "--compile=False")


def launched(cmdlines: dict) -> list:  # type: ignore[type-arg]
    """8 ranks, 2 per node; rank r runs cmdlines.get(r, TRAIN) with its own --local_rank."""
    return [dataclasses.replace(rank(r, f"node{r // 2 + 1:02d}", ALL_REDUCE, world=8),
                                cmdline=(*cmdlines.get(r, TRAIN), f"--local_rank={r % 2}")) for r in range(8)]


def test_flags_are_read_in_every_spelling() -> None:
    assert flags(("python", "t.py", "--a=1", "--b", "2", "--c", "--d", "-5", "pos")) == \
        {"--a": "1", "--b": "2", "--c": "(set)", "--d": "-5"}


def test_a_node_launched_with_other_training_flags_is_named() -> None:
    other = (*TRAIN[:4], "--batch_size=16", "--compile=False", "--gradient_accumulation_steps=32")
    f = next(f for f in analyze(snapshot(launched({6: other, 7: other}))).findings if f.kind == "launch_differs")
    assert f.confidence == "medium" and f.culprit and f.nodes == "node04"
    assert f.title == ("ranks 6-7 on node04 run with other flags than the other 6 ranks: --batch_size `16` where "
                       "the others have `4`, --gradient_accumulation_steps `32` where the others have unset")


def test_per_rank_flags_and_redacted_values_are_no_difference() -> None:
    same = launched({})  # --local_rank differs on every rank by design
    assert not [f for f in analyze(snapshot(same)).findings if f.kind == "launch_differs"]
    spawned = {r: ("/usr/bin/python3", "-c", f"from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, "
                   f"pipe_handle={10 + r})", "--multiprocessing-fork") for r in range(8)}
    assert not [f for f in analyze(snapshot(launched(spawned))).findings if f.kind == "launch_differs"]
    secret = (*TRAIN, "--api-key=***")
    redacted = launched({3: secret})
    assert not [f for f in analyze(snapshot(redacted)).findings if f.kind == "launch_differs"]


def test_identical_command_lines_cost_one_set_lookup() -> None:
    assert not [f for f in analyze(snapshot(job(16, 4))).findings if f.kind == "launch_differs"]


def test_a_slow_node_launched_with_other_flags_says_the_flags_are_why() -> None:
    """nanoGPT with node04 at 32 accumulation steps and batch 16 (the rest 16 and 4) trains on, node04 at the
    job's pace: its slow finding names the flags, which are what to change (seen live, tests/live/test_oss_cluster.py);
    a slow node whose ranks were launched like the rest keeps its finding as it is."""
    from app.analysis.calibrate import before_graph
    from app.analysis.facts import Fact, Who
    from app.analysis.progress import SlowEvidence, SlowReason
    from app.analysis.prose import render

    other = (*TRAIN[:4], "--batch_size=16", "--compile=False")
    snap = snapshot(launched({6: other, 7: other}))
    differs = [f for f in analyze(snap).facts if f.kind == "launch_differs"]
    node04 = tuple(sorted((r.node, r.pid) for r in snap.ranks if r.node == "node04"))
    node03 = tuple(sorted((r.node, r.pid) for r in snap.ranks if r.node == "node03"))
    slow = Fact("slow_node", Who(node04, (6, 7), ("node04",)), "high",
                SlowEvidence("node04", (SlowReason("run_wait", 0.62, 0.02),)))
    other_slow = Fact("slow_node", Who(node03, (4, 5), ("node03",)), "high",
                      SlowEvidence("node03", (SlowReason("run_wait", 0.62, 0.02),)))
    out = before_graph([*differs, slow, other_slow], ())
    assert out[0] == differs[0] and out[2] == other_slow
    said = render(out[1])
    assert said.title == ("node04 is slow: its ranks wait for a CPU; its ranks run with other flags than the rest: "
                          "--batch_size `16` where the others have `4`")
    assert "likely reason; launch every node with the same flags" in said.detail
    assert (said.kind, said.confidence, said.ranks) == ("slow_node", "high", node04)
    assert before_graph([slow], ()) == [slow]

def test_a_secret_a_command_line_holds_as_typed_is_never_a_difference_shown() -> None:
    """A snapshot file (or a node without the node's redaction) may hold a command line as it was typed: the flags
    are read through the pattern net, so `--password VALUE` on one rank is `***` there and no difference at all."""
    typed = (*TRAIN, "--password", "Kestrel-Umber-Quartz-417", "--hub-token=hf_q8ZtV2mWn4LpR7sK1xYcB6dF3gH9jA0e")
    findings = analyze(snapshot(launched({5: typed}))).findings
    assert not [f for f in findings if f.kind == "launch_differs"]
    assert not any("Kestrel" in f.title + f.detail or "hf_q8Z" in f.title + f.detail for f in findings)
