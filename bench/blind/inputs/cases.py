"""The blind bad-input set for hangscope: the table.

Written from README.md and `hangscope --help` only (see README.md in this folder): nothing here was
derived from, or tuned against, the code that parses the input.  `python3 cases.py` writes cases.json,
the frozen form run.py reads.

A case is a dict:
  id        unique slug                      cat    category (the taxonomy in README.md)
  args      argv after `hangscope` (str, or {"gen": ...} expanded in the sandbox)
  expect    "reject" (exit 2, one-line message naming the problem) | "work" (accepted, ran: exit
            0/1/3, or `exits`) | "either" (reject or work)
  why       what the case probes and why that expectation
  mention   regexes, one of which the one-line message must contain (reject cases)
  bound     seconds within which it must end            fixtures  files made in the sandbox first
  env/unset environment given/removed                    stdin     what fd 0 is
  outputs   paths the tool may create or change (the output path the user named)
  series    {"name", "n"}: a point of a time-vs-size series
Paths are relative to the sandbox's working directory; {S} is the sandbox root.
"""

from __future__ import annotations

import json
import os
import re

CASES: list[dict] = []
S = "{S}"
NODE = ["-w", "nodeA", "--print", "--connect-timeout", "2"]  # a node that never resolves
SNAP = {"path": "snap.json", "kind": "snapshot"}  # a valid recorded snapshot (tests/data/scenarios)
LOAD = ["--load", "snap.json"]
PWNED = S + "/pwned"


def case(id, cat, args, expect, why, **kw):
    assert not any(c["id"] == id for c in CASES), id
    kw.setdefault("bound", 5.0 if expect == "reject" else 10.0)
    CASES.append(dict(id=id, cat=cat, args=args, expect=expect, why=why, **kw))


def esc(s: str) -> str:
    return re.escape(s)


# ---------------------------------------------------------------------------------------------
# A. hosts files (the positional HOSTS)
# ---------------------------------------------------------------------------------------------
H = ["--print", "--connect-timeout", "2"]
HM = ["hosts", "line", "host"]


def hosts(id, fixture, expect, why, path="hosts.txt", mention=None, **kw):
    fx = [dict(fixture, path=path)] if fixture is not None else []
    fx += kw.pop("more", [])
    case("hosts-" + id, "hosts-file", [path] + H, expect, why, fixtures=fx,
         mention=mention if mention is not None else HM + [esc(os.path.basename(path))], **kw)


hosts("missing", None, "reject", "a hosts file that does not exist", mention=["hosts.txt", "no such", "not found", "exist"])
hosts("directory", {"kind": "dir"}, "reject", "HOSTS is a directory", mention=["hosts.txt", "director"])
hosts("fifo-no-writer", {"kind": "fifo"}, "reject", "HOSTS is a FIFO nobody writes: opening it blocks forever",
      mention=["hosts.txt", "fifo", "regular", "pipe"])
hosts("chardev-zero", {"kind": "chardev", "dev": [1, 5]}, "reject",
      "HOSTS is a char device that yields endless NULs (1,5): must not be read to the end",
      mention=["hosts.txt", "device", "regular"])
hosts("chardev-null", {"kind": "chardev", "dev": [1, 3]}, "reject", "HOSTS is a null device: no hosts",
      mention=["hosts.txt", "device", "regular", "no host", "empty"])
hosts("dev-urandom", None, "reject", "HOSTS is the sandbox's /dev/urandom: endless binary",
      path="/dev/urandom", mention=["urandom", "device", "regular"])
hosts("empty", {"kind": "file", "text": ""}, "reject", "an empty hosts file names no node",
      mention=["hosts.txt", "empty", "no host", "no node"])
hosts("only-comments", {"kind": "file", "text": "# a\n\n   \n# b\r\n"}, "reject", "comments and blanks only",
      mention=["hosts.txt", "empty", "no host", "no node"])
hosts("binary", {"kind": "file", "gen": {"gen": "random", "n": 4096, "seed": 1}}, "reject", "random bytes")
hosts("invalid-utf8", {"kind": "file", "b64text": "bm9kZUEKbvZkZUIK"}, "reject",
      "latin-1 byte 0xf6 in a host name (invalid UTF-8)", mention=HM + ["utf", "decod", "hosts.txt"])
hosts("utf16", {"kind": "file", "encode": "utf-16", "text": "nodeA\n"}, "reject", "a UTF-16 file (with its BOM)",
      mention=HM + ["utf", "decod", "hosts.txt"])
hosts("bom-crlf", {"kind": "file", "text": "\ufeffnodeA\r\n# c\r\n"}, "work", "UTF-8 BOM and CRLF: documented as fine")
hosts("nul-byte", {"kind": "file", "text": "node\x00A\n"}, "reject", "a NUL byte inside a name")
hosts("nul-only", {"kind": "file", "text": "\x00" * 1000}, "reject", "a file of NUL bytes")
hosts("huge-line", {"kind": "file", "gen": {"gen": "repeat", "s": "a", "n": 10_000_000}}, "reject",
      "one 10 MB host name", bound=10.0)
hosts("huge-line-nonl", {"kind": "file", "gen": {"gen": "repeat", "s": "a ", "n": 2_000_000}}, "reject",
      "one 4 MB line of words", bound=10.0)
hosts("lines-10001", {"kind": "file", "gen": {"gen": "lines", "fmt": "node{i}", "n": 10_001}}, "reject",
      "10,001 distinct hosts: over --max-hosts (10000)", mention=["max-hosts", "10000", "10001", "too many"],
      bound=10.0)
hosts("lines-1e6", {"kind": "file", "gen": {"gen": "lines", "fmt": "node{i}", "n": 1_000_000}}, "reject",
      "10^6 distinct hosts: over --max-hosts", mention=["max-hosts", "10000", "too many"], bound=15.0, sigint_at=20)
hosts("lines-1e6-dup", {"kind": "file", "gen": {"gen": "lines", "fmt": "nodeA", "n": 1_000_000}}, "work",
      "10^6 copies of one host: deduplicated (a warning, not 10^6 of them)", bound=15.0, sigint_at=20)
hosts("lines-1e6-comments", {"kind": "file", "gen": {"gen": "lines", "fmt": "# comment {i}", "n": 1_000_000}},
      "reject", "10^6 comment lines and no host", mention=["hosts.txt", "empty", "no host", "no node"],
      bound=15.0, sigint_at=20)
hosts("symlink-loop", {"kind": "symlink", "to": "loop2"}, "reject", "a symlink loop",
      more=[{"path": "loop2", "kind": "symlink", "to": "hosts.txt"}], mention=["hosts.txt", "loop", "symbolic", "link"])
hosts("symlink-dangling", {"kind": "symlink", "to": "nowhere.txt"}, "reject", "a dangling symlink",
      mention=["hosts.txt", "no such", "not found", "exist", "nowhere"])
hosts("symlink-ok", {"kind": "symlink", "to": "real.txt"}, "work", "a symlink to a good hosts file",
      more=[{"path": "real.txt", "kind": "file", "text": "nodeA\n"}])
for i, (name, line) in enumerate([
    ("semicolon", "nodeA;touch {S}/pwned"),
    ("subst", "$(touch {S}/pwned)"),
    ("backtick", "`touch {S}/pwned`"),
    ("pipe", "nodeA|touch {S}/pwned"),
    ("and", "nodeA&&touch {S}/pwned"),
    ("redirect", "nodeA>{S}/pwned"),
    ("newline-in-name", "node\rA"),
    ("proxycommand", "-oProxyCommand=touch {S}/pwned"),
    ("proxycommand-noblank", "-oProxyCommand=touch${IFS}{S}/pwned"),
    ("dash-F", "-F/etc/passwd"),
    ("user-option", "-oProxyCommand=x@nodeA"),
    ("user-dash", "-l@nodeA"),
    ("glob", "node*"),
    ("quote", "node'A"),
]):
    hosts("shell-" + name, {"kind": "file", "text": "nodeB\n" + line + "\n"}, "reject",
          f"shell/option-like line {line!r}: refused with its line number before any connection",
          mention=["line 2", ":2"], checks={"pwned": PWNED})
for name, line, exp in [
    ("slots-abc", "nodeA slots=abc", "reject"),
    ("slots-neg", "nodeA slots=-1", "reject"),
    ("slots-zero", "nodeA slots=0", "either"),
    ("slots-30digits", "nodeA slots=" + "9" * 30, "reject"),
    ("slots-nan", "nodeA slots=nan", "reject"),
    ("slots-twice", "nodeA slots=8 slots=9", "reject"),
    ("colon-zero", "nodeA:0", "either"),
    ("colon-huge", "nodeA:" + "9" * 30, "reject"),
    ("colon-colon", "nodeA:8:9", "reject"),
    ("port-zero", "nodeA port=0", "reject"),
    ("port-65536", "nodeA port=65536", "reject"),
    ("port-neg", "user@nodeA:-1", "reject"),
    ("port-abc", "user@nodeA:abc", "reject"),
    ("user-at-at", "user@@nodeA", "reject"),
    ("user-empty", "@nodeA", "reject"),
    ("host-empty", "user@", "reject"),
    ("unknown-key", "nodeA foo=bar", "reject"),
    ("ipv6-unclosed", "[fe80::1:22", "reject"),
    ("ipv6-port-abc", "[fe80::1]:abc", "reject"),
    ("ipv6-garbage", "[zzzz]:22", "reject"),
    ("ipv4-256", "10.0.0.256", "either"),
    ("inline-comment", "nodeA # the first node", "either"),
    ("tab-slots", "nodeA\tslots=2", "either"),
    ("zero-width", "node\u200bA", "reject"),
    ("rtl-mark", "\u202enodeA", "reject"),
    ("cyrillic-a", "node\u0410", "reject"),
    ("nbsp", "nodeA\u00a0", "either"),
    ("group", "@gpus", "reject"),
    ("nodelist-ok", "node[1-2]", "work"),
    ("nodelist-unclosed", "node[1-2", "reject"),
    ("nodelist-huge", "node[0-99999999]", "reject"),
    ("label-64", "a" * 64, "either"),
    ("name-300", "a" * 300, "reject"),
]:
    hosts("line-" + name, {"kind": "file", "text": line + "\n"}, exp, f"hosts line {line[:60]!r}",
          mention=["line 1", ":1"], checks={"pwned": PWNED})
hosts("proc-status", None, "reject", "HOSTS is /proc/self/status (a /proc file, lines like 'Name:\\tpython')",
      path="/proc/self/status", mention=["status", "/proc", "line", "regular"])
hosts("proc-environ", None, "reject", "HOSTS is /proc/self/environ (NUL-separated)", path="/proc/self/environ",
      mention=["environ", "/proc", "line", "regular"])
case("hosts-empty-path", "hosts-file", [""] + H, "reject", "HOSTS is the empty string", mention=["hosts", "empty", "''"])
case("hosts-dashdash-option", "hosts-file", H + ["--", "-oProxyCommand=touch {S}/pwned"], "reject",
     "a HOSTS file named like an ssh option (after --): just a missing file", mention=["ProxyCommand", "no such", "not found", "exist"],
     checks={"pwned": PWNED})

# ---------------------------------------------------------------------------------------------
# B. node lists (-w)
# ---------------------------------------------------------------------------------------------
WM = ["-w", "node", "list", "host", "bracket", "range", "name"]


def nodelist(id, value, expect, why, mention=WM, extra=(), **kw):
    args = ["-w", value] + H + list(extra)
    case("nodelist-" + id, "nodelist", args, expect, why, mention=mention, checks={"pwned": PWNED}, **kw)


for id, v, exp, why in [
    ("missing-close", "gpu[001-004", "reject", "missing ]"),
    ("extra-close", "gpu001-004]", "reject", "a ] with no ["),
    ("nested", "gpu[[1-2]]", "reject", "nested brackets"),
    ("reversed", "gpu[4-1]", "reject", "a reversed range"),
    ("huge-range", "gpu[0-99999999]", "reject", "10^8 nodes: over --max-hosts, refused without expanding"),
    ("range-1e5", "gpu[1-100000]", "reject", "10^5 nodes: over --max-hosts"),
    ("product-2e20", "a[0-999]b[0-999]c[0-999]d[0-999]e[0-999]f[0-999]g[0-99]", "reject",
     "a cartesian product of 10^20 names: refused without expanding"),
    ("pad-mismatch-1", "gpu[01-100]", "either", "zero padding 2 vs 3 digits"),
    ("pad-mismatch-2", "gpu[001-4]", "either", "zero padding 3 vs 1 digits"),
    ("empty", "", "reject", "an empty node list"),
    ("comma", ",", "reject", "only a comma"),
    ("commas", ",,,", "reject", "only commas"),
    ("empty-brackets", "gpu[]", "reject", "empty brackets"),
    ("dash-only", "gpu[-]", "reject", "a range with no ends"),
    ("open-end", "gpu[1-]", "reject", "a range with no upper end"),
    ("negative", "gpu[-1]", "reject", "a negative index"),
    ("double-dash", "gpu[1--2]", "reject", "two dashes"),
    ("three-ends", "gpu[1-2-3]", "reject", "a range with three ends"),
    ("letters", "gpu[a-c]", "reject", "letters in a range"),
    ("two-ranges", "gpu[1-2]x[3-4]", "work", "two ranges in one name: 4 nodes"),
    ("dups", "gpu[1,1,1]", "work", "duplicates dropped with a warning"),
    ("group", "@gpus", "reject", "a group: documented as not resolved"),
    ("step", "gpu[1-9/4]", "either", "a step (ClusterShell syntax)"),
    ("step-zero", "gpu[1-9/0]", "reject", "a step of 0"),
    ("step-neg", "gpu[1-9/-1]", "reject", "a negative step"),
    ("option-like", "-oProxyCommand=touch {S}/pwned", "reject", "an ssh option as a node"),
    ("semicolon", "nodeA;touch {S}/pwned", "reject", "shell metacharacters"),
    ("subst", "$(touch {S}/pwned)", "reject", "command substitution"),
    ("space", "nodeA nodeB", "reject", "a space inside the list"),
    ("newline", "nodeA\nnodeB", "reject", "a newline inside the list"),
    ("ipv6", "[fe80::1]", "either", "an IPv6 address in brackets (clashes with range brackets)"),
    ("user-port", "user@nodeA:2222", "either", "user and port in -w"),
    ("exclusion", "gpu[1-3]!gpu2", "either", "ClusterShell's exclusion operator"),
    ("intersection", "gpu[1-3]&gpu2", "reject", "& (a shell character, ClusterShell's intersection)"),
    ("xor", "gpu[1-3]^gpu2", "either", "ClusterShell's xor"),
    ("zero-width", "gpu\u200b[1-2]", "reject", "a zero-width space"),
    ("zero-width-in-range", "gpu[1\u200b-2]", "reject", "a zero-width space inside a range"),
    ("rtl", "\u202egpu[1-2]", "reject", "a right-to-left override"),
    ("bom", "\ufeffgpu1", "reject", "a BOM before the name"),
    ("nbsp", "gpu1\u00a0", "reject", "a no-break space"),
    ("fullwidth-digits", "gpu[\uff11-\uff12]", "reject", "fullwidth digits in a range"),
    ("arabic-digits", "gpu[\u0663-\u0665]", "reject", "Arabic-Indic digits in a range (int() takes them)"),
    ("cyrillic", "gpu\u0430", "reject", "a Cyrillic letter in the name"),
    ("long-prefix-300", "a" * 300 + "[1-2]", "reject", "a 300-character prefix (no host name is that long)"),
    ("label-64", "a" * 64, "either", "a 64-character label"),
    ("digits-5000", "gpu[0-" + "9" * 5000 + "]", "reject", "a 5000-digit bound (Python's int limit is 4300)"),
    ("pad-5000", "gpu[" + "0" * 5000 + "1-2]", "reject", "5000 digits of zero padding"),
]:
    nodelist(id, v, exp, why)
case("nodelist-repeated-1000", "nodelist", sum([["-w", "nodeA"] for _ in range(1000)], []) + H, "work",
     "-w nodeA given 1000 times: one node, no flood of warnings")
case("nodelist-missing-value", "nodelist", ["-w"], "reject", "-w with no value", mention=["-w", "argument", "expected"])
case("nodelist-with-hosts-file", "nodelist", ["hosts.txt", "-w", "nodeB"] + H, "either",
     "a hosts file and -w together", fixtures=[{"path": "hosts.txt", "kind": "file", "text": "nodeA\n"}])

# growing pathological shapes: time vs length (argv strings stay under 128 KiB)
SHAPES = [  # name, builder, expectation
    ("unclosed", {"gen": "repeat", "s": "a[", "k": 2}, "reject"),
    ("nested", {"gen": "nest", "open": "[", "close": "]", "k": 2}, "reject"),
    ("prefix", {"gen": "repeat", "s": "a", "k": 1}, "reject"),
    ("bang", {"gen": "repeat", "s": "a", "k": 1, "suffix": "!"}, "reject"),
    ("dashes", {"gen": "repeat", "s": "a-", "k": 2, "suffix": "!"}, "reject"),
    ("dots", {"gen": "repeat", "s": "a.", "k": 2, "suffix": "!"}, "reject"),
    ("distinct", {"gen": "seq", "fmt": "n{i},", "k": 7}, "reject"),
    ("product", {"gen": "repeat", "s": "a[1-2]", "k": 6}, "reject"),
    ("rangelist", {"gen": "seq", "fmt": "{i},", "k": 7, "prefix": "a[", "suffix": "]"}, "reject"),
    ("bigdigits", {"gen": "repeat", "s": "9", "k": 1, "prefix": "a[0-", "suffix": "]"}, "reject"),
    ("padding", {"gen": "repeat", "s": "0", "k": 1, "prefix": "a[", "suffix": "1-2]"}, "reject"),
    ("pairs", {"gen": "repeat", "s": "[]", "k": 2}, "reject"),
    ("dashrange", {"gen": "repeat", "s": "-", "k": 1, "prefix": "a[1-2", "suffix": "]"}, "reject"),
    ("colons6", {"gen": "repeat", "s": ":", "k": 1, "prefix": "[", "suffix": "]"}, "reject"),
    ("atsigns", {"gen": "repeat", "s": "u@", "k": 2, "suffix": "h"}, "reject"),
    ("ports", {"gen": "repeat", "s": ":1", "k": 2, "prefix": "h"}, "reject"),
    ("commas-open", {"gen": "repeat", "s": "a[1,", "k": 4}, "reject"),
    ("comma-dup", {"gen": "repeat", "s": "a,", "k": 2, "suffix": "a"}, "work"),
]
W_SIZES = [2000, 8000, 32000, 120000]
for name, gen, exp in SHAPES:
    for n in W_SIZES:
        g = dict(gen, n=n)
        case(f"nodelist-grow-{name}-{n}", "nodelist-growth", ["-w", g, "--max-hosts", "50"] + H, exp,
             f"-w shape {name!r} at {n} characters: parse time must grow linearly",
             mention=WM + ["max-hosts", "too many", "50"], series={"name": "-w " + name, "n": n},
             bound=6.0 if exp == "reject" else 10.0, sigint_at=25, timeout=30)
F_SIZES = [10_000, 100_000, 1_000_000]
for name, gen, exp in SHAPES:
    if name in ("comma-dup",):
        continue
    for n in F_SIZES:
        g = dict(gen, n=n)
        case(f"hosts-grow-{name}-{n}", "hosts-growth", ["hosts.txt", "--max-hosts", "50"] + H, exp,
             f"a hosts file whose one line is shape {name!r} at {n} characters: linear parse",
             fixtures=[{"path": "hosts.txt", "kind": "file", "gen": dict(g, newline=True)}],
             mention=HM + ["max-hosts", "too many", "50"], series={"name": "hosts " + name, "n": n},
             bound=10.0, sigint_at=25, timeout=30)
for fmt, exp, mention in [("node{i}", "reject", ["max-hosts", "10000", "too many"]),
                          ("# c{i}", "reject", ["empty", "no host", "no node", "hosts.txt"]),
                          ("nodeA", "work", None)]:
    for n in (10_001, 100_000, 1_000_000):
        nm = {"node{i}": "distinct", "# c{i}": "comments", "nodeA": "dups"}[fmt]
        case(f"hosts-lines-{nm}-{n}", "hosts-growth", ["hosts.txt"] + H, exp,
             f"{n} lines of {fmt!r}: linear in the number of lines",
             fixtures=[{"path": "hosts.txt", "kind": "file", "gen": {"gen": "lines", "fmt": fmt, "n": n}}],
             mention=mention, series={"name": "hosts lines " + nm, "n": n}, bound=15.0, sigint_at=25, timeout=30)

# ---------------------------------------------------------------------------------------------
# C. numeric flags: every one --help lists
# ---------------------------------------------------------------------------------------------
NUM = [  # flag, kind (s seconds | n count | r ratio), mode, zero, huge (>= 1e30)
    ("--timeout", "s", "collect", "reject", "either"),
    ("--interval", "s", "collect", "work", "reject"),
    ("--connect-timeout", "s", "collect", "reject", "either"),
    ("--strace", "s", "collect", "either", "reject"),
    ("--samples", "n", "collect", "reject", "reject"),
    ("--fanout", "n", "collect", "reject", "either"),
    ("--max-hosts", "n", "collect", "reject", "either"),
    ("--refresh", "s", "tui", "either", "either"),
    ("--fps", "n", "tui", "reject", "either"),
    ("--test-timeout", "s", "gpu:sanity", "reject", "either"),
    ("--startup-timeout", "s", "gpu:sanity", "reject", "either"),
    ("--iters", "n", "gpu:bench", "reject", "reject"),
    ("--warmup", "n", "gpu:bench", "work", "reject"),
    ("--procs-per-node", "n", "gpu:sanity", "reject", "reject"),
    ("--slow-ratio", "r", "gpu:pairs", "either", "either"),
    ("--min-busbw", "r", "gpu:pairs", "either", "either"),
]
VALUES = [  # name, text, expectation: a fixed one, or "zero"/"huge" (the flag's own), or by kind
    ("nan", "nan", "reject"), ("inf", "inf", "reject"), ("-inf", "-inf", "reject"), ("neg", "-1", "reject"),
    ("zero", "0", "zero"), ("1e308", "1e308", {"n": "reject", "s": "huge", "r": "huge"}),
    ("30digits", "1" + "0" * 29, "huge"), ("hex", "0x10", "either"), ("underscore", "1_0", "either"),
    ("empty", "", "reject"), ("blank", "   ", "reject"), ("arabic", "\u0663", "either"),
    ("fullwidth", "\uff13", "either"), ("word", "abc", "reject"),
    ("frac", "1.5", {"n": "reject", "s": "work", "r": "work"}), ("padded", " 3 ", "either"),
    ("unit", "5s", "reject"), ("tiny", "1e-9", {"n": "reject", "s": "either", "r": "either"}),
]
for flag, kind, mode, zero, huge in NUM:
    if mode == "collect":
        base = ["-w", "nodeA", "--print"] + ([] if flag == "--connect-timeout" else ["--connect-timeout", "2"])
    elif mode == "tui":
        base = ["-w", "nodeA", "--connect-timeout", "2"]  # no terminal: the TUI cannot start either way
    else:
        base = ["-w", "nodeA", "--connect-timeout", "2", "--test", mode.split(":")[1]]
    for vname, text, exp in VALUES:
        if isinstance(exp, dict):
            exp = exp[kind]
        exp = {"zero": zero, "huge": huge}.get(exp, exp)
        kw = {}
        if mode == "tui":
            # the TUI needs a terminal: a good value is refused for that, a bad one for itself
            kw["mention"] = [esc(flag)] if exp == "reject" else [esc(flag), "terminal", "tty", "--print"]
            exp = "reject" if exp == "reject" else "either"
            if exp == "either":
                kw["exits"] = [2]
        else:
            kw["mention"] = [esc(flag), esc(flag.lstrip("-"))]
        case(f"num{flag}-{vname}", "numeric", base + [f"{flag}={text}"], exp,
             f"{flag}={text!r} ({kind}, {mode})", **kw)
# a few spellings argparse treats specially (negative numbers as separate words)
for flag, text in [("--samples", "-1"), ("--timeout", "-5"), ("--interval", "-inf"), ("--fanout", "-0")]:
    case(f"num{flag}-sep{text}", "numeric", NODE + [flag, text], "reject",
         f"{flag} {text} as two words", mention=[esc(flag)])
for sub, flag, text in [("nproc", "--nproc", "abc"), ("nproc", "--nproc", ""), ("nproc", "--nproc", "nan"),
                        ("nproc", "--nproc", "-1"), ("nproc", "--nproc", "0"), ("nproc", "--nproc", "1.5"),
                        ("timeout", "--timeout", "nan"), ("timeout", "--timeout", "-1"), ("timeout", "--timeout", "abc"),
                        ("timeout", "--timeout", "inf")]:
    case(f"demo{flag}-{text or 'empty'}", "numeric", ["demo", f"{flag}={text}", "--print"], "reject",
         f"hangscope demo {flag}={text!r}", mention=[esc(flag), flag.lstrip("-")], bound=5.0)
case("demo-scenario-bogus", "numeric", ["demo", "--scenario", "bogus", "--print"], "reject", "an unknown demo scenario",
     mention=["scenario", "bogus"])
# sizes
for id, flag, text, exp, mode in [
    ("sizes-empty", "--sizes", "", "reject", "bench"), ("sizes-unit", "--sizes", "1X", "reject", "bench"),
    ("sizes-zero", "--sizes", "0", "reject", "bench"), ("sizes-neg", "--sizes", "-1K", "reject", "bench"),
    ("sizes-ok", "--sizes", "1K:1M", "work", "bench"), ("sizes-reversed", "--sizes", "1G:1K", "reject", "bench"),
    ("sizes-exa", "--sizes", "1K:1E", "reject", "bench"), ("sizes-1e308", "--sizes", "1e308", "reject", "bench"),
    ("sizes-nan", "--sizes", "nan", "reject", "bench"), ("sizes-double-comma", "--sizes", "1K,,1M", "either", "bench"),
    ("sizes-three-colons", "--sizes", "1K:1M:x", "reject", "bench"),
    ("sizes-30digits", "--sizes", "9" * 30 + "K", "reject", "bench"), ("sizes-comma", "--sizes", ",", "reject", "bench"),
    ("sizes-20000", "--sizes", ",".join(["1K"] * 20000), "either", "bench"),
    ("sizes-arabic", "--sizes", "\u0663K", "either", "bench"),
    ("pair-size-zero", "--pair-size", "0", "reject", "pairs"), ("pair-size-neg", "--pair-size", "-1", "reject", "pairs"),
    ("pair-size-nan", "--pair-size", "nan", "reject", "pairs"), ("pair-size-peta", "--pair-size", "1P", "reject", "pairs"),
    ("pair-size-empty", "--pair-size", "", "reject", "pairs"), ("pair-size-ok", "--pair-size", "4M", "work", "pairs"),
    ("pair-size-30digits", "--pair-size", "9" * 30, "reject", "pairs"),
    ("pair-size-frac", "--pair-size", "1.5M", "either", "pairs"),
]:
    case("num-" + id, "numeric", ["-w", "nodeA", "--connect-timeout", "2", "--test", mode, f"{flag}={text}"], exp,
         f"{flag}={text[:40]!r}", mention=[esc(flag), flag.lstrip("-"), "size"])

# ---------------------------------------------------------------------------------------------
# D. choices and free-text options
# ---------------------------------------------------------------------------------------------
for flag, text in [("--test", "bogus"), ("--test", ""), ("--test", "SANITY"), ("--backend", "mpi"),
                   ("--transport", "telnet"), ("--gpu-evidence", "maybe"), ("--gpu-evidence", "")]:
    case(f"choice{flag}-{text or 'empty'}", "choices", NODE + [f"{flag}={text}"], "reject", f"{flag}={text!r}",
         mention=[esc(flag), "choice", "invalid"])
GT = ["-w", "nodeA", "--connect-timeout", "2", "--test"]
for id, value, exp in [("no-equals", "FOO", "reject"), ("empty-name", "=x", "reject"),
                       ("ld-preload", "LD_PRELOAD=/tmp/x.so", "reject"), ("path", "PATH=/evil", "reject"),
                       ("empty-value", "NCCL_DEBUG=", "either"), ("ok", "NCCL_DEBUG=INFO", "work"),
                       ("newline", "NCCL_X=a\nb", "reject"), ("subst", "NCCL_X=$(touch {S}/pwned)", "either"),
                       ("lowercase", "nccl_debug=INFO", "either"), ("huge-name", "NCCL_" + "A" * 100000 + "=1", "either"),
                       ("option-like", "-oProxyCommand=x", "reject")]:
    case("nccl-env-" + id, "choices", GT + ["sanity", "--nccl-env", value], exp, f"--nccl-env {value[:40]!r}",
         mention=["nccl-env", "NCCL_", "NAME=VALUE"], checks={"pwned": PWNED})
for id, value, exp in [("no-port", "host", "reject"), ("empty-port", "host:", "reject"), ("no-host", ":80", "reject"),
                       ("port-zero", "host:0", "reject"), ("port-65536", "host:65536", "reject"),
                       ("port-neg", "host:-1", "reject"), ("port-word", "host:abc", "reject"),
                       ("ipv6-ok", "[::1]:80", "work"), ("ipv6-unclosed", "[::1:80", "reject"),
                       ("option-like", "-oProxyCommand=x:22", "reject"), ("newline", "host:80\n", "reject"),
                       ("long-host", "a" * 1000 + ":80", "either")]:
    case("target-" + id, "choices", GT + ["net", "--target", value], exp, f"--target {value[:40]!r}",
         mention=["target", "HOST:PORT", "port"])
for id, value, exp in [("empty", "", "reject"), ("space", "a b", "reject"), ("option-like", "-oProxyCommand=x", "reject"),
                       ("subst", "$(touch {S}/pwned)", "reject"), ("newline", "host\n", "reject"), ("ipv6", "[::1]", "either")]:
    case("master-addr-" + id, "choices", GT + ["sanity", f"--master-addr={value}"], exp, f"--master-addr {value!r}",
         mention=["master-addr", "addr"], checks={"pwned": PWNED})
for id, value, exp in [("empty", "", "reject"), ("nomatch", "nonexistent", "reject"), ("port", "33175", "work"),
                       ("paren", "(", "reject"), ("huge", "x" * 100000, "reject")]:
    case("job-" + id, "choices", LOAD + ["--print", f"--job={value}"], exp, f"--job {value[:30]!r} on a loaded snapshot",
         fixtures=[SNAP], mention=["job"], exits=[0] if exp == "work" else None)
case("job-collect-nomatch", "choices", NODE + ["--job", "zzz"], "either", "--job when collecting (nothing collected)")

# ---------------------------------------------------------------------------------------------
# E. output paths: --snapshot (before connecting), --export (from --load), --tar, --json
# ---------------------------------------------------------------------------------------------
VICTIM = {"path": "{S}/elsewhere/victim.txt", "kind": "file", "text": "precious\n"}


def outp(id, flag, target, fixtures, expect, why, pre, post=(), outputs=None, mention=None, **kw):
    args = list(pre) + [flag, target] + list(post)
    outs = outputs if outputs is not None else [target] + ([target + ".tar.gz"] if "--tar" in post else [])
    case(f"out{flag}-{id}", "output-path", args, expect, why, fixtures=fixtures, outputs=outs,
         mention=mention if mention is not None else [esc(flag), esc(os.path.basename(target.rstrip("/")) or target)],
         **kw)


SPECIAL_OUT = [  # id, target, fixtures, expectation, why
    ("exists", "out.json", [{"path": "out.json", "kind": "file", "text": "old\n"}], "reject", "exists, no --force"),
    ("symlink-victim", "out.json", [{"path": "out.json", "kind": "symlink", "to": "{S}/elsewhere/victim.txt"}, VICTIM],
     "reject", "a symlink to a file elsewhere: never written through"),
    ("symlink-dangling", "out.json", [{"path": "out.json", "kind": "symlink", "to": "{S}/elsewhere/new.json"},
                                       {"path": "{S}/elsewhere", "kind": "dir"}], "reject",
     "a dangling symlink: never creates its target"),
    ("symlink-loop", "out.json", [{"path": "out.json", "kind": "symlink", "to": "out.json"}], "reject", "a symlink loop"),
    ("fifo", "out.json", [{"path": "out.json", "kind": "fifo"}], "reject", "a FIFO nobody reads: must not block"),
    ("fifo-reader", "out.json", [{"path": "out.json", "kind": "fifo", "reader": True}], "reject",
     "a FIFO someone reads: never written through"),
    ("chardev-null", "out.json", [{"path": "out.json", "kind": "chardev", "dev": [1, 3]}], "reject", "a null device node"),
    ("dev-null", "/dev/null", [], "reject", "the sandbox's /dev/null (a 1,3 node on a private tmpfs)"),
    ("dev-full", "/dev/full", [], "reject", "the sandbox's /dev/full (writes fail with ENOSPC)"),
    ("dev-disk", "/dev/sdz", [{"path": "/dev/sdz", "kind": "pty"}], "reject",
     "a device node named like a disk (a pty the harness reads: any byte written is caught)"),
    ("pty-here", "disk.img", [{"path": "disk.img", "kind": "pty"}], "reject", "a char device in the working directory"),
    ("directory", "outdir", [{"path": "outdir", "kind": "dir"}], "reject", "an existing directory"),
    ("file-as-parent", "file.txt/out.json", [{"path": "file.txt", "kind": "file", "text": "x\n"}], "reject",
     "a regular file as the parent directory"),
    ("readonly-dir", "ro/out.json", [{"path": "ro", "kind": "romount"}], "reject", "a read-only directory (ro mount)"),
    ("proc-hostname", "/proc/sys/kernel/hostname", [], "reject", "a /proc/sys file (guarded: ro proc, own UTS namespace)"),
    ("proc-self-fd1", "/proc/self/fd/1", [], "reject", "/proc/self/fd/1: through a /proc magic link into stdout"),
    ("proc-missing", "/proc/nonexistent/out.json", [], "reject", "a path under /proc that does not exist"),
    ("sys-file", "/sys/kernel/mm/transparent_hugepage/enabled", [], "reject", "a /sys file (guarded: ro mounts)"),
    ("sys-dir", "/sys/kernel/out.json", [], "reject", "a new file in /sys"),
    ("empty", "", [], "reject", "the empty string"),
    ("name-too-long", "x" * 300 + ".json", [], "reject", "a 300-byte file name (NAME_MAX 255)"),
]


def snapshot_outputs():
    for id, target, fx, exp, why in SPECIAL_OUT + [
        ("no-parent", "a/b/c/out.json", [], "either", "a path whose parent does not exist (create it or refuse)"),
        ("newline", "out\n.json", [], "either", "a file name with a newline (one-line message if refused)"),
        ("dash", "-", [], "either", "'-' (stdout?)"),
        ("ok", "out.json", [], "work", "a plain new file: accepted"),
        ("same-as-hosts", "hosts.txt", [{"path": "hosts.txt", "kind": "file", "text": "nodeA\n"}], "reject",
         "the hosts file itself, with --force: the input must not be overwritten"),
    ]:
        if id == "same-as-hosts":
            outp(id, "--snapshot", target, fx, exp, why, ["hosts.txt", "--print", "--connect-timeout", "2", "--force"],
                 outputs=[], mention=["hosts.txt", "input", "same"])
            continue
        outp(id, "--snapshot", target, fx, exp, why, ["-w", "nodeA", "--connect-timeout", "2"],
             forbid_stdout=r'"schema"' if target == "/proc/self/fd/1" else None)


snapshot_outputs()
for id, target, fx, exp, why in SPECIAL_OUT + [
    ("no-parent", "a/b/c/rep", [], "either", "parents that do not exist"),
    ("newline", "rep\nx", [], "either", "a directory name with a newline"),
    ("ok", "rep", [], "work", "a plain new directory: accepted"),
    ("trailing-slash", "rep/", [], "work", "a new directory given with a trailing slash"),
    ("full-disk", "full/rep", [{"path": "full", "kind": "fulltmpfs", "size": "64k"}], "reject",
     "a file system with 64 KiB left: ENOSPC mid-write, a clean message"),
    ("symlink-dir", "rep", [{"path": "rep", "kind": "symlink", "to": "{S}/elsewhere"}, {"path": "{S}/elsewhere", "kind": "dir"}],
     "reject", "a symlink to a directory elsewhere: nothing written there"),
    ("proc-cwd", "/proc/self/cwd/rep", [], "either", "through /proc/self/cwd (the working directory)"),
    ("same-as-load", "snap.json", [], "reject", "the --load file itself"),
]:
    fx = [SNAP] + fx
    post = ["--force"] if id == "same-as-load" else []
    outs = [] if id == "same-as-load" else None
    if id == "proc-cwd":
        outs = ["rep", "/proc/self/cwd/rep"]
    outp(id, "--export", target, fx, exp, why, LOAD, post, outputs=outs)
for id, target, fx, why, preserve in [
    ("cwd-force", ".", [{"path": "notes.txt", "kind": "file", "text": "mine\n"}], "the working directory with --force",
     ["notes.txt", "snap.json"]),
    ("home-force", "{S}/home", [{"path": "{S}/home/.bashrc", "kind": "file", "text": "# mine\n"}], "$HOME with --force",
     ["{S}/home/.bashrc"]),
    ("parent-force", "..", [{"path": "{S}/keep.txt", "kind": "file", "text": "mine\n"}], "the parent directory with --force",
     ["{S}/keep.txt"]),
    ("foreign-force", "rep", [{"path": "rep/notes.txt", "kind": "file", "text": "mine\n"}],
     "an existing directory holding the user's own file, with --force", []),
]:
    case(f"out--export-{id}", "output-path", LOAD + ["--export", target, "--force"], "either",
         f"--export {why}: refuse, or write only the bundle's own files; never delete the user's",
         fixtures=[SNAP] + fx, outputs=[target], preserve=preserve, mention=["export", "director"])
for id, fx, exp, why in [
    ("exists", [{"path": "rep.tar.gz", "kind": "file", "text": "old"}], "reject", "DIR.tar.gz exists, no --force"),
    ("symlink", [{"path": "rep.tar.gz", "kind": "symlink", "to": "{S}/elsewhere/victim.txt"}, VICTIM], "reject",
     "DIR.tar.gz is a symlink to a file elsewhere"),
    ("fifo", [{"path": "rep.tar.gz", "kind": "fifo"}], "reject", "DIR.tar.gz is a FIFO nobody reads"),
    ("pty", [{"path": "rep.tar.gz", "kind": "pty"}], "reject", "DIR.tar.gz is a char device"),
    ("directory", [{"path": "rep.tar.gz", "kind": "dir"}], "reject", "DIR.tar.gz is a directory"),
    ("ok", [], "work", "a plain --export --tar"),
]:
    case(f"out--tar-{id}", "output-path", LOAD + ["--export", "rep", "--tar"], exp, "--tar: " + why,
         fixtures=[SNAP] + fx, outputs=["rep", "rep.tar.gz"], mention=["tar", "rep.tar.gz", "export"],
         exits=[0] if exp == "work" else None)
case("out--tar-same-as-load", "output-path", ["--load", "rep.tar.gz", "--export", "rep", "--tar", "--force"], "reject",
     "--tar would overwrite the --load file (rep.tar.gz) itself", fixtures=[dict(SNAP, path="rep.tar.gz")],
     outputs=["rep"], mention=["tar", "rep.tar.gz", "load", "input"])
for id, target, fx, exp, why in [
    ("fifo", "res.json", [{"path": "res.json", "kind": "fifo"}], "reject", "a FIFO nobody reads"),
    ("pty", "res.json", [{"path": "res.json", "kind": "pty"}], "reject", "a char device"),
    ("symlink", "res.json", [{"path": "res.json", "kind": "symlink", "to": "{S}/elsewhere/victim.txt"}, VICTIM], "reject",
     "a symlink to a file elsewhere"),
    ("directory", "res.json", [{"path": "res.json", "kind": "dir"}], "reject", "a directory"),
    ("proc", "/proc/sys/kernel/hostname", [], "reject", "a /proc/sys file"),
    ("ok", "res.json", [], "work", "a plain file"),
]:
    outp(id, "--json", target, fx, exp, why, ["-w", "nodeA", "--connect-timeout", "2", "--test", "net"])

# ---------------------------------------------------------------------------------------------
# F. --load files
# ---------------------------------------------------------------------------------------------
LM = ["load", "snapshot", "json", "snap.json"]


def load(id, fx, expect, why, path="snap.json", extra=("--print",), mention=LM, **kw):
    fxs = ([dict(fx, path=path)] if fx is not None else []) + kw.pop("more", [])
    kw.setdefault("exits", [0] if expect == "work" else None)
    case("load-" + id, "load", ["--load", path] + list(extra), expect, why, fixtures=fxs, mention=mention, **kw)


def mut(*ops):
    return {"kind": "snapshot", "ops": [list(o) for o in ops]}


load("valid", {"kind": "snapshot"}, "work", "a recorded snapshot: the control case")
load("valid-export", {"kind": "snapshot"}, "work", "--load --export: the control case", extra=("--export", "rep"),
     outputs=["rep"])
load("missing", None, "reject", "a file that does not exist", mention=LM + ["no such", "not found", "exist"])
load("directory", {"kind": "dir"}, "reject", "a directory", mention=LM + ["director"])
load("fifo", {"kind": "fifo"}, "reject", "a FIFO nobody writes: must not block")
load("chardev-zero", {"kind": "chardev", "dev": [1, 5]}, "reject", "endless NULs: must not read forever")
load("dev-urandom", None, "reject", "the sandbox's /dev/urandom", path="/dev/urandom", mention=LM + ["urandom"])
load("dev-null", None, "reject", "the sandbox's /dev/null", path="/dev/null", mention=LM + ["null", "empty"])
load("empty", {"kind": "file", "text": ""}, "reject", "an empty file")
load("whitespace", {"kind": "file", "text": "  \n\t\n"}, "reject", "whitespace only")
load("truncated", {"kind": "snaptext", "truncate": 0.5}, "reject", "the first half of a snapshot")
load("trailing-garbage", {"kind": "snaptext", "append": "\n}}garbage"}, "reject", "a snapshot then garbage")
load("bom", {"kind": "snaptext", "bom": True}, "either", "a UTF-8 BOM before the JSON")
load("utf16", {"kind": "snaptext", "encode": "utf-16"}, "reject", "UTF-16 JSON")
load("gzip", {"kind": "snaptext", "gzip": True}, "either", "a gzipped snapshot")
load("latin1", {"kind": "snaptext", "replace": ["job.py", "j\xf6b.py"], "encode": "latin-1"}, "reject",
     "a snapshot with a latin-1 byte (invalid UTF-8)")
load("raw-surrogate-bytes", {"kind": "snaptext", "replace_bytes": ["job.py", "j\\xed\\xa0\\x80b.py"]}, "reject",
     "UTF-8-encoded surrogate bytes (ED A0 80): invalid UTF-8")
load("lone-surrogate", mut(["set", "snapshot.ranks.0.cmdline.0", "py\ud800thon"]), "either",
     "a JSON \\ud800 escape (a lone surrogate) in a command line that --print prints")
load("lone-surrogate-export", mut(["set", "snapshot.ranks.0.cmdline.0", "py\udfffthon"]), "either",
     "a lone surrogate in what --export writes", extra=("--export", "rep"), outputs=["rep"])
load("lone-surrogate-key", mut(["setkey", "snapshot.options", "na\ud800tive", True]), "either",
     "a lone surrogate in a key")
load("deep-array", {"kind": "file", "gen": {"gen": "nest", "open": "[", "close": "]", "n": 200000}}, "reject",
     "100,000 nested arrays (the JSON decoder's recursion)")
load("deep-object", {"kind": "file", "gen": {"gen": "nest", "open": '{"a":', "close": "}", "n": 500000, "inner": "1"}},
     "reject", "~80,000 nested objects")
load("deep-inside", mut(["deep", "snapshot.options.extra", 50000]), "reject", "a valid snapshot with 50,000 nested lists inside")
load("bigint-pid", mut(["rawnum", "snapshot.ranks.0.pid", "9" * 5000]), "reject",
     "a 5000-digit pid (Python's int-from-string limit is 4300)")
load("bigint-30", mut(["rawnum", "snapshot.ranks.0.pid", "9" * 30]), "reject", "a 30-digit pid")
load("float-1e999", mut(["rawnum", "snapshot.taken_at", "1e999"]), "reject", "taken_at 1e999 (infinity)")
load("taken-at-nan", mut(["rawnum", "snapshot.taken_at", "NaN"]), "reject", "taken_at NaN (a token JSON does not have)")
load("taken-at-1e300", mut(["set", "snapshot.taken_at", 1e300]), "reject", "taken_at 1e300: no date")
load("taken-at-neg", mut(["set", "snapshot.taken_at", -1e18]), "reject", "taken_at -1e18")
load("taken-at-string", mut(["set", "snapshot.taken_at", "yesterday"]), "reject", "taken_at a string")
load("duration-neg", mut(["set", "snapshot.duration", -1e9]), "either", "a negative duration")
load("top-array", {"kind": "file", "text": "[]"}, "reject", "a JSON array")
load("top-string", {"kind": "file", "text": '"snapshot"'}, "reject", "a JSON string")
load("top-number", {"kind": "file", "text": "42"}, "reject", "a JSON number")
load("top-null", {"kind": "file", "text": "null"}, "reject", "JSON null")
load("empty-object", {"kind": "file", "text": "{}"}, "reject", "{}")
load("no-snapshot-key", mut(["del", "snapshot"]), "reject", "no 'snapshot' member")
load("schema-other", mut(["set", "schema", "something.else"]), "reject", "another schema name")
load("schema-version-999", mut(["set", "schema_version", 999]), "reject", "a future schema version")
load("schema-version-string", mut(["set", "schema_version", "1"]), "reject", "schema_version as a string")
load("snapshot-array", mut(["set", "snapshot", []]), "reject", "snapshot: []")
load("ranks-string", mut(["set", "snapshot.ranks", "x"]), "reject", "ranks: a string")
load("ranks-ints", mut(["set", "snapshot.ranks", [1, 2]]), "reject", "ranks: numbers")
load("nodes-null", mut(["set", "snapshot.nodes", None]), "reject", "nodes: null")
load("pid-string", mut(["set", "snapshot.ranks.0.pid", "abc"]), "reject", "a pid that is a string")
load("threads-object", mut(["set", "snapshot.ranks.0.threads", {}]), "reject", "threads: an object")
load("frames-null", mut(["set", "snapshot.ranks.0.threads.0.frames", None]), "reject", "frames: null")
load("line-string", mut(["set", "snapshot.ranks.0.threads.0.frames.0.line", "ten"]), "reject", "a frame line that is text")
load("bool-as-int", mut(["set", "snapshot.ranks.0.rank", True]), "either", "rank: true")
load("dup-keys", {"kind": "snaptext", "replace": ['"schema_version": 1', '"schema_version": 1, "schema_version": 1']},
     "either", "a duplicated key")
load("world-1e12", mut(["set", "snapshot.ranks.*.world_size", 10**12]), "either",
     "world_size 10^12: ranks 'missing from WORLD_SIZE' must not be listed one by one", bound=10.0)
load("world-neg", mut(["set", "snapshot.ranks.*.world_size", -5]), "either", "world_size -5")
load("rank-1e18", mut(["set", "snapshot.ranks.0.rank", 10**18]), "either", "rank 10^18", bound=10.0)
load("rank-neg", mut(["set", "snapshot.ranks.0.rank", -3]), "either", "rank -3")
load("threads-1e15", mut(["set", "snapshot.ranks.*.num_threads", 10**15]), "either", "num_threads 10^15")
load("rss-neg", mut(["set", "snapshot.ranks.*.rss", -1]), "either", "rss -1")
load("line-1e18", mut(["set", "snapshot.ranks.*.threads.*.frames.*.line", 10**18]), "either", "frame lines 10^18")
load("slots-1e12", mut(["set", "snapshot.nodes.*.slots", 10**12]), "either", "node slots 10^12", bound=10.0)
load("port-huge", mut(["set", "snapshot.ranks.*.master_port", 99999999]), "either", "master_port 99999999")
load("local-rank-1e9", mut(["set", "snapshot.ranks.*.local_rank", 10**9]), "either",
     "local_rank 10^9 (the grid's columns are local ranks)", bound=10.0)
load("ranks-x300", mut(["dup", "snapshot.ranks", 300]), "either", "the ranks repeated 300 times (1200 ranks)",
     bound=30.0, sigint_at=30, timeout=40)
load("cmdline-30mb", mut(["set", "snapshot.ranks.0.cmdline.0", {"$repeat": "A", "n": 30_000_000}]), "either",
     "a 30 MB command line", bound=20.0, sigint_at=25, timeout=35)
load("source-1e6", mut(["set", "snapshot.ranks.0.threads.0.frames.0.source.0.1", {"$repeat": "x", "n": 1_000_000}]),
     "either", "a 1 MB source line")
load("nodes-1e5", mut(["dupnode", 100000]), "either", "100,000 empty nodes", bound=20.0, sigint_at=25, timeout=35)
load("ansi-in-cmdline", mut(["set", "snapshot.ranks.*.cmdline.0", "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2Jtrain.py"]),
     "work", "terminal escapes (OSC 52 clipboard, clear screen) in a command line: never printed raw",
     forbid_stdout=r"\x1b")
load("ansi-in-frame", mut(["set", "snapshot.ranks.*.threads.*.frames.*.function", "\x1b[31mred\x1b[0m\r\x08"]),
     "work", "escapes and \\r in function names: never printed raw", forbid_stdout=r"\x1b|\r|\x08")
load("html-in-cmdline", mut(["set", "snapshot.ranks.*.cmdline.0", "<script>alert(1)</script><img src=x onerror=alert(2)>"]),
     "work", "HTML in a command line: escaped in report.html", extra=("--export", "rep"), outputs=["rep"],
     forbid_in=[["rep/report.html", r"<script>alert\(1\)|<img src=x"]])
load("hosts-file", {"kind": "file", "text": "nodeA\nnodeB\n"}, "reject", "a hosts file given to --load", path="hosts.txt",
     mention=LM + ["hosts.txt"])
load("export-dir", {"kind": "dir"}, "reject", "a directory (an export bundle)", path="rep",
     more=[{"path": "rep/summary.md", "kind": "file", "text": "# x\n"}], mention=LM + ["rep", "director"])
load("symlink-loop", {"kind": "symlink", "to": "snap.json"}, "reject", "a symlink loop")
load("proc-environ", None, "reject", "/proc/self/environ", path="/proc/self/environ", mention=LM + ["environ"])
load("stdin-dash", None, "either", "--load - with a snapshot on stdin", path="-", stdin={"kind": "snapshot"},
     mention=LM + ["stdin", "-"])
load("stdin-garbage", None, "reject", "--load /dev/stdin with garbage", path="/dev/stdin",
     stdin={"kind": "bytes", "text": "not json"}, mention=LM + ["stdin"])
load("path-empty", None, "reject", "--load ''", path="", mention=LM + ["empty", "''"])
load("valid-earlier", {"kind": "snapshot", "source": "deadlock.earlier.json"}, "work",
     "the earlier recording of a scenario: a second control case")

# ---------------------------------------------------------------------------------------------
# G. flag combinations that do nothing in a mode
# ---------------------------------------------------------------------------------------------


def combo(id, args, why, flag, expect="reject", fixtures=None, **kw):
    case("combo-" + id, "combination", args, expect, why + ": does nothing in this mode, said so",
         fixtures=fixtures if fixtures is not None else [SNAP], mention=[esc(flag), esc(flag.lstrip("-"))], **kw)


for flag, extra in [("--pid", ["--pid", "5"]), ("--strace", ["--strace", "5"]), ("--strace-data", ["--strace-data"]),
                    ("--match", ["--match", "train"]), ("--native", ["--native"]), ("--gdb", ["--gdb"]),
                    ("--sudo", ["--sudo"]), ("--nonblocking", ["--nonblocking"]), ("--no-locals", ["--no-locals"]),
                    ("--samples", ["--samples", "3"]), ("--interval", ["--interval", "2"]),
                    ("--timeout", ["--timeout", "5"]), ("--connect-timeout", ["--connect-timeout", "3"]),
                    ("--fanout", ["--fanout", "2"]), ("-w", ["-w", "nodeA"]), ("--slurm", ["--slurm", "123"]),
                    ("-i", ["-i", "key"]), ("--python", ["--python", "python3.11"]),
                    ("--accept-new-host-keys", ["--accept-new-host-keys"]), ("--no-store", ["--no-store"])]:
    combo("load" + flag, LOAD + ["--print"] + extra, f"--load with {flag}", flag)
combo("load-hosts", LOAD + ["--print", "hosts.txt"], "--load with a HOSTS file", "hosts.txt",
      fixtures=[SNAP, {"path": "hosts.txt", "kind": "file", "text": "nodeA\n"}])
combo("tar-no-export", NODE + ["--tar"], "--tar without --export", "--tar", fixtures=[])
combo("force-no-output", NODE + ["--force"], "--force without --snapshot or --export", "--force", fixtures=[])
combo("strace-data-no-strace", NODE + ["--strace-data"], "--strace-data without --strace", "--strace-data", fixtures=[])
combo("native-nonblocking", NODE + ["--native", "--nonblocking"], "--native with --nonblocking (help: not with --native)",
      "--nonblocking", fixtures=[])
combo("refresh-print", NODE + ["--refresh", "5"], "--refresh with --print (a TUI option)", "--refresh", fixtures=[])
combo("fps-print", NODE + ["--fps", "10"], "--fps with --print", "--fps", fixtures=[])
for flag, extra in [("--test-timeout", ["--test-timeout", "5"]), ("--json", ["--json", "r.json"]),
                    ("--sizes", ["--sizes", "1K"]), ("--nccl-env", ["--nccl-env", "NCCL_DEBUG=INFO"]),
                    ("--target", ["--target", "h:80"]), ("--all-pairs", ["--all-pairs"]),
                    ("--backend", ["--backend", "gloo"]), ("--allow-busy-gpus", ["--allow-busy-gpus"])]:
    combo("no-test" + flag, NODE + extra, f"{flag} without --test", flag, fixtures=[])
combo("target-sanity", GT + ["sanity", "--target", "h:80"], "--target with --test sanity (net only)", "--target", fixtures=[])
combo("sizes-net", GT + ["net", "--sizes", "1K"], "--sizes with --test net", "--sizes", fixtures=[])
combo("transport-no-slurm", NODE + ["--transport", "srun"], "--transport srun without --slurm", "--transport", fixtures=[])
combo("slurm-and-w", ["--slurm", "123", "-w", "nodeA", "--print"], "--slurm with -w", "-w", fixtures=[])
combo("slurm-and-hosts", ["hosts.txt", "--slurm", "123", "--print"], "--slurm with a hosts file", "hosts.txt",
      fixtures=[{"path": "hosts.txt", "kind": "file", "text": "nodeA\n"}])
combo("load-and-snapshot-same", LOAD + ["--snapshot", "snap.json", "--force"], "--load and --snapshot of the same file",
      "--snapshot")
combo("test-and-load", LOAD + ["--test", "sanity"], "--test with --load", "--test")
combo("two-hosts", ["hosts.txt", "hosts2.txt", "--print"], "two HOSTS files", "hosts2.txt", fixtures=[
    {"path": "hosts.txt", "kind": "file", "text": "nodeA\n"}, {"path": "hosts2.txt", "kind": "file", "text": "nodeB\n"}])

# ---------------------------------------------------------------------------------------------
# H. --match patterns
# ---------------------------------------------------------------------------------------------
MM = ["match", "regex", "regular expression", "pattern"]
for id, pat, exp in [("open-paren", "(", "reject"), ("open-class", "[a-", "reject"), ("star", "*", "reject"),
                     ("bad-group", "(?P<", "reject"), ("huge-repeat", "a{99999999999}", "reject"),
                     ("backslash", "\\", "reject"), ("lookbehind", "(?<=a+)b", "reject"), ("bad-escape", "\\p{L}", "reject"),
                     ("bad-backref", "(a)\\2", "reject"), ("empty", "", "either"),
                     ("catastrophic", "(a+)+$", "either"), ("catastrophic-2", "(a|aa)*c", "either"),
                     ("huge", {"gen": "repeat", "s": "a|", "n": 120000, "suffix": "b"}, "either"),
                     ("huge-class", {"gen": "repeat", "s": "[ab]", "n": 120000}, "either"),
                     ("nested-groups", {"gen": "nest", "open": "(", "close": ")", "n": 20000, "inner": "a"}, "either"),
                     ("newline", "train\n.py", "either"), ("nul-escape", "\\x00", "either"),
                     ("possessive", "a++", "either")]:
    case("match-" + id, "match", NODE + ["--match", pat], exp, f"--match {str(pat)[:40]!r} (no node reachable)",
         mention=MM)
# live: this machine, one planted python process whose command line is 'a'*n + '!'; (a+)+$ backtracks 2^n
LIVE = ["--print", "--samples", "1", "--no-store", "--nonblocking", "--no-locals", "--gpu-evidence", "off",
        "--connect-timeout", "2"]
for n in (14, 18, 22, 26):
    case(f"match-live-{n}", "match-live", ["--match", "(a+)+$"] + LIVE, "work",
         f"--match '(a+)+$' against a live command line of {n} 'a's and '!': bounded (discovery <= 30 s)",
         fixtures=[{"kind": "proc", "argv": ["python3", "-c", "import time; time.sleep(300)", "a" * n + "!"]}],
         series={"name": "--match (a+)+$ live", "n": n}, bound=35.0, sigint_at=40, timeout=50)
case("match-live-sigint", "match-live", ["--match", "(a+)+$"] + LIVE, "work",
     "--match '(a+)+$' against 40 'a's: runs long; Ctrl+C must end it within 2 s",
     fixtures=[{"kind": "proc", "argv": ["python3", "-c", "import time; time.sleep(300)", "a" * 40 + "!"]}],
     bound=35.0, timeout=40)

# ---------------------------------------------------------------------------------------------
# I. --pid
# ---------------------------------------------------------------------------------------------
for id, v, exp in [("zero", "0", "reject"), ("neg", "-1", "reject"), ("frac", "1.5", "reject"), ("word", "abc", "reject"),
                   ("empty", "", "reject"), ("30digits", "9" * 30, "reject"), ("over-limit", "4194305", "reject"),
                   ("hex", "0x10", "either"), ("arabic", "\u0663", "either"), ("padded", " 12 ", "either"),
                   ("ok", "12", "work"), ("nan", "nan", "reject"), ("list", "1,2", "either")]:
    case("pid-" + id, "pid", NODE + [f"--pid={v}"], exp, f"--pid={v!r}", mention=["pid"])
case("pid-5000-times", "pid", NODE + sum([["--pid", str(100 + i)] for i in range(5000)], []), "work",
     "--pid given 5000 times")

# ---------------------------------------------------------------------------------------------
# J. --slurm
# ---------------------------------------------------------------------------------------------
SM = ["slurm", "job"]
for id, v, exp in [("word", "abc", "reject"), ("neg", "-1", "reject"), ("zero", "0", "reject"), ("float", "1e5", "reject"),
                   ("semicolon", "12345;touch {S}/pwned", "reject"), ("subst", "$(touch {S}/pwned)", "reject"),
                   ("empty", "", "reject"), ("blank", " ", "reject"), ("30digits", "9" * 30, "reject"),
                   ("array", "123_4", "either"), ("het", "123+1", "either"), ("plain", "12345", "either"),
                   ("option-like", "-oProxyCommand=x", "reject"), ("arabic", "\u0663", "reject"),
                   ("newline", "12345\n", "reject"), ("step", "12345.0", "either")]:
    case("slurm-" + id, "slurm", [f"--slurm={v}", "--print"], exp, f"--slurm={v!r} (no SLURM controller here)",
         mention=SM, checks={"pwned": PWNED})
for id, v, exp in [("unset", None, "reject"), ("empty", "", "reject"), ("word", "abc", "reject"),
                   ("semicolon", "1;touch {S}/pwned", "reject"), ("30digits", "9" * 30, "reject"), ("plain", "12345", "either")]:
    env = {} if v is None else {"SLURM_JOB_ID": v}
    case("slurm-env-" + id, "environment", ["--slurm", "--print"], exp, f"--slurm with SLURM_JOB_ID={v!r}",
         env=env, unset=["SLURM_JOB_ID"] if v is None else [], mention=["SLURM_JOB_ID", "slurm", "job"],
         checks={"pwned": PWNED})

# ---------------------------------------------------------------------------------------------
# K. stdin '-'
# ---------------------------------------------------------------------------------------------
IM = ["stdin", "hosts", "line", "'-'"]
for id, stdin, exp, why in [
    ("empty", {"kind": "bytes", "text": ""}, "reject", "nothing on stdin"),
    ("binary", {"kind": "random", "n": 4096}, "reject", "random bytes"),
    ("ok", {"kind": "bytes", "text": "nodeA\n"}, "work", "one node"),
    ("lines-1e6", {"kind": "lines", "fmt": "node{i}", "n": 1_000_000}, "reject", "10^6 hosts (over --max-hosts)"),
    ("closed", {"kind": "closed"}, "reject", "fd 0 closed"),
    ("directory", {"kind": "dir"}, "reject", "fd 0 is a directory"),
    ("nul", {"kind": "bytes", "text": "node\x00A\n"}, "reject", "a NUL byte"),
    ("invalid-utf8", {"kind": "bytes", "b64": "bvZkZQo="}, "reject", "invalid UTF-8"),
    ("zero-device", {"kind": "dev", "path": "/dev/zero"}, "reject", "endless NULs on stdin: bounded"),
    ("urandom-device", {"kind": "dev", "path": "/dev/urandom"}, "reject", "endless random bytes on stdin: bounded"),
    ("shell", {"kind": "bytes", "text": "nodeA;touch {S}/pwned\n"}, "reject", "shell characters"),
]:
    case("stdin-" + id, "stdin", ["-"] + H, exp, "hosts from stdin: " + why, stdin=stdin, mention=IM,
         checks={"pwned": PWNED}, bound=15.0 if "1e6" in id else (5.0 if exp == "reject" else 10.0),
         sigint_at=20 if "1e6" in id else 5)
case("stdin-with-w", "stdin", ["-", "-w", "nodeB"] + H, "work", "stdin and -w together", stdin={"kind": "bytes", "text": "nodeA\n"})
case("stdin-twice", "stdin", ["-", "--load", "-"], "reject", "stdin as both HOSTS and --load", stdin={"kind": "bytes", "text": "nodeA\n"},
     mention=["stdin", "-", "load"])

# ---------------------------------------------------------------------------------------------
# L. ssh files and --python
# ---------------------------------------------------------------------------------------------
for flag in ("-F", "-i"):
    fm = [esc(flag), "config" if flag == "-F" else "key", "identity", "f.txt"]
    for id, fx, exp in [("missing", None, "reject"), ("directory", {"kind": "dir"}, "reject"),
                        ("fifo", {"kind": "fifo"}, "reject"), ("chardev-zero", {"kind": "chardev", "dev": [1, 5]}, "reject"),
                        ("binary", {"kind": "file", "gen": {"gen": "random", "n": 4096, "seed": 2}}, "either"),
                        ("empty-path", "EMPTY", "reject")]:
        path = "" if fx == "EMPTY" else "f.txt"
        case(f"ssh{flag}-{id}", "ssh-files", NODE + [flag, path], exp, f"{flag} naming a {id.replace('-', ' ')}",
             fixtures=[dict(fx, path="f.txt")] if isinstance(fx, dict) else [], mention=fm)
case("ssh-F-include-loop", "ssh-files", NODE + ["-F", "cfg"], "either", "-F config that includes itself: bounded",
     fixtures=[{"path": "cfg", "kind": "file", "text": "Include {S}/cwd/cfg\nHost nodeA\n  Port 22\n"}],
     mention=["-F", "config", "include", "cfg"])
case("ssh-F-huge", "ssh-files", NODE + ["-F", "cfg"], "either", "-F config of 10^6 lines: bounded",
     fixtures=[{"path": "cfg", "kind": "file", "gen": {"gen": "lines", "fmt": "Host h{i}\n  Port 22", "n": 1_000_000}}],
     mention=["-F", "config", "cfg"], bound=15.0, sigint_at=20)
case("ssh-i-text", "ssh-files", NODE + ["-i", "key"], "either", "-i naming a text file that is no key",
     fixtures=[{"path": "key", "kind": "file", "text": "not a key\n"}], mention=["-i", "key", "identity"])
for id, fx, exp in [("fifo", {"kind": "fifo"}, "either"), ("directory", {"kind": "dir"}, "either"),
                    ("zero", {"kind": "chardev", "dev": [1, 5]}, "either"),
                    ("binary", {"kind": "file", "gen": {"gen": "random", "n": 4096, "seed": 3}}, "either"),
                    ("include-loop", {"kind": "file", "text": "Include ~/.ssh/config\n"}, "either")]:
    case("env-home-sshconfig-" + id, "environment", NODE, exp,
         f"~/.ssh/config is a {id}: bounded, and a clear message if refused",
         fixtures=[dict(fx, path="{S}/home/.ssh/config")], mention=["ssh", "config"])
case("env-home-known-hosts-fifo", "environment", NODE, "either", "~/.ssh/known_hosts is a FIFO: bounded",
     fixtures=[{"path": "{S}/home/.ssh/known_hosts", "kind": "fifo"}], mention=["known_hosts", "ssh"])
case("env-home-unset", "environment", NODE, "work", "HOME unset", unset=["HOME"])
case("env-home-missing", "environment", NODE, "work", "HOME a directory that does not exist", env={"HOME": "/nonexistent"})
case("env-home-file", "environment", NODE, "work", "HOME is a regular file", env={"HOME": "{S}/cwd/homefile"},
     fixtures=[{"path": "homefile", "kind": "file", "text": "x"}])
for id, v, exp in [("empty", "", "reject"), ("blank", "   ", "reject"), ("newline", "python3\n-S", "reject"),
                   ("option-like", "-oProxyCommand=x", "reject"), ("huge", "x" * 100000, "either")]:
    case("python-" + id, "ssh-files", NODE + [f"--python={v}"], exp, f"--python={v[:30]!r}", mention=["python"])
for id, v in [("semicolon", "python3 -S; touch {S}/pwned"), ("subst", "$(touch {S}/pwned)"),
              ("backtick", "`touch {S}/pwned` -S")]:
    case("python-local-" + id, "ssh-files", ["--python", v, "--match", "ZZZ_NO_SUCH_PROCESS"] + LIVE, "either",
         f"--python {v!r} on this machine: never run by a shell", mention=["python"], checks={"pwned": PWNED},
         bound=20.0, sigint_at=25, timeout=35)

# ---------------------------------------------------------------------------------------------
# M. the command line itself
# ---------------------------------------------------------------------------------------------
for id, args, exp, why, mention in [
    ("unknown-option", ["--bogus"], "reject", "an unknown option", ["bogus", "unrecognized"]),
    ("abbrev", ["-w", "nodeA", "--connect-timeout", "2", "--snap", "out.json"], "either", "an abbreviated --snapshot", ["snap"]),
    ("store-true-value", ["-w", "nodeA", "--print=yes"], "reject", "--print=yes", ["print"]),
    ("load-no-value", ["--load"], "reject", "--load with no value", ["load", "expected"]),
    ("demo-extra", ["demo", "extra"], "reject", "hangscope demo with a stray argument", ["extra", "unrecognized"]),
    ("version-extra", ["--version", "--bogus"], "reject", "--version with an unknown option", ["bogus", "unrecognized"]),
    ("long-arg", ["--" + "x" * 100000], "reject", "a 100,000-character option", ["unrecognized", "xxxx"]),
]:
    case("cli-" + id, "cli", args, exp, why, mention=mention, outputs=["out.json"])


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(CASES, f, ensure_ascii=True, indent=1)
        f.write("\n")
    cats: dict[str, int] = {}
    for c in CASES:
        cats[c["cat"]] = cats.get(c["cat"], 0) + 1
    print(len(CASES), "cases", cats)


if __name__ == "__main__":
    main()
