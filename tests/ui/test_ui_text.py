"""Remote text in the TUI: shown literally (no markup, no escape sequences), capped, and the rank tabs."""

from __future__ import annotations

from rich.text import Text

from app.ui import rank_text
from app.ui.safe import clean, lines, literal
from test_ui_support import build_snapshot, with_hostile_names

HOSTILE = ["[bold]x[/", "[/]", "\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "a\u202eb", "tab\there", "nl\nx"]


def test_markup_is_never_interpreted():
    for s in ("[bold]x[/", "[/]", "[link=http://x]y[/link]", "[red on blue]"):
        t = literal(s)
        assert t.plain == s and not t.spans


def test_escape_sequences_and_controls_become_visible_pictures():
    assert clean("\x1b]0;pwned\x07") == "␛]0;pwned␇"
    assert clean("\x1b[2J") == "␛[2J"
    assert clean("a\u202eb") == "a\ufffdb"  # bidi override: cannot reorder what the user reads
    assert clean("nl\nx") == "nl␊x"
    assert clean("tab\there") == "tab    here"
    for s in HOSTILE:
        assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in clean(s, None))


def test_long_text_is_capped_before_work_is_done():
    t = clean("N" * 10_000, 160)
    assert len(t) == 160 and t.endswith("…")
    out = lines("x\n" * 10, max_lines=3)
    assert out.plain.count("\n") == 3 and "7 more lines" in out.plain


def test_every_tab_renders_hostile_rank_literally():
    snap = with_hostile_names(build_snapshot(nodes=1, per_node=2, strace=True, gdb=True))
    rank = snap.rank_by_number(0)
    assert rank is not None
    for render in (rank_text.threads_text, rank_text.locals_text, rank_text.source_text, rank_text.strace_text,
                   rank_text.gdb_text, rank_text.proc_text, rank_text.env_text):
        text = render(rank)
        assert isinstance(text, Text)
        assert "\x1b" not in text.plain and "\x07" not in text.plain
        for line in text.plain.splitlines():
            assert len(line) < 4200  # a 10 kB name or value is cut, not shown whole
    threads = rank_text.threads_text(rank).plain
    assert "[bold]evil[/" in threads and "␛]0;pwned␇" in threads
    env = rank_text.env_text(rank).plain
    assert "[bold]x[/ ␛]0;x␇" in env and "RANK=[red]0" in env


def test_threads_tab_shows_iteration_and_native_frames():
    snap = build_snapshot(nodes=2, per_node=2, culprit=3)
    text = rank_text.threads_text(snap.rank_by_number(3)).plain
    assert "train  train.py:43  [step=6]" in text
    assert "all_reduce  distributed_c10d.py:2501" in text
    assert "(main)" in text


def test_source_tab_marks_the_current_line():
    snap = build_snapshot(nodes=1, per_node=1, culprit=0)
    text = rank_text.source_text(snap.ranks[0]).plain
    assert "→    43         dist.all_reduce(grad, group=groups[step % 2])" in text
    assert "     42         loss.backward()" in text


def test_missing_tool_output_says_how_to_get_it():
    rank = build_snapshot(nodes=1, per_node=1).ranks[0]
    assert "Press s" in rank_text.strace_text(rank).plain
    assert "Press g" in rank_text.gdb_text(rank).plain
    no_locals = build_snapshot(nodes=1, per_node=1, locals_=False).ranks[0]
    assert "Collect with locals" in rank_text.locals_text(no_locals).plain


def test_locals_tab_and_report_mark_module_globals_read_from_memory():
    from dataclasses import replace

    from app.model import Frame, Local, RankSnapshot, ThreadStack
    from app.report.html_ranks import frames_table

    module = Frame("<module>", "/w/train.py", 7, locals=(Local("iter_num", "41"),))
    step = Frame("step", "/w/train.py", 3, locals=(Local("x", "1"),))
    rank = replace(RankSnapshot(node="n", pid=10, start_time=1),
                   threads=(ThreadStack(tid=10, name="", frames=(step, module), is_main=True),))
    shown = rank_text.locals_text(rank).plain.splitlines()
    assert any(line.strip().startswith("iter_num") and line.endswith("41  (global)") for line in shown), shown
    assert any(line.strip().startswith("x") and line.endswith("= 1") for line in shown), shown
    html = frames_table((step, module))
    assert "iter_num (global) = 41" in html and "x = 1" in html


# -- names the job chose at run time: on screen by the default-deny rule of what is shared ---------------------

READABLE = ["MainThread", "pt_autograd_0", "Thread-3 (_worker)", "python3", "metrics-uploader", "ProcessGroupGloo",
            "dataloader_worker-2"]


def _random_names(n: int = 60, length: int = 15) -> list:
    """OS thread names of random letters alone (no digit, no case change): nothing in them says secret."""
    import random
    rnd = random.Random(25)
    return ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(length)) for _ in range(n)]


def _gdb_rank(names: list):
    import dataclasses
    rank = build_snapshot(nodes=1, per_node=1, gdb=True).rank_by_number(0)
    head = "\n".join(f'Thread {i + 2} (Thread 0x7f00{i:04x} (LWP {100 + i}) "{n}"):\n'
                     f'#0  0x00007f3a in __futex_abstimed_wait_common () from /lib/libc.so.6' for i, n in enumerate(names))
    listing = "\n".join(f'* {i + 1}    Thread 0x7f00{i:04x} (LWP {100 + i}) "{n}" 0x00007f3a in epoll_wait ()'
                        for i, n in enumerate(names))
    threads = tuple(dataclasses.replace(rank.threads[0], tid=100 + i, name=n) for i, n in enumerate(names))
    return dataclasses.replace(rank, gdb=f"{head}\n{listing}\n#1  0x00007f3b in recv (buf=<21 bytes>)", threads=threads)


def test_thread_names_a_job_chose_show_when_they_read_like_names_and_hashed_otherwise():
    from workers.cleartext import clear_word, share_name

    def _tok(kind: str, text: str) -> str:
        return "<%s len=%d>" % (kind, len(text))
    randoms = _random_names()
    rank = _gdb_rank(READABLE + randoms)
    screens = {"gdb": rank_text.gdb_text(rank).plain, "threads": rank_text.threads_text(rank).plain,
               "proc": rank_text.proc_text(rank).plain}
    for tab, shown in screens.items():
        for name in READABLE:
            assert name in shown, (tab, name)
        hidden = [n for n in randoms if n not in shown]
        # the screen follows the shared files' rule for a thread's name exactly (share_name: a name's shape, every
        # word clear): a random name that happens to have one stays
        assert hidden == [n for n in randoms if share_name(n, _tok) != n], tab
        assert all(n in hidden for n in randoms if not clear_word(n)), tab  # every name the word rule hides, still
        assert len(hidden) >= 50, f"{tab}: only {len(hidden)} of {len(randoms)} random names hidden"
    gdb = screens["gdb"]
    assert gdb.count("len=15 #") >= 2 * 50  # each hidden name as its length and a hash, in both header shapes
    one = next(n for n in randoms if not clear_word(n))
    tokens = {line[line.index('"<'):line.index('>"') + 2] for line in gdb.splitlines() if f"(LWP {100 + len(READABLE) + randoms.index(one)})" in line}
    assert len(tokens) == 1, f"the same name hashes the same in every header: {tokens}"
    assert "#1  0x00007f3b in recv (buf=<21 bytes>)" in gdb  # lines that are not thread headers stay as they were


def test_a_thread_name_of_no_names_shape_is_hidden_on_screen_as_in_the_shared_files():
    """A name built from `user@host:password` or a token's first 15 bytes (an OS thread's comm): every word of it
    may read like a name, its shape does not; hidden whole in the thread list, the /proc tab and gdb's headers."""
    odd = ["sftp-ops@nas.example:Birch.Heron7713", "npm_Q7hT2kLx9Rv", "shpat_7Kemo2Xa"]
    rank = _gdb_rank(READABLE + odd)
    for tab, shown in {"gdb": rank_text.gdb_text(rank).plain, "threads": rank_text.threads_text(rank).plain,
                       "proc": rank_text.proc_text(rank).plain}.items():
        for secret in ("Birch.Heron7713", "Heron7713", "Q7hT2kLx9Rv", "7Kemo2Xa"):
            assert secret not in shown, (tab, secret)
        for name in READABLE:
            assert name in shown, (tab, name)
