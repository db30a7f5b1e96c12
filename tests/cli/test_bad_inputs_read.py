"""Issue 25, bad input: a file hangscope reads (HOSTS, --load, -F, -i, ~/.ssh/config and what it Includes,
known_hosts) that is a FIFO with no writer or a device never blocks: its type is checked before it is opened,
and it is refused with exit 2 and one line naming it. A snapshot with a lone surrogate or absurd values ends
in a message or bounded values, never a traceback, at load and at export. FIFOs and device nodes are made in
the test's own temporary directory; the timeout marks catch a regression that would block."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from app.cli import main

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests" / "data" / "scenarios" / "skip.json"
pytestmark = pytest.mark.timeout(60)


def _refused(capsys, argv: list) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    """A FIFO nobody writes to, a zero device (1,5), a directory, a symlink loop and a dangling link."""
    os.mkfifo(tmp_path / "fifo")
    if os.geteuid() == 0:
        os.mknod(tmp_path / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    (tmp_path / "dir").mkdir()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "hosts").write_text("nodeA\n")
    return tmp_path


KINDS = [("fifo", "FIFO"), ("zero", "character device"), ("dir", "directory"), ("loop", "symlink loop"),
         ("dangling", "no such file")]


def _kind(bad: Path, name: str) -> str:
    if not (bad / name).exists() and not (bad / name).is_symlink():
        pytest.skip("mknod needs root")
    return str(bad / name)


@pytest.mark.parametrize("name,reason", KINDS)
def test_a_hosts_file_that_is_not_a_regular_file_is_refused_without_blocking(capsys, bad: Path, name: str,
                                                                             reason: str) -> None:
    path = _kind(bad, name)
    line = _refused(capsys, [path, "--print"])
    assert path in line and reason in line


@pytest.mark.parametrize("name,reason", KINDS)
def test_a_load_file_that_is_not_a_regular_file_is_refused_without_blocking(capsys, bad: Path, name: str,
                                                                            reason: str) -> None:
    path = _kind(bad, name)
    line = _refused(capsys, ["--load", path, "--print"])
    assert path in line and reason in line


@pytest.mark.parametrize("flag", ["-F", "-i"])
@pytest.mark.parametrize("name,reason", KINDS)
def test_ssh_files_that_are_not_regular_files_are_refused_before_connecting(capsys, bad: Path, flag: str,
                                                                            name: str, reason: str) -> None:
    path = _kind(bad, name)
    line = _refused(capsys, [str(bad / "hosts"), "--print", flag, path])
    assert path in line and reason in line


@pytest.mark.parametrize("where", ["config", "known_hosts"])
def test_the_default_ssh_files_are_checked_too(capsys, bad: Path, monkeypatch, where: str) -> None:
    home = bad / "home"
    (home / ".ssh").mkdir(parents=True)
    os.mkfifo(home / ".ssh" / where)
    monkeypatch.setenv("HOME", str(home))
    line = _refused(capsys, [str(bad / "hosts"), "--print"])
    assert str(home / ".ssh" / where) in line and "FIFO" in line


def test_an_ssh_config_that_includes_itself_is_refused(capsys, tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Include {cfg}\nHost *\n  User root\n")
    (tmp_path / "hosts").write_text("nodeA\n")
    line = _refused(capsys, [str(tmp_path / "hosts"), "--print", "-F", str(cfg)])
    assert "includes itself" in line


def test_an_ssh_config_that_includes_a_fifo_skips_it_as_ssh_does(tmp_path: Path) -> None:
    from app.transport.files import check_ssh_files

    os.mkfifo(tmp_path / "extra")
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Include {tmp_path / 'extra'}\n")
    check_ssh_files([str(cfg)], [])  # returns: a FIFO is not a file asyncssh would include


def test_a_huge_ssh_config_is_refused(capsys, tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.write_text("Host x\n" * 200_000)
    (tmp_path / "hosts").write_text("nodeA\n")
    line = _refused(capsys, [str(tmp_path / "hosts"), "--print", "-F", str(cfg)])
    assert "bytes" in line and str(cfg) in line


def _load(tmp_path: Path, change) -> Path:
    doc = json.loads(SNAPSHOT.read_text())
    text = change(doc) or json.dumps(doc)
    path = tmp_path / "in.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize("change,field", [
    (lambda d: json.dumps(d).replace(f'"pid": {d["snapshot"]["ranks"][0]["pid"]}', '"pid": ' + "9" * 30, 1),
     "pid"),
    (lambda d: json.dumps(d).replace(f'"pid": {d["snapshot"]["ranks"][0]["pid"]}', '"pid": ' + "9" * 5000, 1),
     "pid"),
    (lambda d: json.dumps(d).replace(f'"taken_at": {d["snapshot"]["taken_at"]}', '"taken_at": 1e999', 1),
     "taken_at"),
    (lambda d: json.dumps(d).replace(f'"taken_at": {d["snapshot"]["taken_at"]}', '"taken_at": NaN', 1),
     "taken_at"),
])
def test_absurd_values_in_a_snapshot_are_refused_naming_the_field(capsys, tmp_path: Path, change, field) -> None:
    line = _refused(capsys, ["--load", str(_load(tmp_path, change)), "--print"])
    assert field in line and "out of range" in line


@pytest.mark.parametrize("where", ["name", "key"])
def test_a_lone_surrogate_is_printed_and_exported_as_u_fffd(capsys, tmp_path: Path, where: str) -> None:
    def change(d: dict) -> None:
        rank = d["snapshot"]["ranks"][0]
        if where == "name":
            rank["cmdline"] = ["python", "train\udfff.py"]
        else:
            rank.setdefault("env", {})
            rank["cmdline"] = ["python", "x"]
            d["analysis"] = {"\udfff": "\ud800"}
    path = _load(tmp_path, change)
    assert "\\udfff" in path.read_text()
    assert main(["--load", str(path), "--export", str(tmp_path / "b"), "--tar"]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert (tmp_path / "b.tar.gz").exists()


def test_a_time_outside_the_calendar_is_shown_as_unknown(capsys, tmp_path: Path) -> None:
    path = _load(tmp_path, lambda d: d["snapshot"].update(taken_at=9e14))
    assert main(["--load", str(path), "--export", str(tmp_path / "b")]) == 0
    assert "at an unknown time" in (tmp_path / "b" / "summary.md").read_text()


def test_load_reads_stdin_but_not_a_closed_or_terminal_one(capsys, monkeypatch) -> None:
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(SNAPSHOT.read_bytes())))
    monkeypatch.setattr("app.cli.headless.stdin_problem", lambda: None)
    assert main(["--load", "-", "--print"]) == 0
    assert "iteration ahead" in capsys.readouterr().out
    monkeypatch.setattr("app.cli.headless.stdin_problem", lambda: "stdin is closed")
    assert "stdin is closed" in _refused(capsys, ["--load", "-", "--print"])
