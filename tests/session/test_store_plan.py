"""Which store to ask for which ranks' numbers, and what its answer makes of them (app/session/store.py), on the
connections real gloo jobs hold (the shapes tests/workers/test_worker_pgstore.py and the live store test read
from /proc): the store is the endpoint every rank of a job holds and no gloo listener is; a rank with a number
from its environment or command line is never asked for; an answer that names one number twice, or one rank
under two numbers, gives no number; a loopback store is one per node."""

from __future__ import annotations

from app.model import RankSnapshot, TcpSocket
from app.session import store


def _rank(node: str, pid: int, listen: str, peers: list[str], *, evidence: str = "", rank: int | None = None,
          serves: str = "") -> RankSnapshot:
    socks = [TcpSocket(local=listen, peer="0.0.0.0:0", state="LISTEN")]
    socks += [TcpSocket(local=f"{listen.rpartition(':')[0]}:{40000 + i}", peer=p, state="ESTABLISHED")
              for i, p in enumerate(peers)]
    if serves:
        socks.append(TcpSocket(local=serves, peer="[::]:0", state="LISTEN"))
    return RankSnapshot(node=node, pid=pid, start_time=pid * 10, rank=rank, rank_evidence=evidence, sockets=tuple(socks))


# A 4-rank gloo job on two nodes, its store served by rank 0 on n1 (10.0.0.1:29500, bound to every address).
# Each pair connects once, from one side to the other's listener (the side gloo picks by address).
STORE = "10.0.0.1:29500"
L = {0: "10.0.0.1:41000", 1: "10.0.0.1:41001", 2: "10.0.0.2:42000", 3: "10.0.0.2:42001"}


def _job(evidence: str = "") -> list[RankSnapshot]:
    return [
        _rank("n1", 100, L[0], [STORE, L[1], L[2], L[3]], evidence=evidence, serves="[::]:29500"),
        _rank("n1", 101, L[1], [STORE, L[2], L[3]], evidence=evidence),
        _rank("n2", 200, L[2], [STORE, L[3]], evidence=evidence),
        _rank("n2", 201, L[3], [STORE], evidence=evidence),
    ]


def test_the_store_is_the_endpoint_every_rank_holds_and_its_host_asks() -> None:
    (ask,) = store.plan(_job())
    assert ask.store == STORE
    assert (ask.node, ask.pid) == ("n1", 100) and ask.host is not None and ask.host.pid == 100
    assert sorted(r.pid for r in ask.ranks) == [100, 101, 200, 201]
    assert set(ask.listeners) == set(L.values())  # L[3] is held by 3 ranks, the store by all 4


def test_the_answer_numbers_each_rank_once_and_names_the_evidence() -> None:
    (ask,) = store.plan(_job())
    got = store.numbers(ask, {L[0]: 0, L[1]: 1, L[2]: 2, L[3]: 3}, "LIST_KEYS")
    ranks = store.apply(_job(), got)
    assert [(r.pid, r.rank) for r in ranks] == [(100, 0), (101, 1), (200, 2), (201, 3)]
    assert ranks[2].rank_evidence == (f"the process group's store ({STORE}, LIST_KEYS): the default group's key "
                                      f"for rank 2 holds this process's gloo address {L[2]}")
    # one job, whichever launcher on whichever node started its ranks
    assert {(r.job, r.job_evidence) for r in ranks} == {(STORE, "the store its ranks connect to")}


def test_a_number_given_twice_or_a_rank_named_twice_gives_no_number() -> None:
    (ask,) = store.plan(_job())
    got = store.numbers(ask, {L[0]: 0, L[1]: 1, L[2]: 1, L[3]: 3}, "CHECK")  # 1 twice: neither is taken
    assert sorted(v[0] for v in got.values()) == [0, 3]
    ranks = _job()
    two = ranks[3].sockets + (TcpSocket(local="10.0.0.2:42009", peer="0.0.0.0:0", state="LISTEN"),)
    ranks[3] = RankSnapshot(node="n2", pid=201, start_time=2010, sockets=two)
    (ask,) = store.plan(ranks)
    got = store.numbers(ask, {L[0]: 0, L[1]: 1, L[2]: 2, L[3]: 3, "10.0.0.2:42009": 0}, "LIST_KEYS")
    assert ("n2", 201, 2010) not in got  # its two listeners name two ranks: it keeps what it had


def test_ranks_with_a_strong_number_are_not_asked_for_and_not_changed() -> None:
    assert store.plan(_job(evidence="environment (RANK)")) == []
    assert store.plan(_job(evidence="command line (--rank)")) == []
    env = _job(evidence="environment (RANK)")
    assert store.apply(env, {("n1", 100, 1000): (3, "x", "job")}) == env


def test_the_store_replaces_the_spawn_arguments_number_and_says_what_that_said() -> None:
    ranks = [RankSnapshot(node=r.node, pid=r.pid, start_time=r.start_time, rank=r.pid % 100, sockets=r.sockets,
                          rank_evidence="the spawn target's `rank` argument (main, py-spy --locals)") for r in _job()]
    (ask,) = store.plan(ranks)
    got = store.numbers(ask, {L[0]: 0, L[1]: 1, L[2]: 2, L[3]: 3}, "LIST_KEYS")
    out = store.apply(ranks, got)
    assert [r.rank for r in out] == [0, 1, 2, 3]
    assert out[2].rank_evidence.endswith("; the spawn target's `rank` argument said 0")
    assert out[0].rank_evidence.startswith("the process group's store") and "said" not in out[0].rank_evidence


def test_without_a_shared_endpoint_or_with_two_equally_shared_nothing_is_asked() -> None:
    lone = [_rank("n1", 1, "10.0.0.1:41000", ["10.0.0.9:29500"])]  # one rank: nothing shows which peer is the store
    assert store.plan(lone) == []
    two = [_rank("n1", 1, L[0], [STORE, "10.0.0.9:80"]), _rank("n1", 2, L[1], [STORE, "10.0.0.9:80"])]
    assert store.plan(two) == []  # a metrics server both talk to is as shared as the store: not told apart
    assert [a.store for a in store.plan(_job(), skip=[("", STORE)])] == []  # a store that failed is not asked again


def test_a_loopback_store_is_one_per_node() -> None:
    local = "127.0.0.1:29500"
    ranks = [_rank("n1", 1, "127.0.0.1:41000", [local]), _rank("n1", 2, "127.0.0.1:41001", [local, "127.0.0.1:41000"]),
             _rank("n2", 3, "127.0.0.1:41000", [local]), _rank("n2", 4, "127.0.0.1:41001", [local, "127.0.0.1:41000"])]
    asks = store.plan(ranks)
    assert sorted((a.node, a.store, tuple(sorted(r.pid for r in a.ranks))) for a in asks) == [
        ("n1", local, (1, 2)), ("n2", local, (3, 4))]
    assert sorted(store.job_name(a) for a in asks) == [f"{local} on n1", f"{local} on n2"]
