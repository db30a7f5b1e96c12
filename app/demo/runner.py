"""Start the demo job (app/demo/job.py) locally with torchrun and wait until every rank is hung.

Used by `hangscope demo`; nothing here imports torch (the job runs in its own processes).
"""

from __future__ import annotations

import collections
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

JOB_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "job.py")


class JobFailed(RuntimeError):
    """The job exited or did not reach its hang within the deadline; the message carries its output tail."""


@dataclass
class LocalJob:
    """A torchrun job on this machine, in its own process group so that stop() takes all of it."""

    scenario: str
    nproc: int
    proc: subprocess.Popen
    workdir: str
    ready: Dict[int, dict] = field(default_factory=dict)  # rank -> the rank's ready line
    owns_workdir: bool = False  # made by start_local_job: removed by stop()

    @property
    def ready_file(self) -> str:
        return os.path.join(self.workdir, "ready.jsonl")

    @property
    def log_file(self) -> str:
        return os.path.join(self.workdir, "job.log")

    def log_tail(self, lines: int = 25) -> str:
        try:
            with open(self.log_file, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    @property
    def rank_log_dir(self) -> str:
        return os.path.join(self.workdir, "ranks")

    def rank_errors(self, lines: int = 40) -> Dict[str, str]:
        """Each failed rank's own stderr (torchrun --tee writes it to RUN/attempt_N/LOCAL_RANK/stderr.log),
        by local rank, its last `lines`: the ranks with a traceback, or else every rank that wrote to stderr."""
        logs: Dict[str, str] = {}
        for path in sorted(glob.glob(os.path.join(self.rank_log_dir, "*", "attempt_*", "*", "stderr.log"))):
            try:
                with open(path, errors="replace") as f:
                    tail = "".join(collections.deque(f, maxlen=lines)).strip()
            except OSError:
                continue
            if tail:
                logs[os.path.basename(os.path.dirname(path))] = tail
        failed = {rank: text for rank, text in logs.items() if "Traceback (most recent call last)" in text}
        return failed or logs

    def failure(self, what: str) -> JobFailed:
        """A JobFailed that shows the failing ranks' own errors first (torchrun's summary after them), and
        keeps the work folder so that the whole log can still be read."""
        self.owns_workdir = False
        parts = [what]
        for rank, text in self.rank_errors().items():
            parts.append(f"local rank {rank} wrote to stderr:\n{text}")
        parts.append(f"the job's output ends with:\n{self.log_tail()}".rstrip())
        parts.append(f"the whole log is kept in {self.log_file}")
        return JobFailed("\n\n".join(parts))

    def _read_ready(self) -> None:
        try:
            with open(self.ready_file) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue  # a line being written right now
                    self.ready[int(rec["rank"])] = rec
        except FileNotFoundError:
            pass

    def wait_hung(self, timeout: float = 240.0, expected: Optional[int] = None) -> Dict[int, dict]:
        """Wait until `expected` ranks (default all) reported reaching their hang point and are blocked."""
        want = self.nproc if expected is None else expected
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read_ready()
            if len(self.ready) >= want and all(_blocked(int(r["pid"])) for r in self.ready.values()
                                               if _alive(int(r["pid"]))):
                return self.ready
            if self.proc.poll() is not None:
                raise self.failure(f"the job exited with code {self.proc.returncode}")
            time.sleep(0.2)  # polling a file another process writes; there is nothing to block on
        raise self.failure(f"the job did not hang within {timeout:.0f} s ({len(self.ready)}/{want} ranks ready)")

    def stop(self) -> None:
        """Terminate the whole process group (launcher and ranks), then kill what is left."""
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # ranks may outlive a launcher that died first
        except (ProcessLookupError, PermissionError):
            pass
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_local_job(scenario: str = "skip", nproc: int = 4, python: str = sys.executable,
                    extra_args: Optional[List[str]] = None, workdir: Optional[str] = None) -> LocalJob:
    owns_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="hangscope-demo-")
    env = dict(os.environ, HANGSCOPE_READY_FILE=os.path.join(workdir, "ready.jsonl"),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # --tee 2: each rank's stderr also goes to its own file under ranks/, so a failure shows the rank's error
    argv = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "--log-dir", os.path.join(workdir, "ranks"), "--tee", "2", JOB_SCRIPT, "--scenario", scenario, *(extra_args or [])]
    with open(os.path.join(workdir, "job.log"), "wb") as log:  # the launcher holds its own copy
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return LocalJob(scenario=scenario, nproc=nproc, proc=proc, workdir=workdir, owns_workdir=owns_workdir)


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _blocked(pid: int) -> bool:
    """The rank's main thread sleeps in the kernel (state S or D), i.e. it is inside its blocking call."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("S", "D")
