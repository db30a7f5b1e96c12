"""Fault matrix, on the node, as a real non-root SSH user whose job ranks belong to root: ptrace is denied (named
with the reason and the remedy, /proc data still shown) and `sudo -n` needs a password (named on the node,
never a prompt). A user is created on this machine for the test (the nodes share /etc/passwd) and removed."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import cluster as cluster_mod
from waiting import wait_until
from app.model.codec import snapshot_from_json

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
PORT = 2200


@pytest.fixture
def user_node(make_cluster):
    """(cluster, node, ssh config, node user) : a second sshd on the node that a non-root user can log in to
    (the cluster's authorized_keys lives in a root-only directory, which sshd reads as the user)."""
    if shutil.which("useradd") is None or os.getuid() != 0:
        pytest.skip("needs root and useradd")
    c = make_cluster(1, prefix="usr")
    node = c.nodes[0]
    user = "hsf" + secrets.token_hex(3)
    subprocess.run(["useradd", "-p", "*", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/bin/sh",
                    user], check=True, capture_output=True)
    d = Path(tempfile.mkdtemp(prefix="hangscope-user-"))
    d.chmod(0o755)
    sshd = None
    try:
        shutil.copy(c.workdir / "authorized_keys", d / "authorized_keys")
        (d / "authorized_keys").chmod(0o644)
        (d / "sshd_config").write_text(
            (node.dir / "sshd_config").read_text().replace("Port 22", f"Port {PORT}")
            .replace(f"AuthorizedKeysFile {c.workdir / 'authorized_keys'}", f"AuthorizedKeysFile {d}/authorized_keys")
            .replace(f"PidFile {node.dir / 'sshd.pid'}", f"PidFile {d}/sshd.pid"))
        key = next(line for line in c.known_hosts.read_text().splitlines() if line.startswith(node.name + ","))
        (d / "known_hosts").write_text(f"[{node.ip}]:{PORT} {key.split(' ', 1)[1]}\n")
        (d / "config").write_text(f"Host {node.name}\n    HostName {node.ip}\n    Port {PORT}\n    User {user}\n"
                                  f"    IdentityFile {c.key}\n    IdentitiesOnly yes\n"
                                  f"    UserKnownHostsFile {d}/known_hosts\n")
        sshd = node.spawn([cluster_mod.SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: node.listening(PORT), 10, "the second sshd to listen")
        yield c, node, d / "config", user
    finally:
        if sshd is not None:
            sshd.kill()
            sshd.wait(timeout=10)
        subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def _root_rank(node) -> tuple[subprocess.Popen, int]:
    """A rank-like root process blocked in read(2) on the node; returns it and its pid inside the node."""
    proc = node.spawn(["python3", "-c", "import os; r, w = os.pipe(); os.read(r, 1)"],
                      env={"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    found = wait_until(lambda: [p for p in node.procs() if p.comm == "python3"], 20, "the rank to start")
    return proc, found[0].pid


def _collect(c, config: Path, node, pid: int, tmp_path: Path, *extra: str):
    out = tmp_path / f"out{len(extra)}.json"
    res = cluster_mod.run_login([sys.executable, "-m", "app", "-F", str(config), "-w", node.name, "--pid", str(pid),
                                 "--snapshot", str(out), "-q", "--samples", "1", *extra], c, timeout=120,
                                cwd=str(REPO))
    assert res.returncode == 1, res.stderr  # partial: the rank is there, its stack is not
    snap, _ = snapshot_from_json(out.read_text())
    (rank,) = snap.ranks
    return res, snap, rank


def test_ptrace_denied_for_another_users_rank_names_reason_and_remedy_and_keeps_proc_data(user_node,
                                                                                          tmp_path) -> None:
    c, node, config, user = user_node
    proc, pid = _root_rank(node)
    try:
        res, snap, rank = _collect(c, config, node, pid, tmp_path)
    finally:
        proc.kill()
    assert snap.nodes[0].state == "done" and snap.nodes[0].info.uid != 0  # really not root on the node
    assert rank.error is not None and rank.error.code == "ptrace_denied"
    assert f"pid {pid}" in rank.error.message and "ptrace_scope" in rank.error.message
    assert "CAP_SYS_PTRACE" in rank.error.hint and "--sudo" in rank.error.hint  # the remedy
    assert rank.threads and rank.threads[0].state == "S"  # /proc fallback: the thread and its state
    assert "ptrace denied" in res.stdout and node.name in res.stdout


def test_sudo_that_needs_a_password_is_named_on_the_node_and_never_prompts(user_node, tmp_path) -> None:
    c, node, config, user = user_node
    proc, pid = _root_rank(node)
    try:
        res, snap, rank = _collect(c, config, node, pid, tmp_path, "--sudo")
    finally:
        proc.kill()
    assert rank.error is not None and rank.error.code == "sudo_password"
    assert "password" in rank.error.message and "NOPASSWD" in rank.error.hint
    assert f"{node.name}: sudo password" in res.stdout
