"""The socket a blocked thread waits on: its endpoints, state and queues, and the local process at the other end
(workers/collect/kwait.py asks; only /proc and, in the worker's own network namespace, sock_diag are read).

TCP: the namespace's table (one sock_diag dump here, /proc/PID/net/tcp{,6} in another namespace: read once per
namespace and request); the other end is the process holding the reverse connection (local and peer swapped)
when it is in the same table, or the listener of the peer's port when the connection still waits in its accept
queue (its other end has no file, and no inode, until accept) or is being set up (SYN_SENT). A peer on this node
but in another network namespace (a container) is not found. UDP: endpoints only (/proc/PID/net/udp{,6}).
Unix: sock_diag gives the socket's path and its peer's inode (in the worker's namespace), /proc/PID/net/unix the
path only (elsewhere); a connection the server has not accepted yet has a peer without an inode, and its other end
is the listener whose pending connections hold it (sock_diag's dump of the listeners).
"""

from __future__ import annotations

import os
import socket
import struct
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Set, Tuple

from workers import procinfo
from workers.collect import fdindex, sockets

MAX_TABLE_BYTES = 16 << 20
MAX_UNIX_BYTES = 4 << 20
_UDP_STATES = {"ESTABLISHED": "connected", "CLOSE": "unconnected"}
_UNIX_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 7: "UNCONNECTED", 10: "LISTEN"}  # sock_diag: TCP's numbers
_UNIX_PROC_STATES = {"01": "UNCONNECTED", "02": "CONNECTING", "03": "CONNECTED", "04": "DISCONNECTING"}
_WILDCARD = ("0.0.0.0", "::")

_lock = threading.Lock()


class _Tables:
    """One network namespace's TCP (and, when asked, UDP) sockets, with the reverse lookups."""

    def __init__(self, tcp: Dict[int, Dict[str, Any]]) -> None:
        self.tcp = tcp
        self.udp: Optional[Dict[int, Dict[str, Any]]] = None
        self.by_pair: Dict[Tuple[str, str], int] = {}
        self.listeners: Dict[int, List[Tuple[str, int]]] = {}
        self.addrs: Set[str] = set()
        for inode, row in tcp.items():
            host, port = split(row["local"])
            if row["state"] == "LISTEN":
                self.listeners.setdefault(port, []).append((host, inode))
            else:
                self.by_pair[(row["local"], row["peer"])] = inode
            if host not in _WILDCARD:
                self.addrs.add(host)

    def local(self, host: str) -> bool:
        """host is this namespace's own: loopback, or the address of one of its sockets."""
        return host.startswith("127.") or host == "::1" or host in self.addrs

    def listener(self, endpoint: str) -> Optional[int]:
        host, port = split(endpoint)
        for addr, inode in self.listeners.get(port, []):
            if addr == host or addr in _WILDCARD:
                return inode
        return None


def split(endpoint: str) -> Tuple[str, int]:
    """"10.0.0.1:80" / "[::1]:80" as (host, port); port -1 when there is none."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else -1


def _netns(pid: int) -> str:
    return procinfo.namespace(pid, "net") or "pid %d" % pid


def _tables(cache: Dict[str, Any], pid: int) -> _Tables:
    ns = _netns(pid)
    key = "tcp " + ns
    with _lock:
        tables = cache.get(key)
        if tables is None:
            rows = sockets.netlink_table() if ns == _netns(os.getpid()) else None
            tables = cache[key] = _Tables(rows if rows is not None else sockets.tcp_table(pid))
        return tables


def _udp(cache: Dict[str, Any], pid: int, tables: _Tables) -> Dict[int, Dict[str, Any]]:
    with _lock:
        if tables.udp is None:
            rows: Dict[int, Dict[str, Any]] = {}
            for name in ("udp", "udp6"):
                try:
                    text = procinfo.read_file("/proc/%d/net/%s" % (pid, name), MAX_TABLE_BYTES)
                except OSError:
                    continue
                rows.update(sockets.parse_proc_tcp(text.decode("ascii", "replace")))
            tables.udp = rows
        return tables.udp


def endpoint(cache: Dict[str, Any], index: fdindex.FdIndex, pid: int, inode: int) -> Dict[str, Any]:
    """What the socket is: {"proto", "local", "peer", "state", "send_q", "recv_q", "others", "complete",
    "notes"}; the keys that cannot be told are left out."""
    tables = _tables(cache, pid)
    row = tables.tcp.get(inode)
    if row is not None:
        out = {"proto": "tcp", "local": row["local"], "peer": row["peer"], "state": row["state"],
               "send_q": row["send_q"], "recv_q": row["recv_q"]}  # type: Dict[str, Any]
        _tcp_other(out, tables, index, pid)
        return out
    row = _udp(cache, pid, tables).get(inode)
    if row is not None:
        return {"proto": "udp", "local": row["local"], "peer": row["peer"],
                "state": _UDP_STATES.get(row["state"], row["state"]), "send_q": row["send_q"], "recv_q": row["recv_q"]}
    unix = _unix_diag(inode) if _netns(pid) == _netns(os.getpid()) else None
    if unix is None:
        unix = _unix_proc(pid, inode)
    if unix is None:
        return {"notes": ["socket:[%d] is in none of its namespace's TCP, UDP or unix tables (another family: "
                          "netlink, packet, ...)" % inode]}
    peer = unix.pop("peer_inode", None)
    if peer and unix.get("state") != "LISTEN":
        others, complete = fdindex.ends(index, "socket:[%d]" % peer, (0, 1, 2), "peer", pid)
        unix["others"], unix["complete"] = others, complete
        if not others:
            unix.setdefault("notes", []).append("no process holds the peer socket:[%d]%s" % (
                peer, "" if complete else " among the processes read"))
    elif peer == 0 and unix.get("state") in ("ESTABLISHED", "SYN_SENT"):
        # connected, and its other end has no inode: a socket the listener has not accepted yet (it has no file
        # until accept), as a TCP connection in the accept queue. The listener lists it among its pending ones.
        listener = _unix_listener_of(inode)
        if listener is not None:
            ino, name = listener
            if name:
                unix["peer"] = name
            unix["others"], unix["complete"] = fdindex.ends(index, "socket:[%d]" % ino, (0, 1, 2), "listener", pid)
            unix.setdefault("notes", []).append(
                "the connection waits in the listener's accept queue: the listener has not accepted it")
    return unix


def _tcp_other(out: Dict[str, Any], tables: _Tables, index: fdindex.FdIndex, pid: int) -> None:
    """The local process at the other end of a TCP socket, when the peer is on this node (see the module doc)."""
    state, peer = out["state"], out["peer"]
    if state == "LISTEN":
        return  # accept(): whoever connects next; nothing more to name
    host, port = split(peer)
    if port <= 0 or not tables.local(host):
        return
    reverse = tables.by_pair.get((peer, out["local"])) if state != "SYN_SENT" else None
    if reverse is not None:
        others, complete = fdindex.ends(index, "socket:[%d]" % reverse, (0, 1, 2), "peer", pid)
        if others:
            out["others"], out["complete"] = others, complete
            return
    listener = tables.listener(peer)
    if listener is None:
        out["notes"] = ["the peer %s is on this node but no socket of this namespace listens on it or holds the "
                        "connection's other end (another namespace, or closed)" % peer]
        out["complete"] = False
        return
    others, complete = fdindex.ends(index, "socket:[%d]" % listener, (0, 1, 2), "listener", pid)
    out["others"], out["complete"] = others, complete
    if state == "ESTABLISHED":  # its other end has no inode yet, or none of ours holds it: not accepted
        out["notes"] = ["the connection waits in the listener's accept queue: the listener has not accepted it"]


def _diag(inode: int, show: int) -> Optional[Tuple[int, int, Dict[int, bytes]]]:
    """One unix socket by inode from sock_diag: (type, state, {attribute: value}); None when refused (not found,
    unix_diag not loaded, netlink not allowed)."""
    req = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, inode & 0xFFFFFFFF, show,
                      0xFFFFFFFF, 0xFFFFFFFF)  # no cookie: looked up by inode
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4) as nl:
            nl.settimeout(1.0)
            nl.send(struct.pack("=IHHII", 16 + len(req), 20, 1, 1, 0) + req)
            data = nl.recv(1 << 16)
    except OSError:
        return None
    if len(data) < 32:
        return None
    length, kind = struct.unpack_from("=IH", data, 0)
    _family, stype, state, _pad, ino = struct.unpack_from("=BBBBI", data, 16)
    if kind != 20 or ino != inode & 0xFFFFFFFF:
        return None  # NLMSG_ERROR
    return stype, state, _attrs(data, 32, min(length, len(data)))


def _unix_diag(inode: int) -> Optional[Dict[str, Any]]:
    """The unix socket's name, state, type and queues, its peer's inode and name (sock_diag)."""
    got = _diag(inode, 1 | 4 | 0x10)  # UDIAG_SHOW_NAME | UDIAG_SHOW_PEER | UDIAG_SHOW_RQLEN
    if got is None:
        return None
    _type, state, attrs = got
    out = {"proto": "unix", "state": _UNIX_STATES.get(state, str(state))}  # type: Dict[str, Any]
    if 0 in attrs:  # UNIX_DIAG_NAME
        out["local"] = _unix_name(attrs[0])
    if len(attrs.get(4, b"")) >= 8:  # UNIX_DIAG_RQLEN
        out["recv_q"], out["send_q"] = struct.unpack_from("=II", attrs[4])
    if len(attrs.get(2, b"")) >= 4:  # UNIX_DIAG_PEER
        peer = out["peer_inode"] = struct.unpack_from("=I", attrs[2])[0]
        named = _diag(peer, 1)
        if named is not None and 0 in named[2]:
            out["peer"] = _unix_name(named[2][0])
    return out


MAX_DUMP_BYTES = 8 << 20  # the listening unix sockets of a namespace: a few KB; more is not read


def _unix_listener_of(inode: int) -> Optional[Tuple[int, str]]:
    """(inode, name) of the listening unix socket whose accept queue holds the connection from socket `inode`
    (sock_diag's dump of the listeners with their pending connections, UNIX_DIAG_ICONS: the inode of each
    connecting socket); None when no listener has it, or the dump is refused."""
    req = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 1 << 10, 0, 1 | 8,  # LISTEN; SHOW_NAME | SHOW_ICONS
                      0xFFFFFFFF, 0xFFFFFFFF)
    want = struct.pack("=I", inode & 0xFFFFFFFF)
    read = 0
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4) as nl:
            nl.settimeout(1.0)
            nl.send(struct.pack("=IHHII", 16 + len(req), 20, 0x301, 1, 0) + req)  # REQUEST | DUMP
            while read < MAX_DUMP_BYTES:
                data = nl.recv(1 << 16)
                if not data:
                    return None
                read += len(data)
                off = 0
                while off + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, off)
                    if length < 16 or kind in (2, 3):  # NLMSG_ERROR, NLMSG_DONE
                        return None
                    if kind == 20 and length >= 32:
                        ino = struct.unpack_from("=I", data, off + 20)[0]
                        attrs = _attrs(data, off + 32, min(off + length, len(data)))
                        icons = attrs.get(3, b"")  # UNIX_DIAG_ICONS: u32 inodes
                        if any(icons[i:i + 4] == want for i in range(0, len(icons) - 3, 4)):
                            return ino, _unix_name(attrs[0]) if 0 in attrs else ""
                    off += (length + 3) & ~3
    except OSError:
        return None
    return None


def _attrs(data: bytes, off: int, end: int) -> Dict[int, bytes]:
    """A netlink message's attributes from off to end: {type: value}."""
    attrs = {}  # type: Dict[int, bytes]
    while off + 4 <= end:
        alen, akind = struct.unpack_from("=HH", data, off)
        if alen < 4:
            break
        attrs[akind] = data[off + 4:off + alen]
        off += (alen + 3) & ~3
    return attrs


def _unix_name(raw: bytes) -> str:
    """A bound name: a path, or "@name" for an abstract one (leading NUL)."""
    if raw.startswith(b"\0"):
        return "@" + raw[1:].decode("utf-8", "replace")[:200]
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")[:300]


def _unix_proc(pid: int, inode: int) -> Optional[Dict[str, Any]]:
    """The socket's line of /proc/PID/net/unix (its namespace's): path and state, no peer."""
    try:
        text = procinfo.read_file("/proc/%d/net/unix" % pid, MAX_UNIX_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    want = str(inode)
    for line in text.splitlines()[1:]:
        f = line.split(None, 7)
        if len(f) >= 7 and f[6] == want:
            out = {"proto": "unix", "state": _UNIX_PROC_STATES.get(f[5], f[5]),
                   "notes": ["its peer is not named: sock_diag is read in the worker's own network namespace only"]}
            if len(f) == 8:
                out["local"] = f[7][:300]
            return out
    return None
