"""app/transport/sshconfig.py and sshlib.py: an ssh config read once per process gives every host what asyncssh's
own parser gives it, and importing asyncssh starts no compiler.

What a user relies on: hangscope honours their ~/.ssh/config for each node exactly as before, however the file is
written (Host and Match blocks, negations, `=` forms, Include, % tokens, quoting, errors), and a config with a
block per node does not cost the login node a read of the whole file for every node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from app.transport import sshconfig
from app.transport.sshconfig import HostConfig
from app.transport.sshlib import asyncssh, find_library_without_compiler

CONFIG = """\
# a comment, then blank lines

Host node* !node07
    User = trainer
    Port=2222
    IdentityFile ~/.ssh/id_%h
    ServerAliveInterval 15
Host node07
    HostName "10.0.0.7"
    ProxyJump bastion
    SetEnv A=1 "B=two words"
Host NODE01,node12 x[1] ,
    ConnectTimeout 7
Host gpu-? login
    ConnectTimeout 5
    ForwardAgent yes
Match host node1*,gpu-* user {user}
    Compression yes
    Ciphers aes128-gcm@openssh.com,aes256-ctr
Match !host node2*
    RekeyLimit 1G 1h
Include {include}
Host *
    User fallback
    Port 22
    ServerAliveCountMax 3
    IdentityFile ~/.ssh/id_default
    RemoteCommand echo %r@%h:%p
"""

INCLUDED = """\
Host node3*
    HostKeyAlias cluster-%n
    GlobalKnownHostsFile /etc/ssh/k1 /etc/ssh/k2
"""

HOSTS = ["node01", "node07", "node12", "node25", "node33", "gpu-a", "gpu-ab", "login", "other", "NODE01", "x[1]", "x1",
         ""]


def _options(cls: type, paths: List[Path], host: str, user: str = "") -> Dict[str, Any]:
    cfg = cls.load(None, [str(p) for p in paths], False, False, False, "localuser", user or (), host, ())
    return dict(cfg._options)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    inc = tmp_path / "included.conf"
    inc.write_text(INCLUDED)
    path = tmp_path / "config"
    path.write_text(CONFIG.format(include=inc, user="localuser"))
    return path


def test_every_host_gets_the_options_asyncssh_gives_it(config: Path) -> None:
    for host in HOSTS:
        for user in ("", "someone"):
            ours = _options(HostConfig, [config], host, user)
            theirs = _options(asyncssh.config.SSHClientConfig, [config], host, user)
            assert ours == theirs, host
            assert ours, host
    # a few of them, as a user reads the file
    assert _options(HostConfig, [config], "node01")["User"] == "trainer"
    assert _options(HostConfig, [config], "node07")["Hostname"] == "10.0.0.7"
    assert _options(HostConfig, [config], "other")["User"] == "fallback"
    assert "HostKeyAlias" in _options(HostConfig, [config], "node33")
    # a Host line of plain names is decided by equality: exact and case-sensitive, brackets literal
    assert _options(HostConfig, [config], "node12")["ConnectTimeout"] == 7
    assert _options(HostConfig, [config], "x[1]")["ConnectTimeout"] == 7
    assert "ConnectTimeout" not in _options(HostConfig, [config], "node01")


def test_a_second_file_and_a_changed_file_are_read_again(config: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.write_text("Host node01\n    User first\n")
    assert _options(HostConfig, [extra, config], "node01")["User"] == "first"  # first value wins across files
    assert _options(HostConfig, [config, extra], "node01")["User"] == "trainer"
    extra.write_text("Host node01\n    User changed-since\n")
    st = extra.stat()
    os.utime(extra, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a clock's tick: a new mtime
    assert _options(HostConfig, [extra, config], "node01")["User"] == "changed-since"


@pytest.mark.parametrize("text, message", [
    ('Host a\n    User "unclosed\n', "No closing quotation"),
    ("Host *\n    Port\n", "Missing Port value"),
    ("Host *\n    Port 22 23\n", "Extra data at end"),
    ("Host *\n    Port twenty\n", "Invalid Port integer value"),
])
def test_errors_are_asyncssh_s_own_on_the_same_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad"
    path.write_text(text)
    errors = []
    for cls in (HostConfig, asyncssh.config.SSHClientConfig):
        with pytest.raises(asyncssh.config.ConfigParseError) as exc:
            _options(cls, [path], "node01")
        errors.append(str(exc.value))
    assert errors[0] == errors[1] and message in errors[0]


def test_a_config_with_a_block_per_node_is_tokenized_once(tmp_path: Path) -> None:
    path = tmp_path / "config"
    with path.open("w") as f:
        f.write("Host *\n    ServerAliveInterval 10\n")
        for i in range(2000):
            f.write(f"Host node{i:04d}\n    HostName 10.0.{i // 250}.{i % 250}\n    User u{i}\n    Port 22\n")
    sshconfig._cache.clear()
    _options(HostConfig, [path], "node0000")
    tokens = sshconfig._cache[str(path)][1]
    for i in (1, 999, 1999):
        ours = _options(HostConfig, [path], f"node{i:04d}")
        assert ours["User"] == f"u{i}" and ours == _options(asyncssh.config.SSHClientConfig, [path], f"node{i:04d}")
    assert sshconfig._cache[str(path)][1] is tokens  # the file was not tokenized again for the other hosts


def test_a_missing_or_unreadable_file_is_left_to_asyncssh(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(OSError):
        _options(asyncssh.config.SSHClientConfig, [missing], "a")
    with pytest.raises(OSError):
        _options(HostConfig, [missing], "a")


def test_the_library_search_finds_what_the_loader_would_load_without_starting_a_process(tmp_path: Path,
                                                                                        monkeypatch: Any) -> None:
    lib = tmp_path / "libhsfake.so.3.1"
    lib.write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nonexistent:{tmp_path}")
    assert find_library_without_compiler("hsfake") == str(lib)
    assert find_library_without_compiler("hsfake-absent") is None
    libc = find_library_without_compiler("c")
    assert libc is not None and Path(libc).name.startswith("libc.so")


def test_importing_the_transport_starts_no_compiler_or_linker() -> None:
    # A fresh interpreter: ru_maxrss of RUSAGE_CHILDREN is 0 until a child process has been waited for.
    code = ("import resource, app.transport.ssh; "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 0, "a child process ran while asyncssh was imported (ldconfig, gcc, ld)"
    if os.path.exists("/sbin/ldconfig") or os.path.exists("/usr/sbin/ldconfig"):
        # asyncssh imported on its own runs them (ctypes.util.find_library): the check above can fail
        stock = subprocess.run([sys.executable, "-c", "import resource, asyncssh; "
                                "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"],
                               capture_output=True, text=True, timeout=120)
        assert stock.returncode == 0 and int(stock.stdout) > 0
