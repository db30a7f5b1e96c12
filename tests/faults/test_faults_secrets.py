"""Fault matrix, secrets: a rank with secrets in its environment, its argv and its locals, investigated through
the real CLI on this machine: no secret value may reach the terminal, the snapshot file or any exported file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from waiting import wait_until
from worker_targets import Target, rank_env, wait_blocked

REPO = Path(__file__).resolve().parents[2]
SECRETS = {
    "env": "envSecretValue-7f3a9c2e41",
    "argv": "argvSecretValue-c81d0b5e77",
    "local": "localSecretValue-19e4a6f0d3",
    "url": "urlSecretPw-5b2e8c",
    "token": "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",  # a GitHub token shape, found by its form
}

# The locals' values come from a file, so the only way they can travel is as locals (not in argv or source).
RANK = textwrap.dedent("""
    import os, sys
    def train(password, db_url, token):
        r, _w = os.pipe()
        step = 3
        print("ready", os.getpid(), flush=True)
        os.read(r, 1)
    values = open(sys.argv[1]).read().split()
    train(values[0], "postgres://admin:%s@db:5432/x" % values[1], values[2])
""")


def test_secrets_in_env_argv_and_locals_never_reach_the_screen_or_any_file(tmp_path) -> None:
    # a job of one rank: every rank of it collected is exit 0
    env = rank_env(0, WORLD_SIZE="1", HF_TOKEN=SECRETS["env"], WANDB_API_KEY=SECRETS["env"])
    values = tmp_path / "values.txt"
    values.write_text(" ".join([SECRETS["local"], SECRETS["url"], SECRETS["token"]]))
    argv = [sys.executable, "-c", RANK, str(values), "--api-key", SECRETS["argv"], f"--password={SECRETS['argv']}"]
    with Target(argv, env=env) as t:
        wait_blocked(t.pid)
        out, bundle = tmp_path / "snap.json", tmp_path / "bundle"
        res = subprocess.run([sys.executable, "-m", "app", "--pid", str(t.pid), "--snapshot", str(out),
                              "--export", str(bundle), "--tar", "--samples", "1"],
                             cwd=str(REPO), capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, NO_COLOR="1"))
    assert res.returncode == 0, res.stderr
    assert "train" in res.stdout  # the rank really was collected, with its stack
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p != values]
    assert any(p.name.endswith(".tar.gz") for p in files) and len(files) > 4
    texts = {"stdout": res.stdout, "stderr": res.stderr}
    texts.update({str(p): p.read_bytes().decode("utf-8", "replace") for p in files
                  if not p.name.endswith(".tar.gz")})
    import tarfile

    with tarfile.open(next(p for p in files if p.name.endswith(".tar.gz"))) as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member)
            if f is not None:
                texts[f"tar:{member.name}"] = f.read().decode("utf-8", "replace")
    leaks = [(where, what) for where, text in texts.items() for what, value in SECRETS.items() if value in text]
    assert leaks == []
    assert "\x1b[" not in res.stdout, "NO_COLOR and a pipe: no escape sequences in the summary"
    # the names stay, so a reader knows what was hidden
    snap_text = out.read_text()
    assert "HF_TOKEN" in snap_text or "--api-key" in snap_text


# --- the planted corpus (issue 18) in one live rank, through every channel hangscope reads ------------------

import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tarfile  # noqa: E402
import time  # noqa: E402
from typing import Dict, Iterator, List  # noqa: E402

import pytest  # noqa: E402

CORPUS = json.loads((REPO / "tests" / "data" / "secrets_corpus.json").read_text(encoding="utf-8"))["secrets"]
# Issue 25's free-text lines go to the rank's stderr (a file, so its tail is read); the older ones (tool errors,
# NCCL lines) and gdb strings are checked offline (tests/workers/test_redact_corpus.py).
STDERR = [e for e in CORPUS if e["channel"] == "text" and int(e["id"].split("-")[1]) > 100]
LIVE = [e for e in CORPUS if e["channel"] not in ("text", "gdb")] + STDERR
# what the pattern rules are expected to catch on a screen (the TUI) and in --print (which shows the error output
# default-deny): an entry in another language or without a shape is the bundle's and the snapshot's only
SCREENS = [e for e in LIVE if e.get("screens", True)]
PRINT = [e for e in LIVE if e.get("screens", True) or e in STDERR]


def corpus_rank_program(flight_file: str, err_file: str, module_file: str) -> str:
    """A rank that carries every live entry of the corpus: locals and source lines in a chain of frames (two
    source entries right above each call, inside the source context), the innermost frame in a module whose file
    is named after a token, named threads, an OS thread name, a thread that keeps writing and sending the strace
    payloads, a stderr that is a file ending in a traceback and log lines, and a Flight Recorder dump file."""
    by = {ch: [e for e in LIVE if e["channel"] == ch] for ch in ("source", "locals", "thread", "comm", "strace",
                                                                   "flight")}
    err = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nRuntimeError: lost\n"
    err += "".join(e["text"] + "\n" for e in STDERR)
    out = ["import ctypes, importlib.util, json, os, socket, sys, threading, time",
           f"_err = open({err_file!r}, 'w')",
           "os.dup2(_err.fileno(), 2)",
           f"sys.stderr.write({err!r})",
           "sys.stderr.flush()",
           f"_spec = importlib.util.spec_from_file_location('planted_module', {module_file!r})",
           "planted_module = importlib.util.module_from_spec(_spec)",
           "_spec.loader.exec_module(planted_module)",
           "def loop(*a, **k): return None",
           "f = requests_get = connect = os_environ_set = call_with = hmac_new = loop",
           "cfg_map = {}",
           "class _Api:", "    def login(self, *a): return None", "api = _Api()",
           "class _Cfg: pass", "self_cfg = _Cfg()", "hold = threading.Event()"]
    chunks = [by["source"][i:i + 2] for i in range(0, len(by["source"]), 2)]
    for i, chunk in enumerate(chunks):
        out.append(f"def s{i}():")
        out += ["    " + line for e in chunk for line in e["lines"]]
        out.append(f"    s{i + 1}()")
    out.append(f"def s{len(chunks)}():")
    out += [f"    {e['name']} = {e['expr']}" for e in by["locals"]]
    out += ["    for item in [header, query]:  # a loop variable holding a header",
            "        r, _w = os.pipe()",
            "        print('ready', os.getpid(), flush=True)",
            "        planted_module.wait(r)"]
    out += [f"threading.Thread(target=hold.wait, name={e['thread_name']!r}, daemon=True).start()"
            for e in by["thread"]]
    comm = by["comm"][0]["comm"].encode()
    out += ["def named():",
            f"    ctypes.CDLL(None).prctl(15, {comm!r}, 0, 0, 0)",
            "    hold.wait()",
            "threading.Thread(target=named, daemon=True).start()"]
    payloads = [e["payload"].encode() for e in by["strace"]]
    out += ["def chatter():",
            "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
            "    null = os.open(os.devnull, os.O_WRONLY)",
            "    while True:",
            f"        for i, p in enumerate({payloads!r}):",
            "            if i % 2: os.write(null, p)",
            "            else: s.sendto(p, ('127.0.0.1', 9))",
            "        time.sleep(0.05)",
            "threading.Thread(target=chatter, daemon=True).start()"]
    fl = {e["field"]: e["text"] for e in by["flight"]}
    record = {"version": "2.10",
              "pg_config": {"0": {"name": fl["name"], "desc": fl["desc"], "ranks": "[0, 1]"}},
              "pg_status": {"0": {"last_enqueued_collective": 4, "last_started_collective": -1,
                                  "last_completed_collective": 3}},
              "entries": [{"record_id": i, "pg_id": 0, "collective_seq_id": 3 + i, "profiling_name": name,
                           "state": "scheduled", "retired": False, "is_p2p": False}
                          for i, name in enumerate((fl["profiling_name"], fl["profiling_name2"]))]}
    out += [f"open({flight_file!r}, 'w').write(json.dumps({record!r}))", "s0()"]
    return "\n".join(out) + "\n"


def _main_thread_blocked(pid: int, timeout: float = 30) -> None:
    """The main thread in read(2) (the others wait or chatter on purpose): its stack is the planted one."""

    def in_read() -> bool:
        try:
            with open(f"/proc/{pid}/syscall") as fh:
                return fh.read().split()[0] in ("0", "63")
        except OSError:
            return False

    wait_until(in_read, timeout, f"pid {pid} to block in read")


def write_corpus_rank(tmp: Path) -> Path:
    """The program in a directory named after a token, its module in a file named after another, its stderr
    file beside them; the program's path."""
    paths = {e["shape"].split(" ")[0]: e for e in CORPUS if e["channel"] == "paths"}
    home = tmp / paths["directory"]["dir"]
    home.mkdir()
    module = home / (paths["module"]["module"] + ".py")
    module.write_text("import os\ndef wait(r):\n    os.read(r, 1)\n", encoding="utf-8")
    prog = home / "planted_rank.py"
    prog.write_text(corpus_rank_program(str(tmp / "fr_0"), str(home / "rank.err"), str(module)), encoding="utf-8")
    return prog


def source_functions() -> int:
    """How many s<N> functions the program chains (two source entries each): the locals are in the last."""
    return -(-len([e for e in LIVE if e["channel"] == "source"]) // 2)


@pytest.fixture(scope="module")
def corpus_rank(tmp_path_factory) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("corpus-rank")
    prog = write_corpus_rank(tmp)
    # a one-rank job: exit code 0 then means every rank was collected (the code the tests assert)
    env = rank_env(0, WORLD_SIZE="1", TORCH_FR_BUFFER_SIZE="20", TORCH_FR_DUMP_TEMP_FILE=str(tmp / "fr_"),
                   **{e["name"]: e["env_value"] for e in LIVE if e["channel"] == "env"})
    argv = [sys.executable, str(prog)] + [a for e in LIVE if e["channel"] == "argv" for a in e["argv"]]
    with Target(argv, env=env) as t:
        _main_thread_blocked(t.pid)
        yield t


def _hangscope(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=str(REPO), capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, NO_COLOR="1"))


def _leaks(texts: Dict[str, str], entries: List[dict]) -> List[tuple]:
    return [(where, e["id"], e["shape"]) for where, text in texts.items() for e in entries if e["value"] in text]


def test_no_planted_value_reaches_print_the_snapshot_or_any_exported_file(corpus_rank: Target, tmp_path) -> None:
    pid = str(corpus_rank.pid)
    snap, bundle = tmp_path / "snap.json", tmp_path / "bundle"
    res = _hangscope("--pid", pid, "--locals", "--strace", "3", "--strace-data", "--gdb", "--snapshot", str(snap),
                     "--export", str(bundle), "--tar", "--samples", "1")
    assert res.returncode == 0, res.stderr
    printed = _hangscope("--pid", pid, "--print", "--samples", "1")
    assert printed.returncode == 0, printed.stderr
    texts = {"snapshot run stdout": res.stdout, "snapshot run stderr": res.stderr, "--print stdout": printed.stdout,
             "--print stderr": printed.stderr}
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    texts.update({str(p): p.read_bytes().decode("utf-8", "replace") for p in files if not p.name.endswith(".gz")})
    tarballs = [p for p in files if p.name.endswith(".tar.gz")]
    assert len(tarballs) == 1 and len(files) > 6
    with tarfile.open(tarballs[0]) as tar:
        for member in tar.getmembers():
            fh = tar.extractfile(member)
            if fh is not None:
                texts[f"tar:{member.name}"] = fh.read().decode("utf-8", "replace")
    printed_texts = {k: v for k, v in texts.items() if k.startswith("--print") or k.startswith("snapshot run std")}
    files_texts = {k: v for k, v in texts.items() if k not in printed_texts}
    assert _leaks(files_texts, LIVE) == []  # the snapshot, the bundle, the tarball: default-deny, every entry
    assert _leaks(printed_texts, PRINT) == []  # --print: what the pattern rules catch, and the error output

    # Each channel really was collected (a test that collected nothing would find nothing), with markers where
    # the values were, and the manifest counts them by channel.
    doc = json.loads(snap.read_text())
    rank = doc["snapshot"]["ranks"][0]
    functions = {f["function"] for t in rank["threads"] for f in t["frames"]}
    assert {"s0", f"s{len(functions) - 1}"} <= functions or "s0" in functions
    assert "--pass" in rank["cmdline"] and "***" in rank["cmdline"]
    assert dict(rank["env"])["TORCHELASTIC_RDZV_ENDPOINT"] == "etcd://root:***@etcd:2379"
    local_names = {loc["name"] for t in rank["threads"] for f in t["frames"] for loc in f["locals"]}
    assert {"password", "creds", "nested", "login", "blob", "item"} <= local_names
    sources = " ".join(line for t in rank["threads"] for f in t["frames"] for _, line in f["source"])
    assert 'client_secret: str = "***"' in sources and "loop(" in sources
    # strace: syscalls, sizes and results; of the bytes only the protocol verbs (--strace-data)
    strace = rank["strace"]["output"]
    assert 'sendto(' in strace and '"AUTH"...' in strace and '"GET"...' in strace and '"PASS"...' in strace
    assert "Authorization" not in strace and "password" not in strace
    assert "Thread" in rank["gdb"]
    assert rank["flight"]["source"] == "dump_file" and rank["flight"]["groups"]
    # the token-named directory and module file and the stderr tail were read, and are hashed
    frames = [f for t in rank["threads"] for f in t["frames"]]
    # (*** where the node's pattern net recognised a token, a hash where only default-deny did)
    assert any(f["function"] == "wait" and f["filename"].endswith(("***.py", ">.py")) for f in frames)
    assert rank["output"] and rank["output"][0]["path"].endswith(("***/rank.err", ">/rank.err"))
    assert "RuntimeError: lost" in rank["output"][0]["text"]
    assert doc["sharing"]["rule"] == "default-deny"
    manifest = json.loads((bundle / "manifest.json").read_text())
    by_channel = manifest["redactions"]["by_channel"]
    for channel in ("argv", "env", "locals", "source lines", "flight recorder", "names", "stacks", "error output"):
        assert by_channel.get(channel, 0) > 0, (channel, by_channel)
    # ordinary values next to the secrets survive
    assert any(loc["name"] == "item" and "***" in loc["repr"] for t in rank["threads"] for f in t["frames"]
               for loc in f["locals"])
    assert "s0" in res.stdout or "planted_rank.py" in res.stdout


def test_strace_keeps_syscall_fd_size_and_result_and_drops_the_bytes_by_default(corpus_rank: Target,
                                                                                   tmp_path) -> None:
    snap = tmp_path / "snap.json"
    res = _hangscope("--pid", str(corpus_rank.pid), "--strace", "2", "--snapshot", str(snap), "--samples", "1",
                     "--no-locals")
    assert res.returncode == 0, res.stderr
    output = json.loads(snap.read_text())["snapshot"]["ranks"][0]["strace"]["output"]
    sends = [line for line in output.splitlines() if "sendto(" in line and "= " in line]
    assert sends, output[:2000]
    # fd, size and result are there; the bytes are not, not even their verbs
    assert all('sendto(' in s and '""...' in s for s in sends), sends[:3]
    for word in ("Authorization", "password", "X-Api-Key", "Cookie", "PASS", "AUTH", "GET"):
        assert word not in output
    assert _leaks({"strace": output}, LIVE) == []


def test_raw_snapshot_says_it_is_not_for_sharing_and_holds_what_default_deny_would_hash(corpus_rank: Target,
                                                                                         tmp_path) -> None:
    snap = tmp_path / "raw.json"
    res = _hangscope("--pid", str(corpus_rank.pid), "--snapshot", str(snap), "--raw", "--samples", "1")
    assert res.returncode == 0, res.stderr
    assert "warning: --raw" in res.stderr and "do not share it" in res.stderr
    text = snap.read_text(encoding="utf-8")
    assert json.loads(text)["sharing"]["rule"] == "raw"
    assert _leaks({"raw snapshot": text}, SCREENS) == []  # the pattern net still applies, as on screen
    # what only default-deny hides is there as collected: a local in another language, the rank's own values
    assert any(e["value"] in text for e in LIVE if not e.get("screens", True))
    assert "input_ids" in text


TUI_WIDTH = 200


def _body(screen: str) -> str:
    """The tab's own lines: below the tab bar's underline (which animates when the tab changes) and above the
    footer. Pages are compared by these, so a late frame of the underline or the scrollbar is never taken for
    a new page."""
    lines = screen.splitlines()
    under = next((i for i, line in enumerate(lines) if line.count("━") >= 10 and set(line.strip()) <= set("━╸╺─╾╼ ")),
                 -1)
    # the scrollbar's columns at the right edge left out (its thumb is drawn late), and trailing blanks (a blank
    # row comes as spaces or as nothing). A line with wide characters (Japanese) is fewer characters than cells,
    # so the scrollbar is cut by its glyphs, not only by the column.
    return "\n".join(_SCROLLBAR.sub("", line[:TUI_WIDTH - 2]).rstrip() for line in lines[under + 1:-1])


def _fits(screen: str) -> bool:
    """The tab's text ends rows above the pane's bottom and no scrollbar is drawn, so there is nothing to scroll
    to: End would not move it (a tab that overflows fills the pane to its last row or the one above it, its
    padding). Otherwise the caller finds out by pressing End and waiting."""
    rows = screen.splitlines()
    under = next((i for i, line in enumerate(rows) if line.count("━") >= 10 and set(line.strip()) <= set("━╸╺─╾╼ ")),
                 -1)
    pane = rows[under + 1:-1]
    body = [row[:TUI_WIDTH - 2].strip() for row in pane]
    scrollbar = any(_SCROLLBAR.search(row) for row in pane)
    return len(body) > 3 and any(body) and not any(body[-3:]) and not scrollbar


_SCROLLBAR = re.compile(r"\s+[\u2581-\u2588\u258f\u2595\u2594]+\s*$")


def _settled(term, differs_from: str, timeout: float) -> str:
    """The screen once its tab body differs from `differs_from`'s and two captures in a row agree (a repaint
    tmux shows half done is never taken for a page); a screen like `differs_from` when nothing changed within
    `timeout`."""
    deadline = time.monotonic() + timeout
    screen = term.screen()
    while _body(screen) == _body(differs_from) and time.monotonic() < deadline:
        time.sleep(0.05)
        screen = term.screen()
    while True:
        time.sleep(0.1)
        again = term.screen()
        if again == screen:
            return screen
        screen = again


def _read_tab(term, key: str, check) -> List[str]:
    """Show a drill-down tab and page through it to its end: every screenful, as the user would see them. The
    end is known first (End shows the last screenful), so no page is ever taken for the end because a loaded
    machine repainted it late."""
    term.keys(key)
    term.keys("Home")  # from its top (PageDown/Home/End scroll the tab shown; Tab goes to the next tab)
    term.wait_for(check, f"tab {key}")
    first = _settled(term, "", 0)
    if _fits(first):
        return [first]
    term.keys("End")
    last = _settled(term, first, 10.0)  # a tab that fits one screen does not move
    if _body(last) == _body(first):
        return [first]
    term.keys("Home")
    try:
        term.wait_for(lambda s: _body(s) == _body(first), f"tab {key} back at its top", timeout=30)
    except AssertionError:
        import difflib
        now = term.screen()
        raise AssertionError(f"tab {key}: Home did not show its first screen again:\n" + "\n".join(
            difflib.unified_diff(_body(first).splitlines(), _body(now).splitlines(), lineterm=""))) from None
    seen = [first]
    while _body(seen[-1]) != _body(last):
        assert len(seen) < 80, f"tab {key}: more than 80 pages, or PageDown never reached the End screen"
        term.keys("PageDown")
        seen.append(_settled(term, seen[-1], 60.0))
        assert _body(seen[-1]) != _body(seen[-2]), f"tab {key}: PageDown did not move within 60 s"
    return seen


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_no_planted_value_reaches_the_tui_screens(corpus_rank: Target, tmp_path) -> None:
    """The real TUI in tmux on the live rank: the main screen, then every tab of the rank's drill-down paged
    through to its end, strace (with --strace-data) and gdb run from the TUI."""
    from test_ui_tmux import Terminal, hangscope, wait_exit

    exit_file = tmp_path / "exit"
    term = Terminal(hangscope("--pid", corpus_rank.pid, "--fps", 20, "--strace-data", exit_file=exit_file),
                    size=f"{TUI_WIDTH}x60")
    screens: Dict[str, str] = {}
    try:
        screens["main"] = term.wait_for(lambda s: "snapshot 1/1" in s, "the first snapshot", timeout=120)
        term.keys("Enter")
        term.wait_for(lambda s: "Env & cmdline" in s, "the drill-down")
        term.keys("s")
        term.wait_for(lambda s: "strace 1 rank" in s, "the strace confirmation")
        term.keys("y")
        term.wait_for(lambda s: "Env & cmdline" in s and "strace 1 rank" not in s, "the drill-down again")
        term.keys("4")
        term.wait_for(lambda s: "sendto(" in s, "the strace output", timeout=90)
        term.keys("g")
        term.wait_for(lambda s: "gdb" in s and "rank" in s, "the gdb confirmation")
        term.keys("y")
        term.keys("5")
        term.wait_for(lambda s: "Thread" in s and "LWP" in s, "the gdb output", timeout=90)
        for key, tab, shows in (("1", "threads", "s0  planted_rank"), ("2", "locals", f"s{source_functions()} (planted_rank.py:"), ("3", "source", "→"),
                                ("4", "strace", "sendto("), ("5", "gdb", "LWP"), ("6", "proc", "wchan"),
                                ("7", "env", "--pass")):
            for i, screen in enumerate(_read_tab(term, key, lambda s, shows=shows: shows in s)):
                screens[f"{tab} {i}"] = screen
        term.keys("Escape")
        term.wait_for(lambda s: "findings" in s, "the main screen again")
        term.keys("q")
        assert wait_exit(exit_file) == 0
    finally:
        term.close()
    assert _leaks(screens, SCREENS) == []
    shown = "\n".join(screens.values())
    # the screens did show the channels, with markers where the values were (strace: the verb, not its arguments)
    for pattern in (r"password +=? ?\*\*\*", r"client_secret: str = \"\*\*\*\"", r'sendto\(\d+, "AUTH"\.\.\.',
                    r"--pass", r"etcd://root:\*\*\*@etcd:2379", r"pw=\*\*\*", r'os\.environ\["HF_HUB_TOKEN"\] = "\*\*\*"'):
        assert re.search(pattern, shown), (pattern, [v for k, v in screens.items() if k.startswith("source")])


def _host_pid_running(script: Path, timeout: float = 60) -> int:
    """The host pid of the process running `script` (started inside a test node)."""

    def running() -> int:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/cmdline", "rb") as fh:
                        argv = fh.read().split(b"\0")
                except OSError:
                    continue
                if len(argv) > 1 and argv[1] == str(script).encode():
                    return int(name)
        return 0

    return wait_until(running, timeout, f"{script} to start", interval=0.05)


@pytest.mark.cluster
def test_no_planted_value_leaves_a_cluster_node_over_ssh(make_cluster, tmp_path) -> None:
    """The same planted rank on a node of the SSH test cluster, investigated from the login side as a user
    does (hosts file, real sshd, the worker shipped over SSH) with --locals, --strace with its data, --gdb and
    the Flight Recorder: nothing planted reaches --print, the snapshot, the export or its tarball."""
    from cluster import UNHURRIED_LOGIN, run_login
    import testenv

    cluster = make_cluster(1)
    node = cluster.nodes[0]
    prog = write_corpus_rank(tmp_path)  # /tmp is shared with the test nodes
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "TORCH_FR_BUFFER_SIZE": "20",
           "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_"),
           **{e["name"]: e["env_value"] for e in LIVE if e["channel"] == "env"}}
    argv = [testenv.PYTHON, str(prog)] + [a for e in LIVE if e["channel"] == "argv" for a in e["argv"]]
    node.spawn(argv, env=env)
    _main_thread_blocked(_host_pid_running(prog))
    hosts = cluster.hosts_file(tmp_path)
    snap, bundle = tmp_path / "snap.json", tmp_path / "bundle"
    res = run_login([sys.executable, "-m", "app", str(hosts), *UNHURRIED_LOGIN, "--locals", "--strace", "3", "--strace-data", "--gdb",
                     "--snapshot", str(snap), "--export", str(bundle), "--tar", "--samples", "1"], cluster,
                    timeout=180, cwd=str(REPO))
    assert res.returncode == 0, res.stdout + res.stderr
    printed = run_login([sys.executable, "-m", "app", str(hosts), *UNHURRIED_LOGIN, "--print", "--samples", "1"], cluster, timeout=180,
                        cwd=str(REPO))
    assert printed.returncode == 0, printed.stderr
    texts = {"snapshot run": res.stdout + res.stderr, "--print": printed.stdout + printed.stderr}
    files = [p for p in (snap, *bundle.rglob("*")) if p.is_file()]
    texts.update({str(p): p.read_bytes().decode("utf-8", "replace") for p in files if not p.name.endswith(".gz")})
    tarballs = [p for p in bundle.parent.rglob("*.tar.gz")]
    assert len(tarballs) == 1
    with tarfile.open(tarballs[0]) as tar:
        for member in tar.getmembers():
            fh = tar.extractfile(member)
            if fh is not None:
                texts[f"tar:{member.name}"] = fh.read().decode("utf-8", "replace")
    assert _leaks({k: v for k, v in texts.items() if k != "--print"}, LIVE) == []
    assert _leaks({"--print": texts["--print"]}, PRINT) == []
    # what was collected over SSH carries every channel, with markers where the values were
    rank = json.loads(snap.read_text())["snapshot"]["ranks"][0]
    assert rank["node"] == node.name and "--pass" in rank["cmdline"] and "***" in rank["cmdline"]
    assert "sendto(" in rank["strace"]["output"] and '"AUTH"...' in rank["strace"]["output"]
    assert "Thread" in rank["gdb"] and rank["flight"]["source"] == "dump_file"
    by_channel = json.loads((bundle / "manifest.json").read_text())["redactions"]["by_channel"]
    for channel in ("argv", "env", "locals", "source lines", "flight recorder", "names"):
        assert by_channel.get(channel, 0) > 0, (channel, by_channel)
