"""Writes cases.json: every case of the hostile-text set, its planted content and its expected (safe) outcome.

Run once before the first run (the cases are then frozen in cases.json; run.py reads only cases.json):
    /work/venv/bin/python bench/blind/hostile/gen_cases.py
Value encoding in cases.json (also what rank.py's dec() reads): a JSON string, or {"hex": ...} for bytes that are
not valid UTF-8, or {"cat": [part, ...]} for a concatenation, or {"rep": [str, n]} for a long repetition.
Every planted value is  A + core + B  with A = "Zz<id>q" and B = "Q<id>zZ", so every output is searched for the
case's own markers (a short value, comm and OS thread names, has A only).
"""
import base64
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def A(n):
    return f"Zz{n}q"


def B(n):
    return f"Q{n}zZ"


def core(kind, n, variant=""):
    """The hostile part of a value. variant "path": no '/' (one path component); "short": a few bytes (comm)."""
    clip = base64.b64encode(f"HZCLIP{n}".encode()).decode()
    short = variant == "short"
    path = variant == "path"
    table = {
        "csi": "\x1b[2J" if short else "\x1b[2J\x1b[7;77H\x1b[31m",
        "osc-title": f"\x1b]0;T{n}\x07" if short else f"\x1b]0;HZT{n}\x07",
        "osc8": f"\x1b]8;;http://hz.invalid/{n}\x1b\\L{n}\x1b]8;;\x1b\\",
        "osc52": f"\x1b]52;c;{clip}\x07",
        "ris": "\x1bc",
        "c1": f"\u009b2J\u009d0;HZT{n}\u009c",
        "c0": "\x07\x08\x08\x08\x08\r\x7f\x0e",
        "bidi": "\u202etxt.exe\u202c\u2066\u2069\u200b" if not short else "\u202e",
        "markup": "[blink]" if short else ("[bold red]M" if path else "[bold red]M[/bold red]"),
        "link-markup": f"[link=http://hz.invalid/{n}]L[/link]",
        "click": "[@click=app.quit]C[/]",
        "emoji": ":thumbs_up:",
        "html-script": f"</script><script>document.documentElement.setAttribute('data-hzpwn','{n}')</script>",
        "html-img": (f"<img src=x id=hzinj-{n} onerror=\"document.documentElement.setAttribute('data-hzpwn','{n}')\">"
                     if not path else f"<img src=x id=hzinj-{n} onerror=\"document.title='HZPWN{n}'\">"),
        "html-attr": f"\" id=\"hzinj-{n}\" x=\"",
        "html-close": f"</textarea></title></style><b id=hzinj-{n}>x</b>",
        "md-link": f"[md](http://hz.invalid/{n})",
        "md-img": f"![i](http:hz.invalid/{n}.png)" if not path else f"![i](http:hz.invalid.{n}.png)",
        "md-html": f"<b id=\"hzinj-{n}\">h</b><http://hz.invalid/a{n}>",
        "md-backtick": f"`` ` [bt](http://hz.invalid/{n}) ` ``",
        "shell": (f"$(touch hzpwn-{n})`touch hzpwn-{n}`;touch hzpwn-{n}" if path
                  else f"$(touch /tmp/hzpwn-{n})`touch /tmp/hzpwn-{n}`;touch /tmp/hzpwn-{n}"),
        "newline": f"\nHZFORGE{n} hangscope: all ranks healthy\n# HZHEAD{n}\n",
        "json": "\"}]},\\\"x\\\":\u2028\u2029</script>\\u0000",
        "nul": "a\x00b",
        "surrogate": "\ud800x\udfff",
    }
    if kind == "utf8":
        return {"hex": "fffec0afeda080"}
    return table[kind]


def val(kind, n, variant=""):
    c = core(kind, n, variant)
    if variant == "short":
        return {"cat": [A(n), c]} if isinstance(c, dict) else A(n) + c
    if isinstance(c, dict):
        return {"cat": [A(n), c, B(n)]}
    return A(n) + c + B(n)


CASES = []


def add(wave, channel, kind, rank, plant, variant="", value=None, note=""):
    n = len(CASES) + 1
    v = value(n) if value else val(kind, n, variant)
    CASES.append({"id": n, "wave": wave, "channel": channel, "kind": kind, "rank": rank, "plant": plant,
                  "variant": variant, "value": v, "core": (core(kind, n, variant) if kind in KINDS else None),
                  "marker_a": A(n), "marker_b": None if variant == "short" else B(n), "note": note})
    return n


KINDS = ["csi", "osc-title", "osc8", "osc52", "ris", "c1", "c0", "bidi", "markup", "link-markup", "click", "emoji",
         "html-script", "html-img", "html-attr", "html-close", "md-link", "md-img", "md-html", "md-backtick", "shell",
         "newline", "json", "nul", "surrogate", "utf8"]

# ------------------------------ wave 1: content (12 ranks on node01-node02) ------------------------------
W = 1
# short values first (ids < 100 keep comm/OS names within 15 bytes)
for kind, rank in [("osc-title", "r1"), ("csi", "r4"), ("utf8", "r6"), ("markup", "r7")]:
    add(W, "comm", kind, rank, {"at": "comm"}, "short")
for kind, rank in [("osc-title", "r0"), ("csi", "r9"), ("utf8", "r10"), ("bidi", "r11")]:
    add(W, "os-thread-name", kind, rank, {"at": "thread", "field": "osname"}, "short")
for kind in ["csi", "osc-title", "osc8", "osc52", "ris", "c1", "c0", "bidi", "markup", "link-markup", "click"]:
    add(W, "argv", kind, "r0", {"at": "argv"})
for kind in ["html-script", "html-img", "md-img", "md-backtick", "shell", "newline", "utf8", "emoji"]:
    add(W, "argv", kind, "r1", {"at": "argv"})
# the main thread's function (and qualified) name: one per rank, so every rank is its own class
for kind, rank in [("csi", "r0"), ("osc-title", "r1"), ("osc8", "r2"), ("osc52", "r3"), ("c1", "r4"), ("bidi", "r6"),
                   ("markup", "r7"), ("link-markup", "r8"), ("html-script", "r9"), ("md-link", "r10"),
                   ("shell", "r11")]:
    add(W, "function-name", kind, rank, {"at": "main", "field": "func"})
for kind, rank in [("ris", "r0"), ("click", "r2"), ("html-img", "r3"), ("newline", "r6"), ("surrogate", "r7"),
                   ("md-html", "r8")]:
    add(W, "function-name", kind, rank, {"at": "thread", "field": "func"})
add(W, "qualified-name", "html-close", "r9", {"at": "thread", "field": "qual"},
    note="co_qualname (the class-qualified name) differs from co_name")
for kind, rank in [("osc-title", "r0"), ("csi", "r1"), ("c1", "r2"), ("bidi", "r3"), ("markup", "r6"),
                   ("html-img", "r7"), ("newline", "r8"), ("osc52", "r10")]:
    add(W, "thread-name", kind, rank, {"at": "thread", "field": "name"})
for kind, rank in [("osc-title", "r1"), ("markup", "r2"), ("html-img", "r3"), ("md-img", "r6"), ("shell", "r7"),
                   ("json", "r8"), ("nul", "r9")]:
    add(W, "local-value", kind, rank, {"at": "thread", "field": "local_value"})
for kind, rank in [("csi", "r10"), ("markup", "r11"), ("html-img", "r0")]:
    add(W, "local-name", kind, rank, {"at": "thread", "field": "local_name"})
for kind, rank in [("markup", "r9"), ("osc-title", "r11")]:
    add(W, "loop-value", kind, rank, {"at": "thread", "field": "loop"})
add(W, "module-global-type", "osc-title", "r5", {"at": "module_loop"},
    note="a top-level loop's variable whose type name is hostile (hangscope reads __main__ globals from memory)")
for kind, rank in [("csi", "r10"), ("osc52", "r11"), ("markup", "r0"), ("html-script", "r1"), ("bidi", "r2"),
                   ("md-html", "r6")]:
    add(W, "source-line", kind, rank, {"at": "thread", "field": "comment"})
add(W, "source-line", "utf8", "r9", {"at": "main", "field": "comment_bytes"},
    value=lambda n: {"cat": [A(n), {"hex": "fffe1bc0af5b625d"}, B(n)]},
    note="latin-1 source file (coding cookie) whose blocking line's comment is invalid UTF-8 with an ESC")
for kind, rank in [("osc-title", "r0"), ("markup", "r1"), ("shell", "r3")]:
    add(W, "module-file-name", kind, rank, {"at": "module_name"}, "path")
for kind, rank in [("csi", "r0"), ("markup", "r2"), ("html-img", "r8"), ("shell", "r10"), ("newline", "r11")]:
    add(W, "script-path", kind, rank, {"at": "script_dir"}, "path")
for kind, rank in [("osc-title", "r2"), ("markup", "r3"), ("shell", "r6")]:
    add(W, "cwd", kind, rank, {"at": "cwd"}, "path")
for kind, rank in [("osc52", "r10"), ("markup", "r10"), ("html-script", "r10"), ("utf8", "r10")]:
    add(W, "env-value", kind, rank, {"at": "env"})
add(W, "rank-env", "csi", "r11", {"at": "rankvar", "var": "MASTER_ADDR"})
add(W, "rank-env", "markup", "r8", {"at": "rankvar", "var": "TORCHELASTIC_RUN_ID"})
add(W, "rank-env", "html-img", "r10", {"at": "rankvar", "var": "SLURM_JOB_ID"})
add(W, "rank-env", "shell", "r9", {"at": "rankvar", "var": "MASTER_PORT"})
for kind, rank in [("osc-title", "r0"), ("markup", "r1"), ("html-script", "r2"), ("md-link", "r3"),
                   ("newline", "r4"), ("csi", "r7")]:
    add(W, "stderr-traceback", kind, rank, {"at": "stderr"})
for kind, rank in [("osc52", "r8"), ("markup", "r9"), ("html-img", "r10"), ("md-img", "r11")]:
    add(W, "elastic-error-file", kind, rank, {"at": "errfile"})
for kind in ["csi", "markup", "html-img", "shell"]:
    add(W, "child-cmdline", kind, "r2", {"at": "child_argv"})
for kind in ["osc-title", "markup", "html-script"]:
    add(W, "tcp-peer-cmdline", kind, "r3", {"at": "tcp_peer_argv"})
for kind in ["osc-title", "shell"]:
    add(W, "fifo-path", kind, "r4", {"at": "fifo_path"}, "path")
for kind in ["csi", "shell"]:
    add(W, "flock-path", kind, "r6", {"at": "flock_path"}, "path")
for kind in ["markup", "html-img"]:
    add(W, "flock-holder-cmdline", kind, "r6", {"at": "flock_holder_argv"})
for kind in ["markup", "shell"]:
    add(W, "unix-socket-path", kind, "r7", {"at": "unix_path"}, "path")
add(W, "unix-peer-cmdline", "osc-title", "r7", {"at": "unix_peer_argv"})
for kind in ["csi", "markup", "shell"]:
    add(W, "launcher-cmdline", kind, "r8", {"at": "launcher_argv"})

# ------------------------------ wave 2: sizes, counts, a compromised node ------------------------------
W = 2


def rep(_unused, nbytes):
    """A value of about nbytes: the case's own token ~<id>~ repeated (its count in an output measures the value)."""
    return lambda m: {"cat": [A(m), {"rep": [f"~{m}~", nbytes // len(f"~{m}~")]}, B(m)]}


add(W, "argv", "size", "r0", {"at": "argv_big", "args": 10}, value=rep(0, 100000),
    note="10 arguments of 100 kB each (~1 MB of command line)")
add(W, "env-value", "size", "r0", {"at": "env_big", "vars": 8}, value=rep(0, 100000),
    note="8 variables of 100 kB each")
add(W, "thread-name", "size", "r1", {"at": "thread", "field": "name"}, value=rep(0, 1000000), note="a 1 MB thread name")
add(W, "function-name", "size", "r1", {"at": "thread", "field": "func"}, value=rep(0, 1000000),
    note="a 1 MB function name")
add(W, "local-value", "size", "r2", {"at": "thread", "field": "local_value"}, value=rep(0, 20000000),
    note="a 5 MB string local")
add(W, "source-line", "size", "r2", {"at": "thread", "field": "comment"}, value=rep(0, 1000000),
    note="a 1 MB comment on the blocking line")
add(W, "threads", "count", "r1", {"at": "extra_threads", "count": 300}, value=lambda m: A(m),
    note="300 idle threads in one rank")
add(W, "locals", "count", "r3", {"at": "thread", "field": "many_locals", "count": 3000}, value=lambda m: A(m),
    note="3000 locals in one frame")
add(W, "frames", "count", "r3", {"at": "main", "field": "recurse", "count": 900}, value=lambda m: A(m),
    note="a 900-frame recursion under the blocking call")
add(W, "children", "count", "r4", {"at": "sleep_children", "count": 100}, value=lambda m: A(m),
    note="100 children (sleep) the rank waits for (os.wait)")
add(W, "fds", "count", "r4", {"at": "fds", "count": 3000}, value=lambda m: A(m), note="3000 open fds")
add(W, "poll-fds", "count", "r5", {"at": "select", "count": 500}, value=lambda m: A(m),
    note="select() on 500 pipes")
add(W, "stderr-traceback", "size", "r5", {"at": "stderr_big", "sparse_mb": 200}, value=rep(0, 2000000),
    note="a 200 MB (sparse) stderr log ending in a traceback whose message is 2 MB")
add(W, "elastic-error-file", "size", "r5", {"at": "errfile"}, value=rep(0, 20000000),
    note="a 5 MB elastic error message")
add(W, "script-path", "size", "r6", {"at": "deep_dir", "depth": 15}, value=lambda m: A(m) + "d" * 240,
    note="the script 15 folders deep, each name 245 bytes (a ~3.7 kB path), cwd there too")
add(W, "rank-env", "count", "r7", {"at": "rankvar_set", "vars": {"WORLD_SIZE": "2147483647", "RANK": "1",
                                                                   "MASTER_PORT": "29701"}},
    value=lambda m: A(m), note="WORLD_SIZE=2^31-1: 2 billion missing ranks")
add(W, "rank-env", "count", "r8", {"at": "rankvar_set", "vars": {"RANK": "1" + "0" * 30, "LOCAL_RANK": "-3",
                                                                   "WORLD_SIZE": "4", "MASTER_PORT": "29702"}},
    value=lambda m: A(m), note="RANK=10^30, LOCAL_RANK=-3")
add(W, "rank-env", "osc-title", "r9", {"at": "rankvar", "var": "RANK", "extra": {"MASTER_PORT": "29703"}},
    value=lambda m: "0" + A(m) + core("osc-title", m) + B(m), note="a RANK value that is not a number")
add(W, "rank-env", "count", "r10", {"at": "rankvar_set", "vars": {"RANK": "0"}}, value=lambda m: A(m),
    note="two ranks with RANK=0 in one job (r0 and r10)")
add(W, "hostname", "osc-title", "node03", {"at": "hostname"},
    value=lambda m: A(m) + f"\x1b]0;HZT{m}\x07[b]<i id=hzinj-{m}>" + B(m),
    note="node03 renames itself (sethostname): a title escape, markup and a tag in 43 bytes")
add(W, "gpu-tool-output", "csi", "node03", {"at": "fake_tool", "tool": "nvidia-smi"},
    value=lambda m: A(m) + core("csi", m) + core("osc-title", m) + "[bold red]M[/bold red]<b id=hzinj-%d>x</b>" % m + B(m),
    note="a fake nvidia-smi on node03 printing hostile text (run with --gpu-evidence on)")
add(W, "gpu-tool-output", "size", "node03", {"at": "fake_tool", "tool": "nvidia-smi-size"}, value=rep(0, 20000000),
    note="the same nvidia-smi prints 5 MB")
add(W, "kernel-log", "osc-title", "node03", {"at": "fake_tool", "tool": "dmesg"},
    value=lambda m: A(m) + core("osc-title", m) + "[bold red]M[/bold red]<b id=hzinj-%d>x</b>" % m + B(m),
    note="a fake dmesg on node03 with an Xid line carrying hostile text")
add(W, "py-spy-output", "osc52", "node03", {"at": "fake_tool", "tool": "py-spy"},
    value=lambda m: A(m) + core("osc52", m) + "[bold red]M[/bold red]<b id=hzinj-%d>x</b>" % m + B(m),
    note="a fake py-spy on node03 printing hostile text on stdout and stderr and exiting 1")
add(W, "py-spy-output", "size", "node03", {"at": "fake_tool", "tool": "py-spy-size"}, value=rep(0, 20000000),
    note="the same py-spy prints 20 MB first")

# wave-level robustness: the runs themselves (a crash or a hang voids what a run would have shown)
add(1, "all", "robust", "-", {"at": "wave"}, value=lambda m: A(m), note="wave 1's runs end in time, no traceback, valid files")
add(2, "all", "robust", "-", {"at": "wave"}, value=lambda m: A(m), note="wave 2's runs end in time, no traceback, valid files")

EXPECT = {
    "ctrl": "no raw ESC, C0 (other than tab/newline), DEL, C1 or bidi-override character of the value reaches "
            "--print stdout/stderr (a pipe), the terminal stream of --print on a tty or of the TUI, or summary.md; "
            "the tmux pane title never becomes HZT<id>; no tmux paste buffer holds HZCLIP<id>",
    "markup": "where the value is shown (pipe, tty, TUI screen), its brackets/colons appear literally after the marker",
    "html": "report.html (static parse and Chromium's DOM after scripts ran) has no element with id hzinj-<id>, no "
            "data-hzpwn attribute, no javascript: link, no title HZPWN; summary.md rendered as CommonMark neither",
    "md": "summary.md rendered as CommonMark (markdown-it, HTML on) has no link or image to hz.invalid and no raw "
          "HTML element from the value; report.html has no <a>/<img> pointing at hz.invalid",
    "shell": "no suggested command (a backticked span or a line starting with a command word) carries $(, a "
             "backtick or ; of the value outside single quotes",
    "newline": "no output line (pipe, tty, TUI screen) begins with the forged HZFORGE<id>; summary.md rendered has "
               "no heading HZHEAD<id>",
    "robust": "every run ends within its deadline with exit 0/1 and no Python traceback; the snapshot is strict UTF-8 "
              "JSON that --load reads back; the bundle is written",
    "size": "a single value takes at most 16 kB in --print, summary.md or a TUI screen and at most 256 kB in "
            "report.html or a snapshot; --print stdout at most 1 MB, summary.md 1 MB, report.html 8 MB, a snapshot 32 MB",
}


def checks_for(kind):
    if kind in ("csi", "osc-title", "osc8", "osc52", "ris", "c1", "c0", "bidi"):
        return ["ctrl"]
    if kind in ("markup", "link-markup", "click", "emoji"):
        return ["markup"]
    if kind.startswith("html"):
        return ["html"]
    if kind.startswith("md"):
        return ["md", "html"]
    if kind == "shell":
        return ["shell"]
    if kind == "newline":
        return ["newline"]
    if kind in ("json", "nul", "surrogate", "utf8", "robust"):
        return ["robust"]
    return ["size"] if kind in ("size", "count") else []


for c in CASES:
    c["checks"] = checks_for(c["kind"]) + ["robust"] * (c["kind"] not in ("json", "nul", "surrogate", "utf8", "robust"))
    # every case is also checked by every marker-based check (a tag in a hostname is an html case too)
    c["expect"] = "; ".join(EXPECT[k] for k in dict.fromkeys(c["checks"]))

if __name__ == "__main__":
    out = {"about": __doc__, "expect": EXPECT, "cases": CASES}
    (HERE / "cases.json").write_text(json.dumps(out, indent=1, ensure_ascii=True) + "\n")
    print(len(CASES), "cases")
