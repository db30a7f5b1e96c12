"""`--slurm JOBID`: ask SLURM (scontrol / squeue, JSON when the installed version has it) for a job's nodes.

Runs only SLURM's read-only query commands, each under a deadline, as argv (never through a shell). The
job must be RUNNING; node lists are expanded with ClusterShell (app.hosts) and cross-checked with
`scontrol show hostnames`, whose answer wins (it knows the site's naming) with a warning when they differ.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from typing import Mapping, Optional, Sequence

from app.errors import HostsError
from app.hosts import HostSpec, TransportKind, parse_nodelist
from app.slurm.job import SlurmError, SlurmJob, clean, job_from_text, parse_json, parse_text

QUERY_TIMEOUT = 20.0
_JOB_ID = re.compile(r"[0-9]{1,12}(?:[_+][0-9]{1,9})?", re.ASCII)
_UNSUPPORTED = ("unrecognized option", "invalid option", "unknown option", "not supported")


def job_id_from(arg: Optional[str], env: Mapping[str, str]) -> str:
    """The job id given, or the allocation's own (SLURM_JOB_ID) when `--slurm` came without one."""
    job_id = arg or env.get("SLURM_JOB_ID") or ""
    if not job_id:
        raise SlurmError("no_job_id", "--slurm without a job id needs to run inside an allocation "
                         "(SLURM_JOB_ID is not set)", hint="give the id: hangscope --slurm 12345 (see squeue --me)")
    if not _JOB_ID.fullmatch(job_id):
        raise SlurmError("no_job_id", f"{clean(job_id, 40)!r} is not a SLURM job id",
                         hint="a job id is a number, or 123_4 for an array task, or 123+1 for a het job part")
    return job_id


def _run(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, errors="replace",
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmError("controller", f"`{' '.join(argv)}` did not answer within {timeout:g} s",
                         hint="slurmctld is slow or unreachable; try again, or check `scontrol ping`") from None
    except OSError as exc:
        raise SlurmError("no_slurm", f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def _unsupported(done: subprocess.CompletedProcess[str]) -> bool:
    """This SLURM has no --json here: an option error, or a command that printed no JSON at all."""
    err = done.stderr.lower()
    return any(s in err for s in _UNSUPPORTED) or not done.stdout.lstrip().startswith("{")


def query_job(job_id: str, env: Mapping[str, str] = os.environ, timeout: float = QUERY_TIMEOUT) -> list[SlurmJob]:
    """Every record SLURM has for job_id (an array job has several); raises SlurmError."""
    path = env.get("PATH", os.defpath)
    scontrol = shutil.which("scontrol", path=path)
    if scontrol is None:
        raise SlurmError("no_slurm", "SLURM's scontrol is not on PATH, so --slurm cannot look up the job",
                         hint="run hangscope on a SLURM login node, or give the nodes: hangscope -w 'gpu[01-04]'")
    done = _run([scontrol, "--json", "show", "job", job_id], env, timeout)
    if not _unsupported(done):
        return parse_json(done.stdout, job_id, "scontrol --json")
    squeue = shutil.which("squeue", path=path)
    if squeue is not None:  # 21.08 and 22.05: squeue has --json, scontrol not yet
        done = _run([squeue, "--json", "--jobs", job_id], env, timeout)
        if done.returncode == 0 and not _unsupported(done):
            jobs = parse_json(done.stdout, job_id, "squeue --json")
            if jobs:
                return jobs  # none: squeue forgets finished jobs sooner; scontrol says what became of it
    done = _run([scontrol, "show", "job", job_id], env, timeout)
    if done.returncode != 0:
        _raise_query_error(job_id, done)
    return [job_from_text(rec, job_id) for rec in parse_text(done.stdout)]


def _raise_query_error(job_id: str, done: subprocess.CompletedProcess[str]) -> None:
    err = clean(done.stderr.strip() or f"exit status {done.returncode}", 500)
    if "invalid job id" in err.lower():
        raise SlurmError("unknown_job", f"SLURM does not know job {job_id}: {err}",
                         hint="check the id with `squeue --me`; a job that ended a while ago is forgotten")
    raise SlurmError("controller", f"scontrol show job {job_id} failed: {err}",
                     hint="is slurmctld reachable from here? `scontrol ping` tells")


def resolve_job(job_id: Optional[str], env: Mapping[str, str] = os.environ,
                timeout: float = QUERY_TIMEOUT) -> SlurmJob:
    """The RUNNING job with its nodes expanded; SlurmError says why not (unknown, pending, ended, no SLURM)."""
    jid = job_id_from(job_id, env)
    jobs = query_job(jid, env, timeout)
    if not jobs:
        raise SlurmError("unknown_job", f"SLURM does not know job {jid}",
                         hint="check the id with `squeue --me`; a job that ended a while ago is forgotten")
    if len(jobs) > 1:
        ids = ", ".join(j.job_id for j in jobs[:8]) + (" ..." if len(jobs) > 8 else "")
        raise SlurmError("ambiguous", f"job {jid} has {len(jobs)} parts ({ids}): hangscope looks at one job",
                         hint=f"give one of them, e.g. hangscope --slurm {jobs[0].job_id}")
    job = jobs[0]
    if not job.running:
        why = f" ({job.reason})" if job.reason else ""
        raise SlurmError("not_running", f"job {jid} is {job.state or 'in an unknown state'}{why}, not RUNNING: "
                         "there are no ranks to look at", hint="wait until squeue shows it R, or pick a running job")
    return _with_nodes(job, env, timeout)


def _with_nodes(job: SlurmJob, env: Mapping[str, str], timeout: float) -> SlurmJob:
    try:
        expanded = [h.host for h in parse_nodelist(job.nodelist, source=f"job {job.job_id} NodeList")]
    except HostsError as exc:
        raise SlurmError("bad_nodes", f"job {job.job_id}: cannot use its node list: {exc}") from None
    if not expanded:
        raise SlurmError("bad_nodes", f"job {job.job_id} is RUNNING but SLURM gave no node list")
    warnings = list(job.warnings)
    scontrol = shutil.which("scontrol", path=env.get("PATH", os.defpath))
    nodes = expanded
    if scontrol is not None:
        done = _run([scontrol, "show", "hostnames", job.nodelist], env, timeout)
        names = done.stdout.split()
        if done.returncode == 0 and names and names != expanded:
            try:  # SLURM's own expansion wins, once it is checked like any node name
                checked = [h.host for h in parse_nodelist(",".join(names), source="scontrol show hostnames")]
            except HostsError as exc:
                warnings.append(f"scontrol show hostnames gave unusable names ({exc}); using ClusterShell's")
            else:
                warnings.append(f"scontrol show hostnames and ClusterShell expand {job.nodelist} differently; "
                                f"using SLURM's {len(checked)} node(s)")
                nodes = checked
    if job.num_nodes is not None and job.num_nodes != len(nodes):
        warnings.append(f"SLURM counts {job.num_nodes} node(s) in job {job.job_id}, its node list has {len(nodes)}")
    return dataclasses.replace(job, nodes=tuple(nodes), warnings=tuple(warnings))


def host_specs(job: SlurmJob, transport: TransportKind = "ssh") -> list[HostSpec]:
    """The job's nodes as the session's HostSpecs (one rank group per node, names as SLURM spells them), reached
    over `transport` (ssh, srun, or auto: SSH, srun where SSH cannot get in)."""
    return [HostSpec(name=n, host=n, source=f"slurm job {job.job_id}", transport=transport) for n in job.nodes]
