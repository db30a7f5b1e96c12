"""This node's network as NCCL and gloo see it; stdlib, psutil when importable.

Interfaces and addresses, InfiniBand ports, the address the hostname resolves to, and whether given
address:port pairs can be reached from here.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import threading
import time
from typing import Any, Dict, List, Optional

_SYS_NET = "/sys/class/net"
_SYS_IB = "/sys/class/infiniband"
_ARPHRD = {"1": "ethernet", "32": "infiniband", "772": "loopback", "65534": "tunnel", "776": "tunnel"}


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _ipv4_fallback(name: str) -> List[Dict[str, Any]]:
    """SIOCGIFADDR / SIOCGIFNETMASK: the primary IPv4 address of an interface, without psutil."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("256s", name.encode()[:15])
        addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])
        mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x891B, req)[20:24])
    except OSError:
        return []
    finally:
        s.close()
    return [{"family": "ipv4", "address": addr, "netmask": mask}]


def _ipv6_fallback() -> Dict[str, List[Dict[str, Any]]]:
    out: Dict[str, List[Dict[str, Any]]] = {}
    text = _read("/proc/net/if_inet6") or ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 6:
            continue
        raw = parts[0]
        addr = ":".join(raw[i:i + 4] for i in range(0, 32, 4))
        try:
            addr = socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, addr))
        except (OSError, ValueError):
            continue
        out.setdefault(parts[5], []).append({"family": "ipv6", "address": addr, "prefix": int(parts[2], 16)})
    return out


def interfaces() -> List[Dict[str, Any]]:
    """Every interface in ifindex order (the order NCCL and gloo walk them), with its addresses."""
    names = sorted(os.listdir(_SYS_NET)) if os.path.isdir(_SYS_NET) else [n for _, n in socket.if_nameindex()]
    addrs: Dict[str, List[Dict[str, Any]]] = {}
    source = "procfs"
    try:
        import psutil

        source = "psutil"
        for name, entries in psutil.net_if_addrs().items():
            for e in entries:
                if e.family == socket.AF_INET:
                    addrs.setdefault(name, []).append({"family": "ipv4", "address": e.address,
                                                        "netmask": e.netmask})
                elif e.family == socket.AF_INET6:
                    addrs.setdefault(name, []).append({"family": "ipv6", "address": e.address.split("%")[0],
                                                        "netmask": e.netmask})
    except ImportError:
        v6 = _ipv6_fallback()
        for name in names:
            addrs[name] = _ipv4_fallback(name) + v6.get(name, [])
    out = []
    for name in names:
        base = os.path.join(_SYS_NET, name)
        operstate = _read(os.path.join(base, "operstate")) or "unknown"
        try:
            flags = int(_read(os.path.join(base, "flags")) or "0x1", 16)
        except ValueError:
            flags = 1
        out.append({
            "name": name, "ifindex": _int(_read(os.path.join(base, "ifindex"))),
            # IFF_UP, and a carrier (loopback and some virtual links report "unknown")
            "up": bool(flags & 1) and operstate in ("up", "unknown"), "operstate": operstate,
            "kind": _ARPHRD.get(_read(os.path.join(base, "type")) or "", "other"),
            "mtu": _int(_read(os.path.join(base, "mtu"))),
            "speed_mbps": _int(_read(os.path.join(base, "speed"))),
            "addresses": addrs.get(name, []),
        })
    out.sort(key=lambda i: (i["ifindex"] is None, i["ifindex"] or 0, i["name"]))
    return [dict(i, source=source) for i in out]


def infiniband() -> List[Dict[str, Any]]:
    """/sys/class/infiniband/<device>/ports/<n>: state, rate and link layer (IB or Ethernet for RoCE)."""
    out: List[Dict[str, Any]] = []
    if not os.path.isdir(_SYS_IB):
        return out
    for dev in sorted(os.listdir(_SYS_IB)):
        ports = os.path.join(_SYS_IB, dev, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            base = os.path.join(ports, port)
            out.append({"device": dev, "port": _int(port), "state": _read(os.path.join(base, "state")) or "",
                        "phys_state": _read(os.path.join(base, "phys_state")) or "",
                        "rate": _read(os.path.join(base, "rate")) or "",
                        "link_layer": _read(os.path.join(base, "link_layer")) or ""})
    return out


def hostname_addresses() -> Dict[str, Any]:
    """gloo binds to the address its hostname resolves to: a loopback answer breaks multi-node gloo."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
        return {"hostname": name, "addresses": sorted({i[4][0] for i in infos}), "error": ""}
    except OSError as exc:
        return {"hostname": name, "addresses": [], "error": str(exc)}


def check_port(host: str, port: int, timeout: float) -> Dict[str, Any]:
    """TCP connect: open, closed (refused: the host answered), filtered (no answer), unreachable, unresolvable."""
    started = time.monotonic()
    result: Dict[str, Any] = {"host": host, "port": port, "address": "", "state": "error", "error": ""}
    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except OSError as exc:
        result.update(state="unresolvable", error=str(exc))
        return result
    family, _, _, _, sockaddr = infos[0]
    result["address"] = sockaddr[0]
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sockaddr)
        result["state"] = "open"
    except socket.timeout:
        result.update(state="filtered", error="no answer within %gs" % timeout)
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:
            result["state"] = "closed"
        elif exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN, errno.EPERM):
            result.update(state="unreachable", error=os.strerror(exc.errno))
        else:
            result.update(state="error", error=str(exc))
    finally:
        s.close()
    result["ms"] = round((time.monotonic() - started) * 1000, 1)
    return result


def check_ports(targets: List[Dict[str, Any]], timeout: float) -> List[Dict[str, Any]]:
    """All targets at once (one thread each, bounded by the caller's target count)."""
    results: List[Optional[Dict[str, Any]]] = [None] * len(targets)

    def one(i: int, t: Dict[str, Any]) -> None:
        results[i] = check_port(str(t["host"]), int(t["port"]), timeout)

    threads = [threading.Thread(target=one, args=(i, t), daemon=True) for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5.0)
    return [r if r is not None else {"host": t["host"], "port": t["port"], "state": "error", "error": "no result"}
            for r, t in zip(results, targets)]


def probe(targets: List[Dict[str, Any]], timeout: float) -> Dict[str, Any]:
    nccl_env = {k: v for k, v in os.environ.items() if k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                                                              "NCCL_IB_HCA", "NCCL_IB_DISABLE")}
    return {"interfaces": interfaces(), "infiniband": infiniband(), "hostname": hostname_addresses(),
            "checks": check_ports(targets, timeout), "env": nccl_env}
