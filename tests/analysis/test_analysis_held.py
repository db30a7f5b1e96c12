"""Process state outranks stack position: a stopped or frozen rank is the headline (what holds it, that the
others wait for it, what resumes it), the progress line names it, and the silence of its sockets is not made a
[high] network lead. Also: the node's reading of the state survives the worker item -> model -> JSON trip, and a
snapshot written before these fields existed still loads."""

from __future__ import annotations

import dataclasses
import json

from analysis_snapshots import LOADING, job, rank, snapshot, sock
from app.decode import replies as parse
from app.analysis import analyze
from app.analysis.text import summary_text
from app.model import ProcessHold
from app.model.codec import snapshot_from_json, snapshot_to_json

SLEEP = LOADING  # the held rank's own stack: somewhere in its loop, not in the collective

FROZEN_V2 = ProcessHold(kind="frozen", freezer="v2", cgroup="/slurm/job42", freezer_state="FROZEN",
                        thaw="echo 0 > /sys/fs/cgroup/slurm/job42/cgroup.freeze", wchan="do_freezer_trap")


def held_job(hold: ProcessHold, state: str = "S", **kw: object) -> list:
    ranks = list(job(8, 2, rank5=SLEEP))
    ranks[5] = rank(5, "node03", SLEEP, world=8, state=state, thread_state=state, hold=hold, **kw)
    return ranks


def test_a_frozen_rank_is_the_headline_not_its_stack_and_not_uninterruptible_sleep() -> None:
    # v1 freezes show D: the freezer, not the D state, is the answer
    a = analyze(snapshot(held_job(dataclasses.replace(FROZEN_V2, freezer="v1"), state="D")))
    assert a.verdict == ("Rank 5 is frozen by the cgroup freezer (v1 cgroup /slurm/job42); the other 7 ranks wait "
                         "for it; thaw with `echo 0 > /sys/fs/cgroup/slurm/job42/cgroup.freeze` on node03.")
    assert a.findings[0].kind == "frozen" and a.findings[0].confidence == "high"
    assert "uninterruptible" not in [f.kind for f in a.findings]
    assert "SIGCONT does not thaw it" in a.findings[0].detail


def test_a_container_pause_says_how_to_unpause() -> None:
    hold = dataclasses.replace(FROZEN_V2, cgroup="/system.slice/docker-0123456789ab.scope",
                               container="docker unpause 0123456789ab")
    assert "(or `docker unpause 0123456789ab`)" in analyze(snapshot(held_job(hold))).verdict


def test_a_stopped_rank_outranks_a_high_minority_stack() -> None:
    ranks = held_job(ProcessHold(kind="stopped", stopped_by="signal", tty=True), state="T")
    a = analyze(snapshot(ranks))
    assert [f.kind for f in a.findings[:2]] == ["stopped", "minority_stack"]
    assert a.verdict == ("Rank 5 is stopped (SIGSTOP or Ctrl-Z in its terminal); the other 7 ranks wait for it; "
                         "`kill -CONT 1005` on node03 resumes it.")


def test_a_rank_stopped_by_a_debugger_names_the_tracer() -> None:
    ranks = held_job(ProcessHold(kind="traced", stopped_by="tracer", tracer_pid=777, tracer="gdb"), state="t")
    assert analyze(snapshot(ranks)).verdict == ("Rank 5 is stopped (by its tracer, PID 777 (gdb)); the other 7 "
                                                "ranks wait for it; detach the tracer (quit the debugger) to resume it.")
    # a tracer whose name could not be read is named by its pid alone
    ranks = held_job(ProcessHold(kind="traced", stopped_by="tracer", tracer_pid=777), state="t")
    assert analyze(snapshot(ranks)).verdict.startswith("Rank 5 is stopped (by its tracer, PID 777); ")


def _waiter_touched_by_our_tool(hold: ProcessHold, letter: str) -> list:
    """Rank 5 is the odd one out (its own stack); rank 0, one of the ranks waiting in the collective, was read
    while a tool of the reading worker's own held it for a moment."""
    ranks = held_job(ProcessHold(), state="S")  # rank 5: SLEEP stack, nothing holds it
    ranks[5] = dataclasses.replace(ranks[5], hold=None)
    ranks[0] = rank(0, "node01", ranks[0].threads[0].frames, world=8, state=letter, thread_state=letter, hold=hold)
    return ranks


def test_a_stop_of_hangscopes_own_tool_never_blames_the_rank_it_held() -> None:
    # The state read made for the question said asleep; the kernel already showed the attaching tool's pid (the
    # tracer is set before the stop lands), and the thread letters were read around that tool: the rank is not
    # stopped, the odd one out is still the answer.
    plain = analyze(snapshot(_waiter_touched_by_our_tool(ProcessHold(), "S"))).verdict
    assert plain.startswith("Rank 5 ")
    attaching = ProcessHold(kind="sleeping", tracer_pid=281, tracer="3")
    for hold, letter in [(attaching, "t"), (attaching, "T"), (dataclasses.replace(attaching, tracer_ours=True), "t"),
                         # the worker's own tool still held it when the worker stopped waiting for it
                         (ProcessHold(kind="traced", stopped_by="tracer", tracer_pid=281, tracer="3",
                                      tracer_ours=True), "t")]:
        a = analyze(snapshot(_waiter_touched_by_our_tool(hold, letter)))
        assert "stopped" not in [f.kind for f in a.findings], (hold, letter, a.verdict)
        assert a.verdict == plain, (hold, letter)
    # the same tracing stop by someone else's tracer is the job's hold, and the headline
    other = ProcessHold(kind="traced", stopped_by="tracer", tracer_pid=281, tracer="gdb")
    assert analyze(snapshot(_waiter_touched_by_our_tool(other, "t"))).verdict.startswith(
        "Rank 0 is stopped (by its tracer, PID 281 (gdb))")
    # with no reading of the hold (a snapshot from before it, a rank not dumped) the letters are all there is: a
    # signal's stop (T) holds the rank, a tracing stop (t) names no tracer and every tool of ours makes one
    assert analyze(snapshot(_waiter_touched_by_our_tool(None, "T"))).verdict.startswith("Rank 0 is stopped")  # type: ignore[arg-type]
    assert analyze(snapshot(_waiter_touched_by_our_tool(None, "t"))).verdict == plain  # type: ignore[arg-type]
    # the flag travels from the worker's item into the model
    assert parse.process_hold({"kind": "traced", "tracer_pid": 281, "tracer": "3", "tracer_ours": True}).tracer_ours
    assert not parse.process_hold({"kind": "traced", "tracer_pid": 281, "tracer_ours": "yes"}).tracer_ours


def test_the_held_ranks_silence_is_no_high_network_lead() -> None:
    # every rank's sockets to the held rank's node are silent: without the state, a [high] network lead
    silent = dict(last_send_ms=90_000, last_recv_ms=90_000, last_ack_ms=90_000, send_q=4096)
    ranks = []
    for r in job(8, 2):
        s = (sock(f"10.0.0.{r.rank // 2 + 1}:4000{r.rank}", "10.0.0.3:40005", **silent),)
        ranks.append(dataclasses.replace(r, sockets=s))
    plain = [f for f in analyze(snapshot(ranks)).findings if f.kind == "network_stall"]
    assert plain and all(f.culprit and f.confidence != "low" for f in plain)  # a lead without the state
    held = list(ranks)
    held[5] = dataclasses.replace(held[5], state="T", hold=ProcessHold(kind="stopped", stopped_by="signal"))
    a = analyze(snapshot(held))
    assert a.findings[0].kind == "stopped"
    network = [f for f in a.findings if f.kind in ("network_stall", "all_identical")]
    assert network and all(f.confidence == "low" and not f.culprit and "stopped" in f.reason for f in network)


def test_the_progress_line_names_the_held_rank() -> None:
    ranks = held_job(FROZEN_V2)
    earlier = snapshot(ranks, taken_at=1000.0)
    later = snapshot(ranks, taken_at=1005.0)
    a = analyze(later, history=[earlier])
    text = summary_text(later, a)
    assert "8 ranks stuck for up to 5 s; 7 sleeping, rank 5 frozen (cgroup freezer)" in text, text
    assert a.verdict.startswith("Rank 5 is frozen by the cgroup freezer")


def test_the_nodes_reading_travels_into_the_model_and_the_snapshot_file() -> None:
    item = {"pid": 1005, "start_time": 1, "ok": True, "pyspy": [], "state_before": "D", "resumed": False,
            "process": {"kind": "frozen", "state": "D", "tty": False, "tracer_pid": 0, "wchan": "__refrigerator",
                        "freezer": {"version": 1, "cgroup": "/job", "state": "FROZEN",
                                    "path": "/sys/fs/cgroup/freezer/job/freezer.state",
                                    "thaw": "echo THAWED > /sys/fs/cgroup/freezer/job/freezer.state",
                                    "container": ""}},
            "actions": ["read /proc", "py-spy dump --nonblocking: read its memory, never attached"]}
    r = parse.apply_dump(rank(5, "node03", (), world=8), item)
    assert r.hold == ProcessHold(kind="frozen", freezer="v1", cgroup="/job", freezer_state="FROZEN",
                                 thaw="echo THAWED > /sys/fs/cgroup/freezer/job/freezer.state",
                                 wchan="__refrigerator")
    assert r.actions == ("read /proc", "py-spy dump --nonblocking: read its memory, never attached")
    snap = snapshot([r])
    back, _ = snapshot_from_json(snapshot_to_json(snap))
    assert back.ranks[0].hold == r.hold and back.ranks[0].actions == r.actions
    # hostile or malformed remote values are bounded or dropped, never an exception
    assert parse.process_hold({"kind": "x" * 1000, "freezer": "nonsense", "tracer_pid": "7"}).kind == "x" * 20
    assert parse.process_hold("frozen") is None
    # nothing holds a sleeping process that no one traces: no hold, the state letter says the rest
    assert parse.process_hold({"kind": "sleeping", "state": "S", "tracer_pid": 0}) is None
    assert parse.process_hold({"kind": "sleeping", "tracer_pid": 99, "tracer": "strace"}).tracer_pid == 99


def test_a_snapshot_from_before_the_state_fields_still_loads() -> None:
    doc = json.loads(snapshot_to_json(snapshot(list(job(4, 2)))))
    for r in doc["snapshot"]["ranks"]:
        del r["hold"], r["actions"]
    back, _ = snapshot_from_json(json.dumps(doc))
    assert all(r.hold is None and r.actions == () for r in back.ranks)
