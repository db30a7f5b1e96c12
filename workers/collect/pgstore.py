"""The rank numbers a job's process group keeps in its store, read from the store without writing to it.

A rank started without a rank environment (torch.multiprocessing.spawn, plain multiprocessing) has its number
only in its process group. gloo's full-mesh rendezvous publishes every rank's listening address in the job's
TCPStore under a per-rank key of the default group ("/default_pg/0//cpu//0/3": group, device type, context,
rank), so the store says which listening socket is which rank. This module asks the store, over its own wire
protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp), with read-only queries only:

    VALIDATE (the magic number every client sends first), PING (the store echoes a nonce: proves it is a
    TCPStore that speaks this protocol before anything else is asked), LIST_KEYS (torch >= 2.10), GET of the
    default group's per-rank keys that LIST_KEYS listed (present: GET never waits), and, on a store without
    LIST_KEYS, CHECK (never waits either) of those keys by name, rank 0 upwards.

Nothing is set, added, deleted or waited for; one connection, closed at the end; every read has the caller's
deadline. A store that does not answer the ping (not a TCPStore, or one older than torch 2.4) is left alone after
it. Values never leave the node: the caller gives the listening addresses of its ranks, and only which of them
the store names, with the rank, comes back.
"""

from __future__ import annotations

import os
import socket
import struct
import time

from workers.lazyre import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Dict, List, Tuple

VALIDATE, GET, CHECK, PING, LIST_KEYS = 0, 3, 5, 13, 17
MAGIC = 0x3C85F7CE
READY = 0
# The default group's per-rank gloo keys (torch 2.x): /default_pg/<group>//<device type>//<context>/<rank>
RANK_KEY = lazy(r"^/?default_pg/([^/]{1,64})//([a-z]{1,16})//(\d{1,4})/(\d{1,7})$")
FALLBACK_KEY = "/default_pg/0//cpu//0/%d"  # CHECKed by name where LIST_KEYS is unknown
MAX_KEYS = 100000  # keys a listing may have
MAX_KEY_BYTES = 1024
MAX_LIST_BYTES = 8 << 20
MAX_GETS = 4096  # per-rank keys read: ranks of a job
MAX_VALUE_BYTES = 64 << 10
MAX_LISTENERS = 4096


class StoreError(Exception):
    """The store could not be read; the message says why, for the user."""


class _Conn:
    def __init__(self, host: str, port: int, deadline: float) -> None:
        self.deadline = deadline
        self.sock = socket.create_connection((host, port), timeout=max(0.05, deadline - time.monotonic()))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data: bytes) -> None:
        self._arm()
        self.sock.sendall(data)

    def recv(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            self._arm()
            chunk = self.sock.recv(min(left, 1 << 16))
            if not chunk:
                raise StoreError("the store closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.recv(8))[0])

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("deadline")
        self.sock.settimeout(left)


def _string(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _open(host: str, port: int, deadline: float) -> _Conn:
    conn = _Conn(host, port, deadline)
    try:
        nonce = int.from_bytes(os.urandom(4), "little")
        conn.send(struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BI", PING, nonce))
        if struct.unpack("<I", conn.recv(4))[0] != nonce:
            raise StoreError("the endpoint answered the ping with something else: not a TCPStore")
    except BaseException:
        conn.close()
        raise
    return conn


def _list_keys(conn: _Conn) -> List[str]:
    conn.send(struct.pack("<B", LIST_KEYS))
    count = conn.u64()
    if count > MAX_KEYS:
        raise StoreError("the store lists %d keys, more than the %d read" % (count, MAX_KEYS))
    keys, total = [], 0
    for _ in range(count):
        size = conn.u64()
        total += size
        if size > MAX_KEY_BYTES or total > MAX_LIST_BYTES:
            raise StoreError("the store's key listing is larger than %d bytes" % MAX_LIST_BYTES)
        keys.append(conn.recv(size).decode("utf-8", "replace"))
    return keys


def _get(conn: _Conn, key: str) -> bytes:
    conn.send(struct.pack("<B", GET) + _string(key.encode()))
    size = conn.u64()
    if size > MAX_VALUE_BYTES:
        raise StoreError("the store's value of %s is %d bytes, more than a rank's address" % (key, size))
    return conn.recv(size)


def _check(conn: _Conn, key: str) -> bool:
    conn.send(struct.pack("<BQ", CHECK, 1) + _string(key.encode()))
    return conn.recv(1)[0] == READY


def _patterns(endpoint: str) -> List[bytes]:
    """The sockaddr bytes gloo stores for a listening endpoint "ip:port" / "[ip6]:port" (sockaddr_in, and the
    sockaddr_in6 of an IPv4 address mapped on an IPv6 socket); the IPv6 flow info is skipped by the caller."""
    host, _, port_text = endpoint.rpartition(":")
    host = host.strip("[]")
    port = struct.pack(">H", int(port_text))
    try:
        v4 = socket.inet_pton(socket.AF_INET, host)
    except OSError:
        v6 = socket.inet_pton(socket.AF_INET6, host)
        return [struct.pack("<H", socket.AF_INET6) + port + b"\0" * 4 + v6]
    mapped = b"\0" * 10 + b"\xff\xff" + v4
    return [struct.pack("<H", socket.AF_INET) + port + v4,
            struct.pack("<H", socket.AF_INET6) + port + b"\0" * 4 + mapped]


def _names(value: bytes, pattern: bytes) -> bool:
    if pattern[:2] == struct.pack("<H", socket.AF_INET):
        return pattern in value
    head, addr = pattern[:4], pattern[8:]  # sockaddr_in6: family, port, flow info (any), address
    at = value.find(head)
    while at >= 0:
        if value[at + 8:at + 24] == addr:
            return True
        at = value.find(head, at + 1)
    return False


def read_ranks(store: str, listeners: List[str], timeout: float, list_keys: bool = True) -> Dict[str, object]:
    """{"ranks": {listener: rank}, "how": "LIST_KEYS" | "CHECK", "keys": listed, "read": got}
    for the listeners (a rank's listening "ip:port") that the store's default group names; raises StoreError
    (or OSError: connection refused, timed out) when the store cannot be read."""
    host, _, port_text = store.rpartition(":")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise StoreError("%r is not an address:port" % store[:100])
    wanted: Dict[str, List[bytes]] = {}
    for endpoint in listeners[:MAX_LISTENERS]:
        try:
            wanted[endpoint] = _patterns(endpoint)
        except (OSError, ValueError):
            continue
    deadline = time.monotonic() + timeout
    found: Dict[str, int] = {}
    clash: set = set()
    listed = got = 0
    how = "LIST_KEYS" if list_keys else "CHECK"
    conn = _open(host.strip("[]"), int(port_text), deadline)
    try:
        keys: List[Tuple[str, int]] = []
        if list_keys:
            try:
                names = _list_keys(conn)
            except (StoreError, OSError):
                # torch < 2.10 has no LIST_KEYS: the store drops the connection; ask again by name
                conn.close()
                conn = _open(host.strip("[]"), int(port_text), deadline)
                how, names = "CHECK", []
            else:
                listed = len(names)
                for name in names:
                    m = RANK_KEY.match(name)
                    if m is not None:
                        keys.append((name, int(m.group(4))))
                keys.sort(key=lambda k: (k[1], k[0]))
        if how == "CHECK":
            for number in range(MAX_GETS):
                name = FALLBACK_KEY % number
                if not _check(conn, name):
                    break
                keys.append((name, number))
        for name, number in keys[:MAX_GETS]:
            value = _get(conn, name)
            got += 1
            for endpoint, patterns in wanted.items():
                if any(_names(value, p) for p in patterns):
                    if found.get(endpoint, number) != number:
                        clash.add(endpoint)
                    found[endpoint] = number
    finally:
        conn.close()
    for endpoint in clash:  # one address under two ranks' keys: the store does not tell which
        del found[endpoint]
    return {"ranks": found, "how": how, "keys": listed, "read": got}
