"""GPU-side evidence for NCCL jobs: kernel Xid lines, ECC/row-remap counts, an nvidia-smi that does not answer, and
NCCL RAS's view, from the node's worker to the findings.

There is no GPU here: every GPU tool's output is RECORDED (tests/data/gpu/, sources in its README) and printed by
FAKE executables (tests/support/gpu_fakes.py) that stand in for faults that cannot be produced here. The worker that runs
them under deadlines, the redaction, the decoding (app/decode/gpu.py) and the analysis are the real code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
import threading
import time
from pathlib import Path

import gpu_fakes
from gpu_fakes import recorded
from worker_client import WorkerProc
from worker_targets import start_rank

from app.decode import gpu as parse_gpu
from app.analysis import analyze
from app.analysis.calibrate import before_graph
from app.analysis.facts import Evidence, Fact, ranks_who
from app.analysis.findings import Finding
from app.analysis.gpu_evidence import gpu_facts
from app.analysis.prose import render
from app.analysis.prose.gpu import evidence_lines
from app.model import (bus_key, GpuUse, GpuXid, NodeGpuEvidence, NodeStatus, RankSnapshot, RasComm, RasRank,
                       RasView, Snapshot)
from workers.collect import gpu_evidence as collector
from workers.collect import nvidia

NOW = 1_760_000_000.0


def gpu_findings(snap: Snapshot, others: list, history: list) -> list:
    """The GPU facts of a snapshot, as the analysis makes and calibrates them beside `others` (other findings of
    the same job, as facts: a progressing job, a stack that singles out some rank), rendered."""
    number = {(r.node, r.pid): r.rank for r in snap.ranks}
    given = [Fact(f.kind, ranks_who(f.ranks, tuple(number.get(k) for k in f.ranks)), f.confidence, Evidence(),
                  culprit=f.culprit) for f in others]
    stuck = (not any(f.kind == "progressing" for f in given)) if history else None
    facts = before_graph(given + gpu_facts(snap, stuck, history), ())
    return [render(f) for f in facts[len(given):]]


def _iso_lines(now: float = NOW) -> list:
    """The recorded dmesg lines with `@AGE:N@` as `dmesg --time-format iso` writes a time N seconds before now."""
    out = []
    for line in recorded("dmesg-xids.txt").splitlines():
        age, rest = line[5:].split("@", 1)
        t = datetime.datetime.fromtimestamp(now - float(age), datetime.timezone.utc)
        out.append(t.strftime("%Y-%m-%dT%H:%M:%S,%f+00:00") + rest)
    return out


# -- decoding recorded outputs ----------------------------------------------------------------------------------

def test_nvidia_smi_q_report_gives_ecc_and_remap_counts_per_gpu() -> None:
    gpus = parse_gpu.parse_query_text(recorded("nvidia-smi-q-a100.txt"))
    assert [(g.index, g.bus_id) for g in gpus] == [(0, "00000000:10:1C.0"), (1, "00000000:10:1D.0")]
    first, second = gpus
    assert first.ecc_corrected_volatile == 177 and first.ecc_uncorrected_volatile == 0
    assert first.remap_correctable == 1 and first.remap_pending is True and first.remap_failure is False
    assert first.retired_pending is None, "N/A stays unknown"
    assert second.remap_pending is False and second.uuid.startswith("GPU-0309d0d1")


def test_query_gpu_csv_joined_with_remapped_rows() -> None:
    gpus = parse_gpu.parse_gpu_csv(recorded("query-gpu.csv"), nvidia.GPU_FIELDS)
    gpus = parse_gpu.add_remaps(gpus, recorded("remapped-rows.csv"), nvidia.REMAP_FIELDS)
    assert len(gpus) == 8
    bad = [g for g in gpus if g.ecc_uncorrected_volatile]
    assert [(g.index, g.bus_id, g.ecc_uncorrected_volatile, g.remap_uncorrectable, g.remap_pending)
            for g in bad] == [(3, "00000000:5D:00.0", 4, 1, True)]
    assert all(g.retired_pending is None for g in gpus), "[N/A] on an H100: unknown, not False"


def test_xid_lines_with_their_age_and_bus() -> None:
    xids = parse_gpu.parse_xids(_iso_lines(), "iso", NOW)
    assert [x.xid for x in xids] == [79, 48, 31, 74, 119, 120, 63], "the non-Xid NVRM line is skipped"
    by = {x.xid: x for x in xids}
    assert by[79].bus_id == "0000:5d:00" and abs(by[79].age_s - 40) < 1
    assert by[119].bus_id == "0000:ab:00", "an Xid line without `PCI:` in front of the address"
    assert "fallen off the bus" in by[79].text and abs(by[63].age_s - 604800) < 1
    assert bus_key("00000000:5D:00.0") == bus_key("0000:5d:00")


# Xid lines as drivers and logs write them (app/decode/gpu.py _XID): the current driver's, a MIG instance's, the
# older drivers' without `PCI:` (as quoted in public bug reports of the 3xx-series drivers), behind each log's prefix
XID_SHAPES = [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
     (79, "0000:3b:00", "", "pid=1234, name=python3, GPU has fallen off the bus.")),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     (79, "0000:3b:00", "", "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")),
    ("NVRM: Xid (PCI:0000:C1:00 GPU-I:01): 43, pid=2201, name=python, Ch 00000010",
     (43, "0000:c1:00", "GPU-I:01", "pid=2201, name=python, Ch 00000010")),
    ("NVRM: Xid (PCI:0000:c1:00 GPU-I:01 GPU-CI:00): 31, pid=2201, name=python, MMU Fault",
     (31, "0000:c1:00", "GPU-I:01 GPU-CI:00", "pid=2201, name=python, MMU Fault")),
    # older drivers: no `PCI:`, no pid or name; the message may even be on the next line
    ("NVRM: Xid (0000:03:00): 13, 0003 00000000 00008297 00001098 00000000 00000044",
     (13, "0000:03:00", "", "0003 00000000 00008297 00001098 00000000 00000044")),
    ("NVRM: Xid (0000:01:00): 8, Channel 00000020", (8, "0000:01:00", "", "Channel 00000020")),
    ("NVRM: Xid (0000:01:00): 16, ", (16, "0000:01:00", "", "")),
    # the logs' prefixes: dmesg, dmesg -T, syslog, /dev/kmsg's record, an `nvidia-smi`-style function
    ("[176830.774761] NVRM: Xid (0000:03:00): 13, 0003", (13, "0000:03:00", "", "0003")),
    ("[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM",
     (13, "0000:cb:00", "", "pid='<unknown>', name=<unknown>, Graphics SM")),
    ("May 10 22:25:01 jambi kernel: [176830.774761] NVRM: Xid (0000:03:00): 13, 0003",
     (13, "0000:03:00", "", "0003")),
    ("3,4471,3023054882,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
     (79, "0000:3b:00", "", "pid=1234, GPU has fallen off the bus.")),
    ("NVRM: Xid (PCI:0000:b3:00.0): 79, pid=12345, GPU has fallen off the bus.",
     (79, "0000:b3:00", "", "pid=12345, GPU has fallen off the bus.")),
]
NOT_XIDS = [
    "NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.",  # the driver's line after an Xid 79: not an Xid itself
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
    "NVRM: Xid (PCI:0000:3b:00) 79, GPU has fallen off the bus.",  # no `): `: no driver writes this
    "NVRM: Xid (PCI:0000:3b): 79, a bus without a device",
    "pcieport 0000:00:03.1: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
]


def test_xid_line_shapes_of_every_driver_and_log_are_read_and_nothing_else() -> None:
    for line, (xid, bus, mig, text) in XID_SHAPES:
        got = parse_gpu.parse_xids([line], "iso", NOW)
        assert [(x.xid, x.bus_id, x.mig, x.text) for x in got] == [(xid, bus, mig, text)], line
    assert parse_gpu.parse_xids(NOT_XIDS, "iso", NOW) == []
    # the GPU tests read the same lines through the same decoder: one model, one parser
    from app.gpu.inventory import node_inventory

    inv = node_inventory("gpu01", {"smi": {"status": "missing"}, "xid_lines": [line for line, _ in XID_SHAPES],
                                   "xid_timed": "iso"})
    assert [x.xid for x in inv.xids] == [want[0] for _, want in XID_SHAPES]


def test_kmsg_and_syslog_times() -> None:
    (x,) = parse_gpu.parse_xids(["1759999990.5\tNVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."],
                                "epoch", NOW)
    assert x.age_s == 9.5
    (y,) = parse_gpu.parse_xids(["[ 1843.308145] NVRM: Xid (PCI:0000:b3:00.0): 79, pid=12345, GPU has fallen off "
                                 "the bus."], "iso", NOW)
    assert y.at is None and y.age_s is None, "seconds since boot are no wall-clock time: age unknown"


def test_ras_text_mismatch_names_the_rank_behind() -> None:
    version, comms, dead, timeouts = parse_gpu.parse_ras_text(recorded("ncclras-text-mismatch.txt"))
    assert version.startswith("2.26.2") and not dead and timeouts == 0
    (c,) = comms
    assert c.hash == "0x27a079b828ff1a75" and c.status == "RUNNING" and c.errors == "MISMATCH"
    assert c.op_groups == (("AllReduce", 6650, 31, ()), ("AllReduce", 6649, 1, (13,)))
    assert (c.ranks[0].rank, c.ranks[0].pid, c.ranks[0].host) == (13, 483093, "172.16.64.211")


def test_ras_text_incomplete_names_missing_rank_and_process() -> None:
    _, (c,), dead, timeouts = parse_gpu.parse_ras_text(recorded("ncclras-text-incomplete.txt"))
    assert c.missing == (21,) and timeouts == 2
    assert dead == ["process 3487984 on 172.16.64.213 (GPU 5): unresponsive"]


def test_ras_json_missing_rank_unresponsive() -> None:
    view = parse_gpu.ras_view({"status": "ok", "via": "ncclras", "format": "json",
                               "text": recorded("ncclras-json.json")})
    assert view is not None and view.format == "json" and view.nccl_version == "2.29.1"
    (c,) = view.comms
    assert c.missing == (1,) and c.size == 2
    gone = [r for r in c.ranks if r.missing][0]
    assert (gone.pid, gone.gpu, gone.unresponsive, gone.dead) == (1524345, 1, True, False)


def test_bad_ras_answer_is_a_failed_view_not_a_crash() -> None:
    view = parse_gpu.ras_view({"status": "ok", "format": "json", "text": "{not json"})
    assert view is not None and view.status == "failed" and "could not be read" in view.error


# -- the analysis -----------------------------------------------------------------------------------------------

def _rank(node: str, pid: int, rank: int, local: int, gpus=()) -> RankSnapshot:
    return RankSnapshot(node=node, pid=pid, start_time=1, rank=rank, local_rank=local, world_size=4,
                        gpus=tuple(gpus))


def _evidence(**kw) -> NodeGpuEvidence:
    gpus = parse_gpu.parse_gpu_csv(recorded("query-gpu.csv"), nvidia.GPU_FIELDS)
    base = dict(why="test", at=NOW, smi="ok", smi_timeout=5.0, gpus=tuple(gpus), xid_source="dmesg")
    base.update(kw)
    return NodeGpuEvidence(**base)


def _snap(evidence: dict, ranks) -> Snapshot:
    nodes = tuple(NodeStatus(name=n, state="done", gpu=evidence.get(n)) for n in ("gpu01", "gpu02"))
    return Snapshot(taken_at=NOW, nodes=nodes, ranks=tuple(ranks))


RANKS = [_rank("gpu01", 100, 0, 0), _rank("gpu01", 101, 1, 1), _rank("gpu02", 200, 2, 0), _rank("gpu02", 203, 3, 3)]
FRESH_79 = GpuXid(xid=79, bus_id="0000:5d:00", text="pid='<unknown>', GPU has fallen off the bus.",
                  at=NOW - 40, age_s=40.0)


def test_fresh_xid_on_a_stuck_ranks_gpu_is_the_lead() -> None:
    snap = _snap({"gpu02": _evidence(xids=(FRESH_79,))}, RANKS)
    (f,) = gpu_findings(snap, [], history=[snap])  # a second sample, no "progressing" finding: stuck
    assert f.kind == "gpu_fault" and f.confidence == "high" and f.culprit
    assert f.ranks == (("gpu02", 203),), "GPU 3 at 0000:5d:00, and rank 3 has LOCAL_RANK 3"
    for words in ("gpu02", "GPU 3", "0000:5d:00", "Xid 79", "fallen off the bus", "40 s before"):
        assert words in f.title, (words, f.title)
    assert "drain" in f.detail and "nvidia-smi -r -i 3" in f.detail and "--test pairs" in f.detail
    assert "4 uncorrectable ECC" in f.detail, "the GPU's own counters back the Xid"
    assert "LOCAL_RANK" in f.detail, "how the rank was tied to the GPU is said (a guess, here)"


def test_nvidia_smi_process_list_ties_the_gpu_to_its_rank() -> None:
    gpus = parse_gpu.parse_gpu_csv(recorded("query-gpu.csv"), nvidia.GPU_FIELDS)
    holder = _rank("gpu02", 201, 2, 0, gpus=[GpuUse(index=3, uuid=gpus[3].uuid)])
    snap = _snap({"gpu02": _evidence(xids=(FRESH_79,))}, [RANKS[0], RANKS[1], holder, RANKS[3]])
    (f,) = gpu_findings(snap, [], history=[snap])
    assert f.ranks == (("gpu02", 201),) and "nvidia-smi's process list" in f.detail


def test_gpu_evidence_on_a_progressing_job_is_a_low_note() -> None:
    snap = _snap({"gpu02": _evidence(xids=(FRESH_79,))}, RANKS)
    moving = Finding("progressing", "the job progresses", "", "high", "samples", culprit=True)
    (f,) = gpu_findings(snap, [moving], history=[snap])
    assert f.confidence == "low" and not f.culprit and "progresses" in f.reason


def test_one_sample_caps_at_medium() -> None:
    snap = _snap({"gpu02": _evidence(xids=(FRESH_79,))}, RANKS)
    (f,) = gpu_findings(snap, [], history=[])
    assert f.confidence == "medium" and "one sample" in f.reason


def test_stale_xid_is_said_to_predate_the_hang() -> None:
    xids = tuple(parse_gpu.parse_xids(_iso_lines(), "iso", NOW))
    old_only = tuple(x for x in xids if x.age_s > collector_fresh())
    snap = _snap({"gpu02": _evidence(xids=old_only)}, RANKS)
    out = gpu_findings(snap, [], history=[snap])
    stale = [f for f in out if "older Xid" in f.title]
    assert len(stale) == 1 and stale[0].confidence == "low" and not stale[0].culprit
    assert "predate the hang" in stale[0].title and "Xid 48, 63, 74, 119, 120" in stale[0].title
    assert not any(f.confidence == "high" for f in out), "old Xids never make a [high] culprit"


def collector_fresh() -> float:
    from app.analysis.gpu_evidence import FRESH_S
    return FRESH_S


def test_app_fault_xid_points_at_the_program() -> None:
    x31 = GpuXid(xid=31, bus_id="0000:2a:00", text="pid=2114, name=python, MMU Fault", at=NOW - 60, age_s=60.0)
    snap = _snap({"gpu01": _evidence(xids=(x31,))}, RANKS)
    f, ecc = gpu_findings(snap, [], history=[snap])
    assert "uncorrectable ECC" in ecc.title and "GPU 3" in ecc.title, "GPU 3's counters are said on their own"
    assert f.ranks == (("gpu01", 101),) and "page fault" in f.title
    assert "CUDA_LAUNCH_BLOCKING" in f.detail and "compute-sanitizer" in f.detail


def test_hung_nvidia_smi_is_a_finding_on_its_node() -> None:
    snap = _snap({"gpu02": _evidence(smi="timeout", gpus=(), smi_stuck=True)}, RANKS)
    (f,) = gpu_findings(snap, [], history=[snap])
    assert f.kind == "gpu_fault" and f.confidence == "high" and f.nodes == "gpu02"
    assert "did not answer within 5 s" in f.title and "stuck in the NVIDIA driver" in f.title
    assert set(f.ranks) == {("gpu02", 200), ("gpu02", 203)}


def test_nvidia_smi_hung_everywhere_is_not_one_nodes_fault() -> None:
    ev = _evidence(smi="timeout", gpus=())
    snap = _snap({"gpu01": ev, "gpu02": ev}, RANKS)
    out = gpu_findings(snap, [], history=[snap])
    assert len(out) == 2 and all(f.confidence == "medium" for f in out)
    assert all("common to them" in f.reason for f in out)


def _ras_evidence(comm: RasComm) -> NodeGpuEvidence:
    return _evidence(gpus=(), ras=RasView(status="ok", via="socket", format="json", comms=(comm,)))


def test_ras_missing_rank_is_named_with_its_process() -> None:
    comm = RasComm(hash="0xabc", size=4, missing=(3,), ranks=(
        RasRank(rank=0, host="10.0.0.1", pid=100, gpu=0, ops=(("AllReduce", 7),)),
        RasRank(rank=3, host="10.0.0.2", pid=203, gpu=3, missing=True, unresponsive=True)))
    snap = _snap({"gpu01": _ras_evidence(comm)}, RANKS)
    (f,) = gpu_findings(snap, [], history=[snap])
    assert f.kind == "nccl_ras" and f.ranks == (("gpu02", 203),) and f.confidence == "high"
    assert "rank 3" in f.title and "unresponsive" in f.title and "process 203" in f.detail


def test_ras_counts_that_differ_name_the_rank_behind_and_moving_counts_are_busy() -> None:
    def comm(behind: int, others: int) -> RasComm:
        return RasComm(hash="0xfeed", size=4, ranks=tuple(
            RasRank(rank=r.rank, host="h", pid=r.pid, gpu=r.local_rank,
                    ops=(("AllReduce", behind if r.rank == 2 else others),)) for r in RANKS))
    earlier = _snap({"gpu01": _ras_evidence(comm(41, 42))}, RANKS)
    stuck = _snap({"gpu01": _ras_evidence(comm(41, 42))}, RANKS)
    (f,) = gpu_findings(stuck, [], history=[earlier])
    assert f.ranks == (("gpu02", 200),) and "launched only 41 AllReduce" in f.title and f.confidence == "high"
    assert "did not move" in f.reason
    busy = _snap({"gpu01": _ras_evidence(comm(50, 51))}, RANKS)
    (g,) = gpu_findings(busy, [], history=[earlier])
    assert g.confidence == "low" and not g.culprit and "moved" in g.reason


def test_healthy_gpu_evidence_adds_nothing_and_the_lines_say_so() -> None:
    snap = _snap({"gpu01": _evidence(gpus=()), "gpu02": _evidence(gpus=())}, RANKS)
    assert gpu_findings(snap, [], history=[snap]) == []
    lines = evidence_lines(snap.nodes[0])
    assert lines[0].startswith("nvidia-smi: 0 GPU(s)") and "no Xid lines" in lines[1]


def test_gpu_finding_leads_the_verdict_of_a_stuck_job() -> None:
    snap = _snap({"gpu02": _evidence(xids=(FRESH_79,))}, RANKS)
    a = analyze(snap, history=[snap])
    assert a.findings[0].kind == "gpu_fault" and "Xid 79" in a.verdict


# -- the worker: fake tools on PATH, the real collector -------------------------------------------------------

def _fakes(tmp_path: Path, rank_pid: int, hang: bool = False) -> Path:
    bindir = tmp_path / "fakebin"
    gpus = recorded("query-gpu.csv")
    gpu_fakes.nvidia_smi(bindir, gpus=gpus, remap=recorded("remapped-rows.csv"),
                         apps=gpu_fakes.apps_csv({3: [rank_pid]}, gpus), hang=hang)
    gpu_fakes.dmesg(bindir, recorded("dmesg-xids.txt"))
    gpu_fakes.ncclras(bindir, text=recorded("ncclras-text-mismatch.txt"))  # an NCCL 2.26: no JSON
    return bindir


def test_worker_collects_gpu_evidence_once_per_collect_from_fake_tools(tmp_path) -> None:
    with start_rank(0) as t:
        bindir = _fakes(tmp_path, t.pid)
        with WorkerProc(env={"PATH": gpu_fakes.path_with(bindir)}) as w:
            items, done = w.call("collect", {"pids": [t.pid],
                                             "gpu_evidence": "on", "ras": True, "timeout": 20}, timeout=180)
            assert done["type"] == "done", done
            raw = [i["gpu_evidence"] for i in items if "gpu_evidence" in i]
            assert len(raw) == 1, "one per node per collect"
            ev = parse_gpu.gpu_evidence(raw[0])
            assert ev is not None and ev.smi == "ok" and ev.why == "--gpu-evidence on"
            assert [g.index for g in ev.gpus if g.remap_pending] == [3]
            assert ev.xid_source == "dmesg" and [x.xid for x in ev.xids][:2] == [79, 48]
            x79 = ev.xids[0]
            assert x79.age_s is not None and 30 <= x79.age_s <= 120, x79
            assert ev.ras is not None and ev.ras.via == "ncclras" and ev.ras.format == "text", \
                "the fake client refuses JSON like an NCCL < 2.28.7: the text form is read"
            assert ev.ras.comms[0].op_groups[-1] == ("AllReduce", 6649, 1, (13,))
            rank = [i["rank"] for i in items if "rank" in i and i["rank"]["pid"] == t.pid][0]
            assert rank["gpus"][0]["index"] == 3, "discovery's GPU use from the same fake nvidia-smi"
            # auto: this rank maps neither libnccl nor libcuda, so nothing is collected, at no cost
            items, _ = w.call("collect", {"pids": [t.pid],
                                          "gpu_evidence": "auto", "ras": True, "timeout": 20}, timeout=180)
            assert not [i for i in items if "gpu_evidence" in i]
            items, _ = w.call("collect", {"pids": [t.pid], "timeout": 20}, timeout=180)
            assert not [i for i in items if "gpu_evidence" in i], "off unless asked"


def test_nvidia_smi_that_never_answers_is_killed_at_its_deadline_and_said(tmp_path) -> None:
    # The FAKE nvidia-smi sleeps for an hour, as one does on a node whose GPU fell off the bus.
    with start_rank(0) as t:
        bindir = _fakes(tmp_path, t.pid, hang=True)
        with WorkerProc(env={"PATH": gpu_fakes.path_with(bindir)}) as w:
            started = time.monotonic()
            items, done = w.call("collect", {"pids": [t.pid],
                                             "gpu_evidence": "on", "ras": False, "timeout": 20}, timeout=120)
            took = time.monotonic() - started
            assert done["type"] == "done", done
            # discovery's query (5 s) and the collector's (skipped: it knows) are the deadlines that apply;
            # the margin is for a loaded machine, far below the fake's hour
            assert took < 5.0 * 2 + 30, took
            ev = parse_gpu.gpu_evidence([i for i in items if "gpu_evidence" in i][0]["gpu_evidence"])
            assert ev is not None and ev.smi == "timeout" and ev.smi_timeout == 5.0
            assert [x.xid for x in ev.xids][0] == 79, "the kernel log is still read"
            # SIGKILLed at its deadline: on a loaded machine the killed process may take a moment to be scheduled
            # and exit; one that was not killed sleeps for its hour
            gone_by = time.monotonic() + 10.0
            while _fake_processes_alive(bindir) and time.monotonic() < gone_by:
                time.sleep(0.1)
            assert not _fake_processes_alive(bindir), "the sleeping nvidia-smi was killed"
            rank = [i["rank"] for i in items if "rank" in i and i["rank"]["pid"] == t.pid][0]
            notes = [i["discovered"] for i in items if "discovered" in i][0]["notes"]
            assert rank["gpus"] == [] and any("timed out after 5s" in n for n in notes)
    node = NodeStatus(name="gpu02", state="done", gpu=dataclasses.replace(ev, xids=()))
    snap = Snapshot(taken_at=NOW, nodes=(node,), ranks=(_rank("gpu02", t.pid, 0, 0),))
    (f,) = gpu_findings(snap, [], history=[snap])
    assert "nvidia-smi on gpu02 did not answer within 5 s" in f.title and f.confidence == "high"


def _fake_processes_alive(bindir: Path) -> bool:
    """This test's FAKE nvidia-smi still runs (other tests, in other xdist workers, run FAKEs of their own)."""
    mine = str(bindir / "nvidia-smi").encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mine in cmd and state not in "ZX":
            return True
    return False


# -- NCCL RAS over its socket: the real protocol against a stand-in server -------------------------------------

class _RasServer:
    """A stand-in for NCCL's RAS listener: speaks the client protocol of src/ras/client_support.cc (CLIENT
    PROTOCOL / TIMEOUT / SET FORMAT / STATUS) and answers with a recorded status. json=False answers SET FORMAT
    as an NCCL older than 2.28.7 does (ERROR: Unknown command)."""

    def __init__(self, text: str, json_text: str = "", silent: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.text, self.json, self.silent = text, json_text, silent
        self.commands: list = []
        self.closed = threading.Event()  # a silent server holds its client until closed, then ends
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:  # closed before a client came
            return
        fmt = "text"
        with conn:
            f = conn.makefile("rb")
            for raw in f:
                cmd = raw.decode().strip()
                self.commands.append(cmd)
                if self.silent:
                    self.closed.wait(60)
                    return
                up = cmd.upper()
                if up.startswith("CLIENT PROTOCOL"):
                    conn.sendall(b"SERVER PROTOCOL 2\n")
                elif up.startswith("TIMEOUT"):
                    conn.sendall(b"OK\n")
                elif up.startswith("SET FORMAT"):
                    if self.json:
                        fmt = "json"
                        conn.sendall(b"OK\n")
                    else:
                        conn.sendall(("ERROR: Unknown command %s\n" % cmd).encode())
                elif up == "STATUS":
                    conn.sendall((self.json if fmt == "json" else self.text).encode())
                    return

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes an accept() that no client came to
        self.sock.close()
        self.thread.join(10)


def test_ras_socket_json_from_a_new_nccl() -> None:
    server = _RasServer(recorded("ncclras-text-incomplete.txt"), json_text=recorded("ncclras-json.json"))
    try:
        raw = collector._ras_socket("127.0.0.1", server.port, time.monotonic() + 10)
    finally:
        server.close()
    assert raw["status"] == "ok" and raw["format"] == "json" and raw["protocol"] == "2"
    assert server.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 3", "SET FORMAT json", "STATUS"]
    view = parse_gpu.ras_view(raw)
    assert view is not None and view.comms[0].missing == (1,)


def test_ras_socket_text_from_an_older_nccl() -> None:
    server = _RasServer(recorded("ncclras-text-incomplete.txt"))
    try:
        raw = collector._ras_socket("127.0.0.1", server.port, time.monotonic() + 10)
    finally:
        server.close()
    view = parse_gpu.ras_view(raw)
    assert view is not None and view.format == "text" and view.comms[0].missing == (21,)


def test_ras_that_never_answers_costs_its_deadline_only() -> None:
    server = _RasServer("", silent=True)
    try:
        started = time.monotonic()
        raw = collector._ras_socket("127.0.0.1", server.port, time.monotonic() + 1.0)
        assert time.monotonic() - started < 1.0 + 10  # the 1 s deadline, with a margin for a loaded machine
    finally:
        server.close()
    assert raw["status"] == "timeout"


def test_no_ras_listening_is_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        raw = collector._ras_socket("127.0.0.1", port, time.monotonic() + 5)
    assert raw["status"] == "refused"


def test_ras_address_from_the_ranks_environment() -> None:
    assert collector.ras_address([None, {"NCCL_RAS_ADDR": "127.0.0.1:29999"}]) == ("127.0.0.1", 29999, True)
    assert collector.ras_address([{"NCCL_RAS_ENABLE": "0"}])[2] is False
    assert collector.ras_address([{}]) == ("localhost", 28028, True)


# -- where a user reads it: --print, the report bundle, the TUI's node panel --------------------------------------

def test_print_report_and_tui_show_the_gpu_evidence(tmp_path) -> None:
    from app.analysis.text import summary_text
    from app.report import export_bundle
    from app.ui.view import node_groups

    hostile = GpuXid(xid=79, bus_id="0000:5d:00", text="[bold red]x[/] <script>alert(1)</script>", at=NOW - 40,
                     age_s=40.0)
    snap = _snap({"gpu02": _evidence(xids=(hostile,))}, RANKS)
    a = analyze(snap, history=[snap])
    text = summary_text(snap, a)
    assert "GPU evidence:" in text and "gpu02: Xid 79 on 0000:5d:00 40 s before the snapshot" in text
    assert "gpu02: nvidia-smi: 8 GPU(s); GPU 3: 4 uncorrectable ECC errors" in text
    result = export_bundle(snap, a, str(tmp_path / "bundle"), history=[snap])
    md = (Path(result.directory) / "summary.md").read_text()
    html = (Path(result.directory) / "report.html").read_text()
    assert "## GPU evidence" in md and "Xid 79 on 0000:5d:00" in md
    assert "<h2 id=\"gpu\">GPU evidence</h2>" in html and "<script>alert" not in html
    (group,) = [g for g in node_groups(snap.nodes, snap.ranks)]
    assert any(line.startswith("gpu02: Xid 79 on 0000:5d:00") for line in group.gpu)
    assert not any(line.startswith("gpu01") for line in group.gpu), "gpu01 has no evidence"


def test_redacted_uuids_do_not_tie_every_rank_to_the_gpu() -> None:
    # GPU uuids are high-entropy text: the node's redaction may turn them into *** on both sides
    gpus = tuple(dataclasses.replace(g, uuid="***") for g in
                 parse_gpu.parse_gpu_csv(recorded("query-gpu.csv"), nvidia.GPU_FIELDS))
    ranks = [_rank("gpu02", 200, 2, 0, gpus=[GpuUse(index=0, uuid="***")]),
             _rank("gpu02", 203, 3, 1, gpus=[GpuUse(index=3, uuid="***")])]
    snap = _snap({"gpu02": _evidence(gpus=gpus, xids=(FRESH_79,))}, ranks)
    (f,) = gpu_findings(snap, [], history=[snap])
    assert f.ranks == (("gpu02", 203),) and "nvidia-smi's process list" in f.detail


def test_gpu_evidence_collector_on_the_oldest_supported_python(tmp_path) -> None:
    import testenv

    py39 = testenv.other_python("3.9")
    if not os.path.exists(py39):
        import pytest

        pytest.skip("no python3.9 here")
    with start_rank(0) as t:
        bindir = _fakes(tmp_path, t.pid)
        with WorkerProc(python=py39, isolated=True, env={"PATH": gpu_fakes.path_with(bindir)}) as w:
            assert w.hello["python"].startswith("3.9")
            items, done = w.call("collect", {"pids": [t.pid],
                                             "gpu_evidence": "on", "ras": True, "timeout": 20}, timeout=180)
            assert done["type"] == "done", done
            ev = parse_gpu.gpu_evidence([i for i in items if "gpu_evidence" in i][0]["gpu_evidence"])
            assert ev is not None and ev.smi == "ok" and ev.xids[0].xid == 79 and ev.ras.status == "ok"


def test_a_collector_past_its_deadline_sends_what_answered(monkeypatch) -> None:
    monkeypatch.setattr(collector, "TOTAL_TIMEOUT", 0.2)
    box = {"partial": {"why": "test", "smi": {"status": "ok"}, "notes": []}}
    slow = threading.Thread(target=time.sleep, args=(5,), daemon=True)  # a source that does not answer
    slow.start()
    out = collector.finish(slow, box, time.monotonic())
    assert out is not None and out["incomplete"] and out["smi"] == {"status": "ok"}
    assert "did not finish within 0.2s" in out["notes"][-1] and box["partial"]["notes"] == []


def test_a_gpu_finding_that_other_evidence_contradicts_is_not_high() -> None:
    snap = _snap({"gpu02": _evidence(xids=(FRESH_79,))}, RANKS)
    elsewhere = Finding("minority_stack", "rank 0 is in `load`", "", "high", "1 against 3", ranks=(("gpu01", 100),),
                        ranks_label="rank 0 on gpu01")
    (f,) = gpu_findings(snap, [elsewhere], history=[snap])
    assert f.confidence == "medium" and "singles out rank 0 on gpu01" in f.reason
    same = Finding("minority_stack", "rank 3 is in `sync`", "", "high", "1 against 3", ranks=(("gpu02", 203),))
    (g,) = gpu_findings(snap, [same], history=[snap])
    assert g.confidence == "high" and "the same rank" in g.reason


def test_the_gpu_tests_read_the_node_with_the_investigations_reader(tmp_path) -> None:
    # gpu_inventory (the GPU tests, before they run) is workers/collect/nvidia.py read(), with the holders
    from app.gpu.inventory import busy, node_inventory

    with start_rank(0) as t:
        bindir = _fakes(tmp_path, t.pid)
        with WorkerProc(env={"PATH": gpu_fakes.path_with(bindir)}) as w:
            _, done = w.call("gpu_inventory", {}, timeout=120)
    assert done["type"] == "done", done
    assert done["data"]["smi"]["via"] == "nvidia-smi" and done["data"]["smi"]["gpu_fields"] == nvidia.GPU_FIELDS
    inv = node_inventory("gpu02", done["data"])
    assert inv.source == "nvidia-smi" and len(inv.gpus) == 8
    assert [(g.index, g.memory_used_mib, g.utilization_pct, g.remap_pending) for g in inv.gpus][3] == (3, 30229, 0, True)
    assert [(h.pid, h.used_mib, h.process) for h in inv.holders] == [(t.pid, 30211, "/usr/bin/python3")]
    assert [node for node, _ in busy([inv])] == ["gpu02"]
    assert [x.xid for x in inv.xids][:2] == [79, 48] and inv.xids[0].age_s is not None


def test_a_dmesg_without_options_is_read_with_its_boot_times(tmp_path) -> None:
    # busybox's dmesg (a container's) refuses --kernel and --time-format: the plain one is read, its seconds since
    # boot turned into wall-clock times on the node, as /dev/kmsg's are
    bindir = tmp_path / "fakebin"
    gpu_fakes.dmesg(bindir, recorded("dmesg-xids.txt"), busybox=True)
    with WorkerProc(env={"PATH": gpu_fakes.path_with(bindir)}) as w:
        _, done = w.call("gpu_inventory", {}, timeout=120)
    raw = done["data"]
    assert raw["xid_source"] == "dmesg" and raw["xid_timed"] == "epoch", raw
    ev = parse_gpu.gpu_evidence(raw)
    assert ev is not None and [x.xid for x in ev.xids][:2] == [79, 48]
    assert 30 <= (ev.xids[0].age_s or 0) <= 120, ev.xids[0]
    assert ev.xids[5].bus_id == "0000:ab:00", "the old shape (no `PCI:`) in a plain dmesg"


def test_without_nvidia_smi_nvml_is_read_through_ctypes_in_a_child(tmp_path) -> None:
    import shutil

    import pytest

    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the FAKE libnvidia-ml")
    lib = gpu_fakes.fake_nvml(tmp_path / "lib")
    bindir = tmp_path / "fakebin"
    gpu_fakes.dmesg(bindir, recorded("dmesg-xids.txt"))  # no nvidia-smi on this PATH
    with start_rank(0) as t, WorkerProc(env={"PATH": gpu_fakes.path_with(bindir),
                                             "LD_LIBRARY_PATH": str(lib.parent)}) as w:
        items, done = w.call("collect", {"pids": [t.pid],
                                         "gpu_evidence": "on", "ras": False, "timeout": 20}, timeout=180)
        assert done["type"] == "done" and t.pid
        raw = [i["gpu_evidence"] for i in items if "gpu_evidence" in i][0]
    assert raw["smi"]["via"] == "nvml", raw["smi"]
    ev = parse_gpu.gpu_evidence(raw)
    assert ev is not None and ev.smi == "ok"
    assert [(g.index, g.bus_id, g.ecc_uncorrected_volatile, g.remap_pending) for g in ev.gpus] == [
        (0, "00000000:3B:00.0", 0, False), (1, "00000000:5D:00.0", 2, True)]
    assert [(g.memory_used_mib, g.memory_total_mib, g.utilization_pct, g.temperature_c) for g in ev.gpus] == [
        (4, 81559, 100, 40), (30211, 81559, 0, 41)]
    assert ev.processes == (), "the investigation does not ask who holds the GPUs"
    with WorkerProc(env={"PATH": gpu_fakes.path_with(bindir), "LD_LIBRARY_PATH": str(lib.parent)}) as w:
        _, done = w.call("gpu_inventory", {}, timeout=120)
    from app.gpu.inventory import node_inventory

    inv = node_inventory("gpu01", done["data"])
    assert inv.source == "nvml" and [(h.pid, h.used_mib) for h in inv.holders] == [(4242, 30211)]
    assert inv.holders[0].uuid == inv.gpus[1].uuid, "held: the second GPU (its uuid as redaction left it)"


def test_auto_collects_for_a_rank_that_maps_libnccl(tmp_path) -> None:
    # A real library mapped under NCCL's file name (a copy of libm, loaded with dlopen): the rank maps a
    # libnccl.so.2 as a CUDA torch's ranks do, and "auto" collects; the CPU rank beside it alone would not.
    import ctypes.util
    import shutil
    import sys

    from worker_targets import Target, rank_env

    libm = ctypes.util.find_library("m")
    assert libm, "libm is everywhere"
    src = next(p for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
                           "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
               for p in [os.path.join(d, libm)] if os.path.exists(p))
    nccl = tmp_path / "libnccl.so.2"
    shutil.copy(src, nccl)
    prog = ("import ctypes, os, sys, time; ctypes.CDLL(sys.argv[1]); print('ready %d' % os.getpid(), flush=True); "
            "time.sleep(120)")
    t = Target([sys.executable, "-c", prog, str(nccl)], env=rank_env(1))
    try:
        bindir = _fakes(tmp_path, t.proc.pid)
        with WorkerProc(env={"PATH": gpu_fakes.path_with(bindir)}) as w:
            items, _ = w.call("collect", {"pids": [t.proc.pid], "gpu_evidence": "auto", "ras": False,
                                          "timeout": 20}, timeout=180)
            (raw,) = [i["gpu_evidence"] for i in items if "gpu_evidence" in i]
            assert raw["why"] == "pid %d maps libnccl.so" % t.proc.pid
    finally:
        t.kill()


def test_hostile_or_malformed_evidence_never_raises() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
                          lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                       max_size=4), max_leaves=20)
    keys = st.sampled_from(["why", "at", "smi", "xid_lines", "xid_timed", "ras", "notes", "gpus_csv", "text",
                            "status", "format", "gpu_fields", "query_text"])

    @settings(max_examples=60, deadline=None)
    @given(st.dictionaries(keys, values, max_size=8), st.dictionaries(keys, values, max_size=6))
    def check(raw: dict, inner: dict) -> None:
        raw = dict(raw)
        if "smi" in raw:
            raw["smi"] = inner
        if "ras" in raw:
            raw["ras"] = dict(inner, status="ok")
        ev = parse_gpu.gpu_evidence(raw)
        assert ev is not None
        node = NodeStatus(name="n", gpu=ev)
        evidence_lines(node)
        gpu_findings(Snapshot(taken_at=NOW, nodes=(node,), ranks=(_rank("n", 1, 0, 0),)), [], history=[])

    check()
    for text in ("{", "#0-0 (zz) INCOMPLETE\nRank x", "Rank 3 -- GPU 1 managed by process 9 on node h\n" * 3,
                 "\x00\x1b[31m" * 100):
        view = parse_gpu.ras_view({"status": "ok", "text": text})
        assert view is not None
