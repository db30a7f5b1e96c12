"""SIMULATION, not a cluster: recorded worker replies replayed as N nodes through the real login-side code.

What is real: the login side, unchanged: Session (its passes, gate, deadlines), WorkerConnection (the reader,
requests routed by id), app.decode, the model, the analysis and the headless report (headless.report(), the
text `--print` writes). What is FAKE: only the connection opening. FakeConnector.open() hands the Session a
WorkerConnection over in-memory streams fed by a FakeReplayWorker, which answers each request with replies
recorded once from a real worker on the test cluster (bench/data/scale_replies.json, `--record`; asked for as a
session past 64 nodes asks: per thread only the locals the analysis reads), renumbered per node (RANK,
GROUP_RANK, WORLD_SIZE, the hostname). The recording holds two passes of one worker (a cold
snapshot, then a refresh: in the compact form the refresh carries no stack table) as plain lines; each FAKE node
compresses them into its own zlib stream as its worker would (workers/server.py), prebuilt before the clock
starts, so compression costs the node's CPU, not the login side's, as on a real cluster. So no SSH key exchange, no channel decryption, no node
CPU is in the figures: on a real cluster the key exchange is ~10 ms of login CPU per node over SSH (none over
srun or through relays, docs/performance.md), and every node dumps on its own cores.

Per size, in a fresh process each (peak memory is the process's own):
  first headline  wall seconds from the Session's creation to the first pass's summary text (the headline of
                  `--print --samples 1`; the TUI's first picture is --ui's)
  CPU ms/node     this process's CPU seconds per node (user + system), minus the FAKE's own (building and feeding
                  the replayed bytes, measured apart), for the first pass with its analysis and summary
  GC %            the share of that CPU spent in the garbage collector (gc.callbacks)
  bytes/node      what the FAKE workers sent per node and pass (the bytes an SSH channel would carry)
  peak MB         the process's peak RSS (ru_maxrss) at the end
  refresh         the second pass (Session.refresh(), as --print's default second sample and the TUI's `r`):
                  wall, CPU ms/node, and how many nodes that answered it were marked as timed out
With --write, three more columns: the second report (analysis of both samples and the summary) without and with
the snapshot file `--snapshot` writes after it (default-deny sharing, the JSON, a temporary folder), and the file's
size.
A watchdog stops a size that passes --max-gb of RSS or --max-seconds and prints how far it got.

With --ui each size runs through the TUI instead (HangscopeApp headless under Textual's test driver, 160x50, as
`hangscope HOSTS` opens it; every session event goes through the app as it does live):
  TUI first picture  wall seconds from the app's creation to the first snapshot analysed and drawn (the verdict
                     line, the grid), CPU ms/node as above; session events: node and rank updates the app took
  TUI refresh        `R` pressed and confirmed: wall seconds to the second snapshot drawn (the FAKE replays two
                     passes: a third pass's replayed bytes would not continue the node's zlib stream)

    python3 bench/scale.py [--sizes 100,1000,12500] [--shape small|small_ranked|deep|deep_ranked] [--bytecode] [--ui]
    sudo python3 bench/scale.py --record     # re-record bench/data/scale_replies.json on the test cluster
    python3 bench/scale.py --before main     # the same table for main's code (login side and worker replies),
                                             # measured by the bench and recording of BASELINE_BENCH
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import io
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support"), str(ROOT / "tests")]

from app.errors import TransportError  # noqa: E402
from app.hosts import HostSpec  # noqa: E402
from app.model import CollectOptions  # noqa: E402
from app.session import Session, SessionOptions  # noqa: E402
from app.session.session import COMPRESS_WINDOW  # noqa: E402  (the window Session asks its workers for)
from app.transport import base  # noqa: E402
from app.transport.base import ExitInfo, WorkerConnection  # noqa: E402

DATA = ROOT / "bench" / "data" / "scale_replies.json"
RANKS_RECORDED = 8
DISCOVER_DELAY = 0.01  # seconds a FAKE node takes to discover (measured: ~3-4 ms of CPU on the test cluster)
DUMP_DELAY = 0.05  # ... and to dump its ranks after discovery or `go` (8 py-spy runs in parallel on its cores)


class FakeCpu:
    """CPU seconds the FAKE spends (building and feeding replayed bytes): taken out of the login side's figure."""

    seconds = 0.0
    bytes = 0

    @classmethod
    def timed(cls, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                cls.seconds += time.process_time() - t
        return wrapper


# -- the recorded replies, as per-node byte templates -------------------------------------------------------

@dataclass
class Recording:
    """One recorded node, as %-templates (%(id)d, %(host)s, %(node)d, %(world)d, %(r<i>)d per local rank): the
    hello, and per pass the messages up to and including "discovered" and those after it (a cold pass's dumps
    wait for `go`). Pass 2 is a refresh on the same worker: a compact one sends no stack it sent before."""

    hello: bytes
    before: List[List[bytes]]  # [pass 1, pass 2]
    after: List[List[bytes]]
    compressed: bool  # the worker sent zlib frames (its hello said so)


def _template(msg: Dict[str, Any], marks: Dict[str, str]) -> bytes:
    """The message as one JSON line in which each marker becomes a %-format field: a marker that is a whole
    JSON string becomes a number (the field's %d), one inside a longer string stays text; @HOST@ stays a string."""
    text = json.dumps(msg, ensure_ascii=True, separators=(",", ":")).replace("%", "%%")
    for marker, field in marks.items():
        if not marker.startswith("@HOST"):
            text = text.replace('"%s"' % marker, field)
        text = text.replace(marker, field)
    return text.encode("ascii") + b"\n"


def _numbered(msg: Dict[str, Any]) -> Dict[str, Any]:
    """A rank item renumbered with markers: its RANK, GROUP_RANK and WORLD_SIZE become the node's."""
    data = msg.get("data") or {}
    if "rank" not in data:
        return msg
    item = dict(data["rank"])
    local = item["local_rank"]
    item.update(rank=f"@R{local}@", group_rank="@NODE@", world_size="@WORLD@")
    item["env"] = [[k, {"RANK": f"@R{local}@", "GROUP_RANK": "@NODE@", "WORLD_SIZE": "@WORLD@"}.get(k, v)]
                   for k, v in item.get("env") or []]
    return dict(msg, data={"rank": item})


def _own_locals(msgs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The deep recording as a job that passes its rank down its stack: the stand-in's `ready` argument (a path
    ending in the local rank, in every frame of its recursion) ends in the rank's global number instead, so no
    two ranks of the simulated job keep the same locals (the recording's 8 ranks repeat on every node)."""
    local = {m["data"]["rank"]["pid"]: m["data"]["rank"]["local_rank"] for m in msgs
             if "rank" in (m.get("data") or {})}
    out = []
    for m in msgs:
        dump = (m.get("data") or {}).get("dump")
        if isinstance(dump, dict) and dump.get("pid") in local:
            n = local[dump["pid"]]
            threads = [dict(t, locals=[[i, name, value.replace(f"ready-{n}\"", f"ready-@R{n}@\"") if name == "ready"
                                        else value, arg] for i, name, value, arg in t.get("locals") or []])
                       for t in dump.get("threads") or []]
            m = dict(m, data={"dump": dict(dump, threads=threads)})
        out.append(m)
    return out


# shape -> the recording it replays; a *_ranked shape gives every simulated rank locals of its own (_own_locals)
SHAPES = {"small": "small", "small_ranked": "small", "deep": "deep", "deep_ranked": "deep"}


def load_recording(shape: str) -> Recording:
    rec = json.loads(DATA.read_text())[SHAPES[shape]]
    if shape.endswith("_ranked"):
        rec = dict(rec, passes=[_own_locals(msgs) for msgs in rec["passes"]])
    marks = {"@HOST@": "%(host)s", "@ID@": "%(id)d", "@NODE@": "%(node)d", "@WORLD@": "%(world)d"}
    marks.update({f"@R{i}@": f"%(r{i})d" for i in range(RANKS_RECORDED)})
    before: List[List[bytes]] = []
    after: List[List[bytes]] = []
    for msgs in rec["passes"]:
        lines = [_template(_numbered(dict(m, id="@ID@")), marks) for m in msgs]
        cut = next(i for i, m in enumerate(msgs) if "discovered" in (m.get("data") or {})) + 1
        before.append(lines[:cut])
        after.append(lines[cut:])
    hello = rec["hello"]
    return Recording(_template(dict(hello, hostname="@HOST@"), {"@HOST@": "%(host)s"}), before, after,
                     hello.get("compress") == "zlib")


# -- the FAKE transport ------------------------------------------------------------------------------------

class FakeStdout:
    """A ByteReader over bytes the FAKE worker feeds (as an SSH channel's reader would give them)."""

    def __init__(self) -> None:
        self._chunks: Deque[bytes] = deque()
        self._waiter: Optional[asyncio.Future[None]] = None
        self._eof = False

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        FakeCpu.bytes += len(data)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def feed_eof(self) -> None:
        self._eof = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self, n: int = -1) -> bytes:
        while not self._chunks:
            if self._eof:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = self._chunks.popleft()
        if 0 < n < len(data):
            self._chunks.appendleft(data[n:])
            data = data[:n]
        return data


def failing(index: int, fraction: float) -> str:
    """How FAKE node `index` fails when a `fraction` of the nodes do, scattered over the list: "" (it does not),
    "unreachable" (its connection times out), "crash" (its worker dies after discovery) or "dump" (one of its
    ranks could not be dumped)."""
    if (index * 7919) % 10007 >= fraction * 10007:
        return ""
    return ("unreachable", "unreachable", "crash", "dump")[index % 4]


# The request ids the Session will use (app/transport/base.py counts them for the process; the bench restarts the
# count): the cold pass's `go` and collect, then the refresh's collect. The FAKE builds each node's replies before
# the clock starts for these ids, and builds them when asked for any other (correct, but on the clock).
PREDICTED_IDS = (2, 3)  # pass 1 collect (its go is 1), pass 2 collect


class FakeNode:
    """FAKE: one node's replayed byte stream, built from the recording (renumbered, and compressed as its worker
    would: one zlib stream across the connection's messages)."""

    def __init__(self, rec: Recording, index: int, name: str, ranks: int, world: int, fails: str) -> None:
        self.rec = rec
        self.fails = fails
        self.values: Dict[bytes, Any] = {b"host": name.encode(), b"node": index, b"world": world}
        self.values.update({b"r%d" % i: index * ranks + i for i in range(RANKS_RECORDED)})
        self.built: Dict[int, Tuple[bytes, bytes]] = {}  # pass number -> (before, after)
        self.ids: Dict[int, int] = {}  # pass number -> the request id its bytes carry
        self.connections = 0
        # No compressor is kept between builds: one holds ~270 KB, which at 12,500 nodes would be gigabytes in
        # the FAKE's memory. A zlib stream is one history, so a pass built later (another request id than the
        # predicted one) is compressed by a new compressor that first replays the passes before it, exactly as
        # they were sent (zlib's output is a function of its input).

    def connect(self) -> None:
        """A new connection to this node: a new worker, so a new zlib stream and nothing prebuilt for it."""
        self.connections += 1
        if self.connections > 1:
            self.built, self.ids = {}, {}

    def _pack(self, z: Any, lines: List[bytes]) -> bytes:
        if z is None:
            return b"".join(lines)
        out = []
        for line in lines:
            packed = z.compress(line) + z.flush(zlib.Z_SYNC_FLUSH)
            out.append(b"z %d\n" % len(packed) + packed)
        return b"".join(out)

    def _pass(self, z: Any, number: int, rid: int) -> Tuple[bytes, bytes]:
        """Pass `number`'s (0 or 1) bytes before and after "discovered", for request id `rid`, through `z`."""
        v = {**self.values, b"id": rid}
        after = [t % v for t in self.rec.after[number]]
        if self.fails == "dump":
            first = next(i for i, line in enumerate(after) if line.startswith(b'{"type":"item"') and b'"dump"' in line)
            msg = json.loads(after[first])
            msg["data"]["dump"].update(ok=False, pyspy=None, threads=None, error={
                "code": "timeout", "message": "FAKE: py-spy did not finish within its deadline", "hint": ""})
            after[first] = json.dumps(msg).encode() + b"\n"
        return self._pack(z, [t % v for t in self.rec.before[number]]), self._pack(z, after)

    def prebuild(self, rids: Tuple[int, ...]) -> None:
        """Every pass's bytes for the predicted request ids, through one compressor, dropped afterwards."""
        z = zlib.compressobj(6, zlib.DEFLATED, COMPRESS_WINDOW) if self.rec.compressed else None
        for number, rid in enumerate(rids):
            self.built[number] = self._pass(z, number, rid)
            self.ids[number] = rid

    @FakeCpu.timed
    def build(self, number: int, rid: int) -> Tuple[bytes, bytes]:
        """Pass `number` for request id `rid`, on the clock (not predicted); what was prebuilt after it is dropped
        (its frames followed the old bytes in the stream)."""
        z = zlib.compressobj(6, zlib.DEFLATED, COMPRESS_WINDOW) if self.rec.compressed else None
        for k in range(number):  # the stream as it was sent up to this pass
            self._pass(z, k, self.ids[k])
        got = self._pass(z, number, rid)
        self.ids[number] = rid
        for later in [k for k in self.built if k > number]:
            del self.built[later]
        return got

    def take(self, number: int, rid: int) -> Tuple[bytes, bytes]:
        got = self.built.pop(number, None)
        if got is None or self.ids.get(number) != rid:
            got = self.build(number, rid)
        return got


class FakeReplayWorker:
    """FAKE: answers the login side's requests with one node's recorded replies (a ByteWriter)."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node
        node.connect()
        self.stdout = FakeStdout()
        self.passes = 0
        self._buf = b""
        self._held: Dict[int, asyncio.TimerHandle] = {}
        self._after: Dict[int, bytes] = {}
        self.exit: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()

    def hello(self) -> None:
        self.stdout.feed(self.node.rec.hello % self.node.values)

    # ByteWriter
    @FakeCpu.timed
    def write(self, data: bytes) -> None:
        self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            if line.strip():
                self._request(json.loads(line))

    async def drain(self) -> None:
        return None

    def write_eof(self) -> None:
        self._end()

    def close(self) -> None:
        self._end()

    def _end(self, how: Optional[ExitInfo] = None) -> None:
        if not self.exit.done():
            self.stdout.feed_eof()
            self.exit.set_result(how or ExitInfo(0))

    def _plain(self, text: bytes) -> None:
        # a short reply goes as a plain JSON line (the protocol lets lines and frames mix): compressing it would
        # put it in the zlib stream between the prebuilt passes, whose frames must follow each other in it
        self.stdout.feed(text)

    def _request(self, req: Dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        rid, op, args = req["id"], req["op"], req.get("args") or {}
        if op == "collect":
            hold = float(args.get("hold") or 0.0)
            number = min(self.passes, 1)
            self.passes += 1
            loop.call_later(DISCOVER_DELAY, self._discovered, rid, number, hold)
        elif op == "go":
            handle = self._held.pop(args.get("target"), None)
            if handle is not None:
                handle.cancel()
                loop.call_later(DUMP_DELAY, self._dumps, args["target"])
            self._plain(b'{"type":"done","id":%d,"data":{"released":%s}}\n'
                        % (rid, b"true" if handle is not None else b"false"))
        elif op == "cancel":
            self._plain(b'{"type":"done","id":%d,"data":{"cancelled":false}}\n' % rid)
        else:
            self._plain(b'{"type":"error","id":%d,"code":"unknown_op","message":"FAKE","hint":""}\n' % rid)

    @FakeCpu.timed
    def _discovered(self, rid: int, number: int, hold: float) -> None:
        before, self._after[rid] = self.node.take(number, rid)
        self.stdout.feed(before)
        if hold > 0:
            self._held[rid] = asyncio.get_running_loop().call_later(hold, self._dumps, rid)
        else:
            asyncio.get_running_loop().call_later(DUMP_DELAY, self._dumps, rid)

    @FakeCpu.timed
    def _dumps(self, rid: int) -> None:
        self._held.pop(rid, None)
        if self.node.fails == "crash":  # the worker dies after discovery (killed: an OOM on the node, say)
            return self._end(ExitInfo(None, signal="SIGKILL"))
        self.stdout.feed(self._after.pop(rid, b""))


class FakeConnector:
    """FAKE: opens a FakeReplayWorker per node instead of connecting (no SSH, no srun, no process)."""

    def __init__(self, rec: Recording, names: List[str], ranks: int, fail: float = 0.0) -> None:
        world = len(names) * ranks
        self.nodes = {n: FakeNode(rec, i, n, ranks, world, failing(i, fail)) for i, n in enumerate(names)}

    def prebuild(self) -> None:
        """Every node's replies for the predicted request ids, before the clock starts (see PREDICTED_IDS)."""
        for node in self.nodes.values():
            if node.fails != "unreachable":
                node.prebuild(PREDICTED_IDS)

    async def open(self, spec: HostSpec) -> WorkerConnection:
        node = self.nodes[spec.name]
        if node.fails == "unreachable":
            raise TransportError("connect_timeout", f"{spec.name}: FAKE: no TCP connection within the connect "
                                 "deadline", phase="connect")
        fake = FakeReplayWorker(node)

        async def wait_exit() -> ExitInfo:
            return await asyncio.shield(fake.exit)

        conn = WorkerConnection(spec.name, fake.stdout, fake, None, wait_exit, kill=fake.close)
        FakeCpu.timed(fake.hello)()
        await conn.start(b"", 30.0)
        return conn


class FakeOptions(SessionOptions):
    """SessionOptions whose connector is the FAKE one: the only change to the login side."""

    fake: Optional[FakeConnector] = None

    def connector(self, worker_options: Any, *, push_pyspy: bool = True) -> Any:
        assert self.fake is not None
        return self.fake


# -- one size --------------------------------------------------------------------------------------------

class GcMeter:
    def __init__(self) -> None:
        self.seconds = 0.0
        self._t = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.process_time()
        else:
            self.seconds += time.process_time() - self._t


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _watchdog(max_gb: float, max_seconds: float, started: float, stage: List[str], got: Dict[str, Any]) -> None:
    while True:
        time.sleep(0.5)
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        over = rss > max_gb * 2**30
        if over or time.monotonic() - started > max_seconds:
            why = f"RSS {rss / 2**30:.2f} GB" if over else f"{max_seconds:.0f} s"
            print(json.dumps({**got, "stopped": f"stopped at {why} after {time.monotonic() - started:.1f} s, "
                              f"during {stage[-1]}", "stage": stage[-1]}), flush=True)
            os._exit(3)


def one_size(nodes: int, ranks: int, shape: str, max_gb: float, max_seconds: float, fail: float = 0.0,
             print_to: Optional[str] = None, write: bool = False) -> Dict[str, Any]:
    from app.cli import headless
    from app.analysis import analyze
    from app.analysis.text import summary_text

    stage = ["setup"]
    started = time.monotonic()
    out: Dict[str, Any] = {"nodes": nodes, "ranks": ranks, "shape": shape}
    threading.Thread(target=_watchdog, args=(max_gb, max_seconds, started, stage, out), daemon=True).start()
    rec = load_recording(shape)
    names = [f"sim{i:05d}" for i in range(nodes)]
    gcm = GcMeter()

    async def run() -> None:
        opts = FakeOptions(collect=CollectOptions(locals=True))
        fake = FakeConnector(rec, names, ranks, fail)
        stage.append("building the FAKE replies")
        fake.prebuild()
        out["fake_mb"] = sum(len(b) for n in fake.nodes.values() for p in n.built.values() for b in p) / 2**20
        object.__setattr__(opts, "fake", fake)
        base._REQUEST_IDS = itertools.count(1)  # the ids PREDICTED_IDS expects
        gc.collect()
        cpu0, gc0, fake0, bytes0, t0 = _cpu(), gcm.seconds, FakeCpu.seconds, FakeCpu.bytes, time.monotonic()
        stage.append("pass 1")
        session = Session([HostSpec(name=n, host=n, slots=ranks) for n in names], opts)
        snap = await session.snapshot()
        t_pass = time.monotonic() - t0
        stage.append("analysis 1")
        a0 = _cpu()
        analysis = analyze(snap)
        headline = summary_text(snap, analysis).splitlines()[0]
        out["analysis_cpu"] = _cpu() - a0
        out["first_headline_s"] = time.monotonic() - t0
        out["pass1_s"] = t_pass
        cpu = _cpu() - cpu0 - (FakeCpu.seconds - fake0)
        out["cpu_ms_node"] = cpu / nodes * 1000
        out["gc_share"] = (gcm.seconds - gc0) / max(cpu, 1e-9)
        out["bytes_node"] = (FakeCpu.bytes - bytes0) / nodes
        out["headline"] = headline[:160]
        out["ranks_seen"] = sum(1 for r in snap.ranks if r.threads)
        out["pass1_failed"] = sum(1 for n in snap.nodes if n.state != "done")
        out["pass1_timed_out"] = sum(1 for n in snap.nodes if n.error is not None and n.error.code == "timeout"
                                     and not failing(int(n.name[3:]), fail))
        del analysis
        # the second pass: the default second sample of --print, a refresh in the TUI
        stage.append("pass 2")
        await asyncio.sleep(0)
        cpu0, gc0, fake0, bytes0, t0 = _cpu(), gcm.seconds, FakeCpu.seconds, FakeCpu.bytes, time.monotonic()
        snap2 = await session.refresh(reconnect=False)
        out["refresh_s"] = time.monotonic() - t0
        stage.append("report 2")
        text = io.StringIO()
        headless.report(snap2, history=[snap], out=text)
        out["report2_s"] = time.monotonic() - t0
        cpu = _cpu() - cpu0 - (FakeCpu.seconds - fake0)
        out["refresh_cpu_ms_node"] = cpu / nodes * 1000
        out["refresh_gc_share"] = (gcm.seconds - gc0) / max(cpu, 1e-9)
        out["refresh_bytes_node"] = (FakeCpu.bytes - bytes0) / nodes
        out["refresh_timed_out"] = sum(1 for n in snap2.nodes if n.error is not None and n.error.code == "timeout"
                                       and not failing(int(n.name[3:]), fail))
        out["refresh_failed"] = sum(1 for n in snap2.nodes if n.state != "done")
        out["print_lines"] = text.getvalue().count("\n")
        if print_to:
            Path(print_to).write_text(text.getvalue())
        if write:  # the same report with the snapshot file, as `--print --snapshot FILE` writes it after the summary
            stage.append("report 2 with --snapshot")
            with tempfile.TemporaryDirectory(prefix="hangscope-scale-") as tmp:
                path = os.path.join(tmp, "snapshot.json")
                t0 = time.monotonic()
                with contextlib.redirect_stderr(io.StringIO()):
                    headless.report(snap2, history=[snap], out=io.StringIO(), snapshot_path=path)
                out["report2_file_s"] = time.monotonic() - t0
                out["file_mb"] = os.path.getsize(path) / 2**20
        stage.append("close")
        await session.close()

    asyncio.run(run())
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["fake_cpu_s"] = FakeCpu.seconds
    out["wall_s"] = time.monotonic() - started
    return out


def one_size_ui(nodes: int, ranks: int, shape: str, max_gb: float, max_seconds: float) -> Dict[str, Any]:
    """The same FAKE nodes through the TUI (HangscopeApp, headless under Textual's test driver, 160x50), as
    `hangscope HOSTS` opens it: its first picture (the first snapshot analysed and drawn: the verdict line, the
    grid) and a refresh (`R`, confirmed), with every session event going through the app as it does live."""
    from textual.pilot import Pilot  # noqa: F401  (Textual's test driver, loaded before the clock starts)

    from app.ui.app import HangscopeApp
    from app.ui.source import LiveSource

    stage = ["setup"]
    started = time.monotonic()
    out: Dict[str, Any] = {"nodes": nodes, "ranks": ranks, "shape": shape, "ui": True}
    threading.Thread(target=_watchdog, args=(max_gb, max_seconds, started, stage, out), daemon=True).start()
    rec = load_recording(shape)
    names = [f"sim{i:05d}" for i in range(nodes)]

    async def picture(app: Any, count: int, t0: float) -> float:
        """Wall seconds from t0 until the app holds `count` snapshots, has drawn the last one and collects no more."""
        while not (len(app.history) >= count and app.views.get(app.position) is not None and not app.collecting):
            await asyncio.sleep(0.02)
        return time.monotonic() - t0

    async def run() -> None:
        opts = FakeOptions(collect=CollectOptions(locals=True))
        fake = FakeConnector(rec, names, ranks)
        stage.append("building the FAKE replies")
        fake.prebuild()
        object.__setattr__(opts, "fake", fake)
        base._REQUEST_IDS = itertools.count(1)
        gc.collect()
        events = [0]
        cpu0, fake0, t0 = _cpu(), FakeCpu.seconds, time.monotonic()
        stage.append("the TUI's first picture")
        source = LiveSource([HostSpec(name=n, host=n, slots=ranks) for n in names], opts)
        app = HangscopeApp(source)
        listener = app._on_source_event

        def counting(event: Any) -> None:
            events[0] += 1
            listener(event)

        app._on_source_event = counting  # type: ignore[method-assign]
        async with app.run_test(size=(160, 50)) as pilot:
            out["first_picture_s"] = await picture(app, 1, t0)
            cpu = _cpu() - cpu0 - (FakeCpu.seconds - fake0)
            out["cpu_ms_node"] = cpu / nodes * 1000
            out["events"] = events[0]
            await pilot.pause()
            snap = app.history[-1]
            out["ranks_seen"] = sum(1 for r in snap.ranks if r.threads)
            out["pass1_timed_out"] = sum(1 for n in snap.nodes if n.error is not None and n.error.code == "timeout")
            out["verdict"] = str(app.main.query_one("#verdict").render())[:160]
            stage.append("the TUI's refresh")
            t1 = time.monotonic()
            await pilot.press("R")  # refresh all: py-spy pauses each rank, so the TUI asks first
            while type(app.screen).__name__ != "ConfirmScreen":
                await asyncio.sleep(0.01)
            await pilot.press("y")
            out["refresh_s"] = await picture(app, 2, t1)
            snap2 = app.history[-1]
            out["refresh_timed_out"] = sum(1 for n in snap2.nodes if n.error is not None and n.error.code == "timeout")
            out["refresh_failed"] = sum(1 for n in snap2.nodes if n.state != "done")
            out["refresh_ranks_seen"] = sum(1 for r in snap2.ranks if r.threads)
            out["refresh_errors"] = sorted({n.error.message[:200] for n in snap2.nodes if n.error is not None})[:3]
            stage.append("close")
            app.exit(0)

    asyncio.run(run())
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["wall_s"] = time.monotonic() - started
    return out


# -- recording --------------------------------------------------------------------------------------------

def record() -> None:
    """Record one real worker's hello and collect replies on a one-node test cluster, for both shapes, as a
    Session of the bench's sizes asks for them: past ALL_LOCALS_NODES nodes (64) a worker sends per thread only
    the locals the analysis reads (the rest stay on the node for the TUI's rank view), so the one-node session
    that records is told it is a large one."""
    import cluster as cluster_mod

    problem = cluster_mod.support_problem()
    if problem:
        sys.exit(problem)
    out = {shape: _record_shape(cluster_mod, depth) for shape, depth in (("small", 0), ("deep", 55))}
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"recorded {DATA} ({DATA.stat().st_size} bytes)")


def _record_shape(cluster_mod: Any, depth: int) -> Dict[str, Any]:
    from waiting import wait_until

    with cluster_mod.build_cluster(1) as c:
        os.environ["HOME"] = str(c.home)
        os.environ.pop("SSH_AUTH_SOCK", None)
        ready = []
        for r in range(RANKS_RECORDED):
            ready.append(c.workdir / f"ready-{r}")
            c.nodes[0].spawn(["/usr/bin/python3", str(ROOT / "bench" / "stand_in_rank.py"), str(ready[-1]),
                              str(depth)],
                             env={"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(RANKS_RECORDED),
                                  "LOCAL_WORLD_SIZE": str(RANKS_RECORDED), "GROUP_RANK": "0",
                                  "MASTER_ADDR": c.names[0], "MASTER_PORT": "29500"})
        wait_until(lambda: all(p.exists() and p.read_text().endswith("\n") for p in ready), 120,
                   "stand-in ranks to block")
        seen: List[Dict[str, Any]] = []
        original = WorkerConnection._on_line

        def on_line(self: WorkerConnection, line: bytes) -> bool:
            if line.strip():
                seen.append(json.loads(line))
            return original(self, line)

        WorkerConnection._on_line = on_line  # type: ignore[method-assign]
        import app.session.session as session_mod
        all_locals_nodes, session_mod.ALL_LOCALS_NODES = session_mod.ALL_LOCALS_NODES, 0  # as past 64 nodes
        try:
            opts = SessionOptions(collect=CollectOptions(locals=True), ssh_config=(str(c.ssh_config),))

            async def go() -> None:
                s = Session([HostSpec(name=c.names[0], host=c.names[0])], opts)
                try:
                    for _ in range(2):  # a snapshot, then a refresh on the same worker
                        snap = await (s.refresh() if seen else s.snapshot())
                        assert sum(1 for r in snap.ranks if r.threads) == RANKS_RECORDED, snap.nodes
                finally:
                    await s.close()

            asyncio.run(go())
        finally:
            WorkerConnection._on_line = original  # type: ignore[method-assign]
            session_mod.ALL_LOCALS_NODES = all_locals_nodes
    hello = next(m for m in seen if m.get("type") == "hello")
    ids = list(dict.fromkeys(m["id"] for m in seen if m.get("type") == "item" and "rank" in (m.get("data") or {})))
    assert len(ids) == 2, ids
    return {"hello": hello, "passes": [[m for m in seen if m.get("id") == i] for i in ids]}


# -- the table --------------------------------------------------------------------------------------------

def table(rows: List[Dict[str, Any]]) -> str:
    if rows and all(r.get("ui") for r in rows):
        return ui_table(rows)
    head = ("| nodes x ranks | first headline s | CPU ms/node | GC % | analysis s | bytes/node | peak MB "
            "| pass 1: answering nodes timed out | refresh s | refresh CPU ms/node | refresh GC % "
            "| refresh: answering nodes timed out | --print lines |")
    write = any("report2_file_s" in r for r in rows)
    if write:
        head += " report 2 s | report 2 with --snapshot s | snapshot MB |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if write and "report2_file_s" not in r:
            r = {"report2_s": float("nan"), "report2_file_s": float("nan"), "file_mb": float("nan"), **r}
        size = f"{r['nodes']:,} x {r['ranks']} ({r['shape']}{', %g %% failing' % (100 * r['fail']) if r.get('fail') else ''})"
        if "stopped" in r and "first_headline_s" not in r:
            lines.append(f"| {size} | {r['stopped']} |" + " |" * (head.count("|") - 3))
            continue
        if "stopped" in r:  # the first pass was measured: the rest says where it stopped
            r = {"refresh_s": float("nan"), "refresh_cpu_ms_node": float("nan"), "refresh_gc_share": float("nan"),
                 "refresh_timed_out": r["stopped"], **r}
        lines.append(
            f"| {size} | {r['first_headline_s']:.2f} | {r['cpu_ms_node']:.2f} | {100 * r['gc_share']:.0f} "
            f"| {r['analysis_cpu']:.2f} | {r['bytes_node'] / 1024:.1f} KiB | {r['peak_mb']:.0f} "
            f"| {r.get('pass1_timed_out', '?')} of {r['nodes']} | {r['refresh_s']:.2f} | {r['refresh_cpu_ms_node']:.2f} | {100 * r['refresh_gc_share']:.0f} "
            f"| {r['refresh_timed_out']} of {r['nodes']} | {r.get('print_lines', '?')} |"
            + (f" {r['report2_s'] - r['refresh_s']:.2f} | {r['report2_file_s']:.2f} | {r['file_mb']:.0f} |" if write else ""))
    return "\n".join(lines)


def ui_table(rows: List[Dict[str, Any]]) -> str:
    head = ("| nodes x ranks | TUI first picture s | CPU ms/node | session events | peak MB "
            "| pass 1: answering nodes timed out | TUI refresh s | refresh: answering nodes timed out |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        size = f"{r['nodes']:,} x {r['ranks']} ({r['shape']}, TUI)"
        if "first_picture_s" not in r:
            lines.append(f"| {size} | {r.get('stopped', '?')} |" + " |" * (head.count("|") - 3))
            continue
        refresh = f"{r['refresh_s']:.2f}" if "refresh_s" in r else r.get("stopped", "?")
        lines.append(f"| {size} | {r['first_picture_s']:.2f} | {r['cpu_ms_node']:.2f} | {r['events']:,} "
                     f"| {r['peak_mb']:.0f} | {r['pass1_timed_out']} of {r['nodes']} | {refresh} "
                     f"| {r.get('refresh_timed_out', '?')} of {r['nodes']} |")
    return "\n".join(lines)


# The bench as first committed, with the replies main's worker sent then (every rank's full dump, no zlib): what
# --before runs against an older tree (whose worker sends that form, and whose login side reads it).
BASELINE_BENCH = "a60057f"


def before(ref: str, argv: List[str]) -> int:
    """Run BASELINE_BENCH's bench/scale.py and recording against `ref`'s tree (a temporary git worktree)."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="scale-before-"))
    tree = tmp / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True,
                   capture_output=True)
    try:
        for path in ("bench/scale.py", "bench/data/scale_replies.json"):
            data = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASELINE_BENCH}:{path}"], check=True,
                                  capture_output=True).stdout
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_bytes(data)
        head = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True,
                              text=True).stdout.strip()
        print(f"# BEFORE: the code of {ref} ({head[:100]}), measured by the bench and recording of "
              f"{BASELINE_BENCH}", flush=True)
        return subprocess.run([sys.executable, str(tree / "bench" / "scale.py"), *argv]).returncode
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,12500", help="node counts (default 100,1000,12500)")
    ap.add_argument("--ranks", type=int, default=RANKS_RECORDED, help=argparse.SUPPRESS)  # as recorded
    ap.add_argument("--shape", default="small", choices=tuple(SHAPES),
                    help="the recorded stacks: small (stand-in ranks, 6 frames), deep (~60 frames with locals; the "
                         "recording's 8 ranks repeat on every node, so every rank keeps the locals of 12,499 others), "
                         "or small_ranked / deep_ranked (the same, with an argument that holds the rank's global "
                         "number in every frame that keeps it: no two ranks keep the same locals, as in a real job, "
                         "where object addresses and paths differ from rank to rank)")
    ap.add_argument("--max-gb", type=float, default=6.0, help="stop a size past this RSS (default 6)")
    ap.add_argument("--max-seconds", type=float, default=1800.0, help="stop a size after this long (default 1800)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--fail", type=float, default=0.0, metavar="FRACTION",
                    help="this fraction of the FAKE nodes fails, scattered: half unreachable, a quarter whose worker "
                         "dies after discovery, a quarter with a rank that could not be dumped")
    ap.add_argument("--print-to", metavar="FILE", help="with --one: write the second pass's --print text to FILE")
    ap.add_argument("--record", action="store_true", help="record the replies on the test cluster (root)")
    ap.add_argument("--before", metavar="REF",
                    help="measure REF's code instead (main: the login side and worker replies before issue 27), with "
                         f"the bench and recording of {BASELINE_BENCH}, in a temporary git worktree")
    ap.add_argument("--bytecode", action="store_true",
                    help="write app/ and workers/ bytecode caches first, as an installed hangscope has them (without "
                         "it, whatever caches the checkout holds are used; under PYTHONDONTWRITEBYTECODE none may be)")
    ap.add_argument("--ui", action="store_true",
                    help="through the TUI (headless, Textual's test driver) instead of --print: its first picture and "
                         "a refresh, every session event through the app")
    ap.add_argument("--write", action="store_true",
                    help="also time the second report with its snapshot file, as `--print --snapshot FILE` writes it "
                         "(default-deny sharing, the JSON, the file on a temporary disk folder)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--profile", metavar="FILE", help="with --one: write a cProfile of CPU time (not wall) to FILE")
    args = ap.parse_args()
    if args.ui and (args.fail or args.before or args.print_to or args.write):
        ap.error("--ui measures the TUI on answering nodes: without --fail, --before, --print-to or --write")
    if args.record:
        return record()
    if args.before:
        sys.exit(before(args.before, ["--sizes", args.sizes, "--shape", args.shape, "--max-gb", str(args.max_gb),
                                      "--max-seconds", str(args.max_seconds)]
                        + (["--json", str(Path(args.json).resolve())] if args.json else [])))
    if args.one:
        if args.profile:
            import cProfile

            prof = cProfile.Profile(time.process_time)  # CPU time: the wall clock of a loaded machine misleads
            prof.enable()
        if args.ui:
            row = one_size_ui(args.one, args.ranks, args.shape, args.max_gb, args.max_seconds)
        else:
            row = one_size(args.one, args.ranks, args.shape, args.max_gb, args.max_seconds, args.fail,
                           args.print_to, args.write)
        if args.profile:
            prof.disable()
            prof.dump_stats(args.profile)
        print(json.dumps(row), flush=True)
        return
    if args.bytecode:  # the first pass imports the analysis and builds the worker payload on the clock (~0.5 s)
        subprocess.run([sys.executable, "-m", "compileall", "-q", "app", "workers"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
    print(f"# SIMULATION (FAKE transport replaying recorded replies; real login-side code), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]}"
          + ("; app/ and workers/ bytecode cached (--bytecode)" if args.bytecode else ""), flush=True)
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        load = os.getloadavg()[0]
        done = subprocess.run([sys.executable, __file__, "--one", str(n), "--ranks", str(args.ranks), "--shape",
                               args.shape, "--max-gb", str(args.max_gb), "--max-seconds", str(args.max_seconds),
                               "--fail", str(args.fail)] + (["--ui"] if args.ui else [])
                              + (["--write"] if args.write else []),
                              capture_output=True, text=True)
        last = (done.stdout.strip().splitlines() or ["{}"])[-1]
        try:
            row = json.loads(last)
        except ValueError:
            row = {"stopped": f"failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"}
        row.update(nodes=n, ranks=args.ranks, shape=args.shape, load=load, fail=args.fail, ui=args.ui)
        rows.append(row)
        print(table([row]).splitlines()[-1] + f"  (load {load:.1f})", flush=True)
        if "headline" in row or "verdict" in row:
            print(f"  headline: {row.get('headline') or row['verdict']}", flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
