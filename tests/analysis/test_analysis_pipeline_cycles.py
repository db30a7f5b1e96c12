"""Point-to-point cycles say what they are. Two ranks each blocked sending to the other wait for a recv that a
different order would post (order the pairs); two ranks each blocked receiving from the other have nothing left to
send to each other: they disagree on how many messages pass between them or in which order (a microbatch count, a
pipeline schedule, a message skipped), which no ordering of the pairs mends. And a cycle in the graph does not take
the next step away from a lead fact that says more (a rank that left the loop on a budget of its own)."""

from __future__ import annotations

from typing import Tuple

from analysis_snapshots import frame, rank, snapshot, stack
from app.analysis import analyze
from app.model import Frame, Local, LoopInfo

TORCH = "/usr/lib/python3/dist-packages/torch"
C10D = f"{TORCH}/distributed/distributed_c10d.py"
LOOP = LoopInfo("for", 60, 80, "for it in range(cfg.iters):", ("it",))


def body(line: int, it: int = 9) -> Frame:
    return Frame("Stage.run", "/opt/pp/stage.py", line, loops=(LOOP,), iteration=(("it", str(it)),))


def p2p(op: str, peer: int, line: int = 66, it: int = 9) -> Tuple[Frame, ...]:
    arg = "src" if op == "recv" else "dst"
    call = Frame(op, C10D, 2100, locals=(Local("tensor", "<Tensor at 0x7f01>", True), Local(arg, str(peer), True)))
    return (call, frame("Stage.exchange (/opt/pp/stage.py:30)"), body(line, it), frame("<module> (/opt/pp/stage.py:99)"))


def reduce_in_loop(line: int = 75) -> Tuple[Frame, ...]:
    return stack(f"all_reduce ({C10D}:2950)", f"wrapper ({TORCH}/distributed/c10d_logger.py:83)") + \
        (body(line), frame("<module> (/opt/pp/stage.py:99)"))


def verdict(odd: dict) -> str:
    ranks = [rank(r, f"node0{r // 2 + 1}", odd.get(r, reduce_in_loop()), world=8) for r in range(8)]
    return analyze(snapshot(ranks, locals=True)).verdict


def test_two_ranks_each_receiving_from_the_other_disagree_on_the_messages() -> None:
    text = verdict({2: p2p("recv", 6), 6: p2p("recv", 2)})
    assert "Rank 2 and rank 6 are deadlocked in point-to-point calls: each waits to receive from the other." in text
    assert "Next: make both sides derive the messages between them from the same values: the number of microbatches" \
        in text
    assert "order the pairs by rank" not in text


def test_two_ranks_each_sending_to_the_other_are_told_to_order_the_pairs() -> None:
    text = verdict({2: p2p("send", 6), 6: p2p("send", 2)})
    assert "Rank 2 and rank 6 are deadlocked in point-to-point calls: each waits for the other." in text
    assert "Next: make each send meet its recv: order the pairs by rank" in text


def test_a_rank_that_left_the_loop_keeps_its_own_next_step_beside_a_cycle() -> None:
    # one replica's stages each wait for the next (0 <- 2 <- 4 <- 6); its last stage (6) left the loop on a budget
    # of its own and waits in the barrier after it, which its peer's recv never joins: a cycle 4 <-> 6 in the graph
    barrier = stack(f"barrier ({C10D}:5356)", f"wrapper ({TORCH}/distributed/c10d_logger.py:83)") + \
        (Frame("Stage.run", "/opt/pp/stage.py", 90), frame("<module> (/opt/pp/stage.py:99)"))
    text = verdict({0: p2p("recv", 2), 2: p2p("recv", 4), 4: p2p("recv", 6), 6: barrier})
    assert text.startswith("Rank 6 has left the loop `for it in range(cfg.iters)` (stage.py:60)"), text
    assert "Next: find the `break` or `return` by which rank 6 left that loop early" in text, text


def test_a_receive_cycle_says_where_each_side_stands_and_which_went_on() -> None:
    # rank 6 finished iteration 9 and waits for iteration 10's first message; rank 2 still waits for one of 9's
    text = verdict({2: p2p("recv", 6, it=9), 6: p2p("recv", 2, line=62, it=10)})
    assert "Rank 2 and rank 6 are deadlocked in point-to-point calls: each waits to receive from the other; rank 6 " \
        "is at it=10, rank 2 still at it=9." in text
    assert "Next: rank 6 left it=9 without sending rank 2 all it expects there (one message skipped), or the others " \
        "expect one more; make both sides derive the messages between them" in text
    a = analyze(snapshot([rank(r, f"node0{r // 2 + 1}", {2: p2p("recv", 6, it=9), 6: p2p("recv", 2, line=62, it=10)}
                               .get(r, reduce_in_loop()), world=8) for r in range(8)], locals=True))
    detail = a.findings[0].detail
    assert "rank 2 waits in recv (`recv` (distributed_c10d.py:2100)) for rank 6 (src=6), in `for it in " \
        "range(cfg.iters)` (stage.py:66; it=9)" in detail, detail
