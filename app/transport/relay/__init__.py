"""Relays: the login side reaches groups of SSH nodes through one relay per group (ClusterShell's gateway
model, over the nodes' own ssh). transport.py opens workers (RelayTransport), framing.py is the wire,
stage.py the node side (shipped as source, not imported there)."""

from app.transport.relay.transport import RelayOptions, RelayTransport

__all__ = ["RelayOptions", "RelayTransport"]
