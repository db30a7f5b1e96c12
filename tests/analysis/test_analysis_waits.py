"""The wait graph (app/analysis/graph.py, calibrate.py): who waits for whom, from each kind of evidence (typed
facts, never their text); its root is the culprit the headline names; contradicted findings are never [high];
deadlocks are said as such; a progressing job has no culprit; several jobs get a graph each; the culprit does not
depend on the order ranks arrive in; every kind of fact is declared once, with a renderer."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis_snapshots import ALL_REDUCE, C10D, LOADING, in_step, job, rank, snapshot, stack
from app.analysis import Analysis, analyze
from app.analysis.facts import KINDS, ORDER
from app.analysis.graph import WaitGraph
from app.analysis.prose import RENDERERS
from app.analysis.prose.graph import graph_lines
from app.analysis.text import summary_text
from app.model import ErrorOutput, FlightGroup, FlightRecord, Frame, JobProcess, Local, NodeStatus, ProcessHold, RankSnapshot
from app.model import KernelWait, LoopInfo, OtherEnd, ThreadStack, WaitFd, WithInfo
from app.model import ProgressCounters, Snapshot, TcpSocket
from app.model.codec import snapshot_from_json

SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "scenarios"


def graph(a: Analysis) -> WaitGraph:
    assert len(a.waits) == 1
    return a.waits[0]


def root_numbers(a: Analysis, g: Optional[WaitGraph] = None) -> set:
    g = g or graph(a)
    out: set = set()
    for vid in g.root:
        v = g.vertex(vid)
        assert v is not None
        out.update(v.numbers)
    return out


def edge_kinds(g: WaitGraph) -> set:
    return {e.kind for e in g.edges}


def p2p(op: str, peer_name: str, peer: int, line: int = 2100) -> tuple:
    """A main thread blocked in torch.distributed's send/recv, its peer in the call's locals (--locals)."""
    call = Frame(op, C10D, line, locals=(Local("tensor", "tensor([0.])", True), Local(peer_name, str(peer), True)))
    return (call,) + stack("train (job.py:70)", "<module> (job.py:120)")


# --- edges from each kind of evidence ------------------------------------------------------------------------


def test_a_stopped_rank_is_the_root_and_its_state_outranks_a_stack_elsewhere() -> None:
    ranks = list(job(8, 4, rank2=LOADING))
    ranks[5] = dataclasses.replace(ranks[5], state="T", hold=ProcessHold(kind="stopped", stopped_by="signal"))
    a = analyze(snapshot(ranks))
    g = graph(a)
    assert root_numbers(a) == {5} and g.vertex(g.root[0]).state == "stopped"  # type: ignore[union-attr]
    assert "state" in edge_kinds(g) and "kill -CONT 1005" in g.next
    assert a.verdict.startswith("Rank 5 is stopped")
    # rank 2's odd stack alone would be [high]; the stopped rank explains the hang, so it is not
    odd = next(f for f in a.findings if f.kind == "minority_stack")
    assert odd.confidence == "medium" and "the wait graph's root is rank 5" in odd.reason


def test_a_thread_holding_the_lock_is_the_root_behind_its_rank() -> None:
    snap, _ = snapshot_from_json((SCENARIOS / "lock.json").read_text(encoding="utf-8"))
    a = analyze(snap)
    g = graph(a)
    root = g.vertex(g.root[0])
    assert root is not None and root.kind == "thread" and "checkpoint-writer" in root.label
    assert root.numbers == (1,) and "Event.wait" in root.doing
    lock = next(e for e in g.edges if e.kind == "lock" and e.waiter != "job")
    assert "_metrics_lock" in lock.evidence and g.vertex(lock.waited) is root
    assert g.chain[-1] == root.id and len(g.chain) == 2  # ranks wait for rank 1, rank 1 for its thread
    assert not g.deadlock and g.confidence == "high" and "_metrics_lock" in g.next


def test_two_threads_on_two_locks_are_a_deadlock_said_as_such() -> None:
    snap, _ = snapshot_from_json((SCENARIOS / "deadlock.json").read_text(encoding="utf-8"))
    g = graph(analyze(snap))
    assert g.deadlock and len(g.root) == 2
    assert g.headline.startswith("a deadlock: ") and "one order" in g.next


def test_two_ranks_receiving_from_each_other_are_deadlocked() -> None:
    ranks = list(job(8, 4))
    ranks[0] = rank(0, "node01", p2p("recv", "src", 1), world=8)
    ranks[1] = rank(1, "node01", p2p("recv", "src", 0), world=8)
    a = analyze(snapshot(ranks, locals=True))
    g = graph(a)
    assert g.deadlock and root_numbers(a) == {0, 1}
    assert {e.evidence for e in g.edges if e.kind == "p2p" and e.waiter != "job"} == {"recv(src=1)", "recv(src=0)"}
    top = a.findings[0]
    assert top.kind == "p2p_wait" and top.confidence == "high" and "deadlocked" in a.verdict
    # each receiving from the other: no send waits to be matched, so no order of the pairs helps (test_analysis_
    # pipeline_cycles.py); the sides disagree on the messages between them
    assert "derive the messages between them from the same values" in g.next and "order the pairs" not in g.next


def test_a_rank_that_waits_for_the_root_is_not_the_headline_nor_high() -> None:
    """Rank 5 sends to rank 6, which receives from rank 4 instead (the wrong peer); rank 4 is in the all_reduce
    with the rest. The graph ends at ranks 4 and 6 (each waits for the other); rank 5's odd stack leads there
    through its send, and 1 rank against 6 alone made it a [high] headline naming the wrong rank (the blind
    groups set, p2p_wrong_peer). A fact about a rank that only waits for a root of other ranks is [medium]."""
    ranks = list(job(8, 4))
    ranks[5] = rank(5, "node02", p2p("send", "dst", 6), world=8)
    ranks[6] = rank(6, "node02", p2p("recv", "src", 4), world=8)
    a = analyze(snapshot(ranks, locals=True))
    assert root_numbers(a) == {4, 6} and graph(a).deadlock
    assert a.verdict.startswith("Rank 6 "), a.verdict
    five = [f for f in a.findings if f.culprit and f.ranks == (("node02", 1005),)]
    assert five and all(f.confidence != "high" for f in five), [(f.title, f.confidence) for f in five]
    assert any("it waits for" in f.reason for f in five)


def test_a_matched_send_and_recv_is_no_wait_between_them() -> None:
    ranks = list(job(8, 4))
    ranks[0] = rank(0, "node01", p2p("send", "dst", 1), world=8)
    ranks[1] = rank(1, "node01", p2p("recv", "src", 0), world=8)
    g = graph(analyze(snapshot(ranks, locals=True)))
    assert "p2p" not in edge_kinds(g)


def test_a_recv_from_a_rank_in_a_collective_is_a_mutual_wait() -> None:
    ranks = list(job(8, 4))
    ranks[3] = rank(3, "node01", p2p("recv", "src", 6), world=8)
    a = analyze(snapshot(ranks, locals=True))
    g = graph(a)
    assert root_numbers(a) == {3, 6} and g.deadlock
    back = next(e for e in g.edges if e.kind == "collective")
    assert "`all_reduce`" in back.evidence and "rank 3 has not joined" in back.evidence
    p2p_finding = next(f for f in a.findings if f.kind == "p2p_wait")
    assert "rank 6" in p2p_finding.title and "in `all_reduce`" in p2p_finding.title


def test_the_flight_recorder_sequence_numbers_name_the_rank_behind() -> None:
    def record(seq: int) -> FlightRecord:
        return FlightRecord("worker_server", "/s", groups=(FlightGroup("0", last_enqueued=seq, last_completed=seq - 1,
                                                                       last_collective="gloo:all_reduce"),))
    ranks = [dataclasses.replace(r, flight=record(40 if r.rank == 7 else 41)) for r in job(8, 4)]
    a = analyze(snapshot(ranks))
    g = graph(a)
    assert root_numbers(a) == {7}
    flight = next(e for e in g.edges if e.kind == "flight")
    assert flight.evidence == "pg 0: seq #40 vs #41" and flight.finding == "collective_lag"
    assert "ranks 0-6 -> rank 7 (flight: pg 0: seq #40 vs #41" in "\n".join(graph_lines(g))


def test_an_iteration_ahead_and_a_missing_rank_are_edges_with_their_evidence() -> None:
    ranks = [rank(r, f"node{r // 2 + 1:02d}", in_step(ALL_REDUCE, 5 if r == 2 else 4), world=4) for r in range(4)]
    g = graph(analyze(snapshot(ranks, locals=True)))
    assert [(e.kind, e.evidence) for e in g.edges] == [("iteration", "step=5 vs 4")]
    gone = analyze(snapshot([r for r in job(8, 4) if r.rank != 6]))
    g = graph(gone)
    assert root_numbers(gone) == {6} and g.vertex(g.root[0]).kind == "missing"  # type: ignore[union-attr]
    assert "dmesg" in g.next


def test_every_kind_of_fact_is_declared_once_with_its_evidence_and_a_renderer() -> None:
    """A new detector declares its kind in facts.KINDS (tier, edge, evidence class) and the text layer renders it;
    every fact the recorded jobs give carries the evidence class its kind declares."""
    assert set(KINDS) == set(ORDER) == set(RENDERERS)
    for path in sorted(SCENARIOS.glob("*.json")):
        if path.name.endswith(".earlier.json"):
            continue
        snap, _ = snapshot_from_json(path.read_text(encoding="utf-8"))
        earlier, _ = snapshot_from_json(path.with_name(path.name[:-5] + ".earlier.json").read_text(encoding="utf-8"))
        for f in analyze(snap, history=[earlier]).facts:
            assert type(f.data).__name__ == KINDS[f.kind].evidence, (path.name, f.kind, type(f.data).__name__)


# --- root selection and calibration --------------------------------------------------------------------


def test_contradicting_evidence_of_the_same_strength_lowers_both() -> None:
    ranks = list(job(12, 4, rank2=LOADING, rank9=stack("barrier (distributed_c10d.py:4100)", "train (job.py:64)",
                                                      "<module> (job.py:120)")))
    a = analyze(snapshot(ranks))
    odd = [f for f in a.findings if f.kind in ("minority_stack", "different_collective")]
    assert len(odd) == 2 and all(f.confidence == "medium" for f in odd), odd
    assert {f.reason.rsplit("; but evidence as strong points at ", 1)[-1] for f in odd} == {"rank 2 on node01",
                                                                                           "rank 9 on node03"}
    assert graph(a).confidence == "medium" and a.verdict.startswith("Likely lead: ")


def test_stronger_evidence_wins_and_the_weaker_is_no_longer_high() -> None:
    """Flight Recorder sequence numbers (rank 7 behind) against one rank's stack elsewhere (rank 2)."""
    def record(seq: int) -> FlightRecord:
        return FlightRecord("worker_server", "/s", groups=(FlightGroup("0", last_enqueued=seq),))
    ranks = [dataclasses.replace(r, flight=record(40 if r.rank == 7 else 41)) for r in job(12, 4, rank2=LOADING)]
    a = analyze(snapshot(ranks))
    assert root_numbers(a) == {7} and a.findings[0].kind == "collective_lag"
    stack_lead = next(f for f in a.findings if f.kind == "minority_stack")
    assert stack_lead.confidence == "medium" and "root is rank 7" in stack_lead.reason
    assert not [f for f in a.findings if f.confidence == "high" and f.culprit and f.kind != "collective_lag"]


def test_kernel_states_are_never_lowered_by_each_other() -> None:
    ranks = list(job(8, 4))
    ranks[4] = dataclasses.replace(ranks[4], state="T")
    ranks[6] = dataclasses.replace(ranks[6], state="Z")
    a = analyze(snapshot(ranks))
    assert {f.kind: f.confidence for f in a.findings if f.kind in ("stopped", "exited")} == \
        {"stopped": "high", "exited": "high"}


# --- progress ------------------------------------------------------------------------------------------


def sample(at: float, step: int, loading: int, **kw: object) -> object:
    ranks = [rank(r, f"node{r // 2 + 1:02d}", in_step(LOADING if r == loading else ALL_REDUCE, step), world=4)
             for r in range(4)]
    return snapshot(ranks, taken_at=at, locals=True)


def test_a_progressing_job_has_no_culprit_and_no_high_suspect() -> None:
    a = analyze(sample(20.0, 12, 1), history=[sample(19.0, 11, 3)])  # type: ignore[arg-type]
    g = graph(a)
    assert g.progressing and not g.root and graph_lines(g) == ["nobody: the job is progressing between samples"]
    assert a.verdict.startswith("The job is progressing")
    assert not [f for f in a.findings if f.culprit and f.confidence == "high"]


def test_a_job_with_a_stopped_rank_is_not_called_progressing() -> None:
    def stopped(snap, step):  # type: ignore[no-untyped-def]
        ranks = list(snap.ranks)
        ranks[2] = dataclasses.replace(rank(2, "node02", in_step(ALL_REDUCE, 3), world=4), state="T")
        return dataclasses.replace(snap, ranks=tuple(ranks))
    a = analyze(stopped(sample(20.0, 12, 1), 3), history=[stopped(sample(19.0, 11, 3), 3)])  # type: ignore[arg-type]
    assert not graph(a).progressing and root_numbers(a) == {2}
    assert a.verdict.startswith("Rank 2 is stopped")
    progressing = next(f for f in a.findings if f.kind == "progressing")
    assert progressing.confidence == "low" and "not progressing" in progressing.reason


# --- jobs, text, order ---------------------------------------------------------------------------------


def test_two_jobs_get_a_graph_each() -> None:
    hung = [dataclasses.replace(r, job="10.0.0.1:29500") for r in job(4, 2, rank3=LOADING)]
    healthy = [dataclasses.replace(r, job="10.0.0.1:29510", pid=r.pid + 100) for r in job(4, 2)]
    later = [dataclasses.replace(r, threads=tuple(dataclasses.replace(t, frames=LOADING) for t in r.threads))
             if r.job.endswith("29510") else r for r in hung + healthy]
    a = analyze(snapshot(later, taken_at=1002.0), history=[snapshot(hung + healthy, taken_at=1000.0)])
    by_job = {g.job.split(" ", 1)[0]: g for g in a.waits}
    assert set(by_job) == {"10.0.0.1:29500", "10.0.0.1:29510"}
    assert by_job["10.0.0.1:29510"].progressing and not by_job["10.0.0.1:29510"].root
    assert root_numbers(a, by_job["10.0.0.1:29500"]) == {3}
    assert {k for v in by_job["10.0.0.1:29500"].vertices for k in v.ranks} <= {(r.node, r.pid) for r in hung}
    text = summary_text(snapshot(later), a)
    assert "job 10.0.0.1:29500" in text and "nobody: the job is progressing" in text


def test_print_shows_who_waits_for_whom_under_the_headline() -> None:
    a = analyze(snapshot(job(8, 4, rank7=LOADING)))
    text = summary_text(snapshot(job(8, 4, rank7=LOADING)), a, width=200)
    lines = text.splitlines()
    assert lines[0].startswith("hangscope: Rank 7 is in `next_batch`")
    at = lines.index("Who waits for whom:")
    assert lines[at - 1] == "" and all(line.startswith(("hangscope: ", "  ")) for line in lines[:at - 1])
    assert lines[at + 1].startswith("  ranks 0-6 -> rank 7 (stacks: `all_reduce` vs `next_batch` (loader.py:31); high)")
    assert any(line.startswith("  next: see why rank 7 does not return from there") for line in lines)
    stored = a.to_dict()["waits"][0]
    assert stored["root"] == list(graph(a).root) and stored["edges"][0]["kind"] == "stacks"


def _link_stall(ranks: List[RankSnapshot]) -> List[RankSnapshot]:
    """node02 and node03 each retransmit to the other: a stalled link between two nodes."""
    stalled = dict(backoff=4, retransmits=1, send_q=4096, last_ack_ms=30000)
    out = []
    for r in ranks:
        if r.node in ("node02", "node03"):
            peer = "10.0.0.3:29501" if r.node == "node02" else "10.0.0.2:29501"
            local = f"10.0.0.{2 if r.node == 'node02' else 3}:4{r.rank:04d}"
            r = dataclasses.replace(r, sockets=(TcpSocket(local, peer, "ESTABLISHED", **stalled),))  # type: ignore[arg-type]
        out.append(r)
    return out


def test_a_two_node_stall_is_contradicted_by_bytes_that_moved_on_both_nodes() -> None:
    """The nodes a fact names are a tuple, never a folded label split again: a stall on the link node02-node03
    whose ranks' sockets moved bytes between samples is contradicted like a one-node stall (it was never
    contradicted when "node[02-03]" was split on commas)."""
    def sample(at: float, moved: int) -> Snapshot:
        ranks = _link_stall(list(job(8, 2)))
        ranks = [dataclasses.replace(r, counters=ProgressCounters(at=at), sockets=tuple(
            dataclasses.replace(s, bytes_acked=moved, bytes_received=moved) for s in r.sockets)) for r in ranks]
        nodes = tuple(NodeStatus(f"node0{i}", address=f"10.0.0.{i}", state="done") for i in range(1, 5))
        return dataclasses.replace(snapshot(ranks, taken_at=at), nodes=nodes)

    one = analyze(sample(1000.0, 0))
    assert {r.node for r in sample(1000.0, 0).ranks} == {"node01", "node02", "node03", "node04"}
    stall = next(f for f in one.facts if f.kind == "network_stall")
    assert stall.who.nodes == ("node02", "node03") and stall.strength == "high"
    a = analyze(sample(1002.0, 50_000), history=[sample(1000.0, 0)])
    stall = next(f for f in a.facts if f.kind == "network_stall")
    assert stall.strength != "high", stall
    assert any(c.code == "sockets_moved" for c in stall.caveats)
    said = next(f for f in a.findings if f.kind == "network_stall")
    assert "moved bytes to their peers between samples" in said.reason and "node[02-03]" in said.reason


def test_suspects_on_two_nodes_agree_by_node_not_by_label() -> None:
    """A missing rank on node03 and a stalled link node02-node03 speak of the same node: no rival lowers either
    (agreement compares node names one by one, not the folded label "node[02-03]")."""
    from app.analysis.calibrate import _agree
    from app.analysis.graph import Vertex

    link = Vertex("v1", "host", nodes=("node02", "node03"))
    missing = Vertex("v2", "missing", numbers=(6,), nodes=("node03",))
    elsewhere = Vertex("v3", "missing", numbers=(6,), nodes=("node04",))
    assert _agree(link, missing) and _agree(missing, link)
    assert not _agree(link, Vertex("v4", "host", nodes=("node04",)))
    assert _agree(missing, elsewhere)  # the same rank number


KINDS_OF_CULPRIT = ("loader", "ahead", "stopped", "missing", "lagging")


def culprit_job(kind: str, culprit: int, n: int = 8) -> List[RankSnapshot]:
    ranks = [rank(r, f"node{r // 4 + 1:02d}", in_step(ALL_REDUCE, 4), world=n) for r in range(n)]
    if kind == "loader":
        ranks[culprit] = rank(culprit, ranks[culprit].node, in_step(LOADING, 4), world=n)
    elif kind == "ahead":
        ranks[culprit] = rank(culprit, ranks[culprit].node, in_step(ALL_REDUCE, 5), world=n)
    elif kind == "stopped":
        ranks[culprit] = dataclasses.replace(ranks[culprit], state="T")
    elif kind == "missing":
        del ranks[culprit]
    else:
        ranks = [dataclasses.replace(r, flight=FlightRecord("worker_server", "/s", groups=(
            FlightGroup("0", last_enqueued=40 if r.rank == culprit else 41),))) for r in ranks]
    return ranks


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(KINDS_OF_CULPRIT), st.integers(0, 7), st.randoms(use_true_random=False))
def test_permuting_the_ranks_never_changes_the_culprit(kind: str, culprit: int, rnd) -> None:  # type: ignore[no-untyped-def]
    ranks = culprit_job(kind, culprit)
    shuffled: Sequence[RankSnapshot] = rnd.sample(ranks, len(ranks))
    a, b = analyze(snapshot(ranks, locals=True)), analyze(snapshot(shuffled, locals=True))
    assert root_numbers(a) == root_numbers(b) == {culprit}
    assert graph(a).headline == graph(b).headline and a.verdict == b.verdict


# --- processes beside the ranks (discovery's Snapshot.processes) ---------------------------------------------
# The model's JobProcess (discovery, issue 16): launchers above ranks and each rank's children.


def job_process(pid: int, role: str, of: tuple, **kw: object) -> JobProcess:
    fields: dict = dict(node="node01", pid=pid, start_time=0, role=role, kind="data-loader worker", of=of,
                        state="S", job="")
    fields.update(kw)
    return JobProcess(**fields)


def with_processes(snap: Snapshot, processes: list) -> Snapshot:
    return dataclasses.replace(snap, processes=tuple(processes))


LOADER_QUEUE = stack("_recv (/usr/lib/python3.11/multiprocessing/connection.py:430)",
                     "_try_get_data (/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:1133)",
                     "train (job.py:55)", "<module> (job.py:120)")


def test_a_rank_waiting_on_a_stopped_child_makes_the_child_the_root() -> None:
    ranks = list(job(8, 4, rank1=LOADER_QUEUE))
    procs = [job_process(4242, "child", (1001,), state="T"), job_process(4243, "child", (1000,), state="T")]
    a = analyze(with_processes(snapshot(ranks), procs))
    g = graph(a)
    root = g.vertex(g.root[0])
    assert root is not None and root.kind == "process" and root.state == "stopped"
    assert root.label == "rank 1's data-loader worker pid 4242"  # rank 0's stopped child: rank 0 does not wait on it
    assert "kill -CONT 4242" in g.next and a.findings[0].ranks == (("node01", 1001),)
    assert "rank 1 waits for rank 1's data-loader worker pid 4242 (held: stopped)" in g.headline


def test_a_running_child_is_shown_but_does_not_take_the_blame() -> None:
    ranks = list(job(8, 4, rank1=LOADER_QUEUE))
    a = analyze(with_processes(snapshot(ranks), [job_process(4242, "child", (1001,))]))
    g = graph(a)
    assert root_numbers(a) == {1} and any(e.kind == "child" and e.strength == "low" for e in g.edges)


def test_a_launcher_with_no_rank_below_it_waits_for_its_rendezvous() -> None:
    ranks = list(job(8, 4, rank1=LOADING))
    launcher = job_process(77, "launcher", (), kind="torchrun", node="node03")
    g = graph(analyze(with_processes(snapshot(ranks), [launcher])))
    e = next(e for e in g.edges if e.kind == "rendezvous")
    assert g.vertex(e.waiter).label == "torchrun pid 77 on node03"  # type: ignore[union-attr]
    assert root_numbers(analyze(snapshot(ranks))) == {1}


CAPTURED_RUN = stack("_PollLikeSelector.select (/usr/lib/python3.11/selectors.py:415)",
                     "Popen._communicate (/usr/lib/python3.11/subprocess.py:2108)",
                     "Popen.communicate (/usr/lib/python3.11/subprocess.py:1209)",
                     "run (/usr/lib/python3.11/subprocess.py:550)", "save_hook (job.py:88)", "train (job.py:57)",
                     "<module> (job.py:120)")
POOL_MAP = stack("Condition.wait (/usr/lib/python3.11/threading.py:320)",
                 "MapResult.get (/usr/lib/python3.11/multiprocessing/pool.py:768)",
                 "Pool.map (/usr/lib/python3.11/multiprocessing/pool.py:367)", "tokenize (job.py:70)",
                 "train (job.py:57)", "<module> (job.py:120)")
IDLE_POOL_WORKER = stack("Connection._recv (/usr/lib/python3.11/multiprocessing/connection.py:395)",
                         "SimpleQueue.get (/usr/lib/python3.11/multiprocessing/queues.py:364)",
                         "worker (/usr/lib/python3.11/multiprocessing/pool.py:114)",
                         "BaseProcess._bootstrap (/usr/lib/python3.11/multiprocessing/process.py:314)")


def _headline(a: Analysis, snap: Snapshot) -> str:
    """The verdict the summary starts with: its first paragraph, its lines joined."""
    return " ".join(summary_text(snap, a).split("\n\n", 1)[0].split())


def test_a_captured_run_whose_child_exited_says_what_it_started_holds_the_pipe() -> None:
    """subprocess.run(capture_output=True) reads the child's output to its end before it waits for the exit: with
    the child a zombie, what the rank waits for is the pipe a process the child started still holds (its exit was
    never the wait: 'let the waiting code notice a dead child' would send the reader the wrong way)."""
    ranks = list(job(8, 4, rank2=CAPTURED_RUN))
    snap = with_processes(snapshot(ranks), [job_process(4300, "child", (1002,), state="Z", kind="subprocess")])
    a = analyze(snap)
    line = _headline(a, snap)
    assert line.startswith("hangscope: Rank 2 (pid 1002 on node01) is blocked in `subprocess.run`"), line
    assert "subprocess.run" in line and "end of its child's output" in line, line
    assert "pid 4300" in line and "inherited the pipe's write end" in line and "ls -l /proc/1002/fd" in line, line
    assert "notice a dead child" not in line, line


@pytest.mark.parametrize("pids", [(5100, 5101), (5100,)])
def test_a_pool_map_whose_workers_all_wait_for_tasks_says_the_result_never_comes(pids: Tuple[int, ...]) -> None:
    """However many workers the pool has left, idle ones are the answer, not a step to follow into (one idle
    worker was followed, and its idle wait read as the thing to see about)."""
    ranks = list(job(8, 4, rank5=POOL_MAP))
    workers = [job_process(pid, "child", (1005,), node="node02", kind="multiprocessing child",
                           threads=(ThreadStack(pid, "MainThread", frames=IDLE_POOL_WORKER, is_main=True),))
               for pid in pids]
    snap = with_processes(snapshot(ranks), workers)
    a = analyze(snap)
    assert root_numbers(a) == {5}
    line = _headline(a, snap)
    assert "all idle" in line and f"pid {', '.join(map(str, pids))})" in line and "never comes" in line, line
    assert "dmesg" in line and "that one is" not in line, line


def test_a_manager_proxy_call_waits_for_the_manager_process_and_names_it_when_it_is_held() -> None:
    proxy = stack("Connection._recv (/usr/lib/python3.11/multiprocessing/connection.py:395)",
                  "BaseProxy._callmethod (/usr/lib/python3.11/multiprocessing/managers.py:822)",
                  "__setitem__ (<string>:2)", "record (job.py:77)", "train (job.py:57)", "<module> (job.py:120)")
    ranks = list(job(8, 4, rank3=proxy))
    sock = WaitFd(4, "socket:[88]", "socket", "read", "unix", others=(OtherEnd("peer", 211, "python3", "T"),))
    main = dataclasses.replace(ranks[3].threads[0], syscall="read", wchan="unix_stream_read_generic",
                               waits=KernelWait("read", "fd", fd=4, fds=(sock,)))
    ranks[3] = dataclasses.replace(ranks[3], threads=(main,))
    snap = with_processes(snapshot(ranks), [job_process(211, "child", (1003,), state="T", kind="multiprocessing child")])
    line = _headline(analyze(snap), snap)
    assert "waiting for its manager process to answer the call" in line and "kill -CONT 211" in line, line


def _sleeping(loop: str, code: str, left: float) -> Tuple[RankSnapshot, ...]:
    frames = (Frame("retrying", "/home/alice/job.py", 60, loops=(LoopInfo("for", 57, 61, loop),),
                    source=((60, code),)),) + stack("train (job.py:57)", "<module> (job.py:120)")
    ranks = list(job(8, 4, rank1=frames))
    main = dataclasses.replace(ranks[1].threads[0], syscall="clock_nanosleep", wchan="hrtimer_nanosleep",
                               waits=KernelWait("clock_nanosleep", "sleep", timeout=left))
    ranks[1] = dataclasses.replace(ranks[1], threads=(main,))
    return tuple(ranks)


def test_one_long_sleep_in_a_loop_says_when_it_wakes_and_a_short_one_polls() -> None:
    """The node reads how long a sleep has left: an hour left is not a loop that checks again every so often (a
    back-off grown long, a retry-after honoured), whatever loop it sits in; a second left is a poll."""
    long = snapshot(list(_sleeping("for attempt in range(attempts):", "time.sleep(delay)", 3596.25)))
    line = _headline(analyze(long), long)
    assert "in one sleep with 60 min left" in line and "wakes by itself in about 60 min" in line, line
    assert "polls for something" not in line, line
    short = snapshot(list(_sleeping("for attempt in range(attempts):", "time.sleep(delay)", 0.75)))
    line = _headline(analyze(short), short)
    assert "polling in the loop" in line and "left" not in line.split("Next:")[0], line


def test_a_child_writing_into_a_pipe_only_its_waiting_parent_reads_is_a_deadlock() -> None:
    """Popen(stdout=PIPE, stderr=PIPE) then wait(): the child blocks writing into the full pipe, whose only
    reader is the rank, and the rank waits for the child to exit: each waits for the other."""
    waiting = stack("Popen._try_wait (/usr/lib/python3.11/subprocess.py:2011)",
                    "Popen.wait (/usr/lib/python3.11/subprocess.py:1264)", "audit (job.py:90)", "train (job.py:57)",
                    "<module> (job.py:120)")
    ranks = list(job(8, 4, rank0=waiting))
    pipe = WaitFd(2, "pipe:[5135456]", "pipe", "write", others=(OtherEnd("reader", 1000, "python3", "S"),))
    child_main = ThreadStack(68, "MainThread", frames=stack("<module> (/usr/local/bin/shard-audit:8)"), is_main=True,
                             state="S", syscall="write", wchan="pipe_write",
                             waits=KernelWait("write", "fd", fd=2, fds=(pipe,)))
    child = job_process(68, "child", (1000,), kind="subprocess", threads=(child_main,))
    snap = with_processes(snapshot(ranks), [child])
    line = _headline(analyze(snap), snap)
    assert line.startswith("hangscope: Rank 0 (pid 1000 on node01) is blocked in `subprocess wait`"), line
    assert "which waits for the first: a deadlock" in line and "each waits for the other" in line, line


def test_a_child_whose_exit_joins_a_thread_writing_to_its_waiting_parent_is_a_deadlock() -> None:
    """Process.join() before the queue is read: the child's exit joins its queue's feeder thread, which writes
    into the full pipe only the rank would read, after the join."""
    joining = stack("Popen.wait (/usr/lib/python3.11/multiprocessing/popen_fork.py:43)",
                    "BaseProcess.join (/usr/lib/python3.11/multiprocessing/process.py:149)", "index (job.py:95)",
                    "train (job.py:57)", "<module> (job.py:120)")
    ranks = list(job(8, 4, rank1=joining))
    pipe = WaitFd(6, "pipe:[5137100]", "pipe", "write", others=(OtherEnd("reader", 1001, "python3", "S"),
                                                                  OtherEnd("reader", 126, "python3", "S", own=True)))
    feeder = ThreadStack(127, "QueueFeederThread", frames=stack(
        "Connection._send (/usr/lib/python3.11/multiprocessing/connection.py:373)",
        "Queue._feed (/usr/lib/python3.11/multiprocessing/queues.py:250)",
        "Thread.run (/usr/lib/python3.11/threading.py:982)"), state="S", syscall="write", wchan="pipe_write",
        waits=KernelWait("write", "fd", fd=6, fds=(pipe,)))
    exiting = ThreadStack(126, "MainThread", frames=stack(
        "Thread._wait_for_tstate_lock (/usr/lib/python3.11/threading.py:1132)",
        "Thread.join (/usr/lib/python3.11/threading.py:1112)",
        "Queue._finalize_join (/usr/lib/python3.11/multiprocessing/queues.py:199)"), is_main=True, state="S")
    child = job_process(126, "child", (1001,), kind="multiprocessing child", threads=(exiting, feeder))
    snap = with_processes(snapshot(ranks), [child])
    line = _headline(analyze(snap), snap)
    assert "`QueueFeederThread`" in line and "which waits for the first: a deadlock" in line, line
    assert "before `join()`" in line, line


FUTURE_RESULT = stack("Condition.wait (/usr/lib/python3.11/threading.py:327)",
                      "Future.result (/usr/lib/python3.11/concurrent/futures/_base.py:451)", "stats (job.py:95)",
                      "train (job.py:57)", "<module> (job.py:120)")
_ENTERING = (Frame("column_stats", "/home/alice/job.py", 170, source=((170, "    with _STATS_LOCK:"),),
                   withs=(WithInfo(170, 173, "with _STATS_LOCK:", ("_STATS_LOCK",), entering=True),)),
             *stack("_process_worker (/usr/lib/python3.11/concurrent/futures/process.py:261)",
                    "BaseProcess.run (/usr/lib/python3.11/multiprocessing/process.py:108)",
                    "BaseProcess._bootstrap (/usr/lib/python3.11/multiprocessing/process.py:314)"))
FORKED_TAIL = stack("Popen._launch (/usr/lib/python3.11/multiprocessing/popen_fork.py:71)",
                    "Popen.__init__ (/usr/lib/python3.11/multiprocessing/popen_fork.py:19)",
                    "BaseProcess.start (/usr/lib/python3.11/multiprocessing/process.py:121)",
                    "ProcessPoolExecutor._spawn_process (/usr/lib/python3.11/concurrent/futures/process.py:785)",
                    "stats (job.py:94)", "train (job.py:57)", "<module> (job.py:120)")
SPAWNED_TAIL = stack("_main (/usr/lib/python3.11/multiprocessing/spawn.py:133)",
                     "spawn_main (/usr/lib/python3.11/multiprocessing/spawn.py:120)", "<module> (<string>:1)")
HEARTBEAT = (Frame("beat", "/home/alice/job.py", 192, source=((192, "            time.sleep(2.0)"),),
                   withs=(WithInfo(189, 192, "with _STATS_LOCK:", ("_STATS_LOCK",)),)),
             *stack("Thread.run (/usr/lib/python3.11/threading.py:982)"))


def _pool_on_a_lock(tail: Tuple[Frame, ...], beating: bool, held_inside: bool = False) -> Snapshot:
    ranks = list(job(8, 4, rank5=FUTURE_RESULT))
    beat = HEARTBEAT if beating else stack("beat (job.py:186)", "Thread.run (/usr/lib/python3.11/threading.py:982)")
    ranks[5] = dataclasses.replace(ranks[5], threads=(*ranks[5].threads, ThreadStack(1013, "heartbeat", frames=beat)))
    workers = []
    for pid in (5100, 5101):
        threads = [ThreadStack(pid, "MainThread", frames=_ENTERING + tail, is_main=True, state="S")]
        if held_inside:
            threads.append(ThreadStack(pid + 50, "flusher", frames=HEARTBEAT))
        workers.append(job_process(pid, "child", (1005,), node="node02", kind="multiprocessing child",
                                   threads=tuple(threads)))
    return with_processes(snapshot(ranks), workers)


def test_pool_workers_forked_while_a_rank_thread_held_their_lock_say_so_and_how_to_avoid_it() -> None:
    """A ProcessPoolExecutor's workers, forked while the rank's heartbeat thread was inside `with _STATS_LOCK:`,
    all block entering the same lock: the copy a fork made is held by no thread of theirs. The chain goes through
    one worker (both wait the same way) to the lock and says where its holder was."""
    snap = _pool_on_a_lock(FORKED_TAIL, beating=True)
    line = _headline(analyze(snap), snap)
    assert line.startswith("hangscope: Rank 5 (pid 1005 on node02) is blocked in `Future.result`"), line
    assert "(and 1 more worker, waiting the same way)" in line, line
    assert "waiting for the lock `_STATS_LOCK`, which no thread of pid 5100 holds" in line, line
    assert "forked from the rank while the rank's thread `heartbeat` held it" in line, line
    assert "'spawn'" in line.split("Next:")[1], line
    # nobody in the rank holds it now: still a lock copied held (or leaked), said without naming a holder
    snap = _pool_on_a_lock(FORKED_TAIL, beating=False)
    line = _headline(analyze(snap), snap)
    assert "no thread of that process holds it: it was forked while a thread of its parent held" in line, line
    assert "heartbeat" not in line, line


def test_pool_workers_on_a_lock_without_a_fork_are_not_said_to_have_inherited_it() -> None:
    """Spawned workers (a fresh interpreter: nothing of the parent's state) waiting for a lock: no fork claim; one
    of their own threads inside the block is the holder."""
    snap = _pool_on_a_lock(SPAWNED_TAIL, beating=True)
    line = _headline(analyze(snap), snap)
    assert "waiting for the lock `_STATS_LOCK`" in line and "fork" not in line, line
    snap = _pool_on_a_lock(SPAWNED_TAIL, beating=True, held_inside=True)
    line = _headline(analyze(snap), snap)
    assert "which pid 5100's thread `flusher` holds" in line and "fork" not in line, line


ACCEPTING = stack("socket.accept (/usr/lib/python3.11/socket.py:294)",
                  "Listener.accept (/usr/lib/python3.11/multiprocessing/connection.py:479)", "evaluate (job.py:80)",
                  "train (job.py:57)", "<module> (job.py:120)")


def _accepting(listen: WaitFd, children: Sequence[JobProcess] = ()) -> Snapshot:
    ranks = list(job(8, 4, rank7=ACCEPTING))
    main = dataclasses.replace(ranks[7].threads[0], syscall="accept4", wchan="unix_wait_for_peer",
                               waits=KernelWait("accept4", "fd", fd=15, fds=(listen,)))
    ranks[7] = dataclasses.replace(ranks[7], threads=(main,))
    return with_processes(snapshot(ranks), list(children))


UNIX_LISTEN = WaitFd(15, "socket:[5153050]", "socket", "accept", "unix", local="/tmp/job/eval-rank7.sock",
                     state="LISTEN")


def test_an_accept_whose_started_processes_all_exited_says_the_client_never_comes() -> None:
    """A rank listens for a helper it started to connect back; the helper died at start (a zombie): nobody is
    found on the socket's other end, and every process the rank started has exited."""
    dead = job_process(396, "child", (1007,), node="node02", kind="subprocess", state="Z")
    snap = _accepting(UNIX_LISTEN, [dead])
    line = _headline(analyze(snap), snap)
    assert "waiting for a client to connect to `/tmp/job/eval-rank7.sock`" in line, line
    assert "every process it started has exited (pid 396" in line and "never will" in line, line
    assert "pid 396 has exited: find why" in line, line
    # a child still alive may yet connect: no such claim
    alive = job_process(396, "child", (1007,), node="node02", kind="subprocess", state="S")
    snap = _accepting(UNIX_LISTEN, [alive])
    line = _headline(analyze(snap), snap)
    assert "never will" not in line and "has exited" not in line, line
    assert "find the client that should connect to /tmp/job/eval-rank7.sock" in line, line


def test_a_listening_socket_s_wildcard_is_no_peer_to_check() -> None:
    """A TCP listener reads 0.0.0.0:0 as its peer: that is no host, and no next step sends anyone to check it."""
    tcp = WaitFd(15, "socket:[88]", "socket", "accept", "tcp", local="0.0.0.0:29650", peer="0.0.0.0:0",
                 state="LISTEN")
    snap = _accepting(tcp)
    line = _headline(analyze(snap), snap)
    assert "0.0.0.0:0" not in line and "find the client that should connect to 0.0.0.0:29650" in line, line


def test_a_signal_wait_names_the_signal_and_how_to_release_it_by_hand() -> None:
    """sigwait: the signals as the node read the waiting set (whatever the code calls them), else as the call
    names them; the next step says who should send it, and the kill that releases it."""
    waiting = (Frame("sigwait", "/usr/lib/python3.11/signal.py", 58),
               Frame("handshake", "/home/alice/job.py", 244, source=((244, "        signal.sigwait(WANTED)"),)),
               *stack("train (job.py:57)", "<module> (job.py:120)"))
    ranks = list(job(8, 4, rank4=waiting))
    main = dataclasses.replace(ranks[4].threads[0], syscall="rt_sigtimedwait", wchan="do_sigtimedwait",
                               waits=KernelWait("rt_sigtimedwait", "signal", timeout=-1.0, signals=("SIGUSR2",)))
    ranks[4] = dataclasses.replace(ranks[4], threads=(main,))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "waiting for SIGUSR2" in line and "kill -USR2 1004" in line and "should send SIGUSR2" in line, line
    # not read by the node: the call's own words
    written = (waiting[0], Frame("handshake", "/home/alice/job.py", 244,
                                 source=((244, "        signal.sigwait({signal.SIGUSR1, signal.SIGTERM})"),)),
               *waiting[2:])
    snap = snapshot(list(job(8, 4, rank4=written)))
    line = _headline(analyze(snap), snap)
    assert "waiting for SIGUSR1 or SIGTERM" in line and "kill -USR1 1004" in line, line


_THREAD_RUN = stack("Thread.run (/usr/lib/python3.11/threading.py:982)")
_LOOP_STEP = stack("Handle._run (/usr/lib/python3.11/asyncio/events.py:80)",
                   "BaseEventLoop._run_once (/usr/lib/python3.11/asyncio/base_events.py:1922)",
                   "BaseEventLoop.run_forever (/usr/lib/python3.11/asyncio/base_events.py:607)") + _THREAD_RUN
_COROUTINE_RESULT = stack("Condition.wait (/usr/lib/python3.11/threading.py:327)",
                          "Future.result (/usr/lib/python3.11/concurrent/futures/_base.py:451)")


def _submitting(line: int, where: str) -> Frame:
    return Frame(where, "/home/alice/job.py", line,
                 source=((line, "        ok = asyncio.run_coroutine_threadsafe(self._ask(step), self.loop).result()"),))


def _with_loop_thread(loop_frames: Tuple[Frame, ...]) -> Snapshot:
    ranks = list(job(8, 4, rank4=_COROUTINE_RESULT + (_submitting(262, "control"),) + stack("train (job.py:57)")))
    loop = ThreadStack(1040, "io-loop", frames=loop_frames)
    ranks[4] = dataclasses.replace(ranks[4], threads=(*ranks[4].threads, loop))
    return snapshot(ranks)


def test_a_coroutine_s_result_waits_for_the_event_loop_thread_and_follows_what_blocks_it() -> None:
    """run_coroutine_threadsafe(...).result(): the coroutine runs on the event loop's thread, not on an executor's
    workers; a synchronous call inside a coroutine (a socket read) holds up the whole loop."""
    reading = stack("socket.recv_into (/usr/lib/python3.11/socket.py:706)", "_token (job.py:251)") + _LOOP_STEP
    snap = _with_loop_thread(reading)
    line = _headline(analyze(snap), snap)
    assert "waiting for the result of a coroutine submitted to an asyncio event loop" in line, line
    assert "which the loop runs on its thread `io-loop`" in line and "inside a coroutine" in line, line
    assert "no worker thread" not in line and "run_in_executor" in line.split("Next:")[1], line


def test_a_coroutine_s_result_awaited_on_the_loop_s_own_thread_is_a_deadlock() -> None:
    on_itself = _COROUTINE_RESULT + (_submitting(283, "_auth_headers"),) + stack("_upload (job.py:291)") + _LOOP_STEP
    snap = _with_loop_thread(on_itself)
    line = _headline(analyze(snap), snap)
    assert "from the loop's own thread: the loop cannot run the coroutine while this thread waits for it" in line, line
    assert "never wait for `run_coroutine_threadsafe(...).result()` on the loop's own thread" in line, line
    # no event loop at all: the coroutine never starts
    ranks = list(job(8, 4, rank4=_COROUTINE_RESULT + (_submitting(262, "control"),) + stack("train (job.py:57)")))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "no thread of the process runs an asyncio event loop" in line, line


_QUEUE_JOIN = (Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 327),
               Frame("Queue.join", "/usr/lib/python3.11/queue.py", 90, locals=(Local("self", "<Queue at 0x7f01>"),)),
               Frame("flush", "/home/alice/job.py", 234, locals=(Local("self", "<Metrics at 0x7f02>"),),
                     source=((234, "        self.q.join()"),)),
               *stack("train (job.py:57)", "<module> (job.py:120)"))


def _consumer(queue: str) -> ThreadStack:
    return ThreadStack(1031, "metrics-writer", frames=(
        Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 327),
        Frame("Queue.get", "/usr/lib/python3.11/queue.py", 171, locals=(Local("self", f"<Queue at {queue}>"),)),
        Frame("_write", "/home/alice/job.py", 218, locals=(Local("self", "<Metrics at 0x7f02>"),)), *_THREAD_RUN))


def test_queue_join_with_its_consumer_idle_on_the_same_queue_says_a_task_done_is_missing() -> None:
    """Queue.join waits for task_done() calls, not for room: its consumer waiting in get() on the same queue means
    the queue is empty and an item was taken without task_done()."""
    ranks = list(job(8, 4, rank1=_QUEUE_JOIN))
    ranks[1] = dataclasses.replace(ranks[1], threads=(*ranks[1].threads, _consumer("0x7f01")))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "waiting until every item put into the queue `self.q` is marked done" in line, line
    assert "room in the full queue" not in line and "a `task_done()` call is missing" in line, line
    # a consumer on another queue says nothing of the kind
    ranks[1] = dataclasses.replace(ranks[1], threads=(ranks[1].threads[0], _consumer("0x7f99")))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "marked done" in line and "task_done()` call is missing" not in line, line


def test_a_dataloader_s_batches_come_from_its_worker_processes_not_a_thread_pool_beside_it() -> None:
    """The rank runs a thread pool of its own (idle) beside its DataLoader; the DataLoader's worker process, forked
    after that pool was made, waits for a future of the pool's copy, which has no thread in it."""
    idle_pool = ThreadStack(1051, "feat-decode_0", frames=stack(
        "_worker (/usr/lib/python3.11/concurrent/futures/thread.py:81)") + _THREAD_RUN)
    ranks = list(job(8, 4, rank5=LOADER_QUEUE))
    ranks[5] = dataclasses.replace(ranks[5], threads=(*ranks[5].threads, idle_pool))
    worker = ThreadStack(5200, "MainThread", is_main=True, frames=_COROUTINE_RESULT + stack(
        "__getitem__ (/home/alice/data.py:415)",
        "_worker_loop (/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py:308)") + FORKED_TAIL)
    snap = with_processes(snapshot(ranks), [job_process(5200, "child", (1005,), node="node02", threads=(worker,))])
    line = _headline(analyze(snap), snap)
    assert "feat-decode" not in line and "which pid 5200" in line, line
    assert "the executor was made before the process forked" in line and "worker_init_fn" in line, line


_HANDLER = "<StreamHandler at 0x7ff827f8cc10>"
_LOGGING = "/usr/lib/python3.11/logging/__init__.py"


def test_a_logging_call_waits_for_the_handler_lock_held_by_a_thread_writing_to_a_full_pipe() -> None:
    """logging takes a handler's lock with acquire() (no `with` to read) and holds it while it emits: the main
    thread's log call waits for the thread blocked writing the record into a full pipe; the sentence starts with
    the main thread, where the rank is stuck."""
    logging_main = (Frame("Handler.acquire", _LOGGING, 927, locals=(Local("self", _HANDLER),),
                          source=((927, "            self.lock.acquire()"),)),
                    Frame("Handler.handle", _LOGGING, 976, locals=(Local("self", _HANDLER),),
                          source=((976, "            self.acquire()"),)),
                    Frame("Logger.info", _LOGGING, 1489),
                    Frame("report", "/home/alice/job.py", 381, source=((381, '        log.info("step %d", step)'),)),
                    *stack("train (job.py:57)", "<module> (job.py:120)"))
    ranks = list(job(8, 4, rank0=logging_main))
    main = dataclasses.replace(ranks[0].threads[0], syscall="futex", wchan="futex_wait_queue")
    emitting = ThreadStack(1010, "stats-reporter", state="S", syscall="write", wchan="pipe_write", frames=(
        Frame("StreamHandler.emit", _LOGGING, 1113, locals=(Local("self", _HANDLER),),
              source=((1113, "            stream.write(msg + self.terminator)"),)),
        Frame("Handler.handle", _LOGGING, 978, locals=(Local("self", _HANDLER),),
              source=((978, "                self.emit(record)"),)),
        Frame("Logger.info", _LOGGING, 1489), Frame("stats", "/home/alice/job.py", 377), *_THREAD_RUN))
    ranks[0] = dataclasses.replace(ranks[0], threads=(main, emitting))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert line.startswith("hangscope: Rank 0's main thread is blocked in `Lock.acquire`"), line
    assert "waiting for a logging handler's lock (to log a record), held by its thread `stats-reporter`, which is " \
           "blocked writing to a full pipe" in line, line


def _pool_worker(tid: int, queue: str, inner: bool) -> ThreadStack:
    waiting = _COROUTINE_RESULT + stack("load_part (job.py:190)") if inner else ()
    loop = Frame("_worker", "/usr/lib/python3.11/concurrent/futures/thread.py", 83 if inner else 81,
                 locals=(Local("work_queue", f"<SimpleQueue at {queue}>"),))
    return ThreadStack(tid, f"shard-io_{tid % 10}", frames=(*waiting, loop, *_THREAD_RUN))


def test_pool_workers_waiting_for_tasks_of_their_own_pool_are_starved_and_said_so() -> None:
    """Each worker of a 2-thread pool runs a task that waits for inner tasks submitted to the same pool: the inner
    tasks stay queued, no worker is free. Not 'which its other worker runs'."""
    ranks = list(job(8, 4, rank6=_COROUTINE_RESULT + stack("prefetch (job.py:196)", "train (job.py:57)")))
    ranks[6] = dataclasses.replace(ranks[6], threads=(*ranks[6].threads, _pool_worker(1061, "0x7f5d", True),
                                                       _pool_worker(1060, "0x7f5d", True)))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "every other worker of its pool (its thread `shard-io_0`) waits for a result of the pool too" in line, line
    assert "pool starvation" in line.split("Next:")[1] and "second executor" in line, line
    # a pool of one worker whose task waits for another task of it: it is its pool's only worker (no other worker
    # thread, no process pool's child), not a pool whose workers are all gone
    ranks[6] = dataclasses.replace(ranks[6], threads=(ranks[6].threads[0], _pool_worker(1061, "0x7f5d", True)))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "it is its pool's only worker: what it waits for is queued behind the task it runs itself" in line, line
    assert "no worker thread or process is alive" not in line and "second executor" in line, line
    # the other worker is idle, or serves another pool: no starvation
    for other in (_pool_worker(1060, "0x7f5d", False), _pool_worker(1060, "0x9999", True)):
        ranks[6] = dataclasses.replace(ranks[6], threads=(*ranks[6].threads[:2], other))
        snap = snapshot(ranks)
        line = _headline(analyze(snap), snap)
        assert "starvation" not in line, line


_BOOT = "<frozen importlib._bootstrap>"


def _importing(name: str, line: int) -> Tuple[Frame, ...]:
    return (Frame("_call_with_frames_removed", _BOOT, 241), Frame("_load_unlocked", _BOOT, 690),
            Frame("_find_and_load_unlocked", _BOOT, 1147, locals=(Local("name", f'"{name}"'),)),
            Frame("_find_and_load", _BOOT, 1176, locals=(Local("name", f'"{name}"'),)))


def test_a_thread_started_at_import_that_imports_the_module_back_is_a_deadlock_with_the_importer() -> None:
    """The main thread, importing `perfhooks`, starts a sampler thread and waits for it to say it started; the
    sampler imports a module that imports `perfhooks` back and waits for that import's lock: each waits for the
    other (the sampler is the only thread tied to the event: its frames hold the object that owns it)."""
    sampler = "<Sampler at 0x7ff59b029ad0>"
    main = (Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 327),
            Frame("Event.wait", "/usr/lib/python3.11/threading.py", 629, locals=(Local("self", "<Event at 0x7e>"),)),
            Frame("Sampler.start", "/home/alice/perfhooks.py", 27, locals=(Local("self", sampler),),
                  source=((27, "        self.started.wait()"),)),
            Frame("<module>", "/home/alice/perfhooks.py", 46), *_importing("perfhooks", 46),
            *stack("train (job.py:57)", "<module> (job.py:120)"))
    thread = ThreadStack(1061, "perf-sampler", frames=(
        Frame("_ModuleLock.acquire", _BOOT, 120, locals=(Local("self", "<_ModuleLock at 0x7a>"),)),
        Frame("_lock_unlock_module", _BOOT, 224, locals=(Local("name", '"perfhooks"'),)),
        Frame("<module>", "/home/alice/stepstats.py", 10, source=((10, "from perfhooks import INTERVAL"),)),
        *_importing("stepstats", 10),
        Frame("Sampler._run", "/home/alice/perfhooks.py", 30, locals=(Local("self", sampler),)), *_THREAD_RUN))
    ranks = list(job(8, 4, rank6=main))
    ranks[6] = dataclasses.replace(ranks[6], threads=(*ranks[6].threads, thread))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "waiting for the import of `perfhooks` to finish (its module lock), which its main thread is still " \
           "importing; which waits for the first: a deadlock" in line, line
    assert "start the thread after the import" in line, line


def test_a_lock_holder_waiting_for_an_event_only_the_lock_s_waiter_sets_is_a_deadlock() -> None:
    ema = "<EmaWeights at 0x7f3>"
    waiter = (Frame("update", "/home/alice/job.py", 480, locals=(Local("self", ema),),
                    source=((480, "        with self.lock:"),),
                    withs=(WithInfo(480, 484, "with self.lock:", ("self.lock",), entering=True),)),
              *stack("train (job.py:57)", "<module> (job.py:120)"))
    holder = ThreadStack(1011, "ema-worker", frames=(
        Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 327),
        Frame("Event.wait", "/usr/lib/python3.11/threading.py", 629, locals=(Local("self", "<Event at 0x7e1>"),)),
        Frame("_update", "/home/alice/job.py", 471, locals=(Local("self", ema),),
              source=((471, "            self.published.wait()"),),
              withs=(WithInfo(469, 474, "with self.lock:", ("self.lock",)),)), *_THREAD_RUN))
    ranks = list(job(8, 4, rank1=waiter))
    ranks[1] = dataclasses.replace(ranks[1], threads=(*ranks[1].threads, holder))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "waiting for the event `self.published` to be set, which only its main thread would give: a deadlock" \
        in line, line
    assert "each waits for the other" in line, line
    # the holder waiting for an event no thread is tied to (no locals read): no deadlock claimed
    bare = ThreadStack(1011, "ema-worker", frames=tuple(dataclasses.replace(f, locals=()) for f in holder.frames))
    ranks[1] = dataclasses.replace(ranks[1], threads=(ranks[1].threads[0], bare))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "deadlock" not in line and "each waits" not in line, line


def test_a_coroutine_future_assigned_a_line_before_is_one_and_an_executor_s_beside_it_is_not() -> None:
    def waiting(source: Tuple[Tuple[int, str], ...]) -> Snapshot:
        caller = Frame("control", "/home/alice/job.py", 262, source=source)
        ranks = list(job(8, 4, rank4=_COROUTINE_RESULT + (caller,) + stack("train (job.py:57)")))
        loop = ThreadStack(1040, "io-loop", frames=stack("socket.recv_into (/usr/lib/python3.11/socket.py:706)",
                                                         "_token (job.py:251)") + _LOOP_STEP)
        ranks[4] = dataclasses.replace(ranks[4], threads=(*ranks[4].threads, loop))
        return snapshot(ranks)

    snap = waiting(((261, "        fut = asyncio.run_coroutine_threadsafe(self._ask(step), self.loop)"),
                    (262, "        ok = fut.result()")))
    line = _headline(analyze(snap), snap)
    assert "which the loop runs on its thread `io-loop`" in line, line
    snap = waiting(((261, "        other = asyncio.run_coroutine_threadsafe(self._ask(step), self.loop)"),
                    (262, "        ok = f.result()")))
    line = _headline(analyze(snap), snap)
    assert "event loop" not in line and "io-loop" not in line, line


def _get_on(owner: str, line: str) -> tuple:
    return (Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 327),
            Frame("Queue.get", "/usr/lib/python3.11/queue.py", 171, locals=(Local("self", "<Queue at 0x7f0a>"),)),
            Frame("next_batch", "/home/alice/job.py", 286, locals=(Local("self", f"<{owner} at 0x7f0b>"),),
                  source=((286, line),)),
            *stack("train (job.py:57)", "<module> (job.py:120)"))


def test_a_wait_no_thread_of_its_object_can_end_names_the_missing_party_by_what_the_wait_needs() -> None:
    """A queue's get with no thread left on its queue: its producer is gone (not "whatever would release it");
    an event nobody is left to set: the setter. The other threads of the rank (gloo's) are not on the object."""
    ranks = list(job(8, 4, rank6=_get_on("Shards", "        return self.q.get()")))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "its producer has ended (or never started), and nothing will put into it" in line, line
    event = (Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 327),
             Frame("Event.wait", "/usr/lib/python3.11/threading.py", 629, locals=(Local("self", "<Event at 0x7f0c>"),)),
             Frame("next_batch", "/home/alice/job.py", 199, locals=(Local("self", "<Prefetch at 0x7f0d>"),),
                   source=((199, "        self.filled.wait()"),)),
             *stack("train (job.py:57)", "<module> (job.py:120)"))
    ranks = list(job(8, 4, rank0=event))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "the thread that would set the event has ended, or never started" in line, line
    assert "producer" not in line, line
    # its error output ends with a helper thread's uncaught exception: said, with where in the job's code, and the
    # next step is that error and a failure that reaches the waiter; a main thread's traceback says nothing of it
    thread_trace = ("Exception in thread shard-filler:\nTraceback (most recent call last):\n"
                    '  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner\n    self.run()\n'
                    '  File "/usr/lib/python3.11/threading.py", line 982, in run\n'
                    '  File "/home/alice/shards.py", line 41, in fill\n    hdr = parse_header(f.read(64))\n'
                    '  File "/opt/venv/lib/python3.11/site-packages/fmt/core.py", line 9, in parse_header\n'
                    "ValueError: bad magic 0x00\nstep 412 loss 0.0871\n")  # the main thread printed on
    main_trace = ('Traceback (most recent call last):\n  File "/home/alice/job.py", line 12, in <module>\n'
                  "KeyError: 'lr'\n")
    for trace, said in ((thread_trace, True), (main_trace, False)):
        ranks[0] = dataclasses.replace(ranks[0], output=(ErrorOutput("stderr", "/scratch/r0.err", trace, 900, 5.0),))
        snap = snapshot(ranks)
        line = _headline(analyze(snap), snap)
        assert ("its error output shows a thread that died of `ValueError: bad magic 0x00` in `fill` (shards.py:41)"
                in line) is said, line
        assert ("a thread of the rank died of an uncaught exception in `fill` (shards.py:41)" in line) is said, line


_ASYNC_RUN = (Frame("EpollSelector.select", "/usr/lib/python3.11/selectors.py", 468,
                    locals=(Local("timeout", "-1"), Local("max_ev", "1"))),
              Frame("BaseEventLoop._run_once", "/usr/lib/python3.11/asyncio/base_events.py", 1884,
                    locals=(Local("self", "<_UnixSelectorEventLoop at 0x7f5a>"), Local("sched_count", "0"),
                            Local("timeout", "None")),
                    source=((1884, "            event_list = self._selector.select(timeout)"),)),
              *stack("BaseEventLoop.run_forever (/usr/lib/python3.11/asyncio/base_events.py:607)",
                     "BaseEventLoop.run_until_complete (/usr/lib/python3.11/asyncio/base_events.py:640)",
                     "Runner.run (/usr/lib/python3.11/asyncio/runners.py:118)",
                     "run (/usr/lib/python3.11/asyncio/runners.py:190)"),
              Frame("get_batch", "/home/alice/job.py", 677, source=((677, "        return asyncio.run(self.fetch(step))"),)),
              *stack("train (job.py:57)", "<module> (job.py:120)"))
_OWN_WAKEUP = WaitFd(4, "socket:[7440920]", "socket", "read", "unix", state="ESTABLISHED",
                     others=(OtherEnd("peer", 1004, "python3", "S", fd=5, own=True),))


def _idle_loop(*fds: WaitFd, timeout: float = -1.0, threads: Tuple[ThreadStack, ...] = ()) -> Snapshot:
    ranks = list(job(8, 4, rank4=_ASYNC_RUN))
    main = dataclasses.replace(ranks[4].threads[0], syscall="epoll_wait", wchan="do_epoll_wait",
                               waits=KernelWait("epoll_wait", "epoll", fd=3, fds=fds, fds_total=len(fds),
                                                timeout=timeout))
    gloo = ThreadStack(1047, "gloo_tcp_loop", syscall="epoll_wait", wchan="do_epoll_wait")  # no Python frames
    ranks[4] = dataclasses.replace(ranks[4], threads=(main, gloo, *threads))
    return snapshot(ranks)


def test_an_idle_event_loop_with_no_timer_and_no_thread_to_wake_it_never_completes_what_it_awaits() -> None:
    """asyncio.run with nothing ready and nothing scheduled sleeps until I/O it watches or a thread's
    call_soon_threadsafe wakes it: it watches only its own wake-up socket, and no other thread runs Python."""
    snap = _idle_loop(_OWN_WAKEUP)
    line = _headline(analyze(snap), snap)
    assert "watches nothing but its own wake-up socket" in line and "nobody is left to complete" in line, line
    assert "asyncio.wait_for" in line.split("Next:")[1], line
    # a live thread that holds the loop could still wake it: named, no "nobody"
    pump = Frame("_pump", "/home/alice/job.py", 640, locals=(Local("loop", "<_UnixSelectorEventLoop at 0x7f5a>"),))
    feeder = ThreadStack(1049, "shard-transport", frames=stack("recv_into (/usr/lib/python3.11/socket.py:706)")
                         + (pump,) + _THREAD_RUN)
    loader = ThreadStack(1050, "shard-reader", frames=stack("recv_into (/usr/lib/python3.11/socket.py:706)",
                                                            "_read (job.py:213)") + _THREAD_RUN)
    snap = _idle_loop(_OWN_WAKEUP, threads=(loader, feeder))
    line = _headline(analyze(snap), snap)
    assert "only another thread can complete what it awaits" in line and "`shard-transport`" in line, line
    assert "nobody" not in line and "shard-reader" not in line, line
    # a thread that does not hold the loop is no waker of it: not named, and nothing claimed of "nobody"
    snap = _idle_loop(_OWN_WAKEUP, threads=(loader,))
    line = _headline(analyze(snap), snap)
    assert "none of the process's other threads names the loop" in line, line
    assert "nobody" not in line and "shard-reader" not in line, line


def test_an_idle_event_loop_watching_a_connection_names_its_peer_and_a_timer_is_no_hang_of_its_own() -> None:
    tcp = WaitFd(7, "socket:[991]", "socket", "read", "tcp", local="10.0.0.3:51000", peer="10.0.9.9:8443",
                 state="ESTABLISHED")
    snap = _idle_loop(_OWN_WAKEUP, tcp)
    line = _headline(analyze(snap), snap)
    assert "it watches I/O whose peer is" in line and "10.0.9.9:8443" in line and "nobody" not in line, line
    # a timer is due: time wakes it, nothing is claimed about who would
    snap = _idle_loop(_OWN_WAKEUP, timeout=4.2)
    line = _headline(analyze(snap), snap)
    assert "nobody" not in line and "wake-up socket" not in line and "no timer" not in line, line
    # the node did not read what it watches: its words say so, no "nobody"
    ranks = list(job(8, 4, rank4=_ASYNC_RUN))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "only I/O it watches could (the node did not read which)" in line and "nobody" not in line, line


def _exchange(line: int, code: str) -> tuple:
    return (Frame("HaloExchange.step", "/home/alice/job.py", line, source=((line, code),)),
            *stack("train (job.py:57)", "<module> (job.py:120)"))


def test_minority_classes_parting_only_at_a_line_of_one_function_single_neither_out() -> None:
    """Ranks 4-5 wait at `send.wait()` and rank 6 at `recv.wait()` of the same exchange while the rest wait in the
    all_reduce: the line does not make rank 6 the odd one against ranks 4-5, so no stack fact is [high]; a rank
    alone in that function still is."""
    sending, receiving = _exchange(532, "        send.wait()"), _exchange(533, "        recv.wait()")
    snap = snapshot(list(job(8, 4, rank4=sending, rank5=sending, rank6=receiving)))
    a = analyze(snap)
    stacks = [f for f in a.findings if f.kind in ("minority_stack", "different_collective")]
    assert len(stacks) == 2 and all(f.confidence != "high" for f in stacks), [(f.title, f.confidence) for f in stacks]
    assert a.verdict.startswith("Likely lead: "), a.verdict
    alone = analyze(snapshot(list(job(8, 4, rank6=receiving))))
    assert alone.findings[0].confidence == "high" and alone.verdict.startswith("Rank 6 "), alone.verdict


def _retrying(source: Tuple[Tuple[int, str], ...], line: int = 553) -> Snapshot:
    loop = LoopInfo("while", 548, 553, "while self.conn is None:", counters=("attempts",))
    scorer = Frame("Scorer.ask", "/home/alice/job.py", line, locals=(Local("t", "<Trainer at 0x7ff1>"),
                                                                     Local("attempts", "17")),
                   loops=(loop,), source=source)
    frames = (scorer, *stack("train (job.py:742)", "<module> (job.py:780)"))
    ranks = list(job(8, 4, rank3=frames))
    ranks[3] = dataclasses.replace(ranks[3], threads=(dataclasses.replace(
        ranks[3].threads[0], syscall="clock_nanosleep", wchan="hrtimer_nanosleep",
        waits=KernelWait("clock_nanosleep", "sleep", timeout=0.4)),))
    return snapshot(ranks)


def test_a_retry_loop_names_the_call_it_retries_and_what_it_catches() -> None:
    """A loop that sleeps in an `except` handler retries the call of its `try` (the `try:` line itself may be
    outside the source window): that call fails every time, not a condition that has not turned yet. An object
    shown by its address is no value the loop reads."""
    window = ((550, '                self.conn = socket.create_connection(("127.0.0.1", t.args.port), timeout=5)'),
              (551, "            except OSError:"), (552, "                attempts += 1"), (553, "                time.sleep(0.5)"),
              (554, '        self.conn.sendall(f"score {step}\\n".encode())'))
    snap = _retrying(window)
    line = _headline(analyze(snap), snap)
    assert "in the retry loop `while self.conn is None` (attempts=17)" in line, line
    assert "socket.create_connection((" in line and "`except OSError`" in line, line
    assert "Trainer at" not in line and "run it by hand on node01" in line, line
    # no except around it: a poll of a condition, as before
    plain = ((550, "            if self.ready():"), (551, "                break"), (552, "            attempts += 1"),
             (553, "            time.sleep(0.5)"))
    snap = _retrying(plain)
    line = _headline(analyze(snap), snap)
    assert "polling in the loop" in line and "retry loop" not in line, line


def test_a_fifo_nobody_opens_says_which_path_needs_its_writer() -> None:
    frames = (Frame("ControlChannel.poll", "/home/alice/job.py", 377, source=((377, "        with open(self.fifo) as f:"),)),
              *stack("train (job.py:742)", "<module> (job.py:780)"))
    ranks = list(job(8, 4, rank3=frames))
    fifo = WaitFd(None, "/run/job/ctl.fifo", "fifo", "read")
    ranks[3] = dataclasses.replace(ranks[3], threads=(dataclasses.replace(
        ranks[3].threads[0], syscall="openat", wchan="wait_for_partner",
        waits=KernelWait("openat", "open", fds=(fifo,), path="/run/job/ctl.fifo")),))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "waiting for a process to open the FIFO (`/run/job/ctl.fifo`) for writing" in line, line
    assert "no process has it open for writing" in line, line
    assert "no process has `/run/job/ctl.fifo` open for writing: start the program" in line.split("Next:")[1], line
    # opened for writing ("w"), it waits for a reader, not for data
    ranks[3] = dataclasses.replace(ranks[3], threads=(dataclasses.replace(
        ranks[3].threads[0], waits=KernelWait("openat", "open", fds=(dataclasses.replace(fifo, access="write"),),
                                              path="/run/job/ctl.fifo")),))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "waiting for a process to open the FIFO (`/run/job/ctl.fifo`) for reading" in line, line
    assert "for writing" not in line and "waiting for data" not in line, line


def test_a_write_to_a_terminal_that_takes_no_more_output_says_who_can_resume_it() -> None:
    """print() to a pty whose output was stopped (Ctrl-S) or that nobody reads: the node reads a write on fd 1, a
    tty; the person at that terminal (Ctrl-Q) or the program holding it releases it, not a py-spy dump."""
    frames = (Frame("ConsoleReport.after_sync", "/home/alice/job.py", 312,
                    source=((312, "        print(report, flush=True)"),)),
              *stack("finish (job.py:465)", "<module> (job.py:495)"))
    ranks = list(job(8, 4, rank0=frames))
    tty = WaitFd(1, "/dev/pts/0", "tty", "write", controlling=False)
    ranks[0] = dataclasses.replace(ranks[0], threads=(dataclasses.replace(
        ranks[0].threads[0], syscall="write", wchan="wait_woken", waits=KernelWait("write", "fd", fd=1, fds=(tty,))),))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "writing to its terminal (`/dev/pts/0`), which takes no more output" in line, line
    assert "resume its output (Ctrl-Q)" in line and "`ps -t pts/0` on node01" in line, line
    assert "mechanism is not known" not in line, line


def test_an_exit_waiting_for_its_one_helper_thread_follows_that_thread_and_says_how_the_program_ended() -> None:
    """The interpreter's shutdown joins its non-daemon threads; with one helper thread of the job left it is the
    one it waits for, and the chain goes on to what that thread waits for (a full queue whose consumer, the main
    program, has ended). A program that ended without an error is not told to fix one."""
    shutdown = (Frame("_wait_for_tstate_lock", "/usr/lib/python3.11/threading.py", 1132),
                Frame("_shutdown", "/usr/lib/python3.11/threading.py", 1583,
                      locals=(Local("locks", "[<_thread.lock at 0x7f10>]"),)))
    ranks = list(job(8, 4, rank7=shutdown))
    prefetch = ThreadStack(1090, "batch-prefetch", frames=(
        Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 327),
        Frame("Queue.put", "/usr/lib/python3.11/queue.py", 140, locals=(Local("self", "<Queue at 0x7f20>"),)),
        Frame("Prefetch._produce", "/home/alice/job.py", 367, locals=(Local("self", "<Prefetch at 0x7f21>"),),
              source=((367, "            self.batches.put(t.batch(step))"),)), *_THREAD_RUN))
    ranks[7] = dataclasses.replace(ranks[7], threads=(*ranks[7].threads, prefetch))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "its threads still running: its thread `batch-prefetch`; that one is blocked in `queue.Queue.put`" in line, line
    assert "its consumer has ended (or never started)" in line and "fix that error" not in line, line
    # two helper threads and one non-daemon thread to wait for: which one is not in a stack, the chain stops there
    other = dataclasses.replace(prefetch, tid=1091, name="metrics-flusher")
    ranks[7] = dataclasses.replace(ranks[7], threads=(*ranks[7].threads, other))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "that one is blocked" not in line and "among its threads still running" in line, line
    assert "ended without an error (it returned, or called sys.exit)" in line.split("Next:")[1], line


def test_one_collective_called_from_an_exit_handler_on_another_group_is_said_as_two_calls_that_never_match() -> None:
    """Rank 3 runs an atexit handler (no `<module>` frame below it: the interpreter called it as it exits) that
    all_reduces on its own metrics group; the others wait in the all_reduce of `finish` on the default group."""
    def reduce_from(*callers: str, code: str, line: int) -> tuple:
        first = callers[0]
        name, _, where_ = first.partition(" (")
        call = Frame(name, "/home/alice/job.py", line, source=((line, code),))
        return (Frame("all_reduce", C10D, 3252), Frame("wrapper", "/opt/venv/lib/python3.11/site-packages/torch/"
                                                       "distributed/c10d_logger.py", 83), call) + stack(*callers[1:])
    handler = reduce_from("MetricsAggregator.close (job.py:287)", code="        dist.all_reduce(merged, group=self.pg)",
                          line=287)
    final = reduce_from("finish (job.py:463)", "main (job.py:492)", "<module> (job.py:498)",
                        code="    dist.all_reduce(totals)", line=463)
    snap = snapshot(list(job(8, 4, frames=final, rank3=handler)))
    line = _headline(analyze(snap), snap)
    assert "rank 3 is in `all_reduce` called from `MetricsAggregator.close` (job.py:287), in code run as its " \
           "interpreter exits" in line, line
    assert "called from `finish` (job.py:463): two different calls, which never match" in line, line
    assert "another process group, `self.pg`, than the others': the default group" in line, line
    assert "an atexit handler or an error path" in line.split("Next:")[1], line


def _waiting_on_gzip(*writers: OtherEnd) -> Snapshot:
    frames = (Frame("Popen._try_wait", "/usr/lib/python3.11/subprocess.py", 2011),
              Frame("Popen._wait", "/usr/lib/python3.11/subprocess.py", 2053),
              Frame("Popen.wait", "/usr/lib/python3.11/subprocess.py", 1264),
              Frame("Trace.on_train_end", "/home/alice/job.py", 426, source=((426, "        self.tracer.wait()"),)),
              *stack("finish (job.py:465)", "<module> (job.py:495)"))
    ranks = list(job(8, 4, rank1=frames))
    pipe = WaitFd(0, "pipe:[7712]", "pipe", "read", others=writers)
    gzip = OtherEnd("child", 424, "gzip", "S", ppid=1001, wchan="anon_pipe_read", cmdline=("gzip", "-c"), reads=pipe)
    ranks[1] = dataclasses.replace(ranks[1], threads=(dataclasses.replace(
        ranks[1].threads[0], syscall="wait4", wchan="do_wait",
        waits=KernelWait("wait4", "wait", child_pid=424, children=(gzip,))),))
    return snapshot(ranks)


def test_a_child_reading_its_input_until_eof_names_who_holds_the_pipe_open() -> None:
    """Popen.wait() on `gzip -c`, which reads its stdin until its end: the end never comes while a process holds
    the pipe's write end: a process the rank forked after making the pipe, or the rank itself (a deadlock)."""
    forked = OtherEnd("writer", 425, "python", "S", ppid=1001, cmdline=("python", "-u", "job.py"), fd=9)
    snap = _waiting_on_gzip(forked)
    line = _headline(analyze(snap), snap)
    assert "the child pid 424 `gzip -c`, which reads its input (`pipe:[7712]`) until its end (EOF)" in line, line
    assert "write end is still open in pid 425 `python -u job.py` (started by the rank): its input never ends" in line
    assert "close_fds" in line.split("Next:")[1] and "each waits" not in line, line
    itself = OtherEnd("writer", 1001, "python", "S", fd=7, own=True)
    snap = _waiting_on_gzip(itself)
    line = _headline(analyze(snap), snap)
    assert "open in the rank itself: its input never ends, while the rank waits for the child: each waits for the " \
           "other" in line, line
    assert "`proc.stdin.close()`" in line.split("Next:")[1], line
    # discovery found the child beside the ranks too (a subprocess, no stack): the node's read of it still says
    snap = with_processes(_waiting_on_gzip(forked), [job_process(424, "child", (1001,), kind="subprocess")])
    line = _headline(analyze(snap), snap)
    assert "write end is still open in pid 425 `python -u job.py` (started by the rank)" in line, line


def test_a_child_reading_a_standard_input_written_from_outside_the_node_waits_for_input_that_does_not_come() -> None:
    """The child reads its fd 0, a pipe no process of the node holds open for writing (the node searched every
    process): the writer is the job's own input from outside (a launcher's, an ssh session's). Said as such, with
    what to do (its input from /dev/null, non-interactive options); a search that did not finish claims nothing."""
    snap = _waiting_on_gzip()
    line = _headline(analyze(snap), snap)
    assert "the child pid 424 `gzip -c`, which waits to read its standard input (`pipe:[7712]`), a pipe that no " \
           "process of the node holds open for writing" in line, line
    assert "`stdin=subprocess.DEVNULL`" in line.split("Next:")[1] and "end it" not in line, line
    ranks = list(snap.ranks)
    main = ranks[1].threads[0]
    assert main.waits is not None
    child = main.waits.children[0]
    assert child.reads is not None
    partial = dataclasses.replace(child, reads=dataclasses.replace(child.reads, complete=False))
    ranks[1] = dataclasses.replace(ranks[1], threads=(dataclasses.replace(
        main, waits=dataclasses.replace(main.waits, children=(partial,))),))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "standard input" not in line and "DEVNULL" not in line, line
    # its input from a file descriptor other than 0 (a pipe it was given): not its standard input
    other = dataclasses.replace(child, reads=dataclasses.replace(child.reads, fd=5))
    ranks[1] = dataclasses.replace(ranks[1], threads=(dataclasses.replace(
        main, waits=dataclasses.replace(main.waits, children=(other,))),))
    snap = snapshot(ranks)
    assert "standard input" not in _headline(analyze(snap), snap)


def _child_on_recv(*ends: OtherEnd, complete: bool = True) -> Snapshot:
    joining = stack("Popen.wait (/usr/lib/python3.11/multiprocessing/popen_fork.py:43)",
                    "BaseProcess.join (/usr/lib/python3.11/multiprocessing/process.py:149)",
                    "_exit_function (/usr/lib/python3.11/multiprocessing/util.py:357)")
    ranks = list(job(8, 4, rank2=joining))
    sock = WaitFd(17, "socket:[7530608]", "socket", "read", "unix", state="ESTABLISHED",
                  others=(*ends, OtherEnd("peer", 115, "python", "S", own=True)), complete=complete)
    main = ThreadStack(115, "MainThread", is_main=True, state="S", syscall="read", wchan="unix_stream_read_generic",
                       frames=stack("Connection._recv (/usr/lib/python3.11/multiprocessing/connection.py:395)",
                                    "Connection._recv_bytes (/usr/lib/python3.11/multiprocessing/connection.py:430)",
                                    "_ConnectionBase.recv (/usr/lib/python3.11/multiprocessing/connection.py:250)")
                       + (Frame("_mirror_loop", "/home/alice/job.py", 192, source=((192, "        path = conn.recv()"),)),)
                       + stack("BaseProcess.run (/usr/lib/python3.11/multiprocessing/process.py:108)"),
                       waits=KernelWait("read", "fd", fd=17, fds=(sock,)))
    return with_processes(snapshot(ranks), [job_process(115, "child", (1002,), kind="multiprocessing child",
                                                        threads=(main,))])


def test_a_child_reading_a_connection_only_its_joining_parent_holds_is_a_deadlock() -> None:
    """The rank joins a multiprocessing child (at its exit) that waits in conn.recv() on a socketpair whose other
    end only the rank holds: the rank would have to send first, and it waits for the child to exit."""
    snap = _child_on_recv(OtherEnd("peer", 1002, "python", "S"))
    line = _headline(analyze(snap), snap)
    assert "only the rank itself (pid 1002) holds its other end, to send on it; which waits for the first: a " \
           "deadlock" in line, line
    assert "send the child what it waits for" in line.split("Next:")[1], line
    # a third process holds that end too (or the search was cut short): no deadlock claimed
    for other, complete in ((OtherEnd("peer", 2222, "python", "S"), True), (None, False)):
        ends = (OtherEnd("peer", 1002, "python", "S"),) + ((other,) if other is not None else ())
        snap = _child_on_recv(*ends, complete=complete)
        line = _headline(analyze(snap), snap)
        assert "a deadlock" not in line, line


def test_a_rank_exiting_that_joins_its_queue_feeder_writing_a_full_pipe_says_both_and_cancel_join_thread() -> None:
    """At exit, multiprocessing's exit function joins a Queue's feeder thread, blocked writing into the queue's
    full pipe that no process reads: the headline starts where the rank is stuck (the join, as it exits)."""
    exiting = ThreadStack(1005, "MainThread", is_main=True, state="S", syscall="futex", wchan="futex_do_wait",
                          frames=(Frame("Thread._wait_for_tstate_lock", "/usr/lib/python3.11/threading.py", 1139),
                                  Frame("Thread.join", "/usr/lib/python3.11/threading.py", 1119,
                                        locals=(Local("self", "<Thread at 0x7ff804ceb250>"),)))
                          + stack("Queue._finalize_join (/usr/lib/python3.11/multiprocessing/queues.py:199)",
                                  "_run_finalizers (/usr/lib/python3.11/multiprocessing/util.py:300)",
                                  "_exit_function (/usr/lib/python3.11/multiprocessing/util.py:360)"))
    pipe = WaitFd(17, "pipe:[7527867]", "pipe", "write", others=(OtherEnd("reader", 1005, "python", "S", own=True),))
    feeder = ThreadStack(1069, "QueueFeederThread", state="S", syscall="write", wchan="anon_pipe_write",
                         waits=KernelWait("write", "fd", fd=17, fds=(pipe,)), frames=(
                             Frame("Connection._send", "/usr/lib/python3.11/multiprocessing/connection.py", 384),
                             Frame("Queue._feed", "/usr/lib/python3.11/multiprocessing/queues.py", 250),
                             Frame("Thread.run", "/usr/lib/python3.11/threading.py", 982,
                                   locals=(Local("self", "<Thread at 0x7ff804ceb250>"),)),
                             Frame("Thread._bootstrap", "/usr/lib/python3.11/threading.py", 1002,
                                   locals=(Local("self", "<Thread at 0x7ff804ceb250>"),))))
    ranks = list(job(8, 4))
    ranks[5] = dataclasses.replace(ranks[5], threads=(exiting, feeder))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "main thread is blocked in `Thread.join` as its interpreter exits (in `_exit_function`" in line, line
    assert "waiting for a thread to end: its thread `QueueFeederThread`, which is blocked writing to a full " \
           "pipe" in line, line
    assert "`queue.cancel_join_thread()`" in line.split("Next:")[1], line


def test_a_recv_whose_peer_waits_in_a_collective_says_both_in_the_headline_and_not_to_reorder_pairs() -> None:
    """The stack fact says where rank 3 is ("in `recv` while 7 others wait in `all_reduce`"); the headline adds
    what its recv waits for (rank 6, which waits in the all_reduce that cannot finish without rank 3), and the next
    step is about the branch one of them took, not about ordering send/recv pairs (there is no pair)."""
    ranks = list(job(8, 4))
    ranks[3] = rank(3, "node01", p2p("recv", "src", 6), world=8)
    a = analyze(snapshot(ranks, locals=True))
    assert "it waits for rank 6 (src=6) to send to it, and rank 6 waits in `all_reduce`, which cannot finish without " \
           "this rank: neither goes on" in a.verdict, a.verdict
    after = a.verdict.split("Next:")[1]
    assert "are not the same step of the program" in after and "batch_isend_irecv" not in after, a.verdict


def test_a_file_lock_held_by_another_rank_waiting_in_a_collective_is_a_deadlock_of_the_two() -> None:
    """Rank 2 waits for a file lock that rank 3 (on the same node) took before the barrier, and rank 3 waits in
    that barrier, which cannot finish without rank 2. The node names the lock's holder by pid: that pid is a rank
    of the job, and its own wait closes the cycle. "End it" would kill a rank: the advice is about the lock."""
    lockf = (Frame("lockf", "/home/alice/job.py", 77, source=((77, "        fcntl.lockf(fd, fcntl.LOCK_EX)"),)),
             *stack("prepare (job.py:70)", "<module> (job.py:120)"))
    holder = OtherEnd("lock_holder", 1003, "python3", "S", cmdline=("python3", "job.py"), lock="POSIX WRITE 0-EOF")
    ranks = list(job(8, 4, frames=stack("barrier (distributed_c10d.py:4100)", "prepare (job.py:74)",
                                          "<module> (job.py:120)"), rank2=lockf))
    main = dataclasses.replace(ranks[2].threads[0], syscall="fcntl", wchan="locks_lock_inode_wait",
                               waits=KernelWait("fcntl", "lock", fd=7, fds=(WaitFd(7, "/scratch/prep/.lock", "file",
                                                                                   "lock", others=(holder,)),),
                                                path="/scratch/prep/.lock", lock_type="POSIX", lock_mode="WRITE"))
    ranks[2] = dataclasses.replace(ranks[2], threads=(main,))
    snap = snapshot(ranks)
    a = analyze(snap)
    line = _headline(a, snap)
    assert line.startswith("hangscope: Rank 2 (pid 1002 on node01) is blocked in `fcntl.lockf`"), line
    assert "held by rank 3 on node01; that one is blocked in `barrier`" in line, line
    assert "which cannot finish without rank 2 on node01 (the first): each waits for the other, a deadlock" in line
    assert "rank 3 holds the file lock while it waits in `barrier`, which needs rank 2: release it before the " \
           "collective" in line, line
    assert "end it" not in line and "kill" not in line, line
    # the holder waits in a collective of a group its call names: that group may not include rank 2, no cycle
    sub = list(snap.ranks)
    h = sub[3].threads[0]
    sub[3] = dataclasses.replace(sub[3], threads=(dataclasses.replace(h, frames=(h.frames[0], dataclasses.replace(
        h.frames[1], source=((74, "    dist.barrier(group=self.io_group)"),)), *h.frames[2:])),))
    line = _headline(analyze(snapshot(sub)), snapshot(sub))
    assert "held by rank 3 on node01; that one is blocked in `barrier`" in line and "deadlock" not in line, line
    assert "waiting for every rank of the group `self.io_group` to enter it" in line, line
    assert "rank 3 holds what rank 2 waits for while it waits in `barrier` on `self.io_group`: if that group " \
           "includes rank 2, each waits for the other" in line.split("Next:")[1], line
    # the same lock held by a process that is no rank of the job: its holder, as before
    other = dataclasses.replace(holder, pid=4242, cmdline=("compact-metrics",))
    ranks[2] = dataclasses.replace(ranks[2], threads=(dataclasses.replace(
        main, waits=dataclasses.replace(main.waits, fds=(dataclasses.replace(main.waits.fds[0], others=(other,)),))),))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "held by pid 4242 `compact-metrics`" in line and "deadlock" not in line, line


def test_threads_waiting_for_a_module_lock_wait_for_the_thread_that_runs_the_import_not_for_each_other() -> None:
    """The main thread imports `plugins`, whose top level starts two loader threads and joins them; each loader
    imports `plugins` back and waits for its module lock. Both loaders have `plugins` in their import frames, but
    only the main thread holds the lock (it runs the import): each loader waits for it, not for the other."""
    def loader(tid: int, name: str) -> ThreadStack:
        return ThreadStack(tid, name, frames=(
            Frame("_ModuleLock.acquire", _BOOT, 120, locals=(Local("self", "<_ModuleLock at 0x7c>"),)),
            Frame("_lock_unlock_module", _BOOT, 224, locals=(Local("name", '"plugins"'),)),
            Frame("_find_and_load", _BOOT, 1173, locals=(Local("name", '"plugins"'),)),
            Frame("load_one", "/home/alice/plugins/registry.py", 9,
                  source=((9, "    from plugins import REGISTRY"),)), *_THREAD_RUN))
    main = (Frame("Thread._wait_for_tstate_lock", "/usr/lib/python3.11/threading.py", 1139,
                  locals=(Local("self", "<Thread at 0x7b1>"),)),
            Frame("Thread.join", "/usr/lib/python3.11/threading.py", 1119, locals=(Local("self", "<Thread at 0x7b1>"),)),
            Frame("<module>", "/home/alice/plugins/__init__.py", 22, source=((22, "    t.join()"),)),
            *_importing("plugins", 22), *stack("setup (job.py:40)", "<module> (job.py:120)"))
    ranks = list(job(8, 4, rank5=main))
    # py-spy lists the newest threads first
    ranks[5] = dataclasses.replace(ranks[5], threads=(loader(1052, "loader-b"), loader(1051, "loader-a"),
                                                      *ranks[5].threads))
    snap = snapshot(ranks)
    line = _headline(analyze(snap), snap)
    assert "waiting for the import of `plugins` to finish (its module lock), which its main thread is still " \
           "importing; which waits for the first: a deadlock" in line, line
    assert "which its thread `loader-" not in line, line


def test_a_pool_whose_workers_all_idle_lost_the_task_of_one_that_died_killed_or_crashed() -> None:
    """Pool.map's result never comes while every worker waits for its next task: the worker that held the task
    died (the OOM killer, or a crash in native code) and the pool replaced it. Both are in the kernel log."""
    main = stack("Condition.wait (/usr/lib/python3.11/threading.py:320)",
                 "MapResult.get (/usr/lib/python3.11/multiprocessing/pool.py:768)",
                 "Pool.map (/usr/lib/python3.11/multiprocessing/pool.py:367)", "index (job.py:40)",
                 "<module> (job.py:120)")
    ranks = list(job(8, 4, rank6=main))

    def worker(pid: int) -> JobProcess:
        t = ThreadStack(pid, "MainThread", is_main=True, frames=stack(
            "Connection._recv (/usr/lib/python3.11/multiprocessing/connection.py:395)",
            "SimpleQueue.get (/usr/lib/python3.11/multiprocessing/queues.py:364)",
            "worker (/usr/lib/python3.11/multiprocessing/pool.py:114)",
            "BaseProcess._bootstrap (/usr/lib/python3.11/multiprocessing/process.py:314)"))
        return job_process(pid, "child", (1006,), node="node02", kind="multiprocessing child", threads=(t,))

    snap = with_processes(snapshot(ranks), [worker(2001), worker(2002)])
    line = _headline(analyze(snap), snap)
    assert "a pool replaces a worker that died, killed or crashed" in line, line
    assert "`dmesg -T | grep -i -e killed -e oom -e segfault`" in line.split("Next:")[1], line


def test_a_poll_loop_on_a_file_no_process_of_the_node_writes_says_so_and_one_being_written_names_its_writer() -> None:
    """`while not os.path.exists(marker): time.sleep(1)` on a file the node found no process holding open for
    writing (its whole /proc/*/fd scan): nothing on the node is writing what it waits for, and the next step is to
    find what should. A writer found is named instead; a path the loop does not read claims nothing."""
    def polling(marker: str, watched: Tuple[WaitFd, ...]) -> Snapshot:
        frames = (Frame("wait_commit", "/home/alice/job.py", 88, locals=(Local("marker", f'"{marker}"'),),
                        loops=(LoopInfo("while", 87, 88, "    while not os.path.exists(marker):"),),
                        source=((87, "    while not os.path.exists(marker):"), (88, "        time.sleep(1)"))),
                  *stack("train (job.py:57)", "<module> (job.py:120)"))
        ranks = list(job(8, 4, rank6=frames))
        main = dataclasses.replace(ranks[6].threads[0], syscall="clock_nanosleep", wchan="hrtimer_nanosleep",
                                   waits=KernelWait("clock_nanosleep", "sleep", timeout=0.6, watched=watched))
        ranks[6] = dataclasses.replace(ranks[6], threads=(main,))
        return snapshot(ranks)

    marker = "/ckpt/step-400/COMMITTED"
    snap = polling(marker, (WaitFd(None, marker, "file", "read", complete=True),))
    line = _headline(analyze(snap), snap)
    assert "it sleeps and checks again; no process of the node has `/ckpt/step-400/COMMITTED` open for writing (by " \
           "that name): nothing there is writing what it waits for" in line, line
    assert "no process on node02 is writing /ckpt/step-400/COMMITTED: find what should create or complete it" in \
        line.split("Next:")[1], line
    writer = OtherEnd("writer", 3130, "python3", "S", cmdline=("python3", "commit.py"), fd=5)
    snap = polling(marker, (WaitFd(None, marker, "file", "read", others=(writer,), complete=True),))
    line = _headline(analyze(snap), snap)
    assert "pid 3130 python3 commit.py has the file it polls open for writing" in line, line
    assert "no process" not in line, line
    for watched in ((WaitFd(None, marker, "file", "read", complete=False),),  # a search that did not finish
                    (WaitFd(None, "/ckpt/other", "file", "read", complete=True),)):  # not what the loop reads
        snap = polling(marker, watched)
        line = _headline(analyze(snap), snap)
        assert "open for writing" not in line and "polls for something that does not happen" in line, line


def test_a_connection_both_ends_of_which_wait_to_read_is_said_to_wait_for_each_other() -> None:
    """Rank 4 reads a reply from a node-local service whose process is itself asleep reading its end of the same
    connection (the node read its thread's call): each waits for the other to send first. A peer asleep elsewhere
    keeps the usual 'see what it does'."""
    def reading(peer_reads: bool) -> Snapshot:
        frames = (Frame("socket.recv", "/usr/lib/python3.11/socket.py", 706),
                  Frame("Client.fetch", "/home/alice/job.py", 140, source=((140, "        n = sock.recv(8)"),)),
                  *stack("train (job.py:57)", "<module> (job.py:120)"))
        ranks = list(job(8, 4, rank4=frames))
        svc = OtherEnd("peer", 880, "python3", "S", cmdline=("python3", "featsvc.py"), fd=6, reading=peer_reads)
        sock = WaitFd(9, "socket:[4411]", "socket", "read", "unix", peer="/run/featsvc.sock", state="ESTABLISHED",
                      others=(svc,))
        main = dataclasses.replace(ranks[4].threads[0], syscall="recvfrom", wchan="unix_stream_read_generic",
                                   waits=KernelWait("recvfrom", "fd", fd=9, fds=(sock,)))
        ranks[4] = dataclasses.replace(ranks[4], threads=(main,))
        return snapshot(ranks)

    snap = reading(True)
    line = _headline(analyze(snap), snap)
    assert "its peer is pid 880 `python3 featsvc.py`, which is itself asleep reading its end of this same " \
           "connection: each end waits for the other to send first" in line, line
    assert "both ends of the connection wait to read" in line.split("Next:")[1] and "end it" not in line, line
    snap = reading(False)
    line = _headline(analyze(snap), snap)
    assert "itself asleep reading" not in line and "see what pid 880 does" in line, line


def test_a_loader_worker_and_its_child_writing_full_pipes_to_each_other_are_a_deadlock() -> None:
    """A DataLoader worker writes a big document into the stdin of its child, a filter that writes as it reads
    (`tr`), which blocks writing its stdout, a pipe the worker reads only after its own write ends. Each writes a
    full pipe the other would read: the chain follows the worker to its child and back."""
    ranks = list(job(8, 4, rank1=LOADER_QUEUE))
    worker_main = ThreadStack(4242, "MainThread", is_main=True, state="S", syscall="write", wchan="anon_pipe_write",
                              frames=stack("Docs.__iter__ (job.py:88)", "_worker_loop (worker.py:308)"),
                              waits=KernelWait("write", "fd", fd=9, fds=(WaitFd(9, "pipe:[51]", "pipe", "write", others=(
                                  OtherEnd("reader", 4250, "tr", "S", ppid=4242, cmdline=("tr", "a-z", "A-Z"),
                                           fd=0),)),)))
    filt_main = ThreadStack(4250, "tr", is_main=True, state="S", syscall="write", wchan="anon_pipe_write",
                            waits=KernelWait("write", "fd", fd=1, fds=(WaitFd(1, "pipe:[52]", "pipe", "write", others=(
                                OtherEnd("reader", 4242, "pt_data_worker", "S", ppid=1001, fd=10),)),)))
    procs = [job_process(4242, "child", (1001,), threads=(worker_main,)),
             job_process(4250, "child", (1001,), kind="subprocess", cmdline=("tr", "a-z", "A-Z"), threads=(filt_main,))]
    snap = with_processes(snapshot(ranks), procs)
    line = _headline(analyze(snap), snap)
    assert "waiting for the reader of a full pipe (`pipe:[51]`); the reader pid 4250 `tr a-z A-Z`; that one is " \
           "blocked in `pipe write`" in line, line
    assert "waiting for the reader of a full pipe (`pipe:[52]`); which waits for pid 4242" in line and \
           "again: a deadlock" in line, line
    # the filter writing a pipe someone else reads: no cycle
    other = dataclasses.replace(filt_main, waits=KernelWait("write", "fd", fd=1, fds=(WaitFd(
        1, "pipe:[52]", "pipe", "write", others=(OtherEnd("reader", 4300, "cat", "S", fd=0),)),)))
    procs[1] = dataclasses.replace(procs[1], threads=(other,))
    snap = with_processes(snapshot(ranks), procs)
    line = _headline(analyze(snap), snap)
    assert "deadlock" not in line, line
