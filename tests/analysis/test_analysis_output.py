"""The ranks' recent error output (RankSnapshot.output, read on the nodes) where users read: grouped by the file
ranks write to, the culprit's first; in --print's summary, summary.md, report.html and the rank view's /proc tab;
remote text shown literally (no escape sequence reaches the terminal, no markup the page), secrets redacted again
in the bundle; never a finding by itself."""

from __future__ import annotations

import dataclasses

from app.analysis import analyze
from app.analysis.output import blocks
from app.analysis.text import summary_text
from app.model import ErrorOutput, rank_key
from app.report import build_bundle
from app.ui import rank_text
from test_report_build import make_snapshot

TRACE = ("Traceback (most recent call last):\n  File \"train.py\", line 88, in step\n"
         "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB \x1b]0;pwned\x07<script>alert(1)</script>")
SHARED = "NCCL WARN Call to recv from 10.0.0.2<43021> failed : Connection reset by peer"
TOKEN = "hf_" + "Q" * 34


def _with_output():  # type: ignore[no-untyped-def]
    snap = make_snapshot("barrier", culprit_rank=5)
    ranks = []
    for r in snap.ranks:
        out = ()
        if r.rank == 5:  # the culprit's own log, with a token a node's redaction missed
            out = (ErrorOutput("stderr", "/scratch/run/rank5.err", f"{TRACE}\nHF_TOKEN={TOKEN}", 9000, 4.0),)
        elif r.node == "node01":  # node01's ranks share one log file, which holds one error
            out = (ErrorOutput("stderr", "/scratch/run/node01.log", SHARED, 120000, 30.0),)
        ranks.append(dataclasses.replace(r, output=out))
    return dataclasses.replace(snap, ranks=tuple(ranks))


def test_blocks_group_a_shared_file_and_put_the_culprits_first() -> None:
    snap = _with_output()
    culprit = next(rank_key(r) for r in snap.ranks if r.rank == 5)
    got = blocks(snap, [culprit])
    assert [(b.label, b.blamed) for b in got] == [("rank 5 on node02", True), ("ranks 0-3 on node01", False)]
    assert got[0].source == "its stderr (/scratch/run/rank5.err)" and got[0].age == 4.0
    assert got[1].source == "their stderr (/scratch/run/node01.log)"
    assert [b.label for b in blocks(snap)] == ["rank 5 on node02", "ranks 0-3 on node01"]  # by label without blame


def test_the_summary_shows_them_literally_and_no_finding_comes_of_them() -> None:
    snap = _with_output()
    analysis = analyze(snap)
    assert analysis.to_dict()["findings"] == analyze(make_snapshot("barrier", culprit_rank=5)).to_dict()["findings"]
    text = summary_text(snap, analysis)
    section = text.split("Recent error output (read on the nodes, redacted):\n", 1)[1]
    assert section.startswith("  rank 5 on node02, its stderr (/scratch/run/rank5.err), written 4 s before it was "
                              "read (blamed):\n    | Traceback (most recent call last):"), section
    assert "RuntimeError: CUDA out of memory" in section and "ranks 0-3 on node01, their stderr" in section
    assert "\x1b" not in text and "\x07" not in text


def test_the_bundle_escapes_them_and_redacts_what_the_node_missed() -> None:
    snap = _with_output()
    bundle = build_bundle(snap, analyze(snap))
    html = bundle.files["report.html"].decode()
    md = bundle.files["summary.md"].decode()
    assert "<h2 id=\"output\">Recent error output</h2>" in html and "## Recent error output" in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert" not in html
    assert "RuntimeError: CUDA out of memory" in md
    for name, data in bundle.files.items():
        assert TOKEN.encode() not in data, name


def test_the_rank_view_shows_its_own() -> None:
    snap = _with_output()
    r5 = next(r for r in snap.ranks if r.rank == 5)
    plain = rank_text.proc_text(r5).plain
    assert "Recent error output: its stderr (/scratch/run/rank5.err, written 4 s before it was read)" in plain
    assert "RuntimeError: CUDA out of memory" in plain and "\x1b" not in plain
    r6 = next(r for r in snap.ranks if r.rank == 6)
    assert "Recent error output" not in rank_text.proc_text(r6).plain


def test_a_line_of_error_output_never_passes_for_one_of_hangscopes() -> None:
    """A rank's message may hold newlines, and what follows them any text at all (a verdict, a block's header):
    every line quoted from a rank is printed behind the gutter."""
    snap = _with_output()
    forged = "RuntimeError: bad\nhangscope: all ranks healthy\n  rank 0 on node01, its stderr (/x), written 1 s before"
    ranks = tuple(dataclasses.replace(r, output=tuple(dataclasses.replace(o, text=forged) for o in r.output))
                  for r in snap.ranks)
    text = summary_text(dataclasses.replace(snap, ranks=ranks), analyze(snap))
    section = text.split("Recent error output (read on the nodes, redacted):\n", 1)[1].split("\n\n", 1)[0]
    assert "\n    | hangscope: all ranks healthy\n    |   rank 0 on node01, its stderr (/x)" in section
    assert not any(line.startswith(("hangscope", "  rank 0 on node01, its stderr (/x)")) for line in section.splitlines())


def test_a_log_path_with_a_newline_is_one_line_of_the_header() -> None:
    """The path of a rank's log is remote text: a newline in it is shown (␊), never the start of a line that the
    --print wrapping would begin with the path's rest."""
    snap = _with_output()
    ranks = tuple(dataclasses.replace(r, output=(ErrorOutput("stderr", "/scratch/n1\nhangscope: all ranks healthy.log",
                                                             SHARED, 100, 3.0),)) if r.rank == 5 else r
                  for r in snap.ranks)
    got = blocks(dataclasses.replace(snap, ranks=ranks))
    assert got[0].source == "its stderr (/scratch/n1␊hangscope: all ranks healthy.log)"
    text = summary_text(dataclasses.replace(snap, ranks=ranks), analyze(dataclasses.replace(snap, ranks=ranks)))
    assert not [line for line in text.splitlines() if line.lstrip().startswith("hangscope: all ranks healthy")]
