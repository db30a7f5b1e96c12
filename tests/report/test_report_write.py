"""Writing the bundle: private modes whatever the umask, nothing overwritten without force, no symlink
followed, and a full or read-only disk reported with the bundle kept in memory for a retry elsewhere.

The full and read-only filesystems are real: small tmpfs mounts this test makes (root only, like the
cluster tests) and removes in `finally`.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Iterator

import pytest

from app.analysis import analyze
from app.errors import InputError
from app.report import (BundleExistsError, BundleWriteError, UnsafePathError, build_bundle, export_bundle,
                        write_bundle)
from test_report_build import make_snapshot


@pytest.fixture(scope="module")
def data():  # type: ignore[no-untyped-def]
    snap = make_snapshot("barrier", failed_node=True)
    return snap, analyze(snap)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
def test_files_are_0600_in_a_0700_directory_whatever_the_umask(tmp_path: Path, data, umask: int) -> None:
    old = os.umask(umask)
    try:
        result = export_bundle(*data, str(tmp_path / "out"), tar=True)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "out") == 0o700
    assert sorted(Path(p).name for p in result.paths) == sorted(
        ["manifest.json", "summary.md", "report.html", "snapshot.json", "stacks.speedscope.json",
         "stacks.collapsed.txt", "out.tar.gz"])
    for p in result.paths:
        assert _mode(Path(p)) == 0o600, p
    assert not [p for p in os.listdir(tmp_path / "out") if p.startswith(".")]  # no temp files left
    with tarfile.open(result.tarball) as tf:  # type: ignore[arg-type]
        members = tf.getmembers()
    assert members[0].name == "out" and members[0].isdir() and members[0].mode == 0o700
    assert all(m.mode == 0o600 and m.uname == "" and m.uid == 0 for m in members[1:])
    assert {m.name for m in members[1:]} == {f"out/{Path(p).name}" for p in result.paths[:-1]}


def test_an_existing_path_needs_force_and_force_replaces_an_earlier_bundle(tmp_path: Path, data) -> None:
    out = tmp_path / "out"
    export_bundle(*data, str(out))
    before = (out / "report.html").read_bytes()
    with pytest.raises(BundleExistsError) as info:
        export_bundle(*data, str(out))
    assert isinstance(info.value, InputError) and "--force" in str(info.value) + info.value.hint
    (out / "summary.md").write_text("stale")
    export_bundle(*data, str(out), force=True)
    assert (out / "summary.md").read_text().startswith("# hangscope report")
    assert (out / "report.html").read_bytes() == before
    # the tarball's path is checked before anything is written
    (tmp_path / "fresh.tar.gz").write_bytes(b"someone's file")
    with pytest.raises(BundleExistsError):
        export_bundle(*data, str(tmp_path / "fresh"), tar=True)
    assert not (tmp_path / "fresh").exists()
    assert (tmp_path / "fresh.tar.gz").read_bytes() == b"someone's file"
    export_bundle(*data, str(tmp_path / "fresh"), tar=True, force=True)
    assert tarfile.is_tarfile(tmp_path / "fresh.tar.gz")


def test_force_never_writes_into_a_directory_that_is_not_a_bundle(tmp_path: Path, data) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    (home / "notes.txt").write_text("mine")
    with pytest.raises(UnsafePathError):
        export_bundle(*data, str(home), force=True)
    assert os.listdir(home) == ["notes.txt"] and _mode(home) == 0o755


def test_a_symlink_is_never_followed(tmp_path: Path, data) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "link").symlink_to(victim)
    for force in (False, True):
        for path in (str(tmp_path / "link"), str(tmp_path / "link") + "/"):  # a trailing / must not follow it
            with pytest.raises(UnsafePathError):
                export_bundle(*data, path, force=force)
    assert os.listdir(victim) == []

    # a symlink planted at a file name inside an earlier bundle is replaced, its target untouched
    out = tmp_path / "out"
    export_bundle(*data, str(out))
    target = tmp_path / "precious.txt"
    target.write_text("precious")
    (out / "summary.md").unlink()
    (out / "summary.md").symlink_to(target)
    export_bundle(*data, str(out), force=True)
    assert target.read_text() == "precious"
    assert not (out / "summary.md").is_symlink() and _mode(out / "summary.md") == 0o600

    # and a symlink where the tarball goes is refused, even with force
    (tmp_path / "t.tar.gz").symlink_to(target)
    with pytest.raises(UnsafePathError):
        export_bundle(*data, str(tmp_path / "t"), force=True, tar=True)
    assert target.read_text() == "precious" and not (tmp_path / "t").exists()


def test_a_missing_parent_is_a_clear_error(tmp_path: Path, data) -> None:
    with pytest.raises(Exception) as info:
        export_bundle(*data, str(tmp_path / "no" / "such" / "dir"))
    assert "parent directory does not exist" in str(info.value)


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True,
                   capture_output=True, timeout=10)


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[list]:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("root is needed to mount a small tmpfs; env CI is set", pytrace=False)
        pytest.skip("needs root to mount a small tmpfs")
    made: list = []
    try:
        yield made
    finally:
        for m in reversed(made):
            subprocess.run(["umount", "-l", str(m)], capture_output=True, timeout=10)


def test_a_full_disk_is_reported_and_the_bundle_kept_for_a_retry(tmp_path: Path, data, mounts: list) -> None:
    small = tmp_path / "small"
    _mount_tmpfs(small, "32k")
    mounts.append(small)
    bundle = build_bundle(*data)
    assert sum(map(len, bundle.files.values())) > 64 * 1024  # more than fits
    with pytest.raises(BundleWriteError) as info:
        write_bundle(bundle, str(small / "out"))
    err = info.value
    assert "no space left" in str(err) and "another directory" in err.hint
    assert err.bundle is bundle and err.pending  # what was not written, in memory
    assert set(err.pending) | {Path(p).name for p in err.written} == set(bundle.files)
    # measured before the first file: nothing written, not even the directory (no partial bundle, no temp file)
    assert err.written == () and set(err.pending) == set(bundle.files) and "nothing was written" in str(err)
    assert not (small / "out").exists()
    retry = write_bundle(err.bundle, str(tmp_path / "elsewhere"))  # type: ignore[arg-type]
    for p in retry.paths:
        assert Path(p).read_bytes() == bundle.files[Path(p).name]


def test_a_read_only_disk_is_reported_and_nothing_is_lost(tmp_path: Path, data, mounts: list) -> None:
    ro = tmp_path / "ro"
    _mount_tmpfs(ro, "1m")
    mounts.append(ro)
    subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True, capture_output=True, timeout=10)
    with pytest.raises(BundleWriteError) as info:
        export_bundle(*data, str(ro / "out"))
    err = info.value
    assert "read-only" in str(err) and err.written == ()
    assert err.bundle is not None and set(err.pending) == set(err.bundle.files)  # type: ignore[attr-defined]
