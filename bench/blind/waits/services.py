"""Services around the blind wait set's training job, each started by the harness (bench/blind/waits/scenarios.py):

  collector --port P [--stop-reading-after BYTES]   a node's metrics collector on 127.0.0.1: reads and discards
                                                     what it is sent; after BYTES bytes on a connection it stops
                                                     reading it (its writer is stuck) but keeps it open
  snapshot-agent --spool DIR                        a node's snapshot agent: takes each request file `req-*`
                                                     (`PID snapshot ...`) from DIR, snapshots, and acknowledges
                                                     with SIGUSR2 to PID
  registry --host H --port P --retry-after S        a model registry whose project quota is used up: answers every
                                                     REGISTER with `429 Too Many Requests Retry-After: S`

Each prints `ready` on stdout once it listens (or watches its folder).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time


def _serve(sock: socket.socket, handle) -> None:
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def collector(port: int, stop_after: int) -> None:
    hold = threading.Event()

    def handle(conn: socket.socket) -> None:
        got = 0
        while True:
            if 0 <= stop_after <= got:
                hold.wait()  # the connection stays open and is never read again
            data = conn.recv(1 << 16)
            if not data:
                return
            got += len(data)

    sock = socket.create_server(("127.0.0.1", port), backlog=64)
    print("ready", flush=True)
    _serve(sock, handle)


def snapshot_agent(spool: str) -> None:
    os.makedirs(spool, exist_ok=True)
    print("ready", flush=True)
    while True:
        for name in sorted(os.listdir(spool)):
            if not name.startswith("req-"):
                continue
            path = os.path.join(spool, name)
            with open(path) as f:
                pid = int(f.read().split()[0])
            os.rename(path, os.path.join(spool, "done-" + name[4:]))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2)
        time.sleep(0.1)  # a poll interval of the agent's folder watch


def registry(host: str, port: int, retry_after: int) -> None:
    def handle(conn: socket.socket) -> None:
        with conn:
            f = conn.makefile("rb")
            if f.readline():
                conn.sendall(f"429 Too Many Requests Retry-After: {retry_after}\n".encode())

    sock = socket.create_server((host, port), backlog=64)
    print("ready", flush=True)
    _serve(sock, handle)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("collector")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--stop-reading-after", type=int, default=-1)
    a = sub.add_parser("snapshot-agent")
    a.add_argument("--spool", required=True)
    r = sub.add_parser("registry")
    r.add_argument("--host", required=True)
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--retry-after", type=int, default=3600)
    args = ap.parse_args()
    if args.what == "collector":
        collector(args.port, args.stop_reading_after)
    elif args.what == "snapshot-agent":
        snapshot_agent(args.spool)
    else:
        registry(args.host, args.port, args.retry_after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
