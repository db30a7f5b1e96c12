"""The relay's node-side stage: starts the worker on its group's nodes and multiplexes their streams (framing.py).

Not imported on the node: framing.relay_stage reads this source, appends the call to main() with this relay's
values and ships it compressed as `python3 -c`, like the srun stage. So it is stdlib only, python >= 3.9
syntax, imports nothing from app/, and writes nothing on the node.

Child 0 is this node's own worker (run here, no ssh to itself); child i > 0 is `ssh ... <child> <the worker's
command>` with the node's own OpenSSH client. Every child gets the worker payload (read once from stdin).

Wire (all integers big-endian):
- relay -> login: `kind u8, child u16, length u32, data`: O the child's stdout, E its stderr, X its exit
  status (decimal; negative: killed by that signal).
- login -> relay: the payload (`size` bytes), then `kind u8, tlen u16, length u32, targets, data`: D bytes for
  the children's stdin, E EOF on it (the worker stops and exits), K EOF then kill after `grace` seconds;
  `targets` is one child, `*` (every child) or ranges (`0-4,7`). EOF on the relay's stdin is K for every
  child; the relay exits once every child has.
"""

import os
import signal
import struct
import subprocess
import sys
import threading

UP = struct.Struct(">BHI")
DOWN = struct.Struct(">BHI")


def main(size, local_argv, ssh_argv, remote_command, children, grace, parallel, start_deadline):
    """`children`: [None (this node), [host, port or None, user or None], ...]."""
    out = sys.stdout.buffer
    stdin = sys.stdin.buffer
    lock = threading.Lock()

    def emit(kind, child, data=b""):
        with lock:
            try:
                out.write(UP.pack(ord(kind), child, len(data)) + data)
                out.flush()
            except Exception:
                pass  # the login side is gone: EOF on stdin ends everything

    payload = b""
    while len(payload) < size:
        chunk = stdin.read(size - len(payload))
        if not chunk:
            sys.exit(98)  # the login side went away before the whole payload: nothing was started
        payload += chunk

    starting = threading.BoundedSemaphore(max(1, parallel))

    class Child(object):
        def __init__(self, index, argv):
            self.index = index
            self.argv = argv
            self.proc = None
            self.cond = threading.Condition()
            self.queue = []  # bytes to write, None = EOF
            self.eof = False
            self.killed = False  # a kill is on its way (K, or the relay's stdin ended)
            self.dead = False  # killed: a child not started by then never starts
            self.spoke = threading.Event()  # first output, or the end: its start no longer holds a slot
            self.done = threading.Event()

        def put(self, data):
            with self.cond:
                if not self.eof:
                    self.queue.append(data)
                    self.cond.notify()

        def end(self, kill_after):
            with self.cond:
                if not self.eof:
                    self.queue.append(None)
                    self.eof = True
                    self.cond.notify()
            if kill_after is not None and not self.killed:
                self.killed = True
                timer = threading.Timer(kill_after, self.kill)
                timer.daemon = True
                timer.start()

        def kill(self):
            self.dead = True
            proc = self.proc
            if proc is not None and proc.poll() is None:
                try:
                    proc.kill()
                except Exception:
                    pass

        def run(self):
            code = None
            with starting:
                if self.dead:
                    emit("X", self.index, b"-9")
                    self.done.set()
                    return
                try:
                    self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE)
                except OSError as exc:
                    emit("E", self.index, ("relay: cannot run %s: %s\n" % (self.argv[0], exc)).encode())
                    emit("X", self.index, b"127")
                    self.done.set()
                    return
                pumps = [threading.Thread(target=self.pump, args=(self.proc.stdout, "O")),
                         threading.Thread(target=self.pump, args=(self.proc.stderr, "E"))]
                for t in pumps:
                    t.daemon = True
                    t.start()
                writer = threading.Thread(target=self.write)
                writer.daemon = True
                writer.start()
                # a slot is held while the child connects: until it says something or ends, at most the deadline
                self.spoke.wait(start_deadline)
            code = self.proc.wait()
            self.spoke.set()
            for t in pumps:
                t.join(5)
            emit("X", self.index, str(code).encode())
            self.done.set()

        def pump(self, stream, kind):
            while True:
                try:
                    data = os.read(stream.fileno(), 65536)
                except OSError:
                    data = b""
                if not data:
                    if kind == "O":
                        self.spoke.set()  # its output ended (it exited): the slot is free
                    return
                if kind == "O":
                    self.spoke.set()
                emit(kind, self.index, data)

        def write(self):
            pipe = self.proc.stdin if self.proc is not None else None
            if pipe is None:
                return
            try:
                pipe.write(payload)
                pipe.flush()
            except Exception:
                pass
            while True:
                with self.cond:
                    while not self.queue:
                        self.cond.wait()
                    items, self.queue = self.queue, []
                for data in items:
                    if data is None:
                        try:
                            pipe.close()
                        except Exception:
                            pass
                        return
                    try:
                        pipe.write(data)
                        pipe.flush()
                    except Exception:
                        pass  # the child is gone: its exit status says why

    kids = []
    for i, child in enumerate(children):
        if child is None:
            argv = list(local_argv)
        else:
            host, port, user = child
            argv = list(ssh_argv)
            if port:
                argv += ["-p", str(port)]
            if user:
                argv += ["-l", user]
            argv += ["--", host, remote_command]
        kids.append(Child(i, argv))
    runners = []
    for kid in kids:
        t = threading.Thread(target=kid.run)
        t.daemon = True
        t.start()
        runners.append(t)

    def stop_all(*_):
        for kid in kids:
            kid.end(grace)

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGHUP, stop_all)
    cache = {}  # type: dict

    def chosen(field):
        if field == b"*":
            return kids
        got = cache.get(field)
        if got is None:
            got = []
            for part in field.split(b","):
                lo, _, hi = part.partition(b"-")
                try:
                    got.extend(kids[int(lo):int(hi or lo) + 1])
                except ValueError:
                    return []
            if len(cache) > 64:
                cache.clear()
            cache[field] = got
        return got

    def exactly(n):
        buf = b""
        while len(buf) < n:
            chunk = stdin.read(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def feed():
        while True:
            head = exactly(DOWN.size)
            if head is None:
                break
            kind, tlen, length = DOWN.unpack(head)
            field = exactly(tlen) if tlen else b""
            data = exactly(length) if length else b""
            if field is None or data is None:
                break
            for kid in chosen(field):
                if kind == ord("D"):
                    kid.put(data)
                elif kind == ord("E"):
                    kid.end(None)
                elif kind == ord("K"):
                    kid.end(grace)
        stop_all()  # the login side closed the relay (or went away): every child stops

    feeder = threading.Thread(target=feed)
    feeder.daemon = True
    feeder.start()
    for kid in kids:
        kid.done.wait()
    for t in runners:
        t.join(5)
