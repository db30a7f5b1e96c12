"""What every thread waits for: its blocking operation, the resource it waits on, and where in the job's code.

One pure function, `thread_wait`, reads a thread's frames (innermost first, Python and native), its kernel
state (state letter, wait channel, system call, and what the node found at the other end of the call's file
descriptor), its locals, and how it moved between samples, and returns a typed `ThreadWait`:

1. What holds the process or thread comes first: stopped, traced, frozen (the freezer's wait channel is the
   answer even where the node's cgroup view lacks the freezer's cgroup), in uninterruptible sleep, exited.
2. A signal handler running on top of the frame it interrupted is named as such, and its own wait read.
3. The wait sites of app/analysis/sites.py: the outermost library frame that is a site, below the job's own
   code, is the call the job made (`Future.result`, not the `Condition.wait` it waits in); torch.distributed's
   collectives and point-to-point calls are sites too (frames.py's table).
4. A C call from a Python line (`sock.recv(...)`, `time.sleep(1)`, `input()`): the call is read from the
   line's text, checked against the receiver's type (locals) and the system call the thread sleeps in.
5. Else the kernel's own facts (KERNEL_SITES), said as what they are: the mechanism is then not known.
6. A thread that runs: computing, or spinning in a loop (a core's worth of CPU, the same frames).

Nothing here decides who is to blame or writes a sentence: release.py finds who can end each wait, and the
text layer says it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, List, Optional, Sequence, Tuple

from app.analysis.frames import bare_name, collective_of, is_library, is_machinery
from app.analysis.sites import CALL_SITES, Release, Resource, Site, frame_site, kernel_site, native_site, norm
from app.model import Frame, KernelWait, LoopInfo, ProcessHold, ThreadStack, WaitFd

ThreadState = str  # one of STATES
STATES = ("blocked", "running", "spinning", "stopped", "traced", "frozen", "disk", "exited", "unknown")
HOLD_STATES = {"stopped": "stopped", "traced": "traced", "frozen": "frozen", "disk_sleep": "disk",
               "zombie": "exited", "exiting": "exited", "gone": "exited"}
# system calls a C function can sleep in for ever that no Python-level call on the line explains
NATIVE_WAITS = frozenset({"pause", "futex", "rt_sigsuspend", "rt_sigtimedwait", "wait4", "waitid", "semop",
                          "semtimedop", "msgrcv"})
SPIN_CPU = 0.5  # a core's share between samples above which a thread that stays put spins
SPIN_CPU_LOADED = 0.1  # ... at its own `while` loop: a spin on a busy machine still takes this much
# A thread on a CPU at one line of a loop's body may spin there or compute a long step there (a matrix product
# runs in C under one Python line): two samples a second apart cannot tell. It is said to spin when it tests its
# loop's condition (it stands on the `while` header), or when it has stood at that line this long.
SPIN_PROOF_S = 10.0
MAX_LINE = 400  # characters of a source line read for the call it makes
MAX_DETAIL = 200


@dataclass(frozen=True)
class Detail:
    """A named fact about a wait, from the locals, the line or the kernel: ("key", "'ready_3'")."""

    name: str
    value: str


@dataclass(frozen=True)
class ThreadWait:
    """What one thread is doing or waiting for. `operation` as the user knows it ("Future.result",
    "socket.recv", "time.sleep"); `resource` from sites.Resource; `release` the rule that finds who can end it."""

    state: ThreadState
    operation: str = ""
    resource: Resource = "unknown"
    release: Release = "unknown"
    site: Optional[Site] = None  # the table entry it rests on (its reason), when a Python site matched
    frame: Optional[Frame] = None  # the frame of the blocking call (a library's), or the line making a C call
    caller: Optional[Frame] = None  # the job's own innermost frame: where in the job's code
    how: str = ""  # the innermost wait below the operation ("Condition.wait"), when it differs
    syscall: str = ""
    wchan: str = ""
    kernel: str = ""  # the kernel site's operation when that is all there is ("futex wait")
    reason: str = ""  # why this is what it waits on (the site's reason, or the kernel site's)
    poll: Optional[LoopInfo] = None  # the loop around a sleep or a spin: what it polls for
    handler: Optional[Frame] = None  # a signal handler's frame, running on top of `interrupted`
    interrupted: Optional[Frame] = None
    signal: str = ""  # the signal the handler runs for, from its argument
    details: Tuple[Detail, ...] = ()  # identities: the lock's expression, the key, the fd, the peer, the timeout
    by: str = ""  # what named it: "frame", "call", "kernel_wait" (the node's read of the call), "kernel", "state", "cpu"
    cpu: Optional[float] = None  # CPU share of one core between samples, when known
    collective: str = ""  # a torch.distributed collective or p2p call, by name

    @property
    def known(self) -> bool:
        """A mechanism is named (a site, a collective, a state), not only the kernel's facts."""
        return self.by in ("frame", "call", "state", "cpu", "kernel_wait") and self.resource != "unknown"

    def detail(self, name: str) -> str:
        return next((d.value for d in self.details if d.name == name), "")


@dataclass(frozen=True)
class Motion:
    """How a thread (or its process) moved between the last two samples."""

    cpu: Optional[float] = None  # share of one core
    moved: bool = False  # its stack or loop iteration changed
    moved_own: bool = False  # its innermost frame of the job's own code changed (the function, file or line)
    rising: Tuple[str, ...] = field(default=())  # loop counters whose values rose
    running_before: bool = False  # it was on a CPU (state R) in the previous sample too
    stayed_s: float = 0.0  # seconds its innermost own frame has stood where it is, over the samples


def _python(frames: Sequence[Frame]) -> List[Frame]:
    return [f for f in frames if not f.native]


def line_text(f: Frame) -> str:
    """The source of the line a frame is at ("" where the node did not read it)."""
    return next((src for n, src in f.source if n == f.line), "")


def _line(f: Frame) -> str:
    return line_text(f)[:MAX_LINE]


def _local(f: Frame, name: str) -> Optional[str]:
    for loc in f.locals:
        if loc.name == name:
            return loc.repr[:MAX_DETAIL]
    return None


def innermost_own(frames: Sequence[Frame]) -> Optional[Frame]:
    """The job's own innermost Python frame (not a library's nor the interpreter's machinery)."""
    for f in frames:
        if not f.native and not is_library(f) and not is_machinery(f.function, f.filename):
            return f
    return None


# --- calls on a line -------------------------------------------------------------------------------------

_CALL = re.compile(r"((?:[A-Za-z_][A-Za-z_0-9]*\s*\.\s*)*)([A-Za-z_][A-Za-z_0-9]*)\s*\(")
_STRING = re.compile(r"""[rbfuRBFU]{0,2}("([^"\\]|\\.){0,200}"|'([^'\\]|\\.){0,200}')""")


@dataclass(frozen=True)
class Call:
    receiver: str  # "self._sock", "time", "" for a bare call
    name: str
    args: str  # the text after the parenthesis, up to the line's end


def calls(line: str) -> List[Call]:
    """The calls a line makes, outermost first by position: `x = store.wait([key])` -> store.wait."""
    out = []
    for m in _CALL.finditer(line[:MAX_LINE]):
        receiver = re.sub(r"\s+", "", m.group(1)).rstrip(".")
        out.append(Call(receiver, m.group(2), line[m.end():m.end() + MAX_DETAIL]))
    return out


_OPAQUE = re.compile(r"<cell at 0x[0-9a-fA-F]+>")  # a closure's cell: py-spy shows the cell, not what it holds


def _receiver_repr(f: Frame, receiver: str) -> Optional[str]:
    """The repr of a call's receiver from the frame's locals (`store` -> `<TCPStore at 0x...>`), when the
    receiver is a plain name (an attribute chain's value is not in the locals) and the repr shows the object
    (a closure variable shows as its cell: its type is not known)."""
    if not receiver or "." in receiver:
        return None
    rep = _local(f, receiver)
    return None if rep is None or _OPAQUE.fullmatch(rep.strip()) else rep


def call_site(f: Frame, syscall: str) -> Optional[Tuple[Site, Call]]:
    """The CALL_SITES entry for the C call a frame's current line makes, checked against the receiver's type and
    the system call the thread sleeps in; the innermost (last) matching call on the line wins ties."""
    line = _line(f)
    if not line:
        return None
    found: Optional[Tuple[Site, Call]] = None
    for c in calls(line):
        for site in CALL_SITES:
            if c.name not in site.functions:
                continue
            if site.module and c.receiver.rsplit(".", 1)[-1] != site.module:
                continue
            if not site.module and site is not _INPUT and not c.receiver and site.receiver:
                continue  # a method site needs a receiver
            if site is _INPUT and c.receiver:
                continue
            if syscall and site.syscalls and syscall not in site.syscalls:
                continue
            if site.receiver:
                rep = _receiver_repr(f, c.receiver)
                if rep is not None and not re.search(site.receiver, rep):
                    continue
                if rep is None and not _receiver_name_fits(c.receiver, site) and \
                        not (site.kernel_confirms and syscall in site.syscalls):
                    continue
            found = (site, c)
            break
    return found


_INPUT = next(s for s in CALL_SITES if s.operation == "input()")
_RECEIVER_WORDS = {"socket": ("sock", "conn", "socket", "client", "server", "s"),
                   "store_key": ("store",), "lock": ("lock", "mutex", "sem", "semaphore", "_lock"),
                   "collective": ("work", "handle", "req", "request", "fut"),
                   "device": ("cuda", "stream", "event", "torch")}


def _receiver_name_fits(receiver: str, site: Site) -> bool:
    """Without the receiver's type (no locals, or an attribute), its name must look like the site's kind."""
    last = receiver.rsplit(".", 1)[-1].lower().strip("_")
    words = _RECEIVER_WORDS.get(site.resource, ())
    return any(last == w or (len(w) > 2 and (last.endswith(w) or last.startswith(w))) for w in words)


# --- identities ------------------------------------------------------------------------------------------


_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_SIMPLE_VALUE = re.compile(r"""-?\d{1,20}|"[^"\\{}]{0,100}"|'[^'\\{}]{0,100}'""")


def _keys(text: str, at: Frame) -> Tuple[List[str], List[str]]:
    """The string literals of a call's arguments: (keys, templates). An f-string with placeholders is a template
    (its value is built at run time): it is a key only when every placeholder is a plain name whose local the stack
    holds as an int or a string (f"ready_{rank}" with rank=3 is "ready_3"); else it is kept as written."""
    keys: List[str] = []
    templates: List[str] = []
    for m in _STRING.finditer(text[:MAX_DETAIL]):
        literal = m.group(1)[:MAX_DETAIL]
        prefix = m.group(0)[:len(m.group(0)) - len(m.group(1))].lower()
        if "f" not in prefix or "{" not in literal:
            keys.append(literal)
            continue
        parts: List[str] = []
        for name in _PLACEHOLDER.findall(literal):
            value = _local(at, name) if name.isidentifier() else None
            if value is None or not _SIMPLE_VALUE.fullmatch(value):
                break
            parts.append(value.strip("\"'"))
        else:
            values = iter(parts)
            keys.append(_PLACEHOLDER.sub(lambda _m, v=values: next(v), literal))
            continue
        templates.append("f" + literal)
    return keys, templates


def _first_arg(args: str) -> str:
    depth = 0
    for i, ch in enumerate(args):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return args[:i].strip()
            depth -= 1
        elif ch == "," and depth == 0:
            return args[:i].strip()
    return args.strip()


def _identity(site: Site, call: Optional[Call], frame: Frame, caller: Optional[Frame]) -> Tuple[Detail, ...]:
    """What the wait is on, by name: the object the job's code called it on, the key, the duration, the path."""
    out: List[Detail] = []
    at = caller or frame
    if call is not None:
        if call.receiver and call.receiver not in ("self", site.module):
            out.append(Detail("object", call.receiver))
        arg = _first_arg(call.args)
        if arg:
            out.append(Detail("argument", arg[:MAX_DETAIL]))
            names = re.findall(r"\b[A-Za-z_][A-Za-z_0-9]*\b", arg)
            for n in names[:4]:
                value = _local(at, n)
                if value is not None and n not in ("self",):
                    out.append(Detail(n, value))
        if site.resource == "store_key":
            keys, templates = _keys(call.args, at)
            if not keys and not templates and arg and arg.isidentifier():  # store.wait(keys): a local's value
                value = _local(at, arg)
                keys = [value] if value is not None and not _OPAQUE.fullmatch(value.strip()) else []
            out += [Detail("key", k) for k in keys[:4]]
            out += [Detail("key_template", k) for k in templates[:4]]
    elif caller is not None:
        # the job's own line that called into the library: `fut.result()`, `q.get(timeout=5)`
        for c in calls(_line(caller)):
            if c.name in site.functions or bare_name(site.operation) == c.name:
                if c.receiver and c.receiver != "self":
                    out.append(Detail("object", c.receiver))
                arg = _first_arg(c.args)
                if arg:
                    out.append(Detail("argument", arg[:MAX_DETAIL]))
                break
    if site.timeout:
        value = _local(frame, site.timeout)
        if value is not None:
            out.append(Detail("timeout", value))
    return tuple(out)


_SIGNAL_ARGS = ("signum", "sig", "signo", "signal_number", "signalnum")
SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 6: "SIGABRT", 10: "SIGUSR1", 12: "SIGUSR2", 14: "SIGALRM",
           15: "SIGTERM", 17: "SIGCHLD", 28: "SIGWINCH"}


def _handler(py: Sequence[Frame]) -> Optional[Tuple[int, str]]:
    """A signal handler on the stack: a frame whose arguments are (signum, frame) called from another frame that
    is not the signal module's (the interpreter runs a handler on top of whatever it interrupted). (index in
    `py`, the signal's name)."""
    for i, f in enumerate(py):
        names = [loc.name for loc in f.locals if loc.arg]
        if len(names) >= 2 and names[-2] in _SIGNAL_ARGS and names[-1] in ("frame", "stack", "frm", "_frame") \
                and i + 1 < len(py):
            value = _local(f, names[-2]) or ""
            number = int(value) if value.strip().isdigit() else None
            return i, (SIGNALS.get(number, f"signal {number}") if number is not None else "")
    return None


def _state_wait(t: ThreadStack, hold: Optional[ProcessHold], caller: Optional[Frame]) -> Optional[ThreadWait]:
    """What holds the process or the thread, whatever its stack shows."""
    entry = kernel_site(t.syscall, t.wchan)
    kernel_state = entry[4] if entry is not None and entry[3] == "kernel" and entry[2] == "unknown" else ""
    state = ""
    if kernel_state == "frozen":
        state = "frozen"  # the wait channel says so even where the cgroup file system does not show the freezer
    elif hold is not None and hold.kind in HOLD_STATES and hold.kind != "disk_sleep" and not hold.ours:
        state = HOLD_STATES[hold.kind]
    elif hold is None and (t.state == "T" or (t.state != "t" and kernel_state.startswith("stopped")
                                              and "tracer" not in kernel_state)):
        # stop letters and a stop's wait channel count only without a hold reading: they are read around the tools
        # (hangscope's own py-spy attaches and detaches thread by thread), the hold reading before any; and then only
        # a signal's stop: a tracing stop without the reading that names its tracer is ours as likely (health.py)
        state = "stopped"
    elif t.state in ("Z", "X"):
        state = "exited"
    elif t.state == "D" or (not t.state and hold is not None and hold.kind == "disk_sleep"):
        state = "disk"
    if not state:
        return None
    details: List[Detail] = []
    if state == "disk":
        on = hold.waits_on if hold is not None else ""
        if on:
            details.append(Detail("path", on[:MAX_DETAIL]))
        call = hold.syscall if hold is not None and hold.syscall else t.syscall
        return ThreadWait("disk", call or "kernel call", "file", "kernel", frame=caller, caller=caller,
                          syscall=call, wchan=t.wchan, reason="uninterruptible sleep: a kernel call that has not "
                          "returned (a file system, a device, a driver)", details=tuple(details), by="state")
    resource: Resource = "unknown"
    return ThreadWait(state, state, resource, "kernel", frame=caller, caller=caller, syscall=t.syscall,
                      wchan=t.wchan, reason=entry[5] if entry is not None and kernel_state else "", by="state")


# A call interrupted by a signal or a ptrace attach (py-spy's own, a sample earlier) resumes as restart_syscall, which
# names no call: the kernel function the thread sleeps in says which one it was.
_RESTARTED = (("poll_schedule_timeout", "poll"), ("do_select", "select"), ("core_sys_select", "select"),
              ("do_sys_poll", "poll"), ("hrtimer_nanosleep", "clock_nanosleep"), ("do_nanosleep", "clock_nanosleep"),
              ("futex", "futex"), ("do_epoll_wait", "epoll_wait"), ("ep_poll", "epoll_wait"),
              ("do_wait", "wait4"), ("sk_wait_data", "recvfrom"), ("unix_stream_read", "recvfrom"))


def real_syscall(syscall: str, wchan: str) -> str:
    """The system call a thread sleeps in, with restart_syscall named after the call it restarts."""
    if syscall != "restart_syscall":
        return syscall
    return next((name for prefix, name in _RESTARTED if wchan.startswith(prefix)), syscall)


def thread_wait(t: ThreadStack, hold: Optional[ProcessHold] = None, motion: Optional[Motion] = None) -> ThreadWait:
    """The typed wait of one thread (see the module doc)."""
    if t.syscall == "restart_syscall":
        from dataclasses import replace as _re

        t = _re(t, syscall=real_syscall(t.syscall, t.wchan))
    py = _python(t.frames)
    caller = innermost_own(t.frames)
    cpu = motion.cpu if motion is not None else None
    held = _state_wait(t, hold, caller)
    if held is not None:
        return held

    # A signal handler runs on top of the frame it interrupted: what it waits on is the thread's wait.
    handler = _handler(py)
    handler_frame = interrupted = None
    signame = ""
    if handler is not None:
        i, signame = handler
        handler_frame, interrupted = py[i], py[i + 1]
        inner = t.frames[:t.frames.index(handler_frame) + 1]
        w = thread_wait(ThreadStack(t.tid, t.name, t.active, t.owns_gil, inner, t.state, t.wchan, t.syscall,
                                    t.kernel_stack, t.is_main), None, motion)
        return _replace(w, handler=handler_frame, interrupted=interrupted, signal=signame,
                        caller=w.caller or handler_frame)

    running = t.state == "R" or (t.active and t.state not in ("S", "D") and t.syscall in ("", "running"))
    if running:
        polled = _polling_wait(py, caller, t)
        if polled is not None:
            return _replace(polled, cpu=cpu)
        return _running(t, caller, cpu, motion)

    found = _frame_sites(py, caller, t)
    if found is not None:
        return _replace(found, cpu=cpu)

    # entering a `with` block whose context manager is a C lock (threading.Lock's __enter__ has no Python frame)
    entering = _entering_with(py, t)
    if entering is not None:
        return _replace(entering, cpu=cpu)

    # a native frame (--native) that names the wait
    for f in t.frames:
        if not f.native:
            break  # only the native frames innermost of the Python ones are the call in progress
        named_site = native_site(f.function)
        if named_site is not None:
            _, resource, rel, op, reason = named_site
            return ThreadWait("blocked", op, resource, rel, frame=f, caller=caller, syscall=t.syscall, wchan=t.wchan,
                              reason=reason, by="frame", cpu=cpu, details=_kernel_details(t),
                              collective=op if resource == "collective" else "")

    # a C call from the innermost Python frame
    if py:
        hit = call_site(py[0], t.syscall)
        if hit is not None:
            site, c = hit
            return _from_site(site, py[0], caller, t, call=c, by="call", cpu=cpu)

    kernel_wait = kernel_wait_site(t.waits)
    if kernel_wait is not None:
        resource, release, op, reason = kernel_wait
        return ThreadWait("blocked", op, resource, release, frame=py[0] if py else None, caller=caller,
                          syscall=t.syscall, wchan=t.wchan, kernel=op, reason=reason, by="kernel_wait", cpu=cpu,
                          details=_kernel_details(t))
    entry = kernel_site(t.syscall, t.wchan)
    if py and caller is py[0] and t.syscall in NATIVE_WAITS:
        # the job's own line called into C (a ctypes function, an extension) that sleeps in a call no Python API
        # of the table makes: the mechanism is native code's
        return ThreadWait("blocked", "native call", "native", "unknown", frame=caller, caller=caller,
                          syscall=t.syscall, wchan=t.wchan, kernel=entry[4] if entry is not None else "",
                          reason="a C function called from the job's own line (ctypes, an extension) sleeps in "
                          f"`{t.syscall}`, which no Python call of the line explains", by="call", cpu=cpu,
                          details=_kernel_details(t))
    if entry is not None:
        return ThreadWait("blocked", "", entry[2], entry[3], frame=py[0] if py else None, caller=caller,
                          syscall=t.syscall, wchan=t.wchan, kernel=entry[4], reason=entry[5], by="kernel", cpu=cpu,
                          details=_kernel_details(t))
    return ThreadWait("blocked" if t.state == "S" else "unknown", "", "unknown", "unknown",
                      frame=py[0] if py else None, caller=caller, syscall=t.syscall, wchan=t.wchan, by="", cpu=cpu,
                      details=_kernel_details(t))


# Waits that poll on a CPU instead of sleeping: a thread in one runs (state R, a core's worth of CPU) while it
# waits, so its wait is the call, not a spin of the job's own. resource -> why it runs while it waits.
POLLING_WAITS = {
    "device": "the CUDA runtime polls the GPU on a CPU core while it waits (its default schedule spins when there "
              "are more cores than GPUs)",
}
# native calls that busy-wait for the other ranks (NCCL polls its peers' progress on a CPU)
POLLING_NATIVE = ("ncclCommInitRank", "ncclGroupEnd")


def _polling_wait(py: Sequence[Frame], caller: Optional[Frame], t: ThreadStack) -> Optional[ThreadWait]:
    """A running thread inside a wait that polls (POLLING_WAITS, POLLING_NATIVE): blocked in that wait."""
    for f in t.frames:
        if not f.native:
            break
        named = native_site(f.function)
        if named is not None and (named[1] in POLLING_WAITS or named[3] in POLLING_NATIVE):
            _, resource, rel, op, reason = named
            why = POLLING_WAITS.get(resource, "NCCL polls the other ranks' progress on a CPU core while it waits")
            return ThreadWait("blocked", op, resource, rel, frame=f, caller=caller, syscall=t.syscall, wchan=t.wchan,
                              reason=f"{reason}; {why}", by="frame",
                              details=_kernel_details(t), collective=op if resource == "collective" else "")
    found = _frame_sites(py, caller, t)
    if found is not None and found.resource in POLLING_WAITS:
        return _replace(found, reason=f"{found.reason}; {POLLING_WAITS[found.resource]}")
    return None


def polls(t: ThreadStack) -> bool:
    """Whether the thread stands in a wait that polls on a CPU (POLLING_WAITS, POLLING_NATIVE): the CPU it uses
    there is that wait's, neither work nor a spin of the job's own (progress names its activity so)."""
    return _polling_wait(_python(t.frames), innermost_own(t.frames), t) is not None


WITH_LOCK = Site((), frozenset({"__enter__"}), "with-statement lock", "lock", "holder",
                 "waits to enter a `with` block: its lock is held by another thread (or by itself, lower on its own "
                 "stack: a non-reentrant lock taken twice)", syscalls=("futex",))


def _entering_with(py: Sequence[Frame], t: ThreadStack) -> Optional[ThreadWait]:
    """The innermost Python frame stands at a `with` header it has not entered (WithInfo.entering), and the thread
    sleeps where a lock's acquire sleeps: it waits for that lock."""
    if not py or (t.syscall and t.syscall not in WITH_LOCK.syscalls):
        return None
    f = py[0]
    entering = [w for w in f.withs if w.entering]
    if not entering or not entering[-1].items:
        return None
    w = entering[-1]
    details = (Detail("object", w.items[0][:MAX_DETAIL]), Detail("header", w.header[:MAX_DETAIL]))
    caller = f if not is_library(f) else innermost_own(py)
    return ThreadWait("blocked", f"with {w.items[0][:80]}", "lock", "holder", site=WITH_LOCK, frame=f, caller=caller,
                      syscall=t.syscall, wchan=t.wchan, reason=WITH_LOCK.reason, details=details, by="frame")


def _replace(w: ThreadWait, **kw: Any) -> ThreadWait:
    from dataclasses import replace

    return replace(w, **kw)


EMPTY_STATEMENTS = ("pass", "...", "continue")  # a loop body of only these does nothing but test its condition


def _empty_body(f: Frame, loop: LoopInfo) -> bool:
    """The loop's body, every line of it in the frame's source, holds only EMPTY_STATEMENTS (and comments)."""
    text = dict(f.source)
    body = range(loop.line + 1, loop.end_line + 1)
    if not body or any(n not in text for n in body):
        return False
    statements = [text[n].split("#", 1)[0].strip() for n in body]
    return any(statements) and all(st in EMPTY_STATEMENTS or not st for st in statements)


def _running(t: ThreadStack, caller: Optional[Frame], cpu: Optional[float], motion: Optional[Motion]) -> ThreadWait:
    at = caller or next((f for f in t.frames if not f.native), None)
    loop = _enclosing_loop(at) if at is not None else None
    # a thread on a CPU at its own `while` loop, with nothing below it that computes, spins: it polls a
    # condition without waiting. On a loaded machine it gets a fraction of a core, so its share alone cannot say;
    # runnable at the same place in two samples can (a thread that waits is not runnable)
    # (a call the loop's header makes to test its condition, `while not os.path.exists(p)`, is the loop itself:
    # library frames below a frame standing on its `while` header compute nothing of the job's)
    below = t.frames[:t.frames.index(at)] if at is not None and at in t.frames else []
    own_loop = loop is not None and loop.kind == "while" and at is not None and (
        not below or (at.line == loop.line and all(f.native or is_library(f) for f in below)))
    stayed = motion is not None and motion.running_before and not motion.moved_own
    hot = (cpu is not None and cpu >= SPIN_CPU) or (own_loop and (stayed or cpu is None or cpu >= SPIN_CPU_LOADED))
    # at the condition: on the `while` header, or anywhere in a body that does nothing (`while not done: pass`):
    # py-spy shows such a loop at either line, as the sample happens to fall, and both are the same spin
    at_condition = loop is not None and loop.kind == "while" and at is not None and (
        at.line == loop.line or _empty_body(at, loop))
    spinning = hot and (at_condition or (motion is not None and motion.stayed_s >= SPIN_PROOF_S))
    return ThreadWait("spinning" if spinning else "running", "running", "cpu", "itself", frame=at, caller=caller,
                      syscall=t.syscall, wchan=t.wchan, poll=loop, details=_loop_values(at, loop),
                      reason="on a CPU, not waiting: " + ("a core's worth of CPU between samples at the same place"
                                                          if spinning else "running Python or native code"),
                      by="cpu", cpu=cpu)


def _loop_values(f: Optional[Frame], loop: Optional[LoopInfo]) -> Tuple[Detail, ...]:
    """What a polling or spinning loop's condition reads: the values of the frame's locals its header names
    (`while not os.path.exists(marker):` -> marker='/ckpt/COMMITTED')."""
    if f is None or loop is None:
        return ()
    out = []
    # the test the loop retries: a `while` header's condition, or the first `if` of its body before this line
    test = loop.header.strip().rstrip(":")[len("while"):].strip() if loop.kind == "while" else ""
    if not test:
        test = next((src.strip()[2:].strip().split(":", 1)[0] for n, src in f.source
                     if loop.line < n < f.line and src.strip().startswith("if ")), "")
    if test:
        out.append(Detail("test", test[:MAX_DETAIL]))
    # the header, then the lines of the loop's body the frame's source window holds (a retry loop's test is in
    # its body: `for attempt in count(): if os.path.exists(marker): break; time.sleep(1)`)
    text = loop.header + " " + " ".join(src for n, src in f.source if loop.line < n <= min(loop.end_line, f.line + 3))
    skip = set(loop.variables) | {"while", "for", "in", "not", "and", "or", "is", "None", "True", "False", "self",
                                  "if", "break", "return", "continue", "else", "elif"}
    for name in dict.fromkeys(re.findall(r"\b[A-Za-z_][A-Za-z_0-9]*\b", text[:MAX_LINE * 2])):
        if name in skip:
            continue
        value = _local(f, name)
        # an object shown by its address says nothing of what the loop waits for
        if value is not None and not _OPAQUE.fullmatch(value.strip()) and not _AN_OBJECT.fullmatch(value.strip()):
            out.append(Detail(f"polls:{name}", value))
        if len(out) == 3:
            break
    retried = _retried(f, loop)
    if retried is not None:
        out += [Detail("retries", retried[0][:MAX_DETAIL]), Detail("catches", retried[1][:MAX_DETAIL])]
    return tuple(out)


_AN_OBJECT = re.compile(r"<[\w.]+ at 0x[0-9a-fA-F]+>")
_EXCEPT = re.compile(r"except\b\s*([^:]*):")


def _retried(f: Frame, loop: LoopInfo) -> Optional[Tuple[str, str]]:
    """A retry loop: in the loop's body (as far as the frame's source window shows it), an `except` before the
    current line (the thread sleeps in its handler, or after it) and, inside the `try` it closes (indented deeper
    than the `except`), the last line that makes a call: (that line, what the except names). The loop is then
    not waiting for a condition to turn: it makes the call again after each failure."""
    body = [(n, src) for n, src in f.source if loop.line < n <= loop.end_line]
    for j, (n, src) in enumerate(body):
        m = _EXCEPT.match(src.strip())
        if m is None or n >= f.line:
            continue
        indent = len(src) - len(src.lstrip())
        tried = [b for _, b in body[:j] if "(" in b and len(b) - len(b.lstrip()) > indent and b.strip() != "try:"]
        if tried:
            return tried[-1].strip(), m.group(1).strip() or "every exception"
    return None


def _enclosing_loop(f: Frame) -> Optional[LoopInfo]:
    """The innermost loop around the frame's current line."""
    inner = None
    for loop in f.loops:  # outermost first
        if loop.line <= f.line <= loop.end_line:
            inner = loop
    return inner


def _frame_sites(py: Sequence[Frame], caller: Optional[Frame], t: ThreadStack) -> Optional[ThreadWait]:
    """The call the job made: the outermost site (or collective) below its innermost own frame, with the
    innermost site as how it waits."""
    limit = py.index(caller) if caller is not None and caller in py else len(py)
    inner = list(py[:limit])  # library frames below the job's code, innermost first
    matches: List[Tuple[Frame, Optional[Site], str]] = []
    for f in inner:
        coll = collective_of(f)
        if coll is not None:
            matches.append((f, None, coll))
            continue
        site = frame_site(f.function, f.filename)
        if site is not None:
            matches.append((f, site, ""))
    if not matches:
        return None
    outer_frame, outer_site, coll = matches[-1]
    how = matches[0]
    how_name = how[1].operation if how[1] is not None and how is not matches[-1] else ""
    if coll:
        p2p = coll in ("send", "recv", "send/recv")
        if _held_end(t):
            # the kernel says what the call waits on: a socket or pipe whose other end is a process that cannot run
            # (a store's host, a service), whatever the ranks of the group do
            return ThreadWait("blocked", coll, "socket", "peer", frame=outer_frame, caller=caller, how=how_name,
                              syscall=t.syscall, wchan=t.wchan, by="kernel_wait", details=_kernel_details(t),
                              reason="its socket's other end is a process that cannot run until it is resumed",
                              collective=coll)
        return ThreadWait("blocked", coll, "p2p" if p2p else "collective", "peer_rank" if p2p else "ranks",
                          frame=outer_frame, caller=caller, how=how_name, syscall=t.syscall, wchan=t.wchan,
                          reason=("waits until the peer rank makes the matching call" if p2p else
                                  "waits until every rank of the group has joined the same collective"),
                          by="frame", collective=coll)
    assert outer_site is not None
    if outer_site.phased:
        # the phase the thread is in: the innermost specific site below the call (not a generic wait under it)
        phase = next((m[1] for m in matches[:-1] if m[1] is not None and not m[1].generic and not m[1].phased), None)
        if phase is not None:  # what it waits on is the phase's; the call, its name and arguments, the job's
            outer_site = replace(phase, files=outer_site.files, functions=outer_site.functions,
                                 operation=outer_site.operation, timeout=outer_site.timeout or phase.timeout)
    # a site that only says "waits" in general (Condition.wait) under the job's own line: a C call on the caller's
    # line may say more (a socket read under selectors is still a socket)
    return _from_site(outer_site, outer_frame, caller, t, how=how_name, by="frame")


def _held_end(t: ThreadStack) -> bool:
    """Whether the node found the blocked call's socket or pipe held at its other end by another process that cannot
    run (stopped or traced: state T or t): the call waits on that process, not on the ranks of its group."""
    kw = t.waits
    return kw is not None and any(o.state in ("T", "t") and not o.own for f in kw.fds
                                  if f.kind in ("socket", "pipe", "fifo") for o in f.others)


_IMPORT_FRAMES = ("_find_and_load", "_find_and_load_unlocked", "_lock_unlock_module", "_ModuleLockManager.__enter__")


# The frame of an import that holds its module's lock: `_find_and_load` takes it (`with _ModuleLockManager(name)`)
# and runs the import in this one; a thread that waits for another's import of the module waits in
# `_ModuleLockManager.__enter__` or `_lock_unlock_module` instead, below a `_find_and_load` of its own
_IMPORT_HOLDING = ("_find_and_load_unlocked",)


def importing(t: ThreadStack, outermost: bool = True, holding: bool = False) -> List[str]:
    """The modules a thread is importing, from importlib's frames' `name` locals (outermost first; the innermost
    first with outermost=False); empty where locals were not read. holding: only those whose lock it holds (it
    runs their import), not one it waits to get."""
    names: List[str] = []
    frames = _IMPORT_HOLDING if holding else _IMPORT_FRAMES
    for f in t.frames:
        if f.function in frames and "importlib" in f.filename:
            value = next((loc.repr.strip('"\'') for loc in f.locals if loc.name == "name"), "")
            if value and value not in names:
                names.append(value)
    return names[::-1] if outermost else names


def _from_site(site: Site, frame: Frame, caller: Optional[Frame], t: ThreadStack, *, call: Optional[Call] = None,
               how: str = "", by: str = "frame", cpu: Optional[float] = None) -> ThreadWait:
    details = _identity(site, call, frame, caller) + _kernel_details(t)
    poll = None
    if site.resource in ("timer", "file_lock") and caller is not None:
        poll = _enclosing_loop(caller)
        details += _loop_values(caller, poll)
        if poll is not None and t.waits is not None and t.waits.watched:
            details += _polled_files(details, t.waits.watched)
    if site.resource == "terminal":  # input(): standard input
        details += (Detail("fd", "0"),)
    if site.release == "importer":
        modules = importing(t, outermost=False)
        if modules:
            details += (Detail("module", modules[0][:MAX_DETAIL]),)
    return ThreadWait("blocked", site.operation, site.resource, site.release, site=site, frame=frame, caller=caller,
                      how=how, syscall=t.syscall, wchan=t.wchan, reason=site.reason, poll=poll, details=details,
                      by=by, cpu=cpu)


def _polled_files(details: Tuple[Detail, ...], watched: Sequence[WaitFd]) -> Tuple[Detail, ...]:
    """Of the paths a poll loop's condition reads (its `polls:` values), what the node found holding each open for
    writing (KernelWait.watched): "unwritten" where its whole search found no process, "written_by" where it found
    one. A path the node did not look up says nothing."""
    quoted = (d.value.strip() for d in details if d.name.startswith("polls:"))
    values = {v[1:-1] for v in quoted if len(v) > 2 and v[0] in "\"'" and v[-1] == v[0]}
    out: List[Detail] = []
    for f in watched:
        if f.target not in values:
            continue
        if f.others:
            o = f.others[0]
            out.append(Detail("written_by", f"pid {o.pid} {' '.join(o.cmdline) or o.comm}"[:MAX_DETAIL]))
        elif f.complete:
            out.append(Detail("unwritten", f.target[:MAX_DETAIL]))
    return tuple(out)


def _kernel_details(t: ThreadStack) -> Tuple[Detail, ...]:
    """What the node found at the call's file descriptor (ThreadStack.waits): its target, kind and endpoints, the
    path a lock or an open is on, the child waited for, the timeout."""
    kw = t.waits
    if kw is None:
        return ()
    out: List[Detail] = []
    f = _first_fd(kw)
    if f is not None:
        if f.fd is not None:
            out.append(Detail("fd", str(f.fd)))
        for name in ("target", "kind", "access", "proto", "local", "peer", "state"):
            value = getattr(f, name)
            if value:
                out.append(Detail(name, str(value)[:MAX_DETAIL]))
    if kw.path:
        out.append(Detail("path", kw.path[:MAX_DETAIL]))
    if kw.child_pid is not None and kw.child_pid > 0:
        out.append(Detail("child", str(kw.child_pid)))
    if kw.lock_type:
        out.append(Detail("lock", f"{kw.lock_type} {kw.lock_mode}".strip()))
    if kw.timeout is not None:
        out.append(Detail("kernel_timeout", "none" if kw.timeout < 0 else f"{kw.timeout:g}"))
    if kw.fds_total is not None and kw.fds_total > 1:
        out.append(Detail("watched", str(kw.fds_total)))
    if kw.signals:
        out.append(Detail("signals", ", ".join(kw.signals)[:MAX_DETAIL]))
    return tuple(out)


def _first_fd(kw: KernelWait) -> Optional[WaitFd]:
    """The fd that says most about a wait: a socket, pipe, FIFO or terminal before a file or an eventfd."""
    rank = {"socket": 0, "fifo": 1, "pipe": 2, "tty": 3, "file": 4, "device": 5}
    fds = [f for f in kw.fds if f.kind not in ("eventfd", "epoll")] or list(kw.fds)
    return min(fds, key=lambda f: rank.get(f.kind, 9), default=None)


FIFO_OPEN = "open() of a FIFO"  # the operation of an open that waits for the FIFO's other end (prose reads it)

# What the node read of a blocked call (KernelWait) names when no Python call on the stack does: (family, fd kind,
# access) -> (resource, release, operation, reason). "" matches anything.
_KERNEL_WAITS: Tuple[Tuple[str, str, str, Resource, Release, str, str], ...] = (
    # an open for writing waits for a reader, one for reading for a writer (the node reads the open's flags)
    ("open", "fifo", "write", "pipe", "reader", FIFO_OPEN,
     "opening a FIFO for writing blocks until a process opens it for reading"),
    ("open", "fifo", "", "pipe", "writer", FIFO_OPEN,
     "opening a FIFO blocks until a process opens its other end"),
    ("lock", "", "", "file_lock", "lock_holder", "file lock", "waits for a lock on a file that another process holds"),
    ("wait", "", "", "child", "children", "wait for a child", "waits until a child process exits"),
    ("", "tty", "read", "terminal", "writer", "terminal read", "waits for input on a terminal"),
    # a write to a terminal blocks only while the terminal takes no more output: its output stopped (Ctrl-S: flow
    # control) or nothing reads the other side of the pseudo-terminal (a stuck tmux, screen or ssh session)
    ("", "tty", "write", "terminal", "person", "terminal write",
     "its terminal takes no more output (output stopped with Ctrl-S, or nothing reads the terminal)"),
    ("", "fifo", "read", "pipe", "writer", "FIFO read", "waits for data that a process writes into the FIFO"),
    ("", "pipe", "read", "pipe", "writer", "pipe read", "waits for data that a process writes into the pipe"),
    ("", "fifo", "write", "pipe", "reader", "FIFO write", "the FIFO is full: waits until its reader reads"),
    ("", "pipe", "write", "pipe", "reader", "pipe write", "the pipe is full: waits until its reader reads"),
    ("", "socket", "accept", "socket", "peer", "socket accept", "waits for a client to connect"),
    ("", "socket", "connect", "socket", "peer", "socket connect", "waits for the server to accept the connection"),
    ("", "socket", "", "socket", "peer", "socket wait", "waits for its socket's peer"),
)


def kernel_wait_site(kw: Optional[KernelWait]) -> Optional[Tuple[Resource, Release, str, str]]:
    """(resource, release, operation, reason) from what the node read of the blocked call."""
    if kw is None:
        return None
    f = _first_fd(kw)
    kind, access = (f.kind, f.access) if f is not None else ("", "")
    for family, fd_kind, fd_access, resource, release, operation, reason in _KERNEL_WAITS:
        if (not family or family == kw.family) and (not fd_kind or fd_kind == kind) and \
                (not fd_access or fd_access == access or (fd_access == "read" and access == "both")):
            return resource, release, operation, reason
    return None


def job_frames(frames: Sequence[Frame]) -> List[Frame]:
    """The job's own Python frames of a stack, innermost first."""
    return [f for f in frames if not f.native and not is_library(f) and not is_machinery(f.function, f.filename)]


def norm_file(f: Frame) -> str:
    return norm(f.filename)
