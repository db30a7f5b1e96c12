"""The srun step's login side: frames of one loop turn coalesced (the same bytes for many tasks go out once, a
task's own frames stay in order), and the node list folded, or in a file past MAX_NODELIST (issue 27)."""

from __future__ import annotations

import asyncio

from app.transport.srun import step as step_mod
from app.transport.srun.step import SrunOptions, Step, node_list, srun_argv


async def _step(nodes: int, said_hello: int) -> tuple[Step, list[bytes]]:
    step = Step(SrunOptions(job_id="42"), [f"n{i:05d}" for i in range(nodes)])
    for i, chan in enumerate(list(step.channels.values())[:said_hello]):
        chan.task = i
        step.by_task[i] = chan
    sent: list[bytes] = []
    step.send = sent.append  # type: ignore[method-assign]
    return step, sent


async def test_the_same_request_to_every_node_goes_out_once() -> None:
    step, sent = await _step(1000, 1000)
    for chan in step.channels.values():
        chan.write(b'{"id":7,"op":"collect"}\n')
    assert sent == []  # at the end of the loop turn
    await asyncio.sleep(0)
    assert len(sent) == 1 and sent[0].startswith(b"* D ")


async def test_frames_for_some_tasks_name_their_ranges_and_keep_each_tasks_order() -> None:
    step, sent = await _step(10, 10)
    chans = list(step.channels.values())
    for c in chans[2:6]:
        c.write(b"same")
    chans[0].write(b"own")
    chans[3].write_eof()  # after its data
    chans[4].write(b"later")
    await asyncio.sleep(0)
    assert [line.rstrip().split(b" ")[:2] for line in sent] == [[b"2-5", b"D"], [b"0", b"D"], [b"3", b"E"], [b"4", b"D"]]


async def test_every_task_is_not_every_node_until_each_said_which_it_is() -> None:
    step, sent = await _step(3, 2)  # the third node has not said which task it is: `*` would reach it too
    for c in list(step.channels.values())[:2]:
        c.write(b"x")
    await asyncio.sleep(0)
    assert sent[0].startswith(b"0-1 D ")


def test_the_node_list_is_folded_and_goes_in_a_file_when_long() -> None:
    names = [f"gpu-node-{i:05d}" for i in range(12_500)]  # 205 KB listed: past Linux's 128 KiB per argument
    assert node_list(names) == "gpu-node-[00000-12499]"
    argv = srun_argv(SrunOptions(job_id="42"), names, ["python3"], "/tmp/nodes.txt")
    assert "--nodelist=gpu-node-[00000-12499]" in argv
    scattered = names[::2]
    assert len(node_list(scattered)) > step_mod.MAX_NODELIST
    argv = srun_argv(SrunOptions(job_id="42"), scattered, ["python3"], "/tmp/nodes.txt")
    assert "--nodefile=/tmp/nodes.txt" in argv and not any(a.startswith("--nodelist") for a in argv)
    assert max(len(a) for a in argv) < 1000
