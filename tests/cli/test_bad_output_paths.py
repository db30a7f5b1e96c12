"""Issue 25, bad input: output paths (--snapshot, --export and its DIR.tar.gz, --json) are regular files or new,
never a device node, a FIFO, a symlink or a directory, never in /proc, /sys or /dev, never an input of the same
command; refused before anything connects (exit 2, one line naming the path and the reason), and nothing at the
path is touched. Device nodes, FIFOs and symlinks are made in the test's own temporary directory (mknod as root);
/proc and /sys are only ever named inside a private mount namespace where they are read-only.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.inputs import paths

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests" / "data" / "scenarios" / "skip.json"


def _refused(capsys, argv: list) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def _picture(d: Path) -> dict:
    """Every entry of d: type, device numbers, link target, size and content (what must not change)."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = os.lstat(p)
        content = p.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        out[p.name] = (stat.S_IFMT(st.st_mode), st.st_rdev, os.readlink(p) if p.is_symlink() else "", st.st_ino,
                       content)
    return out


@pytest.fixture
def specials(tmp_path: Path) -> Path:
    """A directory holding a character device (1,3 like /dev/null), a FIFO, symlinks and a hosts file."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "target.txt").write_text("precious")
    (tmp_path / "link").symlink_to(tmp_path / "target.txt")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dir").mkdir()
    (tmp_path / "hosts").write_text("nodeA\n")
    return tmp_path


@pytest.mark.parametrize("name,reason", [("null", "character device"), ("fifo", "FIFO"), ("link", "symlink"),
                                          ("dangling", "symlink"), ("loop", "symlink"), ("dir", "directory"),
                                          ("hosts", "reads")])
@pytest.mark.parametrize("flag", ["--snapshot", "--json"])
def test_a_file_output_that_is_not_a_regular_file_is_refused_even_with_force(capsys, specials: Path, name: str,
                                                                             reason: str, flag: str) -> None:
    before = _picture(specials)
    mode = ["--print"] if flag == "--snapshot" else ["--test", "sanity"]
    line = _refused(capsys, [str(specials / "hosts"), *mode, flag, str(specials / name), "--force"])
    assert str(specials / name) in line and reason in line
    assert _picture(specials) == before


@pytest.mark.parametrize("name,reason", [("null", "character device"), ("fifo", "FIFO"), ("link", "symlink"),
                                          ("hosts", "not a directory")])
def test_an_export_path_that_is_not_a_directory_is_refused(capsys, specials: Path, name: str, reason: str) -> None:
    before = _picture(specials)
    line = _refused(capsys, ["--load", str(SNAPSHOT), "--export", str(specials / name), "--force"])
    assert str(specials / name) in line and reason in line
    assert _picture(specials) == before


@pytest.mark.parametrize("name,reason", [("null", "character device"), ("fifo", "FIFO"), ("link", "symlink")])
def test_the_tarball_beside_an_export_is_checked_too(capsys, specials: Path, name: str, reason: str) -> None:
    os.rename(specials / name, specials / "out.tar.gz")
    before = _picture(specials)
    line = _refused(capsys, ["--load", str(SNAPSHOT), "--export", str(specials / "out"), "--tar", "--force"])
    assert "out.tar.gz" in line and reason in line
    assert _picture(specials) == before


def test_a_device_inside_an_earlier_bundle_is_never_replaced(capsys, specials: Path) -> None:
    out = specials / "bundle"
    assert main(["--load", str(SNAPSHOT), "--export", str(out)]) == 0
    (out / "summary.md").unlink()
    os.mknod(out / "summary.md", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    capsys.readouterr()
    line = _refused(capsys, ["--load", str(SNAPSHOT), "--export", str(out), "--force"])
    assert "summary.md" in line and "character device" in line
    assert stat.S_ISCHR(os.lstat(out / "summary.md").st_mode)


def test_the_load_file_is_never_overwritten_by_its_own_export(capsys, tmp_path: Path) -> None:
    assert main(["--load", str(SNAPSHOT), "--export", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    loaded = tmp_path / "b" / "snapshot.json"
    before = loaded.read_bytes()
    line = _refused(capsys, ["--load", str(loaded), "--export", str(tmp_path / "b"), "--force"])
    assert "which this command reads" in line
    assert loaded.read_bytes() == before


@pytest.mark.parametrize("make,reason", [
    (lambda d: str(d / "missing" / "out.json"), "parent directory does not exist"),
    (lambda d: str(d / "hosts" / "out.json"), "not a directory"),
    (lambda d: str(d / "out.json") + "/", "names a directory"),
    (lambda d: str(d / ("x" * 300)), "too long"),
    (lambda d: str(d / "out.json"), "exists; pass --force"),
])
def test_a_path_that_cannot_be_written_is_found_up_front(capsys, tmp_path: Path, make, reason: str) -> None:
    (tmp_path / "hosts").write_text("nodeA\n")
    (tmp_path / "out.json").write_text("someone's")
    line = _refused(capsys, [str(tmp_path / "hosts"), "--print", "--snapshot", make(tmp_path)])
    assert reason in line
    assert (tmp_path / "out.json").read_text() == "someone's"


def test_an_unwritable_directory_is_found_before_collecting(tmp_path: Path) -> None:
    """As a user who cannot write there (root can write anywhere but a read-only mount): a child imports the
    checker, then drops to nobody (who may not read root's Python) and runs the check."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    os.chmod(tmp_path, 0o755)
    code = (f"import os, sys; sys.path.insert(0, {str(REPO)!r}); "
            f"from app.inputs.paths import check_file, UnsafeOutputError; os.setgid(65534); os.setuid(65534)\n"
            f"try:\n check_file({str(locked / 'o.json')!r}, flag='--snapshot', force=False, writable=True)\n"
            f"except UnsafeOutputError as e:\n print(e)")
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to nobody")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "permission denied" in res.stdout, res.stderr


def test_a_read_only_file_system_is_found_before_collecting(capsys, tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private read-only mount")
    ro = tmp_path / "ro"
    ro.mkdir()
    (tmp_path / "hosts").write_text("nodeA\n")
    script = (f"mount -t tmpfs -o size=1m,ro tmpfs {ro} && cd {REPO} && exec {sys.executable} -m app "
              f"{tmp_path / 'hosts'} --print --snapshot {ro / 'out.json'}")
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "read-only file system" in res.stderr


@pytest.mark.parametrize("flag", ["--snapshot", "--export", "--load", "HOSTS", "--job", "-F", "-i", "--python"])
def test_an_empty_path_or_name_is_refused_not_taken_as_not_given(capsys, tmp_path: Path, flag: str) -> None:
    (tmp_path / "hosts").write_text("nodeA\n")
    argv = {"HOSTS": [""], "--load": ["--load", ""], "--job": [str(tmp_path / "hosts"), "--print", "--job", ""]}.get(
        flag, [str(tmp_path / "hosts"), "--print", flag, ""])
    line = _refused(capsys, argv)
    assert flag in line and "empty" in line


def test_proc_sys_and_dev_are_refused_in_a_namespace_where_they_are_read_only(tmp_path: Path) -> None:
    """The checks refuse these paths by where they resolve to; the test still runs them where /proc and /sys
    cannot be written (a private mount namespace, every mount under them remounted read-only and checked)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("findmnt") is None:
        pytest.skip("needs root, unshare and findmnt")
    (tmp_path / "hosts").write_text("nodeA\n")
    targets = ["/proc/sys/kernel/hangscope-test", "/proc/self/fd/1", "/sys/kernel/hangscope-test.json",
               "/sys/kernel/mm/transparent_hugepage/enabled", "/dev/hangscope-test.json", "/proc/nonexistent/x"]
    checks = "\n".join(
        f"out=$({sys.executable} -m app {tmp_path / 'hosts'} --print --snapshot {t} --force 2>&1); "
        f"echo \"$?|$out\"" for t in targets)
    script = f"""set -e
for m in $(findmnt -R -n -r -o TARGET /proc) $(findmnt -R -n -r -o TARGET /sys); do
  mount -o remount,bind,ro "$m" 2>/dev/null || mount -o remount,ro "$m"
done
{sys.executable} -c "
import os, subprocess
for top in ('/proc', '/sys'):
    for m in subprocess.check_output(['findmnt', '-R', '-n', '-r', '-o', 'TARGET', top]).split():
        assert os.statvfs(m).f_flag & os.ST_RDONLY, m
"
set +e
cd {REPO}
{checks}
"""
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in res.stdout.splitlines() if "|" in line]
    assert len(lines) == len(targets), res.stdout + res.stderr
    for target, line in zip(targets, lines):
        code, _, message = line.partition("|")
        assert code == "2" and target in message and "\n" not in message, (target, line)


def test_the_writer_links_a_new_file_and_replaces_only_a_regular_one(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    paths.write_file(str(out), b"one", force=False)
    assert out.read_bytes() == b"one" and stat.S_IMODE(out.stat().st_mode) == 0o600
    with pytest.raises(paths.OutputExistsError):
        paths.write_file(str(out), b"two", force=False)
    paths.write_file(str(out), b"two", force=True)
    assert out.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary file left


def test_a_lone_surrogate_in_a_snapshot_is_written_not_a_traceback(capsys, tmp_path: Path) -> None:
    doc = json.loads(SNAPSHOT.read_text())
    doc["snapshot"]["nodes"][0]["name"] = "node\udfff"
    path = tmp_path / "in.json"
    path.write_text(json.dumps(doc))  # ensure_ascii: the file holds the escape \udfff, as a hand edit would
    assert main(["--load", str(path), "--export", str(tmp_path / "b"), "--tar"]) == 0
    assert "\ufffd" in (tmp_path / "b" / "snapshot.json").read_text()
    assert "Traceback" not in capsys.readouterr().err
