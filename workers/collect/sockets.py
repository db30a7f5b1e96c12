"""A rank's TCP connections, for telling a network stall from a software hang: /proc/PID/fd socket inodes
joined with the namespace's TCP sockets and their details (backoff, retransmissions, last send/receive).

In the worker's own network namespace the sockets come from one sock_diag netlink dump (what `ss -tin`
reads), ~0.5 ms; elsewhere, or where netlink is refused, from /proc/PID/net/tcp{,6} (~3 ms each: the read
walks the kernel's whole TCP hash) joined with `ss -tin` run in that namespace.
"""

from __future__ import annotations

import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Tuple

from workers import procinfo
from workers.lazyre import lazy

TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
              7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV"}
_SS_INFO = lazy(r"\b(backoff|lastsnd|lastrcv|lastack|bytes_acked|bytes_received):(\d+)")
_SS_RETRANS = lazy(r"\bretrans:(\d+)/(\d+)")


def socket_inodes(pid: int) -> List[int]:
    out: List[int] = []
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return out
    for name in names:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, name))
        except OSError:
            continue
        if link.startswith("socket:["):
            out.append(int(link[8:-1]))
    return out


def _ip(raw: bytes) -> Any:
    import ipaddress  # the /proc/net/tcp and ss paths only

    return ipaddress.ip_address(raw)


def _hex_addr(text: str) -> str:
    """/proc/net/tcp's "0100007F:1F90" (host-order 32-bit words) as "127.0.0.1:8080"."""
    addr, _, port = text.partition(":")
    raw = bytes.fromhex(addr)
    # each 32-bit word is stored in host (little-endian on x86_64 and aarch64) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return join(_ip(raw), int(port, 16))


def join(ip: Any, port: int) -> str:
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ("[%s]:%d" if ip.version == 6 else "%s:%d") % (ip, port)


def normalise(endpoint: str) -> str:
    """ss's "[::ffff:10.0.0.1]:29500" / "10.0.0.1:29500" / "[::1]:80" in the form _hex_addr gives."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]").split("%", 1)[0]
    try:
        import ipaddress

        return join(ipaddress.ip_address(host), int(port))
    except ValueError:
        return endpoint


def _socket_row(local: str, peer: str, state: str, send_q: int, recv_q: int, retransmits: int
                ) -> Dict[str, Any]:
    """A TcpSocket dict; the `ss -ti` details (backoff, retransmission total, last send/receive/ack) are
    filled in where they are known."""
    return {"local": local, "peer": peer, "state": state, "send_q": send_q, "recv_q": recv_q,
            "retransmits": retransmits, "backoff": 0, "total_retrans": None,
            "last_send_ms": None, "last_recv_ms": None, "last_ack_ms": None,
            "bytes_acked": None, "bytes_received": None}


def parse_proc_tcp(text: str) -> Dict[int, Dict[str, Any]]:
    """Rows of /proc/net/tcp or tcp6 by socket inode, as TcpSocket dicts."""
    rows: Dict[int, Dict[str, Any]] = {}
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        try:
            tx, rx = (int(x, 16) for x in f[4].split(":"))
            rows[int(f[9])] = _socket_row(_hex_addr(f[1]), _hex_addr(f[2]), TCP_STATES.get(int(f[3], 16), f[3]),
                                          tx, rx, int(f[6], 16))
        except ValueError:
            continue
    return rows


def parse_ss(text: str) -> Dict[Tuple[str, str], Dict[str, int]]:
    """`ss -tinH` output: per (local, peer) the -i details hangscope uses."""
    out: Dict[Tuple[str, str], Dict[str, int]] = {}
    key: Optional[Tuple[str, str]] = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            f = line.split()
            key = (normalise(f[3]), normalise(f[4])) if len(f) >= 5 else None
            continue
        if key is None:
            continue
        info = out.setdefault(key, {})
        for name, value in _SS_INFO.findall(line):
            info[name] = int(value)
        m = _SS_RETRANS.search(line)
        if m:
            info["retrans"] = int(m.group(2))
    return out


def tcp_table(pid: int) -> Dict[int, Dict[str, Any]]:
    """Every TCP socket of pid's network namespace by inode (/proc/PID/net/tcp and tcp6).

    Reading these files walks the kernel's whole TCP hash table, ~3 ms of system time each on a node with
    much memory whatever the namespace holds: read them once per namespace, not once per rank."""
    rows: Dict[int, Dict[str, Any]] = {}
    for name in ("tcp", "tcp6"):
        try:
            rows.update(parse_proc_tcp(procinfo.read_file("/proc/%d/net/%s" % (pid, name), 16 << 20)
                                       .decode("ascii", "replace")))
        except OSError:
            continue
    return rows


def for_pid(pid: int, ss: Optional[Dict[Tuple[str, str], Dict[str, int]]] = None,
            table: Optional[Dict[int, Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """The TCP sockets pid holds (empty when its fds are not readable). table: tcp_table() of a process in
    pid's network namespace, when the caller has it already."""
    inodes = socket_inodes(pid)
    if not inodes:
        return []
    rows = tcp_table(pid) if table is None else table
    out = []
    for inode in inodes:
        row = rows.get(inode)
        if row is None:
            continue  # a unix or UDP socket
        row = dict(row)  # the table may be shared by several ranks
        extra = (ss or {}).get((row["local"], row["peer"]))
        if extra:
            row["backoff"] = extra.get("backoff", 0)
            row["total_retrans"] = extra.get("retrans")
            row["last_send_ms"], row["last_recv_ms"] = extra.get("lastsnd"), extra.get("lastrcv")
            row["last_ack_ms"] = extra.get("lastack")
            row["bytes_acked"], row["bytes_received"] = extra.get("bytes_acked"), extra.get("bytes_received")
        out.append(row)
    out.sort(key=lambda r: (r["state"] != "ESTABLISHED", r["local"], r["peer"]))
    return out


# sock_diag (linux/inet_diag.h, linux/tcp.h): one dump of every TCP socket of this network namespace.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_INET_DIAG_INFO = 2
_NLMSG = struct.Struct("=IHHII")
_DIAG_MSG = struct.Struct("=BBBB2s2s16s16sIQIIIII")  # inet_diag_msg: 72 bytes
_RTA = struct.Struct("=HH")
# struct tcp_info: backoff (u8 at 4); retrans, total_retrans and the last_* times (u32)
_TCPI_BACKOFF = 4
_TCPI = struct.Struct("=36xI4xI4xII40xI")  # retrans @36, last_data_sent @44, last_data_recv @52,
_TCPI_SIZE = 104                            # last_ack_recv @56, total_retrans @100
# bytes sent and acknowledged, bytes received (u64, Linux >= 4.1/4.2): what tells a socket that moves data
_TCPI_BYTES = struct.Struct("=QQ")  # tcpi_bytes_acked @120, tcpi_bytes_received @128
_TCPI_BYTES_AT = 120
# ss -t without -a leaves these out, so they never got -i details; kept the same here.
_SS_HIDDEN = {6, 7, 10, 12}  # TIME_WAIT, CLOSE, LISTEN, NEW_SYN_RECV (SYN_RECV minisocks)


def _ntop(family: int, raw: bytes, port: bytes) -> str:
    import socket

    p = int.from_bytes(port, "big")
    if family == socket.AF_INET:
        return "%s:%d" % (socket.inet_ntop(socket.AF_INET, raw[:4]), p)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":  # v4-mapped, written as IPv4 like the /proc path does
        return "%s:%d" % (socket.inet_ntop(socket.AF_INET, raw[12:16]), p)
    return "[%s]:%d" % (socket.inet_ntop(socket.AF_INET6, raw), p)


def _diag_rows(family: int) -> Dict[int, Dict[str, Any]]:
    import socket

    req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), 0, 0xFFFFFFFF) + \
        bytes(48)  # inet_diag_req_v2 with a zero socket id: every socket in every state
    rows: Dict[int, Dict[str, Any]] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(2.0)
        nl.send(_NLMSG.pack(_NLMSG.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
                + req)
        while True:
            data = nl.recv(1 << 17)
            if not data:
                return rows
            off = 0
            while off + _NLMSG.size <= len(data):
                length, kind = _NLMSG.unpack_from(data, off)[:2]
                if length < _NLMSG.size:
                    return rows
                if kind == _NLMSG_DONE:
                    return rows
                if kind == _NLMSG_ERROR:
                    errno = -struct.unpack_from("=i", data, off + _NLMSG.size)[0]
                    raise OSError(errno, "sock_diag dump failed: %s" % os.strerror(errno))
                _row(data, off + _NLMSG.size, off + length, rows)
                off += (length + 3) & ~3


def _row(data: bytes, start: int, end: int, rows: Dict[int, Dict[str, Any]]) -> None:
    (family, state, _timer, retrans, sport, dport, src, dst, _if, _cookie, _expires, rqueue, wqueue, _uid,
     inode) = _DIAG_MSG.unpack_from(data, start)
    # for a listener the diag queue is its backlog limit; /proc/net/tcp shows write_seq - snd_una: 0
    row = _socket_row(_ntop(family, src, sport), _ntop(family, dst, dport), TCP_STATES.get(state, "%02X" % state),
                      0 if state == 10 else wqueue, rqueue, retrans)
    off = start + _DIAG_MSG.size
    while off + _RTA.size <= end and state not in _SS_HIDDEN:
        length, kind = _RTA.unpack_from(data, off)
        if length < _RTA.size:
            break
        if kind == _INET_DIAG_INFO and length - _RTA.size >= _TCPI_SIZE:
            info = off + _RTA.size
            tretrans, lastsnd, lastrcv, lastack, total = _TCPI.unpack_from(data, info)
            # as `ss -ti` shows them: a zero time or retransmission count is left out
            row["backoff"] = data[info + _TCPI_BACKOFF]
            row["total_retrans"] = total if (tretrans or total) else None
            row["last_send_ms"], row["last_recv_ms"] = lastsnd or None, lastrcv or None
            row["last_ack_ms"] = lastack or None
            if length - _RTA.size >= _TCPI_BYTES_AT + _TCPI_BYTES.size:
                row["bytes_acked"], row["bytes_received"] = _TCPI_BYTES.unpack_from(data, info + _TCPI_BYTES_AT)
        off += (length + 3) & ~3
    if inode:
        rows[inode] = row


def netlink_table() -> Optional[Dict[int, Dict[str, Any]]]:
    """Every TCP socket of this process's network namespace by inode, with the `ss -ti` details, from one
    sock_diag dump per address family; None where netlink is not allowed (then: tcp_table and ss)."""
    import socket

    rows: Dict[int, Dict[str, Any]] = {}
    try:
        for family in (socket.AF_INET, socket.AF_INET6):
            rows.update(_diag_rows(family))
    except (OSError, struct.error):
        return None
    return rows
