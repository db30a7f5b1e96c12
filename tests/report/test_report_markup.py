"""Remote text in the report formats: control sequences stripped, Markdown and HTML made inert."""

from __future__ import annotations

import pytest

from app.report.markup import h, h_sentence, md, md_block, md_code, md_sentence, strip


@pytest.mark.parametrize("raw, shown", [
    ("red\x1b[31mtext\x1b[0m", "redtext"),  # SGR colour
    ("a\x1b]0;owned title\x07b", "ab"),  # OSC retitle
    ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # OSC 8 hyperlink
    ("x\x9b2Jy", "xy"),  # C1 CSI
    ("bell\x07 nul\x00 del\x7f", "bell nul del"),
    ("abc\u202edcba\u2066", "abcdcba"),  # bidi overrides cannot reorder what is read
    ("two\nlines\ttab", "two lines    tab"),
])
def test_control_sequences_are_stripped(raw: str, shown: str) -> None:
    assert strip(raw) == shown


def test_long_text_is_cut_with_an_ellipsis() -> None:
    assert strip("x" * 10_000, 200) == "x" * 199 + "\u2026"


def test_markdown_text_cannot_become_markup() -> None:
    assert md("<script>alert(1)</script>") == "\\<script\\>alert(1)\\</script\\>"
    assert md("[click](http://evil) *b* _i_ `c` # h | t") == \
        "\\[click\\](http://evil) \\*b\\* \\_i\\_ \\`c\\` \\# h \\| t"
    assert md("- item") == "\\- item" and md("3. item") == "3\\. item"


def test_code_spans_and_blocks_cannot_be_closed_by_the_text() -> None:
    assert md_code("a`b") == "``a`b``"
    assert md_code("`x`") == "`` `x` ``"
    block = md_block("line\n```\nafter\n````")
    fence = block.split("\n")[0]
    assert fence == "`````" and block.endswith("\n" + fence)


def test_analysis_sentences_keep_their_code_parts() -> None:
    s = "rank 5 is in `next_batch` (loader.py:31) while 7 <others> wait in `all_reduce`"
    assert md_sentence(s) == "rank 5 is in `next_batch` (loader.py:31) while 7 \\<others\\> wait in `all_reduce`"
    assert h_sentence(s) == ("rank 5 is in <code>next_batch</code> (loader.py:31) while 7 &lt;others&gt; wait in "
                             "<code>all_reduce</code>")
    assert h_sentence("a `b") == "a `b"  # an unbalanced backtick is text


def test_html_escapes_attributes_too() -> None:
    assert h("\" onmouseover='x' <b>&") == "&quot; onmouseover=&#x27;x&#x27; &lt;b&gt;&amp;"
