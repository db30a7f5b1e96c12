"""Finding the node's tools (py-spy, strace, gdb, nsenter, nvidia-smi, sudo) and holding pushed ones.

A pushed tool lives in an anonymous memfd (nothing on disk, gone with the worker) or, where memfd cannot be
executed, in a 0700 temp dir removed at exit. Lookups record every path tried, for the hello's `searched`
and for tool_missing messages.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Dict, List, Optional, Tuple

    from workers.protocol import ToolFound

from workers import children

TOOL_NAMES = ("py-spy", "strace", "gdb", "nsenter", "nvidia-smi", "sudo")
# How a tool tells its version (first line of output). The hello is on every node's critical path, so only
# py-spy, which every snapshot runs, is asked (~2 ms); the others are listed with their path only: strace,
# nsenter and sudo cost ~2-4 ms each to ask, gdb ~0.17 s, nvidia-smi up to seconds (driver initialisation).
_VERSION_ARGS = {"py-spy": ["--version"]}
_FD_LOCK = threading.Lock()
# A tool not found is looked for again after this long (nvidia-smi is asked for at every discovery; one
# installed meanwhile is seen within a refresh or two).
MISS_TTL = 10.0
_MFD_EXEC = 0x0010  # kernels >= 6.3 with vm.memfd_noexec may refuse exec of a memfd created without it


class Tool:
    """A tool ready to exec: the path to use and the fds the child must inherit for that path to work."""

    def __init__(self, name: str, path: str, fd: Optional[int] = None) -> None:
        self.name = name
        self.path = path
        self.fd = fd  # an open fd holding the binary (pushed tools; also opened for nsenter use)

    def exec_path(self, inside_ns: bool) -> Tuple[str, Tuple[int, ...]]:
        """The path to exec and fds to pass. inside_ns: the child enters other mount namespaces first, so
        the binary goes as an inherited fd (/proc/self/fd/N) and need not exist inside the container."""
        if not inside_ns:
            # A pushed memfd's path is /proc/<worker pid>/fd/N: valid node-wide while the worker lives,
            # also through sudo (which closes inherited fds).
            return self.path, ()
        with _FD_LOCK:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)  # kept for the worker's lifetime
        return "/proc/self/fd/%d" % self.fd, (self.fd,)


def _argv0(pid: int) -> str:
    """The path the process was started by (its command line's first word), or ""."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def untrusted(path: str, root: str) -> str:
    """Why a tool found among a rank's folders must not run, or "" when it may: the file and every folder above it
    up to `root` (the rank's /proc/PID/root) must belong to root or to this worker's own user and be writable by no
    one else (a folder writable by all with the sticky bit, like /tmp, lets no one replace another's entry). A
    worker runs as root to see every user's ranks; a py-spy in a folder the job's user controls (a conda env, a
    venv with copied binaries, a home directory) would run that user's code as root. Each folder is stat()ed as the
    path names it, so a symlinked folder is judged by where it points."""
    me = os.geteuid()
    current = path
    while True:
        try:
            st = os.stat(current)
        except OSError as exc:
            return "cannot check %s: %s" % (current, exc.strerror or exc)
        if st.st_uid not in (0, me):
            return "%s belongs to uid %d" % (current[len(root):] or "/", st.st_uid)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
            return "%s is writable by %s" % (current[len(root):] or "/",
                                             "others" if st.st_mode & stat.S_IWOTH else "its group")
        if len(current) <= len(root):
            return ""
        current = os.path.dirname(current) if current != root + "/" else root


def _is_wrapper(path: str) -> bool:
    # pyenv shims re-dispatch by the *caller's* python version and fail for other versions; the real binary
    # next to an interpreter is searched as well.
    return "/.pyenv/shims/" in path


def _executable(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and os.access(path, os.X_OK)


class Tools:
    """Where each tool is; thread-safe; pushed tools take precedence over the node's own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pushed: Dict[str, Tool] = {}
        self._nspath: Dict[str, Tool] = {}
        self._static: Dict[str, Tool] = {}  # found in PATH or next to this interpreter: the same for any pid
        self._missing: Dict[str, Tuple[float, List[str]]] = {}  # name -> (when, searched), without a pid
        self._tmpdir: Optional[str] = None

    def _static_dirs(self) -> List[str]:
        dirs = [d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if d]
        if sys.executable:  # a venv's bin/ (the path it was started by), then the base interpreter's folder
            dirs += [os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))]
        return dirs

    def candidates(self, name: str, target_pid: Optional[int] = None) -> List[str]:
        """Every path looked at, in order: PATH, next to this interpreter, the rank's interpreter (the folder of
        its binary and, for a venv's symlink, of the path it was started by), ~/.local/bin, the system's."""
        dirs = self._static_dirs()
        if target_pid is not None:
            # /proc/PID/root makes the rank's own view work when it runs in another mount namespace.
            root = "/proc/%d/root" % target_pid
            try:
                dirs.append(root + os.path.dirname(os.readlink("/proc/%d/exe" % target_pid)))
            except OSError:
                pass
            argv0 = _argv0(target_pid)
            if argv0.startswith("/"):  # a venv's bin/python is a symlink: exe names the base interpreter's folder
                dirs.append(root + os.path.dirname(os.path.normpath(argv0)))
        dirs.append(os.path.expanduser("~/.local/bin"))
        dirs += ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        seen: List[str] = []
        for d in dirs:
            p = os.path.join(d, name) if d else ""
            if p and p not in seen:
                seen.append(p)
        return seen

    def find(self, name: str, target_pid: Optional[int] = None) -> Tuple[Optional[Tool], List[str]]:
        """The tool to use, and the paths searched (all of them when it was not found)."""
        with self._lock:
            pushed = self._pushed.get(name)
            static = self._static.get(name)
        if pushed is not None:
            return pushed, []
        if static is not None and _executable(static.path):  # every dump asks: one stat, not a PATH walk
            return static, []
        if target_pid is None:
            with self._lock:
                miss = self._missing.get(name)
            if miss is not None and time.monotonic() - miss[0] < MISS_TTL:
                return None, list(miss[1])
        searched = []
        for path in self.candidates(name, target_pid):
            found = not _is_wrapper(path) and _executable(path)
            if found and target_pid is not None and path.startswith("/proc/%d/root/" % target_pid):
                # a folder of the rank's: its user may own it, and this worker may run as root
                why = untrusted(path, "/proc/%d/root" % target_pid)
                if why:
                    searched.append("%s (not used: %s)" % (path, why))
                    continue
            searched.append(path)
            if found:
                with self._lock:
                    known = self._nspath.get(path)
                    if known is None:
                        known = self._nspath[path] = Tool(name, path)
                    if os.path.dirname(path) in self._static_dirs():
                        self._static[name] = known
                return known, searched
        if target_pid is None:
            with self._lock:
                self._missing[name] = (time.monotonic(), list(searched))
        return None, searched

    def describe(self) -> Tuple[Dict[str, Optional[ToolFound]], Dict[str, List[str]]]:
        """The hello's tools and searched fields; py-spy's version is asked for under a deadline."""
        found: Dict[str, Optional[Tool]] = {}
        searched: Dict[str, List[str]] = {}
        for name in TOOL_NAMES:
            tool, paths = self.find(name)
            found[name] = tool
            if tool is None:
                searched[name] = paths
        versions: Dict[str, str] = {}
        reg = children.Children()
        for name, tool in found.items():
            if tool is None or name not in _VERSION_ARGS:
                continue
            path, fds = tool.exec_path(inside_ns=False)
            try:
                res = children.run(reg, [path] + _VERSION_ARGS[name], timeout=3.0, pass_fds=fds,
                                   max_stdout=4096, max_stderr=4096, pdeathsig=False)
            except OSError:
                continue
            text = (res.stdout or res.stderr).decode("utf-8", "replace").strip().splitlines()
            versions[name] = text[0][:200] if text else ""
        reg.kill_all()
        tools: Dict[str, Optional[ToolFound]] = {}
        for n, t in found.items():
            tools[n] = None if t is None else {"path": t.path, "version": versions.get(n, "")}
        return tools, searched

    def push(self, name: str, data: bytes, sha256: str) -> Tool:
        """Keep a pushed binary executable for this worker's lifetime; ValueError on a checksum mismatch."""
        import hashlib

        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256.lower():
            raise ValueError("sha256 mismatch for %s: got %s, expected %s" % (name, digest, sha256))
        tool = self._push_memfd(name, data) or self._push_file(name, data)
        with self._lock:
            old = self._pushed.get(name)
            self._pushed[name] = tool
        if old is not None and old.fd is not None:
            os.close(old.fd)
        return tool

    def _push_memfd(self, name: str, data: bytes) -> Optional[Tool]:
        create = getattr(os, "memfd_create", None)
        if create is None:
            return None
        fd = -1
        for flags in (os.MFD_CLOEXEC | _MFD_EXEC, os.MFD_CLOEXEC):  # older kernels reject MFD_EXEC
            try:
                fd = create("hangscope-" + name, flags)
                break
            except OSError:
                continue
        if fd < 0:
            return None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, 0o700)
        except OSError:
            os.close(fd)
            return None
        path = "/proc/%d/fd/%d" % (os.getpid(), fd)
        # noexec-sealed memfds (vm.memfd_noexec=2) cannot run: fall back to a file then.
        if not os.access(path, os.X_OK):
            os.close(fd)
            return None
        return Tool(name, path, fd)

    def _push_file(self, name: str, data: bytes) -> Tool:
        import tempfile

        with self._lock:
            if self._tmpdir is None:
                self._tmpdir = tempfile.mkdtemp(prefix="hangscope-")  # mkdtemp makes it 0700
            tmpdir = self._tmpdir
        path = os.path.join(tmpdir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o700)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return Tool(name, path)

    def cleanup(self) -> None:
        """Close pushed memfds and remove the temp dir (the worker is exiting)."""
        with self._lock:
            tools = list(self._pushed.values()) + list(self._nspath.values())
            self._pushed.clear()
            self._nspath.clear()
            tmpdir, self._tmpdir = self._tmpdir, None
        for t in tools:
            if t.fd is not None:
                try:
                    os.close(t.fd)
                except OSError:
                    pass
                t.fd = None
        if tmpdir is not None:
            import shutil

            shutil.rmtree(tmpdir, ignore_errors=True)
