"""The planted-secrets corpus (tests/data/secrets_corpus.json, issue 18) through both redactors, channel by channel,
in the shape each channel's data has on the wire: no planted value survives. And the other side of the
trade-off: ordinary values (loop counters, steps, shapes, paths, function names, recorded worker output) pass
unchanged."""

from __future__ import annotations

import ast
import glob
import json
import os
from typing import Any, Dict, List

import pytest

from app.report.redact import Redactor
from app.report.share import Sharer
from workers.discover import allowed_env
from workers.redact import MASK, redact_argv, redact_message
from workers.tooltext import gdb_text, strace_text

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(HERE, "data", "secrets_corpus.json"), encoding="utf-8") as _f:
    CORPUS: List[Dict[str, Any]] = json.load(_f)["secrets"]


def strace_quote(payload: str) -> str:
    """A payload as strace prints a string argument."""
    out = payload.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r").replace("\n", "\\n")
    return '"%s"' % out


def pyspy_repr(expr: str) -> str:
    """py-spy's repr of a str/tuple/list/dict local: Python's, with double quotes."""
    return repr(ast.literal_eval(expr)).replace("'", '"')


def wire(entry: Dict[str, Any]) -> List[Any]:
    """The entry's value where the worker would carry it: one or more messages, before redaction (argv and env
    the way discovery builds them)."""
    ch = entry["channel"]
    if ch == "argv":
        argv = ["python", "train.py", *entry["argv"]]
        return [{"cmdline": redact_argv(argv)}, {"cmdline": argv}]
    if ch == "env":
        env = {entry["name"]: entry["env_value"], "RANK": "0"}
        return [{"env": allowed_env(env)}, {"env": [[entry["name"], entry["env_value"]]]}]
    if ch == "locals":
        frames = [{"name": "train", "filename": "/job/train.py", "line": 7,
                   "locals": [{"name": entry["name"], "addr": 1, "arg": False, "repr": r}]}
                  for r in (entry["expr"], pyspy_repr(entry["expr"]))]
        return [{"pyspy": [{"thread_name": "MainThread", "frames": frames}]}]
    if ch == "source":
        lines = {str(10 + i): "    " + ln for i, ln in enumerate(entry["lines"])}
        return [{"source": {"/job/train.py": lines}}]
    if ch == "thread":
        return [{"pyspy": [{"thread_id": 1, "thread_name": entry["thread_name"], "frames": []}]},
                {"output": 'Thread 2 (Thread 0x7f (LWP 12) "%s"):' % entry["thread_name"]}]
    if ch == "comm":
        return [{"procfs": {"threads": [{"tid": 1, "comm": entry["comm"]}]}},
                {"output": 'Thread 2 (Thread 0x7f (LWP 12) "%s"):' % entry["comm"]}]
    if ch == "strace":  # as the worker sends it: strace's line with its payload reduced (workers/tooltext.py)
        return [{"output": strace_text(strace_line(entry), verbs=True)}]
    if ch == "gdb":
        return [{"output": gdb_text(entry["text"])}]
    if ch == "paths":
        filename = "/srv/%s/train.py" % entry["dir"] if "dir" in entry else "/srv/job/%s.py" % entry["module"]
        frame = {"name": "train", "filename": filename, "short_filename": filename.rsplit("/", 1)[1], "line": 7}
        return [{"pyspy": [{"thread_name": "MainThread", "frames": [frame]}]},
                {"output": [{"source": "stderr", "path": filename, "text": 'File "%s", line 7' % filename}]}]
    if ch == "flight":
        field = entry["field"].rstrip("2")
        rec: Dict[str, Any] = {"pg_config": {"0": {field: entry["text"]}}} if field in ("name", "desc") else \
            {"entries": [{"profiling_name": entry["text"], "pg_id": 0}]}
        return [{"flight": {"record": rec}}]
    assert ch == "text", ch
    return [{"output": entry["text"]}, {"error": {"code": "tool_failed", "message": entry["text"]}}]


def strace_line(entry: Dict[str, Any]) -> str:
    """The payload in a sendto as strace prints it (-s 64: cut, then `...`)."""
    return '12:00:00.000001 sendto(5, %s%s, %d, 0, NULL, 0) = %d <0.000010>' % (
        strace_quote(entry["payload"][:64]), "..." if len(entry["payload"]) > 64 else "", len(entry["payload"]),
        len(entry["payload"]))


SCREENS = [e for e in CORPUS if e.get("screens", True)]  # what the pattern rules are expected to catch


def test_the_corpus_covers_every_channel_and_shape_of_the_issue() -> None:
    channels = {e["channel"] for e in CORPUS}
    assert len(CORPUS) >= 100
    assert channels >= {"argv", "env", "locals", "source", "thread", "comm", "strace", "flight", "text"}
    assert len({e["value"] for e in CORPUS}) == len(CORPUS), "every planted value is unique"
    shapes = " ".join(e["shape"] for e in CORPUS)
    for word in ("annotated", "tuple", "nested", "non-ASCII", "split across", "JWT", "PEM", "high entropy",
                 "Authorization", "X-Api-Key", "Cookie", "URL password", "GitHub", "Slack", "Stripe", "OpenAI",
                 "Hugging Face", "AWS", "GitLab", "basic",
                 # issue 25's classes
                 "-p and its value", "-pVALUE", "-u user:password", "passcode", "psk", "privkey", "holding a raw @",
                 "URL's user", "user/password@host", "webhook", "netrc", "Russian", "Japanese", "Chinese",
                 "harmless name", "subscript", "login call", "HMAC", "Redis", "IMAP", "STOMP", "ZooKeeper", "SASL",
                 "SMTP", "JSON cut", "char* argument", "recv() buffer", "token-named", "named after a token",
                 "no separator", "validation error"):
        assert word.lower() in shapes.lower(), word


@pytest.mark.parametrize("entry", SCREENS, ids=[e["id"] for e in SCREENS])
def test_no_planted_value_survives_the_node_redactor(entry: Dict[str, Any]) -> None:
    for msg in wire(entry):
        out = json.dumps(redact_message(msg), ensure_ascii=False)
        assert entry["value"] not in out, (entry["shape"], out)
        # a marker says something was there: *** where a value was masked, the size where bytes were dropped
        assert MASK in out or (entry["channel"] == "strace" and '"...' in out) or "bytes>" in out, out


@pytest.mark.parametrize("entry", CORPUS, ids=[e["id"] for e in CORPUS])
def test_no_planted_value_survives_the_export_rule_alone(entry: Dict[str, Any]) -> None:
    """Defence in depth: data the node did not redact (an older worker, a snapshot file from elsewhere) is still
    caught by what the bundle and --snapshot apply (app/report/share.py: the pattern net, then default-deny),
    every entry, also those no pattern can catch."""
    share = Sharer()
    ch = entry["channel"]
    if ch == "argv":
        out = " ".join(share.args(["python", *entry["argv"]]))
    elif ch == "env":
        out = share.value(entry["name"], entry["env_value"], "secret-env")
    elif ch == "locals":
        out = share.value(entry["name"], entry["expr"]) + share.value(entry["name"], pyspy_repr(entry["expr"]))
    elif ch == "source":
        out = "\n".join(share.source(line) for line in entry["lines"])
    elif ch == "strace":
        out = share.strace(strace_line(entry))
    elif ch == "gdb":
        out = share.gdb(entry["text"])
    elif ch == "paths":
        out = share.path("/srv/%s/train.py" % entry["dir"] if "dir" in entry else "/srv/job/%s.py" % entry["module"])
    else:
        out = json.dumps(share.tree({"output": entry.get("text") or entry.get("thread_name") or entry.get("comm")}),
                         ensure_ascii=False)
    assert entry["value"] not in out, (entry["shape"], out)
    assert sum(share.counts.values()) >= 1


def test_no_planted_value_reaches_any_file_of_a_bundle() -> None:
    """Every entry of the corpus in its channel of one snapshot (as an older worker would have sent it: not
    redacted on the node), exported: no value in any file."""
    from app.model import ErrorOutput, Frame, Local, RankSnapshot, Snapshot, StraceResult, ThreadStack
    from app.report.bundle import build_bundle

    by = {ch: [e for e in CORPUS if e["channel"] == ch] for ch in {e["channel"] for e in CORPUS}}
    locals_ = tuple(Local(e["name"], e["expr"]) for e in by["locals"])
    source = tuple((10 + i, line) for i, line in enumerate(ln for e in by["source"] for ln in e["lines"]))
    frames = (Frame("train", "/srv/%s/train.py" % by["paths"][0]["dir"], 10, locals=locals_, source=source),
              Frame("load", "/srv/job/%s.py" % by["paths"][1]["module"], 3))
    threads = (ThreadStack(tid=1, name="MainThread", frames=frames, is_main=True),) + tuple(
        ThreadStack(tid=2 + i, name=e.get("thread_name") or e["comm"]) for i, e in enumerate(by["thread"] + by["comm"]))
    rank = RankSnapshot(
        node="node01", pid=1, start_time=1, rank=0, collected=True, threads=threads,
        cmdline=("python", "train.py", *[a for e in by["argv"] for a in e["argv"]]),
        env=tuple((e["name"], e["env_value"]) for e in by["env"]),
        strace=StraceResult(seconds=1.0, output="\n".join(strace_line(e) for e in by["strace"])),
        gdb="\n".join(e["text"] for e in by["gdb"]),
        output=(ErrorOutput("stderr", "/logs/train.err", "\n".join(e["text"] for e in by["text"])),))
    bundle = build_bundle(Snapshot(taken_at=1.0, ranks=(rank,)), None, now=1.0)
    texts = {name: data.decode() for name, data in bundle.files.items()}
    leaks = [(name, e["id"]) for name, text in texts.items() for e in CORPUS
             if e["value"] in text and e["channel"] != "flight"]
    assert leaks == []


# Ordinary values a diagnosis needs: each must come out exactly as it went in.
ORDINARY_LOCALS = [
    ("step", "1200"), ("i", "3"), ("epoch", "7"), ("global_step", "48000"), ("batch_idx", "17"),
    ("loss", "2.3125"), ("lr", "0.0003"), ("shape", "(8, 128, 4096)"), ("size", "torch.Size([8, 128])"),
    ("path", '"/data/shards/train-00017-of-00128.parquet"'), ("ckpt_dir", '"/checkpoints/run-2024-11-24/step_1200"'),
    ("num_key_value_heads", "8"), ("max_tokens", "4096"), ("tokens", "512"), ("num_tokens", "7"),
    ("sort_key", "<function <lambda> at 0x7f3a9c2e4100>"), ("key", "3"), ("keys", '["input_ids", "labels"]'),
    ("tokenizer", "<LlamaTokenizerFast at 0x7f3a9c2e4100>"), ("session", "<Session at 0x7f3a9c2e4100>"),
    ("self", "<Trainer at 0x7f3a9c2e4100>"), ("tensor", "<Tensor at 0x7f3a9c2e4100>"),
    ("group", "<ProcessGroupGloo at 0x7f3a9c2e4100>"), ("rank", "3"), ("world_size", "8"),
    ("master_addr", '"10.0.0.1"'), ("device", '"cuda:0"'), ("name", '"layers.17.self_attn.k_proj"'),
    ("use_auth", "False"), ("key_cache", "None"), ("timeout", "1800.0"), ("op", '"all_reduce"'),
    ("run_id", '"a1b2c3d4e5f60718293a4b5c6d7e8f90"'), ("commit", '"0866c6d3a1f2e4b5c6d7e8f90a1b2c3d4e5f6071"'),
    ("uuid", '"3f2b8c1e-9d4a-4e6b-8a7c-1d2e3f4a5b6c"'),
]
ORDINARY_TEXT = [
    "for step, batch in enumerate(loader):", "    loss = model(batch).sum()", "dist.all_reduce(tensor)",
    "all_reduce (distributed_c10d.py:2501) <- wrapper (c10d_logger.py:81)", "def keys(self):",
    "    return self._get_token_from_header(headers)", "work.wait(timeout=timedelta(seconds=1800))",
    "python train.py --lr 0.1 --max-tokens 4096 --keyframes 3 --batch-size=32 --num-key-value-heads 8",
    "MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NCCL_SOCKET_IFNAME=eth0 TOKENIZERS_PARALLELISM=false",
    "entry_SYSCALL_64_after_hwframe+0x76/0x7e", "futex_wait_queue+0x63/0x90", "do_epoll_wait+0x4b4/0x4f0",
    "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
    "#0  0x00007f3a9c2e4100 in __futex_abstimed_wait_common (futex_word=0x55d0, expected=0, clockid=0, "
    "abstime=0x0, private=0, cancel=true) at ./nptl/futex-internal.c:57",
    "12:00:00.000001 futex(0x55d0, FUTEX_WAIT_BITSET_PRIVATE|FUTEX_CLOCK_REALTIME, 0, NULL, FUTEX_BITSET_MATCH_ANY"
    " <unfinished ...>", '12:00:00.000002 write(5, ""..., 64) = 64 <0.000010>',
    "ProcessGroupGloo::allreduce", "c10d::ProcessGroupGloo::runLoop(int)", "pt_autograd_0",
    "NCCL INFO Channel 00/02 :    0   1   2   3", "NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0",
    "https://data.example.com:8443/shards/a@b", "ssh://git@github.com/org/repo.git",
    "torch.Size([8, 128, 4096])", "step 1200/48000 loss=2.3125 lr=3e-4 tokens/s=51234",
]


@pytest.mark.parametrize("name, value", ORDINARY_LOCALS, ids=[n for n, _ in ORDINARY_LOCALS])
def test_ordinary_locals_survive(name: str, value: str) -> None:
    msg = {"pyspy": [{"thread_name": "MainThread", "frames": [
        {"name": "keys", "filename": "/job/token_utils.py", "module": "token_utils", "line": 3,
         "locals": [{"name": name, "addr": 1, "arg": False, "repr": value}]}]}]}
    assert redact_message(msg) == msg
    red = Redactor()
    assert red.value(name, value, "secret-local") == value and not red.counts


@pytest.mark.parametrize("text", ORDINARY_TEXT)
def test_ordinary_text_survives(text: str) -> None:
    msg = {"output": text, "source": {"/job/train.py": {"12": text}}}
    assert redact_message(msg) == msg
    red = Redactor()
    assert red.text(text) == text and not red.counts


def test_function_and_module_names_of_frames_are_never_touched_and_file_names_only_for_tokens() -> None:
    """A frame's function and module are code (`get_token`, `password_reset` are names, not values); its file is
    a path, whose components are checked for token shapes and randomness only (a directory named after a token
    is masked on every screen), never for secret words."""
    names = ("get_token", "password_reset", "keys", "sort_key", "_refresh_auth_cookie", "Ab3dE5fG7hJ9kL2mN4pQ6rS8tU0v")
    frames = [{"name": fn, "filename": "/job/%s.py" % fn.lower(), "short_filename": fn.lower() + ".py",
               "module": fn, "line": 1} for fn in names]
    msg = {"pyspy": [{"thread_name": "MainThread", "frames": frames}]}
    out = redact_message(msg)["pyspy"][0]["frames"]
    assert [f["name"] for f in out] == list(names) and [f["module"] for f in out] == list(names)
    assert [f["filename"] for f in out[:5]] == ["/job/%s.py" % fn for fn in names[:5]]
    token_dir = "/srv/Xk9mQ2pL7vRtYw3ZqB8nC4dF/train.py"
    tokened = redact_message({"pyspy": [{"frames": [{"name": "f", "filename": token_dir, "line": 1}]}]})
    assert tokened["pyspy"][0]["frames"][0]["filename"] == "/srv/***/train.py"


def _as_sent(value: Any) -> Any:
    """A snapshot's frames ({function, filename, line, ...}) with the function under py-spy's key, `name`."""
    if isinstance(value, list):
        return [_as_sent(v) for v in value]
    if isinstance(value, dict):
        frame = "function" in value and "filename" in value
        return {("name" if frame and k == "function" else k): _as_sent(v) for k, v in value.items()}
    return value


def test_recorded_worker_output_passes_unchanged() -> None:
    """Every recorded worker reply in tests/data (real torch ranks: stacks, locals, source, strace, gdb, /proc)
    holds no secret: redaction must change none of it (the diagnosis goldens are built from these)."""
    files = [f for f in glob.glob(os.path.join(HERE, "data", "**", "*.json"), recursive=True)
             if not f.endswith("secrets_corpus.json")]
    assert len(files) > 5
    changed = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            try:
                doc = json.load(fh)
            except ValueError:
                continue
        if isinstance(doc, dict) and isinstance(doc.get("sharing"), dict):
            # a snapshot as --snapshot writes it (tests/data/gpu's H100 recordings): its `sharing` block describes
            # the default-deny token's format (`<TYPE len=N #HASH>`), hangscope's own words, not recorded text;
            # and its frames name their function `function` where the worker's reply (py-spy's) names it `name`:
            # each value is checked under the key it was redacted under (a native `ncclTransportP2pSetup` is a
            # frame's name there, and an unknown key's mixed-case token here)
            doc = _as_sent({k: v for k, v in doc.items() if k != "sharing"})
        if redact_message(doc) != doc:
            changed.append(f)
    assert changed == []


def test_the_manifest_counts_markers_per_channel() -> None:
    """What the node replaced arrives as markers; the export's manifest counts them by the channel they sit in
    (and what its own pass replaces on top), never the values."""
    import dataclasses

    from app.model import Frame, Local, RankSnapshot, Snapshot, StraceResult, ThreadStack
    from app.report.bundle import build_bundle

    frame = Frame(function="train", filename="/job/train.py", line=3,
                  locals=(Local("password", MASK), Local("step", "3"), Local("cfg", '{"api_key": "***"}')),
                  iteration=(("item", '"Authorization: Bearer ***"'),),
                  source=((2, 'client_secret: str = "***"'), (3, "train()")))
    rank = RankSnapshot(node="n1", pid=10, start_time=1, cmdline=("python", "--pw", MASK),
                        env=(("TORCHELASTIC_RDZV_ENDPOINT", "etcd://root:***@h:2379"),),
                        threads=(ThreadStack(tid=10, name="uploader token=***", frames=(frame,)),),
                        strace=StraceResult(seconds=1.0, output='sendto(3, "X-Api-Key: ***\\r\\n"..., 20) = 20'),
                        gdb='Thread 2 (Thread 0x7f (LWP 12) "pw=***")', collected=True)
    snap = Snapshot(taken_at=1.0, ranks=(rank,))
    # a value the node let through (an older worker): the export's pass replaces it and counts it too
    leaky = dataclasses.replace(snap, ranks=(dataclasses.replace(rank, cmdline=("python", "--pw", MASK,
                                                                                  "--password=hunter2x")),))
    bundle = build_bundle(leaky, None, now=2.0)
    manifest = json.loads(bundle.files["manifest.json"])
    # the strace payload is no text in a bundle (its size only): nothing is left there to mark
    assert manifest["redactions"]["by_channel"] == {"argv": 2, "env": 1, "gdb": 1, "locals": 3, "names": 1,
                                                    "source lines": 1}
    shared = json.loads(bundle.files["snapshot.json"])["snapshot"]["ranks"][0]
    assert shared["strace"]["output"] == 'sendto(3, ""..., 20) = 20'
    assert manifest["redactions"]["by_rule"].get("secret-flag") == 1
    assert "hunter2x" not in json.dumps(manifest) and all(b"hunter2x" not in data for data in bundle.files.values())
