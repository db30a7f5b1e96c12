"""One py-spy dump of one target, with the state checks around it, failures classified, and /proc data
collected first so that a denied or failed dump still shows where the threads wait."""

from __future__ import annotations

import copy
import json
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, List, Optional, Tuple

    from workers.protocol import DumpItem

from workers import children
from workers import loops as loopinfo
from workers import pstate
from workers.collect import guard, kwait, procfs, pyglobals, runas
from workers.collect.guard import CollectError
from workers.procinfo import ns_id
from workers.protocol import error_dict, pyspy_flags
from workers.redact import redact_text, secret_value
from workers.request import Cancelled, Request

DEFAULT_TIMEOUT = 10.0
# The deadline of the non-blocking dump that replaces the blocking one on a held (stopped, frozen, D) process:
# it never attaches and normally ends in a fraction of a second; a D-state process whose memory map is locked
# can still make it wait, and nobody should wait long for that.
HELD_TIMEOUT = 3.0


class DumpOptions:
    def __init__(self, req: Request) -> None:
        self.native = self.native_wanted = req.arg_bool("native")
        self.locals = req.arg_bool("locals")
        # py-spy refuses --native with --nonblocking; native was asked for explicitly, so it wins.
        self.nonblocking = req.arg_bool("nonblocking") and not self.native
        self.timeout = req.arg_float("timeout", DEFAULT_TIMEOUT) or DEFAULT_TIMEOUT
        self.loops = req.arg_bool("loops")
        ctx = req.arg_int("source_context", 3)
        self.source_context = -1 if ctx is None else min(ctx, 50)
        self.sudo = req.sudo


def held_options(opts: DumpOptions) -> DumpOptions:
    """The options for a process that must not be attached: non-blocking, no native frames, a short deadline."""
    held = copy.copy(opts)
    held.native, held.nonblocking = False, True
    held.timeout = min(opts.timeout, HELD_TIMEOUT)
    return held


def namespaces(pid: int) -> Tuple[bool, Optional[int]]:
    """(in another pid or mount namespace, the pid as seen inside its pid namespace)."""
    other = other_pidns = False
    for kind in ("pid", "mnt"):
        try:
            if os.readlink("/proc/%d/ns/%s" % (pid, kind)) != os.readlink("/proc/self/ns/%s" % kind):
                other = True
                other_pidns = other_pidns or kind == "pid"
        except OSError:
            other_pidns = other_pidns or kind == "pid"  # unknown: ask /proc/PID/status below
    if not other_pidns:
        return other, None  # the same pid namespace: the same pid (status costs ~0.1 ms to generate)
    return other, ns_id(pid)


NONBLOCKING_TRIES = 3  # reads of a running process by py-spy --nonblocking before its failure is reported


def _torn(res: Any, pid: int) -> bool:
    """A --nonblocking read that failed the way a torn read does: py-spy ran to its end and said no more than
    that it could not read the stacks, and the process is still there and may be read."""
    if res.timed_out or res.killed or res.returncode == 0 or not os.path.exists("/proc/%d" % pid):
        return False
    return classify(res.stderr.decode("utf-8", "replace"), pid)[0] == "tool_failed"


def classify(stderr: str, pid: int) -> Tuple[str, str]:
    """(code, message) for a failed py-spy run, from its stderr (the Rust backtrace is skipped)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    meaningful = [ln for ln in lines if not (ln.startswith("Stack backtrace") or ln[0].isdigit()
                                             or ln.startswith("at ") or ln.startswith("Caused by"))]
    first = meaningful[0] if meaningful else "py-spy failed without a message"
    text = stderr.lower()
    if not os.path.exists("/proc/%d" % pid):
        return "target_exited", "pid %d exited during the dump: %s" % (pid, first)
    if "permission denied" in text or "operation not permitted" in text:
        scope = _ptrace_scope()
        return "ptrace_denied", ("py-spy may not trace pid %d (worker uid %d, kernel.yama.ptrace_scope=%s): %s"
                                 % (pid, os.getuid(), "absent" if scope is None else scope, first))
    return "tool_failed", first[:500]


def _ptrace_scope() -> Optional[int]:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _redact_locals(traces: Any) -> None:
    """Locals are remote values: mask those named like secrets and token-shaped text in the rest."""
    if not isinstance(traces, list):
        return
    for thread in traces:
        for frame in (thread.get("frames") or []) if isinstance(thread, dict) else []:
            for local in frame.get("locals") or []:
                _redact_local(local)


def _redact_local(local: Any) -> None:
    if isinstance(local, dict) and isinstance(local.get("repr"), str):
        name = str(local.get("name", ""))
        value = local["repr"]
        local["repr"] = "***" if secret_value(name, value.strip("'\"")) else redact_text(value)


def _frames(traces: Any) -> List[Tuple[str, int]]:
    out = []
    for thread in traces if isinstance(traces, list) else []:
        for frame in thread.get("frames") or []:
            filename, line = frame.get("filename"), frame.get("line")
            if isinstance(filename, str) and isinstance(line, int) and (filename, line) not in out:
                out.append((filename, line))
    return out


def dump(req: Request, pid: int, start_time: Optional[int], opts: DumpOptions) -> DumpItem:
    """The dump item for one target (errors are part of the item: a rank's failure is data)."""
    started, started_at = time.monotonic(), time.time()
    item: DumpItem = {"pid": pid, "start_time": start_time, "ok": False, "pyspy": None, "pyspy_stderr": "",
                            "procfs": {"threads": []}, "loops": {}, "source": {}, "state_before": "",
                            "state_after": "", "resumed": False, "elapsed": 0.0, "error": None, "notes": [],
                            "source_context": opts.source_context, "process": None, "actions": []}
    try:
        _dump(req, pid, start_time, opts, item)
    except CollectError as exc:
        item["error"] = error_dict(exc.code, exc.message)
    item["elapsed"] = round(time.monotonic() - started, 4)
    # the node's clock around the whole dump (state read, tool, source): how close together a pass's dumps were
    item["started_at"], item["ended_at"] = round(started_at, 6), round(started_at + item["elapsed"], 6)
    return item


def _dump(req: Request, pid: int, start_time: Optional[int], opts: DumpOptions, item: DumpItem) -> None:
    # --nonblocking reads memory without attaching, so another tracer does not stop it.
    try:
        item["state_before"] = guard.check_before(pid, start_time, allow_tracer=opts.nonblocking)
    except CollectError as exc:
        if exc.code == "already_traced":  # the right process, only not ours to attach: /proc still tells
            item["state_before"], item["procfs"] = guard.state(pid), procfs.collect(pid)
            item["process"] = pstate.read(pid)
            item["actions"].append("read /proc only (another tracer holds it)")
            _kernel_waits(req, pid, item)
        raise
    # State first, tools second: what holds the process decides which tools may touch it (/proc and cgroupfs
    # only are read until then; the thread states /proc gave are reused).
    other_ns, nspid = namespaces(pid)
    item["procfs"] = procfs.collect(pid, ns_tids=nspid is not None)
    item["actions"].append("read /proc")
    info = item["process"] = guard.hold(pid, [(t["tid"], t["state"]) for t in item["procfs"]["threads"]
                                              if isinstance(t, dict) and "tid" in t and "state" in t])
    if info["kind"] not in ("stopped", "traced", "frozen") and _stop_letters(item):
        # the letters read first caught a stop that hold() saw pass (a tool of this worker's own let go of it):
        # read them again, so no thread of a running rank is reported stopped
        item["state_before"] = guard.state(pid) or item["state_before"]
        item["procfs"] = procfs.collect(pid, ns_tids=nspid is not None)
    _kernel_waits(req, pid, item)
    if info["kind"] == "sleeping":  # a thread asleep writing to a full pipe: who holds its read end (/proc only)
        piped = pstate.pipe_wait(pid, item["procfs"]["threads"], req.shared)
        if piped is not None:
            info["pipe"] = piped
            item["actions"].append("searched /proc/*/fd for the pipe's readers")
    tool, searched = req.worker.tools.find("py-spy", pid)
    if tool is None:
        item["error"] = error_dict("tool_missing", "py-spy not found on this node; searched: %s"
                                   % ", ".join(searched))
        return
    if pstate.held(info):
        opts = held_options(opts)
        item["notes"].append("not attached: the process is %s; dumped with py-spy --nonblocking (reads its "
                             "memory, no ptrace)%s" % (pstate.describe(info), "; native frames need ptrace and "
                                                       "were not collected" if opts.native_wanted else ""))
    flags = pyspy_flags(opts.native, opts.locals, opts.nonblocking)
    # --nonblocking never attaches, so it may run beside this worker's own strace/gdb on the same pid.
    lock = guard.Shared() if opts.nonblocking else guard.Exclusive(pid, "py-spy dump, request %d" % req.id)
    with lock:
        res = None
        try:
            first_try = time.monotonic()
            res = _run(req, tool, pid, nspid, other_ns, flags, opts, item)
            tries = 1
            # --nonblocking reads a running interpreter's memory as it changes: a read can come out torn ("Failed
            # to get stack traces") although nothing is wrong. Read again, a few times, within the first half
            # of the dump's deadline; a failure that lasts is reported as it is.
            while (opts.nonblocking and tries < NONBLOCKING_TRIES and _torn(res, pid)
                   and time.monotonic() - first_try < opts.timeout / 2):
                tries += 1
                res = _run(req, tool, pid, nspid, other_ns, flags, opts, item)
            if tries > 1:
                item["notes"].append("py-spy --nonblocking read the process while it changed; read %d times"
                                     % tries)
        except OSError as exc:
            raise CollectError("tool_failed", "cannot run py-spy (%s): %s" % (tool.path, exc))
        finally:
            killed = res is not None and (res.timed_out or res.killed)
            if opts.nonblocking:  # never attached: nothing to detach or resume, nothing sent
                item["state_after"] = guard.state(pid)
                if res is not None:
                    item["actions"].append("py-spy dump --nonblocking: read its memory, never attached"
                                           + (" (killed at its %.1f s deadline)" % opts.timeout if killed else ""))
            else:
                item["state_after"], item["resumed"] = guard.check_after(pid, item["state_before"], killed)
                if res is not None:
                    item["actions"].append("py-spy dump%s: attached with ptrace, then detached%s" % (
                        " --native" * opts.native,
                        " (killed at its %.1f s deadline)" % opts.timeout if killed else ""))
                if item["resumed"]:
                    item["actions"].append("SIGCONT: the tool left it stopped, and it runs again")
    stderr = redact_text(res.stderr.decode("utf-8", "replace"))
    item["pyspy_stderr"] = stderr[-4000:]
    if res.killed:
        raise Cancelled()
    if res.timed_out:
        item["error"] = error_dict("timeout", "py-spy%s did not finish within %.1fs and was killed; target state "
                                   "after: %s%s" % (" --nonblocking" * opts.nonblocking, opts.timeout,
                                                    item["state_after"] or "gone",
                                                    " (hangscope resumed it)" if item["resumed"] else ""))
        return
    sudo_err = runas.sudo_error(stderr) if opts.sudo else None
    if sudo_err:
        item["error"] = error_dict("sudo_password", sudo_err)
        return
    traces = None
    if res.returncode == 0:
        try:
            traces = json.loads(res.stdout.decode("utf-8", "replace"))
        except ValueError:
            traces = None
    if traces is None:
        if not os.path.exists("/proc/%d" % pid):
            item["error"] = error_dict("target_exited", "pid %d exited during the dump" % pid)
        else:
            code, message = classify(stderr or res.stdout.decode("utf-8", "replace"), pid)
            item["error"] = error_dict(code, message)
        return
    _redact_locals(traces)
    item["pyspy"], item["ok"] = traces, True
    if opts.loops or opts.source_context >= 0:
        item["loops"], item["source"] = loopinfo.annotate(pid, _frames(traces), opts.source_context,
                                                          in_container=other_ns, want_loops=opts.loops)
    if opts.locals:  # the module-level loop counters py-spy cannot show: globals of __main__ (after the dump)
        for local in pyglobals.add(req, pid, traces, item, other_ns):
            _redact_local(local)
        _polled_paths(req, pid, traces, item)


def _polled_paths(req: Request, pid: int, traces: Any, item: DumpItem) -> None:
    """Who writes the files a sleeping poll loop names (kwait.polled_paths), never failing the dump."""
    try:
        action = kwait.polled_paths(req.shared, pid, item["procfs"].get("threads") or [], traces)
    except Exception as exc:  # a bug there must not fail the dump
        item["notes"].append("the files a polling thread names were not looked up: %s: %s"
                             % (type(exc).__name__, str(exc)[:300]))
        return
    if action:
        item["actions"].append(action)


def _stop_letters(item: DumpItem) -> bool:
    """The state letters read so far say stopped (T) or in a tracing stop (t), for the process or a thread."""
    threads = item["procfs"].get("threads") or []
    return item["state_before"] in ("T", "t") or any(isinstance(t, dict) and t.get("state") in ("T", "t")
                                                     for t in threads)


def _kernel_waits(req: Request, pid: int, item: DumpItem) -> None:
    """What each blocked thread waits on and who is at the other end (workers/collect/kwait.py: /proc only, and
    memory only of a process nothing holds), before any tool touches the process."""
    try:
        action = kwait.annotate(req.shared, pid, item["procfs"]["threads"], item.get("process"))
    except Exception as exc:  # a bug there must not fail the dump
        item["notes"].append("what the blocked threads wait on was not read: %s: %s" % (type(exc).__name__,
                                                                                    str(exc)[:300]))
        return
    if action:
        item["actions"].append(action)


def _run(req: Request, tool: Any, pid: int, nspid: Optional[int], other_ns: bool, flags: List[str],
         opts: DumpOptions, item: DumpItem) -> Any:
    # a failure message, not a Rust backtrace (the worker sets it for all its children at start; copying the
    # environment for each dump costs more than the dump's own bookkeeping)
    env = None if os.environ.get("RUST_BACKTRACE") == "0" else dict(os.environ, RUST_BACKTRACE="0")
    if other_ns and nspid is not None:
        # From outside a container py-spy misreports idle threads and --native fails (UNW_EBADREG): enter
        # its pid and mount namespaces; the binary goes along as an fd, it need not exist in there. Not
        # through `nsenter -p`: the tool would be nsenter's forked child, which outlives a killed worker
        # (workers/collect/nsexec.py).
        if not opts.sudo:
            path, fds = tool.exec_path(inside_ns=True)
            argv = [path, "dump", "--json", "--pid", str(nspid)] + flags
            try:
                res = req.run(argv, opts.timeout, pass_fds=fds, env=env, max_stdout=32 << 20, enter_ns=pid)
                err = res.stderr.decode("utf-8", "replace")
            except OSError as exc:  # its namespaces are gone, or this python has no setns
                res, err = None, "nsexec: %s" % exc
            if res is not None and children.entered(res.returncode, err):
                return res
            item["notes"].append("could not enter the target's namespaces (%s); dumped from outside, idle "
                                 "threads may show as active" % err.strip()[:200])
        else:
            item["notes"].append("target runs in other namespaces; dumped from outside (nsenter is not used "
                                 "with sudo)")
    path, fds = tool.exec_path(inside_ns=False)
    argv = runas.prefix(req, opts.sudo) + [path, "dump", "--json", "--pid", str(pid)] + flags
    # A --nonblocking dump never attaches (nothing to leave stopped if the worker died) and ends by itself:
    # it starts without setpriv in front.
    return req.run(argv, opts.timeout, pass_fds=fds, env=env, max_stdout=32 << 20, pdeathsig=not opts.nonblocking)
