"""Node-side programs that the steady-state set's training job (bench/blind/steady/train.py) meets, started by the
harness inside a node (bench/blind/steady/scenarios.py) or by the job itself:

  tokenize                       a streaming tokenizer: reads text on stdin, writes one token id per word on stdout
                                 as it goes (a newline ends a document); started by the job's DataLoader workers
  upload --src DIR --dest DIR    the checkpoint uploader: copies DIR's files to the bucket DIR in 1 KiB parts; its
                                 log level comes from the node's /run/ckpt-upload.conf (debug: one line per part)
  datasvc --root DIR --sock PATH the node's data service: streams a shard's records (DIR/<name>.bin, lengths from
                                 DIR/<name>.idx) to a client that sends `OPEN <name>`, then waits for its next command
  prune --dir DIR                the node's checkpoint retention job: takes DIR/.lock (flock) and deletes old
                                 checkpoints; the harness stops it (SIGSTOP) while it holds the lock

Harness-started ones print `ready` on stdout once they hold what they hold.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import socket
import struct
import sys
import threading
import time
import zlib


def tokenize() -> None:
    pending = b""
    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            return
        pending += chunk
        out = []
        while True:
            cut = min([i for i in (pending.find(b" "), pending.find(b"\n")) if i >= 0], default=-1)
            if cut < 0:
                break
            word, sep, pending = pending[:cut], pending[cut:cut + 1], pending[cut + 1:]
            if word:
                out.append(b"%d " % (zlib.crc32(word) % 30000))
            if sep == b"\n":
                out.append(b"\n")
        if out:
            os.write(1, b"".join(out))


def upload(src: str, dest: str) -> None:
    level = "info"
    try:
        with open("/run/ckpt-upload.conf") as f:
            for line in f:
                key, _, value = line.partition("=")
                if key.strip() == "log_level":
                    level = value.strip()
    except OSError:
        pass
    os.makedirs(dest, exist_ok=True)
    for name in sorted(os.listdir(src)):
        size = os.path.getsize(os.path.join(src, name))
        print(f"upload: {name} ({size} bytes) -> {dest}", flush=True)
        with open(os.path.join(src, name), "rb") as fin, open(os.path.join(dest, name), "wb") as fout:
            part = 0
            while True:
                block = fin.read(1024)
                if not block:
                    break
                fout.write(block)
                part += 1
                if level == "debug":
                    print(f"debug: {name} part {part:06d} offset {fin.tell():>10d} crc32 {zlib.crc32(block):08x} "
                          f"sent ok", flush=True)
    print("upload: done", flush=True)


def datasvc(root: str, sock_path: str) -> None:
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(16)
    print("ready", flush=True)

    def serve(conn: socket.socket) -> None:
        f = conn.makefile("rb")
        while True:
            line = f.readline()
            if not line:
                return
            cmd, _, name = line.decode().strip().partition(" ")
            if cmd != "OPEN":
                continue
            with open(os.path.join(root, name + ".idx")) as fi:
                lengths = json.load(fi)["lengths"]
            conn.sendall(struct.pack("<I", len(lengths)))
            with open(os.path.join(root, name + ".bin"), "rb") as fd:
                for n in lengths:
                    conn.sendall(struct.pack("<I", n) + fd.read(n))

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def prune(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    lock = open(os.path.join(folder, ".lock"), "a+")  # noqa: SIM115 (held until it is done)
    fcntl.flock(lock, fcntl.LOCK_EX)
    print("ready", flush=True)
    for name in sorted(os.listdir(folder)):
        if name.startswith("step-"):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
            time.sleep(0.05)
    fcntl.flock(lock, fcntl.LOCK_UN)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("tokenize")
    u = sub.add_parser("upload")
    u.add_argument("--src", required=True)
    u.add_argument("--dest", required=True)
    d = sub.add_parser("datasvc")
    d.add_argument("--root", required=True)
    d.add_argument("--sock", required=True)
    p = sub.add_parser("prune")
    p.add_argument("--dir", required=True)
    args = ap.parse_args()
    if args.what == "tokenize":
        tokenize()
    elif args.what == "upload":
        upload(args.src, args.dest)
    elif args.what == "datasvc":
        datasvc(args.root, args.sock)
    else:
        prune(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
