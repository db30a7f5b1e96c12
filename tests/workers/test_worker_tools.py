"""Tools the worker needs and how it copes without them: missing py-spy, pushed py-spy, a py-spy that hangs,
ptrace denied for another user, sudo, and ranks inside a container (other pid and mount namespaces)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from worker_client import WorkerProc
from worker_targets import PROG, Target, proc_state, rank_env, start_rank, untouched, wait_blocked, without_sudo
from waiting import wait_until
from workers import procinfo
from workers.collect import runas
import testenv

PYSPY = str(testenv.PYSPY)
SYSTEM_PYTHON = "/usr/bin/python3"  # a python without py-spy next to it, runnable by any user
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

# A FAKE py-spy, for the one fault that cannot be produced on demand with the real one: a dump that hangs
# after stopping its target (a wedged attach). It stops the target, then sleeps past any deadline.
FAKE_HANGING_PYSPY = b"""#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = --pid ] && pid=$2; shift; done
kill -STOP "$pid"
exec sleep 1000
"""


def push(w: WorkerProc, data: bytes, name: str = "py-spy") -> dict:
    _, done = w.call("push_tool", {"name": name, "data_b64": base64.b64encode(data).decode(),
                                   "sha256": hashlib.sha256(data).hexdigest()}, timeout=60)
    assert done["type"] == "done", done
    return done["data"]


def target_of(t: Target, pid: int = 0) -> dict:
    pid = pid or t.pid
    return {"pid": pid, "start_time": procinfo.start_time(pid)}


def needs(path: str) -> None:
    # each is installed by tests/install-deps.sh (py-spy with the project): missing is a broken set-up, not a skip
    assert os.path.exists(path), "%s is missing: run `make test` (tests/install-deps.sh installs it)" % path


def test_missing_py_spy_lists_where_it_looked_then_a_pushed_one_works(tmp_path: str) -> None:
    needs(SYSTEM_PYTHON)
    needs(PYSPY)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    with start_rank(0, python=SYSTEM_PYTHON) as t, WorkerProc(python=SYSTEM_PYTHON, isolated=True, env=env) as w:
        assert w.hello["tools"]["py-spy"] is None
        assert "/usr/bin/py-spy" in w.hello["searched"]["py-spy"]
        item = w.call("dump", {"targets": [target_of(t)]})[0][0]
        assert item["error"]["code"] == "tool_missing"
        assert "/usr/bin/py-spy" in item["error"]["message"] and str(tmp_path) in item["error"]["message"]
        assert item["procfs"]["threads"]  # /proc data even without the tool
        with open(PYSPY, "rb") as f:
            pushed = push(w, f.read())
        item = w.call("dump", {"targets": [target_of(t)]})[0][0]
        assert item["ok"], item["error"]
        assert any(f["name"] == "wait_forever" for th in item["pyspy"] for f in th["frames"])
        assert pushed["path"] and untouched(t.pid)


def _env_folder(parent: Path, owner: int, spy: bytes | None = None, copy: bool = False) -> str:
    """A venv-like folder: bin/python (a symlink to the system python, as a venv's is; copy: the binary itself, as
    a conda env's is) and, given, a py-spy; both folders belong to `owner`. Returns the python's path (the rank's
    argv[0])."""
    bin_dir = parent / "bin"
    bin_dir.mkdir(parents=True)
    if copy:
        shutil.copy2(os.path.realpath(SYSTEM_PYTHON), bin_dir / "python")
    else:
        (bin_dir / "python").symlink_to(SYSTEM_PYTHON)
    if spy is not None:
        (bin_dir / "py-spy").write_bytes(spy)
        (bin_dir / "py-spy").chmod(0o755)
    for p in (parent, bin_dir, *(bin_dir / "py-spy",) * (spy is not None)):
        os.chown(p, owner, owner)
        if p.is_dir():
            p.chmod(0o755)
    return str(bin_dir / "python")


def test_a_py_spy_beside_the_venv_python_a_rank_was_started_by_is_found(tmp_path: Path) -> None:
    # the venv's bin/python is a symlink, so the rank's exe names /usr/bin: the folder it was started by is searched
    needs(SYSTEM_PYTHON)
    python = _env_folder(tmp_path / "venv", os.geteuid(), Path(PYSPY).read_bytes())
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    with start_rank(0, python=python) as t, WorkerProc(python=SYSTEM_PYTHON, isolated=True, env=env) as w:
        assert w.hello["tools"]["py-spy"] is None  # not on the worker's PATH nor beside its python
        item = w.call("dump", {"targets": [target_of(t)]})[0][0]
        assert item["ok"], item["error"]
        assert any(f["name"] == "wait_forever" for th in item["pyspy"] for f in th["frames"])


def test_a_root_worker_never_runs_a_tool_from_a_folder_the_ranks_user_controls(tmp_path: Path) -> None:
    """A conda env or a venv in a user's home: the worker runs as root to see every user's ranks, so a py-spy the
    user could have replaced must not run (it would run that user's code as root). The dump says where it looked
    and why that one was not used; a py-spy pushed by the login side still works."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the worker must run as another user than the folder's owner")
    needs(SYSTEM_PYTHON)
    marker = tmp_path / "ran-as-root"
    planted = f"#!/bin/sh\ntouch {marker}\nexit 1\n".encode()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    # the user's own folder, with the interpreter copied in (a conda env: the rank's exe is there) or linked (a
    # venv: the path it was started by is there); a folder of root's that anyone may write
    for owner, mode, copy in [(65534, 0o755, True), (65534, 0o755, False), (os.geteuid(), 0o777, False)]:
        folder = tmp_path / f"env-{owner}-{mode:o}-{copy}"
        python = _env_folder(folder, owner, planted, copy)
        (folder / "bin").chmod(mode)
        with start_rank(0, python=python) as t, WorkerProc(python=SYSTEM_PYTHON, isolated=True, env=env) as w:
            item = w.call("dump", {"targets": [target_of(t)]})[0][0]
            assert item["error"]["code"] == "tool_missing", item
            why = "bin/py-spy belongs to uid 65534" if owner == 65534 else "bin is writable by others"
            assert f"{folder}/bin/py-spy (not used: {folder}/{why})" in item["error"]["message"], \
                item["error"]["message"]
            assert not marker.exists(), "the planted py-spy ran"
            assert untouched(t.pid)
            with open(PYSPY, "rb") as f:
                push(w, f.read())
            assert w.call("dump", {"targets": [target_of(t)]})[0][0]["ok"]
    assert not marker.exists()


def test_a_hanging_dump_is_killed_at_its_deadline_and_the_target_resumed() -> None:
    with start_rank(0) as t, WorkerProc() as w:
        push(w, FAKE_HANGING_PYSPY)
        item = w.call("dump", {"targets": [target_of(t)], "timeout": 1.0}, timeout=30)[0][0]
        assert item["error"]["code"] == "timeout"
        assert 1.0 <= item["elapsed"] < 5
        assert item["state_before"] == "S" and item["resumed"] is True
        assert item["state_after"] in ("R", "S")  # running again (it may still be on its way back to sleep)
        wait_until(lambda: proc_state(t.pid) == "S" and untouched(t.pid), what="target back in its read")


def test_ptrace_denied_for_another_users_rank_still_gives_proc_data() -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to run the worker as another user")
    needs(SYSTEM_PYTHON)
    with start_rank(0) as t, WorkerProc(python=SYSTEM_PYTHON, isolated=True, prefix=AS_NOBODY) as w:
        with open(PYSPY, "rb") as f:
            push(w, f.read())
        item = w.call("dump", {"targets": [target_of(t)]})[0][0]
        assert item["error"]["code"] == "ptrace_denied", item
        assert "uid 65534" in item["error"]["message"] and "ptrace_scope" in item["error"]["message"]
        assert [th["state"] for th in item["procfs"]["threads"]] == ["S", "S"]
        _, err = w.call("strace", dict(target_of(t), seconds=0.2))
        assert err["code"] == "ptrace_denied"
        assert untouched(t.pid)


def test_sudo_without_sudo_installed_is_tool_missing_and_its_refusal_is_recognised(tmp_path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root for a mount namespace that hides sudo")
    with start_rank(0) as t, WorkerProc(prefix=without_sudo(str(tmp_path))) as w:
        assert w.hello["tools"]["sudo"] is None, "a node without sudo"
        item = w.call("dump", {"targets": [target_of(t)], "sudo": True})[0][0]
        assert item["error"]["code"] == "tool_missing" and "sudo" in item["error"]["message"]
        _, err = w.call("strace", dict(target_of(t), seconds=0.2, sudo=True))
        assert err["code"] == "tool_missing"
    # sudo -n's own words when a password would be needed (sudo 1.9)
    assert runas.sudo_error("sudo: a password is required\n") == "sudo: a password is required"
    assert runas.sudo_error("sudo: a terminal is required to read the password; either use ...") is not None
    assert runas.sudo_error("Error: Failed to find python version") is None


def test_rank_in_a_container_is_found_and_dumped_from_inside_its_namespaces() -> None:
    needs("/usr/bin/unshare")
    needs("/usr/bin/nsenter")
    if os.getuid() != 0:
        pytest.skip("needs root for new pid and mount namespaces")
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, PROG, "rank"]
    with Target(argv, env=rank_env(0)) as t, WorkerProc() as w:
        assert t.ready[0] == "1"  # pid 1 inside its own pid namespace
        with open("/proc/%d/task/%d/children" % (t.pid, t.pid)) as f:
            host_pid = int(f.read().split()[0])
        wait_blocked(host_pid)
        items, _ = w.call("discover")
        rank = {i["pid"]: i for i in items}[host_pid]
        assert rank["in_container"] is True and rank["nspid"] == 1
        item = w.call("dump", {"targets": [target_of(t, host_pid)], "native": True, "loops": True})[0][0]
        assert item["ok"], item
        assert item["notes"] == []  # entered the namespaces, not the degraded outside view
        main = next(th for th in item["pyspy"] if th["thread_name"] == "MainThread")
        assert any(f["name"] == "wait_forever" for f in main["frames"])
        assert any(k.startswith(PROG + ":") for k in item["loops"])  # source read via /proc/PID/root
        assert untouched(host_pid)


def test_a_sigkilled_worker_takes_along_a_tool_it_ran_inside_a_containers_namespaces() -> None:
    """A tool run in a rank's pid namespace is a forked child of whatever entered it (with `nsenter -p`, nsenter's),
    where the parent-death signal set in front does not reach. The worker SIGKILLed mid-dump (a py-spy wedged on
    its attach) must still take the tool along: it would keep the rank stopped."""
    needs("/usr/bin/unshare")
    if os.getuid() != 0:
        pytest.skip("needs root for new pid and mount namespaces")
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, PROG, "rank"]
    with Target(argv, env=rank_env(0)) as t, WorkerProc() as w:
        with open("/proc/%d/task/%d/children" % (t.pid, t.pid)) as f:
            host_pid = int(f.read().split()[0])
        wait_blocked(host_pid)
        push(w, FAKE_HANGING_PYSPY)

        rank_ns = os.readlink(f"/proc/{host_pid}/ns/pid")

        def tool() -> int:  # the FAKE py-spy, become `sleep 1000` inside the rank's namespaces
            for entry in os.listdir("/proc"):  # (other tests, in other xdist workers, hang FAKEs of their own)
                if entry.isdigit():
                    try:
                        if (Path(f"/proc/{entry}/cmdline").read_bytes() == b"sleep\x001000\x00"
                                and os.readlink(f"/proc/{entry}/ns/pid") == rank_ns):
                            return int(entry)
                    except OSError:
                        continue
            return 0

        # its deadline holds in there too: the dump is killed and said timed out
        item = w.call("dump", {"targets": [target_of(t, host_pid)], "timeout": 1.0}, timeout=30)[0][0]
        assert item["error"]["code"] == "timeout" and 1.0 <= item["elapsed"] < 5, item
        assert item["notes"] == [], item["notes"]  # run inside, not the degraded outside view
        wait_until(lambda: not tool(), 10, "the timed-out tool gone")
        w.send("dump", {"targets": [target_of(t, host_pid)], "timeout": 120})
        pid = wait_until(tool, what="the tool running inside the rank's namespaces")
        try:
            w.proc.send_signal(signal.SIGKILL)
            w.proc.wait()
            wait_until(lambda: not Path(f"/proc/{pid}").exists() or proc_state(pid) == "Z", 10,
                       "the tool gone with the worker")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_cancelling_a_hung_dump_kills_the_tool_and_resumes_the_target() -> None:
    with start_rank(0) as t, WorkerProc() as w:
        push(w, FAKE_HANGING_PYSPY)
        rid = w.send("dump", {"targets": [target_of(t)], "timeout": 120})
        wait_until(lambda: proc_state(t.pid) == "T", what="the fake py-spy stopped its target")
        _, done = w.call("cancel", {"target": rid}, timeout=10)
        assert done["data"]["cancelled"] is True
        items, err = w.wait(rid, timeout=10)
        assert err["code"] == "cancelled" and items == []
        wait_until(lambda: proc_state(t.pid) == "S" and untouched(t.pid), what="target resumed")
        _, pong = w.call("ping", timeout=5)
        assert pong["type"] == "done"


def _torn_pyspy(counter: str, failures: int) -> bytes:
    """A FAKE py-spy, for a fault the real one shows only by chance: a --nonblocking read that comes out torn
    because the interpreter changed its memory while it was read. Its first `failures` runs say what py-spy says
    then and exit 1; later runs are the real py-spy."""
    return (f"""#!/bin/sh
n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}
if [ "$n" -lt {failures} ]; then echo "Error: Failed to get stack traces" >&2; exit 1; fi
exec {PYSPY} "$@"
""").encode()


def test_a_torn_nonblocking_read_of_a_running_rank_is_read_again(tmp_path) -> None:
    """--nonblocking never pauses the rank, so a read may be torn; the worker reads again (at most 3 times,
    within half the deadline) and says so; a failure that lasts is reported as it is, once."""
    needs(PYSPY)
    counter = str(tmp_path / "runs")
    with start_rank(0) as t, WorkerProc() as w:
        push(w, _torn_pyspy(counter, 2))
        item = w.call("dump", {"targets": [target_of(t)], "nonblocking": True}, timeout=60)[0][0]
        assert item["ok"], item["error"]
        assert any(f["name"] == "wait_forever" for th in item["pyspy"] for f in th["frames"])
        assert "read 3 times" in " ".join(item["notes"]), item["notes"]
        assert Path(counter).read_text().strip() == "3"

        os.unlink(counter)
        push(w, _torn_pyspy(counter, 99))
        item = w.call("dump", {"targets": [target_of(t)], "nonblocking": True}, timeout=60)[0][0]
        assert item["error"]["code"] == "tool_failed" and "Failed to get stack traces" in item["error"]["message"]
        assert Path(counter).read_text().strip() == "3"  # bounded: three reads, then the failure as it is

        os.unlink(counter)
        push(w, _torn_pyspy(counter, 1))
        item = w.call("dump", {"targets": [target_of(t)]}, timeout=60)[0][0]  # blocking: attached, never torn
        assert item["error"]["code"] == "tool_failed" and Path(counter).read_text().strip() == "1"
        assert untouched(t.pid)
