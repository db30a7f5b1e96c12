"""The processes a blocked call waits for by pid or by lock (workers/collect/kwait.py reads the call): the children
a wait4/waitid can reap, a zombie's exit status decoded, and the holders of the lock a flock or fcntl(F_SETLKW)
waits for, from /proc/locks. Only /proc is read; bounded like kwait (MAX_CHILDREN, the Reader's deadline)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Set, Tuple

    from workers.collect.kwait import Reader

from workers import procinfo

MAX_CHILDREN = 8  # children, and lock holders, named per call
MAX_LOCKS_BYTES = 1 << 20
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS",
            8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM",
            15: "SIGTERM", 24: "SIGXCPU", 25: "SIGXFSZ"}  # x86_64 and aarch64 agree on these


def s32(value: int) -> int:
    """A register holding a C int (an fd, a pid, a timeout in ms): its low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def children(ctx: Reader, name: str, args: List[int], out: Dict[str, Any]) -> None:
    """wait4(pid) / waitid(idtype, id): the pid waited for, as the call gives it (-1: any child, 0: any of its
    own process group, < -1: any of group -N, > 0: that one, in the process's own pid namespace), and its
    children, those it waits for first."""
    if name == "wait4":
        want = s32(args[0])
    else:
        idtype, ident = args[0] & 0xFFFFFFFF, s32(args[1])
        want = {0: -1, 1: ident, 2: -ident if ident > 0 else 0}.get(idtype, -1)
        if idtype == 3:  # P_PIDFD: the pid behind the pidfd
            want = _pidfd_pid(ctx.pid, ident) or -1
            out["notes"].append("waits on a pidfd (fd %d)" % ident)
    out["child_pid"] = want
    kids, complete = _child_pids(ctx)
    own_pgrp = ctx.stat()[4] if len(ctx.stat()) > 4 else ""
    waited, rest = [], []  # type: List[Dict[str, Any]], List[Dict[str, Any]]
    for kid in kids:
        if ctx.over() or len(waited) + len(rest) >= 4 * MAX_CHILDREN:
            complete = False
            break
        try:
            fields = procinfo.stat_fields(kid)
        except (procinfo.Gone, OSError):
            continue
        facts = ctx.index.process(kid)
        if facts is None:
            continue
        facts["role"] = "child"
        if fields[2] == "Z" and len(fields) > 51 and fields[51].lstrip("-").isdigit():
            facts.update(exit_status(int(fields[51])))
        if want > 0:
            match = kid == want or (ctx.other_pidns and procinfo.ns_id(kid) == want)
        elif want == 0:
            match = fields[4] == own_pgrp
        elif want < -1:
            match = ctx.other_pidns or fields[4] == str(-want)
        else:
            match = True
        (waited if match else rest).append(facts)
    # every child, the ones the call waits for first: a zombie it does not wait for (killed by a signal) shows
    chosen = (waited + rest)[:MAX_CHILDREN]
    for facts in chosen:
        if facts.get("state") == "S" and str(facts.get("wchan") or "").startswith(_PIPE_READ) and not ctx.over():
            reads = _pipe_read(ctx, facts["pid"])
            if reads is not None:
                facts["reads"] = reads
    out["children"] = chosen
    out["children_complete"] = complete and len(waited) + len(rest) <= MAX_CHILDREN
    if want > 0 and not waited and complete:
        out["notes"].append("pid %d is not among its children as /proc lists them" % want)
    if ctx.other_pidns and want not in (-1, 0):
        out["notes"].append("the pid waited for is in the process's own pid namespace; its children are named by "
                            "the worker's pids")


# a child asleep reading a pipe (its input, usually: `gzip -c` fed by the rank): its call and the pipe's writers
_PIPE_READ = ("pipe_read", "anon_pipe_read", "pipe_wait_readable")
_READ_CALLS = {"read", "readv", "pread64", "preadv", "preadv2"}


def _read_fd(path: str, calls: Set[str]) -> Optional[int]:
    """The fd argument of the call a /proc/PID[/task/TID]/syscall line shows, when that call is one of `calls`;
    None for another call, a running thread or a line that cannot be read."""
    from workers.collect import procfs

    try:
        line = procinfo.read_file(path, 256).decode("ascii", "replace")
    except OSError:
        return None
    fields = line.split()
    if len(fields) < 2 or procfs.syscall_name(line) not in calls:
        return None
    try:
        return s32(int(fields[1], 16))
    except ValueError:
        return None


def _pipe_read(ctx: Reader, pid: int) -> Optional[Dict[str, Any]]:
    """What a child blocked in a pipe read waits for: {"fd", "target", "kind": "pipe", "access": "read", "others":
    the processes holding the pipe's write end (the waiting rank itself marked own), "complete"}: its input's end
    (EOF) comes only when every one of them has closed it. None when the child is not in such a read (it moved
    on, its syscall line is not readable, or the fd is no pipe)."""
    fd = _read_fd("/proc/%d/syscall" % pid, _READ_CALLS)
    if fd is None:
        return None
    try:
        target = os.readlink("/proc/%d/fd/%d" % (pid, fd))
    except OSError:
        return None
    if not target.startswith("pipe:["):
        return None
    others, complete = ctx.ends(target, (1, 2), "writer", skip=(pid, fd))
    return {"fd": fd, "target": target[:300], "kind": "pipe", "access": "read", "others": others,
            "complete": complete}


_SOCKET_READS = _READ_CALLS | {"recvfrom", "recvmsg", "recvmmsg"}
MAX_PEER_TASKS = 64


def reads_fd(pid: int, fd: int) -> bool:
    """Whether a thread of pid sleeps reading its fd (a read-family call with that fd: /proc/PID/task/TID/syscall),
    at most MAX_PEER_TASKS threads looked at: the peer of a connection that reads its end of it too."""
    try:
        tasks = os.listdir("/proc/%d/task" % pid)[:MAX_PEER_TASKS]
    except OSError:
        return False
    return any(_read_fd("/proc/%d/task/%s/syscall" % (pid, tid), _SOCKET_READS) == fd for tid in tasks)


def exit_status(status: int) -> Dict[str, Any]:
    """A zombie's wait status (/proc/PID/stat field 52, readable with ptrace-read access; 0 otherwise) decoded:
    {"exit_code": N} for an exit, {"exit_signal": "SIGKILL", "core_dumped": bool} for a death by a signal."""
    sig = status & 0x7F
    if sig == 0:
        return {"exit_code": (status >> 8) & 0xFF}
    return {"exit_signal": _SIGNALS.get(sig, "signal %d" % sig), "core_dumped": bool(status & 0x80)}


def _pidfd_pid(pid: int, fd: int) -> Optional[int]:
    try:
        info = procinfo.read_file("/proc/%d/fdinfo/%d" % (pid, fd), 4096).decode("ascii", "replace")
    except OSError:
        return None
    for line in info.splitlines():
        if line.startswith("Pid:"):
            value = line.split(":", 1)[1].strip()
            return int(value) if value.isdigit() else None
    return None


def _child_pids(ctx: Reader) -> Tuple[List[int], bool]:
    """The process's children (every thread's /proc/PID/task/TID/children); (pids, complete)."""
    kids: List[int] = []
    pid = ctx.pid
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return kids, False
    complete = len(tids) <= 4096
    for tid in tids[:4096]:
        if ctx.over():
            complete = False
            break
        try:
            text = procinfo.read_file("/proc/%d/task/%s/children" % (pid, tid), 1 << 16).decode("ascii", "replace")
        except FileNotFoundError:
            continue  # the thread exited
        except OSError:
            complete = False  # a kernel without CONFIG_PROC_CHILDREN, or not readable
            continue
        kids.extend(int(k) for k in text.split() if k.isdigit())
    return sorted(set(kids)), complete


def lock_holders(ctx: Reader, st: os.stat_result, fd: int, path: str, out: Dict[str, Any]
                  ) -> Tuple[List[Dict[str, Any]], bool]:
    try:
        text = procinfo.read_file("/proc/locks", MAX_LOCKS_BYTES).decode("ascii", "replace")
    except OSError as exc:
        out["notes"].append("/proc/locks not readable: %s" % (exc.strerror or exc))
        return [], False
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    holders: List[Dict[str, Any]] = []
    by_fd = False
    complete = len(text) < MAX_LOCKS_BYTES
    for line in text.splitlines():
        f = line.split()
        waiter = len(f) > 1 and f[1] == "->"
        if waiter:
            del f[1]
        if len(f) < 8 or _lock_file(f[5]) != want:
            continue
        pid = int(f[4]) if f[4].lstrip("-").isdigit() else -1
        what = "%s %s %s-%s" % (f[1], f[3], f[6], f[7])
        if waiter:
            if pid == ctx.pid and not out.get("lock_mode"):
                out["lock_mode"] = f[3]
            continue
        facts = ctx.index.process(pid) if pid > 0 else None
        if facts is None:
            by_fd = True  # an OFD lock (pid -1), or its taker has exited: the holders hold the file open
            continue
        if len(holders) >= MAX_CHILDREN:
            return holders, False
        facts.update(role="holder", lock=what, own=pid == ctx.pid)
        holders.append(facts)
    if by_fd and path.startswith("/"):
        found, done = ctx.ends(path, (0, 1, 2), "holder", skip=(ctx.pid, fd))  # not the fd asking for the lock
        for facts in found:
            if all(h["pid"] != facts["pid"] for h in holders) and len(holders) < MAX_CHILDREN:
                facts["lock"] = "one of the processes holding the file open holds the lock through it"
                holders.append(facts)
        complete = complete and done
        out["notes"].append("a lock with no owning process (OFD, or its taker exited): the processes holding "
                            "the file open are named%s" % by_path_note(ctx))
    return holders, complete


def _lock_file(text: str) -> Optional[Tuple[int, int, int]]:
    """/proc/locks' "fe:00:1515554" (major and minor in hex, inode in decimal)."""
    parts = text.split(":")
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2])
    except (IndexError, ValueError):
        return None


def by_path_note(ctx: Reader) -> str:
    """"" when the process shares the worker's mount namespace; else why a search by path may miss."""
    if procinfo.namespace(ctx.pid, "mnt") == procinfo.namespace(os.getpid(), "mnt"):
        return ""
    return (": the process runs in another mount namespace (a container), and the processes holding the file are "
            "searched by its path as they show it")
