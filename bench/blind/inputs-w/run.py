#!/usr/bin/env python3
"""Run the blind bad-input set for `hangscope watch`, every case in a throwaway sandbox.

    sudo python3 bench/blind/inputs-w/run.py [-k REGEX] [--cat CAT] [--json FILE]

(The harness of bench/blind/inputs/run.py, extended for watch: planted dummy ranks, --on-hang hook
recorders, trees the tool must leave alone, directory modes, stdout as a closed pipe or a pty, signals.)

Each case runs in its own namespaces (`unshare --pid --fork --net --mount --uts --ipc`), where, before anything
else, every existing mount is made read-only (a per-mount flag of this namespace's copies: the host
is not touched), /proc is a fresh read-only proc, /dev and /tmp are fresh tmpfs (device nodes made with
mknod: only 1,3 null, 1,5 zero, 1,7 full, 1,8 random, 1,9 urandom, and ptys the harness itself reads).
The tool can write nowhere but the sandbox's /tmp and /dev, and the harness compares those before
and after.  Needs root.  Writes nothing outside the sandbox but the --json results file.
"""

from __future__ import annotations

import argparse
import base64
import copy
import gzip
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SBX = "/tmp/sbx"
CWD = SBX + "/cwd"
HOME = SBX + "/home"
HSB = "/tmp/.hsb"  # the harness's own files in the sandbox (not compared)
SAFE_DEVS = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9)}
SCENARIOS = os.path.join(REPO, "tests", "data", "scenarios")


# =============================================================================================
# inside the sandbox
# =============================================================================================

def sh(*a: str) -> None:
    subprocess.run(list(a), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


SUBS: dict = {}


def sub(x, S=SBX):
    if isinstance(x, str):
        x = x.replace("{S}", S)
        for k, v in SUBS.items():
            x = x.replace(k, v)
        return x
    if isinstance(x, list):
        return [sub(i, S) for i in x]
    if isinstance(x, dict):
        return {k: sub(v, S) for k, v in x.items()}
    return x


def gen(g: dict):
    kind, n = g["gen"], g.get("n", 0)
    pre, suf = g.get("prefix", ""), g.get("suffix", "")
    if kind == "repeat":
        s = g["s"]
        out = pre + s * max(1, (n - len(pre) - len(suf)) // len(s)) + suf
    elif kind == "nest":
        o, c, inner = g["open"], g["close"], g.get("inner", "")
        m = max(1, (n - len(inner)) // (len(o) + len(c)))
        out = o * m + inner + c * m
    elif kind == "seq":
        parts, total, i = [], len(pre) + len(suf), 0
        while total < n:
            p = g["fmt"].format(i=i)
            parts.append(p)
            total += len(p)
            i += 1
        out = pre + "".join(parts) + suf
    elif kind == "lines":
        out = "\n".join(g["fmt"].format(i=i) for i in range(n)) + "\n"
    elif kind == "random":
        return random.Random(g.get("seed", 0)).randbytes(n)
    else:
        raise ValueError(kind)
    if g.get("newline"):
        out += "\n"
    return out


def abspath(p: str) -> str:
    p = sub(p)
    return os.path.normpath(p if p.startswith("/") else os.path.join(CWD, p))


def snapshot_doc(fx: dict) -> tuple[dict, dict]:
    with open(os.path.join(SCENARIOS, fx.get("source", "deadlock.json")), encoding="utf-8") as f:
        doc = json.load(f)
    raw: dict[str, str] = {}
    for op in fx.get("ops", []):
        apply_op(doc, op, raw)
    return doc, raw


def expand_value(v):
    if isinstance(v, dict) and "$repeat" in v:
        return v["$repeat"] * v["n"]
    if isinstance(v, dict) and "$float" in v:
        return float(v["$float"])
    return v


def walk(doc, path: str):
    """Every (container, key) the dotted path names ('*' for every element)."""
    parts = path.split(".")
    found = [(None, None, doc)]
    for part in parts:
        nxt = []
        for _, _, cur in found:
            if part == "*":
                keys = range(len(cur)) if isinstance(cur, list) else list(cur)
            else:
                keys = [int(part)] if isinstance(cur, list) else [part]
            for k in keys:
                nxt.append((cur, k, cur[k] if (isinstance(cur, list) or k in cur) else None))
        found = nxt
    return [(c, k) for c, k, _ in found]


def apply_op(doc, op, raw):
    kind = op[0]
    if kind == "set":
        for c, k in walk(doc, op[1]):
            c[k] = copy.deepcopy(expand_value(op[2]))
    elif kind == "rawnum" or kind == "deep":
        token = f"__RAW_{len(raw)}__"
        raw[json.dumps(token)] = op[2] if kind == "rawnum" else "[" * op[2] + "]" * op[2]
        for c, k in walk(doc, op[1]):
            c[k] = token
    elif kind == "setkey":
        for c, k in walk(doc, op[1]):
            c[k][op[2]] = op[3]
    elif kind == "del":
        for c, k in walk(doc, op[1]):
            del c[k]
    elif kind == "dup":
        for c, k in walk(doc, op[1]):
            c[k] = [copy.deepcopy(x) for _ in range(op[2]) for x in c[k]]
    elif kind == "dupnode":
        nodes = doc["snapshot"]["nodes"]
        for i in range(op[1]):
            nodes.append({"name": f"x{i}", "address": f"x{i}", "user": "", "port": None, "slots": None,
                          "state": "failed", "error": None, "info": None, "ranks_found": 0, "timings": [],
                          "warnings": [], "gpu": None})
    else:
        raise ValueError(kind)


def snapshot_bytes(fx: dict) -> bytes:
    doc, raw = snapshot_doc(fx)
    text = json.dumps(doc, indent=1)
    for token, value in raw.items():
        text = text.replace(token, value)
    return text.encode("utf-8")


def snaptext_bytes(fx: dict) -> bytes:
    with open(os.path.join(SCENARIOS, fx.get("source", "deadlock.json")), encoding="utf-8") as f:
        text = f.read()
    if "replace" in fx:
        text = text.replace(fx["replace"][0], fx["replace"][1])
    if "truncate" in fx:
        text = text[: int(len(text) * fx["truncate"])]
    if "append" in fx:
        text += fx["append"]
    if fx.get("bom"):
        text = "\ufeff" + text
    data = text.encode(fx.get("encode", "utf-8"))
    if "replace_bytes" in fx:
        old, new = fx["replace_bytes"]
        data = data.replace(old.encode(), new.encode("latin-1").decode("unicode_escape").encode("latin-1"))
    if fx.get("gzip"):
        data = gzip.compress(data)
    return data


def file_bytes(fx: dict) -> bytes:
    if "gen" in fx:
        d = gen(fx["gen"])
        return d if isinstance(d, bytes) else d.encode("utf-8")
    if "b64text" in fx:
        return base64.b64decode(fx["b64text"])
    return sub(fx.get("text", "")).encode(fx.get("encode", "utf-8"), "surrogatepass")


def fs_state(roots=("/tmp", "/dev")) -> dict:
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            if dirpath == HSB or dirpath.startswith(HSB + "/"):
                dirnames[:] = []
                continue
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                if p == HSB:
                    continue
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                m = st.st_mode
                if stat.S_ISDIR(m):
                    out[p] = ["d", stat.S_IMODE(m)]
                elif stat.S_ISLNK(m):
                    out[p] = ["l", os.readlink(p)]
                elif stat.S_ISREG(m):
                    h = hashlib.sha1()
                    try:
                        with open(p, "rb") as f:
                            for chunk in iter(lambda: f.read(1 << 20), b""):
                                h.update(chunk)
                    except OSError as e:
                        h.update(str(e).encode())
                    out[p] = ["f", stat.S_IMODE(m), st.st_size, h.hexdigest(), st.st_ino]
                elif stat.S_ISFIFO(m):
                    out[p] = ["p", st.st_ino]
                elif stat.S_ISCHR(m):
                    out[p] = ["c", st.st_ino, os.major(st.st_rdev), os.minor(st.st_rdev)]
                elif stat.S_ISBLK(m):
                    out[p] = ["b", st.st_ino, os.major(st.st_rdev), os.minor(st.st_rdev)]
                else:
                    out[p] = ["s", st.st_ino]
    return out


def marked_pids(mark: str) -> list:
    found = []
    needle = ("HSBLIND_MARK=" + mark).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
            if needle in env.split(b"\0"):
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")[:200]
                found.append([int(d), cmd])
        except OSError:
            continue
    return found


def setup_namespace(need_pty: bool, tty=None):
    """Everything read-only, then fresh /tmp, /proc and /dev.  Returns the pty (master fd) if asked.
    tty: a pty opened before, given to the tool as its terminal: bind-mounted at /dev/tty and /dev/pts/0."""
    pty = None
    if need_pty:
        pty = os.openpty()
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mounts.append(line.split()[4].encode().decode("unicode_escape"))
    for mp in mounts:
        subprocess.run(["mount", "-o", "remount,bind,ro", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sh("mount", "-t", "tmpfs", "-o", "size=4g,mode=1777", "tmpfs", "/tmp")
    for d in (SBX, CWD, HOME, HSB):
        os.makedirs(d, exist_ok=True)
    if pty:
        open(HSB + "/pty", "w").close()
        sh("mount", "--bind", os.ttyname(pty[1]), HSB + "/pty")
    if tty:
        open(HSB + "/tty", "w").close()
        sh("mount", "--bind", os.ttyname(tty[1]), HSB + "/tty")
    sh("mount", "-t", "proc", "-o", "ro,nosuid,nodev,noexec", "proc", "/proc")
    sh("mount", "-t", "tmpfs", "-o", "size=64m,mode=755", "tmpfs", "/dev")
    for name, (ma, mi) in {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9)}.items():
        os.mknod("/dev/" + name, 0o666 | stat.S_IFCHR, os.makedev(ma, mi))
        os.chmod("/dev/" + name, 0o666)
    os.makedirs("/dev/shm", mode=0o1777)
    os.chmod("/dev/shm", 0o1777)
    os.makedirs("/dev/pts")
    if tty:
        for name in ("/dev/tty", "/dev/pts/0"):
            open(name, "w").close()
            sh("mount", "--bind", HSB + "/tty", name)
    for name, target in {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
                         "stderr": "/proc/self/fd/2"}.items():
        os.symlink(target, "/dev/" + name)
    subprocess.run(["ip", "link", "set", "lo", "up"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the guard: every mount but our tmpfs and what lies under them is read-only now
    bad = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp in ("/tmp", "/dev") or mp.startswith("/tmp/") or mp.startswith("/dev/"):
                continue
            try:
                if not os.statvfs(mp).f_flag & os.ST_RDONLY:
                    bad.append(mp)
            except OSError:
                pass
    if bad:
        raise SystemExit("sandbox guard failed: still writable: " + " ".join(bad))
    return pty


def make_fixtures(c: dict, pty, mark: str):
    readers, procs = [], []
    for fx in c.get("fixtures", []):
        kind = fx["kind"]
        if kind == "proc":
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "HSBLIND_PLANT": mark}
            env.update(sub(fx.get("env", {})))
            procs.append(subprocess.Popen(sub(fx["argv"]), cwd=CWD, env=env, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
            SUBS["{PID%d}" % (len(procs) - 1)] = str(procs[-1].pid)
            continue
        if kind == "chmod":
            os.chmod(abspath(fx["path"]), fx["mode"])
            continue
        if kind == "chown":
            os.chown(abspath(fx["path"]), fx["uid"], fx["uid"])
            continue
        p = abspath(fx["path"])
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if kind == "file":
            with open(p, "wb") as f:
                f.write(file_bytes(fx))
            if "mode" in fx:
                os.chmod(p, fx["mode"])
        elif kind == "snapshot":
            with open(p, "wb") as f:
                f.write(snapshot_bytes(fx))
        elif kind == "snaptext":
            with open(p, "wb") as f:
                f.write(snaptext_bytes(fx))
        elif kind == "dir":
            os.makedirs(p, exist_ok=True)
        elif kind == "fifo":
            os.mkfifo(p)
            if fx.get("reader"):
                readers.append((p, os.open(p, os.O_RDONLY | os.O_NONBLOCK)))
        elif kind == "chardev":
            dev = tuple(fx["dev"])
            assert dev in SAFE_DEVS, dev  # never a disk, never anything but these
            os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(*dev))
        elif kind == "pty":
            open(p, "w").close()
            sh("mount", "--bind", HSB + "/pty", p)
        elif kind == "symlink":
            os.symlink(sub(fx["to"]), p)
        elif kind == "romount":
            os.makedirs(p, exist_ok=True)
            sh("mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", p)
        elif kind == "fulltmpfs":
            os.makedirs(p, exist_ok=True)
            sh("mount", "-t", "tmpfs", "-o", "size=" + fx.get("size", "64k"), "tmpfs", p)
            if fx.get("fill"):
                subprocess.run(["dd", "if=/dev/zero", "of=" + p + "/filler", "bs=4k"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        else:
            raise ValueError(kind)
    return readers, procs


def open_stdin(spec: dict | None):
    spec = spec or {"kind": "null"}
    kind = spec["kind"]
    if kind == "null":
        return os.open("/dev/null", os.O_RDONLY), False
    if kind == "closed":
        return os.open("/dev/null", os.O_RDONLY), True
    if kind == "dir":
        return os.open(CWD, os.O_RDONLY | os.O_DIRECTORY), False
    if kind == "dev":
        return os.open(spec["path"], os.O_RDONLY), False
    if kind == "bytes":
        data = base64.b64decode(spec["b64"]) if "b64" in spec else sub(spec["text"]).encode()
    elif kind == "random":
        data = random.Random(0).randbytes(spec["n"])
    elif kind == "lines":
        data = gen({"gen": "lines", "fmt": spec["fmt"], "n": spec["n"]}).encode()
    elif kind == "snapshot":
        data = snapshot_bytes({})
    else:
        raise ValueError(kind)
    with open(HSB + "/stdin", "wb") as f:
        f.write(data)
    return os.open(HSB + "/stdin", os.O_RDONLY), False


def expand_args(args):
    out = []
    for a in args:
        out.append(gen(a) if isinstance(a, dict) else sub(a))
    return out


def read_capped(path: str, cap: int = 65536) -> tuple[str, int, bool]:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        data = f.read(cap)
    return data.decode("utf-8", "surrogateescape"), size, b"\x1b" in data


def inner() -> None:
    ctx = json.load(sys.stdin)
    c, tool = ctx["case"], ctx["tool"]
    mark = "%s-%d" % (c["id"][:40], os.getpid())
    SUBS["{MARK}"] = "HSWDUMMY" + re.sub(r"[^a-z0-9]", "", c["id"].lower())[:30]
    SUBS["{HOOK}"] = HSB + "/hook"
    need_pty = any(fx.get("kind") == "pty" for fx in c.get("fixtures", []))
    out_kind = c.get("stdout", "file")
    tty = None
    if out_kind == "pty":
        tty = os.openpty()
    pty = setup_namespace(need_pty, tty)
    os.makedirs(HSB + "/hook", exist_ok=True)
    os.chmod(HSB, 0o755)
    os.chmod(HSB + "/hook", 0o777)
    readers, procs = make_fixtures(c, pty, mark)
    if procs:
        time.sleep(0.5)
    before = fs_state()
    env = {"PATH": os.path.dirname(tool) + ":/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8", "TERM": "dumb", "HSBLIND_MARK": mark}
    env.update(sub(c.get("env", {})))
    for k in c.get("unset", []):
        env.pop(k, None)
    stdin_fd, close0 = open_stdin(c.get("stdin"))
    out_path, err_path = HSB + "/stdout", HSB + "/stderr"
    if out_kind == "pty":
        os.set_blocking(tty[0], False)
        import fcntl, struct, termios
        fcntl.ioctl(tty[1], termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        stdin_fd = tty[1]
    ignore_int = c.get("ignore_int", False)

    def pre():
        import resource
        resource.setrlimit(resource.RLIMIT_DATA, (4 << 30, 4 << 30))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 30, 2 << 30))
        if close0:
            os.close(0)
        if out_kind == "closed":
            os.close(1)
        if out_kind == "pty":
            import fcntl, termios
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        # the tool's SIGINT as a terminal would give it: default, whatever the harness inherited (a harness
        # started in the background by a non-interactive shell has SIGINT ignored, and hangscope rightly keeps
        # an inherited SIG_IGN: the first run's Ctrl-C results were void for that reason, see FIRST-RUN.md)
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_int else signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    sigint_at, hard = float(c.get("sigint_at", 5)), float(c.get("timeout", 30))
    sig_name = c.get("signal", "INT")
    survive = c.get("survive")  # [t, "SIG"]: a signal the tool must NOT end on (ignored SIGINT), sent first
    survived = None
    pty_got = b""
    with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
        stdout_arg = fo
        rpipe = None
        if out_kind == "closed-pipe":
            rpipe, wpipe = os.pipe()
            os.close(rpipe)
            stdout_arg = wpipe
        elif out_kind == "pty":
            stdout_arg = tty[1]
        t0 = time.monotonic()
        # in a terminal all three fds are the terminal (a TUI may draw on stderr): since the third run
        p = subprocess.Popen([tool] + expand_args(c["args"]), cwd=CWD, env=env, stdin=stdin_fd, stdout=stdout_arg,
                             stderr=tty[1] if tty is not None else fe, start_new_session=True, preexec_fn=pre)
        if out_kind == "closed-pipe":
            os.close(wpipe)
        sigint_t = None
        killed = False
        while True:
            if tty is not None:
                try:
                    pty_got += os.read(tty[0], 1 << 16)[: max(0, 200000 - len(pty_got))]
                except OSError:
                    pass
            rc = p.poll()
            if rc is not None:
                break
            el = time.monotonic() - t0
            if survive and survived is None and el >= survive[0]:
                try:
                    os.killpg(p.pid, getattr(signal, "SIG" + survive[1]))
                except ProcessLookupError:
                    pass
                survived = el
            if survive and survived is not None and el >= survive[0] + 2.5 and not c.get("_checked_survive"):
                c["_checked_survive"] = True
                survived = ("alive", survived) if p.poll() is None else ("ended", survived)
            if tty is not None and sig_name == "INT" and sigint_t is not None and el >= sigint_t + 1.0 \
                    and not c.get("_second_ctrl_c"):
                c["_second_ctrl_c"] = True  # README (TUI): the first Ctrl+C cancels what is in flight, a second aborts
                os.write(tty[0], b"\x03")
            if sigint_t is None and el >= sigint_at:
                if tty is not None and sig_name == "INT":
                    os.write(tty[0], b"\x03")  # Ctrl-C typed at the terminal: a key in raw mode, SIGINT in cooked
                else:
                    try:
                        os.killpg(p.pid, getattr(signal, "SIG" + sig_name))
                    except ProcessLookupError:
                        pass
                sigint_t = el
            if el >= hard:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                killed = True
                rc = p.wait()
                break
            time.sleep(0.01)
        wall = time.monotonic() - t0
    if survive and not isinstance(survived, tuple):
        survived = ("ended", survived) if survived is not None else None
    if tty is None:
        os.close(stdin_fd)
    else:
        try:
            while True:
                d = os.read(tty[0], 1 << 16)
                if not d:
                    break
                pty_got += d[: max(0, 200000 - len(pty_got))]
        except OSError:
            pass
    time.sleep(0.05)
    time.sleep(float(c.get("settle", 0)))
    leftovers = marked_pids(mark)
    for pid, _ in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pr in procs:
        pr.kill()
        pr.wait()
    through = []
    for path, fd in readers:
        try:
            data = os.read(fd, 1 << 20)
        except BlockingIOError:
            data = b""
        if data:
            through.append(f"{len(data)} bytes written through FIFO {path}")
    if pty:
        os.set_blocking(pty[0], False)
        got = b""
        try:
            while True:
                d = os.read(pty[0], 1 << 16)
                if not d:
                    break
                got += d
        except OSError:
            pass
        if got:
            through.append(f"{len(got)} bytes written through a char device (pty): {got[:40]!r}")
    after = fs_state()
    forbid_hits = []
    for path, rx in c.get("forbid_in", []):
        ap = abspath(path)
        if os.path.isfile(ap):
            with open(ap, "rb") as f:
                txt = f.read().decode("utf-8", "replace")
            if re.search(rx, txt):
                forbid_hits.append(f"{path} holds {re.search(rx, txt).group(0)[:40]!r}")
    stdout, out_len, out_esc = read_capped(out_path)
    stderr, err_len, err_esc = read_capped(err_path)
    hook = {}
    for name in sorted(os.listdir(HSB + "/hook")):
        with open(os.path.join(HSB + "/hook", name), "rb") as f:
            hook[name] = f.read(65536).decode("utf-8", "surrogateescape")
    modes = {}
    for pth in c.get("modes", {}):
        ap = abspath(pth)
        try:
            modes[pth] = oct(stat.S_IMODE(os.lstat(ap).st_mode))
        except OSError:
            modes[pth] = None
    if out_kind == "pty":
        stdout = pty_got.decode("utf-8", "replace")[-4000:]
        out_len, out_esc = len(pty_got), False
    res = {"rc": rc, "wall": wall, "sigint_t": sigint_t, "killed": killed, "stdout": stdout, "stdout_len": out_len,
           "hook": hook, "modes": modes, "survived": survived, "planted": [pr.pid for pr in procs],
           "stderr": stderr, "stderr_len": err_len, "esc": out_esc or err_esc, "before": before, "after": after,
           "through": through, "leftovers": leftovers, "forbid_hits": forbid_hits,
           "pwned": os.path.exists(SBX + "/pwned")}
    sys.stdout.write(json.dumps(res))


# =============================================================================================
# outside: run, judge, report
# =============================================================================================

USAGE_RX = re.compile(r"^usage: ")


def message_lines(text: str) -> list:
    """Non-empty lines, an argparse usage block (usage: + its indented continuation lines) left out."""
    lines, in_usage = [], False
    for line in text.splitlines():
        if USAGE_RX.match(line):
            in_usage = True
            continue
        if in_usage and (line.startswith(" ") or not line.strip()):
            continue
        in_usage = False
        if line.strip():
            lines.append(line)
    return lines


def within(path: str, roots: list) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def judge(c: dict, r: dict) -> list:
    """The problems, each (class, text)."""
    probs = []
    expect = c["expect"]
    exits = c.get("exits") or {"reject": [2], "work": [0, 1, 3], "either": [0, 1, 2, 3]}[expect]
    bound = float(c.get("bound", 5))
    sigint_at = float(c.get("sigint_at", 5))
    both = r["stdout"] + "\n" + r["stderr"]
    if "Traceback (most recent call last)" in both or "Exception ignored" in both:
        last = [ln for ln in r["stderr"].splitlines() if ln.strip()][-1:] or ["?"]
        probs.append(("traceback", "Python traceback: " + last[0][:110]))
    if c.get("survive"):
        sv = r.get("survived")
        if not sv or sv[0] != "alive":
            probs.append(("signal", f"started with SIGINT ignored, it ended on SIG{c['survive'][1]} "
                          "(README: it leaves SIGINT ignored throughout)"))
    hk = r.get("hook", {})
    if c.get("hook_argv") is not None:
        if "argv" not in hk:
            probs.append(("nocapture", "the --on-hang hook never ran (no capture within the case's time): "
                          "the injection check is inconclusive"))
        else:
            got = hk["argv"].split("\0")[:-1]
            want = sub(c["hook_argv"])
            if got != want:
                probs.append(("injection", f"the hook's argv is {got!r}, not the literal split {want!r}"))
    if c.get("hook_must_run") and not hk:
        probs.append(("nocapture", "the --on-hang hook never ran (no capture within the case's time)"))
    for pth, want in (c.get("modes") or {}).items():
        got = r.get("modes", {}).get(pth)
        if got is not None and got != want:
            probs.append(("perms", f"{pth} has mode {got}, README says {want}"))
    for d in c.get("private", []):
        root = abspath(d)
        for pth, st in r["after"].items():
            if within(pth, [root]) and r["before"].get(pth) != st and st[0] in "df" and st[1] & 0o077:
                probs.append(("perms", f"{pth} was written with mode {oct(st[1])} (group/other bits; README: "
                              "--out 0700, its files 0600)"))
                break
    if r["killed"]:
        probs.append(("hang", f"still running at {c.get('timeout', 30)} s: killed (hangs)"))
    if r["sigint_t"] is not None:
        if r["killed"] or r["wall"] - r["sigint_t"] > 2.0:
            probs.append(("sigint", f"Ctrl+C at {r['sigint_t']:.0f} s not obeyed within 2 s"
                          + ("" if r["killed"] else f" (ended {r['wall'] - r['sigint_t']:.1f} s later)")))
        if bound <= sigint_at:
            probs.append(("time", f"still running at {r['sigint_t']:.0f} s (bound {bound:g} s)"))
    elif r["wall"] > bound:
        probs.append(("time", f"took {r['wall']:.1f} s (bound {bound:g} s)"))
    interrupted = r["sigint_t"] is not None
    if not interrupted and not r["killed"] and r["rc"] not in exits:
        what = {"reject": "refused with exit 2", "work": "accepted", "either": "refused or accepted"}[expect]
        first = (message_lines(r["stderr"]) or message_lines(r["stdout"]) or ["(no message)"])[0]
        probs.append(("exit", f"exit {r['rc']}, expected {what}: {first[:100]}"))
    if r["rc"] == 2 and not interrupted:
        lines = message_lines(r["stderr"]) + message_lines(r["stdout"])
        if len(lines) != 1:
            probs.append(("message", f"{len(lines)} message lines, not one: " + " | ".join(x[:60] for x in lines[:3])))
        elif expect == "reject" and c.get("mention"):
            if not any(re.search(m, lines[0], re.I) for m in c["mention"]):
                probs.append(("vague", "message does not name the problem: " + lines[0][:110]))
        if lines and any(ch in "".join(lines) for ch in "\x1b\x00\x07\x08\r"):
            probs.append(("message", "raw control characters in the message"))
    if r["stderr"].count("\n") > 40:
        probs.append(("flood", f"{r['stderr'].count(chr(10))} lines on stderr"))
    if c.get("forbid_stdout") and re.search(c["forbid_stdout"], r["stdout"]):
        probs.append(("escape", f"stdout holds what it must not ({c['forbid_stdout']!r})"))
    for h in r["forbid_hits"]:
        probs.append(("escape", h))
    if r["pwned"]:
        probs.append(("injection", "an injected command ran (the sandbox's pwned file exists)"))
    for t in r["through"]:
        probs.append(("special", t))
    outs = []
    for o in c.get("outputs", []) or []:
        o = sub(o)
        outs.append(os.path.normpath(o if o.startswith("/") else os.path.join(CWD, o)))
    before, after = r["before"], r["after"]
    for p, st in before.items():
        if st[0] in "lpcbs":
            a = after.get(p)
            if a is None or a[0] != st[0] or a[1] != st[1]:
                probs.append(("special", f"{p} ({ {'l': 'symlink', 'p': 'FIFO', 'c': 'char device'}.get(st[0], st[0]) }) "
                              + ("removed" if a is None else "replaced")))
    preserve = [os.path.normpath(sub(p) if sub(p).startswith("/") else os.path.join(CWD, sub(p)))
                for p in c.get("preserve", [])]
    for p in preserve:
        if before.get(p) != after.get(p):
            probs.append(("outside", f"the user's file {p} was " + ("deleted" if p not in after else "changed")))
    for d in c.get("preserve_tree", []):
        root = abspath(d)
        bad = [p for p in before if within(p, [root]) and before[p] != after.get(p)]
        if root in after and before.get(root) is not None and before[root] != after[root]:
            bad.insert(0, root + " (its mode)")
        if bad:
            gone = sum(1 for p in bad if p in before and p not in after)
            probs.append(("user-files", f"{len(bad)} of the user's own paths in {d} changed or removed ({gone} removed): "
                          + ", ".join(p.replace(SBX + "/", "") for p in bad[:3])))
    changed = []
    for p in sorted(set(before) | set(after)):
        if before.get(p) == after.get(p) or within(p, outs) or p in preserve:
            continue
        if p in before and p in after and before[p][0] == "d" == after[p][0]:
            continue
        changed.append(p + (" (new)" if p not in before else " (deleted)" if p not in after else " (changed)"))
    if changed:
        probs.append(("outside", f"{len(changed)} paths changed outside the output path: " + ", ".join(changed[:3])))
    if r["leftovers"]:
        msg = f"{len(r['leftovers'])} processes left running: {r['leftovers'][0][1][:60]}"
        if c.get("leftover_ok"):
            r.setdefault("notes", []).append("(informational) " + msg)
        else:
            probs.append(("leftover", msg))
    return probs


CLASS_NAMES = {
    "traceback": "Python traceback", "hang": "hangs (killed at the hard timeout)",
    "sigint": "Ctrl+C not obeyed within 2 s", "time": "over its time bound", "exit": "wrong exit code",
    "message": "message not one clean line", "vague": "message does not name the problem",
    "flood": "floods stderr", "escape": "terminal/HTML escapes passed through", "injection": "shell injection ran",
    "special": "wrote through / replaced a device, FIFO or symlink", "outside": "wrote outside the named output path",
    "leftover": "left processes behind", "superlinear": "superlinear time in input size",
    "signal": "ignored SIGINT not kept ignored", "nocapture": "no capture happened (live case inconclusive)",
    "perms": "--out or its files not private", "user-files": "changed or removed the user's own files in a directory",
}


def run_case(c: dict, tool: str) -> dict:
    ctx = json.dumps({"case": c, "tool": tool})
    cmd = ["unshare", "--pid", "--fork", "--net", "--mount", "--uts", "--ipc", "--propagation", "private", "--",
           sys.executable, os.path.abspath(__file__), "--inner"]
    try:
        p = subprocess.run(cmd, input=ctx.encode(), capture_output=True, timeout=float(c.get("timeout", 30)) + 60)
    except subprocess.TimeoutExpired:
        return {"error": "harness timeout"}
    if p.returncode != 0:
        return {"error": "harness failed: " + p.stderr.decode(errors="replace")[-300:]}
    return json.loads(p.stdout.decode("utf-8", "surrogateescape"))


def series_table(cases: list, results: dict, base: float) -> tuple[list, list]:
    lines, flagged = [], []
    c_by_id = {c["id"]: c for c in cases}
    groups: dict[str, list] = {}
    for c in cases:
        if "series" in c and c["id"] in results and "rc" in results[c["id"]]:
            groups.setdefault(c["series"]["name"], []).append((c["series"]["n"], results[c["id"]], c["id"]))
    for name, pts in groups.items():
        pts.sort()
        row = []
        expo = None
        for i, (n, r, _) in enumerate(pts):
            row.append(f"{n}: {r['wall']:.2f}s rc={r['rc']}" + (" KILLED" if r["killed"] else ""))
        if len(pts) >= 2:
            (n1, r1, _), (n2, r2, id2) = pts[-2], pts[-1]
            t1, t2 = max(r1["wall"] - base, 0.05), max(r2["wall"] - base, 0.05)
            expo = math.log(t2 / t1) / math.log(n2 / n1)
            # only the parses of input (node lists, hosts files) must be linear: a --match pattern's own
            # backtracking is the user's, held to its time bound and Ctrl+C instead
            if c_by_id[id2]["cat"] in ("nodelist-growth", "hosts-growth") and (
                    (r2["wall"] - base > 1.0 and expo > 1.5) or r2["killed"]):
                flagged.append((id2, name, expo))
        lines.append(f"  {name:28s} " + "  ".join(row) + (f"   growth exponent {expo:.2f}" if expo is not None else ""))
    return lines, flagged


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", help="only cases whose id matches this regex")
    ap.add_argument("--cat", help="only this category")
    ap.add_argument("--json", default="/tmp/hangscope-blind-inputs-w.json", help="write the raw results here")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help="another cases file (default: cases.json beside run.py)")
    ap.add_argument("-v", action="store_true", help="print every case as it runs")
    ap.add_argument("--tool", help="another executable in place of hangscope (the harness's own self-test)")
    a = ap.parse_args()
    if a.inner:
        inner()
        return
    if os.geteuid() != 0:
        sys.exit("run.py needs root (mount namespaces, mknod)")
    beside = os.path.join(os.path.dirname(sys.executable), "hangscope")  # the venv run.py runs in
    tool = os.path.abspath(a.tool) if a.tool else (beside if os.path.exists(beside) else shutil.which("hangscope"))
    if not tool:
        sys.exit("no hangscope on PATH: activate the venv that has it")
    with open(a.cases or os.path.join(HERE, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    if a.k:
        cases = [c for c in cases if re.search(a.k, c["id"])]
    if a.cat:
        cases = [c for c in cases if c["cat"] == a.cat]
    head = "not recorded (the set never runs git in the repository)"
    stamp = time.time()
    load0 = "%.1f" % os.getloadavg()[0]
    print(f"hangscope watch blind bad-input set: {len(cases)} cases, commit {head}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}, tool {tool}", flush=True)
    results: dict[str, dict] = {}
    verdicts: dict[str, list] = {}
    t_start = time.monotonic()
    for i, c in enumerate(cases):
        r = run_case(c, tool)
        results[c["id"]] = r
        probs = [("harness", r["error"])] if "error" in r else judge(c, r)
        verdicts[c["id"]] = probs
        if a.v or probs:
            state = "ok " if not probs else "BAD"
            extra = "" if "error" in r else f"rc={r['rc']} {r['wall']:.1f}s"
            print(f"[{i + 1}/{len(cases)}] {state} {c['id']} {extra} " + "; ".join(p[1][:90] for p in probs[:2]),
                  file=sys.stderr, flush=True)
    # timing on a shared machine is noisy: a case whose only problems are time or Ctrl+C is run once more,
    # and those problems count only if they come back
    noisy = [c for c in cases if verdicts[c["id"]] and {p[0] for p in verdicts[c["id"]]} <= {"time", "sigint"}]
    retried_ok = []
    for c in noisy:
        r = run_case(c, tool)
        probs = [("harness", r["error"])] if "error" in r else judge(c, r)
        if not probs:
            retried_ok.append(c["id"])
            verdicts[c["id"]] = []
            results[c["id"]] = r
        print(f"[retry] {'ok ' if not probs else 'BAD'} {c['id']} " + "; ".join(p[1][:90] for p in probs[:2]),
              file=sys.stderr, flush=True)
    elapsed = time.monotonic() - t_start
    # baseline: the startup of a quick refusal, for the growth tables
    quick = sorted(r["wall"] for c in cases for r in [results[c["id"]]]
                   if c["cat"] == "numeric" and "rc" in r and r["rc"] == 2)
    base = quick[len(quick) // 2] if quick else 0.5
    series_lines, flagged = series_table(cases, results, base)
    for id_, name, expo in flagged:
        verdicts[id_].append(("superlinear", f"{name}: time grows as n^{expo:.1f}"))
    # report
    cats: dict[str, list] = {}
    for c in cases:
        cats.setdefault(c["cat"], []).append(c)
    print()
    print(f"{'category':18s} {'cases':>6s} {'OK':>6s} {'misbehaved':>11s}")
    tot = [0, 0, 0]
    for cat, cs in cats.items():
        bad = sum(1 for c in cs if verdicts[c["id"]])
        print(f"{cat:18s} {len(cs):6d} {len(cs) - bad:6d} {bad:11d}")
        tot[0] += len(cs)
        tot[1] += len(cs) - bad
        tot[2] += bad
    print(f"{'TOTAL':18s} {tot[0]:6d} {tot[1]:6d} {tot[2]:11d}")
    print(f"\n(run time {elapsed:.0f} s; load average {load0} at the start, {os.getloadavg()[0]:.1f} at the end, "
          f"on {os.cpu_count()} CPUs; baseline of a quick refusal {base:.2f} s; {len(noisy)} cases retried for time "
          f"or Ctrl+C alone, {len(retried_ok)} of them passed the second time: {', '.join(retried_ok) or '-'})")
    classes: dict[str, int] = {}
    for probs in verdicts.values():
        for k in {p[0] for p in probs}:
            classes[k] = classes.get(k, 0) + 1
    if classes:
        print("\nMisbehaviour classes (cases):")
        for k, n in sorted(classes.items(), key=lambda kv: -kv[1]):
            print(f"  {n:4d}  {CLASS_NAMES.get(k, k)}")
    print("\nMisbehaving cases:")
    for c in cases:
        probs = verdicts[c["id"]]
        if probs:
            r = results[c["id"]]
            rc = f"rc={r.get('rc')} {r.get('wall', 0):.1f}s"
            print(f"  {c['id']} [{rc}]: " + "; ".join(p[1][:140] for p in probs))
    notes = [(c["id"], n) for c in cases for n in results[c["id"]].get("notes", [])]
    if notes:
        print("\nNotes (not counted as failures):")
        for id_, n in notes:
            print(f"  {id_}: {n}")
    if series_lines:
        print("\nTime vs input length (n: wall time, exit code; exponent from the last two points, net of "
              f"{base:.2f} s startup):")
        print("\n".join(series_lines))
    # the host outside the sandbox: nothing may have changed there
    # (only the repository: on a shared machine /root and /etc change under other users' feet)
    changed = subprocess.run(["find", REPO, "-xdev", "-newermt", "@%f" % stamp, "-not", "-path", "*/.git/*",
                              "-not", "-path", "*__pycache__*", "-not", "-path", "*/.mypy_cache/*"],
                             capture_output=True, text=True).stdout.split()
    print("\nHost outside the sandbox: " + ("nothing changed in the repository" if not changed
                                           else "CHANGED: " + " ".join(changed[:10])))
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump({"commit": head, "results": {k: {kk: vv for kk, vv in v.items() if kk not in ("before", "after")}
                                                for k, v in results.items()},
                   "verdicts": verdicts}, f, indent=1)


if __name__ == "__main__":
    main()
