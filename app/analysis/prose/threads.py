"""Sentences for what threads of one rank wait for: locks (and deadlocks), the GIL held in native code, a native
call that does not return, a write to a full pipe, point-to-point calls."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

from app.analysis.facts import Fact
from app.analysis.fold import fold_nodes, short_keys
from app.analysis.frames import clean, is_library, named
from app.analysis.locks import LockEvidence, LockEdge, blocked, held_name
from app.model import Frame, PipeReader, RankSnapshot, ThreadStack

Text = Tuple[str, str, str]


def thread_label(t: ThreadStack) -> str:
    if t.is_main:
        return "main thread"
    return f"thread `{clean(t.name, 60)}`" if t.name else f"thread {t.tid}"


def _python(frames: Sequence[Frame]) -> list:
    return [f for f in frames if not f.native]


def thread_where(t: ThreadStack) -> str:
    """Where a thread is, in the job's own code: `save` (job.py:130), in `Event.wait` when it is in a library."""
    frames = _python(t.frames)
    if not frames:
        return f"`{clean(t.frames[0].function, 80)}`" if t.frames else "an unknown place"
    own = next((f for f in frames if not is_library(f)), None)
    if own is None or own is frames[0]:
        return named(frames[0])
    # the outermost library frame below the job's code names the call it made (Event.wait, Queue.get, ...)
    calls = frames[:frames.index(own)]
    return f"{named(own)}, in `{clean(calls[-1].function, 80)}`"


def rank_name(r: RankSnapshot) -> str:
    return f"rank {r.rank}" if r.rank is not None else f"pid {r.pid}"


def _other_end_of(r: RankSnapshot, t: ThreadStack) -> str:
    """What a thread asleep in a system call waits for, where the node read the call's fd and found its other end:
    `, waiting for data from `/run/agent.sock`; its peer is pid 303 `agent``; "" otherwise."""
    from app.analysis.blocking import thread_wait
    from app.analysis.prose.waits import release as release_text, resource
    from app.analysis.release import Context, Link, Party, release

    if t.waits is None:
        return ""
    w = thread_wait(t, r.hold)
    if w.release not in ("peer", "writer", "reader", "lock_holder"):
        return ""
    rel = release(w, t, Context(r))
    if not rel.parties:
        return ""
    link = Link(Party("thread", r.node, r.pid, t.tid, r.rank, t.name), w, rel)
    return f", {resource(w, rel)}{release_text(link, r)}"


def waits_back_for(r: RankSnapshot, holder: ThreadStack, waiter: ThreadStack) -> str:
    """What a lock's holder waits for, when the only thread tied to it (whose frames hold the object) is the one
    waiting for the lock: `waiting for the event `self.done` to be set`; "" otherwise."""
    from app.analysis.prose.waits import resource
    from app.analysis.release import Context, release

    ctx = Context(r)
    w = ctx.wait_of(holder)
    if w.release not in ("notifier", "producer", "consumer"):
        return ""
    rel = release(w, holder, ctx)
    tied = [p for p in rel.parties if not p.same]
    if len(tied) != 1 or tied[0].role == "any" or tied[0].tid != waiter.tid:
        return ""
    return resource(w, rel)


def lock_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, LockEvidence)
    r = e.rank
    who = rank_name(r)
    if e.cycle:
        cycle = list(e.cycle)
        parts = [f"{thread_label(x.waiter.thread)} holds `{clean(held_name(x, cycle), 80)}` and waits for "
                 f"`{clean(x.waiter.key[1], 80)}` ({x.waiter.frame.location})" for x in cycle]
        names = " and ".join(thread_label(x.waiter.thread) for x in cycle)
        return (clean(f"{who} is deadlocked: its {names} wait for each other's locks", 300),
                "; ".join(parts) + ". Neither can go on; the rank never reaches its next collective, so the others "
                "wait for it. Fix the lock order (always take them in one order).",
                "a cycle of threads each waiting for a lock another holds, from their stacks and source")
    edge = e.edge
    assert edge is not None
    w = edge.waiter
    where = f"`{clean(w.header, 120)}` ({w.frame.location})"
    if edge.holder is not None:
        holder_at = thread_where(edge.holder)
        title = (f"{who}'s {thread_label(w.thread)} waits for `{clean(w.key[1], 80)}`, which its "
                 f"{thread_label(edge.holder)} holds while it is in {holder_at}")
        back = waits_back_for(r, edge.holder, w.thread)
        if back:
            title += f", {back}, which only its {thread_label(w.thread)} would give: a deadlock"
        detail = (f"{thread_label(w.thread)} is blocked entering {where}; {thread_label(edge.holder)} is inside a "
                  f"`with {clean(w.key[1], 80)}:` block and {'waits' if blocked(edge.holder) else 'runs'} in "
                  f"{holder_at}, so the lock is not released")
        if e.odd:
            detail += "; this is why the rank is not where the others are, and they wait for it"
        detail += ". Check why that thread does not finish (what it waits for), or do not hold the lock " \
                  "while waiting."
        if f.strength == "high":
            reason = ("the rank the stacks single out is blocked on a lock another of its threads holds while it "
                      "waits itself")
        elif blocked(edge.holder):
            reason = "a thread waits for a lock another blocked thread holds"
        else:
            reason = "the holder is running: it may release the lock soon"
        return clean(title, 300), detail, reason
    title = f"{who}'s {thread_label(w.thread)} waits to enter {where}, and no thread of it is in that block"
    detail = ("no stack of the rank is inside a `with " + clean(w.key[1], 80) + ":` block: the lock was "
              "taken with acquire() elsewhere, or by a thread that is gone without releasing it.")
    return clean(title, 300), detail, "the holder is not visible in the stacks"


def edge_label(e: LockEdge) -> str:
    return f"`{clean(e.waiter.key[1], 60)}` at {e.waiter.frame.location}"


def pipe_reader(r: RankSnapshot) -> Tuple[str, str]:
    """(who holds the pipe's read end, in a few words; the detail on every reader) from the node's search of
    /proc (ProcessHold.pipe_readers); ("", "") when it was not searched, ("", why) when nobody was found."""
    hold = r.hold
    if hold is None or not hold.pipe:
        return "", ""
    readers = hold.pipe_readers
    if not readers:
        if not hold.pipe_search_complete:
            return "", (f"The node's /proc was searched for the other end of {clean(hold.pipe, 40)} within its "
                        "limits and no reader was found; `ls -l /proc/*/fd | grep` the inode to look further.")
        return "", (f"No process holds {clean(hold.pipe, 40)} open for reading: its reader has exited and the "
                    "write should fail with EPIPE; a reader in another PID namespace is not visible from the node.")

    def one(p: PipeReader) -> str:
        what = " ".join(p.cmdline) or p.comm
        if p.pid == r.pid:
            return f"{short_keys(((r.node, r.pid),), (r.rank,))} itself"
        rel = " (its child)" if p.ppid == r.pid else (" (its parent)" if p.ppid is not None and p.pid == r.ppid
                                                     else "")
        return f"pid {p.pid} `{clean(what, 80)}`{rel}"

    def doing(p: PipeReader) -> str:
        state = READER_STATES.get(p.state)
        if state:
            return state
        return f"asleep in {clean(p.wchan, 60)}" if p.wchan else "asleep"

    first = readers[0]
    short = one(first) + (f" (and {len(readers) - 1} more)" if len(readers) > 1 else "")
    detail = "; ".join(f"{one(p)} holds the read end of {clean(hold.pipe, 40)} and is {doing(p)}" for p in readers)
    detail += (": it never drains the pipe. Make it read (or end it and let the rank see EPIPE), or send the "
               "rank's output to a file instead of a pipe.")
    return clean(short, 200), detail


def _readers_all(r: RankSnapshot, held: Callable[[PipeReader], bool]) -> Tuple[int, ...]:
    """The pids of a full pipe's readers (other than the rank) when every one is held as `held` says, else ()."""
    readers = r.hold.pipe_readers if r.hold is not None else ()
    if readers and all(held(p) and p.pid != r.pid for p in readers):
        return tuple(p.pid for p in readers)
    return ()


def readers_writing(r: RankSnapshot) -> Tuple[int, ...]:
    """The pids of a full pipe's readers when every one is itself asleep writing to a full pipe (wchan pipe_write):
    it does not read because its own output is not read; when that reader is the rank's child, its output pipe is
    most often the rank's to read (Popen with stdin and stdout piped, fed in full before its output is read)."""
    return _readers_all(r, lambda p: p.state == "S" and "pipe_write" in p.wchan)


def readers_stopped(r: RankSnapshot) -> Tuple[int, ...]:
    """The pids of a full pipe's readers when every one is stopped (state T: SIGSTOP, Ctrl-Z of a `| tee`), else
    (): resuming them is what drains the pipe."""
    return _readers_all(r, lambda p: p.state == "T")


READER_STATES = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible sleep (D)",
                 "Z": "a zombie", "R": "running"}


def nodes_of(r: RankSnapshot) -> str:
    return fold_nodes([r.node])


def _line_text(f: Frame) -> str:
    text = next((src for n, src in f.source if n == f.line), "")
    return f" `{clean(text.strip(), 100)}`" if text.strip() else ""


def _single_reason(odd: bool, why: str) -> str:
    return why + ("; and the stacks single this rank out" if odd else
                  "; but the stacks do not single this rank out, so it may not be what the others wait for")


def _held_up_by(r: RankSnapshot, t: ThreadStack) -> str:
    """When the main thread waits for a lock that thread `t` holds (a logging handler's, say), what it waits in,
    so that the sentence starts where the rank is stuck: `main thread is blocked in ..., waiting for ...`; ""
    otherwise."""
    from app.analysis.blocking import thread_wait
    from app.analysis.prose.waits import operation, resource, where
    from app.analysis.release import Context, release

    from app.analysis.prose.stacks import exiting_frames

    main = r.main_thread
    if main is None or main.tid == t.tid or not main.frames:
        return ""
    w = thread_wait(main, r.hold)
    if w.release not in ("holder", "joined"):  # it waits for t's lock, or for t to end
        return ""
    rel = release(w, main, Context(r))
    if not rel.parties or rel.parties[0].tid != t.tid:
        return ""
    # a main thread whose stack starts in the interpreter's exit code (no program root below it)
    outer = main.frames[-1]
    exits = (f" as its interpreter exits (in `{clean(outer.function, 60)}`: its main program has ended)"
             if exiting_frames(main.frames[::-1]) else "")
    link = ", held by its " if w.release == "holder" else ": its "
    return f"main thread is {operation(w)}{where(w)}{exits}, {resource(w, rel)}{link}"


def native_text(f: Fact) -> Text:
    from app.analysis.native import NativeEvidence

    e = f.data
    assert isinstance(e, NativeEvidence)
    r, t, frame = e.rank, e.thread, e.frame
    who = short_keys(((r.node, r.pid),), (r.rank,))
    node = clean(r.node, 60)
    if f.kind == "gil_held":
        assert frame is not None
        others = e.others
        if len(others) == 1:
            stuck = f"; its other Python thread, {thread_label(others[0])}, cannot run"
        elif others:
            stuck = (f"; its {len(others)} other Python threads ({', '.join(thread_label(o) for o in others[:3])}"
                     f"{', ...' if len(others) > 3 else ''}) cannot run")
        else:
            stuck = ""
        title = (f"{who}'s {thread_label(t)} holds the GIL while blocked in native code called from {named(frame)}: "
                 f"it sleeps in `{clean(t.syscall, 40)}`{_other_end_of(r, t)}{stuck}")
        detail = (f"{who} on {node}: py-spy says its {thread_label(t)} owns the GIL, and /proc says it "
                  f"sleeps in the kernel in `{clean(t.syscall, 40)}` (wchan {clean(t.wchan or '?', 60)}), called from "
                  f"{named(frame)}{_line_text(frame)}. CPython releases the GIL around its own blocking calls, so this "
                  f"is native code that kept it (a ctypes.PyDLL call, or a C extension without "
                  f"Py_BEGIN_ALLOW_THREADS); no other thread of the process can run Python until it returns. "
                  f"`py-spy dump --native --pid {r.pid}` on {node} shows the C frames")
        return title, detail, _single_reason(
            e.odd, "the thread owns the GIL and sleeps in the kernel, which CPython's own calls never do")
    if f.kind == "native_call":
        assert frame is not None
        title = (f"{who}'s main thread is inside a native call that does not return, made at {named(frame)}: it "
                 f"sleeps in `{clean(t.syscall, 40)}` with the GIL released")
        detail = (f"{who} on {node}: its innermost Python frame is the job's own {named(frame)}{_line_text(frame)}, "
                  f"with no Python wait below it, and /proc says the thread sleeps in the kernel in "
                  f"`{clean(t.syscall, 40)}` (wchan {clean(t.wchan or '?', 60)}): a C function (a ctypes call, a C "
                  f"extension) that waits for something that does not come. `py-spy dump --native --pid {r.pid}` or "
                  f"`gdb -p {r.pid}` on {node} (hangscope --native / --gdb) shows which")
        return title, detail, _single_reason(
            e.odd, f"the main thread sleeps in `{clean(t.syscall, 40)}` right below the job's own code")
    at = f" in {named(frame)}" if frame is not None else ""
    reader, reader_detail = pipe_reader(r)
    waiting = _held_up_by(r, t)
    title = (f"{who}'s {waiting}{thread_label(t)}"
             f"{', which' if waiting else ''} is blocked writing to a full pipe{at}: "
             + (f"{reader}, which holds its read end, {'is stopped: it ' if readers_stopped(r) else ''}does not read"
                + (": it is itself blocked writing to a full pipe (its own output is not read)"
                   if readers_writing(r) else "")
                if reader else "the process reading the other end has stopped reading"))
    detail = (f"{who} on {node}: its {thread_label(t)} sleeps in `{clean(t.syscall, 40)}` with the kernel "
              f"in {clean(t.wchan, 60)}: the pipe's buffer is full and nothing drains it"
              f"{' (from ' + named(frame) + _line_text(frame) + ')' if frame is not None else ''}. " + (reader_detail or
              f"Find the reader with `ls -l /proc/{r.pid}/fd` (the pipe:[inode]) and the process holding that "
              f"pipe's read end; a log shipper, a `| tee` or a parent that never reads the rank's stdout is the "
              f"usual one"))
    return title, detail, _single_reason(e.odd, "the thread sleeps in write() on a pipe whose buffer is full")


# Ranks each blocked receiving from the next: no send is waiting to be matched, so no ordering of the pairs helps;
# each has no more to send to the other where the other expects one more
RECV_CYCLE = ("Each waits for a message the other is not going to send: they disagree on what passes between them "
              "(how many messages: a microbatch count each side derives on its own; in which order: a pipeline "
              "schedule that differs between stages, forwards against backwards; or a message skipped on one side, "
              "for an empty or masked microbatch)")


def ring_order(ring: Sequence[Any]) -> Optional[Tuple[str, List[Tuple[Any, str]]]]:
    """The ranks of a receive cycle by their outermost loop's value, highest first, when they stand in different
    iterations of it (the first variable whose integer values differ): (name, [(call, value), ...])."""
    values = [dict(c.outer) for c in ring]
    for name in (n for n, _ in ring[0].outer):
        got = [v.get(name) for v in values]
        if any(x is None or not x.lstrip("-").isdigit() for x in got) or len(set(got)) < 2:
            continue
        return name, sorted(zip(ring, got), key=lambda cv: -int(cv[1]))  # type: ignore[arg-type]
    return None


def ahead_in_ring(ring: Sequence[Any]) -> str:
    """"rank 7 is at step=6, rank 5 still at step=5", or ""."""
    found = ring_order(ring)
    if found is None:
        return ""
    name, order = found
    behind = ", ".join(f"rank {c.rank} still at {clean(name, 30)}={clean(v, 20)}" for c, v in order[1:])
    return f"rank {order[0][0].rank} is at {clean(name, 30)}={clean(order[0][1], 20)}, {behind}"


def p2p_text(f: Fact) -> Text:
    from app.analysis.p2p import P2PCall, P2PEvidence
    from app.analysis.prose.words import where

    e = f.data
    assert isinstance(e, P2PEvidence)

    def who(c: P2PCall) -> str:
        return f"rank {c.rank}" if c.rank is not None else f"pid {c.key[1]}"

    if e.ring:
        ring = e.ring
        parts = [f"{who(c)} waits in {c.op} ({named(c.frame)}) for rank {c.peer} ({clean(c.argument, 40)})"
                 for c in ring]
        names = " and ".join(who(c) for c in ring)
        if all(c.op == "recv" for c in ring):
            parts = [p + (f", in {clean(c.loop, 120)}" if c.loop else "") for p, c in zip(parts, ring)]
            ahead = ahead_in_ring(ring)
            title = f"{names} are deadlocked in point-to-point calls: each waits to receive from the other" + (
                f"; {ahead}" if ahead else "")
            return (clean(title, 300), "; ".join(parts) + ". " + RECV_CYCLE,
                    "a cycle of ranks each blocked in recv from the next, read from the calls' arguments")
        return (clean(f"{names} are deadlocked in point-to-point calls: each waits for the other", 300),
                "; ".join(parts) + ". Neither call can complete: every send needs the peer's matching recv. Make the "
                "pairs match (one side sends while the other receives: order them by rank, or use batch_isend_irecv)",
                "a cycle of ranks each blocked in send/recv towards the next, read from the calls' arguments")
    if e.tags:
        return _tags_text(f, e)
    c = e.call
    assert c is not None and e.peer_class is not None
    pc = e.peer_class
    elsewhere = f"in `{pc.collective}`" if pc.collective else where(pc)
    return (clean(f"{who(c)} waits in {named(c.frame)} for rank {c.peer} ({clean(c.argument, 40)}), which is "
                  f"{elsewhere}", 300),
            f"{who(c)}'s {c.op} names rank {c.peer} as its peer ({clean(c.argument, 40)}), and rank {c.peer} is not in "
            f"a matching {'recv' if c.op == 'send' else 'send'}: it is {elsewhere}. The two ranks disagree on what "
            "comes next (a send or recv one of them skipped, or a collective issued between them)",
            "the call's own argument names the peer, and the peer's stack shows it elsewhere; which of the two took "
            "the wrong path is not known")


def _tags_text(f: Fact, e: Any) -> Text:
    """Pairs of sends and receives that name each other and wait, their tags different."""
    pairs = list(zip(e.tags[0::2], e.tags[1::2]))
    odd = {k for k in f.who.keys}

    def side(c: Any) -> str:
        written = f" (tag={clean(c.tag_text, 40)})" if c.tag_text and c.tag_text != c.tag else ""
        return f"rank {c.rank}'s {c.op} {'to' if c.op == 'send' else 'from'} rank {c.peer} carries tag {c.tag}{written}"

    a, b = pairs[0]
    lead, other = (a, b) if a.key in odd else (b, a)
    title = clean(f"{side(lead)} where {side(other).replace(' carries ', ' expects ')}: a send meets only a recv of "
                  "the same tag, so neither completes", 300)
    usual = (f"; most waiting calls carry tag {clean(e.usual, 20)}" if e.usual else "")
    detail = clean("; ".join(f"{side(x)}, {side(y)}" for x, y in pairs[:4]) + usual + ". Each pair names each "
                   "other and runs in opposite directions, so only the tag keeps them apart: the tag is computed from "
                   "each rank's own values, and those went apart", 500)
    return (title, detail, "the calls' own arguments: the peers match, the tags do not")


def p2p_clause(f: Fact) -> str:
    """What a rank's unmatched send or recv waits for, as a clause the headline adds to a stack fact's sentence
    about the same rank (`rank 7 is in recv while 7 others wait in all_reduce`): the peer the call's argument
    names, where that peer is, and, when it waits in a collective of its own, that the collective waits for this
    rank back (the wait graph's edge): neither goes on. "" for a cycle of p2p calls (its own fact says it)."""
    from app.analysis.p2p import P2P, P2PEvidence
    from app.analysis.prose.words import where

    e = f.data
    if not isinstance(e, P2PEvidence) or e.call is None or e.peer_class is None:
        return ""
    c, pc = e.call, e.peer_class
    wants = "to send to it" if c.op == "recv" else "to receive from it" if c.op == "send" else "to match it"
    text = f"it waits for rank {c.peer} ({clean(c.argument, 40)}) {wants}"
    if pc.collective and pc.collective not in P2P:
        return (f"{text}, and rank {c.peer} waits in `{clean(pc.collective, 40)}`, which cannot finish without this "
                "rank: neither goes on (one of them skipped its part: a send or recv, or that collective)")
    return f"{text}; rank {c.peer} is {where(pc)}"
