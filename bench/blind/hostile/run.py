"""Runs the hostile-text set: plants every case of cases.json into real processes on a test cluster, runs
hangscope's outputs against them and checks each case.

    /work/venv/bin/python bench/blind/hostile/run.py --out DIR [--wave 1|2] [--hangscope PATH]

As root (the cluster is network namespaces). One cluster at a time (3 nodes), closed after each wave. Writes into
DIR: wave<W>/ (every output of every run, kept as produced), results.json and results.md (the table); prints the table.
"""
from __future__ import annotations

import argparse
import datetime as dt
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path[:0] = [str(REPO / "tests" / "support"), str(REPO)]

PY = "/usr/bin/python3"  # the nodes' interpreter
RUN_TIMEOUT = 240  # a hangscope run past this is a hang
CMDS = {"kill", "py-spy", "gdb", "strace", "ls", "lsof", "fuser", "cat", "tail", "less", "ss", "ssh", "sudo",
        "nvidia-smi", "echo", "cgexec", "systemctl", "hangscope", "journalctl", "scontrol", "scancel", "ps",
        "pstack", "top", "rm", "mv", "chmod", "touch", "umount", "mount", "findmnt", "flock", "stat", "nsenter",
        "docker", "kubectl", "python", "python3", "pkill", "grep", "readlink", "head", "cd", "mkfifo", "dmesg",
        "ip", "iptables", "ping", "nc", "curl", "env", "sh", "bash", "tmux", "timeout", "fusermount", "pgrep"}
BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


# ------------------------------------------------------------------ values
def dec(v):
    if isinstance(v, dict):
        if "hex" in v:
            return bytes.fromhex(v["hex"])
        if "rep" in v:
            s, n = v["rep"]
            return dec(s) * n
        if "cat" in v:
            parts = [dec(p) for p in v["cat"]]
            if any(isinstance(p, bytes) for p in parts):
                return b"".join(p if isinstance(p, bytes) else p.encode("utf-8", "surrogatepass") for p in parts)
            return "".join(parts)
    return v


def as_bytes(v):
    return v if isinstance(v, bytes) else v.encode("utf-8", "surrogatepass")


def as_text(v):
    return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v


def cat(values, sep=" "):
    out = []
    for i, v in enumerate(values):
        if i:
            out.append(sep)
        out.append(v)
    return {"cat": out}


# ------------------------------------------------------------------ plans
def layout(wave):
    if wave == 1:
        return {f"r{i}": ("node01" if i < 6 else "node02") for i in range(12)}, ["node01", "node02"]
    ranks = {f"r{i}": ("node01" if i < 5 else "node02" if i < 11 else "node03") for i in range(13)}
    return ranks, ["node01", "node02", "node03"]


def build_plans(cases, wave, work: Path):
    """Per rank: the rank.py spec, its argv values, env, cwd, script dir; per node: fake tools and hostname."""
    ranks, nodes = layout(wave)
    world = len(ranks)
    plans = {}
    for i, (r, node) in enumerate(ranks.items()):
        local = sum(1 for rr, nn in list(ranks.items())[:i] if nn == node)
        d = work / r
        d.mkdir(parents=True)
        plans[r] = {"node": node, "argv": [], "env": {"RANK": str(i), "LOCAL_RANK": str(local),
                                                       "WORLD_SIZE": str(world), "MASTER_ADDR": "node01",
                                                       "MASTER_PORT": str(29500 + 100 * wave),
                                                       "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root"},
                    "cwd": None, "script_dir": None, "spec": {"dir": str(d), "threads": [], "main": {}},
                    "stderr_msgs": [], "errfile_msgs": [], "child": [], "tcp": [], "unix_path": [], "unix_peer": [],
                    "fifo": [], "flock": [], "holder": [], "launcher": None, "cases": [], "sparse_mb": 0,
                    "dir": d}
    node_plants = {n: {"tools": {}, "hostname": None} for n in nodes}

    def thread_slot(plan, field):
        for t in plan["spec"]["threads"]:
            if field not in t:
                return t
        t = {}
        plan["spec"]["threads"].append(t)
        return t

    for c in cases:
        if c["wave"] != wave or c["plant"]["at"] == "wave":
            continue
        p, v, n = c["plant"], c["value"], c["id"]
        at = p["at"]
        if c["rank"].startswith("node"):
            np_ = node_plants[c["rank"]]
            if at == "hostname":
                np_["hostname"] = v
            else:
                np_["tools"].setdefault(p["tool"].split("-size")[0], []).append((p["tool"], v))
            continue
        plan = plans[c["rank"]]
        plan["cases"].append(n)
        spec = plan["spec"]
        if at == "argv":
            plan["argv"].append(v)
        elif at == "argv_big":
            plan["argv"] += [v] * p["args"]
        elif at == "env":
            plan["env"][f"HZ_NOTE_{n}"] = v
        elif at == "env_big":
            for k in range(p["vars"]):
                plan["env"][f"HZ_BIG_{n}_{k}"] = v
        elif at == "rankvar":
            plan["env"][p["var"]] = v
            plan["env"].update(p.get("extra", {}))
        elif at == "rankvar_set":
            plan["env"].update(p["vars"])
        elif at == "comm":
            spec["comm"] = v
        elif at == "cwd":
            plan["cwd"] = v
        elif at == "script_dir":
            plan["script_dir"] = v
        elif at == "deep_dir":
            plan["script_dir"] = {"deep": [v] * p["depth"]}
            plan["cwd"] = plan["script_dir"]
        elif at == "module_name":
            spec["module_name"] = {"cat": [v, ".py"]}
        elif at == "module_loop":
            spec["module_loop"] = v
        elif at == "thread":
            f = p["field"]
            if f == "local_value":
                t = thread_slot(plan, "locals")
                t["locals"] = [[None, v]]
            elif f == "local_name":
                t = thread_slot(plan, "locals")
                t["locals"] = [[v, "plain"]]
            elif f == "qual":
                t = thread_slot(plan, "func")
                t["func"], t["qual"] = "save_checkpoint", v
            elif f == "many_locals":
                t = thread_slot(plan, "many_locals")
                t["many_locals"] = p["count"]
            else:
                t = thread_slot(plan, f)
                t[f] = v
        elif at == "main":
            f = p["field"]
            if f == "comment_bytes":
                spec["main"]["comment_bytes"] = v
                spec["latin1_source"] = True
            elif f == "recurse":
                spec["main"]["recurse"] = p["count"]
            else:
                spec["main"][f] = v
        elif at == "stderr":
            plan["stderr_msgs"].append(v)
        elif at == "stderr_big":
            plan["stderr_msgs"].append(v)
            plan["sparse_mb"] = p["sparse_mb"]
        elif at == "errfile":
            plan["errfile_msgs"].append(v)
        elif at == "child_argv":
            plan["child"].append(v)
        elif at == "tcp_peer_argv":
            plan["tcp"].append(v)
        elif at == "unix_path":
            plan["unix_path"].append(v)
        elif at == "unix_peer_argv":
            plan["unix_peer"].append(v)
        elif at == "fifo_path":
            plan["fifo"].append(v)
        elif at == "flock_path":
            plan["flock"].append(v)
        elif at == "flock_holder_argv":
            plan["holder"].append(v)
        elif at == "launcher_argv":
            plan["launcher"] = (plan["launcher"] or []) + [v]
        elif at == "extra_threads":
            spec["extra_threads"] = p["count"]
        elif at == "sleep_children":
            spec["sleep_children"] = p["count"]
            spec["block"] = "wait_any"
        elif at == "fds":
            spec["fds"] = p["count"]
        elif at == "select":
            spec["block"] = "select"
            spec["select_fds"] = p["count"]
        else:
            raise ValueError(f"case {n}: unknown plant {at}")
    return plans, node_plants, nodes


def path_join(base: Path, comp) -> bytes:
    return os.path.join(bytes(base), as_bytes(dec(comp)))


def start_wave(cluster, plans, node_plants, work: Path, log):
    """Start helpers, then ranks; return the spawned Popens and how many ranks became ready."""
    import subprocess as sp
    procs = []
    shutil.copy(HERE / "rank.py", work / "rank.py")
    shutil.copy(HERE / "peer.py", work / "peer.py")
    (work / "bin").mkdir()
    os.symlink(work / "peer.py", work / "bin" / "torchrun")
    # the compromised node: hostname and fake tools
    for name, np_ in node_plants.items():
        node = cluster[name]
        if np_["hostname"] is not None:
            hx = as_bytes(dec(np_["hostname"])).hex()
            r = node.run([PY, "-c", "import socket,sys; socket.sethostname(bytes.fromhex(sys.argv[1]))", hx],
                         check=False)
            log(f"{name}: sethostname -> {getattr(r, 'returncode', '?')}")
        for tool, items in np_["tools"].items():
            payload = work / f"{name}-{tool}.payload"
            with open(payload, "wb") as fh:
                for _which, v in items:
                    fh.write(as_bytes(dec(v)) + b"\n")
            target = node.dir / "bin" / tool
            if target.is_symlink() or target.exists():
                target.unlink()
            body = {"nvidia-smi": "sys.stdout.buffer.write(data); sys.stdout.flush(); sys.exit(0)",
                    "dmesg": "sys.stdout.buffer.write(b'[    5.123456] NVRM: Xid (PCI:0000:5d:00): 79, pid=77, "
                             "name=python3, GPU has fallen off the bus. ' + data); sys.exit(0)",
                    "py-spy": "sys.stderr.buffer.write(data[:4096]); sys.stdout.buffer.write(data); "
                              "sys.stdout.flush(); sys.exit(1)"}[tool]
            target.write_text(f"#!{PY}\nimport sys\ndata = open({str(payload)!r}, 'rb').read()\n{body}\n")
            target.chmod(0o755)
    ready_files = []
    for r, plan in plans.items():
        node = cluster[plan["node"]]
        spec, d = plan["spec"], plan["dir"]
        env = dict(plan["env"])
        # where the script lives
        script = work / "rank.py"
        if plan["script_dir"] is not None:
            sd = plan["script_dir"]
            if isinstance(sd, dict) and "deep" in sd:
                p = bytes(d)
                for comp in sd["deep"]:
                    p = os.path.join(p, as_bytes(dec(comp)))
            else:
                p = path_join(d, sd)
            os.makedirs(p, exist_ok=True)
            shutil.copy(HERE / "rank.py", os.path.join(p, b"rank.py"))
            script = os.path.join(p, b"rank.py")
        cwd = bytes(d)
        if plan["cwd"] is not None:
            cwd = script.rsplit(b"/", 1)[0] if isinstance(plan["cwd"], dict) else path_join(d, plan["cwd"])
            os.makedirs(cwd, exist_ok=True)
        if plan["stderr_msgs"]:
            spec["stderr_msg"] = cat(plan["stderr_msgs"], " | ")
        if plan["errfile_msgs"]:
            spec["errfile_msg"] = cat(plan["errfile_msgs"], " | ")
            env["TORCHELASTIC_ERROR_FILE"] = str(d / "error.json")
        port = 29950 + int(r[1:])
        if plan["child"]:
            spec["block"] = "child"
            spec["child_argv"] = [PY, "-c", "import time; time.sleep(10**6)"] + plan["child"]
        if plan["tcp"]:
            spec["block"] = "tcp"
            spec["port"] = port
            procs.append(node.spawn([PY, str(work / "peer.py"), "tcp", str(port)] + [dec(v) for v in plan["tcp"]],
                                    stdout=sp.DEVNULL, stderr=sp.DEVNULL))
        if plan["unix_path"]:
            spec["block"] = "unix"
            (d / "u").mkdir()
            rel = as_bytes(dec(cat(plan["unix_path"], ""))) + b".sock"
            spec["unix_path"] = {"hex": rel.hex()}
            cwd = bytes(d / "u")
            procs.append(node.spawn([PY, str(work / "peer.py"), "unix", rel.hex()] + [dec(v) for v in plan["unix_peer"]],
                                    cwd=str(d / "u"), stdout=sp.DEVNULL, stderr=sp.DEVNULL))
        if plan["fifo"]:
            spec["block"] = "fifo"
            spec["fifo_path"] = {"hex": path_join(d, cat(plan["fifo"], "")).hex()}
        if plan["flock"]:
            spec["block"] = "flock"
            fp = path_join(d, cat(plan["flock"], ""))
            open(fp, "ab").close()
            spec["flock_path"] = {"hex": fp.hex()}
            procs.append(node.spawn([PY, str(work / "peer.py"), "flock", fp.hex()] + [dec(v) for v in plan["holder"]],
                                    stdout=sp.DEVNULL, stderr=sp.DEVNULL))
        spec_path = d / "spec.json"
        spec_path.write_text(json.dumps(spec))
        env["HZSPEC"] = str(spec_path)
        ready_files.append((r, Path(str(spec_path) + ".ready")))
        logf = d / "stderr.log"
        with open(logf, "wb") as fh:
            if plan["sparse_mb"]:
                fh.truncate(plan["sparse_mb"] * 1024 * 1024)
        envargs = [as_bytes(k) + b"=" + as_bytes(dec(v)) for k, v in env.items()]
        if plan["launcher"]:
            env_l = envargs + [b"HZRANKSCRIPT=" + as_bytes(script)]
            argv = ["env", "-i", *env_l, PY, str(work / "bin" / "torchrun"), "launch", "--nproc-per-node=1",
                    *[dec(v) for v in plan["launcher"]], "train.py"]
        else:
            argv = ["env", "-i", *envargs, PY, script, *[dec(v) for v in plan["argv"]]]
        with open(logf, "ab") as err:
            procs.append(node.spawn(argv, cwd=os.fsdecode(cwd), stdout=sp.DEVNULL, stderr=err, stdin=sp.DEVNULL))
        time.sleep(0.05)
    deadline = time.time() + 60
    while time.time() < deadline and not all(f.exists() for _r, f in ready_files):
        time.sleep(0.5)
    ready = {r: json.loads(f.read_text()) for r, f in ready_files if f.exists()}
    time.sleep(3)  # every rank settles in its block
    return procs, ready


# ------------------------------------------------------------------ runs
def run_cmd(argv, cluster, out: Path, name, timeout=RUN_TIMEOUT, cwd=None):
    t0 = time.time()
    try:
        r = subprocess.run([str(a) for a in argv], env=cluster.env() if cluster else dict(os.environ),
                           capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)
        rc, so, se = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as exc:
        rc, so, se = "timeout", exc.stdout or b"", exc.stderr or b""
    secs = time.time() - t0
    (out / f"{name}.out").write_bytes(so)
    (out / f"{name}.err").write_bytes(se)
    return {"name": name, "argv": [str(a) for a in argv], "rc": rc, "seconds": round(secs, 1),
            "stdout_bytes": len(so), "stderr_bytes": len(se)}


class Tmux:
    def __init__(self, sock, conf: Path):
        self.sock, self.conf = sock, conf
        self.titles = []

    def tm(self, *args, check=False):
        return subprocess.run(["tmux", "-L", self.sock, "-f", str(self.conf), *args], capture_output=True,
                              timeout=30, check=check)

    def start(self, command, raw: Path):
        self.tm("kill-server")
        self.tm("new-session", "-d", "-x", "200", "-y", "50", command, check=True)
        self.tm("pipe-pane", "-o", f"cat >> {raw}")

    def screen(self, escapes=False):
        args = ["capture-pane", "-p", "-S", "-", "-E", "-"] + (["-e"] if escapes else [])
        return self.tm(*args).stdout.decode("utf-8", "replace")

    def title(self):
        t = self.tm("display-message", "-p", "#{pane_title}").stdout.decode("utf-8", "replace").strip()
        self.titles.append(t)
        return t

    def buffers(self):
        return self.tm("list-buffers", "-F", "#{buffer_sample}").stdout.decode("utf-8", "replace")

    def keys(self, *keys):
        self.tm("send-keys", *keys)

    def kill(self):
        self.tm("kill-server")


def tty_and_tui(hangscope, snap: Path, out: Path, nrows, ncols, log):
    conf = out / "tmux.conf"
    conf.write_text("set -g set-clipboard on\nset -g history-limit 100000\nset -g default-terminal xterm-256color\n"
                    "set -g status off\n")
    tx = Tmux(f"hzhostile{os.getpid()}", conf)
    info = {}
    # --print on a terminal
    raw = out / "tty_print.raw"
    raw.touch()
    t0 = time.time()
    tx.start(f"env TERM=xterm-256color {hangscope} --load {snap} --print; echo HZDONE-PRINT; sleep 600", raw)
    while time.time() - t0 < 120 and "HZDONE-PRINT" not in tx.screen():
        time.sleep(1)
    info["tty_print_seconds"] = round(time.time() - t0, 1)
    (out / "tty_print.screen").write_text(tx.screen())
    (out / "tty_print.screen-e").write_text(tx.screen(True))
    tx.title()
    info["tty_print_buffers"] = tx.buffers()
    tx.kill()
    # the TUI on the saved snapshot: every cell, every tab of its rank view, the tree, the waits and the diff
    raw = out / "tui.raw"
    raw.touch()
    screens = []
    t0 = time.time()
    tx.start(f"env TERM=xterm-256color {hangscope} --load {snap}", raw)

    def snap_screen(label, wait=0.6):
        time.sleep(wait)
        s = tx.screen()
        screens.append(f"===== {label} (title {tx.title()!r})\n{s}")

    for _ in range(60):
        time.sleep(1)
        if "drill in" in tx.screen() or time.time() - t0 > 60:
            break
    info["tui_start_seconds"] = round(time.time() - t0, 1)
    snap_screen("main", 1.0)
    for key, label in [("t", "tree"), ("W", "waits"), ("d", "diff")]:
        tx.keys(key)
        snap_screen(label, 1.0)
        tx.keys("Escape")
        time.sleep(0.5)
    for _ in range(nrows + 2):
        tx.keys("Up")
    for _ in range(ncols + 2):
        tx.keys("Left")
    for row in range(nrows):
        for col in range(ncols):
            tx.keys("Enter")
            snap_screen(f"row {row} col {col} enter", 0.8)
            for tab in "1234567":
                tx.keys(tab)
                snap_screen(f"row {row} col {col} tab {tab}", 0.5)
            tx.keys("Escape")
            time.sleep(0.4)
            tx.keys("Right")
        tx.keys("Down")
        for _ in range(ncols + 1):
            tx.keys("Left")
    info["tui_buffers"] = tx.buffers()
    tx.keys("q")
    time.sleep(1)
    info["tui_seconds"] = round(time.time() - t0, 1)
    info["titles"] = sorted(set(tx.titles))
    tx.kill()
    (out / "tui.screens").write_text("\n".join(screens))
    log(f"tty/tui done in {info['tui_seconds']} s")
    return info


def chromium_dom(report: Path, out: Path):
    prof = tempfile.mkdtemp(prefix="hzchrome-")
    try:
        r = subprocess.run(["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
                            f"--user-data-dir={prof}", "--virtual-time-budget=5000", "--dump-dom",
                            report.resolve().as_uri()], capture_output=True, timeout=120)
        out.write_bytes(r.stdout)
        return r.returncode
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        shutil.rmtree(prof, ignore_errors=True)


def run_wave(wave, cases, out_root: Path, hangscope, log):
    from cluster import build_cluster
    out = out_root / f"wave{wave}"
    out.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="hz", dir="/tmp"))
    plans, node_plants, nodes = build_plans(cases, wave, work)
    meta = {"wave": wave, "runs": [], "started": dt.datetime.now(dt.timezone.utc).isoformat()}
    cluster = build_cluster(3)
    try:
        procs, ready = start_wave(cluster, plans, node_plants, work, log)
        meta["ready"] = {r: ready.get(r) for r in plans}
        meta["rank_nodes"] = {r: p["node"] for r, p in plans.items()}
        meta["rank_cases"] = {r: p["cases"] for r, p in plans.items()}
        log(f"wave {wave}: {len(ready)} of {len(plans)} ranks ready")
        if os.environ.get("HZ_PLANT_ONLY"):  # harness debugging: plant, show the processes, stop; no hangscope
            for name in nodes:
                r = cluster[name].run(["ps", "-eo", "pid,ppid,stat,wchan:20,comm,args"], check=False)
                log(f"{name}:\n" + str(getattr(r, "stdout", ""))[:6000])
            for r, rd in sorted(ready.items()):
                log(f"{r}: {json.dumps(rd)[:600]}")
            for r in plans:
                log(f"{r} stderr: " + (work / r / "stderr.log").read_bytes()[-1500:].decode("utf-8", "replace"))
            return meta
        hosts = out / "hosts.txt"
        hosts.write_text("".join(f"{n}\n" for n in nodes))
        common = ["--connect-timeout", "60", "--gpu-evidence", "on"]
        meta["runs"].append(run_cmd([hangscope, hosts, "--snapshot", out / "raw.json", "--raw", *common], cluster,
                                    out, "print_raw"))
        log(f"wave {wave}: print_raw {meta['runs'][-1]}")
        meta["runs"].append(run_cmd([hangscope, hosts, "--export", out / "exp", *common], cluster, out, "export"))
        log(f"wave {wave}: export {meta['runs'][-1]}")
    finally:
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    snap = out / "raw.json"
    if snap.exists():
        meta["runs"].append(run_cmd([hangscope, "--load", snap, "--print"], None, out, "load_print"))
        meta["runs"].append(run_cmd([hangscope, "--load", snap, "--export", out / "exp2"], None, out, "load_export"))
        ranks_by_node = {}
        for r, n in meta["rank_nodes"].items():
            ranks_by_node[n] = ranks_by_node.get(n, 0) + 1
        meta["tty"] = tty_and_tui(hangscope, snap, out, len(nodes), max(ranks_by_node.values()), log)
    for exp in ("exp", "exp2"):
        rep = out / exp / "report.html"
        if rep.exists():
            meta[f"{exp}_chromium"] = chromium_dom(rep, out / f"{exp}.dom.html")
    meta["ended"] = dt.datetime.now(dt.timezone.utc).isoformat()
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


# ------------------------------------------------------------------ checks
def read(path: Path):
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError:
        return None


class Elements(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.items = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        self.items.append((tag, dict(attrs)))
        self._in_title = tag == "title"

    def handle_data(self, data):
        if self._in_title:
            self.title += data

    def handle_endtag(self, tag):
        self._in_title = False


def parse_html(text):
    p = Elements()
    try:
        p.feed(text or "")
    except Exception:  # noqa: BLE001
        pass
    return p


def bad_char(ch, md=False):
    o = ord(ch)
    if ch in "\t\n":
        return False
    if o < 0x20 or o == 0x7f or 0x80 <= o <= 0x9f or 0xdc80 <= o <= 0xdc9f:
        return True
    return ch in BIDI and not md


def windows(text, a, b, length):
    i = 0
    while True:
        i = text.find(a, i)
        if i < 0:
            return
        start = i + len(a)
        end = start + length
        if b:
            j = text.find(b, start, start + length + 200)
            if j >= 0:
                end = j
        yield text[start:end]
        i = start


def shell_unsafe(span):
    state, i = "none", 0
    while i < len(span):
        ch = span[i]
        if state == "single":
            if ch == "'":
                state = "none"
        elif ch == "\\":
            i += 1
        elif state == "double":
            if ch == '"':
                state = "none"
            elif ch == "`" or span.startswith("$(", i):
                return True
        else:
            if ch == "'":
                state = "single"
            elif ch == '"':
                state = "double"
            elif ch in ";|&`" or span.startswith("$(", i):
                return True
        i += 1
    return False


def command_spans(text, needle):
    spans = []
    for m in re.finditer(r"`([^`\n]+)`", text):
        if needle in m.group(1):
            spans.append(m.group(1))
    for line in text.splitlines():
        if needle in line:
            spans.append(line)
    out = []
    for s in spans:
        words = s.strip().lstrip("$").split()
        while words and words[0] in ("sudo", "run", "Next:", "-", "*", ">"):
            words = words[1:]
        if words and words[0].rstrip(":") in CMDS:
            out.append(s)
    return out


def ctrl_sigs(value):
    """The control sequences of a value, as they would appear if written raw: each control char and what follows."""
    v = dec(value)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "surrogateescape")
    if len(v) > 100000:
        return []
    sigs = []
    for i, ch in enumerate(v):
        if ch == "\x1b" or 0x80 <= ord(ch) <= 0x9f or ch in BIDI or ch == "\x08":
            s = v[i:i + 8]
            if s not in sigs:
                sigs.append(s)
    return sigs


def check_wave(cases, wave, out_root: Path, meta):
    out = out_root / f"wave{wave}"
    pipes = {}
    for r in meta.get("runs", []):
        for ext in ("out", "err"):
            t = read(out / f"{r['name']}.{ext}")
            if t is not None:
                pipes[f"{r['name']}.{ext}"] = t
    streams = {k: read(out / f"{k}.raw") for k in ("tty_print", "tui")}
    streams = {k: v for k, v in streams.items() if v is not None}
    screens = {"tty_print.screen": read(out / "tty_print.screen"), "tui.screens": read(out / "tui.screens")}
    screens = {k: v for k, v in screens.items() if v is not None}
    mds = {f"{e}/summary.md": read(out / e / "summary.md") for e in ("exp", "exp2")}
    mds = {k: v for k, v in mds.items() if v is not None}
    htmls = {f"{e}/report.html": read(out / e / "report.html") for e in ("exp", "exp2")}
    htmls.update({f"{e}.dom.html": read(out / f"{e}.dom.html") for e in ("exp", "exp2")})
    htmls = {k: v for k, v in htmls.items() if v}
    jsons = {"raw.json": out / "raw.json", "exp/snapshot.json": out / "exp" / "snapshot.json",
             "exp2/snapshot.json": out / "exp2" / "snapshot.json"}
    tty = meta.get("tty", {})
    titles = tty.get("titles", [])
    buffers = tty.get("tty_print_buffers", "") + tty.get("tui_buffers", "")

    # rendered markdown
    from markdown_it import MarkdownIt
    md_html = {k: MarkdownIt("commonmark", {"html": True}).render(v) for k, v in mds.items()}
    parsed = {k: parse_html(v) for k, v in list(htmls.items()) + [(f"{k} (rendered)", v) for k, v in md_html.items()]}

    # wave robustness
    wave_fail = []
    for r in meta.get("runs", []):
        if r["rc"] not in (0, 1):
            wave_fail.append(f"{r['name']}: exit {r['rc']}")
        if "Traceback (most recent call last)" in pipes.get(f"{r['name']}.err", ""):
            wave_fail.append(f"{r['name']}: Python traceback on stderr")
    names = [r["name"] for r in meta.get("runs", [])]
    for need in ("print_raw", "export", "load_print", "load_export"):
        if need not in names:
            wave_fail.append(f"{need}: not run")
    for k, p in jsons.items():
        if not p.exists():
            wave_fail.append(f"{k}: not written")
            continue
        try:
            json.loads(p.read_bytes().decode("utf-8", "strict"))
        except Exception as exc:  # noqa: BLE001
            wave_fail.append(f"{k}: not strict UTF-8 JSON ({type(exc).__name__}: {str(exc)[:100]})")
        if p.stat().st_size > 32 * 2 ** 20:
            wave_fail.append(f"{k}: {p.stat().st_size} bytes > 32 MB")
    for k in ("exp/summary.md", "exp2/summary.md"):
        if k not in mds:
            wave_fail.append(f"{k}: not written")
        elif len(mds[k]) > 2 ** 20:
            wave_fail.append(f"{k}: {len(mds[k])} chars > 1 MB")
    for k in ("exp/report.html", "exp2/report.html"):
        if k not in htmls:
            wave_fail.append(f"{k}: not written")
        elif len(htmls[k]) > 8 * 2 ** 20:
            wave_fail.append(f"{k}: {len(htmls[k])} chars > 8 MB")
    for k in ("print_raw.out", "export.out", "load_print.out"):
        if len(pipes.get(k, "")) > 2 ** 20:
            wave_fail.append(f"{k}: {len(pipes[k])} chars > 1 MB")
    if "tui" not in streams or tty.get("tui_start_seconds", 99) >= 60:
        wave_fail.append("the TUI did not come up within 60 s")
    for k in ("exp", "exp2"):
        if meta.get(f"{k}_chromium") not in (0, None):
            wave_fail.append(f"chromium on {k}/report.html: {meta.get(f'{k}_chromium')}")

    results = []
    ready = meta.get("ready", {})
    for c in cases:
        if c["wave"] != wave:
            continue
        n, a, b = c["id"], c["marker_a"], c["marker_b"]
        fails, notes, seen = [], [], []
        if c["kind"] == "robust":
            fails += wave_fail
            results.append({"id": n, "result": "FAIL" if fails else "PASS", "fails": fails, "notes": [], "seen": []})
            continue
        if c["rank"].startswith("r") and not ready.get(c["rank"]):
            results.append({"id": n, "result": "VOID", "fails": [], "notes": [f"rank {c['rank']} never ready"],
                            "seen": []})
            continue
        core = dec(c["core"]) if c.get("core") is not None else None
        corelen = len(core) if core is not None else 64
        allt = {**pipes, **streams, **screens, **mds, **htmls}
        for k, t in allt.items():
            if a in t:
                seen.append(k)
        for k, t in jsons.items():
            if t.exists() and a.encode() in t.read_bytes():
                seen.append(k)
        # ctrl: raw control/bidi characters of the value in pipes and summary.md
        for k, t in list(pipes.items()) + list(mds.items()):
            is_md = k.endswith(".md")
            for w in windows(t, a, b, corelen + 8):
                bad = [ch for ch in w if bad_char(ch, md=is_md)]
                if bad:
                    fails.append(f"{k}: raw {sorted(set(repr(ch) for ch in bad))} after the marker")
                    break
                if is_md and any(ch in BIDI for ch in w):
                    notes.append(f"{k}: bidi override kept raw (not counted)")
        for k, t in streams.items():
            for s in ctrl_sigs(c["value"]):
                if s in t:
                    fails.append(f"{k}: the terminal stream carries the value's sequence {s!r}")
                    break
        for t in titles:
            if re.search(rf"(HZT{n}\b|^T{n}$)", t):
                fails.append(f"tmux pane title became {t!r}")
        if f"HZCLIP{n}" in buffers:
            fails.append("a tmux paste buffer (OSC 52 clipboard) holds HZCLIP")
        # markup: the literal brackets must follow the marker wherever the value is shown
        vtext = as_text(dec(c["value"])) if c["kind"] not in ("size",) else ""
        lit = vtext[len(a):len(a) + 2] if vtext.startswith(a) else ""
        if lit and lit[0] in "[:":
            for k, t in list(pipes.items()) + list(screens.items()):
                for w in windows(t, a, None, 8):
                    w = w.split("\n")[0]
                    if not w or w[0] in "\\^…?�␛*'\"" or w.startswith(lit) or w.strip() == "":
                        continue
                    fails.append(f"{k}: markup consumed: {a}{w!r} where {a}{lit}... was planted")
                    break
            for k, t in streams.items():
                if re.search(rf"\x1b\]8;[^\x07\x1b]*hz\.invalid/{n}\b", t):
                    fails.append(f"{k}: an OSC 8 hyperlink to hz.invalid/{n} was emitted")
        # html / md: injected elements, scripts, live links and images
        for k, p in parsed.items():
            for tag, attrs in p.items:
                if attrs.get("id") == f"hzinj-{n}":
                    fails.append(f"{k}: injected element <{tag} id=hzinj-{n}>")
                if attrs.get("data-hzpwn") == str(n):
                    fails.append(f"{k}: script ran (data-hzpwn={n})")
                for attr in ("href", "src"):
                    u = attrs.get(attr) or ""
                    if re.search(rf"hz\.invalid[/.]a?{n}\b", u):
                        fails.append(f"{k}: live <{tag} {attr}={u!r}>")
                    if u.strip().lower().startswith("javascript:") and a in u:
                        fails.append(f"{k}: javascript: link")
            if f"HZPWN{n}" in p.title:
                fails.append(f"{k}: the page title was set by the value")
        # shell: suggested commands
        needle = f"hzpwn-{n}"
        for k, t in list(pipes.items()) + list(mds.items()) + list(screens.items()):
            for s in command_spans(t, needle):
                if shell_unsafe(s):
                    fails.append(f"{k}: suggested command runs the value: {s[:160]!r}")
                    break
        # newline: forged lines
        for k, t in list(pipes.items()) + [(k, v) for k, v in screens.items() if k.startswith("tty")]:
            if re.search(rf"(?m)^\s*HZFORGE{n}\b", t):
                fails.append(f"{k}: a forged line starts with HZFORGE{n}")
        for k, t in screens.items():
            if k.startswith("tui") and re.search(rf"(?m)^[\s│|]*HZFORGE{n}\b", t):
                notes.append(f"{k}: the value's newline starts a screen line (not counted)")
        for k, t in md_html.items():
            if re.search(rf"<h\d>[^<]*HZHEAD{n}", t):
                fails.append(f"{k}: a forged heading HZHEAD{n}")
        # sizes
        if c["kind"] == "size":
            tok = f"~{n}~"
            for k, t in list(pipes.items()) + list(mds.items()) + list(screens.items()) + list(streams.items()):
                shown = t.count(tok) * len(tok)
                if shown > 16 * 1024:
                    fails.append(f"{k}: {shown} bytes of the value (> 16 kB)")
            for k, t in list(htmls.items()):
                shown = t.count(tok) * len(tok)
                if shown > 256 * 1024:
                    fails.append(f"{k}: {shown} bytes of the value (> 256 kB)")
            for k, p in jsons.items():
                if p.exists():
                    shown = p.read_bytes().count(tok.encode()) * len(tok)
                    if shown > 256 * 1024:
                        fails.append(f"{k}: {shown} bytes of the value (> 256 kB)")
        if wave_fail and c["kind"] in ("size", "count", "json", "nul", "surrogate", "utf8"):
            notes.append("the wave's runs failed a robustness check (see the wave row)")
        if c["kind"] in ("size", "count") and wave_fail:
            fails.append("wave robustness: " + "; ".join(wave_fail[:3]))
        result = "FAIL" if fails else ("PASS" if seen else "UNSEEN")
        results.append({"id": n, "result": result, "fails": sorted(set(fails)), "notes": sorted(set(notes)),
                        "seen": sorted(set(seen))})
    return results, wave_fail


def table(cases, results):
    by = {r["id"]: r for r in results}
    lines = ["| id | wave | channel | kind | result | where shown | failure |", "|---|---|---|---|---|---|---|"]
    for c in cases:
        r = by.get(c["id"])
        if not r:
            continue
        seen = ", ".join(s.replace("|", "/") for s in r["seen"][:6]) + (" ..." if len(r["seen"]) > 6 else "")
        fl = "; ".join(r["fails"] + (r["notes"] if r["result"] != "FAIL" else []))
        fl = fl.replace("|", "\\|").replace("\n", " ")
        fl = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in fl)
        lines.append(f"| {c['id']} | {c['wave']} | {c['channel']} | {c['kind']} | {r['result']} | {seen} | {fl[:400]} |")
    return "\n".join(lines)


def totals(cases, results, key):
    by = {r["id"]: r for r in results}
    agg = {}
    for c in cases:
        r = by.get(c["id"])
        if r:
            d = agg.setdefault(c[key], {"PASS": 0, "FAIL": 0, "UNSEEN": 0, "VOID": 0})
            d[r["result"]] += 1
    lines = [f"| {key} | cases | FAIL | PASS | UNSEEN | VOID |", "|---|---|---|---|---|---|"]
    for k, d in sorted(agg.items()):
        lines.append(f"| {k} | {sum(d.values())} | {d['FAIL']} | {d['PASS']} | {d['UNSEEN']} | {d['VOID']} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--wave", type=int, action="append")
    ap.add_argument("--hangscope", default="/work/venv/bin/hangscope")
    ap.add_argument("--check-only", action="store_true", help="re-check the outputs already in --out")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    cases = json.loads((HERE / "cases.json").read_text())["cases"]
    waves = args.wave or [1, 2]
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    results, wave_fails, metas = [], {}, {}
    for w in waves:
        if args.check_only:
            meta = json.loads((out / f"wave{w}" / "meta.json").read_text())
        else:
            meta = run_wave(w, cases, out, args.hangscope, log)
        metas[w] = meta
        res, wf = check_wave(cases, w, out, meta)
        results += res
        wave_fails[w] = wf
    summary = {"started": dt.datetime.fromtimestamp(t0, dt.timezone.utc).isoformat(),
               "seconds": round(time.time() - t0, 1), "results": results, "wave_failures": wave_fails,
               "runs": {w: m.get("runs") for w, m in metas.items()}}
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    text = (table(cases, results) + "\n\n" + totals(cases, results, "channel") + "\n\n"
            + totals(cases, results, "kind") + "\n")
    (out / "results.md").write_text(text)
    print(text)
    n = {k: sum(1 for r in results if r["result"] == k) for k in ("FAIL", "PASS", "UNSEEN", "VOID")}
    print(f"total {len(results)}: {n}; {summary['seconds']} s")


if __name__ == "__main__":
    main()
