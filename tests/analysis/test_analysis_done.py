"""What hangscope did to each process, where users read it (issue 16.4: report exactly what was done to each
process): ranks treated alike on one line, with what was left undone and why; in --print's summary, summary.md,
report.html (escaped) and the rank view's /proc tab; a dump's notes decoded from the worker's reply."""

from __future__ import annotations

import dataclasses

from app.analysis import analyze
from app.analysis.done import done_lines
from app.analysis.text import summary_text
from app.decode import replies
from app.model import RankSnapshot
from app.report import build_bundle
from app.ui import rank_text
from test_report_build import make_snapshot

PAUSED = "py-spy dump: paused ~12 ms, resumed"
HELD = "py-spy dump --nonblocking: read its memory, never attached"
NOTE = "not attached: the process is stopped; dumped with py-spy --nonblocking <b>"


def _snap():  # type: ignore[no-untyped-def]
    snap = make_snapshot("barrier", culprit_rank=5)
    ranks = [dataclasses.replace(r, actions=("read /proc", HELD) if r.rank == 5 else ("read /proc", PAUSED),
                                 notes=(NOTE,) if r.rank == 5 else ()) for r in snap.ranks]
    return dataclasses.replace(snap, ranks=tuple(ranks))


def test_ranks_treated_alike_are_one_line_with_what_was_left_undone() -> None:
    assert done_lines(_snap()) == [
        f"ranks 0-4,6-7 on node[01-02]: read /proc; {PAUSED}",
        f"rank 5 on node02: read /proc; {HELD} ({NOTE})"]


def test_the_summary_the_bundle_and_the_rank_view_show_them() -> None:
    snap = _snap()
    analysis = analyze(snap)
    text = summary_text(snap, analysis)
    assert f"What hangscope did to the processes:\n  ranks 0-4,6-7 on node[01-02]: read /proc; {PAUSED}" in text
    bundle = build_bundle(snap, analysis)
    html = bundle.files["report.html"].decode()
    assert "What hangscope did to the processes</h2>" in html and "&lt;b&gt;" in html and "<b>" not in html
    assert "## What hangscope did to the processes" in bundle.files["summary.md"].decode()
    r5 = next(r for r in snap.ranks if r.rank == 5)
    plain = rank_text.proc_text(r5).plain
    assert f"What hangscope did to it\n  read /proc\n  {HELD}\n  {NOTE}" in plain


def test_a_dumps_notes_are_decoded_bounded() -> None:
    rank = RankSnapshot(node="n", pid=7, start_time=1)
    item = {"pid": 7, "pyspy": [], "actions": ["read /proc"], "notes": [NOTE, 5, "x" * 900] + ["y"] * 30}
    got = replies.apply_dump(rank, item)  # type: ignore[arg-type]
    assert got.actions == ("read /proc",)
    assert got.notes[0] == NOTE and got.notes[1] == "x" * 500 and len(got.notes) == 19  # 20 read, 5 is no text
