"""UI test support: realistic snapshots built in code (also for bench/tui_grid.py), the screen as text, and
tests that the built snapshots stay realistic.

The frames, files and lines follow what py-spy printed for the hung gloo jobs in FIELD-NOTES (torch 2.13):
ranks waiting in all_reduce under c10d_logger's wrapper, a culprit in a final barrier or one loop iteration
ahead, a rank blocked in a DataLoader. Golden snapshots recorded on the test cluster replace none of this:
they are loaded from tests/data/*.json next to it.
"""

from __future__ import annotations

import dataclasses

from typing import Iterable, List, Literal, Optional, Sequence, Tuple

from app.model import CollectOptions, ErrorInfo, Frame, Local, LoopInfo, NodeStatus, RankSnapshot, Snapshot, StraceResult, StraceThread, ThreadStack
from app.model.codec import snapshot_from_json, snapshot_to_json
from workers.protocol import ERROR_HINTS
from waiting import wait_until_async

Scenario = Literal["skip", "barrier", "dataloader", "healthy"]
C10D = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/usr/lib/python3/site-packages/torch/distributed/c10d_logger.py"
TRAIN = "/home/alice/job/train.py"
DATALOADER = "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py"
CONNECTION = "/usr/lib/python3.11/multiprocessing/connection.py"

TRAIN_SOURCE = {
    40: "    for step, batch in enumerate(loader):",
    41: "        loss = model(batch).sum()",
    42: "        loss.backward()",
    43: "        dist.all_reduce(grad, group=groups[step % 2])",
    44: "        opt.step()",
    45: "    dist.barrier()",
}
STEP_LOOP = LoopInfo(kind="for", line=40, end_line=44, header="for step, batch in enumerate(loader):",
                     variables=("step", "batch"))


def _source(line: int) -> Tuple[Tuple[int, str], ...]:
    return tuple((n, TRAIN_SOURCE[n]) for n in range(line - 3, line + 3) if n in TRAIN_SOURCE)


def train_frame(line: int, step: Optional[int], *, locals_: bool = True) -> Frame:
    in_loop = step is not None and 40 <= line <= 44
    locs: Tuple[Local, ...] = ()
    if locals_:
        locs = (Local("model", "<DistributedDataParallel at 0x7f3a2c1d0>", arg=True),
                Local("loader", "<DataLoader at 0x7f3a2c1e0>", arg=True))
        if step is not None:
            locs += (Local("step", str(step)), Local("batch", "<Tensor at 0x7f3a1b2c0>"),
                     Local("loss", "<Tensor at 0x7f3a1b2d0>"))
    return Frame(function="train", filename=TRAIN, line=line, module="train", locals=locs,
                 loops=(STEP_LOOP,) if in_loop else (),
                 iteration=(("step", str(step)),) if in_loop and locals_ else (), source=_source(line))


def main_frames(scenario: Scenario, culprit: bool, step: int, *, locals_: bool = True) -> Tuple[Frame, ...]:
    outer = (Frame("main", TRAIN, 71, module="train", source=((71, "    train(model, loader)"),)),
             Frame("<module>", TRAIN, 90, module="train"))
    if scenario == "barrier" and culprit:
        return (Frame("barrier", C10D, 4159), Frame("wrapper", LOGGER, 81),
                train_frame(45, None, locals_=locals_)) + outer
    if scenario == "dataloader" and culprit:
        return (Frame("_recv_bytes", CONNECTION, 430), Frame("recv", CONNECTION, 250),
                Frame("_next_data", DATALOADER, 1329), Frame("__next__", DATALOADER, 631),
                train_frame(40, step, locals_=locals_)) + outer
    if scenario == "healthy":
        return (Frame("backward", "/usr/lib/python3/site-packages/torch/_tensor.py", 648),
                train_frame(42, step, locals_=locals_)) + outer
    return (Frame("all_reduce", C10D, 2501), Frame("wrapper", LOGGER, 81),
            train_frame(43, step + (1 if scenario == "skip" and culprit else 0), locals_=locals_)) + outer


def make_rank(node: str, node_index: int, local: int, per_node: int, world: int, *, scenario: Scenario,
              culprit: bool = False, step: int = 5, locals_: bool = True, strace: bool = False,
              gdb: bool = False) -> RankSnapshot:
    rank = node_index * per_node + local
    pid = 4100 + rank * 7
    main = ThreadStack(tid=pid, name="python3", active=scenario == "healthy", owns_gil=scenario == "healthy",
                       frames=main_frames(scenario, culprit, step, locals_=locals_), state="S",
                       wchan="futex_do_wait", syscall="futex", is_main=True)
    helper = ThreadStack(tid=pid + 3, name="pt_autograd_0", frames=(
        Frame("_worker_loop", "/usr/lib/python3.11/threading.py", 327),), state="S", wchan="futex_do_wait",
        syscall="futex")
    return RankSnapshot(
        node=node, pid=pid, start_time=123456 + rank, rank=rank, local_rank=local, world_size=world,
        group_rank=node_index, local_world_size=per_node, master_addr="10.0.0.1", master_port=29500,
        launcher="torchrun", launcher_pid=4000 + node_index, ppid=4000 + node_index,
        cmdline=("/usr/bin/python3", "-u", TRAIN, "--lr", "0.1", "--token", "<redacted>"),
        exe="/usr/bin/python3.11", uid=1000, user="alice", state="S", wchan="futex_do_wait",
        num_threads=9, cpu_time=12.5 + rank, rss=315 * 1024 * 1024,
        env=(("RANK", str(rank)), ("LOCAL_RANK", str(local)), ("WORLD_SIZE", str(world)),
             ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")),
        threads=(main, helper), collected=True, elapsed=0.012,
        strace=StraceResult(seconds=2.0, output="futex(0x7f3a, FUTEX_WAIT_BITSET_PRIVATE, 0, NULL <unfinished ...>",
                            threads=(StraceThread(tid=pid, blocked_in="futex(FUTEX_WAIT_BITSET)", calls=1,
                                                  top=(("futex", 1),)),)) if strace else None,
        gdb=("#0  0x00007f3a in __futex_abstimed_wait_common () from /lib/libc.so.6\n"
             "#1  0x00007f3b in c10d::ProcessGroupGloo::AsyncWork::wait () from libtorch_cpu.so") if gdb else None,
    )


def build_snapshot(nodes: int = 4, per_node: int = 2, *, scenario: Scenario = "skip", culprit: int = 5,
                   failed: Sequence[int] = (), failed_code: str = "ptrace_denied", locals_: bool = True,
                   prefix: str = "node", taken_at: float = 1_700_000_000.0, step: int = 5,
                   strace: bool = False, gdb: bool = False) -> Snapshot:
    """A job of nodes x per_node ranks; rank `culprit` is the odd one out; nodes in `failed` did not answer."""
    width = max(2, len(str(nodes)))
    names = [f"{prefix}{i + 1:0{width}d}" for i in range(nodes)]
    world = nodes * per_node
    statuses: List[NodeStatus] = []
    ranks: List[RankSnapshot] = []
    for i, name in enumerate(names):
        if i in failed:
            hint = ERROR_HINTS[failed_code]
            msg = "ptrace denied (ptrace_scope=1)" if failed_code == "ptrace_denied" else failed_code
            statuses.append(NodeStatus(name=name, slots=per_node, state="failed",
                                       error=ErrorInfo(failed_code, msg, hint, phase="collect")))
            continue
        statuses.append(NodeStatus(name=name, slots=per_node, state="done", ranks_found=per_node,
                                   timings=(("connect", 0.2), ("collect", 0.01))))
        for local in range(per_node):
            ranks.append(make_rank(name, i, local, per_node, world, scenario=scenario,
                                   culprit=i * per_node + local == culprit, step=step, locals_=locals_,
                                   strace=strace, gdb=gdb))
    return Snapshot(taken_at=taken_at, duration=0.4, hangscope_version="0.1.0",
                    options=CollectOptions(locals=locals_), nodes=tuple(statuses), ranks=tuple(ranks))


def with_hostile_names(snap: Snapshot) -> Snapshot:
    """The same job where rank 0's remote text tries markup, escape sequences and a 10 kB name."""
    def hostile(r: RankSnapshot) -> RankSnapshot:
        if r.rank != 0:
            return r
        main = r.threads[0]
        bad = Frame("[bold]evil[/", "/tmp/\x1b]0;pwned\x07x.py", 7,
                    locals=(Local("s", "[/]\x1b[31mred\x1b[0m" + "A" * 10_000),))
        name = "N" * 10_000
        threads = (ThreadStack(main.tid, name=name, frames=(bad,) + main.frames, is_main=True),) + r.threads[1:]
        return dataclasses.replace(r, **{"threads": threads, "cmdline": ("[bold]x[/", "\x1b]0;x\x07"),
                               "env": (("RANK", "[red]0"),)})
    return Snapshot(**{**snap.__dict__, "ranks": tuple(hostile(r) for r in snap.ranks)})


def later(snap: Snapshot, seconds: float, *, advance: Iterable[int] = ()) -> Snapshot:
    """The same job `seconds` later; ranks in `advance` moved on (more CPU time, next step)."""
    moved = set(advance)

    def step(r: RankSnapshot) -> RankSnapshot:
        if r.rank not in moved:
            return r
        return make_rank(r.node, r.group_rank or 0, r.local_rank or 0, r.local_world_size or 1,
                         r.world_size or 1, scenario="healthy", step=9)
    return Snapshot(**{**snap.__dict__, "taken_at": snap.taken_at + seconds,
                       "ranks": tuple(step(r) for r in snap.ranks)})


def screen_text(app) -> str:
    """What the terminal shows now, as plain text (the same render Textual's SVG screenshots use)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, record=True,
                      legacy_windows=False, safe_box=False, color_system="truecolor")
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def settle(pilot) -> None:
    """Wait until the collection in flight finished and every message it caused was handled."""
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


async def until(pilot, condition, what: str, timeout: float = 10.0) -> None:
    """Poll `condition` between rounds of the app's message processing, up to a deadline (for what the app
    does on a timer or in a worker: the live redraw, the command palette's search)."""
    await wait_until_async(condition, timeout, what, pause=pilot.pause)


# -- the builder's own tests: what the UI tests rely on -------------------------------------------------


def test_built_snapshot_round_trips_through_the_file_format():
    snap = build_snapshot(nodes=3, per_node=2, failed=(2,), strace=True, gdb=True)
    again, _ = snapshot_from_json(snapshot_to_json(snap))
    assert again == snap


def test_culprit_differs_from_the_others_only_where_the_scenario_says():
    snap = build_snapshot(nodes=2, per_node=2, scenario="skip", culprit=3)
    lines = {r.rank: [(f.function, f.line) for f in r.threads[0].frames] for r in snap.ranks}
    assert lines[0] == lines[1] == lines[2] == lines[3]  # same stack everywhere ...
    steps = {r.rank: r.threads[0].frames[2].iteration for r in snap.ranks}
    assert steps[3] == (("step", "6"),) and steps[0] == (("step", "5"),)  # ... one iteration ahead


def test_failed_node_has_no_ranks_and_a_classified_error():
    snap = build_snapshot(nodes=3, per_node=2, failed=(1,))
    assert [n.state for n in snap.nodes] == ["done", "failed", "done"]
    assert snap.nodes[1].error is not None and snap.nodes[1].error.code == "ptrace_denied"
    assert {r.node for r in snap.ranks} == {"node01", "node03"}
