"""Parse NCCL_DEBUG=INFO output: which network, interfaces and transports NCCL chose per host, and its WARNs.

Pure: lines in, NcclNode records out. Lines are remote text; anything that does not look like an NCCL line is
skipped. Accepts NCCL's own prefix `host:pid:tid [dev]` with or without a launcher's prefix in front
(`[0] ` from mpirun, `[host:0]:` from torchrun --tee), and the formats of NCCL 2.4 through 2.2x.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

from app.gpu.model import NcclNetDevice, NcclNode, NcclWarning

_LINE = re.compile(
    r"^(?:\[[^\]\s]*\]:?\s*)?(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>[^\]]*)\] "
    r"(?:(?P<src>\S+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE|ABORT)\s?(?P<msg>.*)$")
_VERSION = re.compile(r"^(?:\[[^\]\s]*\]:?\s*)?NCCL version (\S+)")
_NET = re.compile(r"^NET/(?P<net>Socket|IB)\s*:\s*Using\s+(?P<rest>.*)$")
_BOOTSTRAP = re.compile(r"^Bootstrap\s*:\s*Using\s+(?P<rest>.*)$")
_TOKEN = re.compile(r"^(?:\[(\d+)\])?([^\s<]+?)(?:<\d+>)?$")
_ENV = re.compile(r"^(\w+) set by environment to (.*?)\.?$")
_VIA = re.compile(r"\bvia (\S+)")
_COMPLETE = re.compile(r"\brank (\d+) nranks \d+ .*Init COMPLETE")


@dataclass
class _Acc:
    host: str
    version: str = ""
    network: str = ""
    socket: list[NcclNetDevice] = field(default_factory=list)
    ib: list[NcclNetDevice] = field(default_factory=list)
    oob: str = ""
    bootstrap: list[NcclNetDevice] = field(default_factory=list)
    transports: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    complete: set[int] = field(default_factory=set)
    no_ib: bool = False
    warnings: list[NcclWarning] = field(default_factory=list)

    def freeze(self) -> NcclNode:
        return NcclNode(host=self.host, version=self.version, network=self.network,
                        socket_devices=tuple(self.socket), ib_devices=tuple(self.ib), oob=self.oob,
                        bootstrap=tuple(self.bootstrap), transports=tuple(self.transports),
                        env=tuple(sorted(self.env.items())), init_complete=tuple(sorted(self.complete)),
                        no_ib=self.no_ib, warnings=tuple(self.warnings))


def _devices(text: str, ib: bool) -> list[NcclNetDevice]:
    """`[0]eth0:10.0.0.34<0> [1]...` (socket) or `[0]mlx5_0:1/IB [1]mlx5_2:1/RoCE [RO]` (IB)."""
    out = []
    for position, word in enumerate(text.split()):
        m = _TOKEN.match(word)
        if not m or word == "[RO]":  # [RO]: relaxed ordering, a flag, not a device
            continue
        name, _, address = m.group(2).partition(":")
        kind = ""
        if ib:
            address, _, kind = address.partition("/")
        index = int(m.group(1)) if m.group(1) is not None else position
        out.append(NcclNetDevice(index=index, name=name, address=address, kind=kind))
    return out


def _transport(via: str) -> str:
    """NET/Socket/0 -> NET/Socket, NET/IB/0/GDRDMA -> NET/IB, P2P/IPC/read -> P2P/IPC, SHM/direct -> SHM."""
    parts = via.split("/")
    return "/".join(parts[:2]) if parts[0] in ("NET", "P2P", "CollNet") and len(parts) > 1 else parts[0]


def _apply(acc: _Acc, msg: str, level: str, src: str, pid: int) -> None:
    if level == "WARN":
        acc.warnings.append(NcclWarning(host=acc.host, pid=pid, source=src, message=msg.strip()))
        return
    if msg.startswith("NCCL version "):
        acc.version = msg.split()[2]
        return
    m = _NET.match(msg)
    if m:
        if m.group("net") == "IB":
            devices, _, oob = m.group("rest").partition("OOB")
            acc.ib = _devices(devices.replace(";", " "), ib=True)
            acc.oob = re.sub(r"<\d+>$", "", oob.strip())
        else:
            acc.socket = _devices(m.group("rest"), ib=False)
        return
    if re.match(r"^NET/IB\s*:\s*No device found", msg):
        acc.no_ib = True
        return
    m = _BOOTSTRAP.match(msg)
    if m:
        acc.bootstrap = _devices(m.group("rest"), ib=False)
        return
    if msg.startswith("Using network "):
        acc.network = msg[len("Using network "):].strip()
        return
    m = _ENV.match(msg)
    if m:
        acc.env[m.group(1)] = m.group(2)
        return
    m = _VIA.search(msg)
    if m:
        t = _transport(m.group(1))
        if t not in acc.transports:
            acc.transports.append(t)
        return
    m = _COMPLETE.search(msg)
    if m:
        acc.complete.add(int(m.group(1)))


def parse(lines: Iterable[str], node: Optional[str] = None) -> tuple[NcclNode, ...]:
    """NcclNode per host, in order of first appearance. With `node`, every line belongs to that node (the
    launcher knows where its lines came from) and NCCL's own hostname is not trusted for grouping."""
    accs: dict[str, _Acc] = {}
    last: Optional[_Acc] = None
    pending_version = ""
    for raw in lines:
        line = raw.rstrip("\r\n")
        if "NCCL" not in line:
            continue
        m = _LINE.match(line)
        if m is None:
            v = _VERSION.match(line)
            if v:  # printed bare by NCCL < 2.9; belongs with the lines around it
                if last is not None or node is not None:
                    target = last if last is not None else accs.setdefault(node or "", _Acc(node or ""))
                    target.version = v.group(1)
                else:
                    pending_version = v.group(1)
            continue
        key = node if node is not None else m.group("host")
        acc = accs.get(key)
        if acc is None:
            acc = accs[key] = _Acc(key)
        if pending_version and not acc.version:
            acc.version, pending_version = pending_version, ""
        last = acc
        _apply(acc, m.group("msg"), m.group("level"), m.group("src") or "", int(m.group("pid")))
    return tuple(a.freeze() for a in accs.values())
