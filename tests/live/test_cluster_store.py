"""Live: rank numbers from the job's store (issue 16.1). A job started by torch.multiprocessing.spawn on two test
cluster nodes (tests/support/spawn_nodes_job.py, the ImageNet example's shape): no rank environment, and the spawn target
has no `rank` argument (it computes node_rank * per_node + index), so the process shows only its local index.
`hangscope HOSTS --print` over real SSH numbers every rank from the store that rank 0 serves on node01, names
that evidence, says on rank 0 what was read from its store, and leaves every key and value of the store as it was.
With --no-store the numbers stay unknown and the spawn index is given as the local rank only: the store was the
only source of the global numbers. The culprit logged a caught traceback to its own stderr file before it stopped:
the summary shows it first, read on its node and redacted there (issue 16.5)."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

from app.model.codec import snapshot_from_json
from cluster import UNHURRIED_LOGIN, Cluster, run_login
from jobs import MARK, PYTHON, _free_port, _kill_marked
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "spawn_nodes_job.py"
PER_NODE = 2
SECRET = "hf_" + "SpawnNodesJobToken" * 2  # what the culprit's traceback holds (tests/support/spawn_nodes_job.py)
pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]
_STORE_CONTENT = """
import datetime, hashlib, json, sys
import torch.distributed as dist
s = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=10))
print(json.dumps({"num_keys": s.num_keys(), "keys": {k: hashlib.sha256(s.get(k)).hexdigest()
                                                     for k in sorted(s.list_keys())}}))
"""


@pytest.fixture(scope="module")
def job(cluster_factory: Callable[..., Cluster]) -> Iterator[tuple[Cluster, str, dict[int, dict]]]:
    """(cluster, the store's address:port, rank -> {"pid", "local", "node"}) of the hung two-node spawn job."""
    cluster = cluster_factory(2)
    master = cluster.nodes[0]
    port = _free_port(master)
    workdir = Path(tempfile.mkdtemp(prefix="hangscope-store-"))
    workdir.chmod(0o755)
    ready = workdir / "ready.jsonl"
    mark = secrets.token_hex(4)
    logs = []
    try:
        for index, node in enumerate(cluster.nodes):
            log = open(workdir / f"{node.name}.log", "wb")  # noqa: SIM115 (closed in the finally below)
            logs.append(log)
            node.spawn([PYTHON, str(SCRIPT), "2", str(index), str(PER_NODE), master.ip, str(port), str(ready)],
                       env={MARK: mark, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT)

        def all_ready() -> bool:
            return ready.exists() and len(ready.read_text().splitlines()) >= 2 * PER_NODE

        try:
            wait_until(all_ready, 180, "every spawned rank on both nodes to be ready", interval=0.3)
        except TimeoutError:
            raise AssertionError({n.name: (workdir / f"{n.name}.log").read_text(errors="replace")[-1500:]
                                  for n in cluster.nodes}) from None
        ranks = {int(d["rank"]): d for d in map(json.loads, ready.read_text().splitlines())}
        for number, d in ranks.items():
            d["node"], d["ready"] = cluster.nodes[number // PER_NODE].name, str(ready)
        yield cluster, f"{master.ip}:{port}", ranks
    finally:
        wait_until(lambda: not _kill_marked(cluster.nodes, f"{MARK}={mark}"), 20, "the spawn jobs to die")
        for log in logs:
            log.close()
        cluster.close()


def hangscope(cluster: Cluster, tmp: Path, *flags: str) -> tuple[str, object]:
    hosts = tmp / "hosts.txt"
    hosts.write_text("".join(f"{n}\n" for n in cluster.names))
    out = tmp / "snap.json"
    # --raw: the tests read back what was collected (the ranks' stderr paths), not what a shared file may show
    res = run_login([sys.executable, "-m", "app", str(hosts), *UNHURRIED_LOGIN, "--print", "--force", "--samples", "1",
                     "--snapshot", str(out), "--raw", *flags], cluster, timeout=240, cwd=str(REPO))
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res.stdout, snapshot_from_json(out.read_text())[0]


def _store_content(cluster: Cluster, store: str) -> dict:
    host, _, port = store.rpartition(":")
    return json.loads(cluster.nodes[0].run([PYTHON, "-c", _STORE_CONTENT, host, port], timeout=120).stdout)


def test_every_rank_is_numbered_from_the_store_and_the_store_is_left_as_it_was(job, tmp_path) -> None:
    cluster, store, truth = job
    before = _store_content(cluster, store)
    stdout, snap = hangscope(cluster, tmp_path)
    assert _store_content(cluster, store) == before  # read-only: every key and value as it was
    found = {(r.node, r.pid): r for r in snap.ranks}  # type: ignore[attr-defined]
    assert len(found) == len(truth), sorted(found)
    for number, d in truth.items():
        r = found[(d["node"], d["pid"])]
        assert r.env_value("RANK") is None  # really no rank environment
        assert r.rank == number, r
        assert r.local_rank == d["local"], r  # the spawn index: the local rank only
        assert r.rank_evidence.startswith(f"the process group's store ({store}, LIST_KEYS): the default group's "
                                          f"key for rank {number} holds this process's gloo address "), r
    host = found[(truth[0]["node"], truth[0]["pid"])]
    assert any(a.endswith(f"hangscope read the rank numbers from the store it serves ({store}): LIST_KEYS and "
                          f"{len(truth)} GET, read-only, one connection") for a in host.actions), host.actions
    assert not any("store" in a for r in found.values() if r is not host for a in r.actions)
    last = len(truth) - 1
    assert re.match(rf"hangscope: Rank {last} \(pid {truth[last]['pid']} on {truth[last]['node']}\) is blocked in "
                    r"`Event.wait` at `main_worker` \(spawn_nodes_job.py:\d+\)", " ".join(stdout.split())), stdout
    # the culprit's recent error output (its own stderr file), read on its node, redacted there (issue 16.5)
    err = f"{truth[last]['ready']}.rank{last}.err"
    section = stdout.split("Recent error output (read on the nodes, redacted):\n", 1)[1]
    # --print quotes it as it would be shared (default-deny): a path component that reads like no name (the
    # temporary directory's random suffix, when its letters happen to) is shown by its length and hash
    path = "/".join(f"(?:{re.escape(c)}|<str len={len(c)} #[0-9a-f]+>)" if c else "" for c in err.split("/"))
    assert re.match(rf"  rank {last} on {truth[last]['node']}, its stderr \({path}\), written ", section), section
    assert "RuntimeError: shard 7 of the dataset is missing (HF_TOKEN=***)" in section, section
    assert SECRET not in stdout and SECRET not in json.dumps([r.output for r in found.values()], default=str)
    culprit = found[(truth[last]["node"], truth[last]["pid"])]
    assert [o.source for o in culprit.output] == ["stderr"] and culprit.output[0].path == err


def test_with_no_store_the_numbers_stay_unknown_and_the_index_is_the_local_rank(job, tmp_path) -> None:
    cluster, _, truth = job
    _, snap = hangscope(cluster, tmp_path, "--no-store")
    found = {(r.node, r.pid): r for r in snap.ranks}  # type: ignore[attr-defined]
    for d in truth.values():
        r = found[(d["node"], d["pid"])]
        assert r.rank is None and r.local_rank == d["local"], r
        assert r.rank_evidence.startswith("unknown: the spawn target main_worker has no `rank` argument"), r
        assert not any("store" in a for a in r.actions), r.actions
