"""Stand-in processes for the kernel-wait tests (run as a script, one mode each): each sets up what it will wait on,
says `ready PID [more]` on stdout, then blocks in one system call forever. Not a test module."""

import fcntl
import os
import socket
import subprocess
import sys
import threading
import time


def ready(*more):
    print("ready %d %s" % (os.getpid(), " ".join(str(m) for m in more)), flush=True)


def pipe_from_sleeper(args):
    """Reads a pipe whose only writer is a child that sleeps."""
    r, w = os.pipe()
    child = subprocess.Popen(["sleep", "86400"], pass_fds=[w])
    os.close(w)
    ready(child.pid)
    os.read(r, 1)


def fifo_nobody(args):
    """Opens a FIFO for reading that nobody opens for writing: blocks in openat."""
    path = args[0]
    os.mkfifo(path)
    ready()
    with open(path, "rb"):
        pass


def stdin_child(args):
    """A child reading its stdin, a pipe from this process (which sleeps, never writing)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.buffer.read(1)"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    child.stdout.readline()
    ready(child.pid)
    time.sleep(86400)


def pty_read(args):
    """Reads a pty's slave side: with "--ctty" after opening it as its controlling terminal (a session leader
    without one acquires the first terminal it opens)."""
    import pty

    master, slave = pty.openpty()
    fd = os.open(os.ttyname(slave), os.O_RDWR) if "--ctty" in args else slave
    ready(os.ttyname(slave))
    os.read(fd, 1)


def server(args):
    """A TCP server that accepts one connection and never answers (with "--no-accept": never accepts it)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    ready(srv.getsockname()[1])
    if "--no-accept" in args:
        time.sleep(86400)
    conn, _ = srv.accept()
    time.sleep(86400)
    return conn


def unix_server(args):
    """A unix stream server at args[0] that never accepts (a listener stopped or busy elsewhere)."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(args[0])
    srv.listen(4)
    ready()
    time.sleep(86400)


def unix_send(args):
    """Connects to the unix socket at args[0] and sends until the send blocks (nobody reads)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(args[0])
    ready()
    conn.sendall(b"x" * (64 << 20))


def recv_from(args):
    """recv on a TCP connection to args[0] (host:port); with "--timeout" the socket has a timeout: Python polls."""
    host, port = args[0].rsplit(":", 1)
    conn = socket.create_connection((host, int(port)))
    if "--timeout" in args:
        conn.settimeout(1000)
    ready(conn.getsockname()[1])
    conn.recv(1)


def udp_remote(args):
    """recv on a UDP socket connected to a TEST-NET address (never local, never answers)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("192.0.2.1", 9))
    ready()
    s.recv(1)


def unix_pair(args):
    """A child reads its end of a socketpair whose other end this process holds (and never writes)."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        b.recv(1)
        os._exit(0)
    b.close()
    ready(pid)
    time.sleep(86400)


def both_read(args):
    """Both ends of a socketpair read: a child reads its end, and this process reads its own (each waits for the
    other to send first)."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        b.recv(1)
        os._exit(0)
    b.close()
    ready(pid)
    a.recv(1)


def asyncio_read(args):
    """asyncio (its selector is epoll) waits for a TCP connection to args[0] to send something."""
    import asyncio

    host, port = args[0].rsplit(":", 1)

    async def main():
        reader, _writer = await asyncio.open_connection(host, int(port))
        ready()
        await reader.read(1)

    asyncio.run(main())


def asleep(pid, where=""):
    """Wait (bounded) until the child sleeps: right after exec it may still be running (state R) on a busy
    machine, and the tests read its state. where: a part of the kernel function it must sleep in (its wchan): a
    forked child sleeps (S) before its exec too, in no call of the program's."""
    for _ in range(2000):
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "S":
                with open("/proc/%d/wchan" % pid) as f:
                    if where in f.read():
                        return
        time.sleep(0.005)


def wait_child(args):
    """wait4 on one child that sleeps; another child is killed by SIGKILL and left a zombie."""
    sleeper = subprocess.Popen(["sleep", "86400"])
    victim = subprocess.Popen(["sleep", "86400"])
    os.kill(victim.pid, 9)
    os.waitid(os.P_PID, victim.pid, os.WEXITED | os.WNOWAIT)  # dead, and left unreaped: a zombie
    asleep(sleeper.pid)
    ready(sleeper.pid, victim.pid)
    os.waitpid(sleeper.pid, 0)


def wait_fed(args):
    """wait() on `cat` whose stdin is a pipe this process still holds open (it never closed proc.stdin); with
    "fork", a child forked after the pipe was made holds it too (a fork copies open files)."""
    cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    forked = 0
    if args and args[0] == "fork":
        forked = os.fork()
        if forked == 0:
            time.sleep(86400)
            os._exit(0)
    asleep(cat.pid, "pipe_read")
    ready(cat.pid, forked)
    cat.wait()


def poll_file(args):
    """Polls for a file to be complete (`while not complete(path)`, sleeping between checks); with "writer", a
    child holds the file open for writing (and sleeps, writing nothing)."""
    path = args[0]
    open(path, "w").close()
    writer = 0
    if len(args) > 1 and args[1] == "writer":
        child = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1], 'a')\n"
                                  "print('ok', flush=True)\ntime.sleep(86400)", path], stdout=subprocess.PIPE)
        child.stdout.readline()
        writer = child.pid
    ready(writer)
    while not _complete(path):
        time.sleep(0.2)


def _complete(path):
    return os.path.getsize(path) > 10


def wait_any(args):
    """wait4(-1): any of two sleeping children."""
    kids = [subprocess.Popen(["sleep", "86400"]) for _ in range(2)]
    for k in kids:
        asleep(k.pid)
    ready(*(k.pid for k in kids))
    os.wait()


def lock(fd, how):
    """An exclusive lock on the whole file: flock, POSIX (lockf: fcntl F_SETLKW) or an open file description's
    (fcntl F_OFD_SETLKW)."""
    if how == "flock":
        fcntl.flock(fd, fcntl.LOCK_EX)
    elif how == "posix":
        fcntl.lockf(fd, fcntl.LOCK_EX)
    else:
        import struct

        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))


def lock_holder(args):
    """Holds a lock on args[1] and sleeps."""
    fd = os.open(args[1], os.O_RDWR | os.O_CREAT)
    lock(fd, args[0])
    ready()
    time.sleep(86400)


def lock_waiter(args):
    """Asks for the lock lock_holder holds: blocks in flock or fcntl."""
    fd = os.open(args[1], os.O_RDWR)
    ready()
    lock(fd, args[0])


def spin(args):
    """A thread spinning on a core beside a main thread blocked reading a pipe nobody writes."""
    r, w = os.pipe()
    started = threading.Event()

    def run():
        started.set()
        while True:
            pass

    thread = threading.Thread(target=run, name="spinner", daemon=True)
    thread.start()
    started.wait()
    ready(thread.native_id)
    os.read(r, 1)
    return w


def sigwait(args):
    """sigwait for SIGUSR2 and a real-time signal (blocked first, as sigwait needs)."""
    import signal
    wanted = {signal.SIGUSR2, signal.SIGRTMIN + 3}
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    ready()
    signal.sigwait(wanted)


def shared_semaphore(args):
    """Acquires a multiprocessing semaphore at 0 (a POSIX named semaphore: a futex in /dev/shm shared between
    processes) that nobody posts; a threading.Lock in a second thread waits on a private futex beside it."""
    import multiprocessing
    sem = multiprocessing.Semaphore(0)
    lock = threading.Lock()
    lock.acquire()
    waiter = threading.Thread(target=lock.acquire, daemon=True)
    waiter.start()
    ready(waiter.native_id)
    sem.acquire()


if __name__ == "__main__":
    {"pipe": pipe_from_sleeper, "fifo": fifo_nobody, "stdin": stdin_child, "pty": pty_read, "server": server, "unix_server": unix_server, "unix_send": unix_send,
     "recv": recv_from, "udp": udp_remote, "unix": unix_pair, "both_read": both_read, "asyncio": asyncio_read, "wait": wait_child, "wait_fed": wait_fed, "poll_file": poll_file,
     "wait_any": wait_any, "holder": lock_holder, "waiter": lock_waiter, "spin": spin,
     "sigwait": sigwait, "shared_semaphore": shared_semaphore}[sys.argv[1]](sys.argv[2:])
