"""The blind bad-input set for `hangscope watch`: the table.

Written from README.md, `hangscope --help`, `hangscope watch --help` and `hangscope demo --help` only
(see README.md in this folder): nothing here was derived from, or tuned against, the code that parses
the input.  `python3 cases.py` writes cases.json, the frozen form run.py reads.

A case is a dict (the fields of bench/blind/inputs/cases.py, plus):
  hook_argv     the argv the --on-hang recorder must have received: the literal shell-like split of CMD
  hook_must_run the hook must have run (a capture happened)
  modes         {path: "0o700"}: the mode a path must have afterwards
  private       dirs whose new files/dirs must have no group/other bits (--out 0700, files 0600)
  preserve_tree dirs whose every pre-existing path (and the dir's own mode) must be unchanged afterwards
  stdout        file (default) | closed-pipe (`| head -0`) | closed (fd 1 closed) | pty (a terminal)
  signal        the signal sent at sigint_at (INT by default; TERM for the `kill` cases)
  survive       [t, "INT"]: a signal sent first that the tool must survive (SIGINT ignored by its parent)
  ignore_int    start the tool with SIGINT ignored (nohup, `&` from a script)
  leftover_ok   a left-over process is reported as a note only (a daemon the user's hook detached itself)
Placeholders: {S} the sandbox root, {PID0}/{PID1} the pids of the planted dummy ranks, {MARK} a marker
unique to the case that is in the dummy ranks' command line (for --match), {HOOK} the recorder's folder.

Safety: every case runs in its own PID namespace (bench/blind/inputs' harness), so "this machine" is only
the dummy processes the case plants; every case that makes watch look at this machine still narrows it
with --pid or --match of its own dummy.  Cases about parsing use -w nodeA, a host that never resolves.
"""

from __future__ import annotations

import json
import os
import re

CASES: list[dict] = []
S = "{S}"
PWNED = S + "/pwned"


def case(id, cat, args, expect, why, **kw):
    assert not any(c["id"] == id for c in CASES), id
    kw.setdefault("bound", 5.0 if expect == "reject" else 12.0)
    kw.setdefault("checks", {"pwned": PWNED})
    if expect != "reject":
        kw.setdefault("sigint_at", kw["bound"])  # still running at its bound: interrupted, and over its bound
    CASES.append(dict(id=id, cat=cat, args=args, expect=expect, why=why, **kw))


def esc(s: str) -> str:
    return re.escape(s)


# the parsing base: a node that never resolves, short deadlines, a private --out
BASEOPTS = {"-w": "nodeA", "--connect-timeout": "1", "--wait-start": "2", "--every": "1", "--out": "out"}


def base(drop=(), **over):
    opts = {k: v for k, v in BASEOPTS.items() if k not in drop}
    opts.update(over)
    args = ["watch"]
    for k, v in opts.items():
        args += [k, v]
    return args


# the live base: two dummy ranks of one job (RANK env) that sleep: no progress, so a capture within seconds
def dummy(rank, port="29561", extra_argv=()):
    return {"kind": "proc", "argv": ["python3", "-c", "import time; time.sleep(600)", "{MARK}", *extra_argv],
            "env": {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port}}


DUMMIES = [dummy(0), dummy(1)]
REC = {"kind": "file", "path": "{S}/bin/rec", "mode": 0o755,
       "text": "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done > {HOOK}/argv\n"
               "env | grep '^HANGSCOPE_' > {HOOK}/env\nexit 0\n"}
LIVE = ["watch", "--match", "{MARK}", "--every", "1", "--stall", "3", "--stall-start", "3", "--once", "--no-locals",
        "--no-store"]
LIVEKW = dict(bound=45.0, sigint_at=50, timeout=60)

# =============================================================================================
# numbers
# =============================================================================================
BAD_NUMS = [
    ("nan", "nan"), ("inf", "inf"), ("neg-inf", "-inf"), ("neg", "-1"), ("1e308", "1e308"),
    ("30digits", "1" * 30), ("hex", "0x10"), ("underscore", "1_0"), ("empty", ""), ("blank", "   "),
    ("arabic", "\u0663"), ("fullwidth", "\uff13"), ("word", "abc"), ("unit", "5s"), ("sci-small", "1e-9"),
]
NUM_FLAGS = ["--every", "--stall", "--stall-start", "--slow", "--keep", "--on-hang-timeout", "--wait-start", "--fps",
             "--timeout", "--connect-timeout", "--fanout", "--max-hosts", "--pid"]
for flag in NUM_FLAGS:
    for name, v in BAD_NUMS:
        if flag in ("--keep", "--fanout", "--max-hosts", "--pid") and name == "sci-small":
            continue
        extra = []
        if flag == "--fps":
            extra = ["--tui"]
        if flag == "--on-hang-timeout":
            extra = ["--on-hang", "true"]
        args = base(drop=(flag,)) + extra + [flag + "=" + v if v.startswith("-") else flag, *([] if v.startswith("-") else [v])]
        case(f"num{flag}-{name}", "numeric", args, "reject",
             f"{flag} {v!r}: README: every number is range-checked, nan and inf refused, only plain ASCII decimals "
             "are numbers", mention=[esc(flag), esc(flag.lstrip("-"))], outputs=["out"],
             **({"stdout": "pty", "sigint_at": 6, "timeout": 20} if flag == "--fps" else {}))

# ranges the main command states for the flags watch shares, and values each flag cannot mean
RANGE = [
    ("--timeout", "0", "reject", "per-rank dump deadline 0.1-600 s (hangscope --help)"),
    ("--timeout", "601", "reject", "per-rank dump deadline 0.1-600 s"),
    ("--connect-timeout", "0", "reject", "0.1-600 s"),
    ("--connect-timeout", "601", "reject", "0.1-600 s"),
    ("--fanout", "0", "reject", "1-4096"),
    ("--fanout", "4097", "reject", "1-4096"),
    ("--fanout", "1.5", "reject", "a count"),
    ("--max-hosts", "0", "reject", "1-100000"),
    ("--max-hosts", "100001", "reject", "1-100000"),
    ("--pid", "0", "reject", "1-4194304"),
    ("--pid", "4194305", "reject", "1-4194304"),
    ("--pid", "1.5", "reject", "a pid is an integer"),
    ("--fps", "0", "reject", "--fps 1-120 (hangscope --help)"),
    ("--fps", "121", "reject", "--fps 1-120"),
    ("--every", "0", "reject", "a cheap sample every 0 s is a busy loop on the login node"),
    ("--every", "0.000001", "either", "a microsecond between samples: refused, or clamped"),
    ("--every", "1000000000", "either", "31 years between samples"),
    ("--stall", "0", "either", "capture after 0 s without progress: refused, or every sample captures"),
    ("--stall-start", "0", "either", "start-up stall limit 0"),
    ("--slow", "0", "work", "documented: --slow 0 never captures as slow"),
    ("--slow", "1.5", "reject", "a rate below 1.5 x its own recent rate: a healthy job is 'slow'; F is a fraction"),
    ("--slow", "1", "either", "below 100% of its own rate"),
    ("--keep", "0", "either", "keep no capture: refused, or the capture removed at once (never the user's files)"),
    ("--keep", "1.5", "reject", "a count of bundles"),
    ("--keep", "1000000000000", "either", "keep 10^12 bundles"),
    ("--on-hang-timeout", "0", "either", "a hook killed at once"),
    ("--wait-start", "0", "either", "give up at once when no job is there"),
    ("--wait-start", "99999999999", "either", "3000 years"),
]
for flag, v, exp, why in RANGE:
    extra = ["--tui"] if flag == "--fps" else (["--on-hang", "true"] if flag == "--on-hang-timeout" else [])
    case(f"range{flag}-{v[:12]}", "numeric", base(drop=(flag,)) + extra + [flag, v], exp, f"{flag} {v}: {why}",
         mention=[esc(flag), esc(flag.lstrip("-"))], outputs=["out"],
         **({"stdout": "pty", "sigint_at": 6, "timeout": 20} if flag == "--fps" else {}))

# absurd combinations of numbers
COMBOS = [
    ("stall-below-every", ["--every", "60", "--stall", "10"], "either",
     "--stall 10 with a sample every 60 s: a stall can only be seen after 60 s (refused or said)"),
    ("stall-start-below-stall", ["--stall", "120", "--stall-start", "10"], "either",
     "a start-up limit shorter than the steady-state one"),
    ("every-over-wait-start", ["--every", "600", "--wait-start", "5"], "either",
     "the first sample after the wait for a job has ended"),
    ("keep0-once", ["--keep", "0", "--once"], "either", "--once with --keep 0: the one capture removed at once"),
    ("negative-separate", ["--every", "-5"], "reject", "a negative number as its own word"),
    ("every-twice", ["--every", "5", "--every", "nan"], "reject", "the last of two values is nan"),
]
for id, extra, exp, why in COMBOS:
    drop = tuple(x for x in extra if x.startswith("--"))
    case("combo-num-" + id, "numeric", base(drop=drop) + extra, exp, why,
         mention=[r"--\w[\w-]*", "every", "stall", "keep"], outputs=["out"])

# =============================================================================================
# --out DIR
# =============================================================================================
OM = ["--out", "out", "director"]
USERFILES = [{"kind": "file", "path": "out/notes.txt", "text": "my notes\n"},
             {"kind": "file", "path": "out/data/a.bin", "text": "\x00\x01 data"},
             {"kind": "chmod", "path": "out", "mode": 0o700}]


def outcase(id, path, fixtures, exp, why, mention=None, preserve_tree=(), **kw):
    args = base(drop=("--out",)) + ["--out", path]
    kw.setdefault("outputs", [path] if exp != "reject" and not path.startswith("/") else [])
    case("out-" + id, "out-dir", args, exp, why, fixtures=fixtures, mention=mention or OM + [esc(path)],
         preserve_tree=list(preserve_tree), **kw)


outcase("new", "out", [], "work", "a new --out: created 0700 (README), its files 0600",
        modes={"out": "0o700"}, private=["out"])
outcase("new-nested", "a/b/out", [], "either", "missing parents: created (0700) or refused with one line",
        private=["a"], outputs=["a"])
outcase("existing-user-files", "out", USERFILES, "work",
        "an existing private directory holding the user's own files: none of them touched", preserve_tree=["out"])
outcase("trailing-slash", "out/", [{"kind": "dir", "path": "out"}, {"kind": "chmod", "path": "out", "mode": 0o700}],
        "work", "an existing --out given with a trailing slash", outputs=["out"])
outcase("regular-file", "out", [{"kind": "file", "path": "out", "text": "a user's file\n"}], "reject",
        "--out is a regular file", preserve=["out"], outputs=[])
outcase("symlink-to-dir", "out", [{"kind": "dir", "path": "{S}/elsewhere"},
                                  {"kind": "symlink", "path": "out", "to": "{S}/elsewhere"}], "reject",
        "README: --out is never a symlink", mention=OM + ["symlink", "link"], outputs=[])
outcase("symlink-dangling", "out", [{"kind": "symlink", "path": "out", "to": "{S}/nowhere"}], "reject",
        "a dangling symlink: never followed to create {S}/nowhere", mention=OM + ["symlink", "link"], outputs=[])
outcase("symlink-loop", "out", [{"kind": "symlink", "path": "out", "to": "loop2"},
                                {"kind": "symlink", "path": "loop2", "to": "out"}], "reject", "a symlink loop",
        mention=OM + ["symlink", "link", "loop"], outputs=[])
outcase("symlink-parent", "lnk/out", [{"kind": "dir", "path": "{S}/elsewhere"},
                                      {"kind": "symlink", "path": "lnk", "to": "{S}/elsewhere"}], "either",
        "the parent is a symlink to a directory elsewhere: refused, or --out created there (the user named it)",
        outputs=["{S}/elsewhere"])
for p in ["/proc", "/proc/self", "/proc/self/cwd/out", "/sys", "/sys/kernel", "/dev", "/dev/shm/out", "/dev/null"]:
    outcase("special-" + p.strip("/").replace("/", "-"), p, [], "reject", f"README: never in /proc, /sys or /dev: {p}",
            mention=OM + [esc(p), "proc", "sys", "dev"])
outcase("fifo", "out", [{"kind": "fifo", "path": "out", "reader": True}], "reject", "--out is a FIFO (with a reader)",
        mention=OM + ["fifo", "pipe", "regular"], outputs=[])
outcase("chardev-full", "out", [{"kind": "chardev", "path": "out", "dev": [1, 7]}], "reject", "--out is /dev/full's kind",
        mention=OM + ["device"], outputs=[])
outcase("pty", "out", [{"kind": "pty", "path": "out"}], "reject", "--out is a terminal device (writes are read back)",
        mention=OM + ["device", "regular"], outputs=[])
outcase("read-only", "ro/out", [{"kind": "romount", "path": "ro"}], "reject", "--out on a read-only file system",
        mention=OM + ["read-only", "writable", "ro/out"], outputs=[])
outcase("read-only-existing", "ro", [{"kind": "romount", "path": "ro"}], "reject",
        "an existing --out on a read-only file system", mention=OM + ["read-only", "writable", "ro"], outputs=[])
outcase("full-fs", "full/out", [{"kind": "fulltmpfs", "path": "full", "size": "64k", "fill": True}], "either",
        "--out on a full file system: refused at start, or watch runs and says it cannot write (never a traceback)",
        outputs=["full"])
outcase("world-writable", "out", [{"kind": "dir", "path": "out"}, {"kind": "chmod", "path": "out", "mode": 0o777}],
        "reject", "README: an existing --out must be writable by nobody else", mention=OM + ["writable", "mode", "0?777"],
        outputs=[], preserve_tree=["out"])
outcase("other-owner", "out", [{"kind": "dir", "path": "out"}, {"kind": "chmod", "path": "out", "mode": 0o700},
                               {"kind": "chown", "path": "out", "uid": 1234}], "reject",
        "README: an existing --out must be yours", mention=OM + ["owner", "own", "yours", "1234"], outputs=[],
        preserve_tree=["out"])
outcase("sticky-tmp", "/tmp", [], "reject", "--out /tmp: world-writable (1777), not the user's",
        mention=OM + ["/tmp", "writable", "own"])
outcase("newline", "o\nut", [], "reject", "a newline in --out (a control character)",
        mention=["--out", "control", "newline", "character", r"\\n"], outputs=[])
outcase("long-name", "o" * 300, [], "reject", "a 300-byte name: over NAME_MAX", mention=["--out", "long", "name"],
        outputs=[])
outcase("empty", "", [], "reject", "--out '' (README: an empty value is refused, never taken as not given)",
        mention=["--out", "empty"], outputs=[])
outcase("file-parent", "f.txt/out", [{"kind": "file", "path": "f.txt", "text": "x\n"}], "reject",
        "--out under a regular file", mention=OM + ["f.txt", "not a dir"], preserve=["f.txt"], outputs=[])
outcase("home", "{S}/home", [{"kind": "file", "path": "{S}/home/.bashrc", "text": "alias ll='ls -l'\n"},
                             {"kind": "file", "path": "{S}/home/thesis.tex", "text": "\\documentclass{article}\n"}],
        "either", "--out $HOME: refused, or used without touching the user's files and without chmod'ing HOME",
        mention=OM + ["home"], outputs=["{S}/home"], preserve_tree=["{S}/home"])
outcase("root", "/", [], "reject", "--out / (read-only here, root's in any case)",
        mention=OM + ["/", "read-only", "writable"])
outcase("dot", ".", [{"kind": "file", "path": "train.py", "text": "print(1)\n"},
                     {"kind": "file", "path": "ckpt/step100.pt", "text": "weights"}], "either",
        "--out . (the working directory with the user's files): refused, or none of them touched",
        mention=OM + [r"\."], outputs=["."], preserve_tree=["."])
outcase("dotdot", "..", [{"kind": "file", "path": "{S}/results.csv", "text": "a,b\n"}], "either",
        "--out .. (the sandbox root): refused, or the user's files untouched", mention=OM + [r"\.\."],
        outputs=[".."], preserve_tree=[".."])
# things already inside an existing --out that hangscope writes into: never through a link, device or FIFO
INOUT = [{"kind": "dir", "path": "out"}, {"kind": "chmod", "path": "out", "mode": 0o700}]
outcase("history-symlink", "out", INOUT + [{"kind": "file", "path": "{S}/victim.txt", "text": "precious\n"},
                                           {"kind": "symlink", "path": "out/history.jsonl", "to": "{S}/victim.txt"}],
        "either", "out/history.jsonl is a symlink to a user's file: never written through (README: never written "
        "through a link)", preserve=["{S}/victim.txt", "out/history.jsonl"], outputs=["out"])
outcase("history-fifo", "out", INOUT + [{"kind": "fifo", "path": "out/history.jsonl", "reader": True}], "either",
        "out/history.jsonl is a FIFO with a reader: never written through, never blocks", outputs=["out"])
outcase("history-pty", "out", INOUT + [{"kind": "pty", "path": "out/history.jsonl"}], "either",
        "out/history.jsonl is a terminal device: never written through", outputs=["out"])
outcase("history-dir", "out", INOUT + [{"kind": "dir", "path": "out/history.jsonl"}], "either",
        "out/history.jsonl is a directory: one line or carries on, no traceback", outputs=["out"])
outcase("history-foreign", "out", INOUT + [{"kind": "file", "path": "out/history.jsonl",
                                            "text": "my own notes, not JSON\n"}], "either",
        "a user's own file named history.jsonl that hangscope did not write (not JSON): strict reading of the "
        "standard: never changed", preserve=["out/history.jsonl"], outputs=["out"])

# =============================================================================================
# --on-hang CMD (parsing; the live cases below run it)
# =============================================================================================
HM_ = ["--on-hang", "on-hang", "CMD", "command"]
for id, cmd, exp, why in [
    ("empty", "", "reject", "an empty command"),
    ("blank", "   ", "reject", "a blank command"),
    ("unbalanced-quote", 'notify-send "training hung', "reject", "CMD does not split: an open quote"),
    ("trailing-backslash", "notify-send hung\\", "reject", "a trailing backslash: does not split like a shell"),
    ("newline", "true\ntouch " + PWNED, "either", "a newline in CMD: a control character (refused) or literal"),
    ("missing-program", "no-such-program-hsw --flag", "either",
     "a program that is not on PATH: refused at start (better) or said when the hook runs"),
    ("not-executable", "{S}/notexec.sh", "either", "a file that is not executable"),
    ("directory", "{S}", "either", "a directory as the program"),
    ("huge", {"gen": "repeat", "s": "arg ", "n": 120_000, "prefix": "true "}, "either", "a 120 KB command line"),
    ("many-words", {"gen": "repeat", "s": "'a' ", "n": 100_000, "prefix": "true "}, "either",
     "25,000 quoted words: split in linear time"),
    ("deep-quotes", {"gen": "repeat", "s": "\"'", "n": 100_000, "prefix": "true "}, "either",
     "100 KB of alternating quotes: one pass"),
    ("dash-option", "--print", "either", "a CMD that looks like an option (it is the value of --on-hang)"),
]:
    case("onhang-" + id, "on-hang", base() + ["--on-hang", cmd], exp, why, mention=HM_, outputs=["out"],
         fixtures=[{"kind": "file", "path": "{S}/notexec.sh", "text": "#!/bin/sh\ntouch " + PWNED + "\n",
                    "mode": 0o644}], bound=8.0 if exp == "reject" else 12.0)
case("onhang-timeout-without-hook", "on-hang", base() + ["--on-hang-timeout", "5"], "either",
     "--on-hang-timeout without --on-hang does nothing (README's rule: such flags are refused, naming the flag)",
     mention=["on-hang"], outputs=["out"])

# =============================================================================================
# live: a capture happens (dummy ranks on this machine, narrowed by --match/--pid); what is done with it
# =============================================================================================


def live(id, extra, exp, why, fixtures=(), **kw):
    for k, v in LIVEKW.items():
        kw.setdefault(k, v)
    kw.setdefault("outputs", ["out"])
    kw.setdefault("exits", [0] if exp == "work" else [0, 1, 2])
    case("live-" + id, "live", LIVE + ["--out", "out"] + extra, exp, why,
         fixtures=list(fixtures) + DUMMIES, **kw)


live("baseline", ["--on-hang", "{S}/bin/rec plain"], "work",
     "the live fixture itself: two sleeping ranks of one job are captured (--once: exit 0), the hook runs with "
     "the literal argv, --out is 0700 and its files 0600", fixtures=[REC], hook_argv=["plain"],
     modes={"out": "0o700"}, private=["out"])
live("pid", ["--pid", "{PID0}", "--pid", "{PID1}", "--on-hang", "{S}/bin/rec pid"], "work",
     "narrowed by --pid instead of (and as well as) --match", fixtures=[REC], hook_argv=["pid"])
for id, cmd, argv in [
    ("semicolon", "{S}/bin/rec a ; touch {S}/pwned && touch {S}/pwned",
     ["a", ";", "touch", "{S}/pwned", "&&", "touch", "{S}/pwned"]),
    ("subst", "{S}/bin/rec $(touch {S}/pwned) `touch {S}/pwned` ${IFS}x",
     ["$(touch", "{S}/pwned)", "`touch", "{S}/pwned`", "${IFS}x"]),
    ("pipe-redirect", "{S}/bin/rec x | touch {S}/pwned > {S}/pwned 2>&1 < /etc/passwd",
     ["x", "|", "touch", "{S}/pwned", ">", "{S}/pwned", "2>&1", "<", "/etc/passwd"]),
    ("glob-tilde-var", "{S}/bin/rec {S}/* ~ $HOME \"$HANGSCOPE_HEADLINE\" '$PATH' a\\ b",
     ["{S}/*", "~", "$HOME", "$HANGSCOPE_HEADLINE", "$PATH", "a b"]),
    ("background", "{S}/bin/rec & touch {S}/pwned", ["&", "touch", "{S}/pwned"]),
]:
    live("metachar-" + id, ["--on-hang", cmd], "work",
         f"--on-hang {cmd!r}: no shell, split once: every metacharacter stays a literal argument "
         "(the recorder must see exactly the split)", fixtures=[REC], hook_argv=argv)
live("headline-injection", ["--on-hang", "{S}/bin/hdl"], "work",
     "the ranks' command line carries shell metacharacters and the user's own hook quotes $HANGSCOPE_HEADLINE "
     "properly in a shell of its own: nothing runs",
     fixtures=[{"kind": "file", "path": "{S}/bin/hdl", "mode": 0o755,
                "text": "#!/bin/sh\nprintf '%s' \"$HANGSCOPE_HEADLINE\" > {HOOK}/headline\n"
                        "printf '%s' \"$HANGSCOPE_JOB\" > {HOOK}/job\n"},
               dummy(0, "29562", ["$(touch {S}/pwned)", ";touch {S}/pwned", "`touch {S}/pwned`"]),
               dummy(1, "29562", ["$(touch {S}/pwned)", ";touch {S}/pwned", "`touch {S}/pwned`"])],
     hook_must_run=True)
live("hook-never-exits", ["--on-hang", "sleep 300", "--on-hang-timeout", "3"], "work",
     "a hook that never exits is killed after --on-hang-timeout (3 s) and nothing is left", bound=30.0)
live("hook-ignores-term", ["--on-hang", "{S}/bin/stubborn", "--on-hang-timeout", "3"], "work",
     "a hook that ignores SIGTERM: still gone after --on-hang-timeout (SIGKILL), nothing left", bound=35.0,
     fixtures=[{"kind": "file", "path": "{S}/bin/stubborn", "mode": 0o755,
                "text": "#!/bin/sh\ntrap '' TERM INT HUP\nwhile :; do sleep 1; done\n"}])
live("hook-bg-child", ["--on-hang", "{S}/bin/bg", "--on-hang-timeout", "5"], "work",
     "a hook that exits at once leaving a background child in its process group: the group is killed "
     "(README: run in its own process group, killed after --on-hang-timeout; the standard: nothing left behind)",
     bound=30.0, settle=6.0,
     fixtures=[{"kind": "file", "path": "{S}/bin/bg", "mode": 0o755,
                "text": "#!/bin/sh\nsleep 300 </dev/null >/dev/null 2>&1 &\nexit 0\n"}])
live("hook-daemon", ["--on-hang", "{S}/bin/daemon", "--on-hang-timeout", "5"], "work",
     "a hook that detaches a daemon with setsid: the hook's own choice; reported as a note only", bound=30.0,
     leftover_ok=True, settle=6.0,
     fixtures=[{"kind": "file", "path": "{S}/bin/daemon", "mode": 0o755,
                "text": "#!/bin/sh\nsetsid sleep 300 </dev/null >/dev/null 2>&1 &\nexit 0\n"}])
live("hook-floods-stdout", ["--on-hang", "head -c 1000000000 /dev/zero", "--on-hang-timeout", "20"], "work",
     "a hook that writes 1 GB to its stdout: watch neither blocks nor dies, within its bound", bound=45.0)
live("hook-endless-stdout", ["--on-hang", "yes hung", "--on-hang-timeout", "4"], "work",
     "a hook that writes to its stdout for ever: killed after 4 s, watch goes on", bound=35.0)
live("hook-missing", ["--on-hang", "no-such-program-hsw"], "either",
     "a hook program that is not there: refused at start (exit 2) or said when it should run; no traceback",
     mention=HM_ + ["no-such-program-hsw"], exits=[0, 1, 2])
live("hook-not-executable", ["--on-hang", "{S}/notexec.sh"], "either", "a hook that is not executable",
     fixtures=[{"kind": "file", "path": "{S}/notexec.sh", "text": "#!/bin/sh\ntouch " + PWNED + "\n", "mode": 0o644}],
     mention=HM_ + ["notexec", "executable", "permission"], exits=[0, 1, 2])
live("hook-fails", ["--on-hang", "false"], "work", "a hook that exits 1: said, the capture stands (exit 0 with --once)",
     exits=[0, 1])
live("ctrl-c-in-hook", ["--on-hang", "sleep 300"], "work",
     "Ctrl-C while the hook runs (capture at ~5 s, SIGINT at 15 s): exit within 2 s, the hook not left behind",
     sigint_at=15, bound=45.0, exits=[130])
live("term-in-hook", ["--on-hang", "sleep 300"], "work",
     "SIGTERM (README: end a watch with kill) while the hook runs: ends within 2 s, the hook not left behind",
     sigint_at=15, signal="TERM", bound=45.0, exits=[130, 143, 0, 1])
CAPLIKE = [{"kind": "dir", "path": "out"}, {"kind": "chmod", "path": "out", "mode": 0o700}]
for i in range(25):
    CAPLIKE.append({"kind": "file", "path": f"out/2020010{1 + i % 9}-0000{i:02d}-hang-myjob/notes.txt",
                    "text": f"my analysis {i}\n"})
CAPLIKE.append({"kind": "file", "path": "out/README.txt", "text": "my notes\n"})
CAPLIKE.append({"kind": "file", "path": "out/20200101-000000-slow-x", "text": "a file named like a capture\n"})
live("keep1-user-lookalikes", ["--keep", "1"], "work",
     "--keep 1 in an --out holding 25 of the user's own folders named like captures (and user files): "
     "rotation removes only bundles hangscope wrote", fixtures=CAPLIKE, preserve_tree=["out"])
live("keep0-user-files", ["--keep", "0"], "either",
     "--keep 0 with the user's files in --out: refused, or its own capture removed, never the user's",
     fixtures=CAPLIKE, preserve_tree=["out"], mention=["keep"])
live("full-fs", [], "either",
     "--out on a 256 KiB file system (filled): the capture cannot be written: exit 1 (README) or refused at start, "
     "one clear line, no traceback", exits=[1, 2],
     fixtures=[{"kind": "fulltmpfs", "path": "full", "size": "256k", "fill": True}],
     outputs=["full"])
CASES[-1]["args"] = [a if a != "out" else "full/out" for a in CASES[-1]["args"]]
live("closed-stdout", [], "work", "stdout is a closed pipe (`| head -0`) while it prints a capture: no traceback, "
     "no 'Exception ignored'", stdout="closed-pipe", exits=[0, 1, 120, 141])
live("match-and-job-nomatch", ["--job", "no-such-job-xyz", "--wait-start", "4"], "either",
     "--job naming no job there: exit 3 after --wait-start (or refused); no capture", exits=[2, 3], bound=30.0)

# =============================================================================================
# --job, --match, --pid, -w, HOSTS
# =============================================================================================
SEL = [
    ("job-empty", ["--job", ""], "reject", "an empty --job", ["--job", "job", "empty"]),
    ("job-blank", ["--job", "   "], "reject", "a blank --job", ["--job", "job", "empty", "blank"]),
    ("job-newline", ["--job", "29500\nx"], "reject", "a control character in --job", ["--job", "job", "control"]),
    ("job-huge", ["--job", "j" * 100_000], "either", "a 100 KB --job", ["--job", "job", "long"]),
    ("job-shell", ["--job", "$(touch {S}/pwned);`touch {S}/pwned`"], "either", "shell text in --job", ["job"]),
    ("match-empty", ["--match", ""], "reject", "an empty --match", ["--match", "match", "empty"]),
    ("match-nested", ["--match", "(a+)+$"], "reject", "README: a repeat inside a repeat is refused", ["--match", "match", "repeat", "backtrack"]),
    ("match-alt", ["--match", "(a|ab)*c"], "reject", "README: an overlapping repeated alternation", ["--match", "match", "backtrack", "alternat"]),
    ("match-backref", ["--match", "(a)\\1"], "reject", "README: a back-reference", ["--match", "match", "back"]),
    ("match-four-stars", ["--match", ".*a.*b.*c.*d"], "reject", "README: more than 3 unbounded repeats", ["--match", "match", "repeat"]),
    ("match-possessive", ["--match", "a++"], "reject", "README: Python 3.11 syntax the nodes' 3.9 lacks", ["--match", "match", "3\\.9", "possessive"]),
    ("match-atomic", ["--match", "(?>ab)c"], "reject", "README: atomic groups", ["--match", "match", "atomic", "3\\.9"]),
    ("match-201", ["--match", "a" * 201], "reject", "README: at most 200 characters", ["--match", "match", "200"]),
    ("match-invalid", ["--match", "train[.py"], "reject", "an invalid pattern", ["--match", "match"]),
    ("match-newline", ["--match", "train\n.py"], "either", "a newline in the pattern", ["--match", "match", "control"]),
    ("pid-many", [x for _ in range(3000) for x in ("--pid", "4242")], "either", "--pid 3000 times", ["--pid", "pid"]),
    ("pid-list", ["--pid", "1,2"], "reject", "a list in one --pid", ["--pid", "pid"]),
    ("pid-padded", ["--pid", "000042"], "either", "a zero-padded pid", ["--pid", "pid"]),
    ("w-empty", ["-w", ""], "reject", "-w ''", ["-w", "node", "empty", "host"]),
    ("w-unclosed", ["-w", "node[1-"], "reject", "README: a missing ] named", ["-w", "node", r"\]", "bracket"]),
    ("w-too-many", ["-w", "n[1-100000000]"], "reject", "README: over --max-hosts refused unexpanded", ["max-hosts", "10000", "many"]),
    ("w-shell", ["-w", "nodeA;touch {S}/pwned"], "reject", "shell characters in a node name", ["-w", "node", "host", ";"]),
    ("w-option", ["-w", "-oProxyCommand=touch {S}/pwned"], "reject", "an ssh option as a node", ["-w", "node", "host", "-o"]),
    ("w-zwsp", ["-w", "node\u200bA"], "reject", "a zero-width space", ["-w", "node", "host", "ASCII", "character"]),
    ("w-ok-list", ["-w", "node[001-004]"], "work", "a good node list", []),
]
for id, extra, exp, why, mention in SEL:
    drop = tuple(x for x in extra if x in ("-w",))
    case("sel-" + id, "select", base(drop=drop) + extra, exp, why, mention=mention, outputs=["out"],
         bound=8.0 if exp == "reject" else (20.0 if id in ("pid-many", "job-huge") else 12.0))
HOSTS = [
    ("missing", "nosuch.txt", [], "reject", "a hosts file that is not there", ["nosuch", "no such", "exist"]),
    ("directory", "hd", [{"kind": "dir", "path": "hd"}], "reject", "HOSTS a directory", ["hd", "director"]),
    ("fifo", "hf", [{"kind": "fifo", "path": "hf"}], "reject", "HOSTS a FIFO nobody writes", ["hf", "fifo", "regular"]),
    ("dev-zero", "/dev/zero", [], "reject", "HOSTS /dev/zero", ["zero", "device", "regular"]),
    ("proc-file", "/proc/self/environ", [], "reject", "HOSTS a /proc file", ["proc", "regular"]),
    ("shell-line", "h.txt", [{"kind": "file", "path": "h.txt", "text": "nodeA\n$(touch {S}/pwned)\n"}], "reject",
     "a hosts line with shell text: refused with its line number", ["line 2", ":2"]),
    ("empty", "h.txt", [{"kind": "file", "path": "h.txt", "text": "# nothing\n"}], "reject", "no host in the file",
     ["h.txt", "empty", "no host", "no node"]),
]
for id, path, fx, exp, why, mention in HOSTS:
    case("hosts-" + id, "select", base(drop=("-w",)) + [path], exp, why, fixtures=fx, mention=mention, outputs=["out"])
case("hosts-stdin-empty", "select", base(drop=("-w",)) + ["-"], "reject", "hosts from an empty stdin",
     mention=["stdin", "empty", "no host", "-"], outputs=["out"])
case("hosts-stdin-closed", "select", base(drop=("-w",)) + ["-"], "reject", "hosts from a closed stdin (README: refused)",
     stdin={"kind": "closed"}, mention=["stdin", "closed", "-"], outputs=["out"])
case("hosts-stdin-dir", "select", base(drop=("-w",)) + ["-"], "reject", "hosts from a directory on stdin",
     stdin={"kind": "dir"}, mention=["stdin", "director", "-"], outputs=["out"])

# =============================================================================================
# combinations and flags watch does not have
# =============================================================================================
COMB = [
    ("tui-no-terminal", ["--tui"], "reject", "README: the TUI needs a terminal (stdout is a file here)",
     ["tui", "terminal", "tty"]),
    ("fps-without-tui", ["--fps", "10"], "reject", "--help: --fps is 'with --tui'", ["fps", "tui"]),
    ("native-nonblocking", ["--native", "--nonblocking"], "reject", "--help: --nonblocking is not with --native",
     ["native", "nonblocking"]),
    ("slurm-with-hosts", ["--slurm", "12345"], "reject", "--slurm and -w name the nodes twice", ["slurm", "-w", "host"]),
    ("slurm-word", ["--slurm", "abc"], "reject", "--slurm abc", ["slurm", "abc", "job"]),
    ("slurm-empty", ["--slurm", ""], "reject", "--slurm ''", ["slurm", "empty"]),
    ("transport-without-slurm", ["--transport", "srun"], "reject", "README: --transport without --slurm is refused",
     ["transport", "slurm"]),
    ("transport-bad", ["--transport", "telnet"], "reject", "a transport outside the choices", ["transport", "telnet"]),
    ("gpu-evidence-bad", ["--gpu-evidence", "maybe"], "reject", "outside the choices", ["gpu-evidence", "maybe"]),
    ("once-keep-verbose", ["--once", "--keep", "3", "-v", "-q"], "either", "--once with --keep, -v with -q", ["-v", "-q", "verbose", "quiet"]),
    ("tui-verbose", ["--tui", "-v"], "either", "--tui with a print-like flag (no terminal either)",
     ["tui", "verbose", "-v", "terminal"]),
    ("python-empty", ["--python", ""], "reject", "README: an empty --python is refused", ["python", "empty"]),
    ("python-shell", ["--python", "python3; touch {S}/pwned"], "either", "shell text in --python (nodeA never connects)",
     ["python"]),
    ("F-fifo", ["-F", "cfg"], "reject", "-F a FIFO (README: refused without being opened)", ["-F", "cfg", "fifo", "regular"]),
    ("i-missing", ["-i", "nokey"], "either", "-i a missing identity", ["-i", "nokey", "identity"]),
    ("hosts-and-w", ["h.txt"], "either", "HOSTS and -w together", ["HOSTS", "-w", "h.txt"]),
    ("unknown-option", ["--frobnicate"], "reject", "an unknown option", ["frobnicate", "unrecognized", "unknown"]),
    ("abbrev", ["--ever", "5"], "either", "an abbreviation of --every (argparse may accept it)", ["ever"]),
    ("stray-args", ["h1.txt", "h2.txt"], "reject", "two positional arguments", ["h2.txt", "unrecognized", "argument"]),
    ("watch-watch", ["watch"], "reject", "`hangscope watch watch`: a hosts file named watch that is not there",
     ["watch", "no such", "exist"]),
]
for id, extra, exp, why, mention in COMB:
    drop = ()
    fx = []
    if id == "F-fifo":
        fx = [{"kind": "fifo", "path": "cfg"}]
    if id == "hosts-and-w":
        fx = [{"kind": "file", "path": "h.txt", "text": "nodeB\n"}]
    case("comb-" + id, "combination", base(drop=drop) + extra, exp, why, fixtures=fx, mention=mention, outputs=["out"])
for flag in [["--print"], ["--snapshot", "s.json"], ["--export", "rep"], ["--samples", "2"], ["--interval", "1"],
             ["--refresh", "5"], ["--test", "sanity"], ["--load", "s.json"], ["--raw"], ["--strace", "1"], ["--gdb"],
             ["--json", "j.json"], ["--force"], ["--tar"], ["--relay", "off"]]:
    case("main-only" + flag[0], "combination", base() + flag, "reject",
         f"{flag[0]} is a flag of the main command that watch --help does not list", mention=[esc(flag[0]),
         "unrecognized", "not .*watch"], outputs=["out"])

# =============================================================================================
# environment, stdin/stdout, signals
# =============================================================================================
ENVC = [
    ("home-unset", {}, ["HOME"], {}, "work", "HOME unset"),
    ("home-file", {"HOME": "{S}/homefile"}, [], {"fx": [{"kind": "file", "path": "{S}/homefile", "text": "x"}]},
     "either", "HOME is a file"),
    ("home-readonly", {"HOME": "{S}/rohome"}, [], {"fx": [{"kind": "romount", "path": "{S}/rohome"}]}, "either",
     "HOME on a read-only file system"),
    ("home-missing", {"HOME": "{S}/nohome"}, [], {}, "either", "HOME does not exist"),
    ("stdin-closed", {}, [], {"stdin": {"kind": "closed"}}, "work", "fd 0 closed"),
    ("stdout-closed-pipe", {}, [], {"stdout": "closed-pipe"}, "either", "stdout a closed pipe (| head -0): SIGPIPE/EPIPE"),
    ("stdout-closed-fd", {}, [], {"stdout": "closed"}, "either", "fd 1 closed"),
    ("lang-c", {"LANG": "C", "LC_ALL": "C"}, [], {}, "work", "an ASCII locale"),
    ("term-unset", {}, ["TERM"], {}, "work", "TERM unset (no --tui)"),
]
for id, env, unset, more, exp, why in ENVC:
    case("env-" + id, "environment", base(), exp, why, env=env, unset=unset, fixtures=more.get("fx", []),
         stdin=more.get("stdin"), stdout=more.get("stdout", "file"), mention=["HOME", "home", "stdout"],
         outputs=["out"], exits=[0, 1, 3, 120, 141] if "stdout" in id else None)
for id, term in [("xterm-unknown", "xterm-frobnicator"), ("dumb", "dumb"), ("empty", "")]:
    case("env-tui-term-" + id, "environment", base(drop=("--wait-start",)) + ["--wait-start", "60", "--tui"], "either",
         f"--tui in a terminal with TERM={term!r}: the TUI (Ctrl-C: exit 130 within 2 s) or one line",
         env={"TERM": term}, stdout="pty", sigint_at=6, bound=30.0, exits=[130, 2, 0, 1, 3], outputs=["out"],
         mention=["TERM", "terminal"])
case("env-tui-ctrl-c", "environment", base(drop=("--wait-start",)) + ["--wait-start", "60", "--tui"], "work",
     "--tui in a terminal (TERM=xterm-256color), Ctrl-C at 6 s", env={"TERM": "xterm-256color"}, stdout="pty",
     sigint_at=6, bound=30.0, exits=[130], outputs=["out"])
case("sig-int-while-waiting", "environment", base(drop=("--wait-start",)) + ["--wait-start", "600"], "work",
     "Ctrl-C while waiting for a job (no job on an unreachable node): exit 130 within 2 s", sigint_at=4,
     bound=30.0, exits=[130], outputs=["out"])
case("sig-term-while-waiting", "environment", base(drop=("--wait-start",)) + ["--wait-start", "600"], "work",
     "SIGTERM (README: end a background watch with kill) while waiting: ends within 2 s, no traceback",
     sigint_at=4, signal="TERM", bound=30.0, exits=[130, 143, 0, 1, 3], outputs=["out"])
case("sig-int-ignored", "environment", base(drop=("--wait-start",)) + ["--wait-start", "600"], "work",
     "started with SIGINT ignored (nohup/&): README: it stays ignored (survives SIGINT at 3 s), ends on SIGTERM at 7 s",
     ignore_int=True, survive=[3, "INT"], sigint_at=7, signal="TERM", bound=30.0, exits=[130, 143, 0, 1, 3],
     outputs=["out"])
case("sig-int-live-watching", "environment", ["watch", "--match", "{MARK}", "--every", "1", "--stall", "300",
                                              "--stall-start", "300", "--out", "out"], "work",
     "Ctrl-C while following a live (dummy) job before any capture (long stall limits): exit 130 within 2 s",
     fixtures=DUMMIES, sigint_at=3, bound=30.0, exits=[130], outputs=["out"])


if __name__ == "__main__":
    for c in CASES:
        c.setdefault("checks", {})
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(CASES, f, indent=1, ensure_ascii=True)
    cats: dict[str, int] = {}
    for c in CASES:
        cats[c["cat"]] = cats.get(c["cat"], 0) + 1
    print(f"{len(CASES)} cases -> {out}: " + ", ".join(f"{k} {v}" for k, v in cats.items()))
