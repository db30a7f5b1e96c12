"""The SSH transport against the real test cluster (network namespaces, each with its own sshd): every
failure class a user meets is produced for real and must arrive as its own code with a useful sentence."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import asyncssh
import pytest

from app.errors import TransportError
from app.transport.login_tools import local_pyspy
from app.transport.ssh import SshOptions, SshTransport
from app.transport.sshconfig import HostConfig
from workers import protocol

import cluster as cluster_mod
from waiting import wait_until, wait_until_async

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture
def ssh_cluster(cluster):
    """The shared session cluster; each test restores whatever it breaks (iptables rules, sshd, py-spy)."""
    return cluster


def _opts(c: object, **kw: object) -> SshOptions:
    base: dict = dict(config_paths=(str(c.ssh_config),), connect_timeout=8.0,
                      start_timeout=20.0, keepalive_interval=2.0, keepalive_count_max=2)
    base.update(kw)
    return SshOptions(**base)


def _fingerprint(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], capture_output=True, text=True,
                         check=True).stdout
    return out.split()[1]


async def _open(t: SshTransport, name: str, **kw: object):
    return await t.open(name, **kw)


async def test_hello_from_every_node_with_the_users_own_ssh_config(ssh_cluster, monkeypatch) -> None:
    c = ssh_cluster
    # ~/.ssh/config (HostName, User, IdentityFile, UserKnownHostsFile) is read by default, as ssh does
    monkeypatch.setenv("HOME", str(c.home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    t = SshTransport(SshOptions(connect_timeout=5))
    workers = await asyncio.gather(*(t.open(n) for n in c.names))
    try:
        assert [w.hello["hostname"] for w in workers] == c.names
        for w in workers:
            assert (await w.call(protocol.PING({}), timeout=10))["pong"] is True
            assert {"connect", "login", "start"} <= set(w.timings)
            assert w.pid in c[w.name].pids()
    finally:
        await asyncio.gather(*(w.close() for w in workers))
    for w in workers:  # closing the channel ends the worker: nothing is left running on the node
        wait_until(lambda w=w: w.pid not in c[w.name].pids(), 10, f"worker on {w.name} to exit")


async def test_unknown_host_key_names_the_fingerprint_and_changes_nothing(ssh_cluster, tmp_path) -> None:
    c = ssh_cluster
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    before = c.known_hosts.read_bytes()
    with pytest.raises(TransportError) as err:
        await SshTransport(_opts(c, known_hosts=(str(empty),))).open("node01")
    e = err.value
    assert e.code == "host_key_unknown" and e.phase == "connect"
    assert "node01" in e.message and _fingerprint(c["node01"].dir / "ssh_host_ed25519_key.pub") in e.message
    assert empty.read_bytes() == b"" and c.known_hosts.read_bytes() == before


async def test_changed_host_key_is_a_different_error_and_is_never_accepted(ssh_cluster, tmp_path,
                                                                           monkeypatch) -> None:
    c = ssh_cluster
    monkeypatch.setenv("HOME", str(tmp_path))
    node = c["node02"]
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = tmp_path / "known_hosts"
    known.write_text(f"{node.ip} {other}\n")
    before = known.read_bytes()
    for accept in (False, True):  # --accept-new-host-keys never accepts a CHANGED key
        with pytest.raises(TransportError) as err:
            await SshTransport(_opts(c, known_hosts=(str(known),), accept_new_host_keys=accept)).open("node02")
        e = err.value
        assert e.code == "host_key_changed", e.message
        assert "CHANGED" in e.message and _fingerprint(node.dir / "ssh_host_ed25519_key.pub") in e.message
        assert known.read_bytes() == before
    assert not (tmp_path / ".ssh" / "known_hosts").exists()


async def test_accept_new_host_keys_adds_an_unknown_key_once(ssh_cluster, tmp_path, monkeypatch) -> None:
    c = ssh_cluster
    monkeypatch.setenv("HOME", str(tmp_path))
    user_known = tmp_path / ".ssh" / "known_hosts"
    opts = _opts(c, known_hosts=(str(user_known),))
    with pytest.raises(TransportError) as err:
        await SshTransport(opts).open("node03")
    assert err.value.code == "host_key_unknown"
    w = await SshTransport(_opts(c, known_hosts=(str(user_known),), accept_new_host_keys=True)).open("node03")
    await w.close()
    assert any("accepted the new host key" in x for x in w.warnings)
    lines = user_known.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(c["node03"].ip + " ssh-ed25519 ")
    w = await SshTransport(opts).open("node03")  # now known: no flag needed, nothing appended
    await w.close()
    assert user_known.read_text().splitlines() == lines


async def test_rejected_key_is_auth_failed_without_prompting(ssh_cluster, tmp_path) -> None:
    c = ssh_cluster
    stranger = tmp_path / "id_stranger"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    locked = tmp_path / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    t0 = time.monotonic()
    with pytest.raises(TransportError) as err:
        await SshTransport(_opts(c, identity=(str(stranger), str(locked)))).open("node01")
    e = err.value
    assert e.code == "auth_failed" and e.phase == "login"
    assert str(stranger) in e.message and "root" in e.message
    assert str(locked) in e.message and "encrypted" in e.message  # skipped: never a passphrase prompt
    assert time.monotonic() - t0 < 5


async def test_closed_port_is_refused_fast(ssh_cluster) -> None:
    t0 = time.monotonic()
    with pytest.raises(TransportError) as err:
        await SshTransport(_opts(ssh_cluster)).open("node01", port=2)
    assert err.value.code == "refused" and "node01" in err.value.message
    assert time.monotonic() - t0 < 3


async def test_unknown_name_is_dns(ssh_cluster) -> None:
    with pytest.raises(TransportError) as err:
        await SshTransport(_opts(ssh_cluster)).open("no-such-node.invalid")
    assert err.value.code == "dns" and "no-such-node.invalid" in err.value.message


async def test_no_python_on_the_node(ssh_cluster) -> None:
    with pytest.raises(TransportError) as err:
        await SshTransport(_opts(ssh_cluster, python="/nonexistent/python3")).open("node02")
    e = err.value
    assert e.code == "no_python" and e.phase == "start" and "/nonexistent/python3" in e.message


async def test_black_holed_node_times_out_while_the_others_complete(ssh_cluster) -> None:
    c = ssh_cluster
    node = c["node04"]
    rule = ("INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP")
    node.iptables("-A", *rule)
    try:
        t = SshTransport(_opts(c, connect_timeout=3.0))  # the healthy nodes finish long before, even under load
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        finished: dict[str, float] = {}

        async def one(name: str):
            try:
                return await t.open(name)
            finally:
                finished[name] = loop.time() - t0

        results = await asyncio.gather(*(one(n) for n in c.names), return_exceptions=True)
        try:
            err = results[c.names.index("node04")]
            assert isinstance(err, TransportError) and err.code == "connect_timeout", err
            assert err.phase == "connect" and "node04" in err.message and "3 s" in err.message
            assert 3.0 <= finished["node04"] < 6
            others = [r for n, r in zip(c.names, results) if n != "node04"]
            assert all(not isinstance(r, BaseException) for r in others)
            assert max(finished[n] for n in c.names if n != "node04") < finished["node04"]
        finally:
            await asyncio.gather(*(r.close() for r in results if not isinstance(r, BaseException)))
    finally:
        node.iptables("-D", *rule)


async def test_sshd_killed_mid_session_is_lost(ssh_cluster) -> None:
    c = ssh_cluster
    node = c["node03"]
    w = await SshTransport(_opts(c)).open("node03")
    try:
        node.kill_sshd(sessions=True)
        with pytest.raises(TransportError) as err:
            for _ in range(100):  # the loss is noticed at the latest by the next request
                await w.call(protocol.PING({}), timeout=10)
        assert err.value.code == "lost" and "node03" in err.value.message
    finally:
        await w.close(kill=True)
        node.start_sshd()


def _throttled_sshd(node, tmp_path):
    """A second sshd on the node, port 2222, MaxStartups 1, logging VERBOSE (each connection it drops); (its
    process, its log)."""
    config = tmp_path / "sshd_config_throttled"
    config.write_text((node.dir / "sshd_config").read_text()
                      .replace("Port 22", "Port 2222").replace("MaxStartups 500:30:1000", "MaxStartups 1")
                      .replace(f"PidFile {node.dir / 'sshd.pid'}", f"PidFile {tmp_path / 'sshd2.pid'}")
                      .replace("LogLevel ERROR", "LogLevel VERBOSE"))
    log = tmp_path / "sshd2.log"
    with open(log, "wb") as out:
        sshd = node.spawn([cluster_mod.SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=out)
    return sshd, log


async def test_throttled_by_maxstartups_then_retried(ssh_cluster, tmp_path) -> None:
    c = ssh_cluster
    node = c["node02"]
    sshd, log = _throttled_sshd(node, tmp_path)

    def drops() -> int:
        return log.read_text(errors="replace").count("past MaxStartups")
    holder = None
    try:
        wait_until(lambda: node.listening(2222), 10, "the throttled sshd to listen")
        # one unauthenticated connection fills MaxStartups 1: sshd drops every new one before its banner
        holder = socket.create_connection((node.ip, 2222), timeout=5)
        holder.recv(100)  # its banner: the slot is really taken
        with pytest.raises(TransportError) as err:
            await SshTransport(_opts(c, throttle_retries=2)).open("node02", port=2222)
        assert err.value.code == "throttled" and "node02" in err.value.message
        # retries and a deadline that outlast sshd freeing the slot once the holder goes (its pre-auth child must
        # see the close and exit: seconds on a busy machine); the first drop is awaited below, not slept for
        t = SshTransport(_opts(c, throttle_retries=10, connect_timeout=float(cluster_mod.UNHURRIED_LOGIN[1])))
        dropped = drops()
        opening = asyncio.ensure_future(t.open("node02", port=2222))
        # let it be dropped at least once (sshd says so in its log), then free the slot
        await wait_until_async(lambda: drops() > dropped or opening.done(), 30, "sshd to drop the connection")
        holder.close()
        holder = None
        w = await opening
        await w.close()
        assert any("MaxStartups" in x for x in w.warnings)
    finally:
        if holder is not None:
            holder.close()
        sshd.kill()
        sshd.wait(timeout=10)


async def test_a_node_throttled_and_then_out_of_time_is_named_throttled(ssh_cluster, tmp_path) -> None:
    # sshd drops the first attempts (MaxStartups), then the node stops answering: the retry runs out of the
    # connect deadline. The cause to act on is the throttling (seen beside two CPU burners: 32 names behind one
    # sshd with MaxStartups 3, a retry's key exchange outlasting the deadline), said with what the retry met.
    c = ssh_cluster
    node = c["node02"]
    sshd, log = _throttled_sshd(node, tmp_path)
    rule = ("INPUT", "-p", "tcp", "--dport", "2222", "-j", "DROP")
    holder, blocked = None, False
    try:
        wait_until(lambda: node.listening(2222), 10, "the throttled sshd to listen")
        holder = socket.create_connection((node.ip, 2222), timeout=5)
        holder.recv(100)  # the one slot is taken: sshd drops every new connection before its banner
        t = SshTransport(_opts(c, throttle_retries=50, connect_timeout=6.0))
        opening = asyncio.ensure_future(t.open("node02", port=2222))
        await wait_until_async(lambda: "past MaxStartups" in log.read_text(errors="replace") or opening.done(), 30,
                               "sshd to drop the connection")
        node.iptables("-A", *rule)  # from now on nothing reaches sshd: the next retry times out
        blocked = True
        with pytest.raises(TransportError) as err:
            await opening
        e = err.value
        assert e.code == "throttled", e
        assert "node02" in e.message and "MaxStartups" in e.message and "deadline" in e.message, e.message
        assert "no TCP connection" in e.message, e.message  # what the last attempt met
    finally:
        if blocked:
            node.iptables("-D", *rule)
        if holder is not None:
            holder.close()
        sshd.kill()
        sshd.wait(timeout=10)


async def test_proxyjump_from_ssh_config(ssh_cluster, tmp_path) -> None:
    c = ssh_cluster
    config = tmp_path / "config"
    config.write_text(f"Host via01\n    HostName {c['node02'].ip}\n    ProxyJump node01\n\n"
                      + c.ssh_config.read_text().replace("Host node02\n", "Host node02 via01\n"))
    w = await SshTransport(_opts(c, config_paths=(str(config),))).open("via01")
    try:
        assert w.hello["hostname"] == "node02"
    finally:
        await w.close()


async def test_missing_pyspy_is_pushed_from_the_login_node(ssh_cluster) -> None:
    c = ssh_cluster
    node = c["node04"]
    link = node.bin_dir / "py-spy"
    target = os.readlink(link) if link.is_symlink() else None
    # both are the suite's own set-up (py-spy is a pinned dependency), not the machine's luck: never a skip
    assert target is not None, f"the test cluster gives every node py-spy ({link})"
    assert local_pyspy() is not None, "hangscope's own py-spy (a pinned dependency) is installed beside it"
    link.unlink()
    try:
        w = await SshTransport(_opts(c)).open("node04")
        try:
            assert any("py-spy was missing" in x for x in w.warnings), w.warnings
            assert w.hello["tools"]["py-spy"]["path"]
        finally:
            await w.close()
    finally:
        link.symlink_to(target)


async def test_network_cut_mid_session_is_lost_within_the_keepalive_deadline(ssh_cluster) -> None:
    c = ssh_cluster
    node = c["node01"]
    w = await SshTransport(_opts(c, keepalive_interval=0.5, keepalive_count_max=2)).open("node01")
    rule = ("INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP")
    node.iptables("-I", *rule)
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TransportError) as err:
            await w.call(protocol.PING({}), timeout=30)  # the request itself never gets an answer: keepalives decide
        assert err.value.code == "lost" and "node01" in err.value.message
        assert loop.time() - t0 < 5
    finally:
        node.iptables("-D", *rule)
        await w.close(kill=True)


async def test_config_cannot_give_the_worker_a_pty_an_agent_or_our_environment(ssh_cluster, tmp_path,
                                                                               monkeypatch) -> None:
    c = ssh_cluster
    monkeypatch.setenv("HANGSCOPE_TEST_SECRET", "do-not-send")
    config = tmp_path / "config"
    config.write_text("Host *\n    RequestTTY force\n    ForwardAgent yes\n    SendEnv *\n\n"
                      + c.ssh_config.read_text())
    w = await SshTransport(_opts(c, config_paths=(str(config),))).open("node02")
    try:
        assert (await w.call(protocol.PING({}), timeout=10))["pong"] is True  # a pty would have mangled the protocol
        environ = Path(f"/proc/{c['node02'].host_pid(w.pid)}/environ").read_bytes().split(b"\0")
        names = {e.split(b"=", 1)[0] for e in environ}
        assert b"HANGSCOPE_TEST_SECRET" not in names and b"SSH_AUTH_SOCK" not in names
        assert os.readlink(f"/proc/{c['node02'].host_pid(w.pid)}/fd/0").startswith("pipe:")
    finally:
        await w.close()


async def test_user_config_wins_over_system_config_which_still_applies(ssh_cluster, tmp_path) -> None:
    c = ssh_cluster
    system = tmp_path / "ssh_config"
    system.write_text("Host node01\n    Port 2\n")  # what /etc/ssh/ssh_config would say
    with pytest.raises(TransportError) as err:  # the user's file sets no Port: the system's applies
        await SshTransport(_opts(c, config_paths=(str(c.ssh_config), str(system)))).open("node01")
    assert err.value.code == "refused"
    user = tmp_path / "config"
    user.write_text("Host node01\n    Port 22\n\n" + c.ssh_config.read_text())
    w = await SshTransport(_opts(c, config_paths=(str(user), str(system)))).open("node01")  # first wins
    await w.close()
    defaults = SshTransport().config_paths
    if os.access("/etc/ssh/ssh_config", os.R_OK):
        assert defaults[-1] == "/etc/ssh/ssh_config"


async def test_global_known_hosts_file_from_config_is_trusted(ssh_cluster, tmp_path) -> None:
    c = ssh_cluster
    empty = tmp_path / "user_known_hosts"
    empty.write_text("# nothing here but a broken line, which OpenSSH skips and so do we\ngarbage\n")
    config = tmp_path / "config"
    config.write_text(f"Host node02\n    UserKnownHostsFile {empty}\n    GlobalKnownHostsFile {c.known_hosts}\n\n"
                      + c.ssh_config.read_text())
    w = await SshTransport(_opts(c, config_paths=(str(config),))).open("node02")
    await w.close()
    assert any("malformed" in x for x in w.warnings)


async def test_ssh_agent_is_used_when_ssh_auth_sock_is_set(ssh_cluster, tmp_path, monkeypatch) -> None:
    c = ssh_cluster
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(sock.exists, 10, "ssh-agent to listen")
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        subprocess.run(["ssh-add", "-q", str(c.key)], check=True, capture_output=True)
        monkeypatch.setenv("HOME", str(tmp_path))  # no key files of our own: only the agent can log in
        config = tmp_path / "config"
        config.write_text("".join(line + "\n" for line in c.ssh_config.read_text().splitlines()
                                  if "IdentityFile" not in line and "IdentitiesOnly" not in line))
        w = await SshTransport(_opts(c, config_paths=(str(config),))).open("node03")
        await w.close()
        monkeypatch.delenv("SSH_AUTH_SOCK")
        with pytest.raises(TransportError) as err:
            await SshTransport(_opts(c, config_paths=(str(config),))).open("node03")
        assert err.value.code == "auth_failed" and "no key was available" in err.value.message
    finally:
        agent.kill()
        agent.wait(timeout=10)


async def test_old_python_on_the_node_is_no_python(ssh_cluster) -> None:
    c = ssh_cluster
    node = c["node01"]
    # FAKE python 3.6 on the node: its real python3 with sys.version_info pretending otherwise
    fake = node.bin_dir / "python3.6-fake"
    fake.write_text("#!/bin/sh\nexec python3 -c 'import sys; sys.version_info = (3, 6, 15, \"final\", 0); "
                    "sys.version = \"3.6.15\"; exec(sys.argv[2])' \"$@\"\n")
    fake.chmod(0o755)
    try:
        with pytest.raises(TransportError) as err:
            await SshTransport(_opts(c, python="/usr/local/bin/python3.6-fake")).open("node01")
        e = err.value
        assert e.code == "no_python" and "3.6.15" in e.message and "/usr/local/bin/python3.6-fake" in e.message
    finally:
        fake.unlink()


async def test_a_fanout_window_smaller_than_the_node_count_still_reaches_every_node(ssh_cluster) -> None:
    c = ssh_cluster
    t = SshTransport(_opts(c, fanout=1))
    workers = await asyncio.gather(*(t.open(n) for n in c.names))
    await asyncio.gather(*(w.close() for w in workers))
    assert [w.hello["hostname"] for w in workers] == c.names


@pytest.mark.parametrize("icmp", ["icmp-host-unreachable", "icmp-net-unreachable"])
async def test_icmp_unreachable_is_unreachable(ssh_cluster, icmp: str) -> None:
    c = ssh_cluster
    node = c["node02"]
    rule = ("INPUT", "-p", "tcp", "--dport", "22", "-j", "REJECT", "--reject-with", icmp)
    node.iptables("-I", *rule)
    try:
        t0 = time.monotonic()
        with pytest.raises(TransportError) as err:
            await SshTransport(_opts(c)).open("node02")
        assert err.value.code == "unreachable" and "node02" in err.value.message
        assert time.monotonic() - t0 < 3
    finally:
        node.iptables("-D", *rule)


async def test_a_chatty_login_shell_does_not_break_the_protocol(ssh_cluster) -> None:
    c = ssh_cluster
    bashrc = c["node03"].dir / "home" / ".bashrc"
    before = bashrc.read_text()
    bashrc.write_text(before + "echo 'Welcome to node03! Quota: 93% used'\nprintf '\\033]0;title\\007\\n'\n")
    try:
        w = await SshTransport(_opts(c)).open("node03")
        try:
            assert (await w.call(protocol.PING({}), timeout=10))["pong"] is True
            assert any("Welcome to node03" in x for x in w.warnings), w.warnings
        finally:
            await w.close()
    finally:
        bashrc.write_text(before)


async def test_aes_gcm_is_preferred_unless_the_ssh_config_names_ciphers(ssh_cluster, tmp_path) -> None:
    # asyncssh runs chacha20-poly1305 from Python per packet, AES-GCM in one call: GCM is offered first;
    # a config's own Ciphers line still decides.
    c = ssh_cluster
    t = SshTransport(_opts(c))
    conn, _, _, _ = await t._connect("node01", "node01", None, None)
    try:
        assert conn.get_extra_info("send_cipher").endswith("-gcm@openssh.com")
        assert conn.get_extra_info("recv_cipher").endswith("-gcm@openssh.com")
    finally:
        conn.close()
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  Ciphers chacha20-poly1305@openssh.com\n" + Path(c.ssh_config).read_text())
    t = SshTransport(_opts(c, config_paths=(str(cfg),)))
    conn, _, _, _ = await t._connect("node01", "node01", None, None)
    try:
        assert conn.get_extra_info("send_cipher") == "chacha20-poly1305@openssh.com"
    finally:
        conn.close()


async def test_the_ssh_config_is_read_once_per_connection(ssh_cluster, monkeypatch) -> None:
    # asyncssh's parser runs in Python (~15 us a line) and a config may hold a block per node: the config
    # parsed for the connection is handed to asyncssh instead of being parsed a second time.
    c = ssh_cluster
    parsed = []

    def counting(real):  # type: ignore[no-untyped-def]
        def parse(self, path):  # type: ignore[no-untyped-def]
            parsed.append(str(path))
            return real(self, path)
        return parse

    # asyncssh's parser, and hangscope's (app/transport/sshconfig.py: the same, over lines tokenized once)
    monkeypatch.setattr(asyncssh.config.SSHConfig, "parse", counting(asyncssh.config.SSHConfig.parse))
    monkeypatch.setattr(HostConfig, "parse", counting(HostConfig.parse))
    t = SshTransport(_opts(c))
    w = await t.open("node01")
    try:
        assert w.hello["hostname"] == "node01"  # HostName, User, IdentityFile from the config still apply
    finally:
        await w.close()
    assert parsed == [str(c.ssh_config)]
