"""Findings, one test per kind: what a user reads (title, ranks, nodes, the frames on both sides, confidence),
and that the most likely culprit comes first and becomes the verdict."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from analysis_snapshots import ALL_REDUCE as ALL_REDUCE_FRAMES
from analysis_snapshots import BARRIER, LOADING, failed, job, nodes_of, rank, snapshot, stack
from app.analysis import analyze
from app.analysis.findings import KINDS
from app.analysis.frames import collective_of
from app.model import ErrorInfo, Frame, NodeStatus, RankSnapshot, ThreadStack


def kinds(a) -> list:  # type: ignore[no-untyped-def]
    return [f.kind for f in a.findings]


def test_minority_in_the_data_loader_while_the_rest_wait_in_all_reduce() -> None:
    a = analyze(snapshot(job(8, 4, rank5=LOADING)))
    top = a.findings[0]
    assert top.kind == "minority_stack" and top.confidence == "high" and top.culprit
    assert top.title == "rank 5 is in `next_batch` (loader.py:31) while 7 others wait in `all_reduce`"
    assert top.ranks == (("node02", 1005),) and top.nodes == "node02" and top.ranks_label == "rank 5 on node02"
    # where the path leaves the majority's, on both sides
    assert "after `<module>` (job.py:120): `train` (job.py:55) here, `train` (job.py:57) there" in top.detail
    assert "1 rank stands against 7" in top.reason
    # the headline says where, that the mechanism is not known (this made-up stack carries no kernel state), and
    # what to check next
    assert a.verdict == ("Rank 5 is in `next_batch` (loader.py:31) while 7 others wait in `all_reduce`; what its main "
                         "thread waits in is not known: no wait site names the call and the kernel's state of the "
                         "thread was not read. Next: see why rank 5 does not return from there: `py-spy dump --native "
                         "--locals --pid 1005` on node02; `cat /proc/1005/stack` shows the kernel side.")


def test_a_rank_in_another_collective() -> None:
    a = analyze(snapshot(job(8, 4, rank3=BARRIER)))
    top = a.findings[0]
    assert top.kind == "different_collective" and top.confidence == "high"
    assert top.title == "rank 3 is in `barrier` (distributed_c10d.py:4100) while 7 others wait in `all_reduce`"
    assert "can never meet" in top.reason


def test_two_equal_groups_are_low_confidence() -> None:
    a = analyze(snapshot(job(8, 4, **{f"rank{r}": BARRIER for r in range(4, 8)})))
    top = a.findings[0]
    assert top.kind == "different_collective" and top.confidence == "low"
    assert "either may be the odd one" in top.reason
    assert a.verdict.startswith("No clear culprit; the best lead: ")


def test_same_collective_called_from_elsewhere_in_the_job() -> None:
    elsewhere = stack("all_reduce (distributed_c10d.py:2950)", "wrapper (c10d_logger.py:81)", "evaluate (job.py:90)",
                      "<module> (job.py:121)")
    top = analyze(snapshot(job(8, 4, rank6=elsewhere))).findings[0]
    assert top.kind == "minority_stack" and top.confidence == "medium"
    assert "called from different places" in top.reason


def test_paths_that_differ_only_inside_torch_are_low() -> None:
    inside = stack("_wait (distributed_c10d.py:3001)", "all_reduce (distributed_c10d.py:2950)",
                   "wrapper (c10d_logger.py:81)", "train (job.py:57)", "<module> (job.py:120)")
    top = analyze(snapshot(job(8, 4, rank1=inside))).findings[0]
    assert top.kind == "minority_stack" and top.confidence == "low"
    assert "only inside libraries" in top.reason


def test_many_small_classes_are_summed_up() -> None:
    odd = {f"rank{r}": stack(f"step{r} (job.py:{r + 10})", "<module> (job.py:120)") for r in range(1, 13)}
    a = analyze(snapshot(job(40, 8, **odd)))
    minority = [f for f in a.findings if f.kind == "minority_stack"]
    assert len(minority) == 9  # eight named one by one, the rest in one
    assert minority[-1].title == "4 more small groups of ranks are elsewhere"


def test_collectives_are_recognised_by_python_and_native_names() -> None:
    assert collective_of(Frame("all_reduce", "/x/torch/distributed/distributed_c10d.py", 1)) == "all_reduce"
    assert collective_of(Frame("monitored_barrier", "/x/torch/distributed/distributed_c10d.py", 1)) == \
        "monitored_barrier"
    assert collective_of(Frame("all_to_all_single", "/x/torch/distributed/distributed_c10d.py", 1)) == "all_to_all"
    assert collective_of(Frame("broadcast", "/home/u/job.py", 1)) is None  # not torch's
    native = {
        "c10d::ProcessGroupGloo::allreduce(std::vector<at::Tensor>&)": "all_reduce",
        "c10d::ops::(anonymous namespace)::allgather_CPU(x)": "all_gather",
        "c10d::ProcessGroupNCCL::_reduce_scatter_base(at::Tensor&)": "reduce_scatter",
        "c10d::ProcessGroupGloo::monitoredBarrier(c10d::BarrierOptions const&, bool)": "monitored_barrier",
        "c10d::recv_(x)": "recv",
        "gloo::transport::tcp::UnboundBuffer::waitRecv(int*)": None,  # inside any collective
        "pthread_cond_wait": None,
    }
    for name, want in native.items():
        assert collective_of(Frame(name, "libtorch_cpu.so", 0, native=True)) == want, name


def test_ranks_making_the_default_group_wait_in_init_process_group_the_call_they_made() -> None:
    """init_process_group builds the default group with the helper new_group runs: the ranks that wait there for
    one that never came wait in the call their program made, not in a new_group it never called."""
    creating = stack("_new_process_group_helper (distributed_c10d.py:2169)",
                     "init_process_group (distributed_c10d.py:1899)", "wrapper (c10d_logger.py:97)",
                     "main (job.py:30)", "<module> (job.py:120)")
    elsewhere = stack("read (loader.py:12)", "stage (job.py:20)", "main (job.py:29)", "<module> (job.py:120)")
    a = analyze(snapshot(job(8, 4, creating, rank4=elsewhere)))
    assert a.findings[0].ranks == (("node02", 1004),)
    assert "7 others wait in `init_process_group`" in a.verdict, a.verdict
    assert "new_group" not in a.verdict
    made = stack("_new_process_group_helper (distributed_c10d.py:2169)", "new_group (distributed_c10d.py:4700)",
                 "wrapper (c10d_logger.py:97)", "main (job.py:31)", "<module> (job.py:120)")
    assert "7 others wait in `new_group`" in analyze(snapshot(job(8, 4, made, rank4=elsewhere))).verdict


def test_a_rank_missing_from_world_size_on_healthy_nodes() -> None:
    ranks = [r for r in job(8, 4) if r.rank != 6]
    a = analyze(snapshot(ranks))
    top = a.findings[0]
    assert top.kind == "missing_ranks" and top.confidence == "high" and top.culprit
    assert top.title == "rank 6 not found (WORLD_SIZE=8)"
    assert "exited" in top.detail and "node02: 3 of 4" in top.detail  # LOCAL_WORLD_SIZE unknown: slots
    assert a.verdict == ("Rank 6 not found (WORLD_SIZE=8); the other 7 ranks wait for it in `all_reduce`. "
                         "Next: find why rank 6 exited: its log, and `dmesg` on its "
                         "node for the OOM killer; then restart the job.")


def test_a_failed_node_makes_its_ranks_unknown() -> None:
    ranks = job(12, 4)[:8]
    nodes = nodes_of(ranks) + (failed("node03", "connect_timeout", "node03: no answer within 10 s"),
                               failed("node04", "connect_timeout"))
    a = analyze(snapshot(ranks, nodes))
    node = next(f for f in a.findings if f.kind == "node_failed")
    assert node.title == "ranks on node[03-04] unknown: node failed (connect timeout)"
    assert node.nodes == "node[03-04]" and "hint for connect_timeout" in node.detail
    missing = next(f for f in a.findings if f.kind == "missing_ranks")
    assert missing.title == "ranks 8-11 not found (WORLD_SIZE=12)" and missing.confidence == "low"
    assert "node[03-04] could not be inspected" in missing.detail
    assert a.verdict == ("No clear culprit; the best lead: ranks on node[03-04] unknown: node failed (connect timeout). "
                         "Next: fix access to the failed node(s) and run again: the culprit may be there.")


def test_missing_ranks_from_slots_without_rank_numbers() -> None:
    ranks = [rank(None, "node01", pid=p) for p in (11, 12, 13)] + [rank(None, "node02", pid=p) for p in (21, 22)]
    nodes = (NodeStatus("node01", slots=3, state="done"), NodeStatus("node02", slots=3, state="done"))
    f = next(f for f in analyze(snapshot(ranks, nodes)).findings if f.kind == "missing_ranks")
    assert f.title == "fewer ranks than expected: node02: 2 of 3"


def test_hosts_list_smaller_than_the_job() -> None:
    ranks = [dataclasses.replace(r, **{"local_world_size": 4}) for r in job(16, 4)[:8]]
    f = next(f for f in analyze(snapshot(ranks)).findings if f.kind == "missing_ranks")
    assert f.title == "ranks 8-15 not found (WORLD_SIZE=16)" and not f.culprit
    assert "nodes not in the hosts list" in f.detail


def test_uninterruptible_stopped_and_zombie_ranks() -> None:
    ranks = list(job(8, 4))
    io = ThreadStack(tid=77, name="loader", state="D", wchan="nfs_wait_bit_killable", frames=LOADING)
    ranks[2] = rank(2, "node01", world=8, threads=(io,))
    ranks[4] = rank(4, "node02", world=8, state="T", thread_state="T")
    ranks[6] = rank(6, "node02", world=8, state="Z")
    a = analyze(snapshot(ranks))
    by = {f.kind: f for f in a.findings}
    assert by["uninterruptible"].title == "rank 2 is in uninterruptible sleep (D): waiting on I/O or a driver"
    assert "nfs_wait_bit_killable" in by["uninterruptible"].detail and by["uninterruptible"].confidence == "high"
    # the state is the answer: what holds it, that the others wait for it, and the command that resumes it
    assert by["stopped"].title == ("rank 4 is stopped (SIGSTOP or job control); the other 7 ranks wait for it; "
                                   f"`kill -CONT {ranks[4].pid}` on node02 resumes it")
    assert "SIGSTOP" in by["stopped"].detail
    assert by["exited"].title == "rank 6 exited (zombie) and is gone from the job"
    assert kinds(a)[:3] == ["stopped", "exited", "uninterruptible"]


def test_a_rank_hangscope_found_stopped_after_its_own_tool_and_resumed_is_not_held() -> None:
    # The worker resumes a rank only when it was not stopped before its tool: the stop was hangscope's own (a
    # py-spy killed mid-attach), and the rank runs again. Its tracing-stop letter is no hold of the job's; the
    # rank's own view says hangscope resumed it (app/ui/rank_text.py, the report's rank table).
    ranks = list(job(4, 4))
    ranks[1] = rank(1, "node01", world=4, state="t", thread_state="t", resumed=True)
    a = analyze(snapshot(ranks))
    assert "stopped" not in [f.kind for f in a.findings], a.verdict
    assert a.verdict == analyze(snapshot(list(job(4, 4)))).verdict
    # a signal's stop read the same way (no hold reading: an old snapshot) still holds the rank
    ranks[1] = rank(1, "node01", world=4, state="T", thread_state="T")
    assert analyze(snapshot(ranks)).findings[0].kind == "stopped"


def test_failed_dumps_are_not_culprits_but_say_the_picture_is_incomplete() -> None:
    ranks = list(job(8, 4))
    err = ErrorInfo("ptrace_denied", "Operation not permitted (os error 1)", hint="set kernel.yama.ptrace_scope=0")
    for i in range(4, 8):
        ranks[i] = RankSnapshot(node="node02", pid=1000 + i, start_time=1, rank=i, world_size=8, error=err)
    a = analyze(snapshot(ranks))
    f = a.findings[0]
    assert f.kind == "dump_failed" and not f.culprit
    assert f.title == "no stack for ranks 4-7 on node02: ptrace denied"
    assert "ptrace_scope" in f.detail and "incomplete" in f.reason
    assert a.verdict.startswith("No culprit found, and the picture is incomplete")
    same = next(x for x in a.findings if x.kind == "all_identical")
    assert same.title.startswith("all 4 ranks with stacks wait in `all_reduce`")


def test_thread_count_differs() -> None:
    ranks = [dataclasses.replace(r, **{"num_threads": 5 if r.rank == 3 else 7}) for r in job(8, 4)]
    f = next(f for f in analyze(snapshot(ranks)).findings if f.kind == "thread_count")
    assert f.title == "rank 3 has 5 threads while 7 others have 7" and f.confidence == "low"


def test_everything_identical_says_stacks_cannot_tell() -> None:
    a = analyze(snapshot(job(8, 4)))
    assert kinds(a) == ["all_identical"]
    f = a.findings[0]
    assert f.title == "all 8 ranks wait in `all_reduce` at the same place: stacks cannot tell the culprit"
    assert "(w in the TUI, or --samples N)" in f.detail and "no socket data" in f.detail
    assert a.verdict == "All 8 ranks wait in `all_reduce` at the same place: stacks cannot tell the culprit."


def test_two_jobs_in_one_snapshot() -> None:
    first = [dataclasses.replace(r, **{"master_addr": "10.0.0.1", "master_port": 29500}) for r in job(4, 4)]
    second = [dataclasses.replace(r, **{"master_addr": "10.0.0.1", "master_port": 29501, "pid": r.pid + 100})
              for r in job(4, 4)]
    a = analyze(snapshot(first + second))
    f = next(f for f in a.findings if f.kind == "several_jobs")
    assert f.title == "the snapshot holds 2 jobs" and "29501" in f.detail
    assert not any(f.kind == "missing_ranks" for f in a.findings)  # each job is complete on its own
    assert a.classes[0].label == "ranks 0-3 (8 processes: rank numbers repeat) on node01"


def test_nothing_to_analyse() -> None:
    a = analyze(snapshot([], [failed("node01", "auth_failed")]))
    # a surer finding first: "no rank processes were found" [high] before the failed node [low] ...
    assert kinds(a) == ["no_data", "node_failed"]
    assert "no rank processes were found; 1 of 1 nodes failed" in a.findings[0].title
    assert a.verdict.startswith("No clear culprit; the best lead: ")  # ... while the verdict names the lead


def test_every_finding_has_what_a_user_needs() -> None:
    ranks = list(job(8, 4, rank5=LOADING, rank3=BARRIER))
    ranks[6] = rank(6, "node02", world=8, state="D", wchan="io_schedule")
    a = analyze(snapshot(ranks))
    assert a.findings
    for f in a.findings:
        assert f.kind in KINDS and f.confidence in ("high", "medium", "low")
        assert f.title and f.detail and f.reason
    culprits = [f.culprit for f in a.findings]
    assert culprits == sorted(culprits, reverse=True)  # suspects before notes


def test_long_rank_lists_are_shortened_in_titles_and_capped_in_labels() -> None:
    """A title names a few; a label names the first MAX_PARTS ranges and says how many more (issue 27: scattered
    ranks at thousands of nodes folded into lists of thousands of lines)."""
    from app.analysis.fold import MAX_PARTS

    odd = {f"rank{r}": BARRIER for r in range(6, 400, 7)}
    top = analyze(snapshot(job(400, 8, **odd))).findings[0]
    assert top.title.startswith("57 ranks (6,13,20,27,") and top.title.endswith("while 343 others wait in `all_reduce`")
    shown = ",".join(str(r) for r in range(6, 400, 7)[:MAX_PARTS])
    assert top.ranks_label == f"ranks {shown} and {57 - MAX_PARTS} more on node[01-50]"


def test_findings_never_list_a_less_sure_one_before_a_surer_one() -> None:
    """"Most likely culprit first" read with the confidence shown: a [low] lead never sits above a [high] note,
    in any mix of kinds; within one confidence, progressing comes first, then suspects, then notes."""
    import itertools

    from app.analysis.facts import Evidence, Fact, Who, lead, ordered

    def f(kind: str, confidence: str, culprit: bool) -> Fact:
        return Fact(kind, Who(), confidence, Evidence(), culprit=culprit)  # type: ignore[arg-type]

    def order(facts: Sequence[Fact]) -> Sequence[Fact]:
        return ordered(tuple(facts))

    pool = [f("node_failed", "low", True), f("no_data", "high", False), f("thread_count", "low", True),
            f("all_identical", "high", False), f("minority_stack", "medium", True), f("no_locals", "high", False),
            f("progressing", "medium", False), f("missing_ranks", "high", True), f("dump_failed", "high", False)]
    rank = {"high": 0, "medium": 1, "low": 2}
    for n in (2, 3, 4):
        for combo in itertools.permutations(pool, n):
            got = order(combo)
            assert [rank[x.strength] for x in got] == sorted(rank[x.strength] for x in got), got
    high = order([f("dump_failed", "high", False), f("missing_ranks", "high", True), f("progressing", "high", False)])
    assert [x.kind for x in high] == ["progressing", "missing_ranks", "dump_failed"]
    # the verdict still speaks of the surest suspect, not of a surer note about the data
    best = lead((f("no_locals", "high", False), f("minority_stack", "medium", True)))
    assert best is not None and best.kind == "minority_stack"


def test_print_lists_findings_by_confidence() -> None:
    from app.analysis.text import summary_text

    snap = snapshot([], [failed("node01", "auth_failed")])
    text = summary_text(snap, analyze(snap))
    assert text.index("[high]") < text.index("[low]"), text


def _texts(snap) -> str:  # type: ignore[no-untyped-def]
    from app.analysis.text import summary_text

    a = analyze(snap)
    return "\n".join([summary_text(snap, a, width=400)] + [f"{f.title} {f.detail} {f.reason}" for f in a.findings])


def test_hints_name_only_options_that_exist() -> None:
    """A hint is followed to the letter: every --option it names is one `hangscope` accepts."""
    import re

    from analysis_snapshots import in_step

    from app.cli import build_parser

    known = {o for a in build_parser()._actions for o in a.option_strings}
    snaps = [snapshot(job(8, 4)), snapshot(job(8, 4), locals=True),
             snapshot([rank(r, f"node0{r // 4 + 1}", in_step(ALL_REDUCE_FRAMES, None), world=8) for r in range(8)]),
             snapshot([], [failed("node01", "auth_failed")])]
    named = {m for snap in snaps for m in re.findall(r"--[a-z][a-z-]*", _texts(snap))}
    assert named and named <= known, named - known


def test_run_with_locals_only_when_locals_were_off() -> None:
    """Ranks in a loop without loop variable values: "run with --locals" is advice only when they were off."""
    from analysis_snapshots import in_step

    ranks = [rank(r, f"node0{r // 4 + 1}", in_step(ALL_REDUCE_FRAMES, None), world=8) for r in range(8)]
    assert "run with --locals" in _texts(snapshot(ranks, locals=False))
    text = _texts(snapshot(ranks, locals=True))
    assert "run with --locals" not in text and "no loop variable had a readable value" in text


def test_a_single_rank_reads_in_the_singular() -> None:
    a = analyze(snapshot(job(1, 1)))
    assert a.findings[0].title == "the only rank waits in `all_reduce`: stacks cannot tell the culprit"


def test_a_rank_past_the_end_of_the_loop_the_others_are_in_has_left_it() -> None:
    """Where the paths part both are in `train`; the odd rank's line is past the end of the loop the others are
    still in (read from their own frames' loops): it left the loop, the others wait for it there."""
    from analysis_snapshots import in_step

    ranks = [rank(r, "node01", in_step(BARRIER if r == 3 else ALL_REDUCE_FRAMES, 7), world=4) for r in range(4)]
    top = analyze(snapshot(ranks)).findings[0]
    assert top.kind == "different_collective" and top.confidence == "high"
    assert top.title == ("rank 3 has left the loop `for step, batch in enumerate(loader)` (job.py:50) that 3 others "
                         "are still in: rank 3 is in `barrier` (distributed_c10d.py:4100), they wait in `all_reduce`")
    assert "inputs are uneven" in top.detail
    # a rank inside the same loop (data loading at its header) has not left it
    inside = [rank(r, "node01", in_step(LOADING if r == 3 else ALL_REDUCE_FRAMES, 7), world=4) for r in range(4)]
    assert "left the loop" not in analyze(snapshot(inside)).findings[0].title


def test_the_others_in_backward_are_named_as_ddp_all_reduce() -> None:
    """DDP's gradient all_reduce runs inside autograd's C++ engine: the majority's path shows `backward`, no
    torch.distributed frame. The odd rank's finding says the others are there (issue 17, on nanoGPT and
    Lightning), not "no collective recognised"; stacks alone stay below [high]."""
    backward = stack("_engine_run_backward (/usr/lib/python3/dist-packages/torch/autograd/graph.py:979)",
                     "backward (/usr/lib/python3/dist-packages/torch/autograd/__init__.py:395)",
                     "train_epoch (train.py:41)", "main (train.py:26)", "<module> (train.py:76)")
    forward = stack("forward (model.py:90)", "train_epoch (train.py:39)", "main (train.py:26)",
                    "<module> (train.py:76)")
    ranks = [rank(r, f"node0{r // 2 + 1}", forward if r == 5 else backward, world=8) for r in range(8)]
    odd = next(f for f in analyze(snapshot(ranks)).findings if f.kind == "minority_stack")
    assert odd.title == ("rank 5 is in `forward` (model.py:90) while 7 others are in autograd's backward in "
                         "`train_epoch` (train.py:41), where DDP all_reduces the gradients")
    assert "DDP's gradient all_reduce waits for every rank" in odd.reason and "no collective" not in odd.reason
    assert odd.confidence == "medium"


def test_a_rank_that_left_a_counted_loop_left_it_by_a_decision_of_its_own() -> None:
    """Out of a loop over a count (`for epoch in range(n)`), not over data: no batch ran out; the rank left it by a
    break or return of its own (an early stop on its own loss), and that decision is what to make common. Out of a
    loop over data, uneven inputs stay the next step."""
    import dataclasses

    from analysis_snapshots import in_step
    from app.model import LoopInfo

    epochs = LoopInfo("for", 50, 60, "for epoch in range(cfg.epochs):", ("epoch",))

    def counted(frames: tuple) -> tuple:
        return tuple(dataclasses.replace(f, loops=(epochs,), iteration=(("epoch", "2"),)) if f.function == "train"
                     else f for f in frames)

    ranks = [rank(r, "node01", counted(in_step(BARRIER if r == 1 else ALL_REDUCE_FRAMES, 7)), world=4)
             for r in range(4)]
    text = analyze(snapshot(ranks)).verdict
    assert text.startswith("Rank 1 has left the loop `for epoch in range(cfg.epochs)`"), text
    assert "Next: find the `break` or `return` by which rank 1 left that loop early" in text
    assert "same number of batches" not in text
    data = [rank(r, "node01", in_step(BARRIER if r == 3 else ALL_REDUCE_FRAMES, 7), world=4) for r in range(4)]
    assert "Next: give every rank the same number of batches" in analyze(snapshot(data)).verdict
