"""Services around the blind set's training job, each started by the harness (bench/blind/hangs/scenarios.py):

  objectstore --host H --port P [--stall-key KEY]   an object store taking `PUT key size\\n<data>`, answering
                                                     `200 OK`; the PUT of KEY is read and never answered
  agent --port P [--stall-after N]                  a node's line-based agent on 127.0.0.1 (metrics, reward
                                                     scores): answers each line `OK`; after N lines it keeps
                                                     reading and never answers again
  compact-metrics PATH                              a log compactor that takes an exclusive flock on PATH and
                                                     then waits forever, holding it

Each prints `ready` on stdout once it listens (or holds its lock).
"""

from __future__ import annotations

import argparse
import fcntl
import socket
import sys
import threading


def _serve(sock: socket.socket, handle) -> None:
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def objectstore(host: str, port: int, stall_key: str) -> None:
    hold = threading.Event()

    def handle(conn: socket.socket) -> None:
        f = conn.makefile("rb")
        while True:
            line = f.readline()
            if not line:
                return
            _, key, size = line.decode().split()
            f.read(int(size))
            if key == stall_key:
                hold.wait()  # the request was taken and is never answered
            conn.sendall(b"200 OK\n")

    sock = socket.create_server((host, port), backlog=64)
    print("ready", flush=True)
    _serve(sock, handle)


def agent(port: int, stall_after: int) -> None:
    hold = threading.Event()
    answered = [0]

    def handle(conn: socket.socket) -> None:
        f = conn.makefile("rb")
        while True:
            line = f.readline()
            if not line:
                return
            if 0 <= stall_after <= answered[0]:
                hold.wait()
            answered[0] += 1
            conn.sendall(b"OK\n")

    sock = socket.create_server(("127.0.0.1", port), backlog=64)
    print("ready", flush=True)
    _serve(sock, handle)


def compact_metrics(path: str) -> None:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        print("ready", flush=True)
        threading.Event().wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("objectstore")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--stall-key", default="")
    a = sub.add_parser("agent")
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--stall-after", type=int, default=-1)
    c = sub.add_parser("compact-metrics")
    c.add_argument("path")
    args = ap.parse_args()
    if args.what == "objectstore":
        objectstore(args.host, args.port, args.stall_key)
    elif args.what == "agent":
        agent(args.port, args.stall_after)
    else:
        compact_metrics(args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
