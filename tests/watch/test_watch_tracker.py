"""The watch's tracker on built samples: a healthy job is never stalled nor slow, a hang is declared at its limit
(and the next sample is asked for then), a resumption says how long the job stood still, a slow stretch is
declared once and its recovery said, a job ends only when none of its ranks is found where its nodes answered,
nodes drop and come back, and a job's own watchdog lowers the stall limit."""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Sequence

from app.decode.replies import PgTimeout
from app.model import ErrorInfo, NodeStatus, ProgressCounters, RankSnapshot, Snapshot, TcpSocket
from app.watch.events import (Ended, JobFound, NodeBack, NodeLost, Recovered, Resumed, SlowDetected, Stalled,
                              sparkline)
from app.watch.timeouts import job_watchdog, stall_limit
from app.watch.tracker import MAX_JOBS, POINTS, TrackOptions, Tracker

JOB = "10.0.0.1:29500"
NODES = ("n1", "n2")
# the samples count bytes to the peers in kB: a job's data, above the control traffic (keepalives, status queries)
# that app.analysis.progress.BULK_RATE leaves out
KB = 1000


def rank(node: str, i: int, at: float, sent: int, *, job: str = JOB, env: Sequence = (), log: int = 0
         ) -> RankSnapshot:
    sock = TcpSocket(local=f"10.0.0.{i}:4000", peer="10.0.0.9:5000", state="ESTABLISHED", bytes_acked=sent * KB,
                     bytes_received=sent * KB)
    return RankSnapshot(node=node, pid=100 + i, start_time=7, rank=i, job=job, master_port=29500,
                        sockets=(sock,), env=tuple(env),
                        counters=ProgressCounters(at=at, state="S", utime=at / 10, stime=0.0, log_bytes=log))


def sample(at: float, sent: Dict[int, int], *, failed: Iterable[str] = (), job: str = JOB, env: Sequence = ()
           ) -> Snapshot:
    down = set(failed)
    nodes = tuple(NodeStatus(n, state="failed", error=ErrorInfo("lost", f"{n}: connection lost")) if n in down
                  else NodeStatus(n, state="done") for n in NODES)
    ranks = tuple(rank(NODES[i % 2], i, at, b, job=job, env=env) for i, b in sent.items()
                  if NODES[i % 2] not in down)
    return Snapshot(taken_at=at, nodes=nodes, ranks=ranks)


def run(tracker: Tracker, samples: Iterable[Snapshot]) -> List:
    events: List = []
    for s in samples:
        events += tracker.update(s)
    return events


def steady(t0: float, n: int, every: float = 10.0, per_step: int = 1000, start: int = 0) -> List[Snapshot]:
    return [sample(t0 + k * every, {i: start + (k + 1) * per_step for i in range(4)}) for k in range(n)]


def test_a_healthy_job_is_followed_and_never_stalled_or_slow() -> None:
    tracker = Tracker(TrackOptions(stall=30, slow=0.5))
    events = run(tracker, steady(0, 30))
    assert [type(e) for e in events] == [JobFound]
    job = tracker.jobs[JOB]
    assert job.status == "progressing" and job.unit == "sockets"
    assert job.rate is not None and abs(job.rate - 4 * 200 * KB) < 1e-6  # 2 x 1000 kB per rank per 10 s, 4 ranks
    assert set(job.node_rates) == {"n1", "n2"}
    assert not tracker.all_ended()


def test_a_hang_is_declared_at_its_limit_and_the_next_sample_is_asked_for_then() -> None:
    tracker = Tracker(TrackOptions(stall=30, slow=0.5))
    run(tracker, steady(0, 5))  # last movement seen at t=40
    last = {i: 5000 for i in range(4)}
    assert tracker.next_deadline() == 40 + 30
    assert run(tracker, [sample(50, last), sample(60, last)]) == []
    assert tracker.jobs[JOB].status == "idle"
    events = run(tracker, [sample(70, last)])
    assert [type(e) for e in events] == [Stalled]
    stalled = events[0]
    assert stalled.seconds == 30 and stalled.since == 40 and not stalled.since_start
    assert "no progress for 30 s" in stalled.text()
    assert tracker.jobs[JOB].status == "stalled"
    assert run(tracker, [sample(80, last), sample(90, last)]) == [], "one capture per stall"


def test_a_job_never_seen_moving_gets_the_start_up_limit() -> None:
    """A job hung before the watch began (or still in its rendezvous) is captured after the start-up limit:
    4 x --stall, at least 300 s, unless --stall-start says otherwise."""
    still = {i: 77 for i in range(4)}
    tracker = Tracker(TrackOptions(stall=20))
    found = tracker.update(sample(0, still))
    assert "5 min until it is first seen progressing" in found[0].text()
    assert not run(tracker, [sample(t, still) for t in range(10, 300, 10)])
    stalls = [e for e in run(tracker, [sample(300, still)]) if isinstance(e, Stalled)]
    assert len(stalls) == 1 and stalls[0].since_start and "not seen moving since the watch began" in stalls[0].text()
    tracker = Tracker(TrackOptions(stall=20, stall_start=20))
    events = run(tracker, [sample(t, still) for t in (0, 10, 20)])
    assert len([e for e in events if isinstance(e, Stalled)]) == 1
    # a blip of bytes while the job sets itself up (gloo connecting its pairs) is not yet training
    tracker = Tracker(TrackOptions(stall=20))
    blip = [sample(0, still), sample(10, {i: 99 for i in range(4)})] + [sample(t, {i: 99 for i in range(4)})
                                                                       for t in range(20, 300, 10)]
    assert not [e for e in run(tracker, blip) if isinstance(e, Stalled)]
    assert not tracker.jobs[JOB].moved_once


def test_a_job_still_starting_up_is_not_stalled_until_it_goes_quiet() -> None:
    """Ranks importing torch use a CPU and move no bytes: the stall clock starts when they stop working."""
    tracker = Tracker(TrackOptions(stall=20, stall_start=20))

    def busy(at: float, cpu: float) -> Snapshot:
        snap = sample(at, {i: 0 for i in range(4)})
        return dataclasses.replace(snap, ranks=tuple(
            dataclasses.replace(r, counters=dataclasses.replace(r.counters, utime=cpu)) for r in snap.ranks))

    events = run(tracker, [busy(t, t * 0.9) for t in range(0, 60, 10)])  # 90 % of a core each
    assert not [e for e in events if isinstance(e, Stalled)] and tracker.jobs[JOB].status == "starting"
    events = run(tracker, [busy(t, 60 * 0.9) for t in range(60, 90, 10)])  # busy up to t=60, quiet after
    stalls = [e for e in events if isinstance(e, Stalled)]
    assert len(stalls) == 1 and stalls[0].at == 80 and stalls[0].since == 60


def test_a_job_that_resumes_is_said_to_have_resumed_with_how_long_it_stood_still() -> None:
    tracker = Tracker(TrackOptions(stall=30, slow=0))
    run(tracker, steady(0, 5))
    last = {i: 5000 for i in range(4)}
    run(tracker, [sample(t, last) for t in (50, 60, 70, 80)])
    events = run(tracker, [sample(90, {i: 6000 for i in range(4)})])
    assert [type(e) for e in events] == [Resumed]
    assert events[0].seconds == 50 and "resumed" in events[0].text() and "50 s without progress" in events[0].text()
    assert tracker.jobs[JOB].status == "progressing"


def test_a_short_pause_below_the_limit_says_nothing() -> None:
    tracker = Tracker(TrackOptions(stall=30, slow=0))
    run(tracker, steady(0, 5))
    events = run(tracker, [sample(50, {i: 5000 for i in range(4)}), sample(60, {i: 6000 for i in range(4)})])
    assert events == []


def test_a_slow_stretch_is_declared_once_and_its_recovery_said() -> None:
    tracker = Tracker(TrackOptions(stall=30, slow=0.5))
    samples = steady(0, 6)  # 1000 B per rank per 10 s
    sent = 6000
    for k in range(6, 12):  # 10 % of the rate
        sent += 100
        samples.append(sample(k * 10, {i: sent for i in range(4)}))
    events = run(tracker, samples)
    slow = [e for e in events if isinstance(e, SlowDetected)]
    assert len(slow) == 1 and not [e for e in events if isinstance(e, Stalled)]
    assert slow[0].since == 50 and slow[0].seconds >= 30 and "10% of its recent rate" in slow[0].text()
    assert tracker.jobs[JOB].status == "slow"
    assert tracker.jobs[JOB].slow_start is not None and tracker.jobs[JOB].slow_start.taken_at == 50
    events = run(tracker, [sample(120 + k * 10, {i: sent + (k + 1) * 1000 for i in range(4)}) for k in range(2)])
    assert [type(e) for e in events] == [Recovered]
    assert tracker.jobs[JOB].status == "progressing"


def test_a_job_that_slows_down_into_a_hang_is_a_stall_not_slow() -> None:
    tracker = Tracker(TrackOptions(stall=30, slow=0.5))
    samples = steady(0, 6) + [sample(60, {i: 6100 for i in range(4)})]  # one slow interval, then nothing
    samples += [sample(t, {i: 6100 for i in range(4)}) for t in range(70, 110, 10)]
    events = run(tracker, samples)
    assert [type(e) for e in events if isinstance(e, (Stalled, SlowDetected))] == [Stalled]


def test_slow_captures_can_be_turned_off() -> None:
    tracker = Tracker(TrackOptions(stall=30, slow=0))
    samples = steady(0, 6)
    samples += [sample(k * 10, {i: 6000 + (k - 5) * 10 for i in range(4)}) for k in range(6, 14)]
    assert not [e for e in run(tracker, samples) if isinstance(e, SlowDetected)]


def test_a_node_that_drops_is_said_and_does_not_make_the_job_slow_or_ended() -> None:
    tracker = Tracker(TrackOptions(stall=30, slow=0.5))
    events = run(tracker, steady(0, 6))
    for k in range(6, 12):  # n2 cannot be sampled: its ranks are missing, the job goes on on n1
        events += tracker.update(sample(k * 10, {i: (k + 1) * 1000 for i in range(4)}, failed=["n2"]))
    lost = [e for e in events if isinstance(e, NodeLost)]
    assert len(lost) == 1 and lost[0].node == "n2" and "reconnecting" in lost[0].text()
    assert not [e for e in events if isinstance(e, (SlowDetected, Stalled, Ended))]
    assert tracker.down == {"n2": 60}
    back = tracker.update(sample(120, {i: 13000 for i in range(4)}))
    assert [type(e) for e in back] == [NodeBack] and back[0].down == 60 and "reconnected after 1 min" in back[0].text()


def test_a_job_ends_when_none_of_its_ranks_is_found_twice_where_its_nodes_answered() -> None:
    tracker = Tracker(TrackOptions(stall=30))
    run(tracker, steady(0, 3))
    gone = Snapshot(taken_at=30, nodes=tuple(NodeStatus(n, state="done") for n in NODES))
    assert tracker.update(dataclasses.replace(gone, nodes=(NodeStatus("n1", state="done"),
                                                            NodeStatus("n2", state="failed")))) != []  # lost only
    assert not tracker.all_ended()
    assert tracker.update(dataclasses.replace(gone, taken_at=40)) == [NodeBack(40, "n2", 10)]
    assert tracker.next_deadline() == 45, "a job just gone missing is looked at again soon"
    events = tracker.update(dataclasses.replace(gone, taken_at=45))
    assert [type(e) for e in events] == [Ended] and "has ended" in events[0].text()
    assert tracker.all_ended()


def test_only_the_job_asked_for_is_followed() -> None:
    tracker = Tracker(TrackOptions(stall=30, job="29501"))
    other = sample(0, {0: 1, 1: 1}, job="10.0.0.1:29501")
    events = tracker.update(Snapshot(taken_at=0, nodes=other.nodes, ranks=sample(0, {2: 1, 3: 1}).ranks + other.ranks))
    assert [e.job for e in events if isinstance(e, JobFound)] == ["10.0.0.1:29501"]


def test_the_stall_limit_stays_well_below_the_jobs_own_watchdog() -> None:
    env = (("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "60"), ("NCCL_SOCKET_IFNAME", "eth0"))
    tracker = Tracker(TrackOptions(stall=120))
    found = [e for e in tracker.update(sample(0, {0: 1, 1: 1}, env=env)) if isinstance(e, JobFound)]
    assert found[0].limit == 15 and "lowered to 15 s" in found[0].text() and "HEARTBEAT" in found[0].text()
    dog = job_watchdog([rank("n1", 0, 0, 0)])
    assert dog.seconds == 1800 and "gloo" in dog.source and stall_limit(120, dog) == (120, "")
    nccl = job_watchdog([rank("n1", 0, 0, 0, env=(("NCCL_DEBUG", "INFO"),))])
    assert nccl.seconds == 480 and "heartbeat" in nccl.source
    off = job_watchdog([rank("n1", 0, 0, 0, env=(("NCCL_DEBUG", "INFO"), ("TORCH_NCCL_ENABLE_MONITORING", "0")))])
    assert off.seconds == 600


def test_the_timeout_a_script_sets_is_the_watchdog_and_an_unreadable_one_is_said() -> None:
    r = rank("n1", 0, 0, 0)
    key = (r.node, r.pid, r.start_time)
    dog = job_watchdog([r], {key: PgTimeout(300.0, "train.py:42", "timedelta(minutes=5)")})
    assert dog.seconds == 300 and "train.py:42" in dog.source
    assert stall_limit(120, dog)[0] == 75
    unread = job_watchdog([r], {key: PgTimeout(None, "train.py:42", "timedelta(hours=args.h)")})
    assert unread.seconds == 1800 and "cannot read" in unread.notes[0]
    for value in ("nan", "inf", "-5", "x"):
        weird = job_watchdog([rank("n1", 0, 0, 0, env=(("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", value),))])
        assert weird.seconds == 480, value  # an unreadable value is not a deadline: the default stands
    ib = job_watchdog([rank("n1", 0, 0, 0, env=(("NCCL_IB_TIMEOUT", "22"),))])
    assert ib.seconds == 480, "NCCL_IB_TIMEOUT is an exponent, not seconds"


def test_output_bytes_are_the_rate_where_no_socket_moves() -> None:
    tracker = Tracker(TrackOptions(stall=30))
    for k in range(4):
        ranks = tuple(dataclasses.replace(rank("n1", i, k * 10.0, 0), sockets=(),
                                          counters=ProgressCounters(at=k * 10.0, state="S", log_bytes=k * 500))
                      for i in range(2))
        tracker.update(Snapshot(taken_at=k * 10.0, nodes=(NodeStatus("n1", state="done"),), ranks=ranks))
    job = tracker.jobs[JOB]
    assert job.unit == "io" and job.status == "progressing" and abs((job.rate or 0) - 100) < 1e-6


def test_sparkline() -> None:
    assert sparkline([]) == ""
    assert sparkline([0, 0]) == "▁▁"
    assert sparkline([1, 2, 4, 8]) == "▂▃▅█"
    assert len(sparkline(list(range(100)), 10)) == 10


def test_memory_stays_bounded_over_days_of_samples_and_hundreds_of_jobs() -> None:
    """Left running for days: each job keeps at most POINTS rate points (per job and per node), and jobs that
    come and go are forgotten beyond MAX_JOBS, the ended ones first; the job still running is kept."""
    tracker = Tracker(TrackOptions(stall=30))
    run(tracker, steady(0, POINTS + 100))
    job = tracker.jobs[JOB]
    assert len(job.rates) == POINTS and all(len(v) == POINTS for v in job.node_rates.values())
    t = (POINTS + 100) * 10.0
    for k in range(MAX_JOBS + 50):  # short jobs one after another beside the long one
        other = sample(t, {0: 1, 1: 1}, job=f"10.0.0.1:{30000 + k}")
        long = sample(t, {2: int(t) * 100, 3: int(t) * 100})
        tracker.update(Snapshot(taken_at=t, nodes=long.nodes, ranks=long.ranks + other.ranks))
        t += 10.0
    assert len(tracker.jobs) <= MAX_JOBS
    assert JOB in tracker.jobs and tracker.jobs[JOB].status != "ended"
    assert "10.0.0.1:30000" not in tracker.jobs, "the oldest ended job is forgotten first"
    assert f"10.0.0.1:{30000 + MAX_JOBS + 49}" in tracker.jobs
