"""The GPU tests on the SSH test cluster, gloo on CPU, as the issue lists them.

One rank per node. No GPU is lent to this project, so the NCCL/CUDA paths (chosen by the ranks at run
time) are not exercised here.

- sanity on 4 nodes passes, with the interpreter taken from the hung job's ranks, through the headless API;
- with one node cut off (iptables in its namespace) that node's rank is named within the deadline, and no
  process of the test is left on any node;
- the bench gives a number for every size, and busbw follows the nccl-tests formula;
- pair isolation on 6 nodes names a throttled node (tc tbf), and names a blocked link as the link;
- the port check reports the job's master port open, a closed port closed and a dropped one filtered;
- an `ib*` interface on one node makes NCCL's default choice disagree, and NCCL_SOCKET_IFNAME is suggested.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Iterator

import pytest

from app.cli.gpu import run_tests_headless
from app.gpu.model import GpuTestResults
from app.gpu.options import GpuTestOptions
from app.hosts import HostSpec
from app.model.codec import from_dict
from app.session import SessionOptions
from cluster import Cluster
from waiting import wait_until
import testenv

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
JOB_PYTHON = testenv.PYTHON  # the tests' python (torch is there); tests/support/cluster.py keeps it visible on every node
MARK = b"HANGSCOPE_GPUTEST="


def hosts(c: Cluster, names: list[str] | None = None) -> list[HostSpec]:
    return [HostSpec(name=n, host=n, source="test") for n in (names or c.names)]


def ssh(c: Cluster, python: str | None = None) -> SessionOptions:
    return SessionOptions(python=python, ssh_config=(str(c.ssh_config),), known_hosts=(str(c.known_hosts),),
                          identity=(str(c.key),), connect_timeout=10)


def run(c: Cluster, kind: str, options: GpuTestOptions, names: list[str] | None = None, **kw) -> tuple:
    out, err = io.StringIO(), io.StringIO()
    results, code = run_tests_headless(hosts(c, names), kind, options, session_options=ssh(c, options.python),
                                       out=out, err=err, **kw)
    print(out.getvalue())
    return results, code, out.getvalue()


def gputest_processes(c: Cluster) -> list[tuple[str, int, str]]:
    """Processes of any GPU test still present on the cluster's nodes (they carry the mark)."""
    found = []
    for node in c.nodes:
        for p in node.procs():
            with contextlib.suppress(OSError):
                if any(e.startswith(MARK) for e in Path(f"/proc/{p.host_pid}/environ").read_bytes().split(b"\0")):
                    found.append((node.name, p.pid, p.comm))
    return found


@pytest.fixture(scope="module")
def six(cluster_factory) -> Iterator[Cluster]:
    """A 6-node cluster of this module's own: the pair tests break and repair its links."""
    c = cluster_factory(6, prefix="gp")
    try:
        yield c
    finally:
        c.close()


@pytest.mark.torch
def test_sanity_on_4_nodes_passes_with_the_jobs_interpreter(cluster, hung_job, tmp_path) -> None:
    t0 = time.monotonic()
    results, code, text = run(cluster, "sanity", GpuTestOptions(timeout=30), json_path=str(tmp_path / "r.json"))
    assert code == 0 and results.ok, text
    (run_,) = results.runs
    assert [(r.node, r.rank, r.status, r.value) for r in run_.ranks] == [
        (f"node0{i}", i - 1, "ok", 4.0) for i in range(1, 5)]
    assert run_.master == "node01" and 29500 <= run_.port <= 29999 and run_.backend == "gloo"
    assert "OK: all_reduce sum = world size 4, barrier passed (gloo)" in text
    assert any(line.startswith("[node03:0] is OK (global rank: 2/4)") for line in run_.log)  # [host:rank] lines
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["schema"] == "hangscope.gputest"
    assert from_dict(GpuTestResults, saved["results"]) == results
    assert gputest_processes(cluster) == []
    print(f"sanity, 4 nodes: {time.monotonic() - t0:.1f} s")


def test_a_node_cut_off_is_named_within_the_deadline_and_nothing_is_left(make_cluster) -> None:
    c = make_cluster(4)
    cut = c["node04"]
    for other in c.nodes[:3]:  # the node still answers ssh from the login node, but not its peers
        cut.iptables("-A", "INPUT", "-s", other.ip, "-j", "DROP")
        cut.iptables("-A", "OUTPUT", "-d", other.ip, "-j", "DROP")
    t0 = time.monotonic()
    results, code, text = run(c, "sanity", GpuTestOptions(python=JOB_PYTHON, timeout=8))
    elapsed = time.monotonic() - t0
    assert code == 1 and not results.ok
    (run_,) = results.runs
    assert run_.status == "hung"
    by_node = {r.node: r for r in run_.ranks}
    assert by_node["node04"].status in ("hung", "broken") and by_node["node04"].culprit
    assert by_node["node04"].phase == "store_connect" and "node01:" in by_node["node04"].error
    assert [r.node for r in run_.culprits] == ["node04"]
    assert run_.not_finished == ("node01", "node02", "node03", "node04")
    assert by_node["node01"].waiting_for == (3,)  # rank 0 names the rank that never joined
    assert by_node["node01"].stack and "join_world" in by_node["node01"].stack[0]
    assert "rank 3 (node04) hung: could not connect to the rendezvous store at node01:" in results.verdict
    assert elapsed < 150, elapsed  # start-up (torch import on 2 shared cores) + 8 s without progress + stop
    assert gputest_processes(c) == []


def test_bench_gives_every_size_and_busbw_follows_the_formula(cluster) -> None:
    sizes = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 4 << 20)
    results, code, text = run(cluster, "bench", GpuTestOptions(python=JOB_PYTHON, sizes=sizes, iters=3, warmup=1,
                                                                timeout=30), names=["node01", "node02", "node03"])
    assert code == 0, text
    (run_,) = results.runs
    assert [r.size for r in run_.bench] == list(sizes) and run_.world_size == 3
    for row in run_.bench:
        assert row.count == row.size // 4 and row.time_us > 0 and row.time_max_us >= row.time_us * 0.999
        assert row.algbw == pytest.approx(row.size / (row.time_us * 1e-6) / 1e9)
        assert row.busbw == pytest.approx(row.algbw * 2 * (3 - 1) / 3)
    assert f"peak busbw {run_.busbw:.3f} GB/s" in text
    assert gputest_processes(cluster) == []


@pytest.mark.torch
def test_pair_isolation_names_the_throttled_node(six) -> None:
    slow = six["gp05"]
    slow.run("tc qdisc add dev eth0 root tbf rate 50mbit burst 32kbit latency 400ms")
    try:
        results, code, text = run(six, "pairs", GpuTestOptions(python=JOB_PYTHON, timeout=10, pair_size=2 << 20,
                                                               pair_iters=3))
    finally:
        slow.run("tc qdisc del dev eth0 root")
    assert code == 1
    report = results.pairs
    assert [(f.kind, f.units, f.how) for f in report.faults] == [("node", ("gp05",), "slow")], report.verdict
    assert report.verdict.startswith("node gp05's link is slow")
    assert report.cell("gp05", "gp06").status == "slow" and report.cell("gp01", "gp02").status == "ok"
    assert report.cell("gp05", "gp06").busbw < 0.5 * report.reference_busbw
    assert "pair matrix" in text and gputest_processes(six) == []
    port = {r.id: r.port for r in results.runs}
    for round_ids in report.rounds:  # tests that ran at the same time never shared a port
        assert len({port[i] for i in round_ids}) == len(round_ids)


@pytest.mark.torch
def test_pair_isolation_names_a_blocked_link_not_its_nodes(six) -> None:
    a, b = six["gp01"], six["gp02"]
    rules = [("INPUT", "-s", b.ip, "-j", "DROP"), ("OUTPUT", "-d", b.ip, "-j", "DROP")]
    for rule in rules:
        a.iptables("-A", *rule)
    try:
        # a pair counts as slow only below 5% of the median: this link hangs, and gloo's bandwidth on CPUs that
        # other work shares varies several-fold with that work (gp01-gp03 measured at 24% of the median on this
        # shared machine, and gp01 was then blamed as a node); slowness is the throttled-node test's subject
        results, code, _ = run(six, "pairs", GpuTestOptions(python=JOB_PYTHON, timeout=10, pair_size=2 << 20,
                                                            pair_iters=3, slow_ratio=0.05))
    finally:
        for rule in rules:
            a.iptables("-D", *rule)
    assert code == 1
    report = results.pairs
    assert [(f.kind, f.units, f.how) for f in report.faults] == [("link", ("gp01", "gp02"), "hung")], report.verdict
    assert report.verdict.startswith("the link gp01<->gp02 is broken (hangs)")
    hung = next(r for r in results.runs if r.status == "hung")
    assert {r.node: r.phase for r in hung.ranks} == {"gp01": "join", "gp02": "store_connect"}
    assert gputest_processes(six) == []


@pytest.mark.torch
def test_port_check_from_every_node(cluster, hung_job) -> None:
    node01 = cluster["node01"]
    # no --target: the job's own MASTER_ADDR:MASTER_PORT, taken from its ranks, must be open everywhere
    results, code, _ = run(cluster, "net", GpuTestOptions(check_timeout=1.0))
    master = {(c.host, c.port) for c in results.net.checks}
    assert code == 0 and len(master) == 1 and {c.state for c in results.net.checks} == {"open"}
    assert sorted(c.node for c in results.net.checks) == cluster.names
    listener = node01.spawn([JOB_PYTHON, "-c", "import socket, sys; s = socket.socket(); "
                             "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('', 29611)); "
                             "s.listen(8); sys.stdin.read()"], stdin=-1)
    node01.iptables("-A", "INPUT", "-p", "tcp", "--dport", "29613", "-j", "DROP")
    try:
        wait_until(lambda: node01.listening(29611), 30, "the test listener on node01")
        targets = (("node01", 29611), ("node01", 29612), ("node01", 29613))
        results, code, text = run(cluster, "net", GpuTestOptions(targets=targets, check_timeout=1.0))
    finally:
        node01.iptables("-D", "INPUT", "-p", "tcp", "--dport", "29613", "-j", "DROP")
        listener.kill()
        listener.wait()
        if listener.stdin is not None:
            listener.stdin.close()  # our end of its stdin pipe (it held the listener open)
    states = {(c.node, c.port): c.state for c in results.net.checks}
    for node in cluster.names:
        assert states[(node, 29611)] == "open"
        assert states[(node, 29612)] == "closed"
    assert all(states[(n, 29613)] == "filtered" for n in cluster.names if n != "node01")
    assert code == 1 and "node02 cannot reach node01:29612: closed" in text


def test_an_ib_named_interface_on_one_node_gets_an_ifname_suggestion(make_cluster) -> None:
    c = make_cluster(2)
    c["node02"].run("ip link add ib0 type veth peer name ib0p && ip addr add 10.99.0.2/24 dev ib0 && "
                    "ip link set ib0p up && ip link set ib0 up")
    results, code, text = run(c, "net", GpuTestOptions(check_timeout=1.0))
    picks = {n.node: n.nccl_pick for n in results.net.nodes}
    assert picks == {"node01": "eth0", "node02": "ib0"}
    assert results.net.suggestion == "NCCL_SOCKET_IFNAME=eth0"
    assert code == 1 and "suggestion: NCCL_SOCKET_IFNAME=eth0" in text
    assert {n.hostname for n in results.net.nodes} == {"node01", "node02"}
    assert all(not a.startswith("127.") for n in results.net.nodes for a in n.hostname_addresses)
