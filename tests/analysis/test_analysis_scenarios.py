"""Analysis rules that the live scenarios (tests/live/test_scenarios.py) showed were needed, on snapshots built in code.

- healthy: a running job sampled twice is progressing; one sample's odd stacks (a rank caught in `train` while
  the others are in all_reduce) are then no lead at all.
- netcut: a node cut off in the middle of a ring all_reduce can leave the ranks that got their data one step
  ahead, on the same line: the retransmitting sockets still name the node, with high confidence.
"""

from __future__ import annotations

from analysis_snapshots import ALL_REDUCE, LOADING, in_step, rank, snapshot, sock
from app.analysis import analyze
from app.model import NodeStatus

IPS = {"node01": "10.0.0.1", "node02": "10.0.0.2", "node03": "10.0.0.3"}
RETRANSMIT = dict(backoff=3, retransmits=3, send_q=96, last_ack_ms=2600)


def running_sample(at: float, step: int, loading: int):  # type: ignore[no-untyped-def]
    ranks = [rank(r, f"node{r // 2 + 1:02d}", in_step(LOADING if r == loading else ALL_REDUCE, step), world=4)
             for r in range(4)]
    return snapshot(ranks, taken_at=at, locals=True)


def test_odd_stacks_of_a_progressing_job_are_no_lead() -> None:
    alone = analyze(running_sample(20.0, 12, loading=1))
    assert alone.findings[0].kind == "minority_stack" and alone.findings[0].confidence == "high"
    a = analyze(running_sample(20.0, 12, loading=1), history=[running_sample(19.0, 11, loading=3)])
    assert a.findings[0].kind == "progressing"
    odd = next(f for f in a.findings if f.kind == "minority_stack")
    assert odd.confidence == "low" and odd.reason.endswith("but the job is progressing, and ranks of a running "
                                                           "job are caught at different places")
    assert a.verdict.startswith("The job is progressing")


def test_stuck_job_keeps_its_stack_findings() -> None:
    a = analyze(running_sample(20.0, 12, loading=1), history=[running_sample(19.0, 12, loading=1)])
    assert a.findings[0].kind == "minority_stack" and a.findings[0].confidence == "high"


def cut_mesh(steps: dict[int, int]) -> list:
    """Three ranks, one per node, all in all_reduce; node02 cut off: its sockets and those towards it retry."""
    out = []
    for i, node in enumerate(IPS):
        socks = []
        for peer in IPS:
            if peer != node:
                stalled = RETRANSMIT if "node02" in (node, peer) else {}
                socks.append(sock(f"{IPS[node]}:{41000 + i}", f"{IPS[peer]}:{42000 + i}", last_recv_ms=900,
                                  **stalled))
        out.append(rank(i, node, in_step(ALL_REDUCE, steps[i]), world=3, master_addr=IPS["node01"],
                        master_port=29500, sockets=tuple(socks)))
    return out


def test_a_cut_node_is_named_when_the_ring_left_a_rank_one_step_ahead() -> None:
    nodes = [NodeStatus(n, address=a, state="done") for n, a in IPS.items()]
    a = analyze(snapshot(cut_mesh({0: 6, 1: 5, 2: 5}), nodes, locals=True))
    first = a.findings[0]
    assert first.kind == "network_stall" and first.confidence == "high" and first.nodes == "node02", first
    assert "retransmits towards one node" in first.reason
    split = next(f for f in a.findings if f.kind == "iteration_split")
    assert split.confidence == "medium" and split.title.startswith("rank 0 is 1 iteration ahead")
    same = analyze(snapshot(cut_mesh({0: 5, 1: 5, 2: 5}), nodes, locals=True))
    assert same.findings[0].kind == "network_stall" and same.findings[0].confidence == "high"
