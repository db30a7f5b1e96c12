"""Live: a real torch gloo job on the test cluster hangs with one rank stuck (the gpu_xid scenario), and the node
of that rank has a GPU fault. The fault cannot be produced here (no GPU): FAKE nvidia-smi, dmesg and ncclras on
the nodes print RECORDED outputs (tests/support/gpu_fakes.py, tests/data/gpu/README.md). The job, SSH, the worker, the
CLI and the analysis are real: `hangscope HOSTS --gpu-evidence --snapshot out.json`, as a user runs it.
"""

from __future__ import annotations

from typing import Callable

import pytest

from cluster import Cluster
from record_scenarios import SCENARIOS, diagnose, started

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support")]


def test_a_rank_stuck_on_a_node_with_a_fresh_xid_is_the_headline(cluster_factory: Callable[..., Cluster],
                                                                  tmp_path) -> None:
    cluster = cluster_factory(2)
    try:
        with started(cluster, SCENARIOS["gpu_xid"]) as running:
            fakes = list(running.fakes)
            assert fakes and all(p.exists() for p in fakes)
            culprit = running.job.ranks[3]
            d = diagnose(running, tmp_path)
        assert not any(p.exists() for p in fakes), "the FAKE tools are gone with the scenario"
    finally:
        cluster.close()
    out = " ".join(d.stdout.split())
    assert d.returncode == 0, d.stdout + d.stderr
    head = d.analysis["findings"][0]
    assert head["kind"] == "gpu_fault" and head["confidence"] == "high"
    assert head["ranks"] == [[culprit.node, culprit.pid]]
    assert out.startswith("hangscope: Rank 3 on node02: its GPU 1 (0000:5d:00) reported Xid 79, GPU has fallen off "
                          "the bus"), out[:300]
    assert "nvidia-smi -r -i 1" in out and "drain" in out, "what to do is said"
    # NCCL RAS (asked on node01, the first node) names the same rank; the week-old Xid 63 is said as old, [low]
    ras = d.finding("nccl_ras")
    assert ras["ranks"] == [[culprit.node, culprit.pid]] and "launched only 41 AllReduce" in ras["title"]
    old = [f for f in d.analysis["findings"] if "older Xid" in f["title"]]
    assert len(old) == 1 and old[0]["confidence"] == "low"
    assert "GPU evidence:" in out and "node01: nvidia-smi: not found on this node" in out and "node02: Xid 79 on 0000:5d:00" in out
    node02 = next(n for n in d.snapshot.nodes if n.name == "node02")
    assert node02.gpu is not None and node02.gpu.smi == "ok" and node02.gpu.why == "--gpu-evidence on"
    assert node02.gpu.ras is not None and node02.gpu.ras.status == "refused", "no RAS listens on node02"
