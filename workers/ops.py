"""The op handlers: each takes a Request, streams items, and returns the done data (or raises OpError)."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

    from workers.protocol import CollectDone, DetailDone, DiscoverDone, DumpDone, DumpItem, PingDone, PushToolDone
    from workers.protocol import RetireDone

from workers import compact as compaction
from workers import discover as discovery
from workers import patterns, procinfo, pstate
from workers.collect import flight, gpu_evidence, gpus, output, pgstore, pgtimeout, progress, pyspy, runas, sockets
from workers.collect import traced
from workers.hello import cpu_count
from workers import protocol
from workers.protocol import MATCH_LIMIT, error_dict
from workers.request import Cancelled, OpError, Request


def ping(req: Request) -> PingDone:
    return {"pong": True, "time": time.time()}


def retire(req: Request) -> RetireDone:
    """End an earlier worker of this session whose connection was lost (a cut link never delivers its EOF, so it
    would wait for requests until the node's sshd noticed, which may be never). Only a process of this worker's
    user running this worker's very command line (the session's first stage, its options included) is ended:
    never a rank, never another session's worker."""
    pid = req.arg_int("pid", required=True) or 0
    if pid <= 1 or pid == os.getpid():
        return {"retired": False, "why": "not an earlier worker"}
    try:
        mine = procinfo.read_file("/proc/self/cmdline")
        theirs = procinfo.read_file("/proc/%d/cmdline" % pid)
        uid = os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return {"retired": False, "why": "gone"}
    if uid != os.getuid() or not mine or theirs != mine:
        return {"retired": False, "why": "not a worker of this session"}
    try:
        os.kill(pid, signal.SIGTERM)  # a worker has no handler: it ends; its tools die with their timeouts
    except OSError as exc:
        return {"retired": False, "why": str(exc)}
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    return {"retired": True, "why": "ended with SIGTERM"}


def _alive(pid: int) -> bool:
    try:
        return procinfo.stat_fields(pid)[2] not in ("Z", "X")
    except (procinfo.Gone, OSError, IndexError):
        return False


def push_tool(req: Request) -> PushToolDone:
    name = req.arg_str("name")
    if name not in ("py-spy", "strace", "gdb"):
        raise OpError("bad_request", "push_tool: %r is not a tool hangscope pushes" % name)
    import base64
    import binascii

    try:
        data = base64.b64decode(req.arg_str("data_b64"), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise OpError("bad_request", "push_tool: data_b64 is not base64: %s" % exc)
    try:
        tool = req.worker.tools.push(name, data, req.arg_str("sha256"))
    except ValueError as exc:
        raise OpError("bad_request", "push_tool: %s" % exc)
    except OSError as exc:
        raise OpError("tool_failed", "push_tool: cannot store %s on this node: %s" % (name, exc))
    return {"name": name, "path": tool.path}


def discover(req: Request) -> DiscoverDone:
    return _discover(req, req.item)


def _discover(req: Request, emit: Callable[[Dict[str, Any]], None]) -> DiscoverDone:
    """Find the node's ranks (or exactly `pids`), emit each with its GPUs and TCP sockets; the done data."""
    pids = req.arg_list("pids")
    if pids is not None and not all(isinstance(p, int) and not isinstance(p, bool) for p in pids):
        raise OpError("bad_request", "discover: pids must be integers")
    match = req.args.get("match")
    timeouts = req.arg_bool("timeouts")
    pattern = None
    if match is not None:
        if not isinstance(match, str) or not 0 < len(match) <= MATCH_LIMIT:
            raise OpError("bad_request", "discover: match must be a regular expression of 1 to %d characters"
                          % MATCH_LIMIT)
        why = patterns.problem(match)  # the login side refused these already; a request is checked here too
        if why is not None:
            raise OpError("bad_request", "discover: " + why)
        pattern = re.compile(match)
    notes: list = []
    read_denied = (lambda denied: runas.read_environs(req, denied, notes)) if req.sudo else None
    worker = req.worker
    with worker.lock:
        if worker.proc_cache is None:
            worker.proc_cache = discovery.ProcCache()
        if worker.proc_source is None:
            # /proc by default: the same facts (tests/test_worker_discover.py compares the two) for a quarter
            # of psutil's reads and without its ~13 ms import on every worker start; psutil on request.
            worker.proc_source = procinfo.source(prefer_psutil=bool(worker.options.get("psutil")))
    # One scan at a time shares the cache (a second discover meanwhile reads everything itself).
    cache = worker.proc_cache if worker.scan_lock.acquire(blocking=False) else None
    try:
        scan = discovery.Scan(worker.proc_source, read_denied=read_denied, cache=cache)
        ranks = scan.ranks(pids, match=pattern)
    finally:
        if cache is not None:
            worker.scan_lock.release()
    req.check()
    notes += scan.notes
    # nvidia-smi costs more than the rest of a sample together: the watch's cheap samples leave it out
    want_gpus = req.arg_bool("gpus", True)
    use = gpus.query_cached(req, notes, {(r["pid"], r["start_time"]) for r in ranks}) if ranks and want_gpus else {}
    ss_by_ns: Dict[str, Any] = {}
    tcp_by_ns: Dict[str, Any] = {}  # the ranks of a node usually share one network namespace
    own_netns = procinfo.namespace(os.getpid(), "net")
    for rank in ranks:
        rank["gpus"] = use.get(rank["pid"], [])
        netns = procinfo.namespace(rank["pid"], "net") or ""
        if netns not in tcp_by_ns:
            # ours: one netlink dump has every socket with its details; otherwise /proc/PID/net/tcp + ss there
            table = sockets.netlink_table() if netns and netns == own_netns else None
            if table is not None:
                ss_by_ns[netns], tcp_by_ns[netns] = {}, table
            else:
                ss_by_ns[netns] = _ss(req, rank["pid"], netns)
                tcp_by_ns[netns] = sockets.tcp_table(rank["pid"]) if netns else None  # unknown: read per rank
        rank["sockets"] = sockets.for_pid(rank["pid"], ss_by_ns[netns], tcp_by_ns[netns])
        rank["counters"] = progress.collect(rank["pid"])  # what moves between samples (slow vs stuck)
        written = output.collect(rank["pid"], rank.get("env") or [])  # its recent error output, if readable
        if written:
            rank["output"] = written
        if timeouts:  # the process-group timeout its script sets, read from the file (hangscope watch)
            found = pgtimeout.for_pid(rank["pid"], bool(rank.get("in_container")))
            if found is not None:
                rank["pg_timeout"] = found
        emit(rank)
    done: DiscoverDone = {"count": len(ranks), "scanned": len(scan.procs), "unreadable": scan.unreadable,
                          "notes": notes, "processes": scan.processes, "time": time.time()}
    done["worker_cpu"], sshd = own_cpu()
    if sshd is not None:
        done["sshd_cpu"] = sshd
    return done


def own_cpu() -> Tuple[float, Optional[float]]:
    """What this worker has cost the node so far, in CPU seconds: itself and the tools it ran and reaped, and the
    sshd process that carries its channel (None unless one is its ancestor and readable): `hangscope watch`
    reports its own cost per node from the difference between samples."""
    t = os.times()
    mine = round(t.user + t.system + t.children_user + t.children_system, 4)
    sshd: Optional[float] = None
    pid = os.getppid()
    for _ in range(4):  # the sshd session process, above a login shell that did not exec python
        if pid <= 1:
            break
        try:
            fields = procinfo.stat_fields(pid)
        except (procinfo.Gone, OSError):
            break
        if len(fields) < 15:
            break
        if fields[1].startswith("sshd"):
            try:
                sshd = round((int(fields[13]) + int(fields[14])) / procinfo.CLK_TCK, 4)
            except ValueError:
                pass
            break
        try:
            pid = int(fields[3])
        except ValueError:
            break
    return mine, sshd


def _ss(req: Request, pid: int, netns: str) -> Dict[Any, Any]:
    """`ss -tin` details in the network namespace of pid (entered with nsenter when it is not ours)."""
    ss, _ = req.worker.tools.find("ss")
    if ss is None:
        return {}
    argv = [ss.path, "-tinHn"]
    if netns and netns != procinfo.namespace(os.getpid(), "net"):
        nsenter, _ = req.worker.tools.find("nsenter")
        if nsenter is None:
            return {}
        argv = [nsenter.path, "-t", str(pid), "-n", "--"] + argv
    try:
        res = req.run(argv, 3.0, max_stdout=16 << 20)
    except OSError:
        return {}
    if res.returncode != 0:
        return {}
    return sockets.parse_ss(res.stdout.decode("utf-8", "replace"))


def dump(req: Request) -> DumpDone:
    """py-spy on every target concurrently (bounded), one item per target as soon as it is done."""
    targets = []
    for t in req.arg_list("targets") or []:
        pid = t.get("pid") if isinstance(t, dict) else None
        st = t.get("start_time") if isinstance(t, dict) else None
        if isinstance(pid, bool) or not isinstance(pid, int) or not (st is None or isinstance(st, int)):
            raise OpError("bad_request", "dump: each target needs an integer pid and start_time, got %r" % (t,))
        targets.append((pid, st))
    return _dump(req, targets, req.item)


def collect(req: Request) -> CollectDone:
    """discover, then dump what it found, in one request: a refresh costs one round trip and the dumps start
    the moment discovery ends. Items: {"rank": <discover item>}, then one {"discovered": <discover's done
    data>}, then {"dump": <dump item>} per rank; done: {"discover": ..., "dump": ...}. Arguments: discover's
    and dump's (without targets)."""
    found: List[Tuple[int, Optional[int]]] = []

    def rank(item: Dict[str, Any]) -> None:
        found.append((item["pid"], item["start_time"]))
        req.item({"rank": item})

    discovered = _discover(req, rank)
    req.item({"discovered": discovered})
    # Held (a cold pass of several nodes): the dumps wait for the login side's `go`, sent once every node has
    # discovered, so that they start together while discovery still overlaps the other nodes' connections.
    hold = min(req.arg_float("hold", 0.0), MAX_HOLD)
    if hold > 0 and found:
        req.released.wait(hold)
    req.check()
    procs = discovered.get("processes") or []
    children: Dict[int, List[Tuple[int, Optional[int]]]] = {}  # rank pid -> its python children, dumped when the rank's stack waits on them
    for p in procs:
        if p["role"] == "child" and p["python"] and p["of"]:
            children.setdefault(p["of"][0], []).append((p["pid"], p["start_time"]))
    extra: "queue.Queue[Tuple[int, Optional[int]]]" = queue.Queue()

    compact = req.arg_bool("compact")
    all_locals = req.arg_bool("all_locals")
    if compact:
        with req.worker.lock:  # only this pass's processes are kept for `detail`
            req.worker.details = {}

    def ranked(item: DumpItem) -> None:
        waits = waits_on_children(item.get("pyspy"))  # before the item goes out: replies are redacted in place
        if compact:
            with req.worker.lock:  # the dump threads of this request share the connection's stack table
                small, new = compaction.split(dict(item), req.worker.stacks_sent, all_locals)
                req.worker.details[item.get("pid") or 0] = item
            if new:
                req.item({"stacks": new})
            req.item({"dump": small})
        else:
            req.item({"dump": item})
        pid = item.get("pid")
        if waits and pid is not None:
            for target in children.get(pid, [])[:MAX_CHILD_DUMPS]:
                extra.put(target)

    gpu = _gpu_evidence_start(req, found)
    dumped = _dump(req, found, ranked)
    # what the job's other processes do matters when no rank exists yet (launchers with no rank below them: a
    # rendezvous that waits) or when a rank waits on
    # them (its children): dumped after the ranks, under the same rules (state first, deadlines)
    more = [(p["pid"], p["start_time"]) for p in procs if p["role"] == "launcher" and p["python"] and not p["of"]]
    while not extra.empty():
        more.append(extra.get_nowait())
    if more:
        req.check()
        dumped["processes"] = _dump(req, more[:MAX_PROCESS_DUMPS], lambda item: req.item({"process_dump": item}))
    if gpu is not None:
        evidence = gpu_evidence.finish(*gpu)
        if evidence is not None:
            req.item({"gpu_evidence": evidence})
    return {"discover": discovered, "dump": dumped}


MAX_HOLD = 10.0  # seconds a collect's dumps may wait for `go`
MAX_CHILD_DUMPS = 8  # per rank
MAX_PROCESS_DUMPS = 32  # per node and pass
# Where a rank waits for its own children: a DataLoader's result queue, a subprocess, a process pool.
_CHILD_WAITS = (("torch/utils/data/dataloader.py", ("_try_get_data", "_get_data", "_next_data")),
                ("subprocess.py", ("wait", "_wait", "communicate", "_communicate", "_try_wait")),
                ("multiprocessing/pool.py", ("get", "wait", "map", "starmap")),
                ("concurrent/futures/_base.py", ("result", "wait", "as_completed")),
                ("multiprocessing/popen_fork.py", ("wait", "poll")))


def waits_on_children(traces: Any) -> bool:
    """A rank's py-spy dump shows its main thread (or any thread) waiting for a child process's work."""
    for thread in traces if isinstance(traces, list) else []:
        for frame in (thread.get("frames") or [])[:40] if isinstance(thread, dict) else []:
            filename, function = frame.get("filename") or "", frame.get("name") or ""
            if not isinstance(filename, str) or not isinstance(function, str):
                continue
            function = function.rsplit(".", 1)[-1]  # py-spy >= 0.4 qualifies methods: Class.method
            if any(filename.endswith(f) and function in names for f, names in _CHILD_WAITS):
                return True
    return False


def _gpu_evidence_start(req: Request, found: List[Tuple[int, Optional[int]]]) -> Optional[tuple]:
    """GPU evidence (workers/collect/gpu_evidence.py) in a thread beside the dumps, when asked for: args
    "gpu_evidence" auto (an NCCL/CUDA job) | on | off, and "ras" (this node asks NCCL's RAS service)."""
    mode = req.args.get("gpu_evidence", "off")
    if mode not in gpu_evidence.MODES or mode == "off":
        return None
    cache = req.worker.proc_cache
    envs = [cache.environ(pid, st) if cache is not None else None for pid, st in found]
    started = time.monotonic()
    thread, box = gpu_evidence.start(req, [pid for pid, _ in found], envs, mode, req.args.get("ras") is True)
    return thread, box, started


def _dump(req: Request, targets: List[Tuple[int, Optional[int]]],
          emit: Callable[[DumpItem], None]) -> DumpDone:
    started = time.monotonic()
    opts = pyspy.DumpOptions(req)
    todo: "queue.Queue[tuple]" = queue.Queue()
    for target in targets:
        todo.put(target)
    workers = min(len(targets), req.arg_int("concurrency") or cpu_count()) or 1

    def work() -> None:
        while not req.cancelled.is_set():
            try:
                pid, st = todo.get_nowait()
            except queue.Empty:
                return
            try:
                item = pyspy.dump(req, pid, st, opts)
            except Cancelled:
                return
            except Exception as exc:  # a bug on one target must not lose the others: report it on this one
                item = {"pid": pid, "start_time": st, "ok": False,
                        "error": error_dict("internal", "%s: %s" % (type(exc).__name__, exc))}
            cache = req.worker.proc_cache
            env = cache.environ(pid, st) if cache is not None else None  # read at discovery, same process
            hold = item.get("process") or {}
            # None unless the rank enables the Flight Recorder; a held rank's worker server is not asked
            item["flight"] = flight.collect(pid, env=env, held=hold.get("kind", "") if pstate.held(hold) else "")
            emit(item)

    threads = [threading.Thread(target=work, name="dump-%d-%d" % (req.id, i), daemon=True)
               for i in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    req.check()
    return {"count": len(targets), "elapsed": round(time.monotonic() - started, 4)}


def store_ranks(req: Request) -> Dict[str, Any]:
    """Which of the given listening addresses the job's store names as which rank (workers/collect/pgstore.py),
    asked from the network namespace of `pid`, a rank that holds a connection to that store."""
    store = req.arg_str("store")
    listeners = req.arg_list("listeners") or []
    pid = req.arg_int("pid", required=True)
    if len(store) > 300 or not all(isinstance(x, str) and len(x) <= 300 for x in listeners) \
            or len(listeners) > pgstore.MAX_LISTENERS:
        raise OpError("bad_request", "store_ranks: store and listeners are addresses (at most %d)"
                      % pgstore.MAX_LISTENERS)
    theirs = procinfo.namespace(pid, "net") if pid else None
    if theirs is None:
        raise OpError("target_exited", "store_ranks: process %s is gone" % pid)
    if theirs != procinfo.namespace(os.getpid(), "net"):
        raise OpError("store_unreadable", "store_ranks: the rank runs in another network namespace (a container): "
                                     "its store is not reachable from here")
    timeout = min(req.arg_float("timeout", 2.0), 10.0)
    started = time.monotonic()
    try:
        out = pgstore.read_ranks(store, listeners, timeout, list_keys=req.arg_bool("list_keys", True))
    except pgstore.StoreError as exc:
        raise OpError("store_unreadable", "store_ranks: %s: %s" % (store, exc))
    except socket.timeout:
        raise OpError("store_unreadable", "store_ranks: %s: no answer within %.1f s" % (store, timeout))
    except OSError as exc:
        raise OpError("store_unreadable", "store_ranks: %s: %s" % (store, exc.strerror or exc))
    out["elapsed"] = round(time.monotonic() - started, 4)
    return out


def detail(req: Request) -> DetailDone:
    """The last full dump item a compact collect kept of this process (every local), for the TUI's rank view."""
    pid = req.arg_int("pid", required=True) or 0
    start_time = req.arg_int("start_time")
    with req.worker.lock:
        item = req.worker.details.get(pid)
    if item is None or (start_time is not None and item.get("start_time") not in (None, start_time)):
        raise OpError("target_exited", "detail: no dump of pid %s from this worker's last pass" % pid)
    return {"dump": item}


def strace(req: Request) -> Dict[str, Any]:
    return traced.strace(req)


def gdb(req: Request) -> Dict[str, Any]:
    return traced.gdb(req)


# Under the names of workers/protocol.py's ops (go, cancel and shutdown are the server's own: workers/server.py).
HANDLERS: Dict[str, Callable[[Request], Mapping[str, Any]]] = {
    protocol.COLLECT.name: collect,
    protocol.DUMP.name: dump,
    protocol.STRACE.name: strace,
    protocol.GDB.name: gdb,
    protocol.DETAIL.name: detail,
    protocol.DISCOVER.name: discover,
    protocol.STORE_RANKS.name: store_ranks,
    protocol.PING.name: ping,
    protocol.RETIRE.name: retire,
    protocol.PUSH_TOOL.name: push_tool,
    **__import__("workers.ops_gpu", fromlist=["HANDLERS"]).HANDLERS,  # GPU tests: workers/ops_gpu.py
}
