"""The command line's SLURM part: `--slurm [JOBID]` and `--transport ssh|srun|auto`, resolved into hosts."""

from __future__ import annotations

import argparse
import os
import sys

from app.errors import InputError
from app.hosts import HostSpec
from app.slurm.resolve import host_specs, resolve_job
from app.transport import bootstrap
from app.transport.srun import SrunOptions


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("SLURM")
    g.add_argument("--slurm", nargs="?", const="", default=None, metavar="JOBID",
                   help="investigate this running SLURM job's nodes (without JOBID: this allocation's, "
                   "SLURM_JOB_ID)")
    g.add_argument("--transport", choices=("ssh", "srun", "auto"), default="auto",
                   help="how to reach nodes: ssh, srun (one `srun --overlap` step in the job: works where SSH to "
                   "compute nodes is blocked) or auto (with --slurm: SSH, srun for nodes SSH cannot reach; "
                   "without --slurm: SSH)")


def slurm_hosts(args: argparse.Namespace) -> list[HostSpec]:
    """Resolve --slurm into the job's nodes, each to be reached as --transport says; sets `args.srun` (the job
    for srun) and `args.slurm_title` (the TUI's title); InputError when the job cannot be used."""
    if args.hosts or args.nodelist:
        given = f"HOSTS {args.hosts}" if args.hosts else f"-w {args.nodelist[0]}"
        raise InputError(f"--slurm finds the job's nodes itself; do not also give {given}")
    job = resolve_job(args.slurm or None, os.environ)
    if not args.quiet:
        print(f"hangscope: {job.summary()} (from {job.source})", file=sys.stderr)
    for warning in job.warnings:
        print(f"hangscope: warning: {warning}", file=sys.stderr)
    args.slurm_title = f"SLURM job {job.job_id} ({job.name})" if job.name else f"SLURM job {job.job_id}"
    args.srun = SrunOptions(job_id=job.job_id, python=args.python or bootstrap.DEFAULT_PYTHON)
    return host_specs(job, args.transport)


def check_transport(args: argparse.Namespace) -> None:
    """srun needs a job: refuse `--transport srun` without --slurm before anything connects."""
    if args.transport == "srun" and args.slurm is None:
        raise InputError("--transport srun needs --slurm JOBID (srun runs inside a job's allocation)")
