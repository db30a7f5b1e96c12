"""Peers outside the snapshot: a hosts list that leaves out a node of the job names that node, from the sockets
the inspected ranks hold to it; names come from the ssh config, the SLURM node list or reverse DNS, in time."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from analysis_snapshots import rank, snapshot, sock
from app.session import peer_names
from app.analysis import analyze
from app.analysis.peers import outside_peers
from app.model import NodeStatus

IPS = {"node01": "10.0.0.1", "node02": "10.0.0.2", "node03": "10.0.0.3"}  # node03 is not in the hosts list


def job_without_node03(extra_socks: int = 0):  # type: ignore[no-untyped-def]
    """6 ranks, 2 per node; the snapshot holds node01 and node02: every inspected rank talks to all others."""
    ranks = []
    for i in range(4):
        node = f"node{i // 2 + 1:02d}"
        socks = tuple(sock(f"{IPS[node]}:{41000 + i}", f"{IPS[peer]}:{29600 + j}")
                      for peer in IPS if peer != node for j in range(2))
        socks += tuple(sock(f"{IPS[node]}:{45000 + k}", f"10.9.9.9:{8000 + k}") for k in range(extra_socks))
        ranks.append(rank(i, node, world=6, local_world_size=2, master_addr="10.0.0.1", master_port=29500,
                          sockets=socks))
    nodes = [NodeStatus(n, address=IPS[n], state="done") for n in ("node01", "node02")]
    return snapshot(ranks, nodes)


def test_missing_ranks_on_a_node_left_out_of_the_hosts_list_are_named_by_its_address() -> None:
    snap = dataclasses.replace(job_without_node03(), peer_names=(("10.0.0.3", "node03", "ssh config"),))
    a = analyze(snap)
    top = a.findings[0]
    assert top.kind == "outside_peer" and top.confidence == "medium" and top.culprit
    assert top.title == ("ranks 4-5 are not in the snapshot: the job runs on node03 (10.0.0.3) too, which the hosts "
                         "list leaves out")
    assert "ranks 0-3 on node[01-02] hold 8 connections to node03 (10.0.0.3)" in top.detail
    assert "Add node03 to the hosts list" in top.detail and "10.0.0.3 is node03 by the ssh config" in top.detail
    assert top.ranks == (), "the ranks holding the connections are not the culprit"
    # the ranks here wait for the missing ones: not the "stacks cannot tell, check the links" puzzle
    assert not [f for f in a.findings if f.kind == "all_identical"]
    assert a.verdict.startswith("Likely lead: ranks 4-5 are not in the snapshot")


def test_unnamed_addresses_say_how_to_name_them() -> None:
    top = analyze(job_without_node03()).findings[0]
    assert top.kind == "outside_peer" and "the job runs on 10.0.0.3 too" in top.title
    assert "`getent hosts ADDRESS`" in top.detail


def test_a_service_one_rank_talks_to_once_is_not_a_peer_of_the_job() -> None:
    ranks = [rank(i, "node01", world=2, sockets=(sock(f"10.0.0.1:{41000 + i}", "10.0.0.1:29500"),)) for i in range(2)]
    ranks[0] = dataclasses.replace(ranks[0], sockets=ranks[0].sockets + (sock("10.0.0.1:50000", "172.20.0.5:443"),))
    snap = snapshot(ranks, [NodeStatus("node01", address="10.0.0.1", state="done")])
    assert outside_peers(snap) == []
    assert not [f for f in analyze(snap).findings if f.kind == "outside_peer"]


def test_with_every_rank_found_an_outside_address_is_a_low_note_not_a_culprit() -> None:
    ranks = [rank(i, "node01", world=2, sockets=tuple(sock(f"10.0.0.1:{41000 + i * 10 + k}", f"10.7.7.7:{9000 + k}")
                                                     for k in range(2))) for i in range(2)]
    snap = snapshot(ranks, [NodeStatus("node01", address="10.0.0.1", state="done")])
    f = next(f for f in analyze(snap).findings if f.kind == "outside_peer")
    assert f.confidence == "low" and not f.culprit
    assert f.title == "the job's ranks talk to 10.7.7.7, which the hosts list leaves out"


def test_ssh_config_aliases_name_addresses(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host *\n  User x\nHost gpu7 gpu7.example\n  HostName 10.0.0.7\n"
                      "Match host foo\n  HostName 10.0.0.8\nHost=gpu9\n  HostName=10.0.0.9\n")
    assert peer_names.ssh_config_hosts([str(config)]) == {"10.0.0.7": "gpu7", "10.0.0.9": "gpu9"}


async def test_names_come_from_the_ranks_slurm_node_list(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = job_without_node03()
    snap = dataclasses.replace(snap, ranks=tuple(dataclasses.replace(r, env=(("SLURM_JOB_NODELIST", "node[01-03]"),))
                                                 for r in snap.ranks))
    # the one stand-in here: this machine's resolver does not know the fake nodes' names
    monkeypatch.setattr(peer_names, "_forward", lambda name: [IPS[name]] if name in IPS else [])
    monkeypatch.setattr(peer_names, "_reverse", lambda address: "")
    named = await peer_names.PeerNamer(ssh_config=[]).name(snap)
    assert named.peer_names == (("10.0.0.3", "node03", "SLURM job's node list"),)


async def test_a_resolver_that_does_not_answer_costs_the_deadline_not_more(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()  # set at the end, so the resolver's thread ends with the test
    monkeypatch.setattr(peer_names, "_reverse", lambda address: (release.wait(30), "late")[1])
    namer = peer_names.PeerNamer(ssh_config=[])
    started = time.monotonic()
    try:
        named = await namer.name(job_without_node03(), deadline=0.5)
    finally:
        release.set()
    assert time.monotonic() - started < 0.5 + 10  # the deadline the caller set, with room for a loaded machine
    assert named.peer_names == ()  # unnamed, not wrong
    assert "the job runs on 10.0.0.3 too" in analyze(named).findings[0].title
