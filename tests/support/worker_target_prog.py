"""A stand-in rank for the worker tests (run as a script): blocks forever on a pipe, in known functions and
loops, and says `ready` on stdout only once every thread is about to block. Not a test module."""

import os
import sys
import threading

BLOCK_R, BLOCK_W = os.pipe()  # nobody ever writes BLOCK_W: reads on BLOCK_R block forever
spinner_ready = threading.Event()


def wait_forever(tag):
    marker = "blocked in %s" % tag  # a string local, the same on every rank
    return os.read(BLOCK_R, 1), marker


def spin():
    i = 0
    while True:
        i += 1
        if i == 7:
            spinner_ready.set()
            wait_forever("spin")


def train(loader):
    epoch = 0
    for step, batch in enumerate(loader):
        if step == 3:
            wait_forever("train")
    return epoch


def rank(args):
    hf_token = os.environ.get("TARGET_SECRET", "")  # a secret a rank holds in a local variable
    helper = None
    if "--helper" in args:  # a data-loader-style child: same environment, parent is the rank
        helper = os.fork()
        if helper == 0:
            wait_forever("helper")
            os._exit(0)
    conn = None
    if "--connect" in args:  # a TCP peer it never reads from (a collective's connection, stalled)
        import socket

        host, port = args[args.index("--connect") + 1].rsplit(":", 1)
        conn = socket.create_connection((host, int(port)))
    threading.Thread(target=spin, name="spinner", daemon=True).start()
    spinner_ready.wait()
    print("ready %d %s" % (os.getpid(), helper or ""), flush=True)
    train(["a", "b", "c", "d", "e"])
    return conn, hf_token


def busy(args):
    """A rank whose second thread polls with a 1 ms timeout forever: a steady stream of syscalls for strace."""
    import select

    def poll_forever():
        while True:
            select.select([BLOCK_R], [], [], 0.001)

    threading.Thread(target=poll_forever, name="poller", daemon=True).start()
    print("ready %d" % os.getpid(), flush=True)
    wait_forever("busy")


def launcher(args):
    """Starts N rank children with RANK/LOCAL_RANK set, like torchrun; reports their pids once ready."""
    import subprocess

    n = int(args[0])
    kids = []
    for i in range(n):
        env = dict(os.environ, RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT="29555", LOCAL_WORLD_SIZE=str(n))
        kids.append(subprocess.Popen([sys.executable, __file__, "rank"] + args[1:], env=env,
                                     stdout=subprocess.PIPE))
    pids = [k.stdout.readline().split()[1].decode() for k in kids]
    print("ready %d %s" % (os.getpid(), " ".join(pids)), flush=True)
    os.read(BLOCK_R, 1)


if __name__ == "__main__":
    {"rank": rank, "launcher": launcher, "busy": busy}[sys.argv[1]](sys.argv[2:])
