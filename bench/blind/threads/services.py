"""Node services around the blind thread set's training job, each started by the harness
(bench/blind/threads/scenarios.py) inside a node:

  auth-sidecar --port P [--stall]   the node's auth sidecar on 127.0.0.1:P, answering `GET /token?scope=S` with
                                    a JSON token; with --stall it accepts and reads each request but never answers
                                    (its upstream identity provider hangs), keeping the connection open
  node-agent --socket PATH [--stall]
                                    the node agent on a unix socket, answering each `STATS` line with a JSON line
                                    of host stats; with --stall it reads requests but never answers (its collector
                                    is wedged)

Prints `ready` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time


def auth_sidecar(port: int, stall: bool) -> None:
    hold = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            f.readline()
            while f.readline() not in (b"\r\n", b"\n", b""):
                pass
            if stall:
                hold.wait()  # the upstream call never returns; the connection stays open
            body = json.dumps({"token": os.urandom(12).hex(), "expires_in": 3600}).encode()
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)

    sock = socket.create_server(("127.0.0.1", port), backlog=64)
    print("ready", flush=True)
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def node_agent(path: str, stall: bool) -> None:
    hold = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            for _ in f:
                if stall:
                    hold.wait()  # the collector behind it is wedged
                load = os.getloadavg()
                conn.sendall(json.dumps({"load1": load[0], "time": time.time(), "mem_free_mb": 1024}).encode()
                             + b"\n")

    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o666)
    sock.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("auth-sidecar")
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--stall", action="store_true")
    n = sub.add_parser("node-agent")
    n.add_argument("--socket", required=True)
    n.add_argument("--stall", action="store_true")
    args = ap.parse_args()
    if args.what == "auth-sidecar":
        auth_sidecar(args.port, args.stall)
    else:
        node_agent(args.socket, args.stall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
