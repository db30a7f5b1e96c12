"""Default-deny where data leaves the user's screen (app/report/share.py): the export bundle and --snapshot show a
value in clear only when the rule finds it safe, everything else as `<str len=N #hash>` with a key made per bundle;
values keep comparing equal within a bundle; --raw writes them as collected, and says so."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import re
from contextlib import redirect_stderr
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from app.analysis import analyze
from app.model import ErrorOutput, Frame, Local, RankSnapshot, Snapshot, StraceResult, ThreadStack
from app.report import build_bundle
from app.report.share import Sharer
from test_report_build import make_snapshot
from workers.cleartext import HIDDEN, WORD, clear_word, foreign

TOKEN = re.compile(r"<(str|bytes|text) len=(\d+) #([0-9a-f]{8})>")
# A value of no safe shape that no pattern catches either (no token shape, not mixed case), under harmless names
# everywhere below: what only default-deny hides.
RANDOM = "qv7kz3xw9pjt2mhd"


def _rank(pid: int, rank: int, value: str, thread: str = "worker") -> RankSnapshot:
    frame = Frame("train", "/job/train.py", 12, locals=(Local("name", repr(value)), Local("step", "3"),
                                                         Local("key", "'input_ids'")),
                  source=((12, f"    name = {value!r}  # the run's name"),))
    return RankSnapshot(node="node01", pid=pid, start_time=1, rank=rank, collected=True,
                        cmdline=("python", "train.py", "--run", value, "--lr", "0.1"),
                        threads=(ThreadStack(tid=pid, name=thread, frames=(frame,), is_main=True),))


def test_a_value_of_no_safe_shape_is_its_type_length_and_hash_everywhere() -> None:
    snap = Snapshot(taken_at=1.0, ranks=(_rank(10, 0, RANDOM), _rank(11, 1, RANDOM), _rank(12, 2, "other-" + RANDOM)))
    shared = Sharer().snapshot(snap)
    text = json.dumps(dataclasses.asdict(shared))
    assert RANDOM not in text
    r0, r1, r2 = shared.ranks
    local = r0.threads[0].frames[0].locals[0].repr
    assert TOKEN.fullmatch(local.strip("'")) and TOKEN.fullmatch(local.strip("'")).group(1) == "str"
    assert f"len={len(RANDOM)} " in local
    # the same value hashes the same across ranks, in locals, command lines and source: still comparable
    assert r1.threads[0].frames[0].locals[0].repr == local
    assert r0.cmdline[3] == local.strip("'") == r1.cmdline[3]
    assert local.strip("'") in r0.threads[0].frames[0].source[0][1]
    assert r2.threads[0].frames[0].locals[0].repr != local  # rank 2's value differs from the others'
    # ordinary values and the code's shape stay
    assert r0.threads[0].frames[0].locals[1:] == (Local("step", "3"), Local("key", "'input_ids'"))
    assert r0.cmdline[:3] == ("python", "train.py", "--run") and r0.cmdline[4:] == ("--lr", "0.1")
    assert r0.threads[0].frames[0].source[0][1].startswith("    name = '<str len=16 #")
    assert r0.threads[0].frames[0].source[0][1].endswith("'  # the run's name")


def test_hashes_are_keyed_per_bundle() -> None:
    snap = Snapshot(taken_at=1.0, ranks=(_rank(10, 0, RANDOM),))
    a = build_bundle(snap, None, now=1.0).files["snapshot.json"].decode()
    b = build_bundle(snap, None, now=1.0).files["snapshot.json"].decode()
    ta = {m.group(0) for m in TOKEN.finditer(a)}
    tb = {m.group(0) for m in TOKEN.finditer(b)}
    assert ta and tb and not ta & tb  # a new key each bundle: a hash cannot be matched across bundles
    assert {t.split("#")[0] for t in ta} == {t.split("#")[0] for t in tb}  # the same types and lengths
    assert Sharer(b"k" * 16).text(RANDOM) == Sharer(b"k" * 16).text(RANDOM)


def test_every_channel_of_a_bundle_is_default_deny() -> None:
    """Thread names, paths, error output, strace, gdb and the analysis's sentences: in clear only what the rule
    allows, in every file of the bundle."""
    snap = make_snapshot("dataloader", failed_node=True)
    r = snap.ranks[5]
    main = r.threads[0]
    odd = ThreadStack(tid=r.pid + 9, name=f"uploader-{RANDOM}", frames=(
        Frame("fetch", f"/srv/{RANDOM}/fetch.py", 3, locals=(Local("url", f"'https://{RANDOM}@hooks.example/x'"),)),))
    r = dataclasses.replace(
        r, threads=(main, odd),
        output=(ErrorOutput("stderr", f"/logs/{RANDOM}.err", f"Traceback ...\nValueError: bad value {RANDOM}\n"
                                                               "Пароль: sunshine"),),
        strace=StraceResult(seconds=1.0, output=f'sendto(5, "AUTH {RANDOM}\\r\\n"..., 64, 0, NULL, 0) = 64'),
        gdb=f'#0  0x7f in recv (fd=5, buf=0x7ffd "{RANDOM}\\r\\n", len=64) at recv.c:28')
    snap = dataclasses.replace(snap, ranks=snap.ranks[:5] + (r,) + snap.ranks[6:])
    bundle = build_bundle(snap, analyze(snap), now=1.0)
    for name, data in bundle.files.items():
        text = data.decode()
        assert RANDOM not in text and "sunshine" not in text, name
    doc = json.loads(bundle.files["snapshot.json"])
    shared = doc["snapshot"]["ranks"][5]
    assert shared["threads"][1]["name"].startswith("<str len=")  # `uploader-...` is one word: hidden whole
    assert re.fullmatch(r"/srv/<str len=16 #[0-9a-f]{8}>/fetch\.py", shared["threads"][1]["frames"][0]["filename"])
    assert shared["strace"]["output"] == 'sendto(5, "AUTH"..., 64, 0, NULL, 0) = 64'
    assert "<" in shared["gdb"] and "bytes>" in shared["gdb"]
    # the pattern net masks the value after the Russian word for password (`Пароль: ***`, 11 characters), then the
    # line, in a script the name rules cannot read, is hidden whole
    assert shared["output"][0]["text"].splitlines()[-1].startswith("<text len=11 #")
    assert doc["sharing"]["rule"] == "default-deny"
    manifest = json.loads(bundle.files["manifest.json"])
    assert manifest["redactions"]["by_rule"]["default-deny"] >= 5


_VALUES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(value=_VALUES, thread=_VALUES, arg=_VALUES)
def test_no_value_of_unknown_shape_leaves_a_shared_snapshot_in_clear(value: str, thread: str, arg: str) -> None:
    """Property: whatever a rank holds (a local, a thread name, an argument, a source literal), every word of the
    shared snapshot is a clear word or a token."""
    snap = Snapshot(taken_at=1.0, ranks=(_rank(10, 0, value, thread=thread),))
    snap = dataclasses.replace(snap, ranks=(dataclasses.replace(snap.ranks[0], cmdline=("python", arg)),))
    shared = Sharer().snapshot(snap)
    r = shared.ranks[0]
    f = r.threads[0].frames[0]
    for text in (f.locals[0].repr, r.threads[0].name, r.cmdline[1], f.source[0][1]):
        rest = HIDDEN.sub(" ", text)
        assert all(clear_word(w) for w in WORD.findall(rest)) and not foreign(rest), (text, value)


def test_snapshot_is_default_deny_and_raw_says_it_is_not(tmp_path: Path) -> None:
    from app.cli import headless

    snap = Snapshot(taken_at=1.0, ranks=(_rank(10, 0, RANDOM),))
    shared, raw = tmp_path / "shared.json", tmp_path / "raw.json"
    err = io.StringIO()
    with redirect_stderr(err):
        headless.report(snap, snapshot_path=str(shared), out=io.StringIO())
    assert "warning" not in err.getvalue()
    doc = json.loads(shared.read_text())
    assert doc["sharing"]["rule"] == "default-deny" and RANDOM not in shared.read_text()
    err = io.StringIO()
    with redirect_stderr(err):
        headless.report(snap, snapshot_path=str(raw), out=io.StringIO(), raw=True)
    assert "warning: --raw" in err.getvalue() and "do not share it" in err.getvalue()
    doc = json.loads(raw.read_text())
    assert doc["sharing"]["rule"] == "raw" and RANDOM in raw.read_text()


def test_print_quotes_error_output_as_it_would_be_shared() -> None:
    from app.cli import headless

    r = dataclasses.replace(_rank(10, 0, "run"), output=(
        ErrorOutput("stderr", f"/logs/{RANDOM}.err", f"RuntimeError: login failed for {RANDOM}"),))
    snap = Snapshot(taken_at=1.0, ranks=(r,))
    out = io.StringIO()
    with redirect_stderr(io.StringIO()):
        headless.report(snap, out=out)
    assert "RuntimeError: login failed for <str len=16 #" in out.getvalue() and RANDOM not in out.getvalue()
    raw = io.StringIO()
    with redirect_stderr(io.StringIO()):
        headless.report(snap, out=raw, raw=True)
    assert RANDOM in raw.getvalue()


def test_a_name_in_another_script_is_hidden_as_one_word_never_letter_by_letter() -> None:
    """Hashing a word a letter at a time would be a substitution cipher: a run of letters outside ASCII in code goes
    as one token."""
    out = Sharer().source("    пароль = get(x)  # ok")
    assert out.startswith("    <str len=6 #") and out.endswith("> = get(x)  # ok") and out.count("<str") == 1


# -- values no name explains: a positional literal, a thread's name, the word after a label in error output ------


def test_a_literal_passed_positionally_is_shown_only_in_a_names_shape() -> None:
    """No keyword says what a positional literal is (`SMB(host, user, pw)`): a password of words and digits, or of
    symbols that would split it into harmless-looking pieces, is hidden whole; the ordinary arguments stay."""
    share = Sharer()
    for line, secret in [
        ('    smb = SMBConnection("svc-train", "Heron.Vault2291", "client", "nas01")', "Heron.Vault2291"),
        ("    db = connect('db.internal', 'loader', 'r4T!w@9zQ%eK')", "r4T!w@9zQ%eK"),
        ('    sftp.open_session("Quill&Ember#0815")', "Quill&Ember#0815"),
        ('    client = Vendor("api.vendor.example", "GraniteOwl7730")', "GraniteOwl7730"),
    ]:
        out = share.source(line)
        assert secret not in out and f'"<str len={len(secret)} #' in out.replace("'", '"'), out
        for piece in re.split(r"[^A-Za-z0-9]+", secret):
            assert len(piece) < 4 or piece not in out, (piece, out)
    for line in ['    dist.init_process_group("nccl", timeout=td)',
                 '    tok = AutoTokenizer.from_pretrained("meta-llama/Llama-2-7b-hf", revision="main")',
                 '    logger.info("step=%d loss=%.4f", step, loss)',
                 '    print(f"rank {rank}: waiting for {peer} on cuda:0")',
                 '    x = torch.load("ckpt/step_1200.pt", map_location="cpu")',
                 '    raise RuntimeError("peer 10.0.0.3 did not answer after 600s")',
                 '    subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "-i", "3"])',
                 '    smb = SMBConnection("svc-train", user, "client", "nas01")']:
        assert share.source(line) == line


def test_a_thread_name_is_shown_only_in_a_names_shape() -> None:
    """A thread (or an OS thread's comm) named from `user@host:password` or from a token's first bytes is hidden
    whole in the shared snapshot, and in the bundle's every file; ordinary thread names stay."""
    odd = ["backup-ops@files.example:Marsh.Wren4402", "dop_v1_9QxZ2aKp", "glsa_9Tomu-Rk"]
    snap = make_snapshot("dataloader")
    r = snap.ranks[1]
    threads = r.threads + tuple(ThreadStack(tid=r.pid + 20 + i, name=n, frames=(Frame("wait", "/job/bg.py", 9),))
                                for i, n in enumerate(odd + ["ckpt-writer-rank1", "Thread-3 (worker)"]))
    gdb = "\n".join(f'Thread {i + 2} (Thread 0x7f00{i:04x} (LWP {r.pid + 20 + i}) "{n}"):\n#0  0x7f in poll ()'
                    for i, n in enumerate(odd))  # the OS thread names in gdb's thread headers, too
    snap = dataclasses.replace(snap, ranks=(snap.ranks[0], dataclasses.replace(r, threads=threads, gdb=gdb))
                               + snap.ranks[2:])
    bundle = build_bundle(snap, analyze(snap), now=1.0)
    for name, data in bundle.files.items():
        for secret in ("Marsh.Wren4402", "Wren4402", "9QxZ2aKp", "9Tomu-Rk"):
            assert secret not in data.decode(), (name, secret)
    names = [t["name"] for t in json.loads(bundle.files["snapshot.json"])["snapshot"]["ranks"][1]["threads"]]
    assert sum(1 for n in names if TOKEN.fullmatch(n)) == 3
    assert "ckpt-writer-rank1" in names and "Thread-3 (worker)" in names


def test_print_hides_a_value_after_a_label_in_error_output_whatever_the_labels_language() -> None:
    """Default-deny does not know the label (`Notfallkennung:`), so the value after it is shown only in a name's
    shape: a password of words and digits is hidden in --print as in the bundle; the rest of the line stays."""
    from app.cli import headless

    r = dataclasses.replace(_rank(10, 0, "run"), output=(ErrorOutput("stderr", "/logs/rank0.err", (
        "Traceback (most recent call last):\nRuntimeError: upload refused\n"
        "WARN Notfallkennung: OrchidPebble6618 (Konto etl)\n")),))
    snap = Snapshot(taken_at=1.0, ranks=(r,))
    out = io.StringIO()
    with redirect_stderr(io.StringIO()):
        headless.report(snap, out=out)
    assert "OrchidPebble6618" not in out.getvalue()
    assert "WARN Notfallkennung: <str len=16 #" in out.getvalue() and "RuntimeError: upload refused" in out.getvalue()
    bundle = build_bundle(snap, analyze(snap), now=1.0)
    for name, data in bundle.files.items():
        assert "OrchidPebble6618" not in data.decode(), name


def _ranks_on_one_stack(count: int, shared: bool) -> Snapshot:
    """`count` ranks on the same stack, whose frames hold a value no rule lets through and a token the net
    recognises, started with a secret flag: one frames tuple for all of them as the decode interns it (shared), or
    an equal copy for each rank."""
    frame = Frame("step", "/job/train.py", 40, locals=(Local("run", repr(RANDOM)), Local("tok", "'hf_" + "aB3x" * 9 + "'"),
                                                        Local("i", "7")),
                  source=((40, f"    run = {RANDOM!r}"),))
    frames = (frame, Frame("main", "/job/train.py", 90))
    ranks = tuple(RankSnapshot(node="node01", pid=100 + r, start_time=1, rank=r, collected=True,
                               cmdline=("python", "train.py", "--password", "Walnut.Tulip2549", "--run", RANDOM),
                               threads=(ThreadStack(tid=100 + r, name="worker", is_main=True,
                                                    frames=frames if shared else copy.deepcopy(frames)),))
                  for r in range(count))
    return Snapshot(taken_at=1.0, ranks=ranks)


def test_what_ranks_share_is_judged_once_and_counted_at_every_use() -> None:
    key = b"k" * 16
    one = Sharer(key)
    one.snapshot(_ranks_on_one_stack(1, shared=True))
    for_one = one.summary()
    assert for_one and all(v > 0 for v in for_one.values())
    shared, copied = Sharer(key), Sharer(key)
    out = shared.snapshot(_ranks_on_one_stack(40, shared=True))
    assert out == copied.snapshot(_ranks_on_one_stack(40, shared=False))
    # the counts a bundle reports are those of judging every rank, whether its frames are shared or not
    assert shared.summary() == copied.summary() == {rule: 40 * n for rule, n in for_one.items()}
    assert RANDOM not in json.dumps(dataclasses.asdict(out)) and "Walnut" not in json.dumps(dataclasses.asdict(out))


def test_a_tool_version_and_a_gpu_name_are_judged_like_any_node_text() -> None:
    """A node (or a crafted snapshot file) writes its tools' version lines and its GPUs' names: they read like
    vocabulary and stay when they are (`py-spy 0.4.3`, `NVIDIA H100 80GB HBM3`), but a token put in them does not."""
    from app.model import GpuHealth, GpuUse, NodeGpuEvidence, NodeInfo, NodeStatus, ToolInfo

    token, word = "ghp_Q3mZ8vK1xT6wN0cR5yB2hL9pD4sF7jA1eG0u", "qzvkxmtrbwplnhgdjcfsaeyuioqzvkxm"
    node = NodeStatus("gpu-n3", state="done", info=NodeInfo(tools=(
        ToolInfo("py-spy", "/usr/local/bin/py-spy", "py-spy 0.4.3"),
        ToolInfo("gdb", "/usr/bin/gdb", f"gdb token={token}"))),
        gpu=NodeGpuEvidence(gpus=(GpuHealth(index=0, name="NVIDIA H100 80GB HBM3"),
                                  GpuHealth(index=1, name=f"NVIDIA H100 {word}"))))
    r = dataclasses.replace(_rank(40, 0, "x"), node="gpu-n3",
                            gpus=(GpuUse(0, "GPU-8c1d", "NVIDIA A100-SXM4-80GB"), GpuUse(1, "GPU-9e2f", f"A100 {word}")))
    shared = Sharer().snapshot(Snapshot(taken_at=1.0, nodes=(node,), ranks=(r,)))
    text = repr(shared)
    assert token not in text and word not in text
    tools = shared.nodes[0].info.tools
    assert tools[0].version == "py-spy 0.4.3" and HIDDEN.search(tools[1].version)
    gpu = shared.nodes[0].gpu
    assert gpu is not None and gpu.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert shared.ranks[0].gpus[0].name == "NVIDIA A100-SXM4-80GB"


def test_a_name_with_newlines_is_one_line_of_summary_md() -> None:
    """A function or file name holding a newline (remote text) is shown with ␊ in summary.md's stacks: never a
    line of its own that reads as hangscope's or as a Markdown heading."""
    forged = "load\nhangscope: FORGED all ranks healthy\n# FAKE-HEADING"
    frames = (Frame(forged, "/srv/job/\n# FAKE.py", 12), Frame("main", "/srv/job/run.py", 40))
    ranks = tuple(dataclasses.replace(_rank(50 + i, i, "x"), threads=(ThreadStack(
        50 + i, "MainThread", frames=frames if i == 1 else frames[1:], state="S", is_main=True),)) for i in range(4))
    snap = Snapshot(taken_at=1.0, ranks=ranks)
    with redirect_stderr(io.StringIO()):
        bundle = build_bundle(snap, analyze(snap))
    md = bundle.files["summary.md"].decode()
    assert not [line for line in md.splitlines() if "FORGED" in line and line.lstrip().startswith("hangscope:")]
    assert not [line for line in md.splitlines() if line.startswith("# FAKE")]
    assert "␊" in md
