"""Waits on the handle of an asynchronous torch.distributed operation. `req.wait()` on the c10d Work that isend,
irecv, batch_isend_irecv or a collective with `async_op=True` returned is a wait in that operation, though no
torch.distributed frame is on the stack (the handle's wait is C++): the line that made the handle says which. A rank
waiting in a send or receive waits for its one peer, not for the others: its stacks alone never make it the [high]
culprit, and the next step names the peer's argument and the ranks outside the others' collective."""

from __future__ import annotations

from typing import Tuple

from analysis_snapshots import frame, rank, snapshot, stack
from app.analysis import analyze
from app.analysis.frames import handle_wait, path_collective
from app.analysis.p2p import frames_call, rank_expression
from app.model import Frame, Local, LoopInfo

TORCH = "/usr/lib/python3/dist-packages/torch"
WORK = "<torch._C._distributed_c10d.Work at 0x7f11aa00>"


def user_frame(line: int, source: Tuple[Tuple[int, str], ...], **locals_: str) -> Frame:
    return Frame("Pipe.swap", "/srv/lm/pipe.py", line, source=source,
                 locals=tuple(Local(k, v) for k, v in locals_.items()))


BATCH = ((40, "    def swap(self, act):"),
         (41, "        ops = [dist.P2POp(dist.isend, act, self.next_stage, group=self.pp),"),
         (42, "               dist.P2POp(dist.irecv, self.buf, self.prev_stage, group=self.pp)]"),
         (43, "        handles = dist.batch_isend_irecv(ops)"),
         (44, "        for h in handles:"),
         (45, "            h.wait()"),
         (46, "        return self.buf"))


def test_a_wait_on_a_batch_of_sends_and_receives_is_that_exchange() -> None:
    found = handle_wait(user_frame(45, BATCH, h=WORK))
    assert found is not None and (found.op, found.receiver, found.maker_line) == ("send/recv", "h", 43)
    assert found.maker == "handles = dist.batch_isend_irecv(ops)"
    # without locals the call that made it tells: batch_isend_irecv always returns handles
    assert handle_wait(user_frame(45, BATCH)) is not None


def test_an_async_collectives_handle_and_one_waited_on_the_same_line() -> None:
    src = ((10, "def sync(grads, pg):"), (11, "    work = dist.all_reduce(grads, group=pg,"),
           (12, "                           async_op=True)"), (13, "    log.debug('queued')"), (14, "    work.wait()"))
    found = handle_wait(Frame("sync", "/srv/lm/opt.py", 14, source=src, locals=(Local("work", WORK),)))
    assert found is not None and found.op == "all_reduce" and found.maker_line == 11
    same = handle_wait(Frame("push", "/srv/lm/opt.py", 7, source=((7, "    dist.isend(t, dst=peer).wait()"),)))
    assert same is not None and (same.op, same.maker) == ("send", "")


def test_other_waits_are_not_handles() -> None:
    # an Event's wait, a queue's: nothing made them but a collective that returned no handle
    src = ((20, "def step(self):"), (21, "    dist.all_reduce(self.flag)"), (22, "    self.ready.wait()"))
    assert handle_wait(Frame("step", "/srv/lm/run.py", 22, source=src,
                             locals=(Local("self", "<Runner at 0x7f00>"),))) is None
    # the function's start bounds the search: a handle made in the caller is not this line's
    src = ((30, "    h = dist.irecv(buf, src=1)"), (31, "def finish(h):"), (32, "    h.wait()"))
    assert handle_wait(Frame("finish", "/srv/lm/run.py", 32, source=src)) is None
    assert handle_wait(Frame("finish", "/srv/lm/run.py", 32, source=src, locals=(Local("h", WORK),))) is None


def test_the_path_of_a_handle_wait_is_in_that_operation() -> None:
    path = (frame("<module> (/srv/lm/pipe.py:300)"), frame("Pipe.step (/srv/lm/pipe.py:120)"),
            user_frame(45, BATCH, h=WORK))
    op, at = path_collective(path)
    assert op == "send/recv" and at is not None and at.line == 45
    # torch.distributed.pipelining's schedules wait for their stage's batch in _wait_batch_p2p
    sched = f"{TORCH}/distributed/pipelining/schedules.py"
    assert path_collective(stack(f"_wait_batch_p2p ({sched}:683)", f"Schedule1F1B._step_microbatches ({sched}:1105)",
                                 "main (/srv/lm/pp.py:60)")[::-1])[0] == "send/recv"


def test_the_peer_of_a_handle_from_its_call() -> None:
    # a batch waits for what it receives: the irecv's peer, here an attribute the stack does not give a value for
    call = frames_call((user_frame(45, BATCH, h=WORK),))
    assert call is not None and call[:3] == ("recv", None, "peer=self.prev_stage")
    src = ((70, "def pull(buf, left):"), (71, "    req = dist.irecv(buf, src=left)"), (72, "    req.wait()"))
    call = frames_call((Frame("pull", "/srv/lm/pp.py", 72, source=src,
                              locals=(Local("left", "5"), Local("req", WORK))),))
    assert call is not None and call[:3] == ("recv", 5, "src=left=5")
    src = ((80, "def push(buf):"), (81, "    req = dist.isend(buf, 2)"), (82, "    req.wait()"))
    call = frames_call((Frame("push", "/srv/lm/pp.py", 82, source=src),))
    assert call is not None and call[:3] == ("send", 2, "dst=2")


STEP = LoopInfo("for", 50, 60, "for step, batch in enumerate(loader):", ("step",))


def step_frame(line: int) -> Frame:
    return Frame("Pipe.run", "/srv/lm/pipe.py", line, loops=(STEP,), iteration=(("step", "7"),))


def _swap_job(**odd: int) -> str:
    """8 ranks in the all_reduce at the end of a step (pipe.py:58), but those named: `waiter` in the stage exchange's
    handle wait (its call at pipe.py:52), `skipper` in the step's all_gather at pipe.py:55, which the others passed."""
    tail = (frame("<module> (/srv/lm/pipe.py:300)"),)
    reduce = stack(f"all_reduce ({TORCH}/distributed/distributed_c10d.py:2950)",
                   f"wrapper ({TORCH}/distributed/c10d_logger.py:83)") + (step_frame(58),) + tail
    gather = stack(f"all_gather ({TORCH}/distributed/distributed_c10d.py:4287)",
                   f"wrapper ({TORCH}/distributed/c10d_logger.py:83)") + (step_frame(55),) + tail
    swap = (user_frame(45, BATCH, h=WORK), step_frame(52)) + tail
    frames = {odd.get("waiter"): swap, odd.get("skipper"): gather}
    ranks = [rank(r, f"node0{r // 2 + 1}", frames.get(r, reduce), world=8) for r in range(8)]
    return analyze(snapshot(ranks, locals=True)).verdict


def test_a_rank_waiting_for_its_peer_is_not_blamed_on_its_stack_and_the_next_step_names_the_peer() -> None:
    text = _swap_job(waiter=5)
    first = text.split("\n", 1)[0]
    assert first.startswith("Likely lead: rank 5 is in `Pipe.swap` (pipe.py:45) while 7 others wait in `all_reduce`")
    assert "Next: rank 5 waits in a recv for one peer (peer=self.prev_stage), made by `handles = " \
        "dist.batch_isend_irecv(ops)` (pipe.py:43), not for the others: it completes when that rank posts the " \
        "matching send. The peer's number is not in the stack" in text
    assert "If the peer is among the others, it skipped its side of the exchange and went on" in text


def test_the_ranks_outside_the_others_collective_are_named_as_the_peer_it_may_wait_for() -> None:
    # the skipper's all_gather, which the others passed in this step, waits for a member: the waiter leads, [medium],
    # and the next step names the skipper as where its peer may be
    text = _swap_job(waiter=5, skipper=6)
    first = text.split("\n", 1)[0]
    assert first.startswith("Likely lead: rank 5 is in `Pipe.swap` (pipe.py:45)")
    assert "Outside the others' `all_reduce`: rank 6 in `all_gather` from `Pipe.run` (pipe.py:55). If the peer is " \
        "there, it skipped its side of the exchange" in text


def test_a_peer_written_over_the_ranks_number_and_the_worlds_size() -> None:
    assert rank_expression("(self.rank + 1) % self.world_size", 7, 8) == 0
    assert rank_expression("(dist.get_rank() - 1) % dist.get_world_size()", 0, 8) == 7
    assert rank_expression("rank ^ 1", 3, 8) is None  # only + - * // %
    assert rank_expression("(rank + 1) % world", 3, None) is None
    assert rank_expression("self.peer_of(rank)", 3, 8) is None
    assert rank_expression("rank % 0", 3, 8) is None
    src = ((90, "def ring(buf, out):"), (91, "    s = dist.isend(out, dst=(args.rank + 1) % args.world_size)"),
           (92, "    r = dist.irecv(buf, src=(args.rank - 1) % args.world_size)"), (93, "    s.wait()"))
    call = frames_call((Frame("ring", "/srv/lm/ring.py", 93, source=src, locals=(Local("s", WORK),)),), 7, 8)
    # the handle waited on is the send's, named by the line that made it, not the nearest call above
    assert call is not None and call[:3] == ("send", 0, "dst=(args.rank + 1) % args.world_size=0")


HALO = ((120, "    def exchange(self, edge, n):"),
        (121, "        s = dist.isend(edge, dst=(self.rank + 1) % self.world, tag=n)"),
        (122, "        r = dist.irecv(self.halo, src=(self.rank - 1) % self.world, tag=n)"),
        (123, "        s.wait()"), (124, "        r.wait()"))


def _halo(line: int, n: int) -> Tuple[Frame, ...]:
    f = Frame("Halo.exchange", "/srv/sim/halo.py", line, source=HALO,
              locals=(Local("n", str(n)), Local("s", WORK), Local("r", WORK)))
    return (f, frame("Sim.step (/srv/sim/halo.py:200)"), frame("<module> (/srv/sim/halo.py:300)"))


def test_a_send_and_its_receive_that_wait_with_different_tags() -> None:
    """Ranks 2-4 in a ring exchange (each sends right, receives from the left) tagged by a count of their own;
    rank 3's count is ahead: its send to rank 4 and rank 4's recv from it name each other but never match."""
    reduce = stack(f"all_reduce ({TORCH}/distributed/distributed_c10d.py:2950)",
                   f"wrapper ({TORCH}/distributed/c10d_logger.py:83)", "Sim.step (/srv/sim/halo.py:210)",
                   "<module> (/srv/sim/halo.py:300)")
    odd = {2: _halo(123, 11), 3: _halo(123, 12), 4: _halo(124, 11)}
    ranks = [rank(r, f"node0{r // 2 + 1}", odd.get(r, reduce), world=8) for r in range(8)]
    text = analyze(snapshot(ranks, locals=True)).verdict
    assert text.startswith("Rank 3's send to rank 4 carries tag 12 (tag=n) where rank 4's recv from rank 3 expects "
                           "tag 11 (tag=n): a send meets only a recv of the same tag, so neither completes.")
    assert "Next: compute each pair's tag the same way on both sides: rank 3's `n` is 12 where the others' is 11" in text
    # the same exchange with the tags equal: not this reading
    odd[3] = _halo(123, 11)
    ranks = [rank(r, f"node0{r // 2 + 1}", odd.get(r, reduce), world=8) for r in range(8)]
    assert "carries tag" not in analyze(snapshot(ranks, locals=True)).verdict
