#!/usr/bin/env python3
"""Run every case of manifest.json against `hangscope --load` and check the outputs.

Sequential and light. Writes results.json and results.md next to this file (or to --out DIR).
--selftest: use a stub instead of hangscope (to debug the harness only).
--only ID[,ID...]: a subset.
"""
import html
import html.parser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_DIR = os.environ.get("HS_LOADFILES_DIR", "/tmp/hs-loadfiles/cases")
RUNS = "/tmp/hs-loadfiles/runs"
HANGSCOPE = os.environ.get("HANGSCOPE", "/work/venv/bin/hangscope")
RSS_KILL_MB = 3072
TB = "Traceback (most recent call last)"
# hangscope's own traceback: a line at column 0, or a frame of hangscope's own code; a rank's error output
# quoted by --print (README: it quotes the ranks' stderr tails) is indented and is data, not a crash
OWN_TB = re.compile(r"^Traceback \(most recent call last\)|^  File \"[^\"]*/(app/(?!demo/)|site-packages/(textual|rich)/)", re.M)

C0 = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")  # \t, \n allowed; \r forbidden too
BIDI = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


# ------------------------------------------------------------------ process running
def run_cmd(argv, cwd, env, bound_s, stdin_mode=None, stdin_data=None, stdin_path=None, preexec_close0=False,
            during=None, logdir=None):
    """Returns dict(rc, wall, rss_mb, killed, out(bytes), err(bytes))."""
    os.makedirs(logdir, exist_ok=True)
    fo = open(os.path.join(logdir, "stdout"), "wb")
    fe = open(os.path.join(logdir, "stderr"), "wb")
    stdin = subprocess.DEVNULL
    closefd = None
    if stdin_mode == "file":
        stdin = open(stdin_path, "rb")
    elif stdin_mode == "null":
        stdin = open("/dev/null", "rb")
    elif stdin_mode == "dir":
        closefd = os.open(stdin_path, os.O_RDONLY)
        stdin = closefd
    elif stdin_mode in ("pipe", "slow"):
        stdin = subprocess.PIPE
    elif stdin_mode == "closed":
        stdin = None
    pre = None
    if preexec_close0:
        def pre():
            os.close(0)
    t0 = time.monotonic()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=fo, stderr=fe, start_new_session=True,
                         preexec_fn=pre)
    feeder = None
    if stdin_mode in ("pipe", "slow"):
        def feed():
            try:
                if stdin_mode == "pipe":
                    p.stdin.write(stdin_data)
                else:
                    for i in range(0, len(stdin_data), 65536):
                        p.stdin.write(stdin_data[i:i + 65536])
                        p.stdin.flush()
                        time.sleep(0.05)
            except (BrokenPipeError, OSError):
                pass
            try:
                p.stdin.close()
            except OSError:
                pass
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
    stop = threading.Event()
    if during:
        dt = threading.Thread(target=during, args=(stop,), daemon=True)
        dt.start()
    killed = None
    peak = 0
    rc = None
    ru = None
    while True:
        pid, status, ru_ = os.wait4(p.pid, os.WNOHANG)
        if pid:
            ru = ru_
            rc = os.waitstatus_to_exitcode(status)
            p.returncode = rc
            break
        try:
            with open("/proc/%d/status" % p.pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        peak = max(peak, int(line.split()[1]) // 1024)
        except OSError:
            pass
        el = time.monotonic() - t0
        if peak > RSS_KILL_MB and not killed:
            killed = "rss>%dMB" % RSS_KILL_MB
            os.killpg(p.pid, signal.SIGKILL)
        if el > bound_s + 15 and not killed:
            killed = "timeout>%ss" % (bound_s + 15)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    wall = time.monotonic() - t0
    stop.set()
    try:
        os.killpg(p.pid, signal.SIGKILL)  # leftovers of its group, if any
    except (ProcessLookupError, PermissionError):
        pass
    fo.close()
    fe.close()
    if closefd is not None:
        os.close(closefd)
    elif hasattr(stdin, "close"):
        stdin.close()
    if feeder:
        feeder.join(2)
    rss = max(peak, (ru.ru_maxrss // 1024) if ru else 0)
    with open(os.path.join(logdir, "stdout"), "rb") as f:
        out = f.read(8_000_000)
    with open(os.path.join(logdir, "stderr"), "rb") as f:
        err = f.read(2_000_000)
    outsize = os.path.getsize(os.path.join(logdir, "stdout"))
    return dict(rc=rc, wall=round(wall, 2), rss_mb=rss, killed=killed, out=out, err=err, outsize=outsize)


# ------------------------------------------------------------------ sandbox per mode
def listing(d):
    res = {}
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            try:
                st = os.lstat(p)
                res[os.path.relpath(p, d)] = (st.st_size, st.st_mtime_ns, st.st_mode)
            except OSError:
                res[os.path.relpath(p, d)] = None
    return res


def prepare_input(c, ind):
    """Create the input in `ind`; return (path_arg, stdin spec dict, during-callable, skip_hash)."""
    inv = c["invoke"]
    src = c.get("file")
    spec = {}
    during = None
    skiphash = False
    name = os.path.basename(src) if src else "snap.json"
    if inv == "path":
        p = os.path.join(ind, name)
        os.link(src, p)
        return p, spec, during, skiphash
    if inv == "fifo-nowriter":
        p = os.path.join(ind, "snap.json")
        os.mkfifo(p)
        return p, spec, during, skiphash
    if inv == "fifo-writer":
        p = os.path.join(ind, "snap.json")
        os.mkfifo(p)
        data = open(src, "rb").read()

        def during(stop):
            while not stop.is_set():
                try:
                    fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:
                    time.sleep(0.02)
                    continue
                try:
                    os.set_blocking(fd, True)
                    os.write(fd, data)
                except OSError:
                    pass
                os.close(fd)
                return
        return p, spec, during, skiphash
    if inv.startswith("literal:"):
        return inv[len("literal:"):], spec, during, skiphash
    if inv == "dir":
        p = os.path.join(ind, "adir.json")
        os.mkdir(p)
        return p, spec, during, skiphash
    if inv == "missing":
        return os.path.join(ind, "nope.json"), spec, during, skiphash
    if inv == "symlink":
        real = os.path.join(ind, "real.json")
        os.link(src, real)
        p = os.path.join(ind, "link.json")
        os.symlink(real, p)
        return p, spec, during, skiphash
    if inv.startswith("symlink-to:"):
        p = os.path.join(ind, "link.json")
        os.symlink(inv[len("symlink-to:"):], p)
        return p, spec, during, skiphash
    if inv == "symlink-loop":
        a, b = os.path.join(ind, "a.json"), os.path.join(ind, "b.json")
        os.symlink(b, a)
        os.symlink(a, b)
        return a, spec, during, skiphash
    if inv == "devstdin":
        return "/dev/stdin", dict(stdin_mode="pipe", stdin_data=open(src, "rb").read()), during, skiphash
    if inv == "stdin":
        return "-", dict(stdin_mode="file", stdin_path=src), during, skiphash
    if inv == "stdin-null":
        return "-", dict(stdin_mode="null"), during, skiphash
    if inv == "stdin-closed":
        return "-", dict(stdin_mode="closed", preexec_close0=True), during, skiphash
    if inv == "stdin-dir":
        return "-", dict(stdin_mode="dir", stdin_path=ind), during, skiphash
    if inv == "stdin-slow":
        return "-", dict(stdin_mode="slow", stdin_data=open(src, "rb").read()), during, skiphash
    if inv == "rewrite":
        p = os.path.join(ind, "snap.json")
        data = open(src, "rb").read()
        with open(p, "wb") as f:
            f.write(data)

        def during(stop):
            variants = [data[: len(data) // 3], b"\x00garbage{{{", data, data + data[:100]]
            i = 0
            while not stop.is_set():
                try:
                    with open(p, "r+b") as f:
                        f.truncate(0)
                        f.write(variants[i % len(variants)])
                except OSError:
                    pass
                i += 1
                time.sleep(0.003)
        return p, spec, during, True
    if inv == "same-out":
        p = os.path.join(ind, "snap.json")
        shutil.copyfile(src, p)
        return p, spec, during, skiphash
    if inv == "ctrlname":
        p = os.path.join(ind, "snap\x1b[31mx.json")
        os.link(src, p)
        return p, spec, during, skiphash
    if inv == "unicodename":
        p = os.path.join(ind, "snäpshot-日本.json")
        os.link(src, p)
        return p, spec, during, skiphash
    if inv == "sparse":
        p = os.path.join(ind, "sparse.json")
        with open(p, "wb") as f:
            f.truncate(8 << 30)
        return p, spec, during, True
    raise ValueError(inv)


def file_digest(p):
    import hashlib
    h = hashlib.sha256()
    try:
        with open(p, "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                h.update(b)
    except OSError as e:
        return "ERR:%s" % e.__class__.__name__
    return h.hexdigest()


# ------------------------------------------------------------------ checks
def decode(b):
    try:
        return b.decode("utf-8"), True
    except UnicodeDecodeError:
        return b.decode("utf-8", "replace"), False


def bad_chars(s, bidi=True):
    m = C0.search(s.replace("\r\n", "\n") if False else s)
    found = []
    if m:
        found.append("control U+%04X at %d" % (ord(m.group()), m.start()))
    if bidi:
        m2 = BIDI.search(s)
        if m2:
            found.append("bidi U+%04X at %d" % (ord(m2.group()), m2.start()))
    return found


class HtmlScan(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems = []

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if "XSS" in (k or "") or "XSS" in (v or "") or "data-pwn" in (k or "") or "evil.example" in (v or ""):
                self.problems.append("element <%s %s=%r> made by a payload" % (tag, k, (v or "")[:80]))

    handle_startendtag = handle_starttag


def shell_quote_state(span):
    """For each index of span, True when the char there is inert for bash (quoted/escaped)."""
    inert = [False] * len(span)
    sq = dq = False
    i = 0
    while i < len(span):
        ch = span[i]
        if sq:
            inert[i] = True
            if ch == "'":
                sq = False
        elif ch == "\\" and i + 1 < len(span):
            inert[i] = inert[i + 1] = True
            i += 2
            continue
        elif dq:
            inert[i] = ch not in "$`"
            if ch == '"':
                dq = False
        elif ch == "'":
            sq = True
            inert[i] = True
        elif ch == '"':
            dq = True
            inert[i] = True
        i += 1
    return inert


def check_shell(text, marker):
    """A backticked command holding the marker must keep the payload's trigger inert."""
    probs = []
    for m in re.finditer(r"`([^`\n]*)`", text):
        span = m.group(1)
        if marker not in span:
            continue
        inert = shell_quote_state(span)
        for t in re.finditer(r"(;|\$\(|\|)\s*(touch|sh\b|id)", span):
            if not inert[t.start()]:
                probs.append("unquoted %r before %r in command `%s`" % (t.group(1), t.group(2), span[:160]))
    # a payload whose backtick split the span: `...$(touch ...SHX..)`id`SHX` -> marker right after a backtick
    return probs


def md_tables(md):
    probs = []
    lines = md.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|"):
            j = i
            block = []
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                block.append(lines[j])
                j += 1
            if len(block) >= 2 and re.match(r"^\s*\|[\s:|-]+\|?\s*$", block[1]):
                counts = [len(re.findall(r"(?<!\\)\|", ln)) for ln in block]
                for k, n in enumerate(counts):
                    if n != counts[0]:
                        probs.append("table row has %d pipes, header %d: %s" % (n, counts[0], block[k][:160]))
                        break
            i = j
        else:
            i += 1
    return probs


def md_render_check(md):
    probs = []
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return ["markdown_it missing"]
    h = MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    for m in re.finditer(r"<(a|img)\b[^>]*(href|src)=\"([^\"]*)\"", h):
        if "evil.example" in m.group(3):
            probs.append("summary.md renders <%s %s=%s>" % (m.group(1), m.group(2), m.group(3)[:80]))
    for m in re.finditer(r"<(script|img|svg)\b[^>]*>", h):
        if "XSS" in m.group(0) or "evil" in m.group(0):
            probs.append("summary.md renders raw HTML %s" % m.group(0)[:100])
    return probs


def chromium_check(path, work):
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not exe:
        return None, "no chromium"
    home = os.path.join(work, "chromehome")
    os.makedirs(home, exist_ok=True)
    env = dict(os.environ, HOME=home)
    try:
        r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000",
                            "--user-data-dir=" + os.path.join(home, "prof"), "--dump-dom", "file://" + path],
                           capture_output=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        return None, "chromium timeout"
    dom = r.stdout.decode("utf-8", "replace")
    if not dom.strip():
        return None, "chromium gave no DOM"
    if re.search(r"<body[^>]*data-pwn", dom):
        return ["payload script ran in chromium (body has data-pwn)"], "ok"
    return [], "ok"


def all_files(d):
    res = []
    for root, _, files in os.walk(d):
        for n in files:
            res.append(os.path.join(root, n))
    return res


def check_outcome(c, mode, r, outdir, reasons, notes):
    rc = r["rc"]
    out, _ = decode(r["out"])
    err, _ = decode(r["err"])
    exp = c["expect"]
    written = listing(outdir)

    def reject_rules():
        if rc != 2:
            reasons.append("%s: exit %s, expected 2" % (mode, rc))
        lines = [ln for ln in err.split("\n") if ln.strip()]
        if len(lines) != 1:
            reasons.append("%s: stderr has %d lines, expected 1: %r" % (mode, len(lines), err[:300]))
        elif len(lines[0]) > 400:
            reasons.append("%s: stderr line %d chars" % (mode, len(lines[0])))
        if c.get("field") and c["field"].lower() not in err.lower():
            reasons.append("%s: stderr does not name the field `%s`: %r" % (mode, c["field"], err[:200]))
        if written:
            reasons.append("%s: rejected but wrote %s" % (mode, sorted(written)[:5]))

    def load_rules():
        if rc not in (0, 1):
            reasons.append("%s: exit %s, expected 0/1" % (mode, rc))
        if mode == "print" and not out.strip():
            reasons.append("print: empty summary")
        if mode == "export":
            ex = os.path.join(outdir, "export")
            for n in ("summary.md", "report.html", "snapshot.json"):
                if not os.path.isfile(os.path.join(ex, n)):
                    reasons.append("export: %s missing" % n)
        if mode == "snapshot":
            p = os.path.join(outdir, "out.json")
            if not os.path.isfile(p):
                reasons.append("snapshot: OUT not written")
            else:
                try:
                    with open(p, "rb") as f:
                        json.loads(f.read(), parse_constant=lambda x: (_ for _ in ()).throw(ValueError(x)))
                except Exception as e:  # noqa: BLE001
                    reasons.append("snapshot: OUT is not strict JSON (%s)" % str(e)[:80])

    if r["killed"]:
        reasons.append("%s: killed (%s)" % (mode, r["killed"]))
        return
    if mode == "snapshot" and exp != "reject":
        # revised after the aborted first start (see FIRST-RUN.md): --help says --snapshot collects and
        # --load refuses collection flags, so --load F --snapshot OUT is refused: one line naming --snapshot
        reject_rules()
        if "--snapshot" not in err:
            reasons.append("snapshot: the refusal does not name --snapshot: %r" % err[:200])
        return
    if exp == "reject":
        reject_rules()
    elif exp == "load":
        load_rules()
    elif exp == "clean":
        if rc == 2:
            reject_rules()
            notes.append("%s: rejected: %s" % (mode, err.strip()[:160]))
        else:
            load_rules()
            notes.append("%s: loaded (exit %s)" % (mode, rc))
    elif exp == "load-or-reject-version":
        if rc == 2:
            reject_rules()
            notes.append("%s: rejected: %s" % (mode, err.strip()[:160]))
        else:
            load_rules()
            if "version" not in err.lower():
                reasons.append("%s: loaded a schema_version it does not know without a warning naming the version"
                               % mode)


def check_text_outputs(c, mode, r, outdir, reasons, notes, texts):
    out, ok1 = decode(r["out"])
    err, ok2 = decode(r["err"])
    if not (ok1 and ok2):
        reasons.append("%s: stdout/stderr is not valid UTF-8" % mode)
    for nm, s in (("stdout", out), ("stderr", err)):
        mt = OWN_TB.search(s)
        if mt:
            reasons.append("%s: traceback on %s: %s" % (mode, nm, s[mt.start():][:300].replace("\n", " | ")))
        b = bad_chars(s)
        if b:
            reasons.append("%s: %s holds %s" % (mode, nm, ", ".join(b)))
    if r["outsize"] > c["print_max"]:
        reasons.append("%s: stdout is %d bytes (> %d)" % (mode, r["outsize"], c["print_max"]))
    texts.append(("%s stdout" % mode, out))
    texts.append(("%s stderr" % mode, err))
    # files
    for p in all_files(outdir):
        rel = os.path.relpath(p, outdir)
        if p.endswith(".gz"):
            continue
        with open(p, "rb") as f:
            data = f.read(200_000_000)
        s, ok = decode(data)
        if not ok:
            reasons.append("%s: %s is not valid UTF-8" % (mode, rel))
        b = bad_chars(s, bidi=rel.endswith((".md", ".html")))
        if b:
            reasons.append("%s: %s holds %s" % (mode, rel, ", ".join(b)))
        texts.append((rel, s))


def check_secrets(c, texts, reasons, printed):
    for sec, print_too in c["secrets"]:
        for name, s in texts:
            is_screen = name.endswith("stdout") or name.endswith("stderr")
            if is_screen and not print_too:
                continue
            if sec in s:
                reasons.append("secret %s... in %s" % (sec[:10], name))


def check_markup(c, name, s, reasons):
    for m in c["markers"]:
        for occ in re.finditer(re.escape(m) + r"(?![A-Za-z0-9])", s):
            i = occ.start()
            if i == 0 or s[i - 1] != "]":
                reasons.append("markup interpreted in %s: %r" % (name, s[max(0, i - 40):i + 20]))
                break


def check_forged(c, name, s, reasons):
    for fl in c["forged"]:
        for ln in s.split("\n"):
            if ln.lstrip().startswith(fl):
                reasons.append("forged line in %s: %r" % (name, ln[:120]))
                break


# ------------------------------------------------------------------ TUI
TMUX_SOCK = "hs-loadfiles-bench"


def tmux(*a, check=False):
    return subprocess.run(["tmux", "-L", TMUX_SOCK, "-f", "/dev/null"] + list(a), capture_output=True, text=True,
                          check=check)


def run_tui(c, work, inpath, reasons, notes):
    cwd = os.path.join(work, "cwd")
    home = os.path.join(work, "home")
    tmp = os.path.join(work, "tmp")
    for d in (cwd, home, tmp):
        os.makedirs(d, exist_ok=True)
    status = os.path.join(work, "status")
    q = lambda x: "'" + x.replace("'", "'\\''") + "'"  # noqa: E731
    cmd = ("cd %s && env -i PATH=/usr/bin:/bin HOME=%s TMPDIR=%s LANG=C.UTF-8 TERM=xterm-256color %s --load %s; "
           "echo $? > %s" % (q(cwd), q(home), q(tmp), q(HANGSCOPE), q(inpath), q(status)))
    tmux("kill-server")
    tmux("new-session", "-d", "-s", "c", "-x", "160", "-y", "50", "sh -c " + q(cmd))
    tmux("set-option", "-g", "set-clipboard", "on")
    t0 = time.monotonic()
    last = None
    stable = 0
    plain = ""
    bound = max(20, c["bound_s"])
    while time.monotonic() - t0 < bound:
        time.sleep(0.5)
        if os.path.exists(status):
            break
        cap = tmux("capture-pane", "-p", "-t", "c").stdout
        if cap == last and cap.strip():
            stable += 1
        else:
            stable = 0
        last = cap
        if stable >= 4 and time.monotonic() - t0 > 4:
            break
    plain = tmux("capture-pane", "-p", "-t", "c").stdout
    esc = tmux("capture-pane", "-p", "-e", "-t", "c").stdout
    title = tmux("display-message", "-p", "-t", "c", "#{pane_title}").stdout
    bufs = tmux("list-buffers").stdout
    early = os.path.exists(status)
    if early:
        reasons.append("tui: exited before q (status %s): %r" % (open(status).read().strip(), plain.strip()[-300:]))
    else:
        tmux("send-keys", "-t", "c", "q")
        t1 = time.monotonic()
        while time.monotonic() - t1 < 10 and not os.path.exists(status):
            time.sleep(0.2)
        if not os.path.exists(status):
            reasons.append("tui: did not quit within 10 s of q")
        else:
            st = open(status).read().strip()
            if st not in ("0", "1"):
                reasons.append("tui: exit %s after q" % st)
    tmux("kill-server")
    if OWN_TB.search(plain) or "MarkupError" in plain or re.search(r"/app/(?!demo/)\S*\.py", plain):
        reasons.append("tui: traceback on screen")
    if "rank" not in plain.lower():
        reasons.append("tui: the screen shows no rank: %r" % plain.strip()[:200])
    if re.search(r"\x1b\]8;[^\x07\x1b]*evil\.example", esc):
        reasons.append("tui: OSC 8 hyperlink to the planted host")
    if "pwned" in title:
        reasons.append("tui: pane title set by the payload: %r" % title.strip())
    if bufs.strip():
        reasons.append("tui: a paste buffer appeared (OSC 52?): %r" % bufs.strip()[:100])
    if "\x1b[31mKESC01" in esc or "\x1b[5m" in esc:
        reasons.append("tui: planted SGR reached the terminal")
    check_markup(c, "tui", plain, reasons)
    for d in (cwd, home, tmp):
        if os.listdir(d):
            reasons.append("tui: wrote into %s: %s" % (os.path.basename(d), os.listdir(d)[:5]))
    notes.append("tui screen: %r" % " ".join(plain.split())[:160])


# ------------------------------------------------------------------ a case
def mode_argv(mode, outdir):
    if mode == "print":
        return ["--print"]
    if mode == "export":
        return ["--export", os.path.join(outdir, "export")]
    if mode == "snapshot":
        return ["--snapshot", os.path.join(outdir, "out.json")]
    raise ValueError(mode)


def run_case(c):
    reasons, notes = [], []
    timings = {}
    texts_all = []
    base = os.path.join(RUNS, c["id"])
    shutil.rmtree(base, ignore_errors=True)
    for mode in c["modes"]:
        work = os.path.join(base, mode)
        dirs = {k: os.path.join(work, k) for k in ("cwd", "home", "tmp", "in", "out")}
        for d in dirs.values():
            os.makedirs(d)
        inpath, spec, during, skiphash = prepare_input(c, dirs["in"])
        before_in = listing(dirs["in"])
        dig = None if (skiphash or not os.path.isfile(inpath)) else file_digest(inpath)
        env = dict(PATH="/usr/bin:/bin", HOME=dirs["home"], TMPDIR=dirs["tmp"], LANG="C.UTF-8", TERM="dumb")
        if c["invoke"] == "same-out":
            extra = ["--snapshot", inpath]
            outdir_check = dirs["out"]
        else:
            extra = mode_argv(mode, dirs["out"])
            outdir_check = dirs["out"]
        argv = [HANGSCOPE, "--load", inpath] + extra
        r = run_cmd(argv, dirs["cwd"], env, c["bound_s"], during=during, logdir=os.path.join(work, "log"), **spec)
        timings[mode] = dict(rc=r["rc"], wall=r["wall"], rss_mb=r["rss_mb"])
        if r["wall"] > c["bound_s"]:
            reasons.append("%s: took %.1f s (bound %s s)" % (mode, r["wall"], c["bound_s"]))
        if r["rss_mb"] > c["bound_mb"]:
            reasons.append("%s: peak RSS %d MB (bound %d MB)" % (mode, r["rss_mb"], c["bound_mb"]))
        check_outcome(c, mode, r, outdir_check, reasons, notes)
        texts = []
        check_text_outputs(c, mode, r, outdir_check, reasons, notes, texts)
        texts_all.extend(texts)
        for k in ("cwd", "home", "tmp"):
            if os.listdir(dirs[k]):
                reasons.append("%s: wrote into %s: %s" % (mode, k, os.listdir(dirs[k])[:5]))
        if c["invoke"] not in ("rewrite",):
            after_in = listing(dirs["in"])
            if after_in != before_in:
                reasons.append("%s: the input folder changed: %s" % (mode, sorted(set(after_in) ^ set(before_in))[:5]
                                                                   or "metadata"))
            if dig and file_digest(inpath) != dig:
                reasons.append("%s: the input file changed" % mode)
        # per-text checks
        for name, s in texts:
            if name.endswith("stdout"):
                check_markup(c, name, s, reasons)
            if name.endswith("stdout") or name.endswith(".md"):
                check_forged(c, name, s, reasons)
            if c["shell"] and (name.endswith("stdout") or name.endswith(".md")):
                for m in c["shell"]:
                    reasons.extend("%s: %s" % (name, p) for p in check_shell(s, m))
        if mode == "export" and r["rc"] in (0, 1):
            ex = os.path.join(dirs["out"], "export")
            rep = os.path.join(ex, "report.html")
            if os.path.isfile(rep):
                hs = HtmlScan()
                try:
                    hs.feed(open(rep, encoding="utf-8", errors="replace").read())
                except Exception as e:  # noqa: BLE001
                    reasons.append("report.html does not parse: %s" % e)
                reasons.extend("report.html: " + p for p in hs.problems[:3])
                if c["xss"]:
                    probs, st = chromium_check(rep, work)
                    notes.append("chromium: %s" % st)
                    if probs:
                        reasons.extend("report.html: " + p for p in probs)
            smd = os.path.join(ex, "summary.md")
            if os.path.isfile(smd):
                md = open(smd, encoding="utf-8", errors="replace").read()
                reasons.extend("summary.md: " + p for p in md_tables(md)[:3])
                reasons.extend(md_render_check(md)[:3])
        rtp = os.path.join(dirs["out"], "export", "snapshot.json")
        if mode == "export" and c["roundtrip"] and r["rc"] in (0, 1) and os.path.isfile(rtp):
            rt = run_cmd([HANGSCOPE, "--load", rtp, "--print"], dirs["cwd"], env,
                         c["bound_s"], logdir=os.path.join(work, "log-rt"))
            timings["roundtrip"] = dict(rc=rt["rc"], wall=rt["wall"], rss_mb=rt["rss_mb"])
            if rt["rc"] not in (0, 1):
                reasons.append("roundtrip: --load of the bundle's snapshot.json exits %s: %s" % (rt["rc"], decode(rt["err"])[0][:200]))
            t2 = []
            check_text_outputs(c, "roundtrip", rt, os.path.join(work, "emptyrt"), reasons, notes, t2)
            check_secrets(c, t2, reasons, True)
        if c["invoke"] == "same-out" and dig and os.path.isfile(inpath) and file_digest(inpath) != dig:
            reasons.append("the --load file was overwritten")
        if not os.environ.get("HS_KEEP"):
            shutil.rmtree(os.path.join(work, "in"), ignore_errors=True)
            shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
    check_secrets(c, texts_all, reasons, True)
    # never executed
    for m in c["shell"]:
        if os.path.exists("/tmp/hs-loadfiles-" + m):
            reasons.append("shell payload %s was executed" % m)
    if c["tui"] and c["file"]:
        work = os.path.join(base, "tui")
        os.makedirs(os.path.join(work, "in"))
        inpath = os.path.join(work, "in", os.path.basename(c["file"]))
        os.link(c["file"], inpath)
        t0 = time.monotonic()
        run_tui(c, work, inpath, reasons, notes)
        timings["tui"] = dict(wall=round(time.monotonic() - t0, 1))
    # dedupe reasons keeping order
    seen = set()
    reasons = [x for x in reasons if not (x in seen or seen.add(x))]
    return dict(id=c["id"], family=c["family"], desc=c["desc"], expect=c["expect"], ok=not reasons,
                reasons=reasons, notes=notes, timings=timings)


def main():
    args = sys.argv[1:]
    global HANGSCOPE
    outdir = HERE
    if "--selftest" in args:
        HANGSCOPE = os.path.join(HERE, "_stub_hangscope.py") if os.path.exists(os.path.join(HERE, "_stub_hangscope.py")) else "/tmp/hs-loadfiles/stub.py"
        outdir = "/tmp/hs-loadfiles/selftest"
        os.makedirs(outdir, exist_ok=True)
    if "--out" in args:
        outdir = args[args.index("--out") + 1]
    only = None
    if "--only" in args:
        only = set(args[args.index("--only") + 1].split(","))
    with open(os.path.join(CASES_DIR, "manifest.json")) as f:
        man = json.load(f)
    for m in ("SHX1", "SHX2", "SHX3", "SHX4", "SHX5", "SHX6"):
        try:
            os.unlink("/tmp/hs-loadfiles-" + m)
        except FileNotFoundError:
            pass
    results = []
    t0 = time.monotonic()
    for c in man:
        if only and c["id"] not in only:
            continue
        r = run_case(c)
        results.append(r)
        print("%-4s %-4s %s  %s" % (r["id"], "ok" if r["ok"] else "FAIL", json.dumps(r["timings"]),
                                    ("; ".join(r["reasons"]))[:300]), flush=True)
    total = time.monotonic() - t0
    commit = open(os.path.join(HERE, "..", "..", "..", ".git", "refs", "heads", "main")).read().strip() \
        if os.path.exists(os.path.join(HERE, "..", "..", "..", ".git", "refs", "heads", "main")) else "?"
    meta = dict(commit=commit, hangscope=HANGSCOPE, seconds=round(total, 1), when=time.strftime("%Y-%m-%d %H:%M:%S"))
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    fam = {}
    for r in results:
        a = fam.setdefault(r["family"], [0, 0])
        a[0] += 1
        a[1] += r["ok"]
    with open(os.path.join(outdir, "results.md"), "w") as f:
        f.write("# Results\n\ncommit %s, %s, %.0f s\n\n" % (commit, meta["when"], total))
        f.write("| family | cases | pass | fail |\n|---|---|---|---|\n")
        for k in sorted(fam):
            f.write("| %s | %d | %d | %d |\n" % (k, fam[k][0], fam[k][1], fam[k][0] - fam[k][1]))
        n = len(results)
        p = sum(r["ok"] for r in results)
        f.write("| all | %d | %d | %d |\n\n" % (n, p, n - p))
        f.write("| id | expect | result | reasons (fail) / notes (pass) |\n|---|---|---|---|\n")
        for r in results:
            txt = "; ".join(r["reasons"] if not r["ok"] else r["notes"])
            txt = txt.replace("|", "\\|").replace("\n", " ")
            txt = "".join(ch if ch.isprintable() else "\\x%02x" % ord(ch) for ch in txt)
            f.write("| %s | %s | %s | %s |\n" % (r["id"], r["expect"], "pass" if r["ok"] else "FAIL", txt[:600]))
    print("total %d, pass %d, fail %d, %.0f s" % (len(results), sum(r["ok"] for r in results),
                                                  sum(not r["ok"] for r in results), total))


if __name__ == "__main__":
    main()
