"""The launchers of a job (torchrun's elastic agents, a static launcher) as the cause of a hang: one that cannot run
while the others wait in their rendezvous for it; one started with other rendezvous flags, which meets no one; a
node whose launcher has exited with its ranks; launchers waiting in the exit barrier, whose ranks have finished
while others have not; a rank whose group creation waits on a socket whose other end is stopped. Built in code:
other names, nodes, ports and pids than any recorded job."""

from __future__ import annotations

from dataclasses import replace
from typing import Tuple

from app.analysis import analyze
from app.model import Frame, JobProcess, NodeStatus, RankSnapshot, Snapshot, TcpSocket, ThreadStack
from app.model.kwait import KernelWait, OtherEnd, WaitFd

ELASTIC = "/opt/py/lib/python3.12/site-packages/torch/distributed/elastic/"
C10D = "/opt/py/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"


def agent(node: str, pid: int, *flags: str, state: str = "S", of: Tuple[int, ...] = (), where: str = "rendezvous",
          job: str = "gpu-a07:41000") -> JobProcess:
    frames = {"rendezvous": (Frame("_delay", ELASTIC + "rendezvous/utils.py", 181),
                             Frame("SimpleElasticAgent._rendezvous", ELASTIC + "agent/server/api.py", 540)),
              "barrier": (Frame("barrier", ELASTIC + "utils/store.py", 191),
                          Frame("SimpleElasticAgent._exit_barrier", ELASTIC + "agent/server/api.py", 1102))}[where]
    argv = ("/opt/py/bin/python3", "/opt/py/bin/torchrun", "--nnodes=3", "--nproc-per-node=4", "--rdzv-backend=c10d",
            "--rdzv-endpoint=gpu-a07:41000", "--rdzv-id=pretrain-12", *flags, "pretrain.py", "--lr", "3e-4")
    return JobProcess(node=node, pid=pid, start_time=5, role="launcher", kind="torchrun", ppid=1, of=of, job=job,
                      cmdline=argv, state=state,
                      threads=() if of else (ThreadStack(pid, "MainThread", frames=frames, state="S", is_main=True),))


def worker(node: str, pid: int, number: int, frames: Tuple[Frame, ...], waits: KernelWait | None = None
           ) -> RankSnapshot:
    return RankSnapshot(node=node, pid=pid, start_time=9, rank=number, world_size=12, local_world_size=4, ppid=3,
                        job="gpu-a07:41000", state="S",
                        threads=(ThreadStack(pid, "MainThread", frames=frames, state="S", is_main=True,
                                             syscall="poll", wchan="do_sys_poll", waits=waits),))


def test_a_stopped_launcher_holds_the_rendezvous_the_others_wait_in() -> None:
    snap = Snapshot(taken_at=1.0, processes=(agent("gpu-a07", 310), agent("gpu-b02", 411, state="T"),
                                             agent("gpu-c11", 512)))
    a = analyze(snap, history=[snap])
    assert a.findings[0].kind == "launcher_held" and a.findings[0].confidence == "high"
    assert a.verdict.startswith("The launcher on gpu-b02 (torchrun pid 411) is stopped (SIGSTOP or job control)")
    assert "2 launchers on gpu-a07,gpu-c11 wait in the rendezvous at gpu-a07:41000 for it" in a.verdict
    assert "`kill -CONT 411` on gpu-b02" in a.verdict
    # none stopped: no such finding, and the launchers' rendezvous stays the lead it was
    calm = Snapshot(taken_at=1.0, processes=(agent("gpu-a07", 310), agent("gpu-b02", 411), agent("gpu-c11", 512)))
    assert all(f.kind != "launcher_held" for f in analyze(calm, history=[calm]).findings)


def test_a_launcher_with_another_rendezvous_id_or_endpoint_is_named_with_the_flag() -> None:
    odd = agent("gpu-c11", 512, "--rdzv-id=pretrain-13")
    snap = Snapshot(taken_at=1.0, processes=(agent("gpu-a07", 310), agent("gpu-b02", 411), odd))
    a = analyze(snap, history=[snap])
    assert a.findings[0].kind == "rendezvous_differs"
    assert "gpu-c11 (torchrun pid 512) was started with --rdzv-id pretrain-13 where the others have pretrain-12" \
        in a.verdict
    assert "restart the launcher on gpu-c11 with the job's rendezvous flags" in a.verdict
    # another endpoint makes a job of its own by its key: it is still the one odd launcher of this job
    elsewhere = agent("gpu-c11", 512, "--rdzv-endpoint=gpu-c11:41000", job="gpu-c11:41000")
    snap = Snapshot(taken_at=1.0, processes=(agent("gpu-a07", 310), agent("gpu-b02", 411), elsewhere))
    a = analyze(snap, history=[snap])
    assert a.verdict.startswith("The launcher on gpu-c11 (torchrun pid 512) was started with --rdzv-endpoint "
                                "gpu-c11:41000 where the others have gpu-a07:41000"), a.verdict
    # two of three differing is no minority: no launcher is singled out
    split = Snapshot(taken_at=1.0, processes=(agent("gpu-a07", 310), agent("gpu-b02", 411, "--rdzv-id=x"),
                                              agent("gpu-c11", 512, "--rdzv-id=y")))
    assert all(f.kind != "rendezvous_differs" for f in analyze(split, history=[split]).findings)


def test_launchers_in_the_exit_barrier_make_the_rank_still_running_the_lead_not_the_finished_ones() -> None:
    spin = (Frame("Thread.join", "/opt/py/lib/python3.12/threading.py", 1147),
            Frame("_shutdown", "/opt/py/lib/python3.12/threading.py", 1590))
    left = worker("gpu-b02", 420, 5, spin)
    snap = Snapshot(taken_at=1.0, ranks=(left,),
                    processes=(agent("gpu-a07", 310, where="barrier"), agent("gpu-b02", 411, of=(420,)),
                               agent("gpu-c11", 512, where="barrier")))
    a = analyze(snap, history=[snap])
    assert a.verdict.startswith("Rank 5 has not finished while ranks 0-4,6-11 of 12 have (their launchers on "
                                "gpu-a07,gpu-c11 wait for it in torchrun's exit barrier); its main thread is blocked "
                                "in `interpreter shutdown`"), a.verdict
    assert "find why" not in a.verdict  # the finished ranks are not blamed for having exited
    missing = next(f for f in a.findings if f.kind == "missing_ranks")
    assert not missing.culprit and "have finished" in missing.title


def test_a_node_without_its_launcher_or_its_ranks_is_named_as_the_launcher_that_exited() -> None:
    wait = (Frame("_store_based_barrier", C10D, 4800), Frame("init_process_group", C10D, 1710),
            Frame("main", "/home/u/pretrain.py", 40))
    ranks = tuple(worker(n, 100 + i, i, wait) for i, n in enumerate(["gpu-a07"] * 4 + ["gpu-b02"] * 4))
    snap = Snapshot(taken_at=1.0, ranks=ranks,
                    processes=(agent("gpu-a07", 310, of=(100, 101, 102, 103)),
                               agent("gpu-b02", 411, of=(104, 105, 106, 107))),
                    nodes=tuple(NodeStatus(n, state="done") for n in ("gpu-a07", "gpu-b02", "gpu-c11")))
    a = analyze(snap, history=[snap])
    assert a.verdict.startswith("Ranks 8-11 not found (WORLD_SIZE=12): gpu-c11 runs neither them nor a launcher of "
                                "the job, while the other nodes' launchers run"), a.verdict
    assert "find why the launcher on gpu-c11 exited" in a.verdict


def test_a_group_creation_waiting_on_a_stopped_store_host_names_that_process() -> None:
    stopped = OtherEnd(role="peer", pid=310, comm="pt_elastic", state="T", wchan="do_signal_stop",
                       cmdline=("/opt/py/bin/python3", "/opt/py/bin/torchrun", "--nnodes=3"))
    store = WaitFd(fd=7, target="socket:[99]", kind="socket", access="read", proto="tcp", local="10.1.0.7:51000",
                   peer="10.1.0.7:41000", state="ESTABLISHED", others=(stopped,), complete=True)
    waits = KernelWait(syscall="poll", family="poll", fds=(store,), fds_total=1)
    making = (Frame("_new_process_group_helper", C10D, 2169), Frame("new_group", C10D, 5200),
              Frame("build_groups", "/home/u/pretrain.py", 88))
    trains = (Frame("all_reduce", C10D, 2900), Frame("train_step", "/home/u/pretrain.py", 120))
    ranks = tuple(worker("gpu-a07" if i < 4 else "gpu-b02", 100 + i, i,
                         making if i < 2 else trains, waits if i < 2 else None) for i in range(8))
    ranks = tuple(replace(r, world_size=8) for r in ranks)
    a = analyze(Snapshot(taken_at=1.0, ranks=ranks), history=[Snapshot(taken_at=0.0, ranks=ranks)])
    # ranks 0-1 wait the same way on the same stopped process: one sentence for both, the others wait for them
    assert a.verdict.startswith("Ranks 0-1 (pids 100, 101 on gpu-a07) are each blocked in `new_group` at "
                                "`build_groups` (pretrain.py:88)"), a.verdict
    assert "its peer is pid 310" in a.verdict and "stopped" in a.verdict, a.verdict
    assert "the other 6 ranks wait for them in `all_reduce`" in a.verdict, a.verdict
    assert "`kill -CONT 310` on gpu-a07" in a.verdict
    # the same call whose socket's other end runs: a collective of the group, as before
    running = replace(store, others=(replace(stopped, state="S"),))
    ranks2 = tuple(replace(r, threads=(replace(r.threads[0], waits=replace(waits, fds=(running,))),))
                   if r.rank is not None and r.rank < 2 else r for r in ranks)
    assert "kill -CONT" not in analyze(Snapshot(taken_at=1.0, ranks=ranks2),
                                       history=[Snapshot(taken_at=0.0, ranks=ranks2)]).verdict


def _connecting(port: str, given: int, sleeping: bool = True) -> Tuple[RankSnapshot, ...]:
    from app.model import Local

    rdzv = "/opt/py/lib/python3.12/site-packages/torch/distributed/rendezvous.py"
    frames = (Frame("_create_c10d_store", rdzv, 190, locals=(Local("hostname", '"gpu-a07"', True),
                                                               Local("port", port, True))),
              Frame("_env_rendezvous_handler", rdzv, 280), Frame("init_process_group", C10D, 1892),
              Frame("setup", "/home/u/pretrain.py", 30))
    sleep = KernelWait(syscall="clock_nanosleep", family="sleep", timeout=4.0)
    return tuple(replace(worker("gpu-a07" if i < 4 else "gpu-b02", 100 + i, i, frames,
                                sleep if sleeping and i % 2 == 0 else None),
                         world_size=8, master_addr="gpu-a07", master_port=given) for i in range(8))


def test_ranks_retrying_a_store_at_another_port_than_their_launchers_name_both_addresses() -> None:
    ranks = _connecting("6000", 41000)
    a = analyze(Snapshot(taken_at=1.0, ranks=ranks), history=[Snapshot(taken_at=0.0, ranks=ranks)])
    assert a.verdict.startswith("All 8 ranks retry connecting to the job's store at gpu-a07:6000 in "
                                "`init_process_group`, where nothing accepts: their launcher's store is at "
                                "gpu-a07:41000"), a.verdict
    assert "do not set MASTER_PORT or MASTER_ADDR in the script" in a.verdict
    assert a.findings[0].confidence == "high"
    # no rank seen asleep between two attempts (a sample that caught them restarting the sleep): said, less sure
    unsure = _connecting("6000", 41000, sleeping=False)
    found = analyze(Snapshot(taken_at=1.0, ranks=unsure), history=[Snapshot(taken_at=0.0, ranks=unsure)]).findings
    assert found[0].kind == "store_differs" and found[0].confidence == "medium"
    # the launcher's own port, or a rank connected to the other address (something listens there): not this class
    connected = tuple(replace(r, sockets=(TcpSocket("10.1.0.7:51000", "10.1.0.9:6000", "ESTABLISHED"),))
                      if r.rank == 3 else r for r in _connecting("6000", 41000))
    for same in (_connecting("41000", 41000), connected):
        found = analyze(Snapshot(taken_at=1.0, ranks=same), history=[Snapshot(taken_at=0.0, ranks=same)]).findings
        assert all(f.kind != "store_differs" for f in found)


def test_ranks_missing_from_a_node_whose_launcher_is_gone_are_not_read_as_finished() -> None:
    """Agents in the exit barrier explain the ranks of their own nodes only: a node short of ranks whose launcher
    is neither in the barrier nor still running ranks lost them otherwise, and that stays the lead."""
    spin = (Frame("Thread.join", "/opt/py/lib/python3.12/threading.py", 1147),
            Frame("_shutdown", "/opt/py/lib/python3.12/threading.py", 1590))
    left = worker("gpu-b02", 420, 5, spin)
    nodes = tuple(NodeStatus(n, state="done") for n in ("gpu-a07", "gpu-b02", "gpu-c11"))
    snap = Snapshot(taken_at=1.0, ranks=(left,), nodes=nodes,
                    processes=(agent("gpu-a07", 310, where="barrier"), agent("gpu-b02", 411, of=(420,))))
    a = analyze(snap, history=[snap])
    missing = next(f for f in a.findings if f.kind == "missing_ranks")
    assert missing.culprit and "have finished" not in missing.title, missing.title
    assert not [f for f in a.findings if f.kind == "unfinished"]
