"""The CLI's progress on stderr: a line per node for a small job; for a large one a bounded number of lines a
sample (a count every few seconds, the first failures by name, the count at the end), not one per node."""

from __future__ import annotations

import io

from app.cli.headless import COUNT_EVERY, NAMED_FAILURES, PER_NODE_LINES, NodeProgress
from app.model import ErrorInfo, NodeStatus, Snapshot


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def done(name: str) -> NodeStatus:
    return NodeStatus(name=name, slots=8, state="done", ranks_found=8, timings=(("connect", 0.25), ("collect", 0.5)))


def failed(name: str) -> NodeStatus:
    return NodeStatus(name=name, slots=8, state="failed",
                      error=ErrorInfo("connect_timeout", f"{name}: no TCP connection within 10 s", phase="connect"))


def test_a_small_job_gets_a_line_per_node_as_it_ends_and_no_line_twice() -> None:
    out = io.StringIO()
    progress = NodeProgress(out, 3)
    progress.update(NodeStatus(name="n1", state="connecting"))
    progress.update(done("n1"))
    progress.update(done("n1"))  # the same end again: nothing new to say
    progress.update(failed("n2"))
    progress.update(done("n3\x1b[2J"))  # a name is printed without its control characters
    assert out.getvalue().splitlines() == ["n1: done, 8 rank(s) in 0.75 s",
                                           "n2: failed: n2: no TCP connection within 10 s",
                                           "n3\ufffd[2J: done, 8 rank(s) in 0.75 s"]


def test_a_large_job_gets_counts_and_its_first_failures_by_name_not_a_line_per_node() -> None:
    out, clock = io.StringIO(), Clock()
    nodes = 12_500
    assert nodes > PER_NODE_LINES
    progress = NodeProgress(out, nodes, clock=clock)
    for i in range(nodes):
        clock.now += 0.001  # 12.5 s for the pass
        progress.update(failed(f"sim{i:05d}") if i % 100 == 7 else done(f"sim{i:05d}"))
    progress.pass_done(Snapshot(taken_at=0.0))
    lines = out.getvalue().splitlines()
    named = [line for line in lines if ": failed: " in line]
    counts = [line for line in lines if line.startswith("hangscope: sample 1: ")]
    assert named == [f"sim{i:05d}: failed: sim{i:05d}: no TCP connection within 10 s"
                     for i in range(7, 100 * NAMED_FAILURES, 100)]
    assert len(counts) == int(12.5 / COUNT_EVERY) + 1 and len(lines) == len(named) + len(counts), lines
    assert counts[-1] == ("hangscope: sample 1: 12,375 of 12,500 node(s) answered, 125 failed, 0 rank(s) "
                          "(105 failed node(s) not named above: see the summary), 12.5 s"), counts[-1]


def test_each_sample_of_a_large_job_is_counted_afresh() -> None:
    out, clock = io.StringIO(), Clock()
    progress = NodeProgress(out, 100, clock=clock)
    for i in range(100):
        progress.update(done(f"n{i}"))
    progress.pass_done(Snapshot(taken_at=0.0))
    clock.now += 1.0
    for i in range(60):  # the second sample: 60 answered, 2 failed so far
        progress.update(done(f"n{i}"))
    progress.update(failed("n98"))
    progress.update(failed("n99"))
    clock.now += 0.5
    progress.pass_done(Snapshot(taken_at=1.0))
    lines = out.getvalue().splitlines()
    assert lines == ["hangscope: sample 1: 100 of 100 node(s) answered, 0 failed, 0 rank(s), 0.0 s",
                     "n98: failed: n98: no TCP connection within 10 s",
                     "n99: failed: n99: no TCP connection within 10 s",
                     "hangscope: sample 2: 60 of 100 node(s) answered, 2 failed, 0 rank(s), 0.5 s"], lines
