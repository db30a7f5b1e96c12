"""The pure parts of the GPU tests, each on its own.

Bus bandwidth as nccl-tests defines it, size options, the GPU inventory from nvidia-smi's CSV and kernel
Xid lines, the NCCL_SOCKET_IFNAME suggestion, and the CLI options.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys

import pytest

from app.errors import InputError
from app.gpu import bench, inventory, netcheck
from app.gpu import model as gpu_model
from app.gpu.output import run_message
from app.gpu.schedule import verdict
from app.cli.gpu import add_test_arguments, options_from_args
from app.gpu.table import printable


def test_busbw_is_algbw_times_2_n_minus_1_over_n() -> None:
    ev = {"size": 1 << 20, "count": 1 << 18, "time_avg": 0.002, "time_max": 0.0025, "iters": 20}
    for n, factor in ((1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)):
        row = bench.row(ev, n)
        assert row.algbw == pytest.approx((1 << 20) / 0.002 / 1e9)
        assert row.busbw == pytest.approx(row.algbw * factor)
        assert row.time_us == pytest.approx(2000.0) and row.time_max_us == pytest.approx(2500.0)
    table = bench.table([bench.row(ev, 4)]).splitlines()
    assert table[0].split() == ["size", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)"]
    assert table[1].split() == ["1048576", "262144", "float32", "sum", "2000.0", "0.524", "0.786"]


def test_one_rank_measures_no_bandwidth_and_says_so() -> None:
    """Seen on an H100 (make gpu-check, one GPU): `peak busbw 0 GB/s` read like a broken link; one rank's
    all_reduce crosses none."""
    ev = {"size": 1 << 26, "count": 1 << 24, "time_avg": 0.000017, "time_max": 0.000017, "iters": 5}
    text = bench.table([bench.row(ev, 1)])
    assert "no bandwidth measured: one rank's all_reduce crosses no link" in text and "peak busbw" not in text
    run = gpu_model.TestRun("bench-1", "bench", ("vm",), "ok", backend="nccl", world_size=1,
                  ranks=(gpu_model.RankResult("vm", 0, 0, "ok"),), bench=(bench.row(ev, 1),))
    message = run_message(run)
    assert "peak busbw" not in message and "no bandwidth measured" in message and "it takes 2 ranks" in message
    two = dataclasses.replace(run, world_size=2, bench=(bench.row(ev, 2),))
    assert "peak busbw" in run_message(two)


def test_pairs_with_nothing_to_pair_say_so() -> None:
    """One node (or one GPU): `no fault found: 0 pair(s) ok` claimed a test that never ran."""
    assert verdict("nodes", (), (), (), 0, None) == ("nothing tested: a pair takes two nodes, and fewer were there "
                                                     "to pair")
    assert verdict("node01", (), (), (), 0, None).startswith("node01: nothing tested: a pair takes two GPUs")


def test_sizes_lists_ranges_and_bad_input() -> None:
    assert bench.parse_sizes("1K,1M,64M") == (1024, 1 << 20, 64 << 20)
    assert bench.parse_sizes("1K:64K") == (1024, 4096, 16384, 65536)
    assert bench.parse_sizes("8:64:2") == (8, 16, 32, 64)
    for bad in ("1X", "-4", "1K:2M:1", "64T", "2"):
        with pytest.raises(InputError):
            bench.parse_sizes(bad)


# nvidia-smi's documented --format=csv,noheader,nounits shape; written for this test (no GPU here)
GPUS_CSV = ("0, GPU-6f3ba1e0-5bd1-2c7a-8f4a-0d2c1e9a7b11, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 79213, 81559, "
            "100, 0, 61\n"
            "1, GPU-0b9e4c2d-1a7f-4e3b-9c8d-2f6a5b4c3d21, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 3, 81559, 0, "
            "[N/A], 35\n")
APPS_CSV = "2812731, GPU-6f3ba1e0-5bd1-2c7a-8f4a-0d2c1e9a7b11, 79190, /opt/conda/bin/python3.10\n"
# real kernel lines, from https://github.com/leptonai/gpud/pull/46 and
# https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1150
XID_LINES = [
    "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM "
    "Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
    "errorString CTX SWITCH TIMEOUT, Info 0x58005",
    "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
]


def test_inventory_from_nvidia_smi_with_holders_and_xids() -> None:
    data = {"at": 1.0, "smi": {"status": "ok", "via": "nvidia-smi",
                               "gpu_fields": "index,uuid,name,pci.bus_id,memory.used,memory.total,utilization.gpu,"
                               "ecc.errors.uncorrected.volatile.total,temperature.gpu",
                               "app_fields": "pid,gpu_uuid,used_memory,process_name", "gpus_csv": GPUS_CSV,
                               "apps_csv": APPS_CSV},
            "xid_lines": XID_LINES, "xid_source": "dmesg", "xid_timed": "iso", "notes": []}
    inv = inventory.node_inventory("gpu01", data)
    assert [(g.index, g.name, g.memory_used_mib, g.ecc_uncorrected_volatile, g.temperature_c) for g in inv.gpus] == [
        (0, "NVIDIA H100 80GB HBM3", 79213, 0, 61), (1, "NVIDIA H100 80GB HBM3", 3, None, 35)]  # [N/A] -> None
    assert [(h.pid, h.used_mib, h.process) for h in inv.holders] == [(2812731, 79190, "/opt/conda/bin/python3.10")]
    assert [(x.bus_id, x.xid) for x in inv.xids] == [("0000:cb:00", 13), ("0000:cb:00", 109), ("0000:dc:00", 45)]
    text = inventory.summary(inv)
    assert "2 GPU(s) via nvidia-smi" in text and "held by pid 2812731" in text and "recent Xid 13 on" in text
    busy = inventory.busy([inv])
    err = inventory.GpusBusyError(busy)
    assert "gpu01: pid 2812731" in str(err) and "--allow-busy-gpus" in err.hint


def test_a_node_without_nvidia_tools_has_no_gpus_and_no_holders() -> None:
    inv = inventory.node_inventory("cpu01", {"at": 1.0, "smi": {"status": "missing"}, "xid_lines": [], "notes": []})
    assert inv.gpus == () and inventory.busy([inv]) == []
    assert inventory.summary(inv).startswith("no NVIDIA GPUs")


def test_a_hung_nvidia_smi_gives_no_gpus_and_says_why() -> None:
    inv = inventory.node_inventory("gpu01", {"smi": {"status": "timeout", "via": "nvidia-smi", "timeout": 5.0},
                                             "xid_lines": XID_LINES[:1], "xid_timed": "iso", "notes": []})
    assert inv.gpus == () and [x.xid for x in inv.xids] == [13]
    assert "did not answer within 5s" in inventory.summary(inv)


def probe(iface: str, addr: str, mask: str = "255.255.255.0", extra: tuple = ()) -> dict:
    ifaces = [{"name": "lo", "up": True, "kind": "loopback", "addresses": [{"family": "ipv4", "address": "127.0.0.1",
                                                                            "netmask": "255.0.0.0"}]},
              {"name": iface, "up": True, "kind": "ethernet", "addresses": [{"family": "ipv4", "address": addr,
                                                                             "netmask": mask}]}]
    for name, a in extra:
        ifaces.append({"name": name, "up": True, "kind": "ethernet",
                       "addresses": [{"family": "ipv4", "address": a, "netmask": mask}]})
    return {"interfaces": ifaces, "hostname": {"hostname": "n", "addresses": [addr]}, "checks": []}


def test_agreeing_nodes_need_no_suggestion() -> None:
    report = netcheck.report({"a": probe("eth0", "10.0.0.1"), "b": probe("eth0", "10.0.0.2")})
    assert report.suggestion == "" and report.findings == ()
    assert [n.nccl_pick for n in report.nodes] == ["eth0", "eth0"]


def test_an_ib_named_interface_on_one_node_makes_nccl_disagree_and_eth0_is_suggested() -> None:
    report = netcheck.report({"a": probe("eth0", "10.0.0.1", extra=(("ib0", "10.9.0.1"),)),
                              "b": probe("eth0", "10.0.0.2")})
    assert [n.nccl_pick for n in report.nodes] == ["ib0", "eth0"]
    assert report.suggestion == "NCCL_SOCKET_IFNAME=eth0"
    assert "would not use the same network" in report.findings[0]


def test_different_names_on_one_subnet_are_listed_together() -> None:
    report = netcheck.report({"a": probe("eth0", "10.0.0.1"), "b": probe("ens3", "10.0.0.2")})
    assert report.suggestion == "NCCL_SOCKET_IFNAME=ens3,eth0"


def test_hostname_on_loopback_and_unreachable_master_are_findings() -> None:
    a = probe("eth0", "10.0.0.1")
    a["hostname"] = {"hostname": "a", "addresses": ["127.0.1.1"]}
    a["checks"] = [{"host": "a", "port": 29500, "state": "filtered", "address": "10.0.0.1", "ms": 3000.0}]
    report = netcheck.report({"a": a, "b": probe("eth0", "10.0.0.2"), "c": "connection lost"})
    text = "\n".join(report.findings)
    assert "resolves to 127.0.1.1 only" in text and "GLOO_SOCKET_IFNAME" in text
    assert "a cannot reach a:29500: filtered" in text and "c: no network probe: connection lost" in text


def parse_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--python")
    add_test_arguments(p)
    return p.parse_args(list(argv))


def test_cli_options_become_gpu_test_options() -> None:
    o = options_from_args(parse_args("--test", "bench", "--sizes", "1K:1M", "--nccl-env", "NCCL_SOCKET_IFNAME=eth0",
                                     "--target", "node01:29500", "--python", "/opt/py/bin/python3", "--all-pairs"))
    assert o.sizes == (1024, 4096, 16384, 65536, 262144, 1 << 20)
    assert o.env == (("NCCL_SOCKET_IFNAME", "eth0"),) and o.targets == (("node01", 29500),)
    assert o.python == "/opt/py/bin/python3" and o.all_pairs and o.backend == "auto"


@pytest.mark.parametrize("argv", [["--nccl-env", "LD_PRELOAD=/tmp/x.so"], ["--target", "node01"],
                                  ["--sizes", "lots"], ["--slow-ratio", "2"], ["--test-timeout", "0"]])
def test_bad_cli_options_are_input_errors(argv: list[str]) -> None:
    with pytest.raises(InputError):
        options_from_args(parse_args(*argv))


def test_remote_text_is_made_printable() -> None:
    assert printable("eth0\x1b[2J\x07") == "eth0\ufffd[2J\ufffd"


def test_the_gpu_package_never_imports_textual() -> None:
    code = ("import sys, app.cli.gpu, app.gpu.runner, app.gpu.connect; "
            "assert 'textual' not in sys.modules, 'textual imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_ranks_that_lose_the_store_when_a_hung_run_is_stopped_are_victims_not_culprits() -> None:
    # A hung run is stopped: rank 0's store goes first, and ranks still waiting on it report torch's
    # "Failed to recv ... Connection was likely closed" before they are killed. The rank that never joined
    # (named by rank 0) is the culprit, not them. Lines as the GPU test program prints them.
    from app.gpu.output import EVENT, RunOutput

    def ev(**kw: object) -> str:
        return EVENT + json.dumps(kw)

    out = RunOutput(["node01", "node02", "node03", "node04"], [1, 1, 1, 1])
    lost = ("DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server "
            "shutdown or crash?")
    out.feed("node01", [("out", 0, ev(event="phase", phase="join")), ("out", 0, ev(event="waiting", missing=[3]))])
    for node, rank in (("node02", 1), ("node03", 2)):
        out.feed(node, [("out", 0, ev(event="phase", phase="join")),
                        ("out", 0, ev(event="result", ok=False, phase="join", rank=rank, error=lost))])
    out.feed("node04", [("out", 0, ev(event="phase", phase="store_connect", master="node01:29605"))])
    results = {r.node: r for r in out.results(stopped=True, node_errors={})}
    assert results["node02"].status == "broken" and not results["node02"].culprit
    assert results["node03"].status == "broken" and not results["node03"].culprit
    assert results["node04"].status == "hung" and results["node04"].culprit
    assert [n for n, r in results.items() if r.culprit] == ["node04"]
