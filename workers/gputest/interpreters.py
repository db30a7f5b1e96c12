"""Which python the GPU tests run under on this node: the job's own, as its ranks were started, or one that has torch.

A rank's `/proc/PID/exe` is the binary a symlink chain ends at. For a virtualenv that is the *base*
interpreter (the venv's `bin/python` is a symlink), which does not see the venv's packages: torch is missing
there. The interpreter a rank runs under is the one its command line names: argv[0], resolved against the
rank's cwd and its own PATH, accepted only when it leads to the same binary as /proc/PID/exe.

With no rank on the node (the job was killed, or never started), candidates are probed for torch, in order:
the interpreters of the given processes, an active venv or conda environment named in the environment of
the node's SLURM job processes, then `python3` and `python` on this worker's PATH. Every candidate is run
without a shell, under a deadline, and the reply says which one was chosen and why.
"""

from __future__ import annotations

import os
import subprocess
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Dict, List, Tuple

MAX_CANDIDATES = 12
PROBE = "import torch, sys; sys.stdout.write(torch.__version__)"
_ENV_LIMIT = 1 << 20  # a process's environ is read up to 1 MiB


def _read(path: str, limit: int = _ENV_LIMIT) -> bytes:
    with open(path, "rb") as f:
        return f.read(limit)


def _environ(pid: int) -> Dict[str, str]:
    try:
        raw = _read("/proc/%d/environ" % pid)
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def _same_binary(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _which(name: str, path_var: str, cwd: str) -> str:
    for folder in path_var.split(os.pathsep):
        folder = os.path.join(cwd, folder) if folder and not os.path.isabs(folder) else (folder or cwd)
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return ""


def rank_python(pid: int) -> Tuple[str, str]:
    """(interpreter, how it was found) for a running process; ("", why not) when it cannot be told.

    The interpreter is argv[0] resolved as the kernel's exec did (absolute; relative to the process's cwd;
    or looked up on the process's own PATH), kept only when it is the same binary as /proc/PID/exe."""
    try:
        exe = os.readlink("/proc/%d/exe" % pid)
        argv = _read("/proc/%d/cmdline" % pid, 1 << 16).split(b"\0")
    except OSError as exc:
        return "", "pid %d: %s" % (pid, exc.strerror or exc)
    argv0 = argv[0].decode("utf-8", "replace") if argv and argv[0] else ""
    cwd = ""
    try:
        cwd = os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        pass
    named = ""
    if argv0.startswith("/"):
        named = argv0
    elif "/" in argv0 and cwd:
        named = os.path.normpath(os.path.join(cwd, argv0))
    elif argv0:
        named = _which(argv0, _environ(pid).get("PATH", ""), cwd or "/")
    if named and _same_binary(named, "/proc/%d/exe" % pid):
        return named, "pid %d's command line (argv[0] %s)" % (pid, argv0)
    return exe, "pid %d's executable (/proc/%d/exe; argv[0] %r names no such file)" % (pid, pid, argv0)


def _environment_pythons() -> List[Tuple[str, str]]:
    """Interpreters of active venv/conda environments in the environment of this node's SLURM job processes."""
    found: List[Tuple[str, str]] = []
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return found
    me = os.getpid()
    for pid in pids:
        if pid == me:
            continue
        env = _environ(pid)
        if not env.get("SLURM_JOB_ID"):
            continue
        for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
            prefix = env.get(var, "")
            if prefix.startswith("/"):
                python = os.path.join(prefix, "bin", "python")
                if python not in [p for p, _ in found]:
                    found.append((python, "%s of SLURM job %s (pid %d)" % (var, env["SLURM_JOB_ID"], pid)))
        if len(found) >= 4:
            break
    return found


def probe(python: str, timeout: float) -> Tuple[bool, str]:
    """(has torch, its version or why not): `python -c 'import torch'`, no shell, under a deadline."""
    if not (os.path.isabs(python) and os.path.isfile(python) and os.access(python, os.X_OK)):
        return False, "not an executable file"
    try:
        done = subprocess.run([python, "-c", PROBE], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "importing torch took longer than %.0f s" % timeout
    except OSError as exc:
        return False, exc.strerror or str(exc)
    if done.returncode == 0:
        return True, "torch " + done.stdout.decode("utf-8", "replace")[:64].strip()
    last = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return False, (last[-1][:200] if last else "exit code %d" % done.returncode)


def choose(pids: List[int], explicit: str = "", timeout: float = 60.0) -> Dict[str, object]:
    """The interpreter for the tests on this node: {"python", "why", "tried": [{python, why, ok, detail}]}.

    `explicit` (--python) is taken as given (checked by the launch). Otherwise the ranks' interpreters,
    as their command lines name them, are used unprobed (the job runs with them); with no rank, candidates
    are probed for torch in order, within `timeout` in all."""
    if explicit:
        return {"python": explicit, "why": "--python", "tried": []}
    tried: List[Dict[str, object]] = []
    counts: Dict[str, int] = {}
    whys: Dict[str, str] = {}
    for pid in pids[:256]:
        python, why = rank_python(pid)
        if python:
            counts[python] = counts.get(python, 0) + 1
            whys.setdefault(python, why)
    if counts:
        best = max(counts, key=lambda p: counts[p])
        ranks = counts[best]
        return {"python": best, "why": "the job's interpreter: %s%s" % (
            whys[best], ", as %d ranks here" % ranks if ranks > 1 else ""), "tried": tried}
    candidates: List[Tuple[str, str]] = _environment_pythons()
    for name in ("python3", "python"):
        path = _which(name, os.environ.get("PATH", ""), "/")
        if path:
            candidates.append((path, "%s on this node's PATH" % name))
    deadline = time.monotonic() + timeout
    seen = set()
    for python, why in candidates[:MAX_CANDIDATES]:
        key = os.path.realpath(python) + "\0" + python
        if key in seen:
            continue
        seen.add(key)
        left = deadline - time.monotonic()
        if left <= 1:
            tried.append({"python": python, "why": why, "ok": False, "detail": "no time left to try it"})
            continue
        ok, detail = probe(python, left)
        tried.append({"python": python, "why": why, "ok": ok, "detail": detail})
        if ok:
            return {"python": python, "why": "%s (%s)" % (why, detail), "tried": tried}
    return {"python": "", "why": "", "tried": tried}
