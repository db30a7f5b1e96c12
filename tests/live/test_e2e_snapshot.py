"""End to end: `hangscope hosts.txt --snapshot` over real SSH against the hung torch job on the test cluster."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from app.hosts import parse_hosts
from app.model import CollectOptions
from app.model.codec import snapshot_from_json
from app.session import NodeUpdate, Session, SessionOptions
from cluster import UNHURRIED_LOGIN, run_login

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster


def hangscope_argv(*args: str) -> list[str]:
    """A collection gets the unhurried login deadline; --load connects to nothing, and refuses login flags."""
    login = () if "--load" in args else UNHURRIED_LOGIN
    return [sys.executable, "-m", "app", *login, *args]


@pytest.fixture(scope="module")
def snapshot_run(cluster, hung_job, tmp_path_factory):
    """One `hangscope hosts.txt --snapshot out.json --locals` of the shared hung job, read back."""
    tmp = tmp_path_factory.mktemp("e2e")
    hosts = tmp / "hosts.txt"
    hosts.write_text("# the hung job's nodes\n" + "".join(f"{n} slots=2\n" for n in cluster.names))
    out = tmp / "out.json"
    started = time.monotonic()
    res = run_login(hangscope_argv(str(hosts), "--snapshot", str(out), "--locals"), cluster, timeout=180,
                    cwd=str(REPO))
    elapsed = time.monotonic() - started
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    snap, analysis = snapshot_from_json(out.read_text())
    print(f"\ncold snapshot via the CLI (process start, connect, worker start, discover, dump): {elapsed:.2f} s")
    return res, snap, analysis


def test_every_rank_found_with_its_identity(snapshot_run, hung_job):
    _, snap, _ = snapshot_run
    assert all(n.state == "done" for n in snap.nodes), [(n.name, n.state, n.error) for n in snap.nodes]
    found = {r.rank: r for r in snap.ranks}
    assert sorted(found) == sorted(hung_job.ranks), "every rank, and nothing else (no launcher, no helper)"
    for rank, loc in hung_job.ranks.items():
        r = found[rank]
        assert (r.node, r.pid, r.local_rank) == (loc.node, loc.pid, loc.local_rank)
        assert r.world_size == 8 and r.launcher in ("torchrun", "python")
        assert r.collected and r.error is None
        assert r.start_time > 0 and r.launcher_pid


def test_each_stack_shows_the_training_loop_and_the_wait(snapshot_run, hung_job):
    _, snap, _ = snapshot_run
    for r in snap.ranks:
        frames = r.main_thread.frames
        functions = [f.function for f in frames]
        assert "train" in functions, (r.rank, functions)
        train = next(f for f in frames if f.function == "train")
        assert any(loop.variables[:1] == ("step",) for loop in train.loops), train.loops
        assert dict(train.iteration).get("step") == str(hung_job.step), (r.rank, train.iteration)
        if r.rank == hung_job.culprit:
            assert "all_reduce" not in functions
            assert "StreamingLoader._recv_exact" in functions, functions  # blocked reading its next batch
        else:
            assert "all_reduce" in functions, (r.rank, functions)


def test_summary_names_the_culprit(snapshot_run, hung_job):
    res, _, analysis = snapshot_run
    assert analysis and analysis["findings"], analysis
    culprit = f"rank {hung_job.culprit}"
    assert culprit in res.stdout, res.stdout
    first = analysis["findings"][0]  # the most likely culprit comes first
    loc = hung_job.ranks[hung_job.culprit]
    assert first["ranks"] == [[loc.node, loc.pid]], first
    assert first["confidence"] == "high" and culprit in first["title"], first


def test_unreachable_node_does_not_stop_the_others(cluster, hung_job, tmp_path):
    """A host with nothing behind its address: that node fails with a sentence naming it; exit code 1."""
    ghost = f"{cluster.subnet}.250"
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("".join(f"{n}\n" for n in cluster.names) + f"{ghost}\n")
    out = tmp_path / "out.json"
    # the ghost fails by its connect deadline, the unhurried one the real nodes get (they must all connect, on a
    # busy machine too); nothing answers for it, so it fails as unreachable (no ARP answer) or at the deadline
    connect = float(UNHURRIED_LOGIN[1])
    started = time.monotonic()
    res = run_login(hangscope_argv(str(hosts), "--snapshot", str(out)), cluster, timeout=connect + 120, cwd=str(REPO))
    elapsed = time.monotonic() - started
    assert res.returncode == 1, res.stderr
    snap, _ = snapshot_from_json(out.read_text())
    states = {n.name: n for n in snap.nodes}
    assert states[ghost].state == "failed"
    assert states[ghost].error.code in ("connect_timeout", "unreachable")
    assert ghost in states[ghost].error.message
    assert all(states[n].state == "done" for n in cluster.names)
    assert len(snap.ranks) == len(hung_job.ranks)
    # the dead node costs at most its connect deadline; the rest is the live nodes' collection, as before (the
    # test gave 57 s beyond a 3 s deadline)
    assert elapsed < connect + 57, "the dead node must cost at most its connect deadline"
    assert f"{ghost}: failed" in res.stderr


def test_warm_refresh_reuses_the_open_connections(cluster, hung_job):
    hosts = parse_hosts("".join(f"{n}\n" for n in cluster.names), "test").hosts
    options = SessionOptions(collect=CollectOptions(), ssh_config=(str(cluster.ssh_config),))
    events: list = []

    async def run() -> tuple[float, float, int, int]:
        session = Session(hosts, options, on_event=events.append)
        try:
            t0 = time.monotonic()
            cold = await session.snapshot()
            t1 = time.monotonic()
            events.clear()
            warm = await session.refresh()
            t2 = time.monotonic()
            return t1 - t0, t2 - t1, len(cold.ranks), len(warm.ranks)
        finally:
            await session.close()

    cold_s, warm_s, n_cold, n_warm = asyncio.run(run())
    # the speed-up itself is measured in bench/session.py; here: the refresh never reconnects
    print(f"\nsession snapshot of {n_cold} ranks on {len(hosts)} nodes: cold {cold_s:.2f} s, warm {warm_s:.2f} s")
    assert n_cold == n_warm == len(hung_job.ranks)
    states = [e.node.state for e in events if isinstance(e, NodeUpdate)]
    assert states and "connecting" not in states and states.count("done") == len(hosts)


def test_export_bundle_from_the_snapshot_and_load_it_back(snapshot_run, cluster, hung_job, tmp_path):
    """`hangscope --load out.json --export DIR`: the bundle a user attaches to a ticket, read back by --load."""
    res, snap, _ = snapshot_run
    out = Path(res.args[res.args.index("--snapshot") + 1])
    bundle = tmp_path / "bundle"
    exported = run_login(hangscope_argv("--load", str(out), "--export", str(bundle)), cluster, cwd=str(REPO))
    assert exported.returncode == 0, exported.stderr
    names = {p.name for p in bundle.iterdir()}
    assert {"summary.md", "report.html", "snapshot.json", "manifest.json", "stacks.speedscope.json"} <= names
    assert oct(bundle.stat().st_mode & 0o777) == "0o700"
    assert all(p.stat().st_mode & 0o077 == 0 for p in bundle.iterdir())
    culprit = f"rank {hung_job.culprit}"
    assert culprit in (bundle / "summary.md").read_text()
    assert culprit in (bundle / "report.html").read_text()
    again = run_login(hangscope_argv("--load", str(bundle / "snapshot.json"), "--print"), cluster, cwd=str(REPO))
    assert again.returncode == 0, again.stderr
    assert culprit in again.stdout
    reloaded, _ = snapshot_from_json((bundle / "snapshot.json").read_text())
    assert len(reloaded.ranks) == len(snap.ranks)
    # a second export to the same place is refused without --force, and nothing is overwritten
    before = (bundle / "summary.md").read_bytes()
    refused = run_login(hangscope_argv("--load", str(out), "--export", str(bundle)), cluster, cwd=str(REPO))
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert (bundle / "summary.md").read_bytes() == before


def test_a_node_left_out_of_the_hosts_list_is_named_from_the_ranks_connections(cluster, hung_job, tmp_path):
    """The hosts list leaves out the culprit's node: the headline says which ranks are missing and names that
    node (its address from the ranks' sockets, its name from the ssh config), with no [high] false lead."""
    culprit_node = hung_job.ranks[hung_job.culprit].node
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("".join(f"{n}\n" for n in cluster.names if n != culprit_node))
    res = run_login(hangscope_argv(str(hosts), "--print", "--samples", "1"), cluster, timeout=180, cwd=str(REPO))
    missing = sorted(r for r, loc in hung_job.ranks.items() if loc.node == culprit_node)
    headline = " ".join(res.stdout.split("\n\n", 1)[0].split())
    assert headline.startswith(f"hangscope: Likely lead: ranks {missing[0]}-{missing[-1]} are not in the snapshot: "
                               f"the job runs on {culprit_node} ({cluster[culprit_node].ip}) too"), res.stdout
    text = " ".join(res.stdout.split())
    assert f"Add {culprit_node} to the hosts list" in text and "by the ssh config" in text
    assert "[high]" not in res.stdout.split("Stacks:", 1)[0], res.stdout  # no confident false lead
