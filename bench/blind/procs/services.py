"""Services around the blind process set's training job, each started by the harness (bench/blind/procs/scenarios.py):

  shard-cache --port P [--stall]   a node's shard cache daemon on 127.0.0.1:P, answering `GET /manifest?shard=N`
                                   with the shard's file list (JSON); with --stall it accepts and reads each request
                                   but never answers (its backend is hung), keeping the connection open

Prints `ready` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading


def shard_cache(port: int, stall: bool) -> None:
    hold = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            f = conn.makefile("rb")
            request = f.readline()
            while f.readline() not in (b"\r\n", b"\n", b""):
                pass
            if stall:
                hold.wait()  # the backend lookup never returns; the connection stays open
            shard = request.split(b"shard=", 1)[-1].split()[0].decode(errors="replace") if b"shard=" in request else "0"
            body = json.dumps({"shard": shard, "files": [f"shard-{shard}-{i:03d}.tar" for i in range(16)]}).encode()
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)

    sock = socket.create_server(("127.0.0.1", port), backlog=64)
    print("ready", flush=True)
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("shard-cache")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--stall", action="store_true")
    args = ap.parse_args()
    shard_cache(args.port, args.stall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
