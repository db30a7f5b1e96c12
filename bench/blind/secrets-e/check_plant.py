#!/usr/bin/env python3
"""Planting check (no hangscope): plants corpus.json with run.py's own code, then reads the targets only with
py-spy, ps, /proc and gdb, and says for every entry whether its value shows up in that raw material.

    python3 bench/blind/secrets-e/check_plant.py OUTDIR
"""
import json, os, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402

OUT = os.path.abspath(sys.argv[1])
os.makedirs(OUT, exist_ok=True)


def sh(cmd, timeout=60):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout, errors="replace")
    return "$ %s\n%s%s" % (cmd, r.stdout, r.stderr)


def raw(out, pids, od, runs):
    pid_of = dict(zip(run.TARGETS, pids))
    texts = {}
    for t, p in pid_of.items():
        parts = [sh("py-spy dump --locals --pid %d" % p),
                 sh("ps -o pid,ppid,comm,args -p %d --ppid %d -ww" % (p, p)),
                 sh("tr '\\0' ' ' < /proc/%d/cmdline; echo" % p),
                 sh("tr '\\0' '\\n' < /proc/%d/environ" % p),
                 sh("for t in /proc/%d/task/*; do echo $t $(cat $t/comm); done" % p),
                 sh("readlink /proc/%d/cwd; ls -l /proc/%d/fd" % (p, p)),
                 sh("for c in $(cat /proc/%d/task/*/children); do tr '\\0' ' ' < /proc/$c/cmdline; echo; done" % p),
                 sh("cat /proc/locks | head -50")]
        if t == "T2":
            parts.append(sh("gdb -p %d -batch -ex 'info threads' -ex 'thread 1' -ex 'bt full 8' 2>&1 | grep -v '^\\[' | head -120" % p, 90))
        if t == "T3":
            parts.append(sh("timeout 2 strace -f -s 300 -e trace=sendto,recvfrom,write,read -p %d 2>&1 | head -60" % p))
        texts[t] = "\n".join(parts)
        with open(os.path.join(OUT, "%s.txt" % t), "w") as f:
            f.write(texts[t])
    # the peers: processes whose cwd is / and whose parent is the runner; found by their socket files
    peers = sh("ps -eo pid,args -ww | grep -E 'cloud-sql-proxy|redis-server|mlflow server|litellm|fluent-bit' "
               "| grep -v grep")
    peers += "\n" + sh("cat /proc/net/unix | grep -c blindsec-work")
    with open(os.path.join(OUT, "peers.txt"), "w") as f:
        f.write(peers)
    stderr_files = ""
    for d, _, fs in os.walk(os.path.dirname(os.path.dirname(run_work[0]))):
        pass
    corpus = json.load(open(run.CORPUS))
    allraw = "\n".join(texts.values()) + peers
    errs = ""
    for b in built_ref[0].values():
        errs += open(b.stderr_path, errors="replace").read() + "\n" + b.stderr_path + "\n" + b.script + "\n" + b.cwd
    el = [os.path.join(run_work[0], "logs", "elastic_error.json")]
    for e in el:
        if os.path.exists(e):
            errs += open(e).read()
    srcs = "".join(open(b.script).read() for b in built_ref[0].values())
    import re as _re
    win = []
    for t, b in built_ref[0].items():
        src = open(b.script).read().split("\n")
        seen = set()
        for m in _re.finditer(r"\n    (\w+) \(train_blind\.py:(\d+)\)", texts[t]):
            fn, n = m.group(1), int(m.group(2))
            if fn in ("_bg", "_bg_wait", "main", "_peer_wait", "_child_wait", "_fifo_wait", "_flock_wait") or (fn, n) in seen:
                continue
            seen.add((fn, n))
            win.append("== %s %s line %d (py-spy), lines %d-%d of %s:" % (t, fn, n, n - 3, n + 3, b.script))
            win += ["  %4d%s %s" % (i + 1, ">" if i + 1 == n else " ", src[i]) for i in range(max(0, n - 4), min(len(src), n + 3))]
    with open(os.path.join(OUT, "source-windows.txt"), "w") as f:
        f.write("\n".join(win) + "\n")
    lines = []
    ok = 0
    for e in corpus["secrets"]:
        needles = e["fragments"]
        where = [n for n, txt in (("pyspy/proc/gdb/strace", allraw), ("stderr/paths", errs), ("script", srcs))
                 if any(f in txt or json.dumps(f)[1:-1] in txt for f in needles)]
        ok += bool(where)
        lines.append("%s [%s/%s] %s: %s" % (e["id"], e["channel"], e["target"], e["shape"][:60],
                                             ", ".join(where) or "NOT FOUND"))
    for o in corpus["ordinary"]:
        where = [n for n, txt in (("pyspy/proc/gdb/strace", allraw), ("stderr/paths", errs), ("script", srcs))
                 if o["value"] in txt]
        lines.append("%s [%s/%s] %s: %s" % (o["id"], o["channel"], o["target"], o["what"][:60],
                                             ", ".join(where) or "NOT FOUND"))
    lines.insert(0, "secrets with a fragment found in raw material: %d of %d" % (ok, len(corpus["secrets"])))
    with open(os.path.join(OUT, "SUMMARY.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


run_work, built_ref = [None], [None]
_orig_build = run.build_targets


def build(corpus, work, lib):
    run_work[0] = work
    built_ref[0] = _orig_build(corpus, work, lib)
    return built_ref[0]


run.build_targets = build
run.run_headless = raw
run.report = lambda *a, **k: "plant check done"
sys.argv = [sys.argv[0], "--out", os.path.join(OUT, "runner-out"), "--skip-tui"]
sys.exit(run.main())
