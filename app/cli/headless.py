"""Headless mode: collect once (or load a snapshot), analyse, print the summary, write the snapshot JSON."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import os
import sys
import threading
import time
from typing import Callable, List, Optional, Sequence, TextIO

from app.cli.run import WriteError, write_private
from app.inputs.files import InputFileError, open_input, read_bounded, stdin_problem
from app.errors import InputError
from app.model import CollectOptions, Snapshot, rank_key
from app.model.codec import SnapshotFormatError, snapshot_from_json, snapshot_json_parts

EXIT_OK, EXIT_PARTIAL, EXIT_NOTHING, EXIT_INTERRUPTED = 0, 1, 3, 130
MAX_SNAPSHOT_BYTES = 1 << 30  # a snapshot of 100k ranks with locals is a few hundred MB




def session_options(args: argparse.Namespace):
    from app.session import SessionOptions
    from app.transport.relay import RelayOptions

    collect = CollectOptions(native=args.native, locals=args.locals, nonblocking=args.nonblocking,
                             strace_seconds=args.strace, gdb=args.gdb, sudo=args.sudo,
                             gpu_evidence=getattr(args, "gpu_evidence", "auto"))
    return SessionOptions(
        collect=collect, fanout=args.fanout, connect_timeout=args.connect_timeout, dump_timeout=args.timeout,
        python=args.python, accept_new_host_keys=args.accept_new_host_keys,
        ssh_config=tuple(args.ssh_config) if args.ssh_config else None, identity=tuple(args.identity),
        pids=tuple(args.pids) if args.pids else None, match=getattr(args, "match", None) or None,
        strace_data=getattr(args, "strace_data", False), store=getattr(args, "store", True),
        srun=getattr(args, "srun", None),  # set by --slurm (app.slurm.cli): the job for hosts over srun or auto
        relay=RelayOptions.from_flag(getattr(args, "relay", "auto")),
    )


# What the report loads (every room of the analysis, the summary's text, the redaction of what is written: ~0.3 s
# of imports on a slow login node): loaded in a thread while the nodes connect and dump, rather than before the
# first connection (the session needs none of it) or after the last reply (issue 27, the CLI at 16 x 4).
REPORT_MODULES = ("app.analysis.core", "app.analysis.text", "app.report.redact", "app.report.share")


def preload(modules: Sequence[str]) -> threading.Thread:
    """Import `modules` in a thread (started here); join it before using them. A module that fails to import is
    left for the caller's own import to report."""
    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:
                return

    thread = threading.Thread(target=run, name="hangscope-preload", daemon=True)
    thread.start()
    return thread


def collect_and_report(hosts: Optional[Sequence], args: argparse.Namespace, inputs: Sequence[str] = ()) -> int:
    """Run one collection over hosts (None = this machine) and report it; returns the exit code. `inputs`:
    the files the command read, which no output may replace."""
    from app.cli.run import run_interruptible
    from app.session import NodeUpdate, Session, SnapshotDone

    progress = None if args.quiet else NodeProgress(sys.stderr, len(hosts) if hosts else 1)

    def on_event(event) -> None:
        if progress is not None and isinstance(event, NodeUpdate):
            progress.update(event.node)
        elif progress is not None and isinstance(event, SnapshotDone):
            progress.pass_done(event.snapshot)

    session = Session(hosts, session_options(args), on_event=on_event)
    loading = preload(REPORT_MODULES + (("app.report",) if args.export else ()))

    history: List[Snapshot] = []
    stop: List[asyncio.Event] = []  # set by the first Ctrl+C: ends the wait between samples at once

    def cancel() -> None:
        session.cancel()
        for event in stop:
            event.set()

    async def collect() -> Snapshot:
        stop.append(asyncio.Event())
        try:
            snap = await session.snapshot()
            if args.samples > 1 and not args.native:
                # later samples only tell stuck from progressing: take them without pausing the ranks
                session.use(dataclasses.replace(session.options.collect, nonblocking=True))
            for _ in range(args.samples - 1):
                if snap.interrupted or stop[0].is_set():
                    break
                history.append(snap)
                try:
                    await asyncio.wait_for(stop[0].wait(), next_sample_delay(snap, args.interval, time.time()))
                    break  # interrupted while waiting: what was collected is the answer
                except asyncio.TimeoutError:
                    pass
                # a node that failed to connect in the first sample is not tried again: one deadline each
                snap = await session.refresh(reconnect=False)
            wanted = [rank_key(r) for r in snap.ranks if r.collected]
            if stop[0].is_set():
                wanted = []
            if args.strace and wanted:
                await session.strace(wanted, args.strace)
            if args.gdb and wanted and not stop[0].is_set():
                await session.gdb(wanted)
            if (args.strace or args.gdb) and wanted:
                snap = session.current()
            if stop[0].is_set() and not snap.interrupted:
                snap = dataclasses.replace(snap, interrupted=True)
            return snap
        finally:
            # Every worker gets its EOF now and ends while the summary is analysed and printed; the connections
            # are closed, and each worker's exit waited for, before the command returns (run_interruptible).
            session.end_workers()
            closing.append(asyncio.ensure_future(session.close()))

    def answer(snap: object) -> int:
        assert isinstance(snap, Snapshot)
        loading.join()  # no module is imported by two threads at once
        samples = history
        if getattr(args, "job", None):
            snap, samples = pick_job(snap, history, args.job)
        return report(snap, history=samples, snapshot_path=args.snapshot, force=args.force, export=args.export,
                      tar=args.tar, inputs=inputs, raw=getattr(args, "raw", False))

    closing: List[asyncio.Future] = []
    try:
        code = run_interruptible(collect, cancel, after=answer, finish=closing)
    finally:
        loading.join()  # a failed run does not exit with the thread midway through an import
    assert isinstance(code, int)
    return code


def next_sample_delay(snap: Snapshot, interval: float, now: float) -> float:
    """Seconds to wait before the next sample: --interval is the time between two samples of a rank, and a
    rank is sampled when it is dumped, so it counts from when this pass's dumps began (its first rank dump, on
    the login clock), not from the end of the pass: a cold pass spends most of its time before its dumps
    (connecting, starting the workers, discovery), and a rank dumped late in it is dumped late in the next
    pass too (the same order on each node). Without a dump time (nothing dumped) from now. Never more than
    `interval`; what the progress rules read is each rank's measured time between its samples, not this."""
    starts = [r.dump_started for r in snap.ranks if r.dump_started is not None]
    if not starts:
        return interval
    return min(interval, max(0.0, min(starts) + interval - now))


def report(snap: Snapshot, *, history: Sequence[Snapshot] = (), snapshot_path: Optional[str] = None,
           force: bool = False, export: Optional[str] = None, tar: bool = False, out: Optional[TextIO] = None,
           inputs: Sequence[str] = (), summary_last: bool = False, raw: bool = False) -> int:
    """Analyse, print the summary, write the snapshot file and the report bundle; the exit code says how
    complete the data is. After a collection the summary comes first (a write that fails loses nothing); with
    summary_last (--load: the file stays where it is) the outputs come first, so a refusal is the only line.
    The summary is for this terminal: the pattern net, as the TUI. The snapshot file leaves it: default-deny
    (app/report/share.py) unless raw, which says so on stderr."""
    from app.analysis import analyze
    from app.analysis.text import summary_text
    from app.report.redact import Redactor
    from app.report.share import RAW, SHARING, Sharer, share_output

    analysis = analyze(snap, history=history)
    # The node redacted everything it sent; this second pass covers what is printed here too, and a snapshot
    # loaded from a file written by an older hangscope.
    red = Redactor()
    share = Sharer()
    # The ranks' own error output is quoted, never acted on: --print shows it as it would be shared, so a pasted
    # summary carries no more of it than summary.md does (the rest, commands to run included, as on screen).
    printed = snap if raw else share_output(snap, share)
    out = sys.stdout if out is None else out  # the stream of the moment, not the one at import
    if not summary_last:
        out.write(red.text(summary_text(printed, analysis)) + "\n")
        out.flush()
    if snapshot_path:
        if raw:
            print("hangscope: warning: --raw: the snapshot holds names, paths, command lines, locals and error "
                  "output as collected (only what the pattern rules recognise is masked); do not share it: "
                  "--export writes a bundle that is safe to share", file=sys.stderr)
            text = snapshot_json_parts(red.snapshot(snap), red.tree(analysis.to_dict()), sharing=RAW)
        else:
            text = snapshot_json_parts(share.snapshot(snap), share.tree(analysis.to_dict()), sharing=SHARING)
        write_private(snapshot_path, text, force=force, inputs=inputs)
        print(f"hangscope: snapshot written to {snapshot_path}" + (" (raw)" if raw else ""), file=sys.stderr)
    if export:
        from app.report import export_bundle

        result = export_bundle(snap, analysis, export, force=force, tar=tar, history=history, inputs=inputs)
        redacted = sum(result.redactions.values())
        print(f"hangscope: report bundle written to {result.directory} ({len(result.paths)} files, "
              f"{redacted} value(s) redacted)" + (f"; {result.tarball}" if result.tarball else ""),
              file=sys.stderr)
    if summary_last:
        out.write(red.text(summary_text(printed, analysis)) + "\n")
        out.flush()
    code, why = exit_status(snap, analysis)
    if why:
        print(f"hangscope: {why}", file=sys.stderr)
    return code


def exit_status(snap: Snapshot, analysis) -> tuple:
    """The exit code of a collection and, unless everything was collected, a line saying why:
    0 every rank of the job collected; 1 partial (a node failed, a rank not dumped, ranks missing from the job's
    WORLD_SIZE, or a rank gone since an earlier sample); 3 nothing collected (no rank found at all);
    130 interrupted."""
    if snap.interrupted:
        return EXIT_INTERRUPTED, ""
    failed = [n.name for n in snap.nodes if n.state in ("failed", "partial")]
    if not snap.ranks:
        launchers = [p for p in snap.processes if p.role == "launcher"]
        if launchers:  # a job whose ranks have not started is a job: its launchers were found (and dumped)
            return EXIT_PARTIAL, (f"partial: no rank has started yet; {len(launchers)} launcher(s) of the job found"
                                  + (f"; {len(failed)} node(s) failed" if failed else ""))
        if failed and len(failed) == len(snap.nodes):
            return EXIT_NOTHING, (f"nothing was collected: every node failed ({len(failed)} of {len(snap.nodes)})")
        where = f"{len(snap.nodes) - len(failed)} node(s) answered" if snap.nodes else "nothing was inspected"
        more = f", {len(failed)} failed" if failed else ""
        return EXIT_NOTHING, f"nothing was collected: no rank was found ({where}{more})"
    reasons = []
    if failed:
        reasons.append(f"{len(failed)} node(s) failed or were cut short")
    undumped = sum(1 for r in snap.ranks if not r.collected or r.partial)
    if undumped:
        reasons.append(f"{undumped} rank(s) not dumped")
    reasons += [f.title for f in analysis.findings if f.kind == "missing_ranks"][:3]
    gone = [p for p in analysis.progress if p.status == "gone"]
    if gone:
        reasons.append(f"{len(gone)} rank(s) gone since an earlier sample")
    if not reasons and not snap.complete:
        reasons.append("the collection did not finish on every node")
    if reasons:
        return EXIT_PARTIAL, "partial: " + "; ".join(_printable(r[:200]) for r in reasons)
    return EXIT_OK, ""


def pick_job(snap: Snapshot, history: Sequence[Snapshot], wanted: str) -> "tuple[Snapshot, List[Snapshot]]":
    """The snapshot (and samples) with the ranks of the one job `wanted` names: exactly, or as the only job
    whose name contains it. An InputError lists the jobs when it names none or several."""
    from app.analysis import job_keys, only_job

    keys = [k for k in job_keys(snap) if k]
    match = [k for k in keys if k == wanted] or [k for k in keys if wanted in k]
    if len(match) != 1:
        listed = "; ".join(keys) if keys else "none: no rank tells its job"
        raise InputError(f"--job {wanted!r} names {'no' if not match else 'more than one'} job of this snapshot; "
                         f"its jobs: {listed}")
    return only_job(snap, match[0]), [only_job(h, match[0]) for h in history]


def show_loaded(path: str, *, export: Optional[str] = None, force: bool = False, tar: bool = False,
                job: Optional[str] = None, raw: bool = False) -> int:
    snap = load_snapshot(path)
    if job:
        snap, _ = pick_job(snap, (), job)
    from app.inputs.paths import UnwritableOutputError
    from app.report.writer import BundleWriteError

    try:
        report(snap, export=export, force=force, tar=tar, inputs=[path] if path != "-" else [], summary_last=True,
               raw=raw)
    except (WriteError, BundleWriteError) as exc:
        raise UnwritableOutputError(str(exc)) from None
    return EXIT_OK


_BOM = b"\xef\xbb\xbf"  # an editor's byte-order mark: JSON readers may skip it


def _object_start(path: str) -> Callable[[bytes], None]:
    """read_bounded's check of a snapshot's first bytes: a JSON object (after a byte-order mark), else refused."""
    def check(head: bytes) -> None:
        body = head[len(_BOM):].lstrip() if head.startswith(_BOM) else head
        if body and body[:1] != b"{":
            raise InputError(f"{path} is not a hangscope snapshot (not JSON: it does not start with an object)")
    return check


def load_snapshot(path: str) -> Snapshot:
    """Read a snapshot file ('-': stdin); every way it can be wrong is an InputError naming the file, and a
    file that is not a regular file (a FIFO, a device, a directory) is refused before it is opened."""
    try:
        if path == "-":
            problem = stdin_problem()
            if problem or sys.stdin is None:
                raise InputError(f"--load -: {problem or 'stdin is closed'}")
            data = read_bounded(sys.stdin.buffer, MAX_SNAPSHOT_BYTES, _object_start(path))
        else:
            with open_input(path, what="snapshot", stdin_ok=True) as f:  # bounded: a 100 GB file must not fill the memory
                size = os.fstat(f.fileno()).st_size
                if size > MAX_SNAPSHOT_BYTES:  # known before a byte is read (a sparse file of 8 GB reads as zeros)
                    raise InputError(f"{path} is larger than {MAX_SNAPSHOT_BYTES >> 20} MiB: not a hangscope snapshot")
                data = read_bounded(f, MAX_SNAPSHOT_BYTES, _object_start(path))
    except InputFileError as exc:
        raise InputError(f"--load {exc.path}: {exc.reason}") from None
    except OSError as exc:
        raise InputError(f"cannot read snapshot {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise InputError(f"{path} is larger than {MAX_SNAPSHOT_BYTES >> 20} MiB: not a hangscope snapshot")
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not a hangscope snapshot (not UTF-8 text)") from exc
    del data
    try:
        snap, _ = snapshot_from_json(text)
    except SnapshotFormatError as exc:
        raise InputError(f"{path}: {exc}") from exc
    if any(not r.job for r in snap.ranks):  # written before ranks carried their job: derived from what they hold
        from app.decode.replies import with_job

        snap = dataclasses.replace(snap, ranks=tuple(r if r.job else with_job(r) for r in snap.ranks))
    return snap




PER_NODE_LINES = 32  # nodes up to which each node's end is a progress line of its own
NAMED_FAILURES = 20  # past them: the failed nodes named, this many a pass, then counted
COUNT_EVERY = 2.0  # seconds between two count lines of a larger job


class NodeProgress:
    """Progress on stderr, so a long collection shows it is alive. Up to PER_NODE_LINES nodes, one line per node
    when it finishes or fails. Past that a node's line would be one of thousands a pass (25,000 lines for the
    default two samples of 12,500 nodes): a count line at most every COUNT_EVERY seconds while nodes answer, the
    failed nodes by name (the first NAMED_FAILURES of a pass, then counted), and the count when the pass ends."""

    def __init__(self, stream: TextIO, nodes: int, clock=time.monotonic) -> None:
        self.stream = stream
        self.nodes = nodes
        self.clock = clock
        self.reported: dict = {}
        self.each = nodes <= PER_NODE_LINES
        self.passes = 0
        self._new_pass()

    def _new_pass(self) -> None:
        self.passes += 1
        self.ended: dict = {}  # node -> its last end state this pass
        self.named = 0
        self.started: Optional[float] = None  # the pass's first node event (not the wait between samples)
        self.last = self.clock()

    def _write(self, line: str) -> None:
        self.stream.write(_printable(line) + "\n")
        self.stream.flush()

    def update(self, node) -> None:
        if self.started is None:
            self.started = self.last = self.clock()
        if node.state not in ("done", "partial", "failed"):
            return
        if not self.each:
            self.ended[node.name] = node.state
            if node.state == "failed" and self.named < NAMED_FAILURES:
                self.named += 1
                self._write(f"{node.name}: failed: {node.error.message if node.error is not None else node.state}")
            now = self.clock()
            if now - self.last >= COUNT_EVERY:
                self.last = now
                self._write(self._count(now))
            return
        if self.reported.get(node.name) == node.state:
            return
        self.reported[node.name] = node.state
        if node.state == "failed" and node.error is not None:
            line = f"{node.name}: failed: {node.error.message}"
        else:
            total = sum(sec for _, sec in node.timings)
            line = f"{node.name}: {node.state}, {node.ranks_found} rank(s) in {total:.2f} s"
        self._write(line)

    def _count(self, now: float, snap: Optional[Snapshot] = None) -> str:
        states = list(self.ended.values())
        failed = states.count("failed")
        answered = len(states) - failed
        tail = ""
        if snap is not None:
            tail = f", {len(snap.ranks):,} rank(s)"
        if failed > self.named:
            tail += f" ({failed - self.named:,} failed node(s) not named above: see the summary)"
        began = now if self.started is None else self.started
        return (f"hangscope: sample {self.passes}: {answered:,} of {self.nodes:,} node(s) answered, {failed:,} "
                f"failed{tail}, {now - began:.1f} s")

    def pass_done(self, snap: Snapshot) -> None:
        """The end of a pass (its snapshot): a larger job's count line for it; the next pass counts afresh."""
        if not self.each:
            self._write(self._count(self.clock(), snap))
        self._new_pass()


def _printable(text: str) -> str:
    """Remote text reaches a terminal: drop control characters so it cannot move the cursor or retitle."""
    return "".join(ch if ch.isprintable() or ch == "\t" else "\ufffd" for ch in text)
