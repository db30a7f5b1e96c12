"""Network stalls from TCP sockets: the cut node, one bad link, silent peers, and address mapping."""

from __future__ import annotations

import dataclasses

from typing import Dict, Iterable, Optional

from analysis_snapshots import rank, snapshot, sock
from app.analysis import analyze
from app.analysis.prose import render
from app.analysis.network import address_map, host_of, network_findings
from app.model import NodeStatus

IPS = {"node01": "10.0.0.1", "node02": "10.0.0.2", "node03": "10.0.0.3"}


def mesh(stall: Dict[tuple, dict], ranks_per_node: int = 2, skip: Iterable[str] = ()) -> list:
    """Every rank with a gloo socket to every other node; `stall[(from, to)]` sets that socket's counters."""
    out = []
    for i in range(ranks_per_node * len(IPS)):
        node = f"node{i // ranks_per_node + 1:02d}"
        socks = tuple(sock(f"{IPS[node]}:{41000 + i}", f"{IPS[peer]}:{29500 + i % ranks_per_node}",
                           last_recv_ms=900, **stall.get((node, peer), {}))
                      for peer in IPS if peer != node)
        out.append(rank(i, node, world=ranks_per_node * len(IPS), master_addr="10.0.0.1", master_port=29500,
                        sockets=() if node in skip else socks))
    return out


def nodes(**states: str) -> list:
    return [NodeStatus(n, address=a, state=states.get(n, "done")) for n, a in IPS.items()]  # type: ignore[arg-type]


def stall_of(ranks: list, same_place: bool = True, node_list: Optional[list] = None):  # type: ignore[no-untyped-def]
    """The network fact as the text layer says it (a Finding), or None."""
    found = network_findings(snapshot(ranks, node_list or nodes()), same_place=same_place)
    return render(found[0]) if found else None


RETRANSMIT = dict(backoff=4, retransmits=1, send_q=4096, last_ack_ms=30000)
UNACKED = dict(send_q=2048, backoff=3, last_ack_ms=30000)


def test_a_node_cut_off_from_the_others_is_named_with_evidence() -> None:
    stalls = {("node03", "node01"): RETRANSMIT, ("node03", "node02"): RETRANSMIT,
              ("node01", "node03"): UNACKED, ("node02", "node03"): UNACKED}
    a = analyze(snapshot(mesh(stalls), nodes()))
    f = a.findings[0]
    assert f.kind == "network_stall" and f.confidence == "high" and f.nodes == "node03"
    assert f.title == "every stalled socket involves node03: node03 (or its link) is the problem"
    assert "node03 rank 4 10.0.0.3:41004 -> node01 (10.0.0.1:29500): RTO backoff 4, 1 retransmission in flight, " \
           "4,096 bytes unacknowledged for 30.0 s" in f.detail
    assert a.verdict.startswith("Every stalled socket involves node03")
    identical = next(x for x in a.findings if x.kind == "all_identical")
    assert "the network finding names the node" in identical.detail


def test_only_the_cut_node_reports() -> None:
    f = stall_of(mesh({("node03", "node01"): RETRANSMIT, ("node03", "node02"): RETRANSMIT}))
    assert f.title == "node03's sockets to node[01-02] stall: node03 (or its link) has lost the network"


def test_only_the_peers_report_when_the_node_itself_gave_nothing() -> None:
    ranks = [r for r in mesh({("node01", "node03"): UNACKED, ("node02", "node03"): UNACKED}) if r.node != "node03"]
    f = stall_of(ranks, node_list=nodes(node03="failed"))
    assert f.title == "sockets on node[01-02] towards node03 stall: node03 (or the path to it) does not answer"


def test_one_bad_link() -> None:
    f = stall_of(mesh({("node01", "node02"): RETRANSMIT, ("node02", "node01"): RETRANSMIT}))
    assert f.title == "the link between node01 and node02 stalls" and f.confidence == "high"
    assert f.nodes == "node[01-02]"


def test_confidence_drops_when_stacks_already_differ_or_evidence_is_thin() -> None:
    f = stall_of(mesh({("node03", "node01"): RETRANSMIT, ("node03", "node02"): RETRANSMIT}), same_place=False)
    assert f.confidence == "medium"
    f = stall_of(mesh({("node03", "node01"): dict(send_q=100, last_ack_ms=5000)}))
    assert f.confidence in ("low", "medium") and "unacknowledged bytes only" in f.reason


def test_a_silent_peer_without_retransmissions() -> None:
    ranks = mesh({})
    quiet = []
    for r in ranks:
        quiet.append(dataclasses.replace(r, **{"sockets": tuple(
            s if not s.peer.startswith("10.0.0.3") else dataclasses.replace(s, last_recv_ms=600_000)
            for s in r.sockets)}))
    # node04 is one more peer, so "far longer than the others" has a baseline of two
    extra = [rank(9, "node04", sockets=(sock("10.0.0.4:1", "10.0.0.1:29500", last_recv_ms=800),))]
    node_list = [NodeStatus(n, address=a, state="done") for n, a in dict(IPS, node04="10.0.0.4").items()]
    f = stall_of(quiet + extra, node_list=node_list)
    assert f is not None and f.confidence == "low" and "node03" in f.title
    assert "nothing received for 600 s" in f.detail


def test_healthy_sockets_give_no_finding() -> None:
    assert stall_of(mesh({})) is None
    assert network_findings(snapshot([rank(0, "n1")]), same_place=True) == []


def test_addresses_map_to_nodes() -> None:
    ranks = mesh({})
    ranks.append(rank(10, "node04", sockets=(sock("[::ffff:10.0.0.9]:5", "127.0.0.1:29500"),)))
    ranks.append(rank(11, "node05", sockets=(sock("172.17.0.1:5", "10.0.0.1:1"),)))
    ranks.append(rank(12, "node06", sockets=(sock("172.17.0.1:6", "10.0.0.1:1"),)))  # docker bridge twice
    m = address_map(snapshot(ranks, nodes()))
    assert m["10.0.0.1"] == "node01" and m["10.0.0.3"] == "node03" and m["10.0.0.9"] == "node04"
    assert "172.17.0.1" not in m and "127.0.0.1" not in m
    assert host_of("[fe80::1]:22") == "fe80::1" and host_of("::ffff:10.0.0.3:80") == "10.0.0.3"


def test_a_stall_on_sockets_that_moved_bytes_between_samples_is_not_high() -> None:
    """The sockets look stalled in the snapshot, but they carried bytes since the previous sample: the
    stall is contradicted, so it is not [high]."""
    from dataclasses import replace

    from app.model import ProgressCounters

    stalls = {("node03", "node01"): RETRANSMIT, ("node03", "node02"): RETRANSMIT,
              ("node01", "node03"): UNACKED, ("node02", "node03"): UNACKED}

    def sample(at: float, sent: int) -> list:  # `sent`: bytes so far on node03's sockets, the named node
        return [replace(r, master_port=1, counters=ProgressCounters(at=at, utime=1.0, stime=0.0),
                        sockets=tuple(replace(s, bytes_acked=sent if r.node == "node03" else 100,
                                              bytes_received=sent if r.node == "node03" else 100)
                                      for s in r.sockets))
                for r in mesh(stalls)]

    still = analyze(snapshot(sample(11.0, 100), nodes(), taken_at=11.0),
                    history=[snapshot(sample(10.0, 100), nodes(), taken_at=10.0)])
    assert still.findings[0].kind == "network_stall" and still.findings[0].confidence == "high"
    moved = analyze(snapshot(sample(11.0, 900), nodes(), taken_at=11.0),
                    history=[snapshot(sample(10.0, 100), nodes(), taken_at=10.0)])
    assert not any(f.kind == "progressing" for f in moved.findings), "only node03's ranks moved"
    f = next(f for f in moved.findings if f.kind == "network_stall")
    assert f.confidence == "medium" and "sockets of ranks on node03 moved bytes" in f.reason
