"""Who can end a wait: for each ThreadWait, the threads, processes, ranks, hosts or people that could release it.

Each wait site names a rule (sites.Release); this module follows it over what the snapshot holds:

- holder: the thread of the same process inside a `with` block of the same lock (locks.held), which can be the
  waiter itself lower on its own stack (a self-deadlock: a non-reentrant lock taken twice); for a lock taken
  with acquire(), else the thread whose code in view calls release() on that object (a hand-off, "releaser");
- notifier / producer / consumer: the other threads of the process that run Python (none: nobody can);
- joined: the joined thread, matched by the Thread object's address in both stacks;
- worker: the executor's or pool's workers (threads in concurrent.futures' `_worker` running a call, or child
  processes), busy ones first (all idle, or none alive: nobody runs the call);
- children: the process's children (Snapshot.processes), with their state and their own stacks;
- peer: the socket's other end, from what the node read of the call's file descriptor (ThreadStack.waits): a
  rank of the job, a process on the same node, or a host outside the job;
- writer / reader / lock_holder: the processes the node found holding the pipe's other end or the file lock;
- person: a debugger or a terminal waits for someone to type;
- time / itself: a sleep ends by itself (in a loop, what the loop polls for decides); a spin, by its condition.

Collectives and point-to-point calls are the wait graph's (the ranks not in the collective; the p2p peer).
Everything is bounded: at most MAX_PARTIES parties a wait, chains at most MAX_CHAIN long.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Literal, Optional, Sequence, Set, Tuple

from app.analysis.blocking import MAX_LINE, Motion, ThreadWait, importing, innermost_own, line_text, thread_wait
from app.analysis.frames import group_arg, is_library
from app.analysis.locks import LockKey, held
from app.model import Frame, JobProcess, KernelWait, OtherEnd, RankSnapshot, ThreadStack

PartyKind = Literal["thread", "process", "rank", "host", "person", "time", "itself", "kernel", "device", "ranks"]
# Why a wait has no party: the answer itself ("nobody can"), or what was not known
NoneReason = Literal[
    "", "no_other_thread", "no_related_thread", "no_holder", "no_writer", "no_reader", "no_worker", "workers_idle", "no_child",
    "no_holder_process", "not_read", "search_incomplete", "unknown_rule",
    "inherited",  # the child has exited and the pipe it wrote is still open: a process it started holds it
    "forked_held",  # a forked child waits for a lock no thread of its own holds, and none of its parent's does now
    "clients_exited",  # an accept nobody connected to, while every process the rank started has exited
    "no_loop",  # a coroutine's future (run_coroutine_threadsafe) and no thread runs an asyncio event loop
    "undone",  # Queue.join, and every consumer waits for the next item of that queue: a task_done() is missing
    "forked_no_workers",  # a forked child waits for an executor's future and no thread of its own is a worker
    "starved",  # a pool's worker waits for a task of its pool while every other worker does too
    "loop_alone",  # an idle asyncio loop, no timer, watching only its own wake-up socket; no other Python thread
    "loop_unread",  # an idle asyncio loop, no timer, no other Python thread; what it watches was not read
    "loop_untied",  # ... watching only its own wake-up socket; other Python threads, none holding the loop
    "loop_untied_unread",  # ... what it watches not read; other Python threads, none holding the loop
    "shared_lock",  # no thread holds it, and its futex is shared between processes (a named semaphore, shared memory)
]
MAX_PARTIES = 6
MAX_CHAIN = 6
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


@dataclass(frozen=True)
class Party:
    """Someone who can end a wait, and what it does itself."""

    kind: PartyKind
    node: str = ""
    pid: Optional[int] = None
    tid: Optional[int] = None
    rank: Optional[int] = None
    name: str = ""  # a thread's name, a process's command (remote text: the text layer cleans it)
    address: str = ""  # a socket peer's address
    role: str = ""  # holder, worker, child, writer, reader, listener, peer, lock_holder, joined, thread, person
    state: str = ""  # what holds it: stopped, frozen, zombie, disk, traced ("" when nothing does)
    exit: str = ""  # a zombie's end: "killed by SIGKILL", "exited with 1"
    main: bool = False  # the main thread of its process
    wait: Optional[ThreadWait] = None  # what it waits for itself, when its stack is known
    same: bool = False  # the waiter itself (a self-deadlock)
    what: str = ""  # a process's kind beside the ranks: "data-loader worker", "subprocess"
    # a child asleep reading a pipe (its input): the processes holding that pipe's write end (role "feeder"), whose
    # closing alone gives it the end of its input; `reads`: that pipe ("pipe:[N]")
    feeders: Tuple["Party", ...] = ()
    reads: str = ""
    # the pipe it reads is its standard input (fd 0), and the node's whole search found no process of the node
    # holding its write end (that is outside the node: the job's own input, an ssh or srun session)
    stdin: bool = False
    reading: bool = False  # a socket's peer asleep reading its own end of the same connection (OtherEnd.reading)


@dataclass(frozen=True)
class Release:
    """Who can end one wait: parties (busiest and surest first), or none and why."""

    parties: Tuple[Party, ...] = ()
    none: NoneReason = ""
    complete: bool = True  # False: the search was bounded before its end

    @property
    def nobody(self) -> bool:
        """It was looked for and no one can: the answer itself."""
        return not self.parties and self.none in ("no_other_thread", "no_related_thread", "no_holder", "no_writer",
                                                  "no_reader",
                                                  "no_worker", "workers_idle", "no_child", "no_holder_process",
                                                  "forked_held", "no_loop", "forked_no_workers", "loop_alone")


@dataclass
class Context:
    """What release rules read beyond the thread itself: its process, the processes beside the ranks, the job's
    ranks by address, and how each thread moved between samples."""

    rank: RankSnapshot
    processes: Sequence[JobProcess] = ()
    rank_at: Dict[str, RankSnapshot] = field(default_factory=dict)  # "ip:port" a rank uses -> that rank
    node_of: Dict[str, str] = field(default_factory=dict)  # ip -> node, for peers that are nodes of the snapshot
    motion: Callable[[ThreadStack], Optional[Motion]] = lambda t: None
    ranks: Dict[Tuple[str, int], RankSnapshot] = field(default_factory=dict)  # (node, pid) -> the job's rank there
    _waits: Dict[int, ThreadWait] = field(default_factory=dict)

    def wait_of(self, t: ThreadStack) -> ThreadWait:
        w = self._waits.get(t.tid)
        if w is None:
            w = self._waits[t.tid] = thread_wait(t, self.rank.hold, self.motion(t))
        return w


def _python_thread(t: ThreadStack) -> bool:
    return any(not f.native for f in t.frames)


def _thread_party(ctx: Context, t: ThreadStack, role: str, same: bool = False) -> Party:
    r = ctx.rank
    return Party("thread", r.node, r.pid, t.tid, r.rank, t.name, role=role, main=t.is_main,
                 wait=None if same else ctx.wait_of(t), same=same)


def _busy(p: Party) -> bool:
    """A party that is itself stuck or working (not idle waiting for work)."""
    return p.wait is not None and p.wait.operation not in ("executor worker idle", "process pool worker idle",
                                                         "pool worker idle")


def release(wait: ThreadWait, thread: ThreadStack, ctx: Context) -> Release:
    """Who can end this wait of `thread` (a thread of ctx.rank)."""
    rule = wait.release
    if rule == "holder":
        return _holder(wait, thread, ctx)
    if rule in ("notifier", "producer", "consumer"):
        if wait.resource in ("process_queue", "pool"):
            return _children(ctx, wait, role="producer")
        if wait.operation == "queue.Queue.join":
            return _joined_queue(wait, thread, ctx)
        return _related_threads(wait, thread, ctx, role=rule)
    if rule == "threads":
        return _other_threads(thread, ctx, role="thread", non_daemon=True)
    if rule == "importer":
        module = wait.detail("module")
        parties = [_thread_party(ctx, t, "importer") for t in ctx.rank.threads
                   if t.tid != thread.tid and module and module in importing(t, holding=True)]
        return Release(tuple(parties[:MAX_PARTIES]), "" if parties else "no_holder")
    if rule == "joined":
        return _joined(wait, thread, ctx)
    if rule == "worker":
        if _submitted_to_loop(wait):
            return _loop_threads(thread, ctx)
        return _workers(wait, thread, ctx)
    if rule == "children":
        # the node's own read of the wait (the pid it waits for, zombies with their signal) first, then the
        # children discovery found beside the ranks (with their stacks)
        found = _children(ctx, wait, role="child")
        kernel = _other_end(wait, thread, ctx, "children") if thread.waits is not None else Release(none="not_read")
        if kernel.parties and (not found.parties or any(p.state for p in kernel.parties)):
            stacks = {p.pid: p for p in found.parties}
            return Release(tuple(replace(p, wait=stacks[p.pid].wait, what=stacks[p.pid].what) if p.pid in stacks
                                 else p for p in kernel.parties), complete=kernel.complete)
        if found.parties:
            # what only the node's read of the wait says of a child (the pipe it reads and who holds its write end)
            fed = {p.pid: p for p in kernel.parties if p.feeders or p.reads}
            return replace(found, parties=tuple(replace(p, feeders=fed[p.pid].feeders, reads=fed[p.pid].reads,
                                                        stdin=fed[p.pid].stdin)
                                                if p.pid in fed else p for p in found.parties))
        return kernel
    if rule == "output":
        return _output(wait, thread, ctx)
    if rule == "peer" and _accepting(wait, thread):
        return _clients(wait, thread, ctx)
    if rule in ("peer", "writer", "reader", "lock_holder"):
        return _other_end(wait, thread, ctx, rule)
    if rule == "tasks":
        return _event_loop(wait, thread, ctx)
    if rule == "person":
        return Release((Party("person", role="person"),))
    if rule == "time":
        return Release((Party("time", role="time"),))
    if rule == "itself":
        return Release((Party("itself", ctx.rank.node, ctx.rank.pid, thread.tid, ctx.rank.rank, thread.name,
                              role="itself", main=thread.is_main),))
    if rule == "kernel":
        return Release((Party("kernel", ctx.rank.node, role="kernel"),))
    if rule == "device":
        return Release((Party("device", ctx.rank.node, role="device"),))
    return Release(none="unknown_rule")


def _lock_key(wait: ThreadWait) -> Optional[LockKey]:
    obj = wait.detail("object")
    at = wait.frame if wait.site is not None and wait.site.operation == "with-statement lock" else wait.caller
    if not obj or at is None:
        return None
    return (at.filename, obj)


# Library code that takes an object's lock with acquire() and gives it back in a `finally` (no `with` block to
# read): (file suffix, function, the call its frame is in while it holds the lock). The lock is its `self`'s.
_HOLDING_CALLS = (("logging/__init__.py", "Handler.handle", "self.emit("),  # a handler's lock while it emits
                  ("logging/__init__.py", "Handler.flush", "self.stream.flush("),
                  ("logging/__init__.py", "StreamHandler.flush", "self.stream.flush("))
# ... and where a thread waits for that lock: (file suffix, function)
_ACQUIRING = (("logging/__init__.py", "Handler.acquire"),)


def _holds_by_call(t: ThreadStack, owner: str) -> bool:
    """Whether a thread is inside library code that holds the lock of the object at `owner` (_HOLDING_CALLS)."""
    for f in t.frames:
        if f.native or _self_address(f) != owner:
            continue
        line = line_text(f)
        if any(f.filename.endswith(suffix) and f.function == name and call in line
               for suffix, name, call in _HOLDING_CALLS):
            return True
    return False


def _holder(wait: ThreadWait, thread: ThreadStack, ctx: Context) -> Release:
    key = _lock_key(wait)
    if key is None:
        return Release(none="no_holder")
    parties = []
    if key in held(thread):
        parties.append(_thread_party(ctx, thread, "holder", same=True))
    for t in ctx.rank.threads:
        if t.tid != thread.tid and key in held(t):
            parties.append(_thread_party(ctx, t, "holder"))
    f = wait.frame
    if not parties and f is not None and any(f.filename.endswith(s) and f.function == n for s, n in _ACQUIRING):
        owner = _self_address(f)
        parties += [_thread_party(ctx, t, "holder") for t in ctx.rank.threads
                    if t.tid != thread.tid and owner and _holds_by_call(t, owner)]
    if not parties and wait.site is not None and wait.site.operation.endswith(".acquire") and wait.caller is not None:
        # taken with acquire(), given back by another thread's explicit release() (a lock used as a hand-off
        # between threads: "released by the writer when it is done"): the thread whose code in view releases
        # that very object is the one that would
        obj = wait.detail("object")
        parties += [_thread_party(ctx, t, "releaser") for t in ctx.rank.threads
                    if t.tid != thread.tid and releasing_frame(t, obj, wait.caller) is not None]
    if not parties and shared_futex(thread):
        # the futex lies in memory other processes map: the holder may be one of them, or one that has ended
        return Release(none="shared_lock")
    return Release(tuple(parties[:MAX_PARTIES]), "" if parties else "no_holder")


def shared_futex(thread: ThreadStack) -> str:
    """The file a thread's futex lies in when the node read it as shared between processes ("" otherwise)."""
    w = thread.waits
    return w.path if w is not None and w.family == "futex" and w.path else ""


_RELEASE_CALL = re.compile(r"([A-Za-z_][A-Za-z_0-9.]*)\s*\.\s*release\s*\(")


def releasing_frame(t: ThreadStack, obj: str, at: Frame) -> Optional[Tuple[Frame, int]]:
    """(frame, line) of a thread's Python frame whose source in view calls `obj.release()` on the object the
    frame `at` acquires: `self._lock` only where both frames' `self` is the same object, a bare name only in the
    same file. None when the thread's frames do not."""
    if not obj:
        return None
    owner = _self_address(at) if obj.startswith("self.") else ""
    if obj.startswith("self.") and not owner:
        return None
    for g in t.frames:
        if g.native or not g.source or (owner and _self_address(g) != owner) or \
                (not owner and g.filename != at.filename):
            continue
        for n, text in g.source:
            code = text.split("#", 1)[0]
            if any(m.group(1).replace(" ", "") == obj for m in _RELEASE_CALL.finditer(code[:MAX_LINE])):
                return g, n
    return None


def _other_threads(thread: ThreadStack, ctx: Context, role: str, non_daemon: bool = False) -> Release:
    """The other threads of the process that run Python, busy ones first. `non_daemon`: the interpreter's
    shutdown waits only for non-daemon threads; daemon-ness is not in a stack, so every Python thread that is
    not the runtime's own (gloo's, the pin-memory thread, executor workers idle) counts."""
    others = [t for t in ctx.rank.threads if t.tid != thread.tid and _python_thread(t)]
    parties = [_thread_party(ctx, t, role) for t in others]
    if non_daemon:
        parties = [p for p in parties if p.wait is None or p.wait.caller is not None]
    parties.sort(key=lambda p: (not _busy(p), not (p.wait is not None and p.wait.caller is not None)))
    if not parties:
        return Release(none="no_other_thread")
    return Release(tuple(parties[:MAX_PARTIES]))


_ADDRESS_IN = re.compile(r" at (0x[0-9a-fA-F]+)>")


def _addresses(frames: Sequence[Frame]) -> Set[str]:
    return {m for f in frames for loc in f.locals for m in _ADDRESS_IN.findall(loc.repr)}


def _resource_objects(wait: ThreadWait) -> Set[str]:
    """The addresses of the objects a wait is on: the event, queue or condition itself (its site frame's
    `self`), and the object the job's code called it through (`lister.ready.wait()`: `lister`; `self.q.get()`:
    the caller's `self`)."""
    out: Set[str] = set()
    if wait.site is not None and wait.frame is not None:
        out |= {m for loc in wait.frame.locals if loc.name == "self" for m in _ADDRESS_IN.findall(loc.repr)}
    root = wait.detail("object").split(".", 1)[0]
    if root and wait.caller is not None:
        out |= {m for loc in wait.caller.locals if loc.name == root for m in _ADDRESS_IN.findall(loc.repr)}
    return out


def _related_threads(wait: ThreadWait, thread: ThreadStack, ctx: Context, role: str) -> Release:
    """Who could set an event, notify a condition, fill or drain a queue: the threads running code of the same
    object (one of their frames holds it: the event's owner, the queue), not any thread of the process. A signal
    handler's wait may be for the code it interrupted, lower on its own thread: that cannot run until the
    handler returns. With no thread on that object, whoever would release it has ended (or never started)."""
    objects = _resource_objects(wait)
    if not objects:  # any other thread might: none is tied to the object ("any")
        return _other_threads(thread, ctx, "any")
    parties: List[Party] = []
    if wait.handler is not None and wait.handler in thread.frames:
        below = thread.frames[thread.frames.index(wait.handler) + 1:]
        if objects & _addresses(below):
            parties.append(_thread_party(ctx, thread, "interrupted", same=True))
    for t in ctx.rank.threads:
        if t.tid != thread.tid and _python_thread(t) and objects & _addresses(t.frames):
            parties.append(_thread_party(ctx, t, role))
    if not parties:
        return Release(none="no_related_thread")
    return Release(tuple(parties[:MAX_PARTIES]))


def _self_address(f: Optional[Frame]) -> str:
    return next((m for loc in f.locals if loc.name == "self" for m in _ADDRESS_IN.findall(loc.repr)), "") \
        if f is not None else ""


def _joined_queue(wait: ThreadWait, thread: ThreadStack, ctx: Context) -> Release:
    """Queue.join waits until every item put has been marked done: its consumers (the threads on that queue). When
    every one of them waits in get() on the same queue, the queue is empty and still not every item was marked
    done: a task_done() call is missing (an item taken on a path that does not call it), "undone"."""
    rel = _related_threads(wait, thread, ctx, role="consumer")
    queue = _self_address(wait.frame)
    if queue and rel.parties and all(p.wait is not None and p.wait.operation == "queue.Queue.get"
                                     and _self_address(p.wait.frame) == queue for p in rel.parties):
        return Release(rel.parties, "undone")
    return rel


def _joined(wait: ThreadWait, thread: ThreadStack, ctx: Context) -> Release:
    """The thread whose Thread object the join's `self` names (the same address in its own bootstrap frame)."""
    frame = wait.frame
    me = next((loc.repr for loc in frame.locals if loc.name == "self"), "") if frame is not None else ""
    address = _ADDRESS.search(me)
    for t in ctx.rank.threads:
        if t.tid == thread.tid or address is None:
            continue
        for f in reversed(t.frames):  # the bootstrap frames are outermost
            if f.filename.endswith("threading.py") and any(loc.name == "self" and address.group() in loc.repr
                                                            for loc in f.locals):
                return Release((_thread_party(ctx, t, "joined"),))
    return _other_threads(thread, ctx, role="joined")


# The threads that run a pool's or a loader's work inside the process: (file suffix, function) of a frame on them
_WORKER_THREADS = (("concurrent/futures/thread.py", "_worker"),  # ThreadPoolExecutor's workers
                   ("torch/utils/data/_utils/pin_memory.py", "_pin_memory_loop"),  # DataLoader's pin-memory thread
                   ("multiprocessing/pool.py", "worker"))  # multiprocessing.pool.ThreadPool's workers


# ... of those, the ones that serve a DataLoader
_LOADER_THREADS = (("torch/utils/data/_utils/pin_memory.py", "_pin_memory_loop"),)


def _has_frame(t: ThreadStack, table: Tuple[Tuple[str, str], ...]) -> bool:
    """Whether a thread has a frame of one of `table`'s (file suffix, function) pairs."""
    return any(f.filename.endswith(suffix) and f.function.rsplit(".", 1)[-1] == name
               for f in t.frames for suffix, name in table)


def _worker_thread(t: ThreadStack, kinds: Tuple[Tuple[str, str], ...] = _WORKER_THREADS) -> bool:
    return _has_frame(t, kinds)


def _pool_of(t: ThreadStack) -> str:
    """Which ThreadPoolExecutor a worker thread serves: its `_worker` frame's work queue's address ("" unread)."""
    for f in t.frames:
        if f.function == "_worker" and f.filename.endswith("concurrent/futures/thread.py"):
            return next((m for loc in f.locals if loc.name == "work_queue" for m in _ADDRESS_IN.findall(loc.repr)), "")
    return ""


def _workers(wait: ThreadWait, thread: ThreadStack, ctx: Context) -> Release:
    """Executor, pool or loader workers: the threads that run their work (busy ones first: running a call), else
    the process's children (a process pool, DataLoader workers). A thread that is neither is never taken for one:
    with no worker alive, nobody runs the call. A DataLoader's batches come from its own workers (its worker
    processes, its pin-memory thread), never from a thread pool the job runs beside it."""
    loader = wait.resource == "process_queue"
    kinds = _LOADER_THREADS if loader else _WORKER_THREADS
    workers = [t for t in ctx.rank.threads if t.tid != thread.tid and _worker_thread(t, kinds)]
    if workers:
        parties = [_thread_party(ctx, t, "worker") for t in workers]
        busy = [p for p in parties if _busy(p)]
        if not busy:
            return Release(tuple(parties[:MAX_PARTIES]), "workers_idle")
        pool = _pool_of(thread)
        mates = [p for p, t in zip(parties, workers) if _pool_of(t) == pool]  # the same pool's (all: not read)
        if _worker_thread(thread, kinds) and wait.resource == "future" and mates and all(
                p.wait is not None and p.wait.resource == "future" for p in mates):
            # a worker waiting for a task of its own pool while every other worker does the same: that task is
            # queued behind them, and no worker is free to take it
            return Release(tuple(mates[:MAX_PARTIES]), "starved")
        return Release(tuple(busy[:MAX_PARTIES]))
    kids = _children(ctx, wait, role="worker")
    if not loader and not kids.parties and wait.resource == "future" and _pool_of(thread):
        # the waiter is a thread pool's worker itself and no other worker (nor a process pool's child) exists: it is
        # its pool's only worker, waiting for a task that can only run on that pool, queued behind its own
        return Release((_thread_party(ctx, thread, "worker", same=True),), "starved")
    if loader and any(p.what == "data-loader worker" for p in kids.parties):
        kids = replace(kids, parties=tuple(p for p in kids.parties if p.what == "data-loader worker"))
    if kids.parties and all(p.wait is not None and not _busy(p) and not p.state for p in kids.parties):
        # every worker process waits for its next task while the call waits for a result: no worker runs it (one
        # that took it died: a pool replaces a killed worker and its task is lost)
        return Release(kids.parties, "workers_idle")
    if kids.parties or kids.none != "no_child":
        return kids
    return Release(none="no_worker")


# Frames of a thread that runs an asyncio event loop (run_forever, or one step of it running a callback)
_LOOP_FRAMES = (("asyncio/base_events.py", "run_forever"), ("asyncio/base_events.py", "_run_once"))


def _submitted_to_loop(wait: ThreadWait) -> bool:
    """A future's result from asyncio.run_coroutine_threadsafe: its coroutine runs on an event loop's thread, not
    on an executor's workers (the call is on the waiting line or beside it: `fut = ...` then `fut.result()`)."""
    f = wait.caller
    if f is None:
        return False
    obj = wait.detail("object")
    for n, text in f.source:
        if "run_coroutine_threadsafe" not in text:
            continue
        if n == f.line or (obj.isidentifier() and re.match(rf"\s*{re.escape(obj)}\s*=", text)):
            return True  # on the waiting line, or the future waited on is assigned from it nearby
    return False


def _loop_thread(t: ThreadStack) -> bool:
    return _has_frame(t, _LOOP_FRAMES)


def _loop_threads(thread: ThreadStack, ctx: Context) -> Release:
    """Who runs a coroutine submitted with run_coroutine_threadsafe: the thread running the event loop. The waiter
    itself when it is that thread (it waits for what only its own loop can run: a deadlock); none: nobody runs
    a loop, so the coroutine never starts."""
    loops = [t for t in ctx.rank.threads if _loop_thread(t)]
    if not loops:
        return Release(none="no_loop")
    parties = [_thread_party(ctx, t, "loop", same=t.tid == thread.tid) for t in loops]
    parties.sort(key=lambda p: not p.same)
    return Release(tuple(parties[:MAX_PARTIES]))


def _output(wait: ThreadWait, thread: ThreadStack, ctx: Context) -> Release:
    """The end of a child's output (subprocess's communicate): the processes the node found holding the pipe's
    write end when it could read the call's fd; else the children, the pipe's first writers. Every child exited
    while the read still waits: the write end is held by a process a child started (it inherited the pipe), which
    the node's read would name ("inherited")."""
    if thread.waits is not None:
        writers = _other_end(wait, thread, ctx, "writer")
        if writers.parties:
            return writers
    kids = _children(ctx, wait, role="child")
    return Release(kids.parties, "inherited") if _all_exited(kids) else kids


def _all_exited(kids: Release) -> bool:
    """Children were found and every one has exited (zombies): whatever they were to do, they will not."""
    return bool(kids.parties) and all(p.state == "zombie" for p in kids.parties)


def _accepting(wait: ThreadWait, thread: ThreadStack) -> bool:
    """A wait for a client to connect: the node read an accept on a listening socket, or the site says accept."""
    if thread.waits is not None and thread.waits.fds:
        return any(f.access == "accept" for f in thread.waits.fds)
    return "accept" in wait.operation


def _clients(wait: ThreadWait, thread: ThreadStack, ctx: Context) -> Release:
    """Who would end an accept: nobody is known (a client is anyone who connects), unless the node found one. But
    when every process the rank started has exited, a client it started to connect back (an evaluator, a helper
    handed the address) never will: those children, as candidates ("clients_exited")."""
    found = _other_end(wait, thread, ctx, "peer")
    kids = _children(ctx, wait, role="client") if not found.parties else Release()
    return Release(kids.parties, "clients_exited") if _all_exited(kids) else found


def _process_of(p: Party, ctx: Context) -> Optional[JobProcess]:
    """The process beside the ranks a process party is."""
    return next((q for q in ctx.processes if q.node == p.node and q.pid == p.pid), None)


def _main_of(p: JobProcess) -> Optional[ThreadStack]:
    return next((t for t in p.threads if t.is_main), p.threads[0] if p.threads else None)


def _process_party(p: JobProcess, role: str, ctx: Context) -> Party:
    main = _main_of(p)
    state = ""
    if p.hold is not None and p.hold.kind in ("stopped", "traced", "frozen"):
        state = p.hold.kind
    elif p.state in ("Z", "X"):
        state = "zombie"
    elif p.state in ("T", "t"):
        state = "stopped"
    elif p.state == "D":
        state = "disk"
    wait = thread_wait(main, p.hold) if main is not None and main.frames else None
    return Party("process", p.node, p.pid, None, None, " ".join(p.cmdline) or p.kind, role=role, state=state,
                 wait=wait, what=p.kind)


def _children(ctx: Context, wait: ThreadWait, role: str) -> Release:
    r = ctx.rank
    kids = [p for p in ctx.processes if p.role == "child" and p.node == r.node and r.pid in p.of]
    want = wait.detail("child")
    if want.isdigit():
        kids = [p for p in kids if p.pid == int(want)] or kids
    parties = [_process_party(p, role, ctx) for p in kids[:MAX_PARTIES * 4]]
    parties.sort(key=lambda p: (not p.state, p.wait is None))
    if not parties:
        return Release(none="no_child" if ctx.processes else "not_read")
    return Release(tuple(parties[:MAX_PARTIES]))


def _other_end(wait: ThreadWait, thread: Optional[ThreadStack], ctx: Context, rule: str) -> Release:
    """The other end of the call's file descriptor, as the node found it (ThreadStack.waits): the processes
    holding a pipe's or FIFO's other end, a file lock's holder, a socket's peer (a process on the node, a rank of
    the job, a host), a waited-for child."""
    kw = thread.waits if thread is not None else None
    if kw is None:
        return Release(none="not_read")
    parties: List[Party] = []
    others = kw.others
    if rule == "lock_holder" and not others and kw.watched:
        # a lock file polled (filelock: a try with LOCK_NB, a sleep, again): the process holding that file open
        # holds the lock (a waiter opens it only for each try)
        others = tuple(replace(o, role="holder") for f in kw.watched for o in f.others if not o.own)
    for o in others[:MAX_PARTIES * 2]:
        if o.own and o.role in ("writer", "reader", "peer") and rule != "children":
            # the thread's own process holds the other end (a socketpair, a pipe to itself): its other threads
            parties.append(Party("process", ctx.rank.node, o.pid, None, ctx.rank.rank, _name(o), role=o.role,
                                 state=_state_word(o.state)))
            continue
        other = ctx.ranks.get((ctx.rank.node, o.pid))
        if other is not None and other.pid != ctx.rank.pid:
            # another rank of the job holds the other end (a file lock, a pipe): what it waits for itself is its
            # main thread's wait (a collective that needs this very rank, for one)
            main = other.main_thread
            parties.append(Party("rank", other.node, other.pid, None, other.rank, _name(o), role=o.role,
                                 state=_state_word(o.state), reading=o.reading,
                                 wait=thread_wait(main, other.hold) if main is not None and main.frames else None))
            continue
        parties.append(Party("process", ctx.rank.node, o.pid, None, None, _name(o), role=o.role,
                             state=_state_word(o.state), exit=_exit(o), feeders=_feeders(o, ctx),
                             reads=o.reads.target if o.reads is not None else "",
                             stdin=o.reads is not None and o.reads.fd == 0 and o.reads.complete
                             and not o.reads.others, reading=o.reading))
    complete = all(f.complete for f in kw.fds) and kw.children_complete
    sockets = [f for f in kw.fds if f.kind == "socket" and f.peer and not no_peer(f.peer)]
    if not parties and sockets:
        f = sockets[0]
        r = ctx.rank_at.get(f.peer)
        host = f.peer.rsplit(":", 1)[0].strip("[]")
        if r is not None:
            parties.append(Party("rank", r.node, r.pid, None, r.rank, address=f.peer, role="peer"))
        else:
            parties.append(Party("host", ctx.node_of.get(host, ""), address=f.peer, role="peer"))
    parties.sort(key=lambda p: (not p.state, p.role == "peer" and p.kind == "process" and p.pid == ctx.rank.pid))
    if not parties:
        nobody = any(f.nobody for f in kw.fds)
        none: NoneReason = {"writer": "no_writer", "reader": "no_reader", "lock_holder": "no_holder_process",
                            "children": "no_child"}.get(rule, "no_holder_process")  # type: ignore[assignment]
        if nobody or (complete and rule in ("writer", "reader", "lock_holder")):
            return Release(none=none)
        return Release(none="search_incomplete" if not complete else "not_read", complete=complete)
    return Release(tuple(parties[:MAX_PARTIES]), complete=complete)


def _run_once(thread: ThreadStack) -> Optional[Frame]:
    """The frame of an asyncio loop's one turn (BaseEventLoop._run_once) on the thread's stack."""
    return next((f for f in thread.frames if f.filename.endswith("asyncio/base_events.py")
                 and f.function.endswith("_run_once")), None)


def _loop_timer(thread: ThreadStack, kw: Optional[KernelWait]) -> Optional[bool]:
    """Whether an asyncio loop's selector sleeps with a timer due (True), with none (False: nothing was ready and
    nothing is scheduled, so BaseEventLoop._run_once passed timeout None), or unknown (None): the node's read of
    the call's timeout (-1: none), else the `timeout` local of _run_once (on its current line, so always kept)."""
    if kw is not None and kw.family in ("epoll", "poll") and kw.timeout is not None:
        return kw.timeout >= 0
    f = _run_once(thread)
    value = next((loc.repr for loc in f.locals if loc.name == "timeout"), None) if f is not None else None
    return None if value is None else value != "None"


def _event_loop(wait: ThreadWait, thread: ThreadStack, ctx: Context) -> Release:
    """Who can wake an asyncio event loop that has nothing ready. Its selector sleeps until a timer is due, a file
    descriptor it watches is ready, or another thread wakes it (call_soon_threadsafe writes to the loop's own
    wake-up socket, a socketpair whose other end its process holds). With a timer due, time does (not a hang this
    rule can say more of). Else: the peers of the descriptors it watches beside its wake-up socket; with nothing
    watched but that, the other Python threads that hold the loop in their frames (its address in their locals),
    the only ones that could complete what it awaits (a future set from a thread); other threads that do not are
    not named ("loop_untied": the locals read may not show every reference); with no other Python thread,
    nobody ("loop_alone"). When the node did not read what the loop watches, I/O may still wake it: the same,
    said as such, and no other Python thread is "loop_unread", not nobody."""
    kw = thread.waits if thread.waits is not None and thread.waits.family in ("epoll", "poll") else None
    if _loop_timer(thread, kw) is not False:
        return Release(none="unknown_rule")
    if kw is not None:
        watched = [f for f in kw.fds if f.kind not in ("eventfd", "epoll")
                   and not (f.others and all(o.own for o in f.others))]
        if watched or kw.fds_total is None or kw.fds_total > len(kw.fds):
            return _other_end(wait, replace(thread, waits=replace(kw, fds=tuple(watched))), ctx, "peer")
    # the threads that could wake it hold the loop (or what it runs) in their frames: its address in their locals
    loop = _self_address(_run_once(thread))
    others = [t for t in ctx.rank.threads if t.tid != thread.tid and _python_thread(t)]
    tied = [_thread_party(ctx, t, "waker" if kw is not None else "waker_unread") for t in others
            if loop and loop in _addresses(t.frames)]
    if tied:
        return Release(tuple(tied[:MAX_PARTIES]))
    if others:  # threads that hold no reference to it that the locals show: not named as its wakers
        return Release(none="loop_untied" if kw is not None else "loop_untied_unread")
    return Release(none="loop_alone" if kw is not None else "loop_unread")


def _feeders(child: OtherEnd, ctx: Context) -> Tuple[Party, ...]:
    """Who holds the write end of the pipe a child is blocked reading (OtherEnd.reads): the rank itself (own) or
    other processes (a process forked from the rank after the pipe was made inherits it)."""
    if child.reads is None:
        return ()
    return tuple(Party("process", ctx.rank.node, w.pid, None, ctx.rank.rank if w.own else None, _name(w),
                       role="feeder", state=_state_word(w.state), exit=_exit(w), same=w.own,
                       what="started by the rank" if not w.own and w.ppid == ctx.rank.pid else "")
                 for w in child.reads.others[:MAX_PARTIES])


def no_peer(address: str) -> bool:
    """A socket's "peer" that is none: a listening or unconnected socket shows the wildcard (0.0.0.0:0, [::]:0,
    *:*), which is not a host to check."""
    host, _, port = address.rpartition(":")
    return port in ("0", "*", "") or host.strip("[]") in ("0.0.0.0", "::", "*", "")


def _name(o: OtherEnd) -> str:
    return " ".join(o.cmdline) or o.comm


def _exit(o: OtherEnd) -> str:
    if o.exit_signal:
        return f"killed by {o.exit_signal}" + (" (core dumped)" if o.core_dumped else "")
    if o.exit_code is not None:
        return f"exited with {o.exit_code}"
    return ""


def _state_word(letter: str) -> str:
    return {"T": "stopped", "t": "traced", "Z": "zombie", "X": "zombie", "D": "disk"}.get(letter, "")


@dataclass(frozen=True)
class Link:
    """One step of a chain of waits: `who` waits (`wait`), and `release` says who can end it."""

    who: Party
    wait: ThreadWait
    release: Release


_CERTAIN_ROLES = ("holder", "releaser", "joined", "writer", "reader", "lock_holder", "child", "peer", "listener", "cycle",
                  "person", "loop", "importer")


def certain(wait: ThreadWait, rel: Release) -> bool:
    """Whether who can release a wait is known for sure (a lock's holder, a pipe's writer, a socket's peer, the
    one busy worker of an executor), as opposed to candidates (the threads that might set an event)."""
    if not rel.parties:
        return False
    if wait.release == "threads":
        # the interpreter's shutdown joins its non-daemon threads: with one Python thread of the job's left, that
        # is the one it waits for (the runtime's own threads run no Python of the job)
        return len(rel.parties) == 1
    if wait.release in ("notifier", "producer", "consumer"):
        return False
    if rel.parties[0].role == "loop":
        return len(rel.parties) == 1
    if wait.release == "worker":
        # idle workers are the answer (none runs the call), not someone the chain goes on through
        return rel.none not in ("workers_idle", "starved") and (len(rel.parties) == 1 or alike(rel.parties))
    return rel.parties[0].role in _CERTAIN_ROLES or wait.release in ("children", "time", "person", "kernel")


def alike(parties: Sequence[Party]) -> bool:
    """Whether several workers all wait the same way (the same operation on the same object at the same place):
    any one of them stands for the others, so the chain follows the first."""
    keys = {(p.wait.operation, p.wait.resource, p.wait.detail("object"),
             p.wait.frame.filename if p.wait.frame is not None else "",
             p.wait.frame.line if p.wait.frame is not None else 0) if p.wait is not None else None for p in parties}
    return len(parties) > 1 and None not in keys and len(keys) == 1


def chain(thread: ThreadStack, ctx: Context, first: Optional[ThreadWait] = None) -> Tuple[Link, ...]:
    """From a thread's wait to the root: each step follows the party that surely can release it and waits
    itself, until a party that does not (a host, a person, time, a held process), candidates only (which thread
    would set an event is not in a stack), a cycle (a deadlock), or MAX_CHAIN steps."""
    r = ctx.rank
    wait = first or ctx.wait_of(thread)
    who = Party("thread", r.node, r.pid, thread.tid, r.rank, thread.name, role="self", main=thread.is_main, wait=wait)
    links: List[Link] = []
    seen: Set[Tuple[str, Optional[int], Optional[int]]] = {(r.node, r.pid, thread.tid)}
    at: Optional[ThreadStack] = thread
    while at is not None and len(links) < MAX_CHAIN:
        rel = release(wait, at, ctx)
        links.append(Link(who, wait, rel))
        if not certain(wait, rel):
            links += _waits_back(rel, at, ctx, links)
            break
        nxt = next((p for p in rel.parties if p.wait is not None and not p.same), None)
        if nxt is None or nxt.wait is None:
            break
        ident = (nxt.node, nxt.pid, nxt.tid)
        if ident in seen:
            links.append(Link(nxt, nxt.wait, Release((Party("thread", nxt.node, nxt.pid, nxt.tid, nxt.rank,
                                                            role="cycle"),))))
            break
        seen.add(ident)
        if nxt.kind == "rank":
            # another rank of the job: a collective of the whole job (its default group: a call that names no
            # other) that it waits in cannot finish without this rank, which waits for it here: each waits for the
            # other (this rank is in no collective: it waits in this very call). A subgroup's may not include it.
            whole = nxt.wait.resource == "collective" and not group_arg(nxt.wait.caller)
            ring: Tuple[Party, ...] = (Party("rank", r.node, r.pid, thread.tid, r.rank, role="cycle"),) \
                if whole else ()
            links.append(Link(nxt, nxt.wait, Release(ring)))
            break
        if nxt.kind != "thread" or nxt.pid != r.pid:
            # another process: its own release is not followed here, but for two cases: a lock it waits for (its
            # own threads, then, for a process forked from the rank, the rank's: a fork copies a held lock), and a
            # pipe or socket whose other end is this very rank's process (a child writing into a full pipe only
            # the rank reads, while the rank waits for it to exit): each waits for the other
            inside = _lock_inside(nxt, r, ctx) or _no_workers_inside(nxt, r, ctx)
            if inside is not None:
                links.append(inside)
                break
            pair = _pair_cycle(nxt, ctx)
            if pair:
                links += pair
                break
            back = _back_to(nxt, r, ctx)
            if not back:
                links.append(Link(nxt, nxt.wait, Release()))
                break
            links += back
            links.append(Link(back[-1].release.parties[0], wait, _cycle(r, thread.tid)))
            break
        at = next((t for t in r.threads if t.tid == nxt.tid), None)
        who, wait = nxt, nxt.wait
    return tuple(links)


# Frames a process forked without exec keeps from its parent's stack (the fork returns into them in the child)
_FORK_FRAMES = (("multiprocessing/popen_fork.py", "_launch"),)
_FORK_CALL = re.compile(r"\bfork\(\)")


def forked(proc: JobProcess) -> bool:
    """Whether a process is a fork of its parent that did not exec: its stack goes on below the fork call."""
    for t in proc.threads:
        if _has_frame(t, _FORK_FRAMES):
            return True
        for f in t.frames:
            line = line_text(f)
            if not f.native and _FORK_CALL.search(line) and "os.fork" in line:
                return True
    return False


def _lock_inside(p: Party, r: RankSnapshot, ctx: Context) -> Optional[Link]:
    """For a process party of a chain waiting for a lock: who holds it. A thread of that process inside a block of
    the same lock; else, when the process is the rank's child forked without exec, a thread of the rank holding
    it (the fork copied the lock held, never the thread that would release it: "fork_holder"), or nobody now
    ("forked_held": held when the process forked, or taken with acquire() and never released). None: not a lock,
    or not known."""
    w = p.wait
    if p.kind != "process" or w is None or w.release != "holder" or p.node != r.node:
        return None
    proc = _process_of(p, ctx)
    key = _lock_key(w)
    if proc is None or key is None:
        return None
    for t in proc.threads:
        if key in held(t):
            return Link(p, w, Release((Party("thread", p.node, p.pid, t.tid, None, t.name, role="holder",
                                             main=t.is_main, wait=thread_wait(t, proc.hold)),)))
    if r.pid not in proc.of or proc.role != "child" or not forked(proc):
        return None
    for t in r.threads:
        if key in held(t):
            return Link(p, w, Release((Party("thread", r.node, r.pid, t.tid, r.rank, t.name, role="fork_holder",
                                             main=t.is_main),)))
    return Link(p, w, Release(none="forked_held"))


def _no_workers_inside(p: Party, r: RankSnapshot, ctx: Context) -> Optional[Link]:
    """For a process party of a chain waiting for an executor's future: when no thread of that process is a worker
    and the process is the rank's fork, the executor was made before the fork, which copies only the forking
    thread: nobody in it will run the call ("forked_no_workers")."""
    w = p.wait
    if p.kind != "process" or w is None or w.release != "worker" or w.resource != "future" or p.node != r.node:
        return None
    proc = _process_of(p, ctx)
    if proc is None or r.pid not in proc.of or not forked(proc) or any(_worker_thread(t) for t in proc.threads):
        return None
    return Link(p, w, Release(none="forked_no_workers"))


def _cycle(r: RankSnapshot, tid: Optional[int]) -> Release:
    """The last step of a deadlock: back to a thread of the rank already in the chain."""
    return Release((Party("thread", r.node, r.pid, tid, r.rank, role="cycle"),))


def _waits_back(rel: Release, waiter: ThreadStack, ctx: Context, links: Sequence[Link]) -> List[Link]:
    """Candidates are not followed (which thread would set an event is not in a stack), but for one: when the only
    thread tied to the object (its frames hold it) waits, for sure, for the waiter itself (it holds the lock, runs
    the import the candidate waits for), or is a thread of the chain already, neither can move: the cycle."""
    others = [p for p in rel.parties if not p.same]
    if len(others) != 1 or others[0].kind != "thread" or others[0].role == "any" or others[0].wait is None \
            or others[0].pid != ctx.rank.pid:
        return []
    p = others[0]
    pw = p.wait
    r = ctx.rank
    assert pw is not None
    if any((k.who.pid, k.who.tid) == (p.pid, p.tid) for k in links):  # it waits along the chain already
        return [Link(p, pw, _cycle(r, p.tid))]
    t = next((t for t in r.threads if t.tid == p.tid), None)
    if t is None:
        return []
    back = release(pw, t, ctx)
    if not certain(pw, back) or not back.parties or back.parties[0].tid != waiter.tid:
        return []
    return [Link(p, pw, back), Link(back.parties[0], ctx.wait_of(waiter), _cycle(r, waiter.tid))]


def _back_to(p: Party, r: RankSnapshot, ctx: Context) -> List[Link]:
    """For a process party of a chain: the links back to the rank when the process waits on a pipe or a socket
    whose other end the node found to be the rank's own process, with its main thread, or with a thread of its
    own that its main thread joins (a child's exit waits for its queue's feeder thread, which writes into a full
    pipe the rank would read after the join); else none (the party's own release is not followed)."""
    w = p.wait
    proc = _process_of(p, ctx)
    if p.kind != "process" or w is None or proc is None or p.node != r.node:
        return []
    main = _main_of(proc)
    if main is None:
        return []
    if w.release in ("reader", "writer", "peer"):
        end = _rank_end(main, r)
        return [Link(p, w, Release((end,)))] if end is not None else []
    if w.resource == "process_queue" and w.release in ("producer", "consumer"):
        # a multiprocessing Connection or Queue read (or write) of the child: the socket or pipe under it, when
        # the rank is the only other process holding it, is the rank's to send (or read) on
        end = _rank_end(main, r, alone=True)
        return [Link(p, w, Release((end,)))] if end is not None else []
    if w.release == "joined":
        for t in proc.threads:
            if t is main:
                continue
            tw = thread_wait(t, proc.hold)
            end = _rank_end(t, r) if tw.release in ("reader", "writer", "peer") else None
            if end is not None:
                party = Party("thread", p.node, p.pid, t.tid, None, t.name, role="joined", wait=tw)
                return [Link(p, w, Release((party,))), Link(party, tw, Release((end,)))]
    return []


def _pair_cycle(p: Party, ctx: Context) -> List[Link]:
    """For a process party of a chain blocked on a pipe or a socket: when the process at its other end (another
    process beside the ranks, on the same node) is itself blocked on a pipe or a socket whose other end is this
    one, the two wait for each other (each writes into a full pipe the other would read only after its own write):
    the links to that process and back; else none."""
    w = p.wait
    proc = _process_of(p, ctx)
    if p.kind != "process" or w is None or proc is None or w.release not in ("reader", "writer", "peer"):
        return []
    main = _main_of(proc)
    for f in main.waits.fds if main is not None and main.waits is not None else ():
        for o in f.others[:MAX_PARTIES]:
            if o.own or o.role not in ("reader", "writer", "peer"):
                continue
            q = next((x for x in ctx.processes if x.node == p.node and x.pid == o.pid), None)
            q_main = _main_of(q) if q is not None else None
            if q is None or q_main is None or q_main.waits is None:
                continue
            if not any(e.pid == p.pid and not e.own and e.role in ("reader", "writer", "peer")
                       for g in q_main.waits.fds for e in g.others):
                continue
            q_wait = thread_wait(q_main, q.hold)
            other = Party("process", q.node, q.pid, None, None, " ".join(q.cmdline) or q.kind, role=o.role,
                          wait=q_wait, what=q.kind)
            back = Party("process", p.node, p.pid, None, None, p.name, role="cycle")
            return [Link(p, w, Release((other,))), Link(other, q_wait, Release((back,)))]
    return []


def _rank_end(t: ThreadStack, r: RankSnapshot, alone: bool = False) -> Optional[Party]:
    """The rank's own process as the other end of the pipe or socket this thread (of another process) waits on;
    `alone`: only when no third process holds that end too (and the node's search for them was complete)."""
    for f in t.waits.fds if t.waits is not None else ():
        ends = [o for o in f.others if not o.own]
        for o in ends:
            if o.pid == r.pid and o.role in ("reader", "writer", "peer"):
                if alone and (len(ends) > 1 or not f.complete):
                    return None
                return Party("process", r.node, r.pid, None, r.rank, r.cmdline[0] if r.cmdline else "", role=o.role)
    return None


def job_code(t: ThreadStack) -> bool:
    """Whether a thread runs the job's own code anywhere on its stack."""
    return innermost_own(t.frames) is not None and any(not is_library(f) for f in t.frames if not f.native)
