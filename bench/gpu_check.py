#!/usr/bin/env python3
"""`make gpu-check`: hangscope's NCCL and CUDA paths on a GPU machine, in at most 8 minutes, with every output kept.

No NCCL or CUDA path of hangscope had run on hardware when this was written, and a GPU machine is at hand only
now and then, for minutes: this is the one command to run then, from the repository root (a copy of the tree is
enough; nothing is installed unless missing). On a machine with NVIDIA GPUs (one or several) it:

1. finds the GPUs (nvidia-smi) and installs what is missing into the python it runs under: hangscope's
   dependencies (pinned in pyproject.toml) and torch (pip; from HANGSCOPE_WHEELS=DIR, a folder of wheels, when
   the machine reaches no registry; without either it says what is missing and goes on with what it can);
2. runs the GPU tests inside this node, on localhost: `hangscope --test sanity`, then after the job below
   `bench` and `pairs` (GPU pairs, with two GPUs or more);
3. starts a small NCCL job (torchrun, bench/gpu_hang_job.py: one rank per GPU, at least 2; on one GPU 2 ranks
   share it as two NCCL "hosts", and when NCCL refuses that, a gloo world with an NCCL group per rank) with the
   Flight Recorder (TORCH_FR_BUFFER_SIZE) and NCCL RAS on, whose last rank hangs on purpose; runs
   `hangscope --print --native` and `hangscope --snapshot` on it and checks what they found: every rank, the
   culprit named, Flight Recorder records, the GPU-side evidence; the job is always killed.

On a machine without a GPU it says so plainly and runs its own logic against the recorded fakes instead: the
worker's GPU reader and the decoder on fake nvidia-smi, dmesg and ncclras (tests/gpu_fakes.py, tests/data/gpu),
the NCCL log parser on tests/data/nccl; --no-gpu forces that mode. --rehearse runs the GPU path on CPUs
instead (gloo, two ranks; no GPU evidence expected) to try this script's own steps where no GPU is: it proves
nothing about GPUs.

Every step runs under a deadline within the whole run's (--budget, 480 s), each in its own process group, killed
at its deadline. Everything goes under $OUT (default ./gpu-check-out, at most 8 files): summary.md and
summary.json (each step: pass, fail, skip or info, with why), steps.log (every command and its output),
job.log (torchrun and NCCL_DEBUG=INFO), print-native.txt, snapshot.json, gpu-tests.json. The exit status is 0
when no step failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 480.0  # seconds for the whole run: the 8 minutes
RESERVE = 25.0  # kept back for killing the job and writing the summary
MARK = "HANGSCOPE_GPU_CHECK"  # in the environment of every process the check starts: found and killed at the end
JOB = ROOT / "bench" / "gpu_hang_job.py"
# a waiting rank's innermost native frames: in the driver, the CUDA runtime, NCCL, or c10d's wait (gloo)
GPU_FRAME = re.compile(r"libcuda|libcudart|libnccl|cu[A-Z]\w*Synchroni[sz]e|cuda\w*Synchroni[sz]e|nccl|gloo|"
                       r"c10d::\w*Work\w*::wait", re.I)


@dataclass
class Step:
    name: str
    status: str  # pass, fail, skip, info
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Done:
    rc: Optional[int]  # None: killed at its deadline
    out: str
    err: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass
class Check:
    out: Path
    budget: float
    token: str = field(default_factory=lambda: secrets.token_hex(6))
    started: float = field(default_factory=time.monotonic)
    steps: List[Step] = field(default_factory=list)
    facts: Dict[str, Any] = field(default_factory=dict)

    # -- time -----------------------------------------------------------------------------------------------

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.started) - RESERVE

    def allow(self, want: float) -> float:
        """A step's deadline: what it asks, at most what the run has left."""
        return max(0.0, min(want, self.left()))

    # -- records --------------------------------------------------------------------------------------------

    def record(self, name: str, status: str, detail: str = "", seconds: float = 0.0) -> Step:
        step = Step(name, status, detail.strip()[:2000], round(seconds, 1))
        self.steps.append(step)
        print(f"[{time.monotonic() - self.started:6.1f}s] {status.upper():4} {name}: {step.detail[:300]}",
              file=sys.stderr, flush=True)
        return step

    def log(self, text: str) -> None:
        with open(self.out / "steps.log", "a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    # -- commands -------------------------------------------------------------------------------------------

    def env(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
        env[MARK] = self.token
        env.update(extra or {})
        return env

    def run(self, name: str, argv: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None) -> Done:
        """One command in a process group of its own, killed whole at its deadline; its output goes to steps.log."""
        t0 = time.monotonic()
        self.log(f"\n===== {name}: {' '.join(argv)}  (deadline {timeout:.0f} s)")
        if timeout <= 0:
            self.log("(not run: no time left)")
            return Done(None, "", "no time left", 0.0)
        try:
            proc = subprocess.Popen(list(argv), cwd=ROOT, env=self.env(env), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            self.log(f"(cannot start: {exc})")
            return Done(127, "", str(exc), 0.0)
        try:
            out, err = proc.communicate(timeout=timeout)
            rc: Optional[int] = proc.returncode
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            out, err = proc.communicate()
            rc = None
        done = Done(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.monotonic() - t0)
        self.log(f"----- exit {rc if rc is not None else 'KILLED at its deadline'} after {done.seconds:.1f} s\n"
                 f"{done.out[-200_000:]}\n----- stderr\n{done.err[-100_000:]}")
        return done


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def marked_pids(token: str) -> List[int]:
    """Every process whose environment carries this run's mark (the job's ranks, whatever session they took)."""
    needle = f"{MARK}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and _alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    """Not gone, and not a zombie or dead: a killed process is not left running while its parent reaps it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def kill_marked(token: str, wait: float = 10.0) -> List[int]:
    """SIGKILL every marked process, then wait (at most `wait` s) until they have exited: a process killed on a
    loaded machine takes a while to go (its memory freed, its GPU context torn down)."""
    pids = marked_pids(token)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + wait
    while pids and any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


# -- the machine --------------------------------------------------------------------------------------------

def probe_gpus(check: Check) -> List[str]:
    """The GPUs nvidia-smi lists ("0, NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"), or [] and why."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        check.facts["no_gpu_why"] = "nvidia-smi is not on PATH"
        return []
    done = check.run("nvidia-smi", [smi, "--query-gpu=index,name,memory.total,driver_version",
                                    "--format=csv,noheader"], check.allow(20))
    if not done.ok:
        check.facts["no_gpu_why"] = ("nvidia-smi did not answer within 20 s" if done.rc is None
                                     else f"nvidia-smi failed: {(done.err or done.out).strip()[:300]}")
        return []
    gpus = [line.strip() for line in done.out.splitlines() if line.strip()]
    if not gpus:
        check.facts["no_gpu_why"] = "nvidia-smi lists no GPU"
    return gpus


def pinned_dependencies() -> Dict[str, str]:
    """name -> "name==version" for the login node's dependencies in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    pins = re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', block.group(1)) if block else []
    return {name: f"{name}=={version}" for name, version in pins}


def pip(check: Check, name: str, packages: Sequence[str], timeout: float) -> Done:
    wheels = os.environ.get("HANGSCOPE_WHEELS")
    where = ["--no-index", "--find-links", wheels] if wheels else ["--retries", "1", "--timeout", "15"]
    return check.run(name, [sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
                            "--no-input", *where, *packages], timeout)


def install(check: Check, need_torch: bool, need_cuda: bool = True) -> bool:
    """hangscope's dependencies and torch in this python, installed only when missing; True when usable."""
    t0 = time.monotonic()
    missing = missing_pins(list(pinned_dependencies().values()))
    if missing:
        done = pip(check, "pip install hangscope's dependencies", missing, check.allow(150))
        if not done.ok:
            check.record("install hangscope's dependencies", "fail",
                         f"missing {', '.join(missing)}; pip {'timed out' if done.rc is None else 'failed'} "
                         f"(no registry here? set HANGSCOPE_WHEELS to a folder of wheels): {tail(done.err, 400)}",
                         time.monotonic() - t0)
            return False
        still = missing_pins(missing)
        if still:
            check.record("install hangscope's dependencies", "fail", f"pip ended, but still not at the pinned "
                         f"version: {', '.join(still)}", time.monotonic() - t0)
            return False
        check.record("install hangscope's dependencies", "pass", f"installed {', '.join(missing)}",
                     time.monotonic() - t0)
    else:
        check.record("hangscope's dependencies", "pass", f"already here ({sys.executable})")
    if not need_torch:
        return True
    t0 = time.monotonic()
    probe = [sys.executable, "-c", "import torch, torch.distributed as d; print(torch.__version__, "
             "torch.cuda.is_available(), torch.cuda.device_count(), d.is_nccl_available() and "
             "'.'.join(map(str, torch.cuda.nccl.version())))"]
    done = check.run("torch", probe, check.allow(120))
    if not done.ok and done.rc is not None and "No module named 'torch'" in done.err:
        got = pip(check, "pip install torch", ["torch"], check.allow(240))
        if not got.ok:
            check.record("install torch", "fail", f"torch is missing and pip could not install it "
                         f"(no registry here? HANGSCOPE_WHEELS): {tail(got.err, 400)}", time.monotonic() - t0)
            return False
        done = check.run("torch", probe, check.allow(120))
    if not done.ok:
        check.record("torch", "fail", f"import failed: {tail(done.err, 400)}", time.monotonic() - t0)
        return False
    version, cuda, count, nccl = (done.out.split() + ["?"] * 4)[:4]
    check.facts["torch"] = {"version": version, "cuda": cuda == "True", "gpus": count, "nccl": nccl}
    if cuda != "True" and need_cuda:
        check.record("torch", "fail", f"torch {version} sees no CUDA device (a CPU build?)", time.monotonic() - t0)
        return False
    check.record("torch", "pass", f"torch {version}, {count} CUDA device(s), NCCL {nccl}", time.monotonic() - t0)
    return True


def missing_pins(pins: Sequence[str]) -> List[str]:
    """The pins ("name==version") this python does not have at that version: not installed, or another version.
    Every login-node dependency of pyproject.toml is checked by its distribution's name, so a dependency added
    there is installed here too (the first H100 run of 2026-11-27 lacked orjson: a list of modules kept here had
    not grown with pyproject.toml). Asked once, in a child: this process imports none of them."""
    code = ("import sys\nfrom importlib import metadata\nfor pin in sys.argv[1:]:\n"
            "    name, _, want = pin.partition('==')\n"
            "    try:\n        have = metadata.version(name)\n    except metadata.PackageNotFoundError:\n"
            "        have = None\n"
            "    if have != want:\n        print(pin)\n")
    done = subprocess.run([sys.executable, "-c", code, *pins], capture_output=True, text=True, timeout=60)
    return done.stdout.split() if done.returncode == 0 else list(pins)


def tail(text: str, n: int) -> str:
    text = text.strip()
    return text[-n:] if len(text) > n else text


def hangscope(*args: str) -> List[str]:
    return [sys.executable, "-m", "app", *args]


# -- the GPU tests ------------------------------------------------------------------------------------------

def gpu_test(check: Check, kind: str, results: Dict[str, Any], extra: Sequence[str] = (), want: float = 120.0) -> None:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{kind}.json"
        done = check.run(f"hangscope --test {kind}", hangscope("--test", kind, "--python", sys.executable,
                                                               "--json", str(path), "--test-timeout", "60",
                                                               "--startup-timeout", "120", *extra), check.allow(want))
        try:
            results[kind] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            results[kind] = {"error": "no results written", "rc": done.rc}
    verdict = (results[kind].get("results") or {}).get("verdict", "") if isinstance(results[kind], dict) else ""
    if done.rc is None:
        check.record(f"--test {kind}", "fail", f"did not end within its deadline; {tail(done.err, 300)}", done.seconds)
    else:
        check.record(f"--test {kind}", "pass" if done.ok else "fail",
                     (verdict or tail(done.out + done.err, 400)), time.monotonic() - t0)


# -- the hung NCCL job ---------------------------------------------------------------------------------------

class Job:
    """bench/gpu_hang_job.py under torchrun, in a session of its own; kill() ends every process of it."""

    def __init__(self, check: Check, nproc: int, mode: str, share_gpu: bool, hang: str = "sleep") -> None:
        self.check, self.nproc, self.mode, self.hang = check, nproc, mode, hang
        self.dir = Path(tempfile.mkdtemp(prefix="hangscope-gpu-check-"))
        self.ready = self.dir / "ready"
        env = check.env({"GPU_CHECK_MODE": mode, "GPU_CHECK_HANG": hang, "GPU_CHECK_READY": str(self.ready),
                         "GPU_CHECK_SOCKETS": str(self.dir), "GPU_CHECK_SHARE_GPU": "1" if share_gpu else "0",
                         "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                         "NCCL_RAS_ENABLE": "1", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
                         "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1",
                         # the recorder notes when each collective started on the GPU, not only its enqueue
                         "TORCH_NCCL_ENABLE_TIMING": "1"})
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                str(JOB)]
        what = f"{mode}, hang {hang}, {nproc} ranks{', sharing one GPU' if share_gpu else ''}"
        check.log(f"\n===== job ({what}): {' '.join(argv)}")
        self.logf = open(check.out / "job.log", "ab")  # noqa: SIM115 (closed in kill())
        self.logf.write(f"\n===== {what}\n".encode())
        self.logf.flush()
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def lines(self) -> List[List[str]]:
        try:
            return [line.split() for line in self.ready.read_text().splitlines() if line.strip()]
        except OSError:
            return []

    def wait_hung(self, timeout: float) -> str:
        """"" once the culprit is hung and every other rank waits for it; else why not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.lines()
            if {w[2] for w in got if len(w) == 3} >= {"hung"} and \
                    sum(1 for w in got if len(w) == 3 and w[2] in ("hung", "waiting")) >= self.nproc:
                time.sleep(3.0)  # the waiting ranks' all_reduce reaches NCCL and the host thread blocks
                return ""
            if self.proc.poll() is not None:
                return f"the job ended (exit {self.proc.returncode}) before it hung"
            time.sleep(0.5)
        return f"the job did not reach its hang within {timeout:.0f} s"

    def ranks(self) -> Dict[int, int]:
        """rank -> pid, from the ranks' own lines."""
        return {int(w[0]): int(w[1]) for w in self.lines() if len(w) == 3 and w[0].isdigit() and w[1].isdigit()}

    def log_text(self) -> str:
        try:
            return (self.check.out / "job.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def kill(self) -> List[int]:
        ranks = set(self.ranks().values())
        kill_group(self.proc.pid)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        left = kill_marked(self.check.token)  # ranks that left the session, if any
        self.logf.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self._gpus_released(ranks | set(left), 20.0)
        return left

    def _gpus_released(self, pids: set, timeout: float) -> None:
        """Wait (bounded) until the driver no longer lists the killed ranks as holding a GPU: the GPU tests that
        follow refuse GPUs that processes hold."""
        smi = shutil.which("nvidia-smi")
        deadline = time.monotonic() + timeout
        while smi and pids and time.monotonic() < deadline:
            try:
                done = subprocess.run([smi, "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                                      text=True, timeout=10)
            except subprocess.TimeoutExpired:
                return
            if not pids & {int(x) for x in done.stdout.split() if x.isdigit()}:
                return
            time.sleep(1.0)


def hang_job(check: Check, gpus: int, rehearse: bool = False) -> None:
    # at least 3 ranks: with 2, one hung and one waiting are 1 against 1, and no analysis can say which is odd
    nproc = max(3, min(gpus, 8))
    share = nproc > gpus and not rehearse
    attempts = [("cpu", False)] if rehearse else [("nccl", share)] + ([("shared", False)] if share else [])
    job: Optional[Job] = None
    why = ""
    try:
        for mode, share_gpu in attempts:
            if check.left() < 120:
                check.record("NCCL job", "skip", f"not started: {check.left():.0f} s left")
                return
            t0 = time.monotonic()
            job = Job(check, nproc, mode, share_gpu)
            why = job.wait_hung(check.allow(150))
            if not why:
                check.facts["job"] = {"mode": mode, "ranks": nproc, "shares_one_gpu": share_gpu,
                                      "pids": job.ranks()}
                how = {"nccl": "NCCL world group", "shared": "gloo world group, an NCCL group per rank",
                       "cpu": "gloo on CPUs: a rehearsal"}[mode]
                check.record("NCCL job hangs one rank", "pass",
                             f"{nproc} ranks ({how}{'; ranks share a GPU, each an NCCL host of its own' if share_gpu else ''})"
                             f"; rank {nproc - 1} hung at its step", time.monotonic() - t0)
                break
            refused = re.search(r"Duplicate GPU detected[^\n]*", job.log_text())
            check.record(f"NCCL job ({mode})", "fail" if mode == attempts[-1][0] else "info",
                         why + (f"; NCCL refused two ranks on one GPU: {refused.group(0)}" if refused else "")
                         + ("; trying a gloo world with an NCCL group per rank" if mode != attempts[-1][0] else ""),
                         time.monotonic() - t0)
            job.kill()
            job = None
        if job is None:
            return
        investigate(check, job, gpu=not rehearse)
    finally:
        if job is not None:
            left = job.kill()
            check.record("the job is killed", "pass" if not marked_pids(check.token) else "fail",
                         f"process group killed{f'; and {len(left)} rank(s) outside it' if left else ''}")


HANGS = ("sleep", "kernel", "cycle")  # bench/gpu_hang_job.py's GPU_CHECK_HANG; sleep is the check's own job


def _pids(who: Any) -> List[int]:
    return [k[1] for k in who if isinstance(k, list) and len(k) == 2 and isinstance(k[1], int)] \
        if isinstance(who, list) else []


def judge_culprit(analysis: Dict[str, Any], culprit: Optional[int]) -> Tuple[str, str]:
    """What the snapshot file's analysis says of the hung rank (pid `culprit`): "pass" when the headline's culprit
    (analysis["culprit"], the rank(s) the verdict is about) is that rank alone; "fail" when the headline, or any
    [high] finding that blames ranks (culprit: true), names others without it (a wrong [high] is the worst
    outcome); "unnamed" otherwise (no culprit, or a [medium]/[low] one elsewhere). A [high] finding that blames no
    one (all ranks at one place: "stacks cannot tell the culprit") names no culprit: it is not judged as one."""
    raw = analysis.get("culprit")
    head: Dict[str, Any] = raw if isinstance(raw, dict) else {}
    named, confidence = _pids(head.get("ranks")), str(head.get("confidence") or "-")
    said = f"the headline's culprit [{confidence}] is pid(s) {named or 'none'}, the hung rank is pid {culprit}"
    wrong = [f for f in analysis.get("findings") or [] if isinstance(f, dict) and f.get("culprit") is True
             and f.get("confidence") == "high" and culprit not in _pids(f.get("ranks"))]
    if wrong:
        return "fail", f"{said}; a [high] finding blames pid(s) {_pids(wrong[0].get('ranks'))} ({wrong[0].get('kind')})"
    if culprit is not None and named == [culprit]:
        return "pass", said
    if named and confidence == "high":
        return "fail", said
    return "unnamed", said


def other_hang(check: Check, gpus: int, hang: str, mode: str, share_gpu: bool) -> None:
    """One more hung job, of another kind, in the mode the first one ran in: hangscope's `--print --native` and
    `--snapshot` on it go to print-HANG.txt and snapshot-HANG.json, judged by judge_culprit: a pass when the
    headline's culprit is the hung rank, a failure when a [high] blames another (a wrong [high] is the worst
    outcome), else recorded as info (an honest "not sure" is not a failure)."""
    if check.left() < 90:
        check.record(f"hang {hang}", "skip", f"not started: {check.left():.0f} s left")
        return
    t0 = time.monotonic()
    nproc = max(3, min(gpus, 8))
    job = Job(check, nproc, mode, share_gpu, hang=hang)
    try:
        why = job.wait_hung(check.allow(120))
        if why:
            check.record(f"hang {hang}", "fail", why, time.monotonic() - t0)
            return
        culprit = job.ranks().get(nproc - 1)
        match = ["--match", r"gpu_hang_job\.py", "--gpu-evidence", "on", "--timeout", "30", "-q"]
        done = check.run(f"hangscope --print --native ({hang})",
                         hangscope("--print", "--native", "--samples", "2", *match), check.allow(90))
        (check.out / f"print-{hang}.txt").write_text(done.out + ("\n----- stderr\n" + done.err if done.err else ""),
                                                     encoding="utf-8")
        path = check.out / f"snapshot-{hang}.json"
        check.run(f"hangscope --snapshot ({hang})", hangscope("--snapshot", str(path), "--force", "--native",
                                                             "--samples", "2", *match), check.allow(90))
        try:
            analysis = json.loads(path.read_text(encoding="utf-8")).get("analysis") or {}
        except (OSError, ValueError) as exc:
            check.record(f"hang {hang}", "fail", f"no snapshot: {exc}", time.monotonic() - t0)
            return
        status, said = judge_culprit(analysis, culprit)
        check.record(f"hang {hang}", "info" if status == "unnamed" else status,
                     f"{said}; verdict: {analysis.get('verdict', '')!s:.600}", time.monotonic() - t0)
    finally:
        left = job.kill()
        check.record(f"hang {hang}: the job is killed", "pass" if not marked_pids(check.token) else "fail",
                     f"process group killed{f'; and {len(left)} rank(s) outside it' if left else ''}")


def investigate(check: Check, job: Job, gpu: bool = True) -> None:
    culprit_rank = job.nproc - 1
    culprit = job.ranks().get(culprit_rank)
    match = ["--match", r"gpu_hang_job\.py", "--gpu-evidence", "on", "--timeout", "30", "-q"]
    done = check.run("hangscope --print --native", hangscope("--print", "--native", "--samples", "2", *match),
                     check.allow(90))
    (check.out / "print-native.txt").write_text(done.out + ("\n----- stderr\n" + done.err if done.err else ""),
                                                encoding="utf-8")
    check.record("--print --native", "pass" if done.rc == 0 else "fail",
                 f"exit {done.rc if done.rc is not None else 'killed at its deadline'}; first lines: "
                 f"{done.out.strip()[:400]}", done.seconds)
    snap_path = check.out / "snapshot.json"  # with native frames too: the file is what is read afterwards
    done = check.run("hangscope --snapshot", hangscope("--snapshot", str(snap_path), "--force", "--native",
                                                       "--samples", "2", *match), check.allow(90))
    check.record("--snapshot", "pass" if done.rc == 0 and snap_path.exists() else "fail",
                 f"exit {done.rc if done.rc is not None else 'killed at its deadline'}", done.seconds)
    try:
        doc = json.loads(snap_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        check.record("snapshot contents", "fail", f"no snapshot to read: {exc}")
        return
    judge_snapshot(check, doc, job.nproc, culprit, gpu)


def judge_snapshot(check: Check, doc: Dict[str, Any], nproc: int, culprit: Optional[int], gpu_run: bool) -> None:
    snap, analysis = doc.get("snapshot") or {}, doc.get("analysis") or {}
    ranks = [r for r in snap.get("ranks") or [] if isinstance(r, dict)]
    collected = [r for r in ranks if r.get("collected")]
    check.record("every rank found and dumped", "pass" if len(collected) == nproc == len(ranks) else "fail",
                 f"{len(ranks)} rank(s) found, {len(collected)} dumped, {nproc} in the job")
    native = sorted({f.get("function", "") for r in ranks for t in r.get("threads") or [] if t.get("is_main")
                     for f in (t.get("frames") or [])[:12] if f.get("native") and GPU_FRAME.search(f.get("function", "")
                                                                                                    + " " + (f.get("module") or ""))})
    check.record("native frames where the ranks wait (CUDA, NCCL, c10d)", ("pass" if native else "fail") if gpu_run else "info",
                 ", ".join(native)[:400] or "none among the main threads' innermost native frames")
    status, said = judge_culprit(analysis, culprit)
    check.record("the hung rank is the culprit", "pass" if status == "pass" else "fail",
                 f"verdict: {analysis.get('verdict', '')!s:.300}; {said}")
    flights = [r.get("flight") or {} for r in ranks]
    recorded = [f for f in flights if f.get("source")]
    nccl = [f for f in recorded if any("nccl" in (e.get("profiling_name") or "") for e in f.get("entries") or [])]
    check.record("Flight Recorder read from every rank", "pass" if len(recorded) == len(ranks) and ranks else "fail",
                 f"{len(recorded)} of {len(ranks)} rank(s) with a record ({len(nccl)} with NCCL entries); notes: "
                 + "; ".join(sorted({n for f in flights for n in f.get("notes") or []}))[:400])
    nodes = [n for n in snap.get("nodes") or [] if isinstance(n, dict)]
    gpu = (nodes[0].get("gpu") or {}) if nodes else {}
    check.record("GPU-side evidence", ("pass" if gpu.get("smi") == "ok" and gpu.get("gpus") else "fail") if gpu_run
                 else "info",
                 f"nvidia-smi {gpu.get('smi') or 'not asked'}: {len(gpu.get('gpus') or [])} GPU(s); Xid lines: "
                 f"{len(gpu.get('xids') or [])} from {gpu.get('xid_source') or 'no kernel log'}; notes: "
                 + "; ".join(gpu.get("notes") or [])[:300])
    ras = gpu.get("ras") or {}
    comms = ras.get("comms") or []
    check.record("NCCL RAS", "info", f"status {ras.get('status') or 'not asked'} via {ras.get('via') or '-'} "
                 f"({ras.get('format') or '-'}, NCCL {ras.get('nccl_version') or '?'}): {len(comms)} communicator(s)"
                 + (f"; error: {ras.get('error')}" if ras.get("error") else ""))


# -- without a GPU: hangscope's GPU code against the recorded fakes -------------------------------------------

def no_gpu(check: Check) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support"), str(ROOT / "tests")]
    try:
        import gpu_fakes  # tests/gpu_fakes.py (or tests/support/): fake nvidia-smi, dmesg and ncclras
    except ImportError as exc:
        check.record("the recorded fakes", "fail", f"tests/gpu_fakes.py not found: {exc}")
        return
    t0 = time.monotonic()
    bindir = Path(tempfile.mkdtemp(prefix="hangscope-gpu-check-fakes-"))
    try:
        gpus = gpu_fakes.recorded("query-gpu.csv")
        gpu_fakes.nvidia_smi(bindir, gpus=gpus, remap=gpu_fakes.recorded("remapped-rows.csv"),
                             apps=gpu_fakes.apps_csv({3: [os.getpid()]}, gpus))
        gpu_fakes.dmesg(bindir, gpu_fakes.recorded("dmesg-xids.txt"))
        gpu_fakes.ncclras(bindir, text=gpu_fakes.recorded("ncclras-text-mismatch.txt"))
        os.environ["PATH"] = gpu_fakes.path_with(bindir)
        asyncio.run(asyncio.wait_for(_fake_worker(check), check.allow(90)))
    except asyncio.TimeoutError:
        check.record("the worker on fake GPU tools", "fail", "did not end within its deadline", time.monotonic() - t0)
    finally:
        shutil.rmtree(bindir, ignore_errors=True)
    _recorded_logs(check)
    done = check.run("the job script compiles", [sys.executable, "-m", "py_compile", str(JOB)], check.allow(30))
    check.record("bench/gpu_hang_job.py compiles", "pass" if done.ok else "fail", tail(done.err, 300))


async def _fake_worker(check: Check) -> None:
    from app.decode import gpu as decode
    from app.gpu.inventory import busy, node_inventory, summary
    from app.transport.local import start_local
    from workers import protocol

    t0 = time.monotonic()
    conn = await start_local(name="fakes", timeout=30)
    try:
        raw = await conn.call(protocol.GPU_INVENTORY({}), timeout=60)
        inv = node_inventory("fakes", raw)
        ok = (inv.source == "nvidia-smi" and len(inv.gpus) == 8 and [h.pid for _, h in busy([inv])] == [os.getpid()]
              and [x.xid for x in inv.xids][:2] == [79, 48])
        check.record("the GPU tests' node reading (gpu_inventory) on fake tools", "pass" if ok else "fail",
                     summary(inv), time.monotonic() - t0)
        t0 = time.monotonic()
        items, _ = await conn.request(protocol.COLLECT({"pids": [], "gpu_evidence": "on", "ras": True,
                                                         "timeout": 20}), timeout=60).collect()
        raw_ev = [i["gpu_evidence"] for i in items if protocol.collect_item_key(i) == "gpu_evidence"]
        ev = decode.gpu_evidence(raw_ev[0]) if raw_ev else None
        ok = (ev is not None and ev.smi == "ok" and [g.index for g in ev.gpus if g.remap_pending] == [3]
              and ev.xids[0].xid == 79 and ev.ras is not None and ev.ras.status == "ok")
        check.record("the investigation's GPU evidence (collect) on fake tools", "pass" if ok else "fail",
                     "" if ev is None else f"nvidia-smi {ev.smi}: {len(ev.gpus)} GPU(s); Xid "
                     f"{', '.join(str(x.xid) for x in ev.xids)} from {ev.xid_source}; RAS {ev.ras.status if ev.ras else '-'}"
                     f" ({ev.ras.format if ev.ras else '-'})", time.monotonic() - t0)
    finally:
        await conn.close()


def _recorded_logs(check: Check) -> None:
    from app.gpu import nccl

    logs = sorted((ROOT / "tests" / "data" / "nccl").glob("*.log"))
    empty = []
    said = []
    for path in logs:
        hosts = nccl.parse(path.read_text(encoding="utf-8").splitlines())
        # a recorded log is a fragment: some of its hosts show only a transport or a finished init, but each
        # log tells something (network, version, settings, transports, warnings) of at least one host
        told = [n for n in hosts if n.summary or n.version or n.env or n.warnings or n.transports or n.init_complete]
        if not told:
            empty.append(path.name)
        said += [f"{n.host}: {n.summary or n.version or ', '.join(n.transports) or f'{len(n.warnings)} warning(s)'}"
                 for n in told]
    check.record("NCCL_DEBUG=INFO logs (tests/data/nccl) parsed", "pass" if logs and not empty else "fail",
                 (f"nothing read from {', '.join(empty)}; " if empty else "")
                 + f"{len(logs)} log(s), {len(said)} host(s): " + "; ".join(said[:6]))


# -- the run ------------------------------------------------------------------------------------------------

def write_summary(check: Check, gpus: List[str]) -> int:
    failed = [s for s in check.steps if s.status == "fail"]
    host = socket.gethostname()
    if gpus:
        head = f"GPU check on {host}: {len(gpus)} GPU(s): " + "; ".join(gpus)
    elif check.facts.get("mode") == "rehearse":
        head = (f"REHEARSAL on {host}'s CPUs, NO GPU used: this script's GPU path with gloo in place of NCCL; it "
                "shows the steps work, nothing about GPUs.")
    else:
        head = (f"NO GPU on {host}: {check.facts.get('no_gpu_why', 'forced by --no-gpu')}. The GPU tests and the "
                "NCCL job did NOT run; hangscope's GPU code ran against recorded outputs (tests/data/gpu, "
                "tests/data/nccl) through fake tools (tests/gpu_fakes.py) instead.")
    verdict = f"{len(failed)} step(s) failed" if failed else "every step passed"
    seconds = time.monotonic() - check.started
    lines = [f"# {head}", "", f"{verdict}, in {seconds:.0f} s (budget {check.budget:.0f} s).", "",
             "| step | result | seconds | detail |", "|---|---|---|---|"]
    lines += [f"| {s.name} | {s.status} | {s.seconds:g} | {s.detail.replace('|', '/').replace(chr(10), ' ')} |"
              for s in check.steps]
    (check.out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (check.out / "summary.json").write_text(json.dumps({
        "gpu": bool(gpus), "gpus": gpus, "headline": head, "verdict": verdict, "seconds": round(seconds, 1),
        "facts": check.facts, "steps": [asdict(s) for s in check.steps]}, indent=1), encoding="utf-8")
    print(head + "\n" + verdict + f"; see {check.out}/summary.md", flush=True)
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out",
                    help="where every output goes ($OUT, else ./gpu-check-out)")
    ap.add_argument("--budget", type=float, default=BUDGET, help=f"seconds for the whole run ({BUDGET:g})")
    ap.add_argument("--no-gpu", action="store_true", help="run the no-GPU mode (the recorded fakes) even on a GPU")
    ap.add_argument("--rehearse", action="store_true",
                    help="where no GPU is: the GPU path on CPUs (gloo, 2 ranks), to try this script's steps")
    ap.add_argument("--hangs", default="", type=lambda v: [h for h in v.split(",") if h],
                    help=f"after the check's own job, hang one more job of each of these kinds ({', '.join(HANGS[1:])}"
                         "; bench/gpu_hang_job.py) and keep what hangscope says of each (print-KIND.txt, "
                         "snapshot-KIND.json: more than the 8 files a lent machine returns, so pack them)")
    args = ap.parse_args(argv)
    bad = [h for h in args.hangs if h not in HANGS[1:]]
    if bad:
        ap.error(f"--hangs: unknown kind(s) {', '.join(bad)}; known: {', '.join(HANGS[1:])}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "steps.log").write_text(f"hangscope gpu-check, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
                                   f"python {sys.version.split()[0]} at {sys.executable}\n", encoding="utf-8")
    check = Check(out, args.budget)

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # through the finally blocks: the job is killed

    signal.signal(signal.SIGTERM, stop)
    gpus: List[str] = []
    try:
        gpus = [] if args.no_gpu or args.rehearse else probe_gpus(check)
        check.facts["mode"] = "rehearse" if args.rehearse else "gpu" if gpus else "no-gpu"
        if args.no_gpu or args.rehearse:
            check.facts["no_gpu_why"] = "--no-gpu was given" if args.no_gpu else "--rehearse: CPUs only"
        check.record("GPUs", "info", "; ".join(gpus) if gpus else f"none: {check.facts['no_gpu_why']}")
        if not install(check, need_torch=bool(gpus) or args.rehearse, need_cuda=not args.rehearse):
            return write_summary(check, gpus)
        if not gpus and not args.rehearse:
            no_gpu(check)
            return write_summary(check, gpus)
        results: Dict[str, Any] = {}
        cpu = ["--backend", "gloo", "--procs-per-node", "2"] if args.rehearse else []
        gpu_test(check, "sanity", results, cpu, want=120)
        hang_job(check, len(gpus), rehearse=args.rehearse)
        for hang in args.hangs:
            job = check.facts.get("job") or {}
            if job:
                other_hang(check, len(gpus), hang, job["mode"], job["shares_one_gpu"])
        gpu_test(check, "bench", results, ["--sizes", "1M,16M,64M", "--iters", "5", "--warmup", "2", *cpu],
                 want=100)
        if args.rehearse or len(gpus) >= 2:
            gpu_test(check, "pairs", results, cpu, want=150)
        else:
            check.record("--test pairs", "skip", "one GPU: a pair takes two")
        (out / "gpu-tests.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
        return write_summary(check, gpus)
    finally:
        left = kill_marked(check.token)
        if left:
            print(f"killed {len(left)} leftover process(es) of this check", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
