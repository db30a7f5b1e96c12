"""Command line: argument parsing, the headless modes (--snapshot, --load, summary) and exit codes.

Exit codes (app.cli.headless.exit_status): 0 every rank collected, 1 partial (a node failed, a rank could not be
dumped, ranks missing from WORLD_SIZE, a rank gone since an earlier sample), 2 bad input, 3 nothing collected
(no rank found), 130 interrupted (Ctrl+C); --load: 0 once the file is read and shown. The TUI has its own module; this one only decides which mode runs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from typing import Optional, Sequence

from app import __version__
from app.cli.run import run_interruptible  # noqa: F401 (re-exported: the modes run through it)
from app.errors import HangscopeError, InputError

EXIT_OK, EXIT_PARTIAL, EXIT_INPUT, EXIT_NOTHING, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

EXAMPLES = """\
examples:
  hangscope hosts.txt                      open the TUI on the job on the nodes listed in hosts.txt
  hangscope hosts.txt --print              headless: collect, print the summary (no TUI)
  hangscope -w 'gpu[001-004]' --native     nodes from a SLURM/pdsh node list, with C/C++ frames
  hangscope hosts.txt --snapshot out.json  headless: collect once, print the summary, write the snapshot
  hangscope --load out.json                open a saved snapshot in the TUI (--print: the summary)
  hangscope --load out.json --export rep/  write a report bundle that is safe to share (default-deny)
  hangscope                                investigate ranks on this machine (no SSH)
  hangscope demo                           start a local 4-rank torch job that hangs, and investigate it
  hangscope watch hosts.txt                follow a running job; capture the evidence the moment it stalls
  hangscope hosts.txt --test pairs         find the bad node or link with all_reduce tests on node pairs
  hangscope --slurm 12345 --print          the nodes of SLURM job 12345 (SSH, or srun where SSH is blocked)
  scontrol show hostnames | hangscope -    hosts from stdin

hosts file: one node per line: node01 | node01 slots=8 | node01:8 (8 slots) | user@node01:2222 |
  10.0.0.5 | [fe80::1]:22 | gpu[001-004,010]; '#' comments. ~/.ssh/config and /etc/ssh/ssh_config apply.
exit codes: 0 every rank collected; 1 partial (a node failed, a rank not dumped, ranks missing from
  WORLD_SIZE or gone since an earlier sample); 2 bad input; 3 nothing collected (no rank found);
  130 interrupted. --load exits 0 once the file is read.
time: each node's connect and login (TCP, banner, key exchange, authentication, MaxStartups retries) is
  bounded by --connect-timeout C; nodes connect --fanout F at a time, so N nodes that cannot be reached cost
  at most ceil(N/F) x C in all; a node that failed to connect is not tried again in later --samples.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hangscope",
        description="Investigate a hung multi-node PyTorch job while it is still hung: connect to every "
        "node over SSH, find the ranks, dump their stacks and show which rank is the odd one out.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("hosts", nargs="?", metavar="HOSTS",
                   help="hosts file ('-' for stdin); without HOSTS or -w, this machine is investigated")
    p.add_argument("-w", dest="nodelist", action="append", default=[], metavar="NODELIST",
                   help="comma-separated nodes or node lists, e.g. 'gpu[001-004],login1' (repeatable)")
    p.add_argument("--version", action="store_true", help="print versions of hangscope and its tools")
    mode = p.add_argument_group("headless modes")
    mode.add_argument("--print", dest="print_summary", action="store_true",
                      help="collect, print the summary and exit (no TUI)")
    mode.add_argument("--snapshot", metavar="FILE", help="collect, print the summary, write the snapshot JSON")
    mode.add_argument("--load", metavar="FILE", help="read a snapshot JSON instead of collecting")
    mode.add_argument("--export", metavar="DIR",
                      help="write a report bundle (summary.md, report.html, snapshot.json, ...) to DIR")
    mode.add_argument("--tar", action="store_true", help="with --export, also write DIR.tar.gz")
    mode.add_argument("--force", action="store_true", help="overwrite an existing --snapshot file or --export DIR")
    mode.add_argument("--raw", action="store_true",
                      help="with --snapshot or --print: values as collected (only what the pattern rules catch is "
                      "masked, as in the TUI) instead of default-deny in the snapshot file and in the error output "
                      "--print quotes; not for sharing (--export is always default-deny)")
    col = p.add_argument_group("collection")
    col.add_argument("--locals", action=argparse.BooleanOptionalAction, default=True,
                     help="collect local variables (py-spy --locals, on by default): tells loop iterations "
                     "apart; --no-locals to skip them")
    col.add_argument("--native", action="store_true",
                     help="include native (C/C++) frames (py-spy --native; pauses each rank ~0.5 s)")
    col.add_argument("--nonblocking", action="store_true",
                     help="sample without pausing the ranks (py-spy --nonblocking; not with --native)")
    col.add_argument("--strace", type=float, metavar="SECONDS", default=0.0,
                     help="also strace every rank for SECONDS (traces the rank; capped output)")
    col.add_argument("--strace-data", action="store_true",
                     help="with --strace, show the protocol verb (AUTH, GET, +OK) each call's bytes start with, "
                     "never what follows it (by default only syscall, fd, size and result)")
    col.add_argument("--gdb", action="store_true",
                     help="also take a gdb backtrace of every rank (stops each rank ~3 s; opt-in)")
    col.add_argument("--pid", dest="pids", type=int, action="append", metavar="PID",
                     help="inspect only this process (repeatable; on every node, mostly for this machine)")
    col.add_argument("--match", metavar="REGEX",
                     help="inspect only the python processes whose command line matches this regular expression, "
                     "on every node, rank environment or not (a launcher above a matching process is left out): "
                     "picks the ranks where discovery finds none or too many, e.g. --match 'train\\.py'")
    col.add_argument("--store", action=argparse.BooleanOptionalAction, default=True,
                     help="for ranks whose process carries no rank number (mp.spawn, multiprocessing), read it "
                     "from the job's TCPStore (read-only queries, one connection; on by default); --no-store to "
                     "leave the store alone")
    col.add_argument("--job", metavar="JOB",
                     help="analyse only this job of the snapshot: its name as the summary prints it, or a part "
                     "of it that names one job (e.g. the master port 29500)")
    col.add_argument("--sudo", action="store_true", help="run tools on nodes with `sudo -n` (never prompts)")
    col.add_argument("--gpu-evidence", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),
                     help="GPU-side evidence per node (Xid lines, ECC/row-remap counts, nvidia-smi, NCCL RAS): "
                     "auto collects it for NCCL/CUDA jobs (a rank maps libnccl or libcuda), on (the flag alone) "
                     "always, off never")
    col.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per-rank dump deadline (30)")
    col.add_argument("--samples", type=int, default=2, metavar="N",
                     help="headless: take N snapshots --interval apart to tell stuck ranks from progressing "
                     "ones (2; 1 = a single snapshot)")
    col.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between samples (1)")
    ssh = p.add_argument_group("ssh")
    ssh.add_argument("-F", dest="ssh_config", action="append", metavar="FILE",
                     help="ssh config file(s) instead of ~/.ssh/config and /etc/ssh/ssh_config")
    ssh.add_argument("-i", dest="identity", action="append", default=[], metavar="KEY", help="identity file")
    ssh.add_argument("--accept-new-host-keys", action="store_true",
                     help="add UNKNOWN host keys to ~/.ssh/known_hosts (a CHANGED key is always refused)")
    ssh.add_argument("--fanout", type=int, default=64, metavar="N", help="nodes connected at once (64)")
    ssh.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                     help="deadline for each node's whole connect and login: TCP (and any ProxyJump), sshd's "
                     "banner, key exchange, authentication and MaxStartups retries (10)")
    ssh.add_argument("--python", metavar="PATH", help="the nodes' python3, flags allowed (default: \"python3 -S\": the worker is stdlib-only)")
    ssh.add_argument("--max-hosts", type=int, default=10000, metavar="N", help="refuse more hosts (10000)")
    tui = p.add_argument_group("TUI")
    tui.add_argument("--refresh", dest="refresh_interval", type=float, default=None, metavar="S",
                     help="refresh automatically every S seconds (non-blocking sampling)")
    tui.add_argument("--fps", type=int, default=None, metavar="N",
                     help="limit screen updates to N per second (slow links); below 30 also no animations")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-node progress on stderr")
    from app.cli.gpu import add_test_arguments
    from app.slurm.cli import add_slurm_arguments

    add_test_arguments(p)
    add_slurm_arguments(p)
    return p


def versions_text() -> str:
    """hangscope's version and those of the tools it drives (what a bug report needs)."""
    from importlib import metadata

    from app.transport.login_tools import pyspy_version

    parts = [f"hangscope {__version__}"]
    for dist in ("asyncssh", "textual", "psutil", "ClusterShell"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    parts.append(f"py-spy {pyspy_version() or '(not found)'}")
    parts.append(f"python {sys.version.split()[0]}")
    return "\n".join(parts)


def _check_match(pattern: str) -> None:
    """A --match pattern the nodes can use, checked here before any connection (python's re on both sides)."""
    from workers.protocol import MATCH_LIMIT

    if not 0 < len(pattern) <= MATCH_LIMIT:
        raise InputError(f"--match takes a regular expression of 1 to {MATCH_LIMIT} characters")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise InputError(f"--match {pattern!r} is not a regular expression: {exc}") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["watch"]:
        from app.cli.watch import watch_main

        return watch_main(args_list[1:], read_hosts=_read_hosts, report=_error, check_match=_check_match)
    if args_list[:1] == ["demo"]:
        from app.cli.demo import demo_main

        return demo_main(args_list[1:], build_parser())
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.version:
        print(versions_text())
        return EXIT_OK
    try:
        return _run(args)
    except InputError as exc:
        _error(exc)
        return EXIT_INPUT
    except HangscopeError as exc:
        _error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("hangscope: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _error(exc: HangscopeError) -> None:
    print(f"hangscope: {exc.title}: {exc}", file=sys.stderr)
    if exc.hint:
        print(textwrap.indent(textwrap.fill(exc.hint, 96), "  hint: "), file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    from app.cli import headless

    headless_mode = bool(args.print_summary or args.snapshot or args.export)
    if getattr(args, "raw", False) and not (args.snapshot or args.print_summary):
        raise InputError("--raw applies to --snapshot FILE and --print (an --export bundle is always default-deny)")
    if args.load:
        if args.hosts or args.nodelist:
            raise InputError("--load reads a saved snapshot; do not also give hosts")
        if headless_mode:
            return headless.show_loaded(args.load, export=args.export, force=args.force, tar=args.tar,
                                        job=args.job, raw=getattr(args, "raw", False))
        snap = headless.load_snapshot(args.load)
        _require_terminal()
        from app.ui import run_tui
        from app.ui.source import loaded_source

        return run_tui(loaded_source(snap), fps=args.fps, title=args.load)
    if args.refresh_interval is not None and args.refresh_interval <= 0 or args.fps is not None and args.fps < 1:
        raise InputError("--refresh and --fps must be positive")
    if args.nonblocking and args.native:
        raise InputError("--native cannot be combined with --nonblocking (py-spy refuses it)")
    if args.fanout < 1 or args.timeout <= 0 or args.connect_timeout <= 0 or args.strace < 0:
        raise InputError("--fanout, --timeout and --connect-timeout must be positive, --strace >= 0")
    if args.samples < 1 or args.interval < 0:
        raise InputError("--samples must be at least 1 and --interval not negative")
    if getattr(args, "match", None) is not None:
        _check_match(args.match)
    if args.slurm is not None:  # the job's nodes from SLURM, reached over --transport
        from app.slurm.cli import slurm_hosts

        hosts = slurm_hosts(args)
    else:
        from app.slurm.cli import check_transport

        check_transport(args)
        hosts = _read_hosts(args)
    if args.test:
        from app.cli.gpu import options_from_args, run_tests_headless

        _, code = run_tests_headless(hosts, args.test, options_from_args(args),
                                     session_options=headless.session_options(args),
                                     json_path=args.json_path, force=args.force, quiet=args.quiet)
        return code
    if args.snapshot and os.path.lexists(args.snapshot) and not args.force:
        raise InputError(f"{args.snapshot} exists; pass --force to overwrite it")
    if headless_mode:
        return headless.collect_and_report(hosts, args)
    _require_terminal()
    from app.ui import run_tui
    from app.ui.source import LiveSource

    title = getattr(args, "slurm_title", "") or args.hosts or ",".join(args.nodelist) or "this machine"
    from app.cli.gpu import options_from_args

    # the GPU-test flags (--test-timeout, --nccl-env, ...) also apply to tests started from the TUI
    source = LiveSource(hosts, headless.session_options(args), gpu_options=options_from_args(args))
    return run_tui(source, fps=args.fps, title=title,
                   interval=args.refresh_interval)


def _require_terminal() -> None:
    """The TUI needs a terminal on stdin and stdout; in a pipe or a batch job, say how to run headless."""
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise InputError("stdout or stdin is not a terminal, so the TUI cannot start",
                         hint="use headless mode: --print (summary), --snapshot FILE or --export DIR")


def _read_hosts(args: argparse.Namespace):
    """The HostSpecs from HOSTS and -w, or None for this machine; raises InputError before any connection."""
    from app.hosts import merge, parse_nodelist, read_hosts

    lists = []
    if args.hosts:
        lists.append(read_hosts(args.hosts, stdin=sys.stdin.buffer, max_hosts=args.max_hosts))
    for nl in args.nodelist:
        lists.append(parse_nodelist(nl, max_hosts=args.max_hosts))
    if not lists:
        return None
    merged = merge(*lists)
    if len(merged.hosts) > args.max_hosts:
        raise InputError(f"{len(merged.hosts)} hosts is more than --max-hosts {args.max_hosts}")
    for w in merged.warnings:
        print(f"hangscope: warning: {w}", file=sys.stderr)
    if not merged.hosts:
        raise InputError("no hosts given")
    return list(merged.hosts)
