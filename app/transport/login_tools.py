"""The login node's own tools: where its py-spy is (pushed to nodes that have none) and its version."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from typing import Optional


@functools.lru_cache(maxsize=None)
def local_pyspy() -> Optional[str]:
    """The py-spy binary installed with hangscope (in this environment's scripts folder: a venv's or pipx's
    bin/, activated or not) or on PATH."""
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        beside = os.path.join(folder, "py-spy")
        if os.path.isfile(beside) and os.access(beside, os.X_OK):
            return beside
    return shutil.which("py-spy")


@functools.lru_cache(maxsize=None)
def pyspy_version() -> Optional[str]:
    path = local_pyspy()
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.split()[-1] if out.split() else None
