"""A fake multi-node cluster for tests: one network namespace + PID/mount/UTS/IPC namespaces + sshd per node.

Needs root. Layout (see build_cluster): a bridge in the root netns holds the login side's address
198.18.X.1/24; node i is 198.18.X.(10+i) on a veth into its own netns, with no default route, so nothing can
leave the bridge. Each node's first process is `tini` (PID 1 reaps orphans; killing it takes the whole node)
started by `ip netns exec NS unshare --pid --fork --kill-child --mount-proc --uts --ipc --mount`, after a
setup script that gives the node its hostname, its own /etc/hosts and /etc/resolv.conf, a private /run, a
clean root home and its own /usr/local/bin (see NODE_SETUP). The login side is a temp HOME with .ssh/config,
a user key and known_hosts; `cluster.env()` is the environment to run `hangscope` in against it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import shlex
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import cluster_sweep as sweep
import testenv
from cluster_node import NODE_PATH, Node, NodeCommandError

__all__ = ["Cluster", "Node", "NodeCommandError", "build_cluster", "support_problem", "run_login",
           "NODE_PATH", "SSHD", "PYSPY", "UNHURRIED_LOGIN"]

# `--connect-timeout` for the CLI runs whose subject is not the connect deadline: on a machine whose CPUs are busy,
# sshd's key exchange and login (and asyncssh's side of it) can take longer than hangscope's default
# (SshOptions.connect_timeout, 10 s), and a node failed by it would fail a test about something else. The tests of
# the deadline itself (faults/test_faults_bounds.py, transport/test_transport_ssh.py) set theirs; this is well within
# the CLI runs' own timeouts (180-240 s).
UNHURRIED_LOGIN = ("--connect-timeout", "60")

REQUIRED_TOOLS = ("ip", "unshare", "nsenter", "setpriv", "tini", "ssh", "ssh-keygen", "iptables", "mount")
SSHD = "/usr/sbin/sshd"  # sshd refuses to re-exec itself unless started by an absolute path
# py-spy as pip installs it into the tests' environment (a static binary); nodes get it on their PATH
PYSPY = testenv.PYSPY

# Runs as the node's first process (PID 1 of the new PID namespace, in its new mount namespace; mount
# propagation is private, so none of this is seen outside the node). $1 hostname, $2 the node's directory.
# - /etc/hosts has every node's name: gloo binds to the address its hostname resolves to.
# - resolv.conf points at the node's own loopback, where nothing listens: lookups fail at once, locally.
# - a private /run: sshd needs /run/sshd, and the host's /run (netns mounts, locks) is none of a node's business.
# - root's home is a clean directory whose .bashrc does nothing: sshd runs every remote command through the
#   login shell, and this image's /root/.bashrc runs `pyenv init` (0.1 s per command, and a shared lock that
#   serialised the first command on all nodes). The folders of /root that hold the tests' interpreter, venv
#   and py-spy ($3...: a version manager's folder, a venv) stay visible; the rest of /root (tokens, caches) does not.
# - the host's cgroup hierarchies, mounted where the host has them: `ip netns exec` mounts a fresh /sys without
#   them, and a real node (or a container) shows its cgroups there: the freezer that holds a rank, cpu.stat.
# - /usr/local/bin is the node's own directory holding py-spy: the remote PATH finds py-spy and Debian's
#   /usr/bin/python3, like a compute node with py-spy installed; a test removes it to simulate its absence.
NODE_SETUP = r"""
set -eu
hostname "$1"
mount --bind "$2/etc/hosts" /etc/hosts
mount --bind "$2/etc/resolv.conf" /etc/resolv.conf
mount -t tmpfs -o mode=0755,size=16m tmpfs /run
# `ip netns exec` mounted a fresh /sys for the network namespace, without the cgroup file systems a real node
# has: mount this machine's hierarchies again (the same ones, so the node sees every process's cgroup)
if [ -f "$2/cgroups.sh" ]; then sh "$2/cgroups.sh" || true; fi
mkdir -p /run/sshd
node_dir=$2
shift 2
for keep in "$@"; do
    if [ -d "/root/$keep" ]; then
        mkdir -p "$node_dir/home/$keep"
        mount --bind "/root/$keep" "$node_dir/home/$keep"
    fi
done
set -- "$(hostname)" "$node_dir"
@CGROUPS@
mount --rbind "$2/home" /root
mount --bind "$2/bin" /usr/local/bin
exec tini -- sleep infinity
"""

CLEAN_BASHRC = "# hangscope test node: a fast, quiet shell for non-interactive ssh commands (see tests/support/cluster.py)\n"


def cgroup_setup() -> str:
    """Shell lines that mount this machine's cgroup hierarchies in a node as they are mounted here (the same
    cgroup namespace: paths read the same inside); a mount that fails leaves the node without it, as on a node
    that does not have that hierarchy."""
    lines = []
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return ":"
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or not fields[4].startswith("/sys/fs/cgroup"):
            continue
        point = shlex.quote(fields[4])
        if tail[0] == "tmpfs" and fields[4] == "/sys/fs/cgroup":
            lines.insert(0, "mount -t tmpfs -o mode=0755 cgroup /sys/fs/cgroup || true")
        elif tail[0] == "cgroup2":
            lines.append(f"mkdir -p {point} && mount -t cgroup2 cgroup2 {point} || true")
        elif tail[0] == "cgroup":
            lines.append(f"mkdir -p {point} && mount -t cgroup -o {shlex.quote(tail[2])} cgroup {point} || true")
    return "\n".join(lines) or ":"


def support_problem() -> str | None:
    """Why no cluster can be built here (not root, a tool missing), or None when it can."""
    if os.geteuid() != 0:
        return "the network-namespace test cluster needs root (unshare, ip netns, sshd)"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        return f"the network-namespace test cluster needs these tools: {', '.join(missing)}"
    return None


class Cluster:
    """N nodes on one bridge plus the login side's ssh files. Close it (or let the fixture) to remove all."""

    def __init__(self, rid: str, workdir: Path, subnet: str, lock: sweep.RunLock) -> None:
        self.rid = rid
        self.workdir = workdir
        self.subnet = subnet  # "198.18.X"
        self.bridge = sweep.bridge_name(rid)
        self.login_ip = f"{subnet}.1"
        self.nodes: list[Node] = []
        self.home = workdir / "login"
        self.ssh_dir = self.home / ".ssh"
        self.ssh_config = self.ssh_dir / "config"
        self.key = self.ssh_dir / "id_ed25519"
        self.known_hosts = self.ssh_dir / "known_hosts"
        self._lock = lock
        self._closed = False
        self._close_guard = threading.RLock()  # re-entrant: the SIGTERM handler may run inside close()

    def __getitem__(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """os.environ for a login-side subprocess: HOME is the test home (its .ssh), no ssh agent."""
        env = dict(os.environ)
        env["HOME"] = str(self.home)
        for name in ("SSH_AUTH_SOCK", "SSH_AGENT_PID"):
            env.pop(name, None)
        env.update(extra or {})
        return env

    def hosts_file(self, tmp_path: Path, names: Sequence[str] | None = None) -> Path:
        """A new hosts file (one node name per line, all nodes by default) for hangscope."""
        fd, name = tempfile.mkstemp(dir=tmp_path, prefix="hosts-", suffix=".txt")
        os.close(fd)
        path = Path(name)
        path.write_text("".join(f"{name}\n" for name in (names if names is not None else self.names)))
        return path

    def ssh_argv(self, node: str, *command: str) -> list[str]:
        """The real OpenSSH client against a node: `-F` because ssh takes ~ from passwd, never from $HOME."""
        return ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", node, *command]

    def allow_node_ssh(self) -> None:
        """Let every node ssh to every other, as a cluster with shared home keys does (what relays need): each
        node's root home gets the login side's key (already authorized on every node) and its known_hosts.
        The node's OpenSSH client reads them from /root/.ssh, the node's own home (NODE_SETUP)."""
        for node in self.nodes:
            ssh = node.dir / "home" / ".ssh"
            ssh.mkdir(mode=0o700, exist_ok=True)
            _write(ssh / "id_ed25519", self.key.read_text(), 0o600)
            _write(ssh / "known_hosts", self.known_hosts.read_text())

    def close(self) -> None:
        """Kill every node (their PID-1s take all their processes along), remove netns, links and files."""
        with self._close_guard:
            if self._closed:
                return
            self._closed = True
        for node in self.nodes:
            node.kill()
        for node in self.nodes:
            node.reap()
        with sweep.alloc_lock():
            sweep.remove_run(self.rid, sweep.list_netns(), sweep.list_links())
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._lock.release()
        _LIVE.discard(self)


_LIVE: set[Cluster] = set()


def _close_all() -> None:
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.close()


def _on_signal(signum: int, frame: Any) -> None:
    # SIGTERM/SIGHUP would end the test process without running finalizers: clean up first, then die of it.
    _close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_cleanup() -> None:
    if getattr(_install_cleanup, "done", False):
        return
    atexit.register(_close_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)
    _install_cleanup.done = True  # type: ignore[attr-defined]


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _keygen(path: Path, comment: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _sshd_config(cluster: Cluster, node: Node) -> str:
    return "\n".join([
        f"ListenAddress {node.ip}",
        "Port 22",
        f"HostKey {node.dir / 'ssh_host_ed25519_key'}",
        f"PidFile {node.dir / 'sshd.pid'}",
        f"AuthorizedKeysFile {cluster.workdir / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        # hangscope opens one connection per node, tests open many at once; sessions are multiplexed channels
        "MaxStartups 500:30:1000",
        "MaxSessions 200",
        "LogLevel ERROR",
        "Subsystem sftp internal-sftp",
        "",
    ])


def _ssh_config(cluster: Cluster) -> str:
    blocks = []
    for node in cluster.nodes:
        blocks.append("\n".join([
            f"Host {node.name}",
            f"    HostName {node.ip}",
            "    User root",
            f"    IdentityFile {cluster.key}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {cluster.known_hosts}",
            "    StrictHostKeyChecking yes",
            "",
        ]))
    return "\n".join(blocks)


def build_cluster(n: int = 4, *, prefix: str = "node", start_sshd: bool = True) -> Cluster:
    """Bring up n nodes named prefix01, prefix02, ... with sshd running; call close() (or use `with`)."""
    problem = support_problem()
    if problem:
        raise RuntimeError(problem)
    if not 1 <= n <= 240:
        raise ValueError(f"a test cluster has 1 to 240 nodes, not {n}")
    _install_cleanup()
    rid = sweep.new_run_id()
    workdir = Path(tempfile.mkdtemp(prefix=f"hangscope-cluster-{rid}-"))
    with sweep.alloc_lock():
        sweep.sweep_stale()
        cluster = Cluster(rid, workdir, sweep.free_subnet(), sweep.RunLock(rid, workdir))
        _LIVE.add(cluster)
        try:
            _create_bridge(cluster)  # inside the lock: the address claims the subnet for this run
        except BaseException:
            _LIVE.discard(cluster)
            sweep.remove_run(rid, sweep.list_netns(), sweep.list_links())
            cluster._lock.release()
            raise
    try:
        _populate(cluster, n, prefix)
        if start_sshd:
            for node in cluster.nodes:
                node.start_sshd(wait=False)
            for node in cluster.nodes:
                node.wait_sshd()
    except BaseException:
        cluster.close()
        raise
    return cluster


def _create_bridge(cluster: Cluster) -> None:
    _ip_batch([
        f"link add {cluster.bridge} type bridge",
        f"addr add {cluster.login_ip}/24 dev {cluster.bridge}",
        f"link set {cluster.bridge} up",
    ])


def _ip_batch(lines: Sequence[str], netns: str | None = None) -> None:
    argv = ["ip", *(["-n", netns] if netns else []), "-batch", "-"]
    done = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}\n" + "\n".join(lines))


def _populate(cluster: Cluster, n: int, prefix: str) -> None:
    names = [f"{prefix}{i:02d}" for i in range(1, n + 1)]
    hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + "".join(
        f"{cluster.subnet}.{10 + i}\t{name}\n" for i, name in enumerate(names, start=1))
    cluster.ssh_dir.mkdir(mode=0o700, parents=True)
    keygens = [_keygen(cluster.key, f"hangscope-test-{cluster.rid}")]
    for i, name in enumerate(names, start=1):
        node = Node(name=name, ip=f"{cluster.subnet}.{10 + i}", ns=sweep.netns_name(cluster.rid, name),
                    dir=cluster.workdir / name, cluster_rid=cluster.rid)
        cluster.nodes.append(node)
        _write(node.dir / "etc" / "hosts", hosts)
        _write(node.dir / "etc" / "resolv.conf", "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        _write(node.dir / "home" / ".bashrc", CLEAN_BASHRC)
        _write(node.dir / "home" / ".profile", CLEAN_BASHRC)
        (node.dir / "bin").mkdir()
        if PYSPY.exists():
            (node.dir / "bin" / "py-spy").symlink_to(PYSPY)
        _write(node.dir / "sshd_config", _sshd_config(cluster, node))
        _write(node.dir / "cgroups.sh", _cgroup_mounts())
        keygens.append(_keygen(node.dir / "ssh_host_ed25519_key", name))
    batch = []
    for i, node in enumerate(cluster.nodes, start=1):
        veth = sweep.veth_name(cluster.rid, i)
        batch += [f"netns add {node.ns}",
                  f"link add {veth} type veth peer name eth0 netns {node.ns}",
                  f"link set {veth} master {cluster.bridge} up"]
    _ip_batch(batch)
    for node in cluster.nodes:
        # no default route: the node reaches the bridge's /24 and nothing else
        _ip_batch(["link set lo up", f"addr add {node.ip}/24 dev eth0", "link set eth0 up"], netns=node.ns)
    for node in cluster.nodes:
        node.boot(NODE_SETUP.replace("@CGROUPS@", cgroup_setup()), *testenv.root_dirs_to_keep())
    for proc in keygens:
        _, err = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"ssh-keygen failed: {err.decode(errors='replace')}")
    _write(cluster.workdir / "authorized_keys", Path(f"{cluster.key}.pub").read_text())
    _write(cluster.ssh_config, _ssh_config(cluster), 0o600)
    lines = []
    for node in cluster.nodes:
        kind, blob = (node.dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        lines.append(f"{node.name},{node.ip} {kind} {blob}\n")
    _write(cluster.known_hosts, "".join(lines))
    for node in cluster.nodes:
        node.wait_booted()


def _cgroup_mounts() -> str:
    """Shell lines that mount this machine's cgroup hierarchies (and the tmpfs holding them) where they are."""
    lines = []
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return ""
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, extra = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(extra) < 3 or fields[3] != "/":
            continue
        point = fields[4]
        if not point.startswith("/sys/fs/cgroup"):
            continue
        if extra[0] == "tmpfs" and point == "/sys/fs/cgroup":
            lines.append("mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup")
        elif extra[0] in ("cgroup", "cgroup2"):
            opts = ",".join(o for o in extra[2].split(",") if o not in ("rw", "ro"))
            lines.append(f"mkdir -p '{point}' && mount -t {extra[0]} {'-o ' + opts + ' ' if opts else ''}"
                         f"{extra[0]} '{point}' || true")
    return "\n".join(lines) + "\n"


def run_login(argv: Sequence[str], cluster: Cluster, timeout: float = 60,
              **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a login-side command (ssh, hangscope) with the cluster's environment; output captured as text."""
    return subprocess.run(list(argv), env=cluster.env(), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)


