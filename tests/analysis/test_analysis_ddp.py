"""Two different collectives when one of them is DDP's: its gradient all_reduce runs from autograd's C++ engine (the
ranks' Python stacks end in `backward`), its buffers' broadcast from its forward. A side asleep there against a side
in a collective of its own is two calls that never match; which next step fits depends on what the other side is
in. And a rank in a collective an iteration behind the others, in the loop they are in, holds them all."""

from __future__ import annotations

from typing import Tuple

from analysis_snapshots import frame, rank, snapshot, stack
from app.analysis import analyze
from app.model import Frame, LoopInfo

TORCH = "/usr/lib/python3/dist-packages/torch"
BACKWARD = (f"_engine_run_backward ({TORCH}/autograd/graph.py:979)", f"backward ({TORCH}/autograd/__init__.py:395)",
            f"Tensor.backward ({TORCH}/_tensor.py:623)")
LOOP = LoopInfo("for", 30, 50, "for step in range(steps):", ("step",))


def at(line: int, step: int, function: str = "fit") -> Frame:
    """The job's training loop at `line`, in iteration `step`."""
    return Frame(function, "/home/alice/fit.py", line, loops=(LOOP,), iteration=(("step", str(step)),))


def job_stack(inner: Tuple[str, ...], line: int, step: int) -> Tuple[Frame, ...]:
    return stack(*inner) + (at(line, step), frame("<module> (/home/alice/fit.py:80)"))


def in_backward(step: int, *, line: int = 40) -> Tuple[Frame, ...]:
    return job_stack(BACKWARD, line, step)


def verdict(*ranks_frames: Tuple[int, Tuple[Frame, ...]], states: dict = {}) -> Tuple[str, object]:  # noqa: B006
    ranks = [rank(r, f"node0{r // 4 + 1}", f, world=8, thread_state=states.get(r, "S")) for r, f in ranks_frames]
    a = analyze(snapshot(ranks, locals=True))
    return a.verdict, a


def test_a_collective_of_some_ranks_against_the_others_asleep_in_ddps_backward() -> None:
    broadcast = job_stack((f"broadcast ({TORCH}/distributed/distributed_c10d.py:3151)",
                           f"wrapper ({TORCH}/distributed/c10d_logger.py:83)",
                           f"Optim.collect_state ({TORCH}/distributed/optim/sharded.py:560)"), 45, 3)
    text, _ = verdict(*[(r, broadcast if r == 0 else in_backward(3)) for r in range(8)])
    assert text.startswith("Rank 0 is in `broadcast` inside `Optim.collect_state` at fit.py:45 while 7 others are in "
                           "autograd's backward, in `fit` (fit.py:40), where DDP all_reduces the gradients: two "
                           "different collectives, which never match.")
    assert "Next: call `Optim.collect_state` at fit.py:45 on every rank or on none" in text


def test_a_rank_in_ddps_forward_broadcast_skipped_the_backward_the_others_are_in() -> None:
    ddp = f"{TORCH}/nn/parallel/distributed.py"
    forward = job_stack((f"DistributedDataParallel._distributed_broadcast_coalesced ({ddp}:2363)",
                         f"DistributedDataParallel._sync_buffers ({ddp}:2425)",
                         f"DistributedDataParallel._pre_forward ({ddp}:1782)",
                         f"DistributedDataParallel.forward ({ddp}:1886)",
                         f"Module._call_impl ({TORCH}/nn/modules/module.py:1789)"), 34, 3)
    text, _ = verdict(*[(r, forward if r == 3 else in_backward(3)) for r in range(8)])
    assert text.startswith("Rank 3 is in DDP's forward at fit.py:34, in its broadcast of the buffers from rank 0")
    assert "two different collectives, which never match" in text
    assert "Next: find why rank 3 went on to the next forward without the backward the others are in" in text


def test_a_collective_inside_the_backward_that_only_some_ranks_run() -> None:
    hook = stack(f"all_gather ({TORCH}/distributed/distributed_c10d.py:4287)",
                 f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", "Stats.__call__ (/home/alice/fit.py:12)",
                 f"hook ({TORCH}/utils/hooks.py:137)") + in_backward(3)
    text, _ = verdict(*[(r, hook if r == 7 else in_backward(3)) for r in range(8)])
    assert text.startswith("Rank 7 is in `all_gather` inside autograd's backward, called from `Stats.__call__` "
                           "(fit.py:12) while 7 others are in autograd's backward")
    assert "Next: rank 7 runs `all_gather` inside the backward, from `Stats.__call__` (fit.py:12), which the " \
        "others' backward does not run" in text


def test_a_rank_in_its_backward_where_the_others_call_another_collective() -> None:
    gather = job_stack((f"all_gather ({TORCH}/distributed/distributed_c10d.py:4287)",
                        f"wrapper ({TORCH}/distributed/c10d_logger.py:83)"), 36, 3)
    text, _ = verdict(*[(r, in_backward(3) if r == 6 else gather) for r in range(8)])
    assert text.startswith("Rank 6 is in autograd's backward, in `fit` (fit.py:40), where DDP all_reduces the "
                           "gradients while 7 others wait in `all_gather` called from `fit` (fit.py:36): two "
                           "different collectives, which never match.")
    assert "Next: find the condition under which rank 6 runs its backward where the others call `all_gather`" in text


def test_ranks_that_compute_their_backward_are_not_said_to_wait_in_ddps_all_reduce() -> None:
    broadcast = job_stack((f"broadcast ({TORCH}/distributed/distributed_c10d.py:3151)",
                           f"wrapper ({TORCH}/distributed/c10d_logger.py:83)"), 45, 3)
    text, a = verdict(*[(r, broadcast if r == 0 else in_backward(3)) for r in range(8)],
                      states={r: "R" for r in range(1, 8)})
    assert "DDP all_reduces" not in text and "never match" not in text
    assert not any(f.kind == "different_collective" and f.confidence == "high" for f in a.findings)


def test_a_rank_in_a_collective_an_iteration_behind_holds_the_others_in_the_next() -> None:
    clip = job_stack((f"all_reduce ({TORCH}/distributed/distributed_c10d.py:3252)",
                      f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", "clip_norm (/home/alice/fit.py:20)"), 44, 8)
    ddp = f"{TORCH}/nn/parallel/distributed.py"
    next_forward = job_stack((f"DistributedDataParallel._sync_buffers ({ddp}:2425)",
                              f"DistributedDataParallel.forward ({ddp}:1886)"), 34, 9)
    text, a = verdict(*[(r, clip if r == 4 else next_forward if r == 0 else in_backward(9)) for r in range(8)])
    assert text.startswith("Rank 4 is 1 iteration behind 6 others in `for step in range(steps)` (fit.py:30) (step=8 vs "
                           "9): rank 4 is in `all_reduce` called from `clip_norm` (fit.py:20)")
    assert "Next: find the condition under which rank 4 calls `all_reduce` from `clip_norm` (fit.py:20) in step=8, " \
        "which the others passed without calling it" in text
    # rank 0, in the next step's first collective, waits for rank 4 there: no culprit of its own
    held = [f for f in a.findings if f.ranks == (("node01", 1000),)]
    assert held and all(f.confidence != "high" for f in held)


def test_a_rank_many_iterations_behind_at_a_collective_is_told_to_compare_where_the_counts_started() -> None:
    """Six iterations apart at a collective the others passed: no condition in one iteration leaves a rank that far
    behind; the counts went apart (a resume from another step on that rank) or the call is skipped every time."""
    clip = job_stack((f"all_reduce ({TORCH}/distributed/distributed_c10d.py:3252)",
                      f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", "clip_norm (/home/alice/fit.py:20)"), 44, 3)
    text, _ = verdict(*[(r, clip if r == 2 else in_backward(9)) for r in range(8)])
    assert text.startswith("Rank 2 is 6 iterations behind 7 others in `for step in range(steps)` (fit.py:30) (step=3 "
                           "vs 9): rank 2 is in `all_reduce` called from `clip_norm` (fit.py:20)"), text
    assert ("Next: 6 iterations apart is more than one call skipped once: find where the `step` of rank 2 went apart "
            "from the others': a start of its own (a resume that loaded an older checkpoint or step on rank 2") in text
    assert "find the condition under which rank 2 calls" not in text


def test_a_library_call_behind_its_own_decorators_is_named_by_its_function_and_package() -> None:
    """A library API wrapped in the library's decorators (closures: its logger, a compatibility check) is the call
    the job made, not the decorator's `wrapper`; a bare function name says its package."""
    lib = "/usr/lib/python3/dist-packages/shardio"
    gather = job_stack((f"all_gather ({TORCH}/distributed/distributed_c10d.py:4287)",
                        f"wrapper ({TORCH}/distributed/c10d_logger.py:83)",
                        f"exchange_plans ({lib}/plan.py:51)", f"write_all ({lib}/writer.py:120)",
                        f"_compat.<locals>.inner ({lib}/util.py:33)",
                        f"_timed.<locals>.decorator.<locals>.wrapper ({lib}/metrics.py:90)"), 45, 3)
    text, _ = verdict(*[(r, gather if r == 5 else in_backward(4)) for r in range(8)])
    assert "rank 5 is in `all_gather` inside `write_all` of shardio at fit.py:45" in text, text
    assert "wrapper`" not in text.split("Next:")[0]


def _under(condition: str, line: int, step: int) -> Frame:
    """The training loop's frame at `line`, inside `if <condition>:` two lines above (the source the node read)."""
    return Frame("fit", "/home/alice/fit.py", line, loops=(LOOP,), iteration=(("step", str(step)),),
                 source=((line - 3, "        loss = step_once(batch)"), (line - 2, f"        if {condition}:"),
                         (line - 1, "            # keep a copy of the averaged weights"),
                         (line, "            export_average(model)"), (line + 1, "        opt.zero_grad()")))


def _export_stack(condition: str, step: int) -> Tuple[Frame, ...]:
    return stack(f"all_reduce ({TORCH}/distributed/distributed_c10d.py:3252)",
                 f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", "export_average (/home/alice/fit.py:12)") + \
        (_under(condition, 44, step), frame("<module> (/home/alice/fit.py:80)"))


def test_a_collective_under_a_condition_on_the_ranks_identity_names_that_condition() -> None:
    """A block run by the ranks a test on their identity selects (`args.local_rank == 0 and ...`) calls a
    collective the others never call: the next step names the `if` the node's source shows."""
    text, _ = verdict(*[(r, _export_stack("args.local_rank == 0 and step % 50 == 0", 8) if r == 0
                         else in_backward(9)) for r in range(8)])
    assert ("Next: rank 0 calls `all_reduce` from `export_average` (fit.py:12) inside `if args.local_rank == 0 and "
            "step % 50 == 0:` (fit.py:42), a block run only by the ranks that condition selects: the others never "
            "call it.") in text, text
    text, _ = verdict(*[(r, _export_stack("dist.get_rank() in writers", 8) if r == 0 else in_backward(9))
                        for r in range(8)])
    assert "inside `if dist.get_rank() in writers:` (fit.py:42)" in text, text
    # a condition on the rank's own values, or on what every rank shares (a count of ranks), not on who it is: the
    # condition in view is named as the one to decide the same on every rank
    for condition in ("loss.item() > limit", "num_ranks > 1 and step % 50 == 0", "self.rank is not None"):
        text, _ = verdict(*[(r, _export_stack(condition, 8) if r == 0 else in_backward(9)) for r in range(8)])
        assert "inside `if" not in text, (condition, text)
        assert (f"Next: rank 0 calls `all_reduce` from `export_average` (fit.py:12) in step=8 under `if {condition}:` "
                "(fit.py:42), which the others passed without calling it: that condition, or one further out, rests "
                "on the rank's own values") in text, (condition, text)
    # a script's main guard is no condition: every rank runs under it
    text, _ = verdict(*[(r, _export_stack('__name__ == "__main__"', 8) if r == 0 else in_backward(9))
                        for r in range(8)])
    assert "under `if" not in text and "Next: find the condition under which rank 0 calls `all_reduce`" in text, text


def test_a_collective_inside_the_backward_on_a_group_of_its_own_says_which() -> None:
    function = (stack(f"all_reduce ({TORCH}/distributed/distributed_c10d.py:3252)",
                      f"wrapper ({TORCH}/distributed/c10d_logger.py:83)")
                + (Frame("Copy.backward", "/home/alice/fit.py", 22, source=((22, "    dist.all_reduce(g, group=ctx.group)"),)),)
                + stack(f"BackwardCFunction.apply ({TORCH}/autograd/function.py:325)") + in_backward(3))
    text, _ = verdict(*[(r, function if r == 2 else in_backward(3)) for r in range(8)])
    assert text.startswith("Rank 2 is in `all_reduce` on the process group `ctx.group` inside autograd's backward, "
                           "called from `Copy.backward` (fit.py:22) while 7 others are in autograd's backward")


DDP = f"{TORCH}/nn/parallel/distributed.py"
FORWARD = (f"DistributedDataParallel._distributed_broadcast_coalesced ({DDP}:2363)",
           f"DistributedDataParallel._sync_buffers ({DDP}:2425)", f"DistributedDataParallel.forward ({DDP}:1886)",
           f"Module._call_impl ({TORCH}/nn/modules/module.py:1789)")
EVAL_REDUCE = (f"all_reduce ({TORCH}/distributed/distributed_c10d.py:3252)",
               f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", "mean_of (/home/alice/fit.py:12)",
               "validate (/home/alice/fit.py:20)")


def test_a_rank_in_a_collective_the_others_passed_in_the_same_iteration_is_held_by_the_rank_elsewhere() -> None:
    """Rank 2 sits in DDP's forward broadcast at line 34 of iteration 3, which the others ran and left (they are in
    the backward at line 40 of the same iteration): the broadcast completed for them (a tree lets them), so rank 2
    waits in it for a member that never joined, rank 6, which is in validation's all_reduce. Rank 6 is named."""
    text, a = verdict(*[(r, job_stack(FORWARD, 34, 3) if r == 2 else job_stack(EVAL_REDUCE, 46, 3) if r == 6
                         else in_backward(3)) for r in range(8)])
    assert text.startswith("Rank 6 is in `all_reduce`"), text
    assert "rank 2" not in text.split("Next:")[0].lower(), text
    held = next(f for f in a.findings if f.kind == "minority_stack" and "rank 2" in f.title)  # type: ignore[attr-defined]
    assert held.confidence == "low" and not held.culprit
    assert "which 6 others passed in the same iteration of `for step in range(steps)` (step=3 on both sides)" \
        in held.title


FSDP = f"{TORCH}/distributed/fsdp/_fully_shard"
REDUCE_SCATTER = (f"reduce_scatter_single ({TORCH}/distributed/distributed_c10d.py:4943)",
                  f"wrapper ({TORCH}/distributed/c10d_logger.py:83)",
                  f"DefaultReduceScatter.__call__ ({FSDP}/_fsdp_collectives.py:184)",
                  f"foreach_reduce ({FSDP}/_fsdp_collectives.py:619)",
                  f"FSDPParamGroup.post_backward ({FSDP}/_fsdp_param_group.py:688)") + BACKWARD
GRAD_SYNC = (f"all_reduce ({TORCH}/distributed/distributed_c10d.py:3252)",
             f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", "sync_seq_grads (/home/alice/fit.py:16)")
DISPATCH = (f"all_to_all_single ({TORCH}/distributed/distributed_c10d.py:5140)",
            f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", "Router.forward (/home/alice/fit.py:8)")
DTENSOR_WAIT = (f"wait_tensor ({TORCH}/distributed/_functional_collectives.py:142)",
                f"AsyncCollectiveTensor.wait ({TORCH}/distributed/_functional_collectives.py:1122)",
                f"redistribute_local_tensor ({TORCH}/distributed/tensor/_redistribute.py:1766)",
                f"DTensor.redistribute ({TORCH}/distributed/tensor/_api.py:731)")


def test_functional_and_single_tensor_collectives_are_collectives() -> None:
    """DTensor's redistribution waits in the functional collectives' `wait_tensor`; FSDP2 reduce-scatters its
    gradients with `reduce_scatter_single` from its post-backward: both are collectives, not unknown native waits
    nor DDP's gradient all_reduce."""
    text, _ = verdict(*[(r, job_stack(DTENSOR_WAIT, 44, 3) if r == 0 else in_backward(4)) for r in range(8)])
    assert "Rank 0 is" in text and "`wait_tensor`" in text and "mechanism is not known" not in text, text
    text, _ = verdict(*[(r, job_stack(REDUCE_SCATTER, 40, 3) if r in (0, 2, 4) else job_stack(GRAD_SYNC, 47, 3))
                        for r in range(8)])
    assert "ranks 0,2,4 call `reduce_scatter` from `fit` (fit.py:40)" in text and "DDP" not in text, text


def test_ranks_each_held_in_a_collective_the_others_passed_are_said_without_a_culprit() -> None:
    """Three groups of ranks in three collectives of one iteration (another process group each: a data-parallel
    reduce-scatter, an expert dispatch, a sequence-parallel gradient sync), each line one the largest group ran and
    left: no class is the odd one out; the next step says how to find the rank whose place differs from its
    group's, not a culprit."""
    text, a = verdict(*[(r, job_stack(DISPATCH, 36, 5) if r == 2 else job_stack(REDUCE_SCATTER, 40, 5)
                         if r in (0, 4, 6) else job_stack(GRAD_SYNC, 47, 5)) for r in range(8)])
    assert "for a member that has not joined" in text and "Next: no rank is the odd one out" in text, text
    assert "get_process_group_ranks" in text and "Likely lead" not in text, text
    assert not any(f.culprit and f.confidence != "low" for f in a.findings)


def test_a_counter_that_differs_while_the_loops_own_count_is_equal_is_not_another_iteration() -> None:
    """`seen += len(batch)` differs between ranks with batches of other sizes while `step` is the same: the same
    iteration, never "32 iterations ahead"."""
    def counted(line: int, seen: int) -> Frame:
        return Frame("fit", "/home/alice/fit.py", line, loops=(LoopInfo("for", 30, 50, "for x in loader:", ("x",),
                                                                         ("step", "seen")),),
                     iteration=(("step", "3"), ("seen", str(seen))))

    def path(inner: Tuple[str, ...], line: int, seen: int) -> Tuple[Frame, ...]:
        return stack(*inner) + (counted(line, seen), frame("<module> (/home/alice/fit.py:80)"))

    text, _ = verdict(*[(r, path(EVAL_REDUCE, 46, 128) if r == 5 else path(BACKWARD, 40, 96)) for r in range(8)])
    assert text.startswith("Rank 5 is in `all_reduce`"), text
    assert "iterations ahead" not in text and "seen=128 vs 96" not in text, text


def test_a_rank_in_ddps_forward_where_the_others_gather_skipped_their_call() -> None:
    """The others gather the epoch's metrics (a collective of the job's), one rank is in the next forward's buffer
    broadcast: it skipped that call (an error caught around a metric), which is what to find."""
    gather = job_stack((f"all_gather_object ({TORCH}/distributed/distributed_c10d.py:3513)",
                        f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", "report (/home/alice/fit.py:25)"), 47, 3)
    text, _ = verdict(*[(r, job_stack(FORWARD, 34, 4) if r == 4 else gather) for r in range(8)])
    assert text.startswith("Rank 4 is 1 iteration ahead of 7 others in `for step in range(steps)`"), text
    assert "rank 4 is in DDP's forward at fit.py:34, in its broadcast of the buffers from rank 0" in text, text
    assert "Next: find why rank 4 runs the DDP-wrapped model's forward at fit.py:34 where the others call " \
        "`all_gather` (fit.py:25)" in text, text


def test_two_collectives_of_the_jobs_own_code_are_named_with_their_call_sites_in_the_next_step() -> None:
    """Rank 0 reduces a metric from the validation it alone runs, the others wait in a barrier after it: the next
    step names both calls where they are made, and how such a pair comes about."""
    reduce = job_stack(EVAL_REDUCE, 46, 3)
    barrier = job_stack((f"barrier ({TORCH}/distributed/distributed_c10d.py:4100)",
                         f"wrapper ({TORCH}/distributed/c10d_logger.py:83)"), 48, 3)
    text, _ = verdict(*[(r, reduce if r == 0 else barrier) for r in range(8)])
    assert text.startswith("Rank 0 is in `all_reduce`"), text
    assert ("Next: make every rank issue the same collectives in one order: rank 0 calls `all_reduce` from `mean_of` "
            "(fit.py:12) where the others call `barrier` from `fit` (fit.py:48): one of them runs in code only some "
            "ranks reach") in text, text
