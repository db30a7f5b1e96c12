"""Names for the addresses ranks talk to that no inspected node has (app/analysis/peers.py says why they matter).

Resolved on the login node, in this order, within one deadline for the whole lot: the user's ssh config (a
`Host` whose `HostName` is that address: the name the user would put in the hosts list), the SLURM job's node
list from the ranks' own SLURM_JOB_NODELIST (each node's address), then reverse DNS (/etc/hosts, DNS). A lookup that does
not answer in time leaves the address unnamed; nothing here ever blocks the snapshot for longer than the
deadline. Names are cached per session: the next pass asks only about new addresses.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from app.analysis.peers import outside_peers
from app.model import Snapshot
from app.transport.files import DEFAULT_CONFIGS, usable

T = TypeVar("T")
DEADLINE_S = 2.0  # for all the lookups of one pass
MAX_LOOKUPS = 64  # addresses resolved per pass; more stay unnamed
MAX_CONFIG_BYTES = 1 << 20


def ssh_config_hosts(paths: Optional[Sequence[str]]) -> Dict[str, str]:
    """address -> the first plain `Host` alias (no wildcard) whose `HostName` is that address."""
    out: Dict[str, str] = {}
    for path in paths if paths is not None else DEFAULT_CONFIGS:
        if not usable(os.path.expanduser(path)):
            continue  # missing, or a FIFO or a device: opening it could block
        try:
            with open(os.path.expanduser(path), encoding="utf-8", errors="replace") as f:
                text = f.read(MAX_CONFIG_BYTES)
        except OSError:
            continue
        aliases: List[str] = []
        for line in text.splitlines():
            words = line.replace("=", " ", 1).split()
            if not words or words[0].startswith("#"):
                continue
            key = words[0].lower()
            if key in ("host", "match"):
                aliases = [w for w in words[1:] if key == "host" and not any(c in w for c in "*?!")]
            elif key == "hostname" and len(words) > 1 and aliases:
                out.setdefault(words[1], aliases[0])
    return out


def _reverse(address: str) -> str:
    try:
        return socket.gethostbyaddr(address)[0]
    except (OSError, UnicodeError):
        return ""


def _forward(name: str) -> List[str]:
    try:
        return sorted({str(i[4][0]) for i in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)})
    except (OSError, UnicodeError):
        return []


def slurm_nodes(snapshot: Snapshot, limit: int = 4096) -> List[str]:
    """The node names of the SLURM job(s) the ranks belong to, from their SLURM_JOB_NODELIST (expanded)."""
    from app.hosts import HostsError, parse_nodelist

    lists = sorted({v for r in snapshot.ranks for v in [r.env_value("SLURM_JOB_NODELIST")] if v})
    names: List[str] = []
    for nodelist in lists[:8]:
        try:
            names += [h.host for h in parse_nodelist(nodelist, source="SLURM_JOB_NODELIST", max_hosts=limit)]
        except HostsError:
            continue
    return list(dict.fromkeys(names))[:limit]


class PeerNamer:
    """Names outside addresses for a session (`ssh_config`: the config files the session uses)."""

    def __init__(self, ssh_config: Optional[Sequence[str]] = None) -> None:
        self._config = ssh_config
        self._known: Dict[str, Tuple[str, str]] = {}  # address -> (name, how); ("", "") when none was found
        self._slurm: Dict[str, str] = {}  # address -> node name, for the node lists resolved so far
        self._slurm_asked: set = set()

    async def name(self, snapshot: Snapshot, deadline: float = DEADLINE_S) -> Snapshot:
        """The snapshot with peer_names for its outside addresses (those named already, and new ones)."""
        addresses = [p.address for p in outside_peers(snapshot)]
        if not addresses:
            return snapshot
        new = [a for a in addresses if a not in self._known][:MAX_LOOKUPS]
        if new:
            try:
                await asyncio.wait_for(self._resolve(new, slurm_nodes(snapshot)), deadline)
            except asyncio.TimeoutError:
                pass  # the ones that answered are kept; the rest stay unnamed this pass
        names = tuple((a, *self._known[a]) for a in addresses if self._known.get(a, ("", ""))[0])
        return snapshot if names == snapshot.peer_names else _with(snapshot, names)

    async def _resolve(self, addresses: List[str], nodes: List[str]) -> None:
        config = await _in_thread(ssh_config_hosts, self._config)
        for a in addresses:
            if a in config:
                self._known[a] = (config[a], "ssh config")
        ask = [n for n in nodes if n not in self._slurm_asked][:256]
        if ask and any(a not in self._known for a in addresses):
            found = await asyncio.gather(*(_in_thread(_forward, n) for n in ask))
            self._slurm_asked.update(ask)
            for n, addrs in zip(ask, found):
                for addr in addrs:
                    self._slurm.setdefault(addr, n)
        if self._slurm:
            for a in addresses:
                if a not in self._known and a in self._slurm:
                    self._known[a] = (self._slurm[a], "SLURM job's node list")
        rest = [a for a in addresses if a not in self._known]
        names = await asyncio.gather(*(_in_thread(_reverse, a) for a in rest))
        for a, n in zip(rest, names):
            self._known[a] = (n, "reverse DNS") if n else ("", "")


def _in_thread(fn: Callable[..., T], *args: Any) -> "asyncio.Future[T]":
    """fn(*args) in a daemon thread: a resolver that never answers must not hold up hangscope's exit, as a
    thread of the loop's default executor would (the loop waits for those when it closes)."""
    loop = asyncio.get_running_loop()
    future: "asyncio.Future[T]" = loop.create_future()

    def settle(result: Any, error: Optional[BaseException]) -> None:
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except Exception as exc:
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop closed meanwhile: nobody waits for this answer any more

    threading.Thread(target=run, name="hangscope-resolve", daemon=True).start()
    return future


def _with(snapshot: Snapshot, names: Tuple[Tuple[str, str, str], ...]) -> Snapshot:
    import dataclasses
    return dataclasses.replace(snapshot, peer_names=names)
