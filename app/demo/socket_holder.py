"""Keeps a dead demo rank's TCP connections open (the `die` scenario of job.py); stdlib only.

Usage: socket_holder.py SECONDS FD... (the fds inherited from the rank). It never reads or writes them, so
the peers see neither data nor a close, and exits once every peer has hung up (the job was stopped) or after
SECONDS (the job's process-group timeout), so it never outlives the job.
"""

from __future__ import annotations

import select
import socket
import sys
import time
from typing import List


def hold(seconds: float, fds: List[int]) -> None:
    deadline = time.monotonic() + seconds
    poller = select.poll()
    held, live = [], set()
    for fd in fds:
        sock = socket.socket(fileno=fd)
        held.append(sock)  # keep a reference: a collected socket object would close its fd
        if sock.family != socket.AF_UNIX and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            poller.register(fd, select.POLLRDHUP)  # only hang-ups: pending data must not wake us
            live.add(fd)
    while live and time.monotonic() < deadline:
        for fd, _ in poller.poll(10_000):
            poller.unregister(fd)
            live.discard(fd)


if __name__ == "__main__":
    hold(float(sys.argv[1]), [int(a) for a in sys.argv[2:]])
