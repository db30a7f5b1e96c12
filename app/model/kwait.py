"""What a thread blocked in a system call waits on, and who is at the other end (ThreadStack.waits), as the worker
read it from /proc on the node (workers/collect/kwait.py) without stopping the process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Tuple

WaitFamily = Literal["fd", "poll", "epoll", "wait", "lock", "open", "futex", "sleep", "signal"]
FdKind = Literal["pipe", "fifo", "socket", "tty", "file", "device", "eventfd", "epoll", "other", ""]
EndRole = Literal["reader", "writer", "listener", "peer", "holder", "child"]


@dataclass(frozen=True)
class OtherEnd:
    """A process at the other end of what a thread waits on: a pipe's or FIFO's writer (the thread reads) or
    reader (it writes), a local connection's peer or the listener it waits in the queue of, a lock's holder, a
    child it waits for."""

    role: EndRole
    pid: int  # as the node's worker sees it (the host's pid for a process in a container)
    comm: str = ""
    state: str = ""  # its /proc state letter: R S D T t Z
    ppid: Optional[int] = None
    wchan: str = ""  # where it sleeps in the kernel
    cmdline: Tuple[str, ...] = ()  # redacted on the node
    fd: Optional[int] = None  # its fd on the pipe, socket or file
    own: bool = False  # the waiting thread's own process (a pipe it holds both ends of)
    lock: str = ""  # a holder's lock as /proc/locks shows it, e.g. "POSIX WRITE 0-EOF"
    exit_code: Optional[int] = None  # a zombie child that exited: its exit code
    exit_signal: str = ""  # a zombie child killed by a signal: its name, e.g. "SIGKILL"
    core_dumped: bool = False
    # a child asleep reading a pipe (its input, usually): that pipe and the processes holding its write end, whose
    # closing alone gives it the end of its input (EOF); None when it is not in such a read
    reads: Optional["WaitFd"] = None
    # a socket's peer asleep reading its own end of that same connection (a thread of it in a read on that fd): both
    # ends wait for the other to send
    reading: bool = False


@dataclass(frozen=True)
class WaitFd:
    """One file descriptor a blocked call waits on (a poll or epoll watches several), or the file an open waits
    to open (fd None)."""

    fd: Optional[int] = None
    target: str = ""  # readlink /proc/PID/fd/FD: "pipe:[N]", "socket:[N]", "/dev/pts/3", a path (an open's: the path)
    kind: FdKind = ""  # fifo: a named pipe; tty: a terminal (a pty's either side); "" when unreadable
    access: str = ""  # what the call waits to do: read, write, both (poll), accept, connect, lock, or ""
    proto: str = ""  # a socket's: tcp, udp or unix
    local: str = ""  # a socket's local endpoint ("addr:port"; a unix socket's path or "@abstract")
    peer: str = ""  # its peer's endpoint, when connected
    state: str = ""  # ESTABLISHED, LISTEN, SYN_SENT, ... (UDP: connected, unconnected)
    send_q: Optional[int] = None  # bytes queued to send / not yet acknowledged
    recv_q: Optional[int] = None  # bytes received and not read
    others: Tuple[OtherEnd, ...] = ()  # who is at the other end (at most 8 named)
    complete: bool = True  # False: the search for the other end did not reach its end (bounds, time, permissions)
    controlling: Optional[bool] = None  # a terminal: the process's controlling terminal
    foreground: Optional[bool] = None  # a controlling terminal's foreground process group is the process's own
    notes: Tuple[str, ...] = ()  # what could not be read about it

    @property
    def nobody(self) -> bool:
        """A pipe or FIFO with nobody at the other end as far as the search went (a read would see EOF, an open
        waits for a process that never comes)."""
        return self.kind in ("pipe", "fifo") and self.access in ("read", "write") and not self.others \
            and self.complete


@dataclass(frozen=True)
class KernelWait:
    """What a thread asleep (S or D) in a system call waits on, from the call's arguments (/proc/PID/task/TID/
    syscall), with the other end where the node could tell it."""

    syscall: str  # the call, e.g. "read", "poll", "wait4"
    # fd: a call on one fd (or two: splice); poll: poll or select; epoll; wait: for a child; lock: flock or
    # fcntl's F_SETLKW; open: an open that blocks (a FIFO's); futex; sleep: nanosleep, clock_nanosleep; signal:
    # rt_sigtimedwait (sigwait and its kin)
    family: WaitFamily
    fd: Optional[int] = None  # the call's fd argument (epoll: the epoll fd; lock: the locked file's)
    # what it waits on: the call's fd, the fds a poll/select/epoll watches (at most 64), an open's file
    fds: Tuple[WaitFd, ...] = ()
    fds_total: Optional[int] = None  # poll/select/epoll: how many fds it watches in all
    # seconds the call may wait (an absolute deadline: the time left when read; a sleep: the time asked for);
    # -1: no timeout, it waits until woken; None: unknown or not applicable
    timeout: Optional[float] = None
    # wait4/waitid: -1 any child, 0 any of its process group, < -1 any of group -N, > 0 that pid (in the
    # process's own pid namespace)
    child_pid: Optional[int] = None
    # its children (role child, at most 8), those the call waits for first; a zombie's exit code or signal
    children: Tuple[OtherEnd, ...] = ()
    children_complete: bool = True
    lock_type: str = ""  # the lock asked for: FLOCK, POSIX or OFDLCK
    lock_mode: str = ""  # READ or WRITE
    path: str = ""  # lock: the locked file; open: the path being opened
    address: str = ""  # futex: the futex word's address ("0x7f..."), nothing more is named at this level
    signals: Tuple[str, ...] = ()  # signal: the signals it waits for ("SIGUSR2", "SIGRTMIN+3"), at most 16
    # sleep: the absolute paths its innermost Python frames hold (a poll loop's files, at most 3), each with the
    # processes of the node that hold it open for writing (others, role writer), by the name the kernel gives
    watched: Tuple[WaitFd, ...] = ()
    notes: Tuple[str, ...] = ()  # what /proc did not tell, and why (memory not read: the process is stopped, ...)

    @property
    def others(self) -> Tuple[OtherEnd, ...]:
        """Everyone at the other end, across its fds and children."""
        return tuple(o for f in self.fds for o in f.others) + self.children
