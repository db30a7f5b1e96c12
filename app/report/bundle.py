"""The export bundle: every file rendered in memory from one redacted copy of the data, then written safely.

build_bundle() never touches the disk; write_bundle() writes a built bundle (again, elsewhere, after a
failure); export_bundle() does both and is what the CLI and the TUI call.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from app import __version__
from app.model import Snapshot
from app.model.codec import inert, snapshot_json_bytes, to_dict
from app.report.facts import gather
from app.report.flame import collapsed, speedscope
from app.report.html_report import render_html
from app.report.manifest import build_manifest
from app.report.redact import channel_counts
from app.report.share import SHARING, Sharer
from app.report.summary_md import render_summary
from app.report.writer import (MANIFEST, BundleWriteError, check_destination, check_room, tar_bytes, write_files,
                               write_tarball)

if TYPE_CHECKING:
    from app.analysis import Analysis

SUMMARY, REPORT, SNAPSHOT = "summary.md", "report.html", "snapshot.json"
SPEEDSCOPE, COLLAPSED, TESTS = "stacks.speedscope.json", "stacks.collapsed.txt", "tests.json"
BUNDLE_NAMES = (MANIFEST, SUMMARY, REPORT, SNAPSHOT, SPEEDSCOPE, COLLAPSED, TESTS)  # every file a bundle may hold


@dataclass(frozen=True)
class Bundle:
    """A rendered, redacted bundle held in memory: file name -> content, in writing order (manifest first,
    so a directory holding any file of a bundle is recognisable as one)."""

    files: Dict[str, bytes]
    redactions: Dict[str, int]
    skipped: Tuple[Tuple[str, str], ...]
    taken_at: float


@dataclass(frozen=True)
class ExportResult:
    directory: str
    paths: Tuple[str, ...]  # every file written, the tarball last
    tarball: Optional[str]
    redactions: Dict[str, int]  # rule -> how many values were replaced
    skipped: Tuple[Tuple[str, str], ...] = ()  # (item, why it is not in the bundle)
    bundle: Optional[Bundle] = field(default=None, compare=False, repr=False)


def export_bundle(snapshot: Snapshot, analysis: Optional["Analysis"], out_dir: str, *, force: bool = False,
                  tar: bool = False, history: Sequence[Snapshot] = (), tests: Any = None,
                  inputs: Sequence[str] = ()) -> ExportResult:
    """Render and write the bundle to out_dir (created 0700), and OUT_DIR.tar.gz too with tar=True.

    Raises BundleExistsError (an InputError) when out_dir exists without force, UnsafePathError for a
    symlink or a directory that is not a bundle, BundleWriteError when writing fails part-way: its
    `bundle` attribute holds everything in memory for write_bundle() to another place. `inputs`: files the
    command reads (the --load snapshot), which the bundle must never replace."""
    check_destination(out_dir, force=force, tar=tar, names=BUNDLE_NAMES, inputs=inputs)  # before rendering
    return write_bundle(build_bundle(snapshot, analysis, history=history, tests=tests), out_dir, force=force, tar=tar)


def write_bundle(bundle: Bundle, out_dir: str, *, force: bool = False, tar: bool = False) -> ExportResult:
    """Write a built bundle (raises like export_bundle); a failed write can be retried at another path."""
    out_dir = os.path.normpath(out_dir)
    check_destination(out_dir, force=force, tar=tar)
    try:
        sizes = [len(data) for data in bundle.files.values()]
        if tar:  # the tarball is measured with the files: a bundle is not written for a tarball that cannot be
            sizes.append(len(tar_bytes(os.path.basename(out_dir) or "hangscope-report", bundle.files,
                                       bundle.taken_at)))
        check_room(out_dir, sizes, pending=bundle.files)
        paths: List[str] = write_files(out_dir, bundle.files, force=force)
        tarball = write_tarball(out_dir, bundle.files, mtime=bundle.taken_at, force=force) if tar else None
    except BundleWriteError as exc:
        exc.bundle = bundle
        raise
    if tarball:
        paths.append(tarball)
    return ExportResult(out_dir, tuple(paths), tarball, dict(bundle.redactions), bundle.skipped, bundle)


def build_bundle(snapshot: Snapshot, analysis: Optional["Analysis"], *, history: Sequence[Snapshot] = (),
                 tests: Any = None, now: Optional[float] = None) -> Bundle:
    """Every file of the bundle, shared by default-deny (app/report/share.py). The snapshot is shared once as data
    (so snapshot.json keeps its shape and still loads), the analysis's sentences as they are rendered; every
    rendered file then goes through the pattern net again as a whole."""
    red = Sharer()
    redacted = red.snapshot(snapshot)
    analysis_doc = red.tree(analysis.to_dict()) if analysis is not None else None
    tests_doc = red.tree(_tests_doc(tests)) if tests is not None else None
    facts = gather(redacted, analysis, red)
    skipped: List[Tuple[str, str]] = list(_skipped(redacted, history))
    names = [MANIFEST, SUMMARY, REPORT, SNAPSHOT, SPEEDSCOPE, COLLAPSED] + ([TESTS] if tests_doc is not None else [])

    files: Dict[str, bytes] = {}
    files[SUMMARY] = red.whole(render_summary(facts, analysis, red, tests=tests_doc, files=names,
                                                   first=history[0].options if history else None)).encode()
    page, left_out = render_html(facts, analysis, red, history_times=[s.taken_at for s in history],
                                 tests=tests_doc, version=__version__)
    files[REPORT] = page.encode()
    skipped += left_out
    files[SNAPSHOT] = snapshot_json_bytes(redacted, analysis_doc, sharing=SHARING)
    with_stacks = [r for r in redacted.ranks if r.threads]
    flame = red.whole_tree(speedscope(redacted, with_stacks, f"hangscope {__version__}"))
    files[SPEEDSCOPE] = inert(json.dumps(flame, ensure_ascii=False)).encode()
    files[COLLAPSED] = red.whole(collapsed(with_stacks)).encode()
    if tests_doc is not None:
        files[TESTS] = inert(json.dumps(tests_doc, indent=1, ensure_ascii=False)).encode()

    created = time.time() if now is None else now
    manifest = _manifest(redacted, created, files, red, skipped, history, tests_doc is not None)
    return Bundle({MANIFEST: manifest, **files}, red.summary(), tuple(skipped), snapshot.taken_at)


def _manifest(snapshot: Snapshot, created: float, files: Mapping[str, bytes], red: Sharer,
              skipped: Sequence[Tuple[str, str]], history: Sequence[Snapshot], tests: bool) -> bytes:
    from app.transport.login_tools import pyspy_version

    doc = build_manifest(snapshot, created_at=created, files=files, redactions=red.summary(), skipped=skipped,
                         history=history, tests_included=tests, pyspy_version=pyspy_version(),
                         by_channel=channel_counts(snapshot))
    # The manifest is a bundle file too: it goes through the redactor like the others (it holds node
    # errors and warnings), and must then report the counts including its own.
    before = dict(red.counts)
    doc = red.whole_tree(doc)
    if dict(red.counts) != before:
        doc["redactions"]["by_rule"] = red.summary()
        doc["redactions"]["total"] = sum(red.counts.values())
    return (inert(json.dumps(doc, indent=1, ensure_ascii=False)) + "\n").encode()


def _tests_doc(tests: Any) -> Any:
    """GPU test results as JSON data: an object with to_dict(), a dataclass, or already plain data."""
    if hasattr(tests, "to_dict"):
        return tests.to_dict()
    return json.loads(json.dumps(to_dict(tests), default=str))


def _skipped(snapshot: Snapshot, history: Sequence[Snapshot]) -> List[Tuple[str, str]]:
    out: List[Tuple[str, str]] = []
    for n in snapshot.nodes:
        if n.state == "failed":
            why = n.error.message if n.error is not None else "failed"
            out.append((f"node {n.name}", f"no data: {why}"))
    no_stack = [r for r in snapshot.ranks if not r.threads]
    if no_stack:
        reasons: Dict[str, List[str]] = {}
        for r in no_stack:
            reasons.setdefault(r.error.message if r.error is not None else "not collected", []).append(
                f"{r.label} on {r.node}")
        for why, who in reasons.items():
            shown = ", ".join(who[:10]) + (f" and {len(who) - 10} more" if len(who) > 10 else "")
            out.append((f"stacks of {shown}", why))
    if history:
        out.append(("earlier samples", f"{len(history)} earlier snapshots are summarised in the progress section; "
                                       "their raw stacks are not exported"))
    return out
