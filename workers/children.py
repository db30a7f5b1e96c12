"""Every child process the worker starts: one registry, parent-death signal, process groups and deadlines.

The worker must never leave anything behind on a node: each child runs in its own process group (so a
deadline kills its helpers too), carries PR_SET_PDEATHSIG=SIGKILL (so a SIGKILLed worker still takes it
along), and is listed here until reaped so that EOF on stdin can kill whatever is still running.

The parent-death signal is set by util-linux's `setpriv --pdeathsig KILL` in front of the tool where the node
has it (then subprocess vforks: cheap enough to start four py-spy per rank refresh), else by a preexec_fn
(fork; the child also checks that the worker did not die before the prctl). setpriv cannot make that last
check: a worker SIGKILLed in the microseconds between the fork and setpriv's prctl leaves that one tool to
finish by itself (every tool here ends on its own: a dump, a bounded strace, gdb in batch mode).

A tool for a rank in a container runs inside the rank's pid and mount namespaces (enter_ns). Not through
`nsenter -p`: nsenter forks (a new pid namespace holds only children), and a forked child loses the parent-death
signal, so a SIGKILLed worker left the tool, and a rank it held stopped, behind. The preexec hook enters the
namespaces, forks, and sets the signal in both processes (_enter).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Dict, List, Optional, Sequence

PR_SET_PDEATHSIG = 1
_SETPRIV_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")


def _load_prctl():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
        prctl.restype = ctypes.c_int
        return prctl
    except (ImportError, OSError, AttributeError):
        return None


_PRCTL: object = None  # resolved once, in the parent: the preexec hook must do little between fork and exec
_SETPRIV: Optional[str] = None
_LOADED = False
_LOAD_LOCK = threading.Lock()


def _find_setpriv() -> Optional[str]:
    """util-linux's setpriv when it knows --pdeathsig (2.33+): found by the option's name in the binary,
    which costs a read instead of a run."""
    for d in _SETPRIV_DIRS:
        path = os.path.join(d, "setpriv")
        try:
            with open(path, "rb") as f:
                if b"pdeathsig" in f.read(4 << 20) and os.access(path, os.X_OK):
                    return path
        except OSError:
            continue
    return None


def _load() -> None:
    global _PRCTL, _SETPRIV, _LOADED
    with _LOAD_LOCK:
        if not _LOADED:
            _SETPRIV = _find_setpriv()
            if _SETPRIV is None:
                _PRCTL = _load_prctl()
            _LOADED = True


_NS_CALLS: object = None  # (prctl, setns, get_errno) from libc, loaded once in the parent; False where unavailable
NS_PREFIX = "nsexec:"  # how a child that could not enter the namespaces says so on its stderr (exit 126)


def entered(returncode: Optional[int], stderr: str) -> bool:
    """False when a child started with enter_ns could not enter the namespaces (its tool never ran)."""
    return not (returncode == 126 and stderr.startswith(NS_PREFIX))


def _ns_calls():
    """(prctl, setns, get_errno) from libc, loaded once in the parent (the preexec hook must not import); None
    where libc or ctypes lacks them."""
    global _NS_CALLS
    with _LOAD_LOCK:
        if _NS_CALLS is None:
            prctl = _load_prctl()
            try:
                import ctypes

                _NS_CALLS = (prctl, ctypes.CDLL(None, use_errno=True).setns, ctypes.get_errno) if prctl else False
            except (ImportError, OSError, AttributeError):
                _NS_CALLS = False
    return _NS_CALLS or None


def _say(text: str) -> None:
    try:
        os.write(2, (NS_PREFIX + " " + text + "\n").encode())
    except OSError:
        pass


def _enter(parent_pid: int, ns_fds: "Sequence[int]", calls: tuple) -> None:
    """Runs in the child between fork and exec: enters the target's pid and mount namespaces (their fds, in that
    order) and forks, since a new pid namespace holds only the children of whoever entered it. The forked child
    returns and is exec'd into the tool, inside the namespaces; this process waits for it and exits with its
    status, never returning. Both die with the worker (PR_SET_PDEATHSIG in each): `nsenter -p`'s forked child
    does not, and would keep a rank stopped after the worker was killed."""
    prctl, setns, get_errno = calls
    if prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0 or os.getppid() != parent_pid:
        os._exit(125)
    # Every fd this process holds, read while /proc/self is still its own (in the target's mount namespace it
    # is the target's procfs, where this process is not): the waiting process closes them, or subprocess's
    # error pipe would stay open in it and Popen would wait for the tool's end instead of its exec.
    held = [int(name) for name in os.listdir("/proc/self/fd") if name.isdigit()]
    for fd in ns_fds:
        if setns(fd, 0) != 0:
            _say("cannot enter the namespace of the target (setns: errno %d)" % get_errno())
            os._exit(126)
    os.chdir("/")
    me = os.getpid()
    child = os.fork()
    if child == 0:
        # the parent is outside this pid namespace: getppid() says 0 while it lives
        if prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0 or os.getppid() not in (0, me):
            os._exit(125)
        return
    for fd in held:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _preexec(parent_pid: int) -> None:
    """Runs in the child between fork and exec (only where setpriv is missing)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # type: ignore[operator]
    # The worker may have died between fork and prctl: then no signal will ever come, so go now.
    if os.getppid() != parent_pid:
        os._exit(127)


class Result:
    """What a finished child left: exit status, captured (capped) output and how it ended."""

    def __init__(self) -> None:
        self.returncode: Optional[int] = None
        self.stdout = b""
        self.stderr = b""
        self.stdout_dropped = 0  # bytes beyond the cap, discarded
        self.stderr_dropped = 0
        self.stderr_tail = b""  # the last keep_tail bytes of stderr when some were dropped
        self.stdout_lines = 0  # newlines seen, dropped bytes included
        self.stderr_lines = 0
        self.timed_out = False  # killed at the hard deadline
        self.stopped = False  # stop_signal was sent at stop_after
        self.killed = False  # killed by the registry (cancel, shutdown)
        self.elapsed = 0.0


class Children:
    """The registry of running children, keyed by pid, each tagged with the request that owns it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: Dict[int, "tuple[subprocess.Popen[bytes], object]"] = {}
        self._killed: "set[int]" = set()
        self._closed = False

    def spawn(self, argv: Sequence[str], owner: object = None, pass_fds: Sequence[int] = (),
              env: Optional[Dict[str, str]] = None, pdeathsig: bool = True,
              enter_ns: Optional[int] = None) -> "subprocess.Popen[bytes]":
        """Start argv with piped stdout/stderr and no stdin.

        PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so call this from the thread
        that also waits for the child (every op does: one thread per request). pdeathsig=False is for
        children that never stop or trace anything and end by themselves within moments (a --version,
        a --nonblocking dump): they start ~0.8 ms cheaper, without setpriv in front.

        enter_ns: a pid whose pid and mount namespaces argv runs in (argv[0] a path valid in there, such as
        /proc/self/fd/N of a passed fd), dying with the worker whatever pdeathsig says (_enter). A child that
        cannot enter them exits 126 with `nsexec:` on its stderr (entered(); OSError where libc lacks setns).
        """
        if not _LOADED:
            _load()
        ns_fds: List[int] = []
        calls = None
        if enter_ns is not None:
            calls = _ns_calls()
            if calls is None:
                raise OSError("setns is not available to this python")
            for ns in ("pid", "mnt"):
                ns_fds.append(os.open("/proc/%d/ns/%s" % (enter_ns, ns), os.O_RDONLY | os.O_CLOEXEC))
        try:
            return self._spawn(argv, owner, pass_fds, env, pdeathsig, ns_fds, calls)
        finally:
            for fd in ns_fds:
                os.close(fd)

    def _spawn(self, argv: Sequence[str], owner: object, pass_fds: Sequence[int], env: Optional[Dict[str, str]],
               pdeathsig: bool, ns_fds: List[int], calls: Optional[tuple]) -> "subprocess.Popen[bytes]":
        with self._lock:
            if self._closed:
                raise OSError("the worker is shutting down")
            parent = os.getpid()
            command, preexec = list(argv), None
            if calls is not None:  # with ns_fds
                ns_calls = calls
                preexec = lambda: _enter(parent, ns_fds, ns_calls)  # noqa: E731
            elif pdeathsig and _SETPRIV is not None:
                # setpriv sets the parent-death signal and execs the tool: no Python code runs in the child,
                # so subprocess can vfork (~0.8 ms of CPU per start against ~3.4 ms for fork + preexec_fn).
                command = [_SETPRIV, "--pdeathsig", "KILL", "--"] + command
            elif pdeathsig:
                preexec = lambda: _preexec(parent)  # noqa: E731
            # (the namespace fds are CLOEXEC: open in the preexec hook, which runs before close_fds, not in the tool)
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                close_fds=True, pass_fds=tuple(pass_fds), env=env, start_new_session=True, preexec_fn=preexec)
            self._procs[proc.pid] = (proc, owner)
        return proc

    def forget(self, proc: "subprocess.Popen[bytes]") -> None:
        with self._lock:
            self._procs.pop(proc.pid, None)

    def was_killed(self, proc: "subprocess.Popen[bytes]") -> bool:
        with self._lock:
            return proc.pid in self._killed

    def kill_owner(self, owner: object) -> int:
        """Kill every child of one request (cancel); returns how many were running."""
        with self._lock:
            victims = [p for p, o in self._procs.values() if o is owner]
        for proc in victims:
            self._kill(proc)
        return len(victims)

    def kill_all(self) -> None:
        """Kill every child and refuse new ones: the worker is exiting."""
        with self._lock:
            self._closed = True
            victims = [p for p, _ in self._procs.values()]
        for proc in victims:
            self._kill(proc)
        for proc in victims:
            try:
                proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass

    def running(self) -> List[int]:
        with self._lock:
            return [pid for pid, (p, _) in self._procs.items() if p.poll() is None]

    def _kill(self, proc: "subprocess.Popen[bytes]") -> None:
        with self._lock:
            self._killed.add(proc.pid)
        kill_group(proc)


def kill_group(proc: "subprocess.Popen[bytes]") -> None:
    """SIGKILL the child's whole process group (it leads one: start_new_session), then the child itself."""
    if proc.poll() is not None:
        # Helpers of an exited leader may still hold the group; the pgid equals the leader's pid.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.kill()
    except OSError:
        pass


def run(children: Children, argv: Sequence[str], timeout: float, owner: object = None,
        pass_fds: Sequence[int] = (), env: Optional[Dict[str, str]] = None,
        stop_after: Optional[float] = None, stop_signal: int = signal.SIGINT,
        max_stdout: int = 16 << 20, max_stderr: int = 1 << 20, keep_tail: int = 0,
        pdeathsig: bool = True, enter_ns: Optional[int] = None) -> Result:
    """Run a child to completion under a hard deadline, capturing capped output (enter_ns: Children.spawn).

    At stop_after seconds the child gets stop_signal (strace detaches cleanly on SIGINT); at timeout seconds
    its whole process group is SIGKILLed and the result says timed_out. Output beyond the caps is dropped
    (counted); with keep_tail, the last keep_tail bytes of stderr are kept too (strace: the end of a trace
    shows what each thread was still blocked in). Raises OSError when it cannot start.
    """
    res = Result()
    start = time.monotonic()
    proc = children.spawn(argv, owner=owner, pass_fds=pass_fds, env=env, pdeathsig=pdeathsig, enter_ns=enter_ns)
    try:
        _pump(proc, res, start, timeout, stop_after, stop_signal, max_stdout, max_stderr, keep_tail)
        remaining = max(0.0, timeout - (time.monotonic() - start))
        try:
            res.returncode = proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            res.timed_out = True
            kill_group(proc)
            res.returncode = proc.wait()
        # Even a child that exited by itself may have left helpers in its group (pipe holders are gone).
        kill_group(proc)
    finally:
        if proc.poll() is None:
            kill_group(proc)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        res.killed = children.was_killed(proc)
        children.forget(proc)
    res.elapsed = time.monotonic() - start
    return res


def _pump(proc: "subprocess.Popen[bytes]", res: Result, start: float, timeout: float,
          stop_after: Optional[float], stop_signal: int, max_stdout: int, max_stderr: int,
          keep_tail: int = 0) -> None:
    """Read both pipes until EOF or the deadline, sending stop_signal once at stop_after."""
    sel = selectors.DefaultSelector()
    bufs = {"out": bytearray(), "err": bytearray()}
    caps = {"out": max_stdout, "err": max_stderr}
    dropped = {"out": 0, "err": 0}
    lines = {"out": 0, "err": 0}
    tail = bytearray()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    try:
        while sel.get_map():
            now = time.monotonic() - start
            if stop_after is not None and not res.stopped and now >= stop_after:
                res.stopped = True
                try:
                    proc.send_signal(stop_signal)
                except OSError:
                    pass
            if now >= timeout:
                res.timed_out = True
                kill_group(proc)
                break
            wake = timeout - now
            if stop_after is not None and not res.stopped:
                wake = min(wake, stop_after - now)
            for key, _ in sel.select(max(0.0, wake)):
                chunk = os.read(key.fd, 65536)
                name = key.data
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                lines[name] += chunk.count(b"\n")
                room = caps[name] - len(bufs[name])
                if room > 0:
                    bufs[name] += chunk[:room]
                over = chunk[max(room, 0):]
                dropped[name] += len(over)
                if over and name == "err" and keep_tail:
                    tail += over
                    del tail[:max(0, len(tail) - keep_tail)]
    finally:
        sel.close()
    res.stdout, res.stderr = bytes(bufs["out"]), bytes(bufs["err"])
    res.stdout_dropped, res.stderr_dropped = dropped["out"], dropped["err"]
    res.stdout_lines, res.stderr_lines = lines["out"], lines["err"]
    res.stderr_tail = bytes(tail)
