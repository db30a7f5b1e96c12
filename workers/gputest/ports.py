"""Free TCP ports on this node for a test's rendezvous store, checked by binding them as the store will."""

from __future__ import annotations

import random
import socket
from typing import Iterable, List


def _bindable(port: int) -> bool:
    """The store's server binds every address with SO_REUSEADDR: a listener anywhere on the port refuses it."""
    families = [socket.AF_INET] + ([socket.AF_INET6] if socket.has_ipv6 else [])
    for family in families:
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
            s.listen(1)
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno in (97, 99):  # EAFNOSUPPORT, EADDRNOTAVAIL: no IPv6
                continue
            return False
        finally:
            s.close()
    return True


def free_ports(count: int, exclude: Iterable[int], low: int, high: int) -> List[int]:
    """Up to `count` ports in [low, high] that nothing listens on and that are not excluded (tests still
    running keep theirs); a random start, so two login nodes asking at once rarely pick the same."""
    skip = set(exclude)
    candidates = [p for p in range(low, high + 1) if p not in skip]
    random.shuffle(candidates)
    found: List[int] = []
    for port in candidates:
        if len(found) >= count:
            break
        if _bindable(port):
            found.append(port)
    return found
