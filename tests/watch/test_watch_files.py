"""The watch's --out directory: created private, refused when a link, a file, another user's or writable by
others; capture names that never collide; at most --keep captures, removed without following links; a history
that rotates within its bound and never blocks on a FIFO planted in its place."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from app.errors import InputError
from app.watch import outdir
from app.watch.outdir import HISTORY, HISTORY_OLD, OutDir


def test_the_directory_is_created_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        OutDir(str(tmp_path / "w"), 3).prepare()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(tmp_path / "w").st_mode) == 0o700


@pytest.mark.parametrize("kind", ["symlink", "file", "world-writable", "group-writable"])
def test_an_unsafe_out_directory_is_refused(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    path = tmp_path / "out"
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "file":
        path.write_text("x")
    else:
        path.mkdir()
        path.chmod(0o777 if kind == "world-writable" else 0o770)
    with pytest.raises(InputError) as err:
        OutDir(str(path), 3).prepare()
    assert str(path) in str(err.value)
    assert not list(target.iterdir()), "nothing written through the link"


@pytest.mark.parametrize("path", ["/proc", "/dev", "/sys/kernel", "/dev/hangscope-watch-test", "/proc/sys/out"])
def test_a_directory_in_a_kernel_tree_is_refused_before_anything_is_created_or_changed(path: str) -> None:
    """/dev exists and is root's, 0755: it passed the ownership and mode checks, and was then chmod'ed 0700 and
    written into (history.jsonl) by a root watch (the blind inputs-w set). Refused by where it is, first."""
    parent = os.path.dirname(path)
    before = {p: os.lstat(p).st_mode for p in (path, parent) if os.path.lexists(p)}
    with pytest.raises(InputError, match="never writes into kernel interfaces"):
        OutDir(path, 3).prepare()
    assert {p: os.lstat(p).st_mode for p in before} == before
    assert path in before or not os.path.lexists(path)


def test_an_existing_directory_is_used_as_it_is_its_mode_never_changed(tmp_path: Path) -> None:
    """The user's own directory (`--out .`, a home directory, 0755): used, its mode left alone; only a directory
    hangscope creates is made 0700 (the captures inside are private whatever the directory's mode)."""
    path = tmp_path / "mine"
    path.mkdir()
    path.chmod(0o755)
    (path / "notes.txt").write_text("the user's")
    OutDir(str(path), 3).prepare()
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert (path / "notes.txt").read_text() == "the user's"


def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory owned by another user")
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(InputError, match="another user"):
        OutDir(str(path), 3).prepare()


def _bundle(path: str) -> None:
    os.mkdir(path, 0o700)
    Path(path, "manifest.json").write_text("{}")
    Path(path, "snapshot.json").write_text("{}")


def test_capture_names_never_collide_and_keep_only_safe_characters(tmp_path: Path) -> None:
    out = OutDir(str(tmp_path), 3)
    first = out.capture_path("hang", "10.0.0.1:29500 ; rm -rf /", at=0)
    name = os.path.basename(first)
    assert outdir.CAPTURE_NAME.match(name) and "/" not in name and ";" not in name and " " not in name
    _bundle(first)
    second = out.capture_path("hang", "10.0.0.1:29500 ; rm -rf /", at=0)
    assert second != first and outdir.CAPTURE_NAME.match(os.path.basename(second))


def test_at_most_keep_captures_stay_and_links_inside_are_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    root = tmp_path / "out"
    out = OutDir(str(root), 2)
    out.prepare()
    paths = [out.capture_path("hang", "job", at=1000 + i) for i in range(4)]
    for p in paths:
        _bundle(p)
    os.symlink(victim / "precious", os.path.join(paths[0], "stacks.collapsed.txt"))
    (root / "20200101-000000-hang-notabundle").mkdir()  # no manifest: not ours to remove
    removed = out.prune()
    assert removed == paths[:2]
    assert sorted(os.listdir(root)) == sorted(["20200101-000000-hang-notabundle"] + [os.path.basename(p) for p in paths[2:]])
    assert (victim / "precious").read_text() == "keep me"


def test_the_history_rotates_within_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outdir, "HISTORY_BYTES", 2000)
    out = OutDir(str(tmp_path), 3)
    for i in range(200):
        out.record({"t": i, "jobs": {"j": {"rate": 1.5}}})
    out.close()
    sizes = [os.path.getsize(tmp_path / n) for n in (HISTORY, HISTORY_OLD)]
    assert all(s <= 2000 for s in sizes)
    last = (tmp_path / HISTORY).read_text().splitlines()[-1]
    assert json.loads(last)["t"] == 199
    assert stat.S_IMODE(os.lstat(tmp_path / HISTORY).st_mode) == 0o600


def test_a_fifo_or_a_link_planted_as_the_history_is_never_written_through(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / HISTORY)
    out = OutDir(str(tmp_path), 3)
    out.record({"t": 1})  # must not block on the FIFO (no reader) nor write into it
    out.close()
    assert stat.S_ISFIFO(os.lstat(tmp_path / HISTORY).st_mode)
    os.unlink(tmp_path / HISTORY)
    target = tmp_path / "elsewhere"
    target.write_text("")
    os.symlink(target, tmp_path / HISTORY)
    out.record({"t": 2})
    out.close()
    assert target.read_text() == ""
