"""Node services around the blind exit set's training job, each started by the harness (bench/blind/exits/scenarios.py)
inside a node:

  object-gateway --port P [--stall]  the node's object-storage gateway on 127.0.0.1:P: reads each HTTP PUT (headers
                                     and body) and answers `201 Created`; with --stall it reads the request but never
                                     answers (its upstream store hangs), keeping the connection open
  event-daemon --fifo PATH           the node's job-event daemon: reads job events, one JSON line each, from the FIFO
                                     at PATH (created if missing), reopening it after each writer closes it

Prints `ready` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import os
import socket
import stat
import sys
import threading


def object_gateway(port: int, stall: bool) -> None:
    hold = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            f.readline()
            length = 0
            while True:
                line = f.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            f.read(length)
            if stall:
                hold.wait()  # the upstream store never acknowledges; the connection stays open
            conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    sock = socket.create_server(("127.0.0.1", port), backlog=64)
    print("ready", flush=True)
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def event_daemon(path: str) -> None:
    if not (os.path.exists(path) and stat.S_ISFIFO(os.stat(path).st_mode)):
        os.mkfifo(path, 0o666)
    print("ready", flush=True)
    seen = 0
    while True:
        with open(path, "r") as events:  # blocks until a writer opens it
            for _ in events:
                seen += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("object-gateway")
    g.add_argument("--port", type=int, required=True)
    g.add_argument("--stall", action="store_true")
    e = sub.add_parser("event-daemon")
    e.add_argument("--fifo", required=True)
    args = ap.parse_args()
    if args.what == "object-gateway":
        object_gateway(args.port, args.stall)
    else:
        event_daemon(args.fifo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
