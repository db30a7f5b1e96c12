"""The `hangscope` command as a user runs it: help, versions, bad input refused with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def hangscope(*args: str, stdin: bytes | None = None, cwd: Path | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], input=stdin, capture_output=True,
                          cwd=cwd or REPO, timeout=timeout, env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_help_shows_usage_and_examples():
    res = hangscope("--help")
    assert res.returncode == 0
    out = res.stdout.decode()
    assert "usage: hangscope" in out
    assert "hangscope hosts.txt --snapshot out.json" in out
    assert "hangscope demo" in out
    assert "exit codes" in out


def test_version_lists_the_tools_it_drives():
    res = hangscope("--version")
    assert res.returncode == 0
    out = res.stdout.decode()
    from app import __version__
    assert f"hangscope {__version__}" in out
    for name in ("asyncssh 2.24.1", "textual 8.2.8", "py-spy 0.4.3"):
        assert name in out


@pytest.mark.parametrize("line,reason", [
    ("-oProxyCommand=touch /tmp/hangscope-pwned", "-oProxyCommand"),
    ("node1;id", "node1;id"),
    ("$(id)", "$(id)"),
    ("`id`", "`id`"),
])
def test_hostile_hosts_file_is_refused_before_connecting(tmp_path, line, reason):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"node01\n# fine\n{line}\n")
    res = hangscope(str(hosts), "--snapshot", str(tmp_path / "out.json"))
    assert res.returncode == 2, res.stderr
    err = res.stderr.decode()
    assert f"{hosts}:3" in err and reason in err
    assert not (tmp_path / "out.json").exists()
    assert not Path("/tmp/hangscope-pwned").exists()


@pytest.mark.parametrize("make,expect", [
    (lambda d: d / "missing.txt", "missing.txt"),
    (lambda d: d, "directory"),
])
def test_unusable_hosts_path_exits_2_naming_it(tmp_path, make, expect):
    res = hangscope(str(make(tmp_path)))
    assert res.returncode == 2
    assert expect in res.stderr.decode().lower() or str(tmp_path) in res.stderr.decode()


def test_empty_hosts_file_exits_2(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# only a comment\n\n")
    res = hangscope(str(hosts))
    assert res.returncode == 2
    assert "no hosts" in res.stderr.decode()


def test_hosts_from_stdin_are_validated_too():
    res = hangscope("-", stdin=b"node01\nnode02 slots=x\n")
    assert res.returncode == 2
    assert "<stdin>:2" in res.stderr.decode()


def test_native_with_nonblocking_is_refused():
    res = hangscope("--native", "--nonblocking")
    assert res.returncode == 2
    assert "--nonblocking" in res.stderr.decode()


def test_existing_snapshot_file_is_not_overwritten(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("precious")
    res = hangscope("-w", "node01", "--snapshot", str(out))
    assert res.returncode == 2
    assert "--force" in res.stderr.decode()
    assert out.read_text() == "precious"


@pytest.mark.parametrize("content,expect", [
    (b"not json", "not JSON"),
    (b'{"schema": "something else"}', "not a hangscope snapshot"),
    (b"\xff\xfe\x00garbage", "not"),
])
def test_load_rejects_what_is_not_a_snapshot(tmp_path, content, expect):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    res = hangscope("--load", str(bad), "--print")
    assert res.returncode == 2
    assert expect in res.stderr.decode()


def test_tui_refused_without_a_terminal_with_a_hint(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node01\n")
    res = hangscope(str(hosts))  # stdout is a pipe here
    assert res.returncode == 2
    err = res.stderr.decode()
    assert "not a terminal" in err and "--snapshot" in err and "--print" in err


def test_a_bad_match_pattern_is_refused_before_connecting(tmp_path):
    res = hangscope("--match", "train([", "--print")
    assert res.returncode == 2
    assert "--match 'train([' is not a regular expression" in res.stderr.decode()


def test_match_picks_ranks_discovery_cannot_see(tmp_path):
    """A python process with no rank environment and no torch, which discovery alone never takes for a rank:
    --match on its command line picks it, says so (found_by), and dumps it."""
    from worker_targets import PROG, Target, wait_blocked

    tag = f"hsmatch-cli-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    with Target([sys.executable, PROG, "rank", tag], env=env) as t:
        pid = int(t.ready[0])
        wait_blocked(pid)
        snap = tmp_path / "snap.json"
        res = hangscope("--match", f"rank {tag}$", "--print", "--samples", "1", "--snapshot", str(snap))
        out = res.stdout.decode()
        assert res.returncode == 0, (out, res.stderr.decode())
        import json
        (rank,) = json.loads(snap.read_text())["snapshot"]["ranks"]
        assert rank["pid"] == pid and rank["found_by"] == "--match"
        assert "train" in out  # its stack was dumped: the rank waits in train()
