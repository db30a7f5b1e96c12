"""The srun step's node-side stage: runs one worker per srun task and frames its streams (framing in mux.py).

This file is not imported on the node: mux.mux_stage reads its source, appends the call to main() with this
step's values, and ships it compressed as `python3 -c`. So it is stdlib only, python >= 3.9 syntax, and
imports nothing from app/. Like the worker's own first stage, it writes nothing on the node.
"""

import base64
import os
import signal
import socket
import subprocess
import sys
import threading


def main(size, argv, frame_raw, grace):
    """Say which node this task is, read the worker payload (`size` bytes), run `argv` (the worker's own
    `python3 -c <stage>`) with the payload on its stdin, then relay: this task's `D/E/K` lines to the worker,
    its stdout/stderr out as `O/E` frames, and its exit status as `X`."""
    task = os.environ.get("SLURM_PROCID", "0")
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    out = sys.stdout.buffer
    lock = threading.Lock()

    def emit(kind, data=b""):
        # one or more `<task> <kind> <base64>` lines of at most frame_raw bytes of data each (srun interleaves
        # longer lines of different tasks); an empty `data` is one line with nothing after the kind
        with lock:
            i = 0
            while True:
                out.write(("%s %s " % (task, kind)).encode() + base64.b64encode(data[i:i + frame_raw]) + b"\n")
                i += frame_raw
                if i >= len(data):
                    break
            out.flush()

    emit("H", host.encode("utf-8", "replace"))
    stdin = sys.stdin.buffer
    payload = b""
    while len(payload) < size:
        chunk = stdin.read(size - len(payload))
        if not chunk:
            sys.exit(98)  # srun's stdin ended before the whole payload: nothing was started
        payload += chunk
    worker = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    to_worker = worker.stdin
    assert to_worker is not None  # stdin=PIPE

    def put(data):
        try:
            to_worker.write(data)
            to_worker.flush()
        except Exception:
            pass  # the worker is gone: its exit status says why

    def end(after):
        # EOF on the worker's stdin (it stops its tools and exits); with `after`, kill it if still running then
        try:
            to_worker.close()
        except Exception:
            pass
        if after is not None:
            def kill_if_running():
                if worker.poll() is None:
                    worker.kill()

            timer = threading.Timer(after, kill_if_running)
            timer.daemon = True
            timer.start()

    put(payload)

    def pump(stream, kind):
        while True:
            data = os.read(stream.fileno(), 65536)
            if not data:
                return
            emit(kind, data)

    pumps = [threading.Thread(target=pump, args=(worker.stdout, "O")),
             threading.Thread(target=pump, args=(worker.stderr, "E"))]
    for t in pumps:
        t.daemon = True
        t.start()

    me = task.encode()
    mine_cache = {}  # type: dict

    def mine(field):
        # this task's number, `*` (every task), or ranges `0-4,7` (mux.py targets())
        if field == me or field == b"*":
            return True
        if b"-" not in field and b"," not in field:
            return False
        got = mine_cache.get(field)
        if got is None:
            got = False
            n = int(task)
            for part in field.split(b","):
                lo, _, hi = part.partition(b"-")
                try:
                    if int(lo) <= n <= int(hi or lo):
                        got = True
                        break
                except ValueError:
                    break
            if len(mine_cache) > 64:
                mine_cache.clear()
            mine_cache[field] = got
        return got

    def feed():
        # every task reads every line (srun --input=all): only the lines for this task count
        for line in stdin:
            parts = line.rstrip(b"\n").split(b" ")
            if len(parts) < 2 or not mine(parts[0]):
                continue
            if parts[1] == b"D" and len(parts) > 2:
                put(base64.b64decode(parts[2]))
            elif parts[1] == b"E":
                return end(None)
            elif parts[1] == b"K":
                return end(grace)
        end(grace)  # srun's stdin ended: EOF for every task

    feeder = threading.Thread(target=feed)
    feeder.daemon = True
    feeder.start()
    signal.signal(signal.SIGTERM, lambda signum, frame: end(grace))  # srun cancels the step
    code = worker.wait()
    for t in pumps:
        t.join(5)
    emit("X", str(code).encode())
