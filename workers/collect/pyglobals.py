"""Loop counters that a script keeps as module globals, read from a rank's memory for the `<module>` frame that
py-spy's --locals leaves empty.

nanoGPT's train.py counts `iter_num` at the top level; a script may run `for step, batch in enumerate(loader):`
outside any function. Those are globals of `__main__`, not fast locals, and py-spy shows no locals for a
`<module>` frame: without them hangscope cannot tell which rank is an iteration ahead (app/analysis/iterations.py)
nor whether a counter moved between samples. Here, after py-spy's dump of a rank with --locals, the names bound
or counted by the module-level loops around the main thread's `<module>` frame (workers/loops.py) are read from
the rank's `__main__` dict and added to that frame's locals as `{"name", "repr", "arg": false, "global": true}`,
so everything downstream reads them as it reads py-spy's.

How (workers/collect/pyglobals_probe.py): the rank's own interpreter binary (/proc/PID/exe) is started once
with `-I -S -c <probe>`; being the same CPython build, it learns the struct layouts on its own objects through
/proc/self/mem and prints them. That costs an interpreter start (~15-30 ms), once per binary for the worker's
lifetime: the ranks of a node share one. When the worker runs as root, the probe runs as the rank's user
(setpriv), never as root: it is the job's binary, and it needs no access to anything but itself. The worker
then reads the rank's memory with the same reader, through /proc/PID/mem: no ptrace attach, no signal, the
rank never stops; only ints and bools come back as values, anything else as `<typename>`.

Never read: a process that is stopped, traced, frozen or in D state (a read of its memory may wait on its
memory map's lock; workers/pstate.py decides, as for py-spy), one in another mount or pid namespace (a
container: its interpreter binary is not ours to start), one whose interpreter is not the file the probe ran.
A failure is a note on the dump, never a failed dump.
"""

from __future__ import annotations

import json
import os
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Tuple

    from workers.protocol import DumpItem

from workers import loops as loopinfo
from workers import procinfo, pstate
from workers.collect import guard
from workers.collect import pyglobals_probe as probe
from workers.lazyre import lazy
from workers.request import Cancelled, Request

PROBE_TIMEOUT = 10.0  # an interpreter start on a node whose cores the job keeps busy
MAX_PROBE_OUTPUT = 64 << 10
MAX_CACHED = 16
MAX_FRAMES = 256  # frames of the main thread searched for its `<module>` frame
# What /proc/PID/exe must be called to be started as a probe: an interpreter (`python3.11`, `python3.13t`),
# never another program that embeds Python.
_PYTHON_NAME = lazy(r"^python[0-9.]*[a-z]?$")
_SETPRIV_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")

if TYPE_CHECKING:
    _Key = Tuple[int, int, int, int]  # the binary's (st_dev, st_ino, st_size, st_mtime_ns)

_lock = threading.Lock()
_cache: Dict[_Key, Dict[str, Any]] = {}  # the probe's answer per binary (errors of the build too)
_running: Dict[_Key, threading.Event] = {}


def module_frame(traces: Any, pid: int) -> Optional[Dict[str, Any]]:
    """The main thread's outermost `<module>` frame (the script's top level; a module being imported sits
    above it), or None."""
    threads = [t for t in traces if isinstance(t, dict)] if isinstance(traces, list) else []
    main = next((t for t in threads if t.get("os_thread_id") == pid), None) or \
        next((t for t in threads if t.get("thread_name") == "MainThread"), None)
    frames = main.get("frames") if main is not None else None
    if not isinstance(frames, list):
        return None
    found = None
    for frame in frames[:MAX_FRAMES]:
        if isinstance(frame, dict) and frame.get("name") == "<module>":
            found = frame
    return found


def loop_names(pid: int, frame: Dict[str, Any], in_container: bool = False) -> List[str]:
    """The names that the module-level loops around the frame's line bind or count, outermost loop first."""
    filename, line = frame.get("filename"), frame.get("line")
    if not isinstance(filename, str) or not isinstance(line, int) or not line:
        return []
    path = loopinfo.resolve(pid, filename, in_container)
    parsed = loopinfo.CACHE.get(path) if path else None
    if parsed is None:
        return []
    names: List[str] = []
    for loop in parsed.loops_at(line):
        names.extend(loop["variables"] + loop["counters"])
    return probe.valid_names(names)


def add(req: Request, pid: int, traces: Any, item: DumpItem, other_ns: bool) -> List[Dict[str, Any]]:
    """Read the module-level loop variables of the rank's `<module>` frame and add them to that frame's locals;
    what was done goes to item's actions, why nothing was read to its notes. Returns the locals added."""
    frame = module_frame(traces, pid)
    names = loop_names(pid, frame, other_ns) if frame is not None else []
    if frame is None or not names:
        return []
    try:
        got = collect(req, pid, names, other_ns, item.get("process"))
    except Cancelled:
        raise
    except Exception as exc:  # a bug here must not fail a dump that has its stacks
        item["notes"].append("globals of __main__ (%s) not read: %s: %s" % (", ".join(names), type(exc).__name__,
                                                                           str(exc)[:300]))
        return []
    item["actions"].extend(got["actions"])
    if got["error"]:
        item["notes"].append("globals of __main__ (%s) not read: %s" % (", ".join(names), got["error"]))
        return []
    existing = frame.get("locals")
    current = existing if isinstance(existing, list) else []
    have = {lc.get("name") for lc in current if isinstance(lc, dict)}
    added = [{"name": n, "repr": got["values"][n], "arg": False, "global": True}
             for n in names if n in got["values"] and n not in have]
    frame["locals"] = current + added
    return added


def collect(req: Request, pid: int, names: List[str], other_ns: bool = False,
            process: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """pid's `__main__` globals of these names: {"values": {name: "12" | "True" | "<float>"}, "absent": [names it
    does not hold], "actions": [what was done], "error": why nothing was read, or ""}. process: what held it
    before (pstate.read()), when known."""
    out: Dict[str, Any] = {"values": {}, "absent": [], "actions": [], "error": ""}
    names = probe.valid_names(names)
    why = memory_refusal(pid, process or {}, other_ns)
    if why or not names:
        out["error"] = why or "no valid names"
        return out
    try:
        mem = probe.Memory(pid)
    except OSError as exc:
        out["error"] = "cannot open /proc/%d/mem: %s" % (pid, exc.strerror or exc)
        return out
    with mem:
        cal, ran = calibration(req, pid)
        if ran:
            out["actions"].append(ran)
        if not cal.get("ok"):
            out["error"] = str(cal.get("error") or "the probe failed")
            return out
        try:
            out.update(read(pid, mem, cal, names))
        except (probe.Fault, probe.Changed, OSError, ValueError, LookupError, TypeError) as exc:
            out["error"] = str(exc)[:500] or type(exc).__name__
    if out["error"]:
        if mem.read_bytes:
            out["actions"].append("read its memory (/proc/%d/mem, %d bytes; not stopped) for %d global%s of "
                                  "__main__, in vain" % (pid, mem.read_bytes, len(names), "s" * (len(names) != 1)))
        return out
    out["actions"].append("read %d global%s of __main__ from memory (/proc/%d/mem, %d bytes; not stopped)"
                          % (len(names), "s" * (len(names) != 1), pid, mem.read_bytes))
    return out


def memory_refusal(pid: int, process: Dict[str, Any], other_ns: bool) -> str:
    """Why the process's memory must not be read now ("" when it may). process: what held it before py-spy ran
    (the dump's pstate.read()), checked again by its state letter now; read in full when not given. other_ns:
    refuse a process in another namespace (this module starts its interpreter binary; workers/collect/kwait.py,
    which only reads memory, passes False)."""
    if other_ns:
        return ("it runs in another mount or pid namespace (a container); its interpreter is not started from "
                "outside")
    info = process or pstate.read(pid)
    if pstate.held(info) or info.get("kind") in ("gone", "zombie", "exiting"):
        return "the process is %s" % (pstate.describe(info) or info.get("kind") or "gone")
    letter = guard.state(pid) if process else info.get("state", "")
    if letter in ("T", "t", "D", "Z", "X", ""):
        return "the process is %s" % {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible sleep (D)",
                                      "Z": "a zombie", "X": "gone", "": "gone"}[letter]
    return ""


def read(pid: int, mem: probe.Memory, cal: Dict[str, Any], names: List[str]) -> Dict[str, Any]:
    """{"values", "absent"} (pyglobals_probe.Reader.globals) of pid's __main__, with the probe's
    calibration; raises probe.Fault, probe.Changed, OSError, ValueError."""
    layout = probe.Layout.from_dict(cal.get("layout"))
    files = cal.get("files")
    maps = probe.read_maps(pid, [f["inode"] for f in files] if isinstance(files, list) else None)
    addrs: Dict[str, int] = {}
    for name, where in (cal.get("symbols") or {}).items():
        if not isinstance(where, list) or len(where) != 2 or not isinstance(files, list):
            raise ValueError("the probe's answer has no %s" % name)
        index, delta = where
        f = files[index]
        base = probe.file_base(maps, f["dev"], f["inode"])
        if base is None or base[1] != f["base_offset"]:
            raise probe.Fault("its interpreter is not %s, the file the probe ran (another build or a replaced "
                              "file)" % f["path"])
        addrs[name] = base[0] + delta
    runtime = addrs.pop("runtime")
    for kind in ("int", "bool", "dict", "str", "module"):
        if kind not in addrs:
            raise ValueError("the probe's answer has no %s" % kind)
    return probe.Reader(mem, layout, runtime, addrs).globals(names)


# -- the probe: one run per interpreter binary ---------------------------------------------------------------------


def calibration(req: Request, pid: int) -> Tuple[Dict[str, Any], str]:
    """(the probe's answer for pid's interpreter binary, the action to record when this call ran it, else "").
    Cached per binary; concurrent dumps of ranks that share a binary wait for one run."""
    try:
        st = os.stat("/proc/%d/exe" % pid)
    except OSError as exc:
        return {"ok": False, "error": "its interpreter binary cannot be read: %s" % (exc.strerror or exc)}, ""
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    while True:
        with _lock:
            hit = _cache.get(key)
            if hit is not None:
                return hit, ""
            wait = _running.get(key)
            if wait is None:
                done = _running[key] = threading.Event()
                break
        if not wait.wait(PROBE_TIMEOUT + 5):
            return {"ok": False, "error": "another dump's probe of this binary did not finish"}, ""
    try:
        answer, action, final = _run_probe(req, pid)
        if final:
            with _lock:
                if len(_cache) >= MAX_CACHED:
                    _cache.clear()
                _cache[key] = answer
        return answer, action
    finally:
        with _lock:
            _running.pop(key, None)
        done.set()


def _run_probe(req: Request, pid: int) -> Tuple[Dict[str, Any], str, bool]:
    """(answer, action, whether the answer holds for the binary for good: a timeout or a failed start does not)."""
    exe = "/proc/%d/exe" % pid
    try:
        real = os.readlink(exe)
    except OSError as exc:
        return {"ok": False, "error": "cannot resolve %s: %s" % (exe, exc.strerror or exc)}, "", False
    name = os.path.basename(real[:-len(" (deleted)")] if real.endswith(" (deleted)") else real)
    if not _PYTHON_NAME.match(name):
        return {"ok": False, "error": "its program (%s) is not a python interpreter binary that hangscope starts"
                % name[:100]}, "", True
    prefix, as_user = _as_user(pid)
    if prefix is None:
        return {"ok": False, "error": as_user}, "", False
    # the rank's library path: an interpreter built with a shared libpython and no rpath finds it there (the
    # rank's maps must then hold the very file the probe loaded: read() checks)
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    libpath = _environ(pid).get("LD_LIBRARY_PATH", "")
    if libpath:
        env["LD_LIBRARY_PATH"] = libpath
    started = time.monotonic()
    try:
        res = req.run(prefix + [exe, "-I", "-S", "-c", _probe_source()], PROBE_TIMEOUT, env=env,
                      max_stdout=MAX_PROBE_OUTPUT, max_stderr=16 << 10, pdeathsig=False)
    except OSError as exc:
        return {"ok": False, "error": "cannot start %s: %s" % (real, exc)}, "", False
    ms = (time.monotonic() - started) * 1000
    action = ("ran its python (%s -I -S%s, %.0f ms) once for this binary to learn its object layout; the probe "
              "reads only its own memory" % (real[:300], as_user, ms))
    if res.timed_out or res.killed:
        return {"ok": False, "error": "the layout probe (%s) did not finish within %.0f s" % (real, PROBE_TIMEOUT)
                }, action, False
    try:
        answer = json.loads(res.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        return {"ok": False, "error": "the layout probe (%s) failed (exit %s): %s"
                % (real, res.returncode, (err[-1] if err else "no output")[:300])}, action, False
    if not answer["ok"]:
        answer["error"] = str(answer.get("error") or "the probe failed")[:500]
        return answer, action, True
    try:
        probe.Layout.from_dict(answer.get("layout"))
    except ValueError as exc:
        return {"ok": False, "error": "the layout probe gave an unusable answer: %s" % exc}, action, True
    return answer, action, True


def _as_user(pid: int) -> Tuple[Optional[List[str]], str]:
    """(the prefix that runs the probe as the rank's user, a phrase for the action) or (None, why not). A root
    worker never runs the job's binary as root for a job of another user: setpriv drops to the rank's uid."""
    uid, gid = _ids(pid)
    if uid is None or gid is None:
        return None, "the owner of the process cannot be read"
    if os.geteuid() != 0 or uid == 0:
        return [], ""
    for d in _SETPRIV_DIRS:
        path = os.path.join(d, "setpriv")
        if os.access(path, os.X_OK):
            return [path, "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "--"], ", as uid %d" % uid
    return None, "setpriv is missing: the probe would run the job's python as root"


def _ids(pid: int) -> Tuple[Optional[int], Optional[int]]:
    uid, gid = procinfo.status_field(pid, "Uid").split()[:1], procinfo.status_field(pid, "Gid").split()[:1]
    return (int(uid[0]) if uid and uid[0].isdigit() else None, int(gid[0]) if gid and gid[0].isdigit() else None)


def _environ(pid: int) -> Dict[str, str]:
    try:
        return procinfo.parse_environ(procinfo.read_file("/proc/%d/environ" % pid, 1 << 20))
    except OSError:
        return {}


_SOURCE: List[str] = []


def _probe_source() -> str:
    """The probe module's source (from the file, or from the importer that shipped the worker to the node)."""
    if not _SOURCE:
        import importlib.util

        spec = importlib.util.find_spec(probe.__name__)
        loader = spec.loader if spec is not None else None
        source = loader.get_source(probe.__name__) if loader is not None and hasattr(loader, "get_source") else None
        if not source:
            raise OSError("the probe's source is not available")
        _SOURCE.append(source)
    return _SOURCE[0]
