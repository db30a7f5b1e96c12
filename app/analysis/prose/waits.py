"""Sentences for what a thread waits for and who can release it (blocking.py, release.py): the "blocked" facts
and the middle of the headline. Every remote string (names, command lines, paths, keys) is cleaned here."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import List, Optional, Sequence, Tuple

from app.analysis.blocking import FIFO_OPEN, ThreadWait
from app.analysis.facts import Fact
from app.analysis.frames import clean, group_arg, library_file, location, named
from app.analysis.release import Link, Party, Release, alike, releasing_frame
from app.analysis.suspects import WaitEvidence
from app.model import RankSnapshot

Text = Tuple[str, str, str]


def _q(text: str, limit: int = 80) -> str:
    """Remote text inside backquotes, printable and bounded."""
    return f"`{clean(text, limit).replace('`', chr(39))}`"


def _released_at(p: Party, w: ThreadWait, rank: Optional[RankSnapshot]) -> str:
    """` (`self._lock.release()` in `Checkpointer._write` (train.py:156))`: where the releasing thread's code gives
    the lock back (release.releasing_frame), when its stack is at hand."""
    t = next((t for t in rank.threads if t.tid == p.tid), None) if rank is not None and rank.pid == p.pid else None
    found = releasing_frame(t, w.detail("object"), w.caller) if t is not None and w.caller is not None else None
    if found is None:
        return ""
    f, n = found
    return f" ({_q(w.detail('object') + '.release()', 60)} in `{clean(f.function, 80)}`, {location(replace(f, line=n))})"


def where(w: ThreadWait) -> str:
    """`(upload_checkpoint, train.py:88)`: where in the job's code the wait is, when that is known."""
    at = w.caller
    if at is None:
        return ""
    line = next((src for n, src in at.source if n == at.line), "").strip()
    code = f": {_q(line, 100)}" if line and len(line) <= 100 else ""
    return f" at {named(at)}{code}"


def operation(w: ThreadWait) -> str:
    """`blocked in `Future.result``, `spinning`, `sleeping in `time.sleep``, `blocked in a system call (futex)`."""
    if w.state == "spinning":
        return "spinning on a CPU"
    if w.state == "running":
        return "running"
    if w.state in ("stopped", "frozen", "traced", "exited"):
        return {"stopped": "stopped", "frozen": "frozen by the cgroup freezer", "traced": "stopped by a tracer",
                "exited": "exited"}[w.state]
    if w.state == "disk":
        return f"in uninterruptible sleep (D) in {_q(w.syscall or 'a kernel call', 40)}"
    if w.known and w.operation:
        verb = "sleeping in" if w.resource == "timer" else "blocked in"
        return f"{verb} {_q(w.operation, 60)}"
    kernel = f"{_q(w.syscall, 40)}" if w.syscall else "the kernel"
    return f"blocked in a system call ({kernel}{', kernel wait ' + _q(w.wchan, 40) if w.wchan else ''})"


def _detail(w: ThreadWait, name: str) -> str:
    return w.detail(name)


def _obj(w: ThreadWait) -> str:
    obj = _detail(w, "object")
    return f" {_q(obj, 60)}" if obj else ""


def resource(w: ThreadWait, rel: Optional[Release] = None) -> str:
    """What the wait is for, from its resource kind and its identities: `waiting for the lock `_m``."""
    r = w.resource
    obj = _obj(w)
    if r == "lock" and w.release == "importer":
        module = _detail(w, "module")
        return f"waiting for the import of {_q(module, 80) if module else 'a module'} to finish (its module lock)"
    if r == "lock":
        f = w.frame
        if f is not None and f.function == "Handler.acquire" and f.filename.endswith("logging/__init__.py"):
            return "waiting for a logging handler's lock (to log a record)"
        return f"waiting for the lock{obj}"
    if r == "condition":
        return f"waiting for a notify() on the condition{obj}"
    if r == "event":
        return f"waiting for the event{obj} to be set"
    if r == "semaphore":
        return f"waiting for a permit of the semaphore{obj}"
    if r == "barrier":
        return f"waiting for the other parties of the barrier{obj}"
    if r == "thread":
        return "waiting for a thread to end"
    if r == "future":
        if rel is not None and (rel.none == "no_loop" or (rel.parties and rel.parties[0].role == "loop")):
            return f"waiting for the result of a coroutine{obj} submitted to an asyncio event loop"
        return f"waiting for the result of a future{obj} that an executor runs"
    if r == "queue":
        if w.operation == "queue.Queue.join":
            return f"waiting until every item put into the queue{obj} is marked done (`task_done()`)"
        if w.release == "consumer":
            return f"waiting for room in the full queue{obj}"
        if w.operation == "executor worker idle":
            return "idle, waiting for work"
        return f"waiting for an item in the queue{obj}"
    if r == "process_queue":
        if "manager" in w.operation:  # a proxy's call: the manager's server process answers it
            return f"waiting for its manager process to answer the call{obj}"
        return f"waiting for data from another process{obj}"
    if r == "pool":
        return "waiting for the results of a process pool"
    if r in ("socket", "http"):
        peer = _detail(w, "peer")
        what = "an HTTP response" if r == "http" else "data"
        if "accept" in w.operation:
            return "waiting for a client to connect" + (f" to {_q(_detail(w, 'local'), 60)}" if _detail(w, "local") else "")
        if "connect" in w.operation:
            return "waiting for the server to accept the connection" + (f" ({_q(peer, 60)})" if peer else "")
        if "send" in w.operation:
            return "waiting for its peer to read (the socket's send buffer is full)"
        return f"waiting for {what}" + (f" from {_q(peer, 60)}" if peer else " from its peer")
    if r == "pipe":
        target = _detail(w, "target")
        on = f" ({_q(target, 40)})" if target else ""
        if w.release == "output":
            return f"waiting for the end of its child's output (EOF on the pipe it reads{on})"
        if w.operation == FIFO_OPEN:
            end = "reading" if w.release == "reader" else "writing"
            return f"waiting for a process to open the FIFO{on} for {end}"
        if w.release == "reader":
            return f"waiting for the reader of a full pipe{on}"
        return f"waiting for data on a pipe or file{on}"
    if r == "terminal":
        target = _detail(w, "target")
        if w.operation == "terminal write":
            return ("writing to its terminal" + (f" ({_q(target, 40)})" if target else "") + ", which takes no more "
                    "output: its output is stopped (Ctrl-S, flow control) or nothing reads the terminal's other side")
        return "waiting for input on its standard input" + (f" ({_q(target, 40)})" if target else "")
    if r == "child":
        child = _detail(w, "child")
        arg = _detail(w, "argument")
        return "waiting for a child process to exit" + (f" (pid {child})" if child.isdigit() else
                                                       (f" ({_q(arg, 60)})" if arg else ""))
    if r == "file_lock":
        path = _detail(w, "path") or _detail(w, "target") or _detail(w, "argument")
        return "waiting for a lock on a file" + (f" ({_q(path, 80)})" if path else "")
    if r == "file":
        path = _detail(w, "path")
        return "in a file system call that has not returned" + (f" ({_q(path, 80)})" if path else "")
    if r == "store_key":
        key = _detail(w, "key")
        template = _detail(w, "key_template")
        if not key and template:
            return (f"waiting for a key in the job's store, built by {_q(template, 60)} (its value, and any prefix "
                    "the store adds, are not in the stack)")
        key = key or _detail(w, "argument")
        return f"waiting for the key {_q(key, 60)} in the job's store" if key else "waiting in the job's store"
    if r == "device":
        return "waiting for the GPU to finish its queued work"
    if r == "timer":
        left = long_sleep(w)
        if left is not None:  # one sleep outlasts any sampling: what matters is when it wakes, not that it loops
            inside = f" inside the loop {_q(w.poll.header.strip().rstrip(':'), 80)}{_polls(w)}" if w.poll else ""
            return f"in one sleep with {duration(left)} left (the node read its deadline){inside}"
        if w.poll is not None and w.detail("retries"):
            return (f"in the retry loop {_q(w.poll.header.strip().rstrip(':'), 80)}{_polls(w)}: it calls "
                    f"{_q(w.detail('retries'), 120)} again after each failure ({_q('except ' + w.detail('catches'), 60)}) "
                    "and sleeps between tries: the call has failed on every try so far")
        if w.poll is not None:
            return (f"polling in the loop {_q(w.poll.header.strip().rstrip(':'), 80)}{_polls(w)}: it sleeps and checks "
                    f"again{_polled(w)}")
        arg = _detail(w, "argument")
        return f"sleeping{' (' + _q(arg, 30) + ')' if arg else ''}"
    if r == "cpu":
        if w.poll is not None:
            return (f"in the loop {_q(w.poll.header.strip().rstrip(':'), 80)}{_polls(w)}, which does not wait: it "
                    "burns a core until the condition turns")
        return "computing"
    if r == "debugger":
        return "stopped at a debugger's prompt, waiting for a command on its terminal"
    if r == "shutdown":
        return "its main program has ended; the interpreter waits for its non-daemon threads to end before it exits"
    if r == "event_loop":
        return "its asyncio event loop waits for a task or I/O that does not come"
    if r == "signal":
        names = signals(w)
        return f"waiting for {' or '.join(names)} (sent by another process, or by itself from another thread)" \
            if names else "waiting for a signal"
    if r == "native":
        return f"inside a native call that does not return (it sleeps in {_q(w.syscall or '?', 30)})"
    if r == "gil":
        return "holding the GIL in native code"
    if r == "collective":
        group = group_arg(w.caller)
        return (f"waiting for every rank of {'the group `' + clean(group, 40) + '`' if group else 'the job'} to "
                "enter it")
    return "the mechanism is not known"


_SIGNAL_NAME = re.compile(r"\bSIG(?:RTMIN\+\d{1,2}|RTMAX-\d{1,2}|[A-Z]{2,7}\d?)\b")


def signals(w: ThreadWait) -> List[str]:
    """The signals a signal wait waits for: as the node read its set, else as its call names them (`{SIGUSR2}`)."""
    read = w.detail("signals")
    if read:
        return [n.strip() for n in read.split(",") if n.strip()][:4]
    return list(dict.fromkeys(_SIGNAL_NAME.findall(w.detail("argument"))))[:4]


# A sleep with this much time left (the node reads a sleep's deadline) is not a poll that checks every so often:
# it will not look again for minutes, whatever loop it is in (a back-off grown long, a delay in the wrong unit)
LONG_SLEEP_S = 60.0


def long_sleep(w: ThreadWait) -> Optional[float]:
    """Seconds left in the sleep the thread is in, when the node read them and they are LONG_SLEEP_S or more."""
    if w.resource != "timer":
        return None
    try:
        left = float(w.detail("kernel_timeout"))
    except ValueError:
        return None
    return left if LONG_SLEEP_S <= left < float("inf") else None


def duration(seconds: float) -> str:
    """`45 s`, `12 min`, `60 min`, `3.5 h`, `4 days`."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def _polled(w: ThreadWait) -> str:
    """`; no process of the node has `/ckpt/COMMITTED` open for writing ...`: who writes a file the loop polls."""
    unwritten = [d.value for d in w.details if d.name == "unwritten"]
    if unwritten:
        return (f"; no process of the node has {_q(unwritten[0], 100)} open for writing (by that name): nothing "
                "there is writing what it waits for")
    writer = w.detail("written_by")
    return f"; {clean(writer, 120)} has the file it polls open for writing" if writer else ""


def _polls(w: ThreadWait) -> str:
    """` until `os.path.exists(marker)` (marker='/ckpt/COMMITTED')`: the test the loop retries and the values it
    reads."""
    test = w.detail("test")
    values = [(d.name.split(":", 1)[1], d.value) for d in w.details if d.name.startswith("polls:")]
    said = f", testing {_q(test, 100)}" if test and w.poll is not None and w.poll.kind != "while" else ""
    return said + (" (" + ", ".join(f"{clean(n, 40)}={clean(v, 80)}" for n, v in values) + ")" if values else "")


def party(p: Party, rank: Optional[RankSnapshot] = None) -> str:
    """`its thread `upload_0``, `pid 812 `sleep 1000``, `10.0.0.9:443 (no node of the snapshot)`, `someone at its
    terminal`."""
    if p.kind == "thread":
        if rank is not None and p.pid == rank.pid and p.node == rank.node:
            if p.same:
                return "itself, lower on its own stack"
            return "its main thread" if p.main else (f"its thread {_q(p.name, 60)}" if p.name else f"its thread {p.tid}")
        who = f"rank {p.rank}" if p.rank is not None else f"pid {p.pid}"
        return f"{who}'s thread {_q(p.name, 60)}" if p.name else f"{who}'s thread {p.tid}"
    if p.kind == "process":
        state = f", {p.state}" + (f" ({clean(p.exit, 60)})" if p.exit else "") if p.state else ""
        if rank is not None and p.pid == rank.pid and p.node == rank.node:
            return f"the rank itself (pid {p.pid}){state}"
        return f"pid {p.pid} {_q(p.name, 80)}{state}"
    if p.kind == "rank":
        return f"rank {p.rank} on {clean(p.node, 60)}" if p.rank is not None else f"pid {p.pid} on {clean(p.node, 60)}"
    if p.kind == "host":
        if p.node:
            return f"{clean(p.node, 60)} ({clean(p.address, 60)})"
        return f"{_q(p.address, 60)}, which no inspected node has (outside the job, or a node the hosts list leaves out)"
    if p.kind == "person":
        return "someone at its terminal"
    if p.kind == "time":
        return "time: the sleep ends by itself"
    if p.kind == "itself":
        return "its own loop's condition"
    if p.kind == "kernel":
        return "the kernel (a file system, a device or a driver)"
    if p.kind == "device":
        return "the GPU"
    return "unknown"


def _doing(p: Party) -> str:
    w = p.wait
    if w is None:
        return ""
    text = operation(w) + where(w)
    return text


_NONE = {
    "no_other_thread": "no other thread of the process runs Python: nothing can release it",
    "no_related_thread": "no other thread of the process runs code of that object: whatever would release it has "
                         "ended, or never started",
    "no_holder": "no thread is inside a block of that lock: it was taken with acquire() elsewhere, or by a thread "
                 "that is gone",
    "no_writer": "no process holds the other end open for writing: nothing will come",
    "no_reader": "no process holds its read end",
    "no_worker": "no worker thread or process is alive to run it",
    "no_loop": "it is a coroutine's, and no thread of the process runs an asyncio event loop: it never starts",
    "forked_no_workers": "no thread of that process runs the executor's calls: the executor was made before the "
                         "process forked, and a fork copies only the thread that forked (the workers stay in the "
                         "parent)",
    "workers_idle": "its executor's workers are all idle: the call is not running",
    "no_child": "no child process of it was found",
    "inherited": "its child has exited, yet the pipe stays open: a process the child started holds its write end",
    "no_holder_process": "no process was found holding it",
    "shared_lock": "no thread of this process holds it, and it is shared between processes (its futex lies in a "
                   "file other processes can map: a multiprocessing or POSIX named semaphore, a lock in shared "
                   "memory): another process holds it, or one that ended while holding it, and then nothing can give "
                   "it back",
    "forked_held": "no thread of that process holds it: it was forked while a thread of its parent held the lock "
                   "(a fork copies a held lock, never the thread that would release it), or the lock was taken with "
                   "acquire() and never released",
    "loop_alone": "its loop has no timer due and watches nothing but its own wake-up socket, and no other thread "
                  "of the process runs Python to wake it (call_soon_threadsafe): nobody is left to complete what it "
                  "awaits (a future a thread was to set never completes)",
    "loop_unread": "its loop has no timer due, and no other thread of the process runs Python to wake it "
                   "(call_soon_threadsafe): only I/O it watches could (the node did not read which)",
    "loop_untied": "its loop has no timer due and watches nothing but its own wake-up socket: only another thread "
                   "can wake it (call_soon_threadsafe), and none of the process's other threads names the loop in "
                   "its variables (as far as the locals read show)",
    "loop_untied_unread": "its loop has no timer due: I/O it watches (the node did not read which) or another "
                          "thread (call_soon_threadsafe) must wake it, and none of the process's other threads names "
                          "the loop in its variables (as far as the locals read show)",
    "not_read": "",
    "search_incomplete": "the node's search for the other end was cut short by its bounds",
    "unknown_rule": "",
}


# With no thread tied to the object, who is missing depends on what the wait needs: a queue's get its producer,
# a put its consumer, an event or a condition the thread that sets or notifies it, a semaphore the one that gives
# a permit back (the release role sites.py gives the wait)
_NOBODY_ON_OBJECT = {
    ("queue", "producer"): "no other thread of the process runs code of that queue: its producer has ended (or "
                           "never started), and nothing will put into it",
    ("queue", "consumer"): "no other thread of the process runs code of that queue: its consumer has ended (or "
                           "never started), and nothing will take from it",
    ("event", "notifier"): "no other thread of the process runs code of that object: the thread that would set "
                           "the event has ended, or never started",
    ("condition", "notifier"): "no other thread of the process runs code of that object: the thread that would "
                               "notify it has ended, or never started",
    ("semaphore", "notifier"): "no other thread of the process runs code of that object: whatever would give a "
                               "permit back has ended, or never started (or took one and never released it)",
}


_FRAME_LINE = re.compile(r'^\s*File "([^"\n]{1,500})", line (\d{1,9}), in (\S{1,200})\s*$')
MAX_OUTPUT_SCAN = 64 << 10


def thread_died(rank: Optional[RankSnapshot]) -> Optional[Tuple[str, str]]:
    """(the exception, where in the job's code) of the last traceback in a rank's error output when it is a
    thread's (its frames run through threading's `_bootstrap_inner`): a helper thread that died of an uncaught
    exception; None when the output ends otherwise."""
    if rank is None or not rank.output:
        return None
    text = rank.output[0].text[-MAX_OUTPUT_SCAN:]
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    lines = text[at:].splitlines()[1:]
    frames = [m for m in (_FRAME_LINE.match(line) for line in lines) if m]
    if not any(m.group(3) == "_bootstrap_inner" and m.group(1).endswith("threading.py") for m in frames):
        return None
    # the exception is the first line after the frames that is not indented (output may follow it)
    exc = next((line.strip() for line in lines if line.strip() and not line.startswith((" ", "\t"))), "")
    if not exc:
        return None
    own = [m for m in frames if not library_file(m.group(1))]
    where_ = f"`{own[-1].group(3)}` ({own[-1].group(1).rsplit('/', 1)[-1]}:{own[-1].group(2)})" if own else ""
    return exc, where_


def _died(rank: Optional[RankSnapshot]) -> str:
    died = thread_died(rank)
    if died is None:
        return ""
    exc, at = died
    return f"; its error output shows a thread that died of {_q(exc, 160)}" + (f" in {clean(at, 120)}" if at else "")


def release(link: Link, rank: Optional[RankSnapshot]) -> str:
    """Who can release one wait: `, which its thread `w` holds` / `; nothing can release it: ...`."""
    rel = link.release
    w = link.wait
    if not rel.parties:
        text = _NONE.get(rel.none, "")
        if rel.none == "no_related_thread":
            text = _NOBODY_ON_OBJECT.get((w.resource, w.release), text)
            if text and link.who.pid == (rank.pid if rank is not None else None):
                text += _died(rank)
        if rel.none in ("no_reader", "no_writer") and w.operation == FIFO_OPEN:
            end = "reading" if rel.none == "no_reader" else "writing"
            text = f"no process has it open for {end}: the open waits until one opens it"
        return f"; {text}" if text else ""
    first = rel.parties[0]
    who = party(first, rank)
    if rel.none == "undone":
        names = ", ".join(party(p, rank) for p in rel.parties[:3]) + (" ..." if len(rel.parties) > 3 else "")
        return (f"; its consumers ({names}) wait for the next item: the queue is empty, yet not every item taken was "
                "marked done: a `task_done()` call is missing")
    if w.release == "importer":
        return f", which {who} is still importing"
    if w.release == "holder":
        if first.role == "fork_holder":
            of = f"pid {link.who.pid}" if link.who.pid is not None else "that process"
            holder = ("the rank's main thread" if first.main else
                      f"the rank's thread {_q(first.name, 60)}" if first.name else f"the rank's thread {first.tid}")
            return (f", which no thread of {of} holds: it was forked from the rank while {holder} held it (a fork "
                    "copies a held lock, never the thread that would release it)")
        if first.same:
            return (", which it already holds itself lower on its own stack: a non-reentrant lock taken twice by "
                    "the same thread can never be released")
        if first.role == "releaser":
            return f", which {who} gives back{_released_at(first, w, rank)}"
        return f", which {who} holds"
    if w.release == "joined":
        return f": {who}"
    if w.release == "worker" and first.role == "loop":
        if first.same:
            return (", from the loop's own thread: the loop cannot run the coroutine while this thread waits for it, "
                    "a deadlock")
        return f", which the loop runs on {who}"
    if w.release == "worker":
        if rel.none == "starved" and first.same:
            return ("; it is its pool's only worker: what it waits for is queued behind the task it runs itself, and no "
                    "worker is free to run it (pool starvation)")
        if rel.none == "starved":
            names = ", ".join(party(p, rank) for p in rel.parties[:3]) + (" ..." if len(rel.parties) > 3 else "")
            return (f"; every other worker of its pool ({names}) waits for a result of the pool too: the call is "
                    "queued behind them and no worker is free to run it (pool starvation)")
        if rel.none == "workers_idle":
            if first.kind == "process":
                pids = ", ".join(str(p.pid) for p in rel.parties[:6]) + (" ..." if len(rel.parties) > 6 else "")
                return (f"; its worker processes are all idle, waiting for their next task (pid {pids}): none runs "
                        "what it waits for, so its result never comes (a pool replaces a worker that died, killed or crashed, "
                        "and the task that worker held is lost)")
            names = ", ".join(party(p, rank) for p in rel.parties[:3]) + (" ..." if len(rel.parties) > 3 else "")
            return f"; its executor's workers are all idle ({names}): the call is not running"
        if len(rel.parties) == 1:
            return f", which {who} runs"
        others = len(rel.parties) - 1
        same = ", waiting the same way" if alike(rel.parties) else ""
        return f", which {who} runs (and {others} more worker{'s' if others != 1 else ''}{same})"
    if w.release == "output":
        if rel.none == "inherited":
            child = f"pid {first.pid} {_q(first.name, 80)}" if first.pid is not None else "process"
            return (f"; the child {child} has exited (a zombie not yet reaped), yet the pipe stays open: a process "
                    "it started inherited the pipe's write end and holds it")
        role = "the child" if first.role == "child" else "held open by"
        return f"; {role} {who}" + (f" (and {len(rel.parties) - 1} more)" if len(rel.parties) > 1 else "")
    if first.same and first.role == "interrupted":
        return (", which the code the handler interrupted, lower on its own stack, would release: that cannot run "
                "until the handler returns")
    if w.release in ("notifier", "producer", "consumer", "threads"):
        names = ", ".join(party(p, rank) for p in rel.parties[:3])
        if w.release == "threads":
            more = " ..." if len(rel.parties) > 3 else ""
            n = _nondaemon(w)
            if 0 < n < len(rel.parties):  # daemon-ness is not in a stack: say the count and the candidates
                among = "the one it waits for is" if n == 1 else f"the {n} it waits for are"
                return (f"; {among} among its threads still running: {names}{more} (a stack does not say which "
                        "threads are daemon threads)")
            return f"; its threads still running: {names}{more}"
        if w.resource == "process_queue" and first.kind == "process" and len(rel.parties) == 1 \
                and first.role in ("peer", "reader", "writer"):
            # the node found one process at the other end of the connection or pipe under it
            act = "send on it" if w.release == "producer" else "read from it"
            return f"; only {who} holds its other end, to {act}"
        role = {"notifier": "could set it", "producer": "could put into it",
                "consumer": "could take from it"}[w.release]
        return f"; the threads that {role}: {names}" + (" ..." if len(rel.parties) > 3 else "")
    if rel.none == "clients_exited":
        kids = ", ".join(party(p, rank) for p in rel.parties[:3]) + (" ..." if len(rel.parties) > 3 else "")
        return (f"; nobody has connected, and every process it started has exited ({kids}): a client it started "
                "to connect back never will")
    if w.release == "children" and first.feeders:
        return f"; the child {who}{_fed(first, rank)}"
    if w.release == "children" and first.kind == "process" and first.stdin and not first.state:
        # asleep reading its standard input, a pipe whose write end no process of the node holds (the node's
        # search found none): its writer is the launcher's own input from outside (an ssh or srun session)
        return (f"; the child {who}, which waits to read its standard input ({_q(first.reads, 30)}), a pipe that no "
                "process of the node holds open for writing (its other end is outside the node: the job's own input, "
                "from an ssh or srun session or a launcher): input that does not come there, an answer to a question "
                "it asks (to replace a file, for a password or a confirmation) or the end of what it reads")
    if w.release == "peer" and first.reading and len(rel.parties) == 1:
        return (f"; its peer is {who}, which is itself asleep reading its end of this same connection: each end waits "
                "for the other to send first, and neither will")
    if w.release in ("children", "writer", "reader", "lock_holder", "peer"):
        role = {"children": "the child", "writer": "the writer", "reader": "the reader", "lock_holder": "held by",
                "peer": "its peer is"}[w.release]
        more = f" (and {len(rel.parties) - 1} more)" if len(rel.parties) > 1 else ""
        if who.startswith("the rank itself") and w.release != "peer":
            return f"; {role} is {who}{more}"
        return f"; {role} {who}{more}"
    if w.release == "person" and w.operation == "terminal write":
        return ("; someone at that terminal must resume its output (Ctrl-Q), or the program holding the terminal (a "
                "tmux, screen or ssh session) must read it again")
    if w.release == "person":
        return "; someone at its terminal must type (or the program must not stop there)"
    if w.release == "tasks" and first.role in ("waker", "waker_unread"):
        names = ", ".join(party(p, rank) for p in rel.parties[:3]) + (" ..." if len(rel.parties) > 3 else "")
        if first.role == "waker_unread":
            return (f"; its loop has no timer due: I/O it watches (the node did not read which) or another thread "
                    f"(call_soon_threadsafe) must wake it: {names}")
        return (f"; its loop has no timer due and watches nothing but its own wake-up socket: only another thread "
                f"can complete what it awaits (call_soon_threadsafe): {names}")
    if w.release == "tasks":
        more = f" (and {len(rel.parties) - 1} more)" if len(rel.parties) > 1 else ""
        return f"; it watches I/O whose peer is {who}{more}"
    if w.release == "time":
        return ""
    return f"; {who}"


def _fed(child: Party, rank: Optional[RankSnapshot]) -> str:
    """`, which reads its input until its end (EOF), ...`: who holds the write end of the pipe a child reads."""
    holders = []
    for f in child.feeders[:3]:
        if f.same:
            holders.append("the rank itself")
        else:
            holders.append(f"pid {f.pid} {_q(f.name, 80)}" + (f" ({f.what})" if f.what else ""))
    more = " ..." if len(child.feeders) > 3 else ""
    text = (f", which reads its input ({_q(child.reads, 30)}) until its end (EOF), and that pipe's write end is still "
            f"open in {', '.join(holders)}{more}: its input never ends")
    if any(f.same for f in child.feeders):
        text += ", while the rank waits for the child: each waits for the other"
    return text


def ended(w: ThreadWait, rank: Optional[RankSnapshot]) -> str:
    """For an interpreter shutting down: how its main program ended (the last line of its error output, read on
    the node) and how many non-daemon threads it waits for (its `locks` local: one lock per such thread)."""
    if w.resource != "shutdown":
        return ""
    out = ""
    last = ""
    if rank is not None and rank.output:
        lines = [line.strip() for line in rank.output[0].text.splitlines() if line.strip()]
        last = lines[-1] if lines else ""
    if last:
        out += f" (its error output ends with {_q(last.split(']: ', 1)[-1], 160)})"
    n = _nondaemon(w)
    if n:
        out += f"; it waits for {n} non-daemon thread{'s' if n != 1 else ''} to end"
    return out


def _nondaemon(w: ThreadWait) -> int:
    """How many non-daemon threads an interpreter's shutdown waits for: its `locks` local (threading._shutdown)
    holds one lock per such thread; 0 where the locals were not read."""
    if w.resource != "shutdown":
        return 0
    locks = next((loc.repr for f in (w.frame,) if f is not None for loc in f.locals if loc.name == "locks"), "")
    return locks.count("lock at") if locks.startswith("[") else 0


def handler(w: ThreadWait) -> str:
    """` in a signal handler for SIGUSR1 that interrupted `step` (train.py:40)`."""
    if w.handler is None:
        return ""
    what = f" for {w.signal}" if w.signal else ""
    on = f" that interrupted {named(w.interrupted)}" if w.interrupted is not None else ""
    return f", in a signal handler{what} ({named(w.handler)}){on}"


def chain_text(links: Sequence[Link], rank: Optional[RankSnapshot]) -> str:
    """The chain from the culprit's thread to the root: each step's wait, then who can release it."""
    parts: List[str] = []
    for i, link in enumerate(links):
        w = link.wait
        if i == 0:
            parts.append(f"{operation(w)}{where(w)}{handler(w)}, {resource(w, link.release)}{ended(w, rank)}"
                         f"{release(link, rank)}{_gil_kept(link, rank)}")
            continue
        if link.release.parties and link.release.parties[0].role == "cycle" and link.release.parties[0].kind == "rank":
            # another rank that holds what the first waits for, waiting in a collective that needs the first
            back = link.release.parties[0]
            parts.append(f"that one is {operation(w)}{where(w)}, which cannot finish without "
                         f"{party(back, None)} (the first): each waits for the other, a deadlock")
            break
        if link.release.parties and link.release.parties[0].role == "cycle":
            back = link.release.parties[0]
            again = next((k for k in links[:i] if (k.who.node, k.who.pid, k.who.tid) == (back.node, back.pid, back.tid)),
                         None)
            if not any((k.who.node, k.who.pid) == (link.who.node, link.who.pid) for k in links[:i]):
                # a party not described yet (another process at the other end of a pipe): its own wait first
                parts.append(f"that one is {operation(w)}{where(w)}, {resource(w, link.release)}")
            if again is None or again is links[0]:
                parts.append("which waits for the first: a deadlock")
            else:
                parts.append(f"which waits for {party(again.who, rank)} again: a deadlock")
            break
        inside = ""
        if links[i - 1].release.parties and links[i - 1].release.parties[0].role == "loop" \
                and w.resource != "event_loop":
            inside = " (inside a coroutine: a synchronous call there stops the whole event loop)"
        parts.append(f"that one is {operation(w)}{where(w)}{inside}, {resource(w, link.release)}"
                     f"{release(link, rank)}")
    return "; ".join(parts)


def _gil_kept(link: Link, rank: Optional[RankSnapshot]) -> str:
    """`; it holds the GIL in that call ...`: native code that waits in the kernel without releasing the GIL stops
    the rank's other Python threads too (py-spy says which thread owns it)."""
    if rank is None or link.who.kind != "thread" or link.who.pid != rank.pid:
        return ""
    t = next((t for t in rank.threads if t.tid == link.who.tid), None)
    if t is None or not t.owns_gil or t.state not in ("S", "D"):
        return ""
    others = sum(1 for o in rank.threads if o is not t and any(not f.native for f in o.frames))
    if not others:
        return ""
    them = "the rank's other Python thread" if others == 1 else f"the rank's {others} other Python threads"
    return f"; it holds the GIL in that call (native code that did not release it), so {them} cannot run until it returns"


def rank_name(r: RankSnapshot) -> str:
    return f"rank {r.rank}" if r.rank is not None else f"pid {r.pid}"


def blocked_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, WaitEvidence)
    r = e.rank
    who = rank_name(r)
    if e.whole:
        subject = f"all {e.size} ranks (like {who} on {clean(r.node, 60)}) are"
    else:
        subject = f"{who}'s main thread is"
    title = f"{subject} {chain_text(e.links, r)}"
    w = e.wait
    detail_parts = [f"{who} on {clean(r.node, 60)}, pid {r.pid}"]
    if w.site is not None:
        detail_parts.append(f"{_q(w.operation, 60)} {clean(w.site.reason, 200)}")
    elif w.reason:
        detail_parts.append(clean(w.reason, 200))
    if w.how:
        detail_parts.append(f"it waits inside {_q(w.how, 60)}")
    if w.syscall:
        detail_parts.append(f"the kernel: {_q(w.syscall, 30)}" + (f" in {_q(w.wchan, 40)}" if w.wchan else ""))
    if w.handler is not None:
        detail_parts.append(f"it runs in a signal handler{' for ' + w.signal if w.signal else ''} "
                            f"({named(w.handler)}) on top of {named(w.interrupted) if w.interrupted else 'its code'}")
    detail = "; ".join(detail_parts) + "."
    if e.odd and e.links[-1].release.nobody:
        reason = "the stacks single this rank out, and nothing can release what it waits for"
    elif e.odd:
        reason = "the stacks single this rank out, and its own stack says what it waits for"
    elif e.whole:
        reason = "every rank waits the same way, outside any collective"
    else:
        reason = "its stack says what it waits for; but the stacks do not single this rank out"
    return clean(title, 600), detail, reason
