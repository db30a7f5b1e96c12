"""Network checks from the nodes' probes, and the NCCL_SOCKET_IFNAME suggestion when nodes disagree.

Which interface NCCL would pick on each node, whether the nodes agree (and which NCCL_SOCKET_IFNAME makes
them), InfiniBand port states, hostname resolution, and which address:port each node can reach.
Pure: net_probe replies in, a NetReport out.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from typing import Any, Optional, Sequence, cast

from app.gpu.model import IbPort, NetAddress, NetInterface, NetReport, NodeNet, PortCheck, PortState

_STATES = ("open", "closed", "filtered", "unreachable", "unresolvable", "error")
_EXCLUDED = ("docker", "lo")  # NCCL's default NCCL_SOCKET_IFNAME is ^docker,lo (after trying ib*)


def _text(v: Any, limit: int = 200) -> str:
    return str(v)[:limit] if v is not None else ""


def _opt_int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _prefix(a: dict) -> Optional[int]:
    if isinstance(a.get("prefix"), int):
        return a["prefix"]
    mask = a.get("netmask")
    if isinstance(mask, str) and mask:
        try:
            return ipaddress.ip_network(f"0.0.0.0/{mask}").prefixlen if "." in mask else \
                ipaddress.ip_network(f"::/{mask}").prefixlen
        except ValueError:
            return None
    return None


def node_net(node: str, data: dict) -> NodeNet:
    """One node's probe reply as a NodeNet (remote text: truncated, typed, never interpreted)."""
    ifaces = []
    for i in data.get("interfaces") or []:
        if not isinstance(i, dict):
            continue
        addrs = tuple(NetAddress(family=_text(a.get("family"), 8), address=_text(a.get("address"), 64),
                                 prefix=_prefix(a)) for a in i.get("addresses") or [] if isinstance(a, dict))
        ifaces.append(NetInterface(name=_text(i.get("name"), 32), up=bool(i.get("up")), kind=_text(i.get("kind"), 16),
                                   mtu=_opt_int(i.get("mtu")), speed_mbps=_opt_int(i.get("speed_mbps")),
                                   addresses=addrs))
    ib = tuple(IbPort(device=_text(p.get("device"), 64), port=_opt_int(p.get("port")), state=_text(p.get("state"), 40),
                      rate=_text(p.get("rate"), 40), link_layer=_text(p.get("link_layer"), 20))
               for p in data.get("infiniband") or [] if isinstance(p, dict))
    host: dict = data["hostname"] if isinstance(data.get("hostname"), dict) else {}
    env: dict = data["env"] if isinstance(data.get("env"), dict) else {}
    return NodeNet(node=node, hostname=_text(host.get("hostname"), 255),
                   hostname_addresses=tuple(_text(a, 64) for a in host.get("addresses") or []),
                   interfaces=tuple(ifaces), infiniband=ib, nccl_pick=nccl_pick(ifaces),
                   env=tuple(sorted((_text(k, 64), _text(v)) for k, v in env.items())))


def _usable(i: NetInterface) -> bool:
    return i.up and any(a.family == "ipv4" for a in i.addresses)


def nccl_pick(ifaces: Sequence[NetInterface]) -> str:
    """NCCL's default without NCCL_SOCKET_IFNAME: an `ib*` interface first, then any but docker/lo/virbr."""
    usable = [i for i in ifaces if _usable(i)]
    for i in usable:
        if i.name.startswith("ib"):
            return i.name
    for i in usable:
        if not i.name.startswith(_EXCLUDED) and i.kind != "loopback":
            return i.name
    return ""


def network_of(n: NodeNet, name: str) -> Optional[ipaddress.IPv4Network]:
    for i in n.interfaces:
        if i.name == name:
            for a in i.addresses:
                if a.family == "ipv4" and a.prefix is not None:
                    try:
                        return ipaddress.ip_interface(f"{a.address}/{a.prefix}").network  # type: ignore[return-value]
                    except ValueError:
                        return None
    return None


def suggest(nodes: Sequence[NodeNet]) -> tuple[str, list[str]]:
    """(NCCL_SOCKET_IFNAME suggestion or "", findings) from where the nodes' default picks disagree."""
    nodes = [n for n in nodes if not n.error]
    if len(nodes) < 2:
        return "", []
    picks = {n.node: (n.nccl_pick, network_of(n, n.nccl_pick)) for n in nodes}
    if len({p for p, _ in picks.values()}) == 1 and len({net for _, net in picks.values()}) == 1:
        return "", []
    shown = ", ".join(f"{node}: {p or 'none'} ({net or 'no IPv4'})" for node, (p, net) in picks.items())
    findings = [f"NCCL would not use the same network on every node by default ({shown})"]
    common = set.intersection(*({i.name for i in n.interfaces if _usable(i) and i.kind != "loopback"}
                                for n in nodes))
    good = sorted((name for name in common if len({network_of(n, name) for n in nodes}) == 1),
                  key=lambda name: (not name.startswith("ib"), name))
    if good:
        name = good[0]
        longer = any(i.name != name and i.name.startswith(name) for n in nodes for i in n.interfaces)
        return f"NCCL_SOCKET_IFNAME={'=' if longer else ''}{name}", findings
    counts: Counter = Counter()
    for n in nodes:
        for i in n.interfaces:
            net = network_of(n, i.name) if _usable(i) and i.kind != "loopback" else None
            if net is not None:
                counts[net] += 1
    shared = [net for net, c in counts.most_common() if c >= len(nodes)]
    if shared:
        names = sorted({i.name for n in nodes for i in n.interfaces if network_of(n, i.name) == shared[0]})
        return f"NCCL_SOCKET_IFNAME={','.join(names)}", findings
    findings.append("the nodes share no IPv4 subnet: NCCL sockets need a route between every pair of nodes")
    return "", findings


def findings_for(nodes: Sequence[NodeNet], checks: Sequence[PortCheck]) -> list[str]:
    out = []
    for n in nodes:
        if n.error:
            out.append(f"{n.node}: no network probe: {n.error}")
            continue
        if n.hostname_addresses and all(a.startswith("127.") or a == "::1" for a in n.hostname_addresses):
            out.append(f"{n.node}: its hostname {n.hostname!r} resolves to {', '.join(n.hostname_addresses)} only: "
                       f"gloo would listen on loopback and other nodes cannot connect; fix /etc/hosts or set "
                       f"GLOO_SOCKET_IFNAME")
        for p in n.infiniband:
            if p.state and "ACTIVE" not in p.state.upper():
                out.append(f"{n.node}: InfiniBand {p.device} port {p.port} is {p.state} ({p.link_layer or '?'})")
    with_ib = [n.node for n in nodes if any("ACTIVE" in p.state.upper() for p in n.infiniband)]
    if with_ib and len(with_ib) < len([n for n in nodes if not n.error]):
        out.append(f"only {', '.join(with_ib)} have an active InfiniBand port: NCCL falls back to sockets "
                   f"between the others")
    for c in checks:
        if c.state != "open":
            why = {"closed": "nothing listens there (connection refused)",
                   "filtered": "no answer: a firewall drops it or the route is wrong",
                   "unreachable": "no route to the host", "unresolvable": "the name does not resolve there"}
            out.append(f"{c.node} cannot reach {c.host}:{c.port}: {c.state}: {why.get(c.state, c.error)}")
    return out


def port_checks(node: str, data: dict) -> list[PortCheck]:
    out = []
    for c in data.get("checks") or []:
        if not isinstance(c, dict) or not isinstance(c.get("port"), int):
            continue
        state = cast(PortState, c["state"] if c.get("state") in _STATES else "error")
        ms = c.get("ms")
        out.append(PortCheck(node=node, host=_text(c.get("host"), 255), port=c["port"], state=state,
                             address=_text(c.get("address"), 64),
                             ms=float(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None,
                             error=_text(c.get("error"))))
    return out


def report(replies: dict[str, Any]) -> NetReport:
    """replies: node -> net_probe done data, or an error string when the probe failed."""
    nodes, checks = [], []
    for node, data in replies.items():
        if isinstance(data, dict):
            nodes.append(node_net(node, data))
            checks += port_checks(node, data)
        else:
            nodes.append(NodeNet(node=node, error=str(data)))
    suggestion, findings = suggest(nodes)
    return NetReport(nodes=tuple(nodes), checks=tuple(checks),
                     findings=tuple(findings + findings_for(nodes, checks)), suggestion=suggestion)
