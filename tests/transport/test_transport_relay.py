"""Relays on the real test cluster: 6 nodes in 2 groups of 3, each node with a stand-in rank
(bench/stand_in_rank.py), the relays' children reached with the nodes' own OpenSSH (Cluster.allow_node_ssh:
shared home keys and known hosts). Through the relays a Session and `hangscope --print` see every rank; a
child whose sshd is stopped is reported as its direct connection would be (refused), named via its relay,
while the others are read; and after the session nothing of ours is left on any node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from app.hosts import HostSpec
from app.model import CollectOptions
from app.session import Session, SessionOptions
from app.transport.relay import RelayOptions

import cluster as cluster_mod
from waiting import wait_until, wait_until_async

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
RANK_SCRIPT = ROOT / "bench" / "stand_in_rank.py"
STAGE_MARK = b"zlib;exec("  # how the worker's and the relay's `python3 -c` arguments begin (bootstrap, framing)


@pytest.fixture(scope="module")
def relay_cluster(cluster_factory) -> Iterator[cluster_mod.Cluster]:
    c = cluster_factory(6)
    c.allow_node_ssh()
    ready = []
    for i, node in enumerate(c.nodes):
        ready.append(c.workdir / f"ready-{node.name}")
        node.spawn(["/usr/bin/python3", str(RANK_SCRIPT), str(ready[-1])],
                   env={"RANK": str(i), "LOCAL_RANK": "0", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "1",
                        "GROUP_RANK": str(i), "MASTER_ADDR": c.names[0], "MASTER_PORT": "29500"})
    wait_until(lambda: all(p.exists() and p.read_text().endswith("\n") for p in ready), 120,
               "stand-in ranks to block")
    try:
        yield c
    finally:
        c.close()


def _ours(node: cluster_mod.Node) -> list[str]:
    """hangscope's processes on the node: workers, relays, and the relays' ssh clients."""
    found = []
    for proc in node.procs():
        try:
            cmd = Path(f"/proc/{proc.host_pid}/cmdline").read_bytes()
        except OSError:
            continue
        if STAGE_MARK in cmd or proc.comm == "ssh":
            found.append(f"{node.name}: {proc.pid} {proc.comm} {cmd[:80]!r}")
    return found


def _nothing_left(c: cluster_mod.Cluster) -> None:
    left: list[str] = []

    def clean() -> bool:
        left[:] = [p for n in c.nodes for p in _ours(n)]
        return not left

    wait_until(clean, 20, "every worker, relay and relay ssh client to end")


def _options(c: cluster_mod.Cluster) -> SessionOptions:
    return SessionOptions(collect=CollectOptions(locals=False), ssh_config=(str(c.ssh_config),),
                          connect_timeout=30.0, relay=RelayOptions(width=3, threshold=2))


async def test_every_rank_on_every_node_through_two_relays_and_nothing_left(relay_cluster) -> None:
    c = relay_cluster
    session = Session([HostSpec(name=n, host=n, slots=1) for n in c.names], _options(c))
    try:
        snap = await session.snapshot()
        relays = session._connector._relay.relays  # type: ignore[union-attr]
        assert [r.name for r in relays] == ["node01", "node04"]
        assert [[ch.spec.name for ch in r.channels] for r in relays] == [c.names[:3], c.names[3:]]
        assert {n.name: n.state for n in snap.nodes} == {n: "done" for n in c.names}
        assert sorted((r.node, r.rank) for r in snap.ranks if r.threads) == [(n, i) for i, n in enumerate(c.names)]
        assert all(r.bytes_up > 0 and r.bytes_down > 0 for r in relays)
        # the relays run where they should, and only there
        relay_procs = {n.name for n in c.nodes for p in _ours(n) if "base64,zlib" in p}
        assert relay_procs == {"node01", "node04"}
        await session.refresh()  # a second pass over the same relayed connections
    finally:
        await session.close()
    _nothing_left(c)


async def test_a_child_without_sshd_is_refused_via_its_relay_and_the_others_are_read(relay_cluster) -> None:
    c = relay_cluster
    c["node05"].kill_sshd()
    try:
        session = Session([HostSpec(name=n, host=n, slots=1) for n in c.names], _options(c))
        try:
            snap = await session.snapshot()
        finally:
            await session.close()
    finally:
        c["node05"].start_sshd()
    states = {n.name: n for n in snap.nodes}
    err = states["node05"].error
    assert err is not None and err.code == "refused", err
    assert "via relay node04" in err.message and "Connection refused" in err.message
    assert {n for n, s in states.items() if s.state == "done"} == set(c.names) - {"node05"}
    assert sorted(r.node for r in snap.ranks if r.threads) == sorted(set(c.names) - {"node05"})
    _nothing_left(c)


def test_hangscope_print_through_relays_sees_every_rank(relay_cluster, tmp_path) -> None:
    c = relay_cluster
    hosts = c.hosts_file(tmp_path)
    snap_file = tmp_path / "snap.json"
    done = subprocess.run([sys.executable, "-m", "app", str(hosts), "--print", "--samples", "1", "--relay", "3",
                           "--snapshot", str(snap_file),
                           "--no-locals", "-F", str(c.ssh_config), *cluster_mod.UNHURRIED_LOGIN],
                          env=c.env(), cwd=ROOT, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "6 of 6 ranks" in done.stdout and "ranks 0-5 on node[01-06]" in done.stdout, done.stdout[:3000]
    nodes = json.loads(snap_file.read_text())["snapshot"]["nodes"]
    # every node came through a relay: its timings say how long its relay took to connect
    assert sorted(n["name"] for n in nodes if "relay" in dict(n["timings"])) == c.names, nodes
    _nothing_left(c)


async def test_the_children_of_an_unreachable_relay_are_reached_direct(relay_cluster) -> None:
    c = relay_cluster
    c["node04"].kill_sshd()
    try:
        session = Session([HostSpec(name=n, host=n, slots=1) for n in c.names], _options(c))
        try:
            snap = await session.snapshot()
        finally:
            await session.close()
    finally:
        c["node04"].start_sshd()
    states = {n.name: n for n in snap.nodes}
    err = states["node04"].error
    assert err is not None and err.code == "refused" and "via relay" not in err.message, err  # its own error
    for name in ("node05", "node06"):
        assert states[name].state == "done"
        assert any("reached directly: relay node04 could not be reached" in w for w in states[name].warnings)
        assert "relay" not in dict(states[name].timings)
    assert sorted(r.node for r in snap.ranks if r.threads) == sorted(set(c.names) - {"node04"})
    _nothing_left(c)


async def test_a_relay_that_dies_fails_its_children_by_name_and_the_next_pass_reaches_them_again(relay_cluster) -> None:
    c = relay_cluster
    session = Session([HostSpec(name=n, host=n, slots=1) for n in c.names], _options(c))
    try:
        await session.snapshot()
        conns = {n.spec.name: n.conn for n in session._nodes}
        relay = [p for p in c["node04"].procs() if b"base64,zlib" in Path(f"/proc/{p.host_pid}/cmdline").read_bytes()]
        assert len(relay) == 1
        os.kill(relay[0].host_pid, signal.SIGKILL)
        await wait_until_async(lambda: all(conns[n].closed for n in ("node04", "node05", "node06")), 20,
                   "the relay's children to be lost")
        for name in ("node04", "node05", "node06"):
            err = conns[name].error
            assert err is not None and err.code == "lost" and "relay node04 ended" in err.message, err
        assert not any(conns[n].closed for n in ("node01", "node02", "node03"))
        snap = await session.refresh()  # the lost nodes are opened again, together: through a new relay
        assert sorted(r.node for r in snap.ranks if r.threads) == c.names
        assert [r.name for r in session._connector._relay.relays] == ["node01", "node04", "node04"]  # type: ignore[union-attr]
    finally:
        await session.close()
    _nothing_left(c)


# A login process that opens every node through the relays, says so, and waits to be killed (no close).
_LOGIN = """
import asyncio, sys
from app.hosts import HostSpec
from app.session import Session, SessionOptions
from app.transport.relay import RelayOptions

async def main():
    names, cfg = sys.argv[1].split(","), sys.argv[2]
    s = Session([HostSpec(name=n, host=n, slots=1) for n in names],
                SessionOptions(ssh_config=(cfg,), connect_timeout=30.0, relay=RelayOptions(width=3, threshold=2)))
    snap = await s.snapshot()
    print(sum(1 for r in snap.ranks if r.threads), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_a_login_process_killed_outright_leaves_nothing_on_the_nodes(relay_cluster) -> None:
    c = relay_cluster
    proc = subprocess.Popen([sys.executable, "-c", _LOGIN, ",".join(c.names), str(c.ssh_config)], cwd=ROOT,
                            env=c.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "6", proc.stderr.read() if proc.poll() is not None else ""
        assert len([p for n in c.nodes for p in _ours(n)]) >= 6 + 2  # 6 workers, 2 relays (+ their ssh clients)
    finally:
        proc.kill()  # no close, no EOF written: only the TCP connections end
        proc.communicate(timeout=30)
    _nothing_left(c)
