"""A rank in a collective of a later iteration of the loop the others are in, while they wait in a collective of
theirs: it left their iteration without that collective (one iteration ahead: a skip on its own values), or its count
went apart (more: a resume from another step). The next step says which, never only "see why it does not return"."""

from __future__ import annotations

from typing import Tuple

from analysis_snapshots import frame, rank, snapshot, stack
from app.analysis import analyze
from app.model import Frame, LoopInfo

TORCH = "/usr/lib/python3/dist-packages/torch"
LOOP = LoopInfo("for", 40, 70, "for it, batch in enumerate(feed):", ("it",))


def in_loop(line: int, it: int, inner: Tuple[str, ...] = ()) -> Tuple[Frame, ...]:
    body = Frame("Runner.fit", "/opt/sim/runner.py", line, loops=(LOOP,), iteration=(("it", str(it)),))
    return stack(f"all_reduce ({TORCH}/distributed/distributed_c10d.py:2950)",
                 f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", *inner) + (body,) + \
        (frame("<module> (/opt/sim/runner.py:200)"),)


def verdict(ahead_by: int) -> str:
    # the others in iteration 20's norm all_reduce (runner.py:66, through `Runner.norm`); rank 3 in the first
    # all_reduce of a later iteration (runner.py:44)
    others = in_loop(66, 20, ("Runner.norm (/opt/sim/runner.py:31)",))
    ranks = [rank(r, f"node0{r // 2 + 1}", in_loop(44, 20 + ahead_by) if r == 3 else others, world=8)
             for r in range(8)]
    return analyze(snapshot(ranks, locals=True)).verdict


def test_one_iteration_ahead_left_the_others_iteration_early() -> None:
    text = verdict(1)
    assert text.startswith("Rank 3 is 1 iteration ahead of 7 others")
    assert "Next: rank 3 went on to it=21 without `all_reduce` from `Runner.norm` (runner.py:31), which the others " \
        "wait in at it=20: rank 3 left that iteration early, by a `continue` or a condition that skipped the rest of " \
        "the step on its own values" in text


def test_many_iterations_ahead_is_a_count_that_went_apart() -> None:
    text = verdict(5)
    assert "Next: 5 iterations ahead is more than one step skipped once: find where the `it` of rank 3 went apart " \
        "from the others': a start of its own (a resume that loaded a newer checkpoint or step on rank 3" in text
