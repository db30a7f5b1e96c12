"""The SSH test cluster behaves like separate machines, leaves nothing behind, and the shared job really hangs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional, Tuple

import pytest

import cluster_sweep as sweep
from cluster import Cluster, build_cluster, run_login
from waiting import wait_until
from jobs import Job, _main_thread
from procstate import describe

pytestmark = pytest.mark.cluster

CONNECT = textwrap.dedent("""
    import socket, sys
    try:
        socket.create_connection((sys.argv[1], 22), timeout=float(sys.argv[2])).close()
        print("connected")
    except OSError as exc:
        print(type(exc).__name__, exc.errno)
""")


def connect_from(node, target: str, timeout: float = 2.0) -> str:
    return node.run(["python3", "-c", CONNECT, target, str(timeout)]).stdout.strip()


def test_real_ssh_reaches_every_node_by_name_and_strict_host_key(cluster: Cluster) -> None:
    for node in cluster.nodes:
        res = run_login(cluster.ssh_argv(node.name, "hostname"), cluster, timeout=30)
        assert res.returncode == 0, res.stderr
        assert res.stdout == f"{node.name}\n"
        assert res.stderr == ""  # no host-key prompt or warning: known_hosts holds the node's key


def test_remote_shell_is_quiet_and_finds_system_python_and_py_spy(cluster: Cluster) -> None:
    script = 'echo "$HOME"; command -v python3 py-spy; python3 -c "import sys; print(sys.version_info >= (3, 9))"'
    res = run_login(cluster.ssh_argv("node02", script), cluster, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["/root", "/usr/bin/python3", "/usr/local/bin/py-spy", "True"]
    assert res.stderr == ""
    # the node's root home is the test's clean one, not this machine's /root
    assert cluster["node02"].run(["cat", "/root/.bashrc"]).stdout == cluster["node02"].dir.joinpath(
        "home", ".bashrc").read_text()


def test_env_points_hangscope_at_the_test_home(cluster: Cluster, tmp_path: Path) -> None:
    env = cluster.env()
    assert env["HOME"] == str(cluster.home) and "SSH_AUTH_SOCK" not in env
    config = cluster.ssh_config.read_text()
    for node in cluster.nodes:
        assert f"Host {node.name}\n    HostName {node.ip}\n    User root\n" in config
        assert f"{node.name},{node.ip} ssh-ed25519 " in cluster.known_hosts.read_text()
    assert cluster.hosts_file(tmp_path).read_text() == "node01\nnode02\nnode03\nnode04\n"
    assert cluster.hosts_file(tmp_path, ["node03"]).read_text() == "node03\n"


def test_nodes_reach_each_other_by_name_and_ip_and_nothing_beyond_the_bridge(cluster: Cluster) -> None:
    node1, node2 = cluster["node01"], cluster["node02"]
    assert connect_from(node1, "node02") == "connected"
    assert connect_from(node1, node2.ip) == "connected"
    # no default route: any address outside the bridge's /24 is unreachable
    assert connect_from(node1, "192.0.2.1", 1.0).startswith("OSError 101")  # ENETUNREACH


def test_nodes_have_their_own_pid_uts_and_mount_namespaces(cluster: Cluster) -> None:
    node1, node2 = cluster["node01"], cluster["node02"]
    marker = "hangscope-pidns-probe"
    proc = node2.spawn(["python3", "-c", "import sys, time; time.sleep(3600)", marker])
    try:
        def probes(node) -> list[int]:
            return [p.host_pid for p in node.procs()
                    if marker.encode() in Path(f"/proc/{p.host_pid}/cmdline").read_bytes()]
        host_pids = wait_until(lambda: probes(node2), 10, "the probe to start")
        nspid = next(p.pid for p in node2.procs() if p.host_pid == host_pids[0])
        assert probes(node1) == []
        # node01 can neither see the probe by its node02 pid's cmdline nor signal it by its host pid
        scan = ("import os, sys; me = str(os.getpid()); m = (sys.argv[1] + sys.argv[2]).encode()\n"
                "print([p for p in os.listdir('/proc') if p.isdigit() and p != me\n"
                "       and m in open(f'/proc/{p}/cmdline', 'rb').read()])")
        halves = [marker[:5], marker[5:]]  # the scanner's own argv must not contain the marker
        assert node2.run(["python3", "-c", scan, *halves]).stdout == f"['{nspid}']\n"
        assert node1.run(["python3", "-c", scan, *halves]).stdout == "[]\n"
        assert node1.run(["kill", "-0", str(host_pids[0])], check=False).returncode != 0
        assert node2.run(["kill", "-0", str(nspid)]).returncode == 0
        assert node1.run(["cat", "/proc/1/comm"]).stdout == "tini\n"
        assert node1.run(["hostname"]).stdout == "node01\n"
        assert "node03" in node1.run(["cat", "/etc/hosts"]).stdout
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_sshd_can_be_stopped_and_restarted(cluster: Cluster) -> None:
    node = cluster["node04"]
    node.kill_sshd()
    try:
        res = run_login(cluster.ssh_argv("node04", "true"), cluster, timeout=30)
        assert res.returncode == 255 and "Connection refused" in res.stderr
    finally:
        node.start_sshd()
    assert run_login(cluster.ssh_argv("node04", "true"), cluster, timeout=30).returncode == 0


def test_iptables_in_a_node_cuts_only_that_node(cluster: Cluster) -> None:
    node1, node3 = cluster["node01"], cluster["node03"]
    node3.iptables("-A", "INPUT", "-s", node1.ip, "-j", "DROP")
    try:
        assert connect_from(node1, "node03", 0.5) == "TimeoutError None"
        assert connect_from(cluster["node02"], "node03") == "connected"
    finally:
        node3.iptables("-D", "INPUT", "-s", node1.ip, "-j", "DROP")
    assert connect_from(node1, "node03") == "connected"


# The namespaces' processes die on the kernel's own time once their init is killed (a process in the middle of a
# system call on a busy machine takes longer): the wait for nothing to be left is bounded by this, and a timeout says
# what was still there. What the teardown does itself (its files, lock and links) is checked at once.
KERNEL_REAP_S = 30.0
Member = Tuple[int, str]  # (pid, start time in clock ticks): one process, whatever pid numbers are reused later


def _stat(pid: int) -> Optional[Tuple[str, list[str]]]:
    """(command, the fields after it) of /proc/PID/stat, None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            head, rest = f.read().rsplit(b")", 1)
    except (OSError, ValueError):
        return None
    return head.split(b"(", 1)[-1].decode(errors="replace"), rest.decode(errors="replace").split()


def _start_time(pid: int) -> Optional[str]:
    stat = _stat(pid)
    return stat[1][19] if stat is not None and len(stat[1]) > 19 else None


def _members(pidns: set[str]) -> set[Member]:
    """The processes in these PID namespaces now, by pid and start time. Taken while the cluster is up: once a
    namespace is freed its inode number is reused (a cluster built at the same time by another test can get it), so
    "in that namespace" read after the teardown can name another cluster's processes."""
    found: set[Member] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") in pidns:
                    started = _start_time(int(entry.name))
                    if started is not None:
                        found.add((int(entry.name), started))
            except OSError:
                continue
    return found


def _describe(pid: int) -> str:
    """`pid 123 (sshd, state S, parent 1)`: what a leftover is, for the failure message."""
    stat = _stat(pid)
    if stat is None or len(stat[1]) < 2:
        return f"pid {pid}"
    return f"pid {pid} ({stat[0]}, state {stat[1][0]}, parent {stat[1][1]})"


def _gone(rid: str, workdir: Path, members: set[Member], what: str) -> None:
    """Wait until nothing of the cluster is left; at the deadline, fail naming what still is."""
    left: list[str] = []

    def nothing() -> bool:
        left[:] = _leftovers(rid, workdir, members)
        return not left

    try:
        wait_until(nothing, KERNEL_REAP_S, what)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; still there: {[_describe(int(x[4:])) if x.startswith('pid ') else x for x in left[:8]]}") from None


def _leftovers(rid: str, workdir: Path, members: set[Member]) -> list[str]:
    found = [n for n in sweep.list_netns() + sweep.list_links() if sweep.rid_of(n) == rid]
    if workdir.exists():
        found.append(str(workdir))
    if (sweep.LOCK_DIR / f"{rid}.lock").exists():
        found.append(f"lock {rid}")
    found += [f"pid {pid}" for pid, started in sorted(members) if _start_time(pid) == started]
    return found


def test_up_and_down_leaves_nothing_behind_and_spares_other_clusters(cluster: Cluster) -> None:
    extra = build_cluster(2)  # how long that takes is measured by bench/cluster_up.py, not asserted here
    try:
        assert extra.subnet != cluster.subnet and extra.bridge != cluster.bridge
        # an orphaned daemon inside a node: it must die with the node
        extra["node02"].run("setsid sleep 3600 </dev/null >/dev/null 2>&1 &")
        members = _members({os.readlink(f"/proc/{n.init_pid}/ns/pid") for n in extra.nodes})
        assert len(members) >= 2 * 2, members  # each node's init and sshd at least, and the orphan
        res = run_login(extra.ssh_argv("node01", "hostname"), extra, timeout=30)
        assert res.stdout == "node01\n"
    finally:
        extra.close()
    assert not [x for x in _leftovers(extra.rid, extra.workdir, set()) if not x.startswith("pid ")]  # files, links
    _gone(extra.rid, extra.workdir, members, "the extra cluster to vanish")
    # the session cluster was not touched
    assert run_login(cluster.ssh_argv("node01", "true"), cluster, timeout=30).returncode == 0


def test_sweeper_removes_the_leftovers_of_a_crashed_run(cluster_support: None) -> None:
    tests_dir = Path(__file__).resolve().parents[1] / "support"  # the helpers (cluster)
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(tests_dir)!r})
        import cluster
        c = cluster.build_cluster(1, start_sshd=False)
        print(c.rid, c.workdir, flush=True)
        sys.stdin.readline()  # the test holds the allocation lock now
        os.kill(os.getpid(), signal.SIGKILL)  # a crash: no finalizer, no atexit
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)[1]
        rid, workdir = line.split()
        # Every cluster that other test sessions (xdist workers) build sweeps crashed runs first, under this
        # lock: held from before the crash to the sweep, the crashed run is ours to sweep and no one else's.
        with sweep.alloc_lock():
            proc.stdin.write("crash\n")
            proc.stdin.flush()
            assert proc.wait(timeout=60) == -signal.SIGKILL, proc.communicate()[1]
            leftover = [n for n in sweep.list_netns() if sweep.rid_of(n) == rid]
            assert leftover  # the crash left its netns behind ...
            # ... but not its nodes: they die with the process that built them (parent-death signal)
            wait_until(lambda: subprocess.run(["ip", "netns", "pids", leftover[0]], capture_output=True,
                                              text=True).stdout == "", 10, "the crashed run's node to die")
            swept = sweep.sweep_stale()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rid in swept
    assert _leftovers(rid, Path(workdir), set()) == []


def test_sigterm_to_the_test_process_still_tears_its_clusters_down(cluster_support: None) -> None:
    tests_dir = Path(__file__).resolve().parents[1] / "support"  # the helpers (cluster)
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(tests_dir)!r})
        import cluster
        c = cluster.build_cluster(2)
        print(c.rid, c.workdir, *(os.readlink(f"/proc/{{n.init_pid}}/ns/pid") for n in c.nodes), flush=True)
        sys.stdin.read()  # until the test signals us
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        rid, workdir, *pidns = proc.stdout.readline().split()  # type: ignore[union-attr]
        members = _members(set(pidns))
        assert members and _leftovers(rid, Path(workdir), members)  # it is up
        proc.terminate()
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
    # what the handler removes itself (netns, links, work folder, lock) is gone by the time the process has died of
    # the signal; the kernel then kills and reaps the rest of each namespace on its own time (on a loaded machine
    # not by the moment the process's exit is seen): within KERNEL_REAP_S, as in
    # test_up_and_down_leaves_nothing_behind_and_spares_other_clusters
    assert not [x for x in _leftovers(rid, Path(workdir), set()) if not x.startswith("pid ")]
    _gone(rid, Path(workdir), members, "the cluster its SIGTERM handler tore down to vanish")


@pytest.mark.torch
def test_hung_job_ranks_are_blocked_where_the_scenario_says(hung_job: Job, cluster: Cluster) -> None:
    assert sorted(hung_job.ranks) == list(range(8)) and hung_job.culprit == 5
    for rank, loc in hung_job.ranks.items():
        assert loc.node == f"node{rank // 2 + 1:02d}" and loc.local_rank == rank % 2
        assert loc.step == 3
        assert loc.where == ("data_loading" if rank == hung_job.culprit else "all_reduce")
        state, syscall, *_ = _main_thread(loc.host_pid) or ("gone", "")
        assert state == "S" and syscall != "running", (rank, state, syscall, describe(loc.host_pid))
        dump = cluster[loc.node].run(["py-spy", "dump", "--pid", str(loc.pid)], timeout=30).stdout
        assert "train (app/demo/job.py:" in dump
        if rank == hung_job.culprit:
            assert "StreamingLoader._recv_exact" in dump and "all_reduce" not in dump
        else:
            assert "all_reduce (torch/distributed/distributed_c10d.py:" in dump
