"""Command line: argument parsing, the headless modes (--snapshot, --load, summary) and exit codes.

Exit codes (app.cli.headless.exit_status): 0 every rank collected, 1 partial (a node failed, a rank could not be
dumped, ranks missing from WORLD_SIZE, a rank gone since an earlier sample), 2 bad input, 3 nothing collected
(no rank found), 130 interrupted (Ctrl+C); --load: 0 once the file is read and shown. The TUI has its own module; this one only decides which mode runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from app import __version__
from app.cli.run import OneLineParser, run_interruptible  # noqa: F401 (re-exported: the modes run through it)
from app.errors import HangscopeError, InputError
from app.inputs import numbers
from app.inputs.text import python_command, text_arg

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


# Ranges of the numeric flags, stated in --help (app.inputs.numbers: one parser per kind of number).
# (those `hangscope watch` takes too are in app/cli/ranges.py, one definition for both)
from app.cli.ranges import CONNECT_TIMEOUT, DUMP_TIMEOUT, FANOUT, FPS, MAX_HOSTS, PID  # noqa: E402

SAMPLES = numbers.count(1, 100)
INTERVAL = numbers.seconds(0, 3600)
STRACE = numbers.seconds(0, 60)  # a rank is traced (slowed) for this long: bounded, whatever was typed
REFRESH = numbers.seconds(0.5, 3600)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="hangscope",
        description="Investigate a hung multi-node PyTorch job while it is still hung: connect to every "
        "node over SSH, find the ranks, dump their stacks and show which rank is the odd one out.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("hosts", nargs="?", metavar="HOSTS", type=text_arg("HOSTS"),
                   help="hosts file ('-' for stdin; a regular file, never a FIFO or a device); without HOSTS or "
                   "-w, this machine is investigated")
    p.add_argument("-w", dest="nodelist", action="append", default=[], metavar="NODELIST",
                   help="comma-separated nodes or node lists, e.g. 'gpu[001-004],login1' (repeatable)")
    p.add_argument("--version", action="store_true", help="print versions of hangscope and its tools")
    mode = p.add_argument_group("headless modes (output paths: a new or regular file, never a symlink, FIFO or "
                                "device, never in /proc, /sys or /dev, never an input of the same command)")
    mode.add_argument("--print", dest="print_summary", action="store_true",
                      help="collect, print the summary and exit (no TUI)")
    mode.add_argument("--snapshot", metavar="FILE", type=text_arg("--snapshot"),
                      help="collect, print the summary, write the snapshot JSON")
    mode.add_argument("--load", metavar="FILE", type=text_arg("--load"),
                      help="read a snapshot JSON instead of collecting ('-' for stdin); collection, SSH and GPU-test "
                      "flags are refused with it")
    mode.add_argument("--export", metavar="DIR", type=text_arg("--export"),
                      help="write a report bundle (summary.md, report.html, snapshot.json, ...) to DIR")
    mode.add_argument("--tar", action="store_true", help="with --export, also write DIR.tar.gz")
    mode.add_argument("--force", action="store_true",
                      help="replace an existing --snapshot or --json file (a regular file only) or an earlier --export "
                      "bundle")
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
    numbers.add_number(col, "--strace", kind=STRACE, default=0.0, metavar="SECONDS",
                       help="also strace every rank for SECONDS (traces the rank; capped output; 0: no strace)")
    col.add_argument("--strace-data", action="store_true",
                     help="with --strace, keep the first bytes each call read or wrote (redacted on the node; "
                     "by default only syscall, fd, size and result)")
    col.add_argument("--gdb", action="store_true",
                     help="also take a gdb backtrace of every rank (stops each rank ~3 s; opt-in)")
    numbers.add_number(col, "--pid", kind=PID, dest="pids", action="append", metavar="PID",
                       help="inspect only this process (repeatable; on every node, mostly for this machine)")
    col.add_argument("--match", metavar="REGEX", type=text_arg("--match"),
                     help="inspect only the python processes whose command line matches this regular expression, "
                     "on every node, rank environment or not (a launcher above a matching process is left out): "
                     "picks the ranks where discovery finds none or too many, e.g. --match 'train\\.py'; at most "
                     "200 characters, and patterns that backtrack without bound (nested or overlapping "
                     "repeats such as (a+)+) are refused")
    col.add_argument("--store", action=argparse.BooleanOptionalAction, default=True,
                     help="for ranks whose process carries no rank number (mp.spawn, multiprocessing), read it "
                     "from the job's TCPStore (read-only queries, one connection; on by default); --no-store to "
                     "leave the store alone")
    col.add_argument("--job", metavar="JOB", type=text_arg("--job", max_len=1024),
                     help="analyse only this job of the snapshot: its name as the summary prints it, or a part "
                     "of it that names one job (e.g. the master port 29500)")
    col.add_argument("--sudo", action="store_true", help="run tools on nodes with `sudo -n` (never prompts)")
    col.add_argument("--gpu-evidence", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),
                     help="GPU-side evidence per node (Xid lines, ECC/row-remap counts, nvidia-smi, NCCL RAS): "
                     "auto collects it for NCCL/CUDA jobs (a rank maps libnccl or libcuda), on (the flag alone) "
                     "always, off never")
    numbers.add_number(col, "--timeout", kind=DUMP_TIMEOUT, default=30.0, metavar="S", help="per-rank dump deadline")
    numbers.add_number(col, "--samples", kind=SAMPLES, default=2, metavar="N",
                       help="headless: take N snapshots --interval apart to tell stuck ranks from progressing "
                       "ones (1 = a single snapshot)")
    numbers.add_number(col, "--interval", kind=INTERVAL, default=1.0, metavar="S",
                       help="headless: seconds between samples")
    ssh = p.add_argument_group("ssh (config, identity and known_hosts files must be regular files)")
    ssh.add_argument("-F", dest="ssh_config", action="append", metavar="FILE", type=text_arg("-F"),
                     help="ssh config file(s) instead of ~/.ssh/config and /etc/ssh/ssh_config")
    ssh.add_argument("-i", dest="identity", action="append", default=[], metavar="KEY", type=text_arg("-i"),
                     help="identity file")
    ssh.add_argument("--accept-new-host-keys", action="store_true",
                     help="add UNKNOWN host keys to ~/.ssh/known_hosts (a CHANGED key is always refused)")
    numbers.add_number(ssh, "--fanout", kind=FANOUT, default=64, metavar="N", help="nodes connected at once")
    ssh.add_argument("--relay", default="auto", type=relay_arg, metavar="auto|off|W",
                     help="reach SSH nodes through relays, W nodes each (one SSH connection per group; each relay "
                     "starts the worker on its group with the node's own ssh, so nodes must be able to ssh to each "
                     "other): auto (default) relays from 64 nodes with W ~ sqrt(nodes), off never")
    numbers.add_number(ssh, "--connect-timeout", kind=CONNECT_TIMEOUT, default=10.0, metavar="S",
                       help="deadline for each node's whole connect and login: TCP (and any ProxyJump), sshd's "
                       "banner, key exchange, authentication and MaxStartups retries")
    ssh.add_argument("--python", metavar="PATH", type=python_command,
                     help="the nodes' python3, flags allowed (default: \"python3 -S\": the worker is stdlib-only)")
    numbers.add_number(ssh, "--max-hosts", kind=MAX_HOSTS, default=10000, metavar="N", help="refuse more hosts")
    tui = p.add_argument_group("TUI")
    numbers.add_number(tui, "--refresh", kind=REFRESH, dest="refresh_interval", metavar="S",
                       help="refresh automatically every S seconds (non-blocking sampling)")
    numbers.add_number(tui, "--fps", kind=FPS, metavar="N",
                       help="limit screen updates to N per second (slow links); below 30 also no animations")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-node progress on stderr")
    from app.cli.gpu import add_test_arguments
    from app.slurm.cli import add_slurm_arguments

    add_test_arguments(p)
    add_slurm_arguments(p)
    return p


def relay_arg(value: str) -> str:
    """`--relay`: auto, off, or a width of 2 or more (app/transport/relay)."""
    value = value.strip().lower()
    if value in ("auto", "off") or (value.isdigit() and 2 <= int(value) <= 10000):
        return value
    raise argparse.ArgumentTypeError(f"expected auto, off or a width from 2 to 10000, not {value!r}")


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
    """A --match pattern the nodes can search in bounded time, checked before any connection (the worker
    applies the same rules, workers.patterns)."""
    from workers.patterns import problem
    from workers.protocol import MATCH_LIMIT

    if not 0 < len(pattern) <= MATCH_LIMIT:
        raise InputError(f"--match takes a regular expression of 1 to {MATCH_LIMIT} characters, not {len(pattern)}")
    why = problem(pattern)
    if why is not None:
        raise InputError(why)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The `hangscope` command; returns its exit code. Every refusal is one line on stderr; Ctrl+C at any point
    (even while the arguments are parsed) is exit 130 without a traceback."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        print("hangscope: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(args_list: list) -> int:
    try:
        if args_list[:1] == ["watch"]:
            from app.cli.watch import watch_main

            return watch_main(args_list[1:], read_hosts=_read_hosts, report=_error, check_match=_check_match)
        if args_list[:1] == ["demo"]:
            from app.cli.demo import demo_main

            return demo_main(args_list[1:], build_parser())
        args = build_parser().parse_args(args_list)
        if args.version:
            print(versions_text())
            return EXIT_OK
        from app.cli.modes import check_modes, explicit_flags

        mode = check_modes(args, explicit_flags(build_parser, args_list))
        return _run(args, mode)
    except InputError as exc:
        _error(exc)
        return EXIT_INPUT
    except HangscopeError as exc:
        _error(exc)
        return exc.exit_code


def _error(exc: HangscopeError) -> None:
    """One line, whatever the error: the title, the message and the hint after a semicolon."""
    hint = f"; hint: {exc.hint}" if exc.hint and exc.hint not in str(exc) else ""
    line = f"hangscope: {exc.title}: {exc}{hint}"
    print(" ".join(line.split()), file=sys.stderr)


def _inputs(args: argparse.Namespace) -> list:
    """The files this command reads: an output must never be one of them."""
    files = [args.hosts, args.load, *(args.ssh_config or []), *(args.identity or [])]
    return [f for f in files if f and f != "-"]


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output path, before anything is read from the network: the same checks as at write time, and
    that its directory is writable and not full (found now, not after the collection)."""
    from app.inputs.paths import check_file

    inputs = _inputs(args)
    if args.snapshot:
        check_file(args.snapshot, flag="--snapshot", force=args.force, inputs=inputs, writable=True)
    if getattr(args, "json_path", None):
        check_file(args.json_path, flag="--json", force=args.force, inputs=inputs, writable=True)
    if args.export:
        from app.report.bundle import BUNDLE_NAMES
        from app.report.writer import check_destination

        check_destination(args.export, force=args.force, tar=args.tar, names=BUNDLE_NAMES, inputs=inputs,
                          flag="--export", writable=True)
    if args.snapshot and args.export:
        from app.inputs.files import identity

        if os.path.normpath(os.path.dirname(os.path.abspath(args.snapshot))) == os.path.abspath(args.export) \
                or identity(args.snapshot) is not None and identity(args.snapshot) == identity(args.export):
            raise InputError(f"--snapshot {args.snapshot} is inside --export {args.export}; write it elsewhere")


def _run(args: argparse.Namespace, mode: str) -> int:
    from app.cli import headless

    if args.nonblocking and args.native:
        raise InputError("--native cannot be combined with --nonblocking (py-spy refuses it)")
    if args.match is not None:
        _check_match(args.match)
    _check_outputs(args)
    if mode in ("load", "load-tui"):
        if mode == "load":
            return headless.show_loaded(args.load, export=args.export, force=args.force, tar=args.tar,
                                        job=args.job, raw=args.raw)
        snap = headless.load_snapshot(args.load)
        _require_terminal()
        from app.ui import run_tui
        from app.ui.source import loaded_source

        return run_tui(loaded_source(snap), fps=args.fps, title=args.load)
    gpu_options = None
    if mode in ("test", "tui"):
        from app.cli.gpu import options_from_args

        gpu_options = options_from_args(args)  # checked now: the TUI's G key runs tests with them
    if args.slurm is not None:  # the job's nodes from SLURM, reached over --transport
        from app.slurm.cli import slurm_hosts

        hosts = slurm_hosts(args)
    else:
        from app.slurm.cli import check_transport

        check_transport(args)
        hosts = _read_hosts(args)
    if hosts is not None:
        from app.transport.files import check_ssh_files

        check_ssh_files(args.ssh_config, args.identity)
    if mode == "tui":
        _require_terminal()  # before anything connects
    if args.test:
        from app.cli.gpu import run_tests_headless

        assert gpu_options is not None
        _, code = run_tests_headless(hosts, args.test, gpu_options,
                                     session_options=headless.session_options(args),
                                     json_path=args.json_path, force=args.force, quiet=args.quiet,
                                     inputs=_inputs(args))
        return code
    if mode == "headless":
        return headless.collect_and_report(hosts, args, inputs=_inputs(args))
    from app.ui import run_tui
    from app.ui.source import LiveSource

    title = getattr(args, "slurm_title", "") or args.hosts or ",".join(args.nodelist) or "this machine"
    # the GPU-test flags (--test-timeout, --nccl-env, ...) also apply to tests started from the TUI
    source = LiveSource(hosts, headless.session_options(args), gpu_options=gpu_options)
    return run_tui(source, fps=args.fps, title=title,
                   interval=args.refresh_interval)


def _require_terminal() -> None:
    """The TUI needs a terminal on stdin and stdout; in a pipe or a batch job, say how to run headless."""
    if not (sys.stdout is not None and sys.stdout.isatty() and sys.stdin is not None and sys.stdin.isatty()):
        raise InputError("stdout or stdin is not a terminal, so the TUI cannot start",
                         hint="use headless mode: --print (summary), --snapshot FILE or --export DIR")


def _read_hosts(args: argparse.Namespace):
    """The HostSpecs from HOSTS and -w, or None for this machine; raises InputError before any connection."""
    from app.hosts import merge, parse_nodelist, read_hosts

    lists = []
    if args.hosts:
        stdin = sys.stdin.buffer if sys.stdin is not None else None
        lists.append(read_hosts(args.hosts, stdin=stdin, max_hosts=args.max_hosts))
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
