"""The interpreter and tools of the environment the tests run in, found the way a user's shell would.

In a virtualenv, `sys.executable` is the venv's `python` (a symlink to the base interpreter) and py-spy is in
the venv's scripts folder, not next to the resolved base interpreter. Nothing here names a machine's path:
every test that needs the job's interpreter or py-spy takes it from here.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

# The python the tests run under (torch is installed there); a job's ranks run with it, unresolved, so a
# venv's ranks keep their venv (sys.prefix comes from the path they were started by, not the symlink target).
PYTHON = sys.executable
# Where pip put this environment's console scripts (the venv's bin/, or the interpreter's own bin/).
SCRIPTS = Path(sysconfig.get_path("scripts"))


def _find_pyspy() -> Path:
    found = shutil.which("py-spy", path=str(SCRIPTS)) or shutil.which("py-spy")
    return Path(found) if found else SCRIPTS / "py-spy"


# py-spy as pip installs it into this environment (a static binary; the test extra depends on it)
PYSPY = _find_pyspy()


def root_dirs_to_keep() -> list[str]:
    """Top-level folders under /root that hold this environment (venv, base interpreter, pyenv): a test node
    hides the rest of /root, and must still see these to run the job's interpreter and py-spy."""
    keep: list[str] = []
    for p in (sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve()), str(PYSPY.resolve())):
        parts = Path(p).parts
        if len(parts) > 2 and parts[:2] == ("/", "root") and parts[2] not in keep:
            keep.append(parts[2])
    return keep


def other_python(version: str = "3.9") -> str:
    """A python of another minor version (the worker's oldest supported), found as a user's shell would: on
    PATH (not a version manager's shim, which may not run), else under $PYENV_ROOT; "" when there is none."""
    import glob
    import os

    name = f"python{version}"
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder, name)
        if folder and "/shims" not in folder and os.access(candidate, os.X_OK):
            return candidate
    root = os.environ.get("PYENV_ROOT", "")
    found = sorted(glob.glob(os.path.join(root, "versions", f"{version}*", "bin", name))) if root else []
    return found[-1] if found else ""
