"""The NCCL_DEBUG=INFO parser on real NCCL output (tests/data/nccl/, sources cited in each file).

Which network, interface and address NCCL chose on each host, the transports it connected with, and its
WARNs. No GPU was lent to this project: these lines come from public bug reports and the source guide.
"""

from __future__ import annotations

from pathlib import Path

from app.gpu import nccl

DATA = Path(__file__).parent.parent / "data" / "nccl"


def parse_file(name: str, node: str | None = None) -> dict:
    return {n.host: n for n in nccl.parse((DATA / name).read_text().splitlines(), node=node)}


def test_socket_network_on_two_nodes_names_each_nodes_interface_and_address() -> None:
    hosts = parse_file("socket_gcp_two_nodes.log")
    a, b = hosts["slurm-train-compute-0-0"], hosts["slurm-train-compute-0-1"]
    assert (a.network, b.network) == ("Socket", "Socket")
    assert [(d.name, d.address) for d in a.socket_devices] == [("eth0", "10.0.0.34")]
    assert [(d.name, d.address) for d in b.socket_devices] == [("eth0", "10.0.0.33")]
    assert a.no_ib and b.no_ib  # "NET/IB : No device found." -- why NCCL fell back to sockets
    assert a.version == "2.7.8+cuda10.2"  # NCCL < 2.9 prints its version without a prefix
    assert a.summary == "NET/Socket eth0:10.0.0.34"


def test_infiniband_devices_roce_and_the_out_of_band_interface() -> None:
    node = parse_file("ib_roce_nvml_warn.log")["gcn6"]
    assert node.network == "IB"
    assert [(d.name, d.address, d.kind) for d in node.ib_devices] == [
        ("mlx5_0", "1", "IB"), ("mlx5_1", "1", "IB"), ("mlx5_2", "1", "RoCE")]  # "[RO]" is a flag, not a device
    assert node.oob == "eno1np0:172.18.62.6"
    assert [(d.name, d.address) for d in node.bootstrap] == [("eno1np0", "172.18.62.6")]
    assert node.summary == "NET/IB mlx5_0:1/IB mlx5_1:1/IB mlx5_2:1/RoCE (OOB eno1np0:172.18.62.6)"
    assert [(w.source, w.message) for w in node.warnings] == [
        ("misc/nvmlwrap.cc:181", "nvmlDeviceGetHandleByPciBusId() failed: Not Found")] * 2


def test_the_source_guides_ib_completion_error_is_a_warning_with_its_source_line() -> None:
    hosts = parse_file("guide_ib_completion_error.log")
    node2 = hosts["node-2"]
    assert [(d.name, d.kind) for d in node2.ib_devices] == [("ibP111p0s0", "IB"), ("rdmaP1111p0s2", "RoCE")]
    assert len(node2.warnings) == 1
    assert node2.warnings[0].source == "transport/net_ib.cc:1296"
    assert node2.warnings[0].message.startswith("NET/IB : Got completion from peer")
    assert hosts["DeepWhite"].summary == "NET/Socket enp67s0:192.168.50.21"


def test_transports_from_channel_lines_behind_an_mpirun_prefix() -> None:
    hosts = parse_file("socket_mpi_prefix_shm.log")
    assert hosts["node0"].transports == ("NET/Socket", "SHM")  # the GPUs inside node0 talk over shared memory
    assert hosts["node2"].transports == ("NET/Socket",)


def test_connection_closed_by_peer_warnings() -> None:
    node = parse_file("socket_closed_by_peer.log")["gpu004"]
    assert [w.source for w in node.warnings] == ["misc/socket.cc:49", "proxy.cc:1143"]
    assert "Connection closed by remote peer" in node.warnings[0].message
    assert node.warnings[0].pid == 2200689


def test_environment_settings_and_completed_communicators() -> None:
    hosts = parse_file("bond0_env_init_complete.log")
    node = hosts["hostname-test"]
    assert dict(node.env) == {"NCCL_SOCKET_IFNAME": "bond0"}
    assert [(d.name, d.address) for d in node.bootstrap] == [("bond0", "172.36.134.184")]  # no [index] form
    assert node.init_complete == (34, 36)
    assert hosts["swat1-04"].init_complete == (6,)  # "ncclCommInitRank comm ..." in newer NCCL


def test_ipv6_addresses_old_ring_lines_and_roce_with_spaced_oob() -> None:
    hosts = parse_file("ipv6_and_old_ring.log")
    v6 = next(n for h, n in hosts.items() if h.startswith("NvYt-"))
    assert [(d.name, d.address) for d in v6.socket_devices] == [
        ("ip6tnl0", "fe80::e866:19ff:fe1e:a688%ip6tnl0"), ("veth0", "2a02:6b8:fc1d:3606:0:4457:edef:600a")]
    assert dict(v6.env) == {"NCCL_IB_DISABLE": "1"} and v6.version == "2.5.6+cuda10.0"
    assert hosts["ip-172-31-12-210"].transports == ("NET/Socket",)
    roce = hosts["gpu-dev006"]
    assert [(d.name, d.kind) for d in roce.ib_devices] == [("mlx4_0", "RoCE")] and roce.oob == "enp7s0:10.10.112.56"


def test_lines_from_a_known_node_group_under_that_node_whatever_hostname_nccl_prints() -> None:
    lines = (DATA / "socket_gcp_two_nodes.log").read_text().splitlines()
    (node,) = nccl.parse(lines, node="node07")
    assert node.host == "node07" and node.network == "Socket"


def test_hostile_lines_are_skipped_not_interpreted() -> None:
    lines = ["\x1b]0;pwned\x07 NCCL INFO NET/Socket : Using [0]eth0:1.2.3.4<0>", "NCCL" * 10000,
             "h:1:2 [0] NCCL INFO NET/Socket : Using [0]\x1b[31meth0:10.0.0.1<0>", ""]
    (node,) = nccl.parse(lines)
    assert node.host == "h" and node.socket_devices[0].address == "10.0.0.1"
    assert node.socket_devices[0].name == "\x1b[31meth0"  # kept literally: the table makes it printable
