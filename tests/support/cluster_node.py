"""One fake node of the test cluster: boot it, run commands inside all its namespaces, control its sshd.

Commands enter the node with `nsenter -t <node PID-1> -a` (net, pid, mount, uts, ipc) and then `setpriv
--pdeathsig KILL`, so killing the host-side nsenter (Popen.kill, a timeout) also kills the command inside the
node. Every process started here is in its own session on the host and is killed at teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

from waiting import wait_until

SSHD = "/usr/sbin/sshd"
# the PATH sshd gives root's remote commands on Debian; node.run/spawn use the same so both see one machine
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

class NodeCommandError(subprocess.CalledProcessError):
    """A command inside a node failed; str() names the node and shows its stderr."""

    def __init__(self, node: str, returncode: int, cmd: Any, output: str, stderr: str) -> None:
        super().__init__(returncode, cmd, output, stderr)
        self.node = node

    def __str__(self) -> str:
        tail = (self.stderr or self.output or "").strip()[-2000:]
        return f"on {self.node}: {self.cmd!r} exited {self.returncode}" + (f":\n{tail}" if tail else "")


class NodeProc(NamedTuple):
    pid: int  # as seen inside the node
    host_pid: int  # as seen by the test process
    comm: str


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(path: Path, limit: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-limit:]
    return ""


@dataclass(eq=False)
class Node:
    """A node: `name` (its hostname), `ip`, `ns` (its netns), `init_pid` (host pid of its PID-1, tini)."""

    name: str
    ip: str
    ns: str
    dir: Path  # the node's files on the host: etc/, home/ (its /root), bin/ (its /usr/local/bin), logs
    cluster_rid: str
    init_pid: int = 0
    _boot: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _sshd: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _spawned: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

    @property
    def bin_dir(self) -> Path:
        """The node's /usr/local/bin (holds py-spy); remove a file here to take a tool off the node's PATH."""
        return self.dir / "bin"

    @property
    def sshd_log(self) -> Path:
        return self.dir / "sshd.log"

    # --- lifecycle -----------------------------------------------------------------------------------------
    def boot(self, setup_script: str, *extra_args: str) -> None:
        argv = ["setpriv", "--pdeathsig", "KILL",  # the node dies with the test process, however it dies
                "ip", "netns", "exec", self.ns,
                "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--ipc", "--mount",
                "--propagation", "private", "/bin/sh", "-c", setup_script, "node-setup", self.name, str(self.dir), *extra_args]
        with open(self.dir / "boot.log", "wb") as log:
            self._boot = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, env={"PATH": NODE_PATH})

    def wait_booted(self, timeout: float = 20) -> None:
        """Wait until the node's PID-1 is tini (the setup script finished and exec'd it)."""
        boot = self._boot
        assert boot is not None, "boot() first"

        def tini_pid() -> int:
            if boot.poll() is not None:
                log = _tail(self.dir / "boot.log")
                raise RuntimeError(f"{self.name} did not boot (exit {boot.returncode}):\n{log}")
            with contextlib.suppress(OSError, ValueError):
                for child in Path(f"/proc/{boot.pid}/task/{boot.pid}/children").read_text().split():
                    if os.readlink(f"/proc/{child}/exe").endswith("/tini"):
                        return int(child)
            return 0

        self.init_pid = wait_until(tini_pid, timeout, f"{self.name} to boot")

    def kill(self) -> None:
        """SIGKILL the node's PID-1: the kernel then kills every process in the node's PID namespace."""
        if self.init_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        elif self._boot is not None:  # still booting: unshare --kill-child takes the node's first process along
            _kill_group(self._boot)

    def reap(self, timeout: float = 10) -> None:
        """After kill(): wait for our host-side helpers (nsenter, unshare) to exit, killing any that linger.

        Waiting first lets each nsenter reap its own child; killing it first would hand the child to the
        host's init as a zombie.
        """
        helpers = [*self._spawned, *([self._boot] if self._boot else [])]
        deadline = time.monotonic() + timeout
        for proc in helpers:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait(timeout=10)
        self._spawned.clear()

    # --- commands inside the node --------------------------------------------------------------------------
    def base_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """What a root ssh session on the node gets, plus `extra`: the test process's env never leaks in."""
        env = {"PATH": NODE_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash",
               "LANG": "C.UTF-8"}
        env.update(extra or {})
        return env

    def enter_argv(self, cmd: Sequence[str] | str, cwd: str = "/") -> list[str]:
        assert self.init_pid, f"{self.name} is not booted"
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return ["nsenter", "-t", str(self.init_pid), "-a", f"--wd={cwd}", "--",
                "setpriv", "--pdeathsig", "KILL", "--", *argv]

    def run(self, cmd: Sequence[str] | str, timeout: float = 60, check: bool = True, *,
            env: Mapping[str, str] | None = None, input: str | None = None,
            cwd: str = "/") -> subprocess.CompletedProcess[str]:
        """Run cmd (argv, or a shell string for /bin/sh -c) inside the node; output captured as text."""
        proc = subprocess.Popen(self.enter_argv(cmd, cwd), env=self.base_env(env), text=True,
                                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except BaseException:
            _kill_group(proc)  # the whole process group: a shell's children too
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)
            raise
        if check and proc.returncode != 0:
            raise NodeCommandError(self.name, proc.returncode, cmd, out, err)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def spawn(self, argv: Sequence[str] | str, env: Mapping[str, str] | None = None, cwd: str = "/",
              **popen_kw: Any) -> subprocess.Popen[Any]:
        """Start a long-running process in the node (env adds to base_env()); killed at teardown.

        The Popen's pid is the host-side nsenter; kill() on it kills the process inside too (pdeathsig).
        """
        popen_kw.setdefault("stdin", subprocess.DEVNULL)
        popen_kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.enter_argv(argv, cwd), env=self.base_env(env), **popen_kw)
        self._spawned.append(proc)
        return proc

    def iptables(self, *args: str) -> subprocess.CompletedProcess[str]:
        """iptables in the node's network namespace, e.g. iptables("-A", "INPUT", "-s", ip, "-j", "DROP")."""
        return self.run(["iptables", "-w", *args])

    # --- sshd ----------------------------------------------------------------------------------------------
    def start_sshd(self, wait: bool = True) -> None:
        if self._sshd is not None and self._sshd.poll() is None:
            return
        with open(self.sshd_log, "ab") as log:
            self._sshd = self.spawn([SSHD, "-D", "-e", "-f", str(self.dir / "sshd_config")],
                                    stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_sshd()

    def wait_sshd(self, timeout: float = 20) -> None:
        sshd = self._sshd
        assert sshd is not None, "start_sshd() first"

        def up() -> bool:
            if sshd.poll() is not None:
                raise RuntimeError(f"sshd on {self.name} exited {sshd.returncode}:\n{_tail(self.sshd_log)}")
            return self.listening(22)

        wait_until(up, timeout, f"sshd on {self.name} to listen")

    def kill_sshd(self, sessions: bool = False) -> None:
        """Stop sshd: new connections are refused; with sessions=True, open connections are cut as well."""
        if self._sshd is not None:
            _kill_group(self._sshd)
            self._sshd.wait(timeout=10)
            self._sshd = None
        if sessions:
            for proc in self.procs():
                if proc.comm == "sshd":
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.host_pid, signal.SIGKILL)
        wait_until(lambda: not self.listening(22), 10, f"sshd on {self.name} to stop listening")

    def listening(self, port: int) -> bool:
        """A TCP socket in LISTEN on `port` in the node's netns (read from procfs: no connection made)."""
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{self.init_pid}/net/{table}").read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        return True
        return False

    # --- processes -----------------------------------------------------------------------------------------
    def procs(self) -> list[NodeProc]:
        """Every process of the node, with its pid inside the node and on the host."""
        try:
            pidns = os.readlink(f"/proc/{self.init_pid}/ns/pid")
        except OSError:
            return []
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                if os.readlink(f"/proc/{entry.name}/ns/pid") != pidns:
                    continue
                status = Path(f"/proc/{entry.name}/status").read_text()
                comm = status.split("\n", 1)[0].split("\t", 1)[1]
                nspid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()
                found.append(NodeProc(int(nspid[-1]), int(entry.name), comm))
        return sorted(found)

    def pids(self) -> list[int]:
        """Pids of the node's processes as seen inside the node (what hangscope's worker reports)."""
        return [p.pid for p in self.procs()]

    def host_pid(self, pid: int) -> int:
        """The host pid of the node's process `pid`; ProcessLookupError when there is none."""
        for proc in self.procs():
            if proc.pid == pid:
                return proc.host_pid
        raise ProcessLookupError(f"no pid {pid} on {self.name}")
