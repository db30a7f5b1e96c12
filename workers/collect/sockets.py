"""A rank's TCP connections, for telling a network stall from a software hang: /proc/PID/fd socket inodes
joined with /proc/PID/net/tcp{,6}, enriched with `ss -tin` (backoff, retransmissions, last send/receive)."""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from workers import procinfo

TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
              7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV"}
_SS_INFO = re.compile(r"\b(backoff|lastsnd|lastrcv|lastack):(\d+)")
_SS_RETRANS = re.compile(r"\bretrans:(\d+)/(\d+)")


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


def _hex_addr(text: str) -> str:
    """/proc/net/tcp's "0100007F:1F90" (host-order 32-bit words) as "127.0.0.1:8080"."""
    addr, _, port = text.partition(":")
    raw = bytes.fromhex(addr)
    # each 32-bit word is stored in host (little-endian on x86_64 and aarch64) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return join(ipaddress.ip_address(raw), int(port, 16))


def join(ip: Any, port: int) -> str:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ("[%s]:%d" if ip.version == 6 else "%s:%d") % (ip, port)


def normalise(endpoint: str) -> str:
    """ss's "[::ffff:10.0.0.1]:29500" / "10.0.0.1:29500" / "[::1]:80" in the form _hex_addr gives."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]").split("%", 1)[0]
    try:
        return join(ipaddress.ip_address(host), int(port))
    except ValueError:
        return endpoint


def parse_proc_tcp(text: str) -> Dict[int, Dict[str, Any]]:
    """Rows of /proc/net/tcp or tcp6 by socket inode, as TcpSocket dicts."""
    rows: Dict[int, Dict[str, Any]] = {}
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        try:
            tx, rx = (int(x, 16) for x in f[4].split(":"))
            rows[int(f[9])] = {"local": _hex_addr(f[1]), "peer": _hex_addr(f[2]),
                               "state": TCP_STATES.get(int(f[3], 16), f[3]), "send_q": tx, "recv_q": rx,
                               "retransmits": int(f[6], 16), "backoff": 0, "total_retrans": None,
                               "last_send_ms": None, "last_recv_ms": None, "last_ack_ms": None}
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
        out.append(row)
    out.sort(key=lambda r: (r["state"] != "ESTABLISHED", r["local"], r["peer"]))
    return out
