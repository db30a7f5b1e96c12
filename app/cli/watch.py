"""`hangscope watch`: follow a running job with cheap samples and capture the evidence the moment it stalls.

Exit codes: 0 every job it followed has ended (or --once captured one), 1 a capture failed, 2 bad input, 3 no job
was found within --wait-start (or nothing could be reached), 130 interrupted. The watcher itself is app.watch; this
module only reads the command line, prints the watcher's events, and starts the TUI with --tui.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from typing import Any, Callable, List, Optional, Sequence, TextIO

from app.errors import HangscopeError, InputError

EXIT_OK, EXIT_INPUT, EXIT_INTERRUPTED = 0, 2, 130

EXAMPLES = """\
examples:
  hangscope watch hosts.txt                        follow the job on these nodes; captures go to ./hangscope-watch
  hangscope watch -w 'gpu[001-064]' --out /scratch/me/hangs --on-hang 'notify-send hang'
  hangscope watch --slurm 12345 --transport srun   the nodes of SLURM job 12345, through srun only
  nohup hangscope watch hosts.txt --out hangs > watch.log 2>&1 &
  hangscope watch hosts.txt --tui                  the jobs, their rate over time and the captures

--on-hang CMD is split like a shell would split it, once, and executed without a shell; the capture is in its
environment: HANGSCOPE_BUNDLE (the bundle directory), HANGSCOPE_SNAPSHOT (its snapshot.json, for --load),
HANGSCOPE_HEADLINE (the diagnosis, one line: text from the nodes, quote it), HANGSCOPE_JOB, HANGSCOPE_KIND
(hang | slow). It runs in a process group of its own: what it leaves running there is ended when it exits (or
at --on-hang-timeout); a process that must outlive it starts its own session (setsid).
exit codes: 0 every job followed has ended (or --once captured one); 1 a capture failed; 2 bad input; 3 no job
  found within --wait-start; 130 interrupted. hangscope watch never restarts, stops or kills anything.
"""


def build_parser() -> argparse.ArgumentParser:
    from app.slurm.cli import add_slurm_arguments

    from app.cli.ranges import CONNECT_TIMEOUT, DUMP_TIMEOUT, FANOUT, FPS, MAX_HOSTS, PID
    from app.cli.run import OneLineParser
    from app.inputs import numbers
    from app.inputs.text import python_command, text_arg
    from app.watch.options import EVERY, HOOK_TIMEOUT, KEEP, SLOW, STALL, WAIT_START

    p = OneLineParser(
        prog="hangscope watch",
        description="Follow a running job with cheap samples (/proc and counters: no ptrace, no py-spy) and, the "
        "moment it stops progressing (or runs slow), capture the full snapshot and report bundle, before its own "
        "watchdog kills it.", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    # every number through its kind (plain ASCII decimals, a closed range --help states), every text through
    # text_arg (never empty, no control character), as the main command's flags: the same flag takes the same
    # values whichever command it is given to (app/cli/ranges.py)
    p.add_argument("hosts", nargs="?", metavar="HOSTS", type=text_arg("HOSTS"),
                   help="hosts file ('-' for stdin); without HOSTS or -w, this machine is watched")
    p.add_argument("-w", dest="nodelist", action="append", default=[], metavar="NODELIST",
                   help="comma-separated nodes or node lists, e.g. 'gpu[001-004],login1' (repeatable)")
    w = p.add_argument_group("watch")
    numbers.add_number(w, "--every", kind=EVERY, default=30.0, metavar="S", help="seconds between cheap samples")
    numbers.add_number(w, "--stall", kind=STALL, default=120.0, metavar="S",
                       help="capture a job that has made no progress for S seconds (lowered to a quarter of the "
                       "job's own watchdog timeout when that is shorter)")
    numbers.add_number(w, "--stall-start", kind=STALL, metavar="S",
                       help="the same for a job not yet seen progressing: start-up (imports, rendezvous, loading a "
                       "checkpoint) is quiet too (default: 4 x --stall, at least 300 s)")
    numbers.add_number(w, "--slow", kind=SLOW, default=0.5, metavar="F",
                       help="capture a job whose rate stays below F of its own recent rate for --stall (0: never)")
    w.add_argument("--out", default="hangscope-watch", metavar="DIR", type=text_arg("--out"),
                   help="where captures (report bundles) and the history of samples go; created 0700, never in "
                   "/proc, /sys or /dev (hangscope-watch)")
    numbers.add_number(w, "--keep", kind=KEEP, default=20, metavar="N",
                       help="capture bundles kept in --out, the oldest of hangscope's own removed")
    w.add_argument("--on-hang", metavar="CMD", type=text_arg("--on-hang"),
                   help="run CMD after each capture (no shell; see below)")
    numbers.add_number(w, "--on-hang-timeout", kind=HOOK_TIMEOUT, default=300.0, metavar="S",
                       help="seconds --on-hang may run before it is killed")
    w.add_argument("--once", action="store_true", help="exit after the first capture")
    numbers.add_number(w, "--wait-start", kind=WAIT_START, default=600.0, metavar="S",
                       help="seconds to wait for a job to appear on the nodes before giving up")
    w.add_argument("--job", metavar="JOB", type=text_arg("--job", max_len=1024),
                   help="follow only this job (its name as printed, or a part of it)")
    w.add_argument("--tui", action="store_true",
                   help="show the jobs, their rate over time and the captures in the TUI (Enter opens a capture)")
    numbers.add_number(w, "--fps", kind=FPS, metavar="N", help="with --tui: at most N screen updates a second")
    w.add_argument("-v", "--verbose", action="store_true", help="print every sample (default: every 10 min)")
    col = p.add_argument_group("the capture (as --snapshot collects)")
    col.add_argument("--locals", action=argparse.BooleanOptionalAction, default=True,
                     help="collect local variables at a capture (py-spy --locals, on by default)")
    col.add_argument("--native", action="store_true", help="include native frames at a capture (pauses each rank ~0.5 s)")
    col.add_argument("--nonblocking", action="store_true", help="capture without pausing the ranks (py-spy --nonblocking)")
    numbers.add_number(col, "--timeout", kind=DUMP_TIMEOUT, default=30.0, metavar="S",
                       help="per-rank dump deadline at a capture")
    numbers.add_number(col, "--pid", kind=PID, dest="pids", action="append", metavar="PID",
                       help="watch only this process (repeatable; on every node)")
    col.add_argument("--match", metavar="REGEX", type=text_arg("--match"),
                     help="watch only python processes whose command line matches")
    col.add_argument("--store", action=argparse.BooleanOptionalAction, default=True,
                     help="read rank numbers from the job's TCPStore where the ranks carry none (on by default)")
    col.add_argument("--sudo", action="store_true", help="run tools on nodes with `sudo -n` (never prompts)")
    col.add_argument("--gpu-evidence", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),
                     help="GPU-side evidence at a capture (auto: NCCL/CUDA jobs)")
    ssh = p.add_argument_group("ssh")
    ssh.add_argument("-F", dest="ssh_config", action="append", metavar="FILE", type=text_arg("-F"),
                     help="ssh config file(s)")
    ssh.add_argument("-i", dest="identity", action="append", default=[], metavar="KEY", type=text_arg("-i"),
                     help="identity file")
    ssh.add_argument("--accept-new-host-keys", action="store_true", help="add UNKNOWN host keys to known_hosts")
    numbers.add_number(ssh, "--fanout", kind=FANOUT, default=64, metavar="N", help="nodes connected at once")
    numbers.add_number(ssh, "--connect-timeout", kind=CONNECT_TIMEOUT, default=10.0, metavar="S",
                       help="deadline for each node's whole connect and login")
    ssh.add_argument("--python", metavar="PATH", type=python_command,
                     help="the nodes' python3 (default: \"python3 -S\")")
    numbers.add_number(ssh, "--max-hosts", kind=MAX_HOSTS, default=10000, metavar="N", help="refuse more hosts")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-node lines at start")
    add_slurm_arguments(p)
    p.set_defaults(strace=0.0, gdb=False, strace_data=False)
    return p


def watch_main(argv: Sequence[str], *, read_hosts: Callable[[argparse.Namespace], Any],
               report: Callable[[HangscopeError], None], check_match: Callable[[str], None]) -> int:
    """The command line's own helpers come in as arguments (as `hangscope demo` gets its parser): the modes
    import nothing from app.cli's root, which imports them."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    try:
        if args.match is not None:
            check_match(args.match)
        options = watch_options(args)
        if args.slurm is not None:
            from app.slurm.cli import slurm_hosts

            hosts = slurm_hosts(args)
        else:
            from app.slurm.cli import check_transport

            check_transport(args)
            hosts = read_hosts(args)
        if hosts is not None:  # the same regular-file rules as the main command (never a FIFO, a device)
            from app.transport.files import check_ssh_files

            check_ssh_files(args.ssh_config, args.identity)
        if args.tui and not (sys.stdout.isatty() and sys.stdin.isatty()):
            raise InputError("--tui needs a terminal on stdin and stdout", hint="leave --tui out: watch prints")
        return run(hosts, args, options)
    except InputError as exc:
        report(exc)
        return EXIT_INPUT
    except HangscopeError as exc:
        report(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("hangscope watch: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def watch_options(args: argparse.Namespace):
    """WatchOptions from the command line; every number range-checked (nan and inf refused) before anything
    connects."""
    from app.watch import WatchOptions, check
    from app.watch.hook import parse_command

    if args.fps is not None and not args.tui:  # a flag that would do nothing is refused, as the main command does
        raise InputError("--fps limits the TUI's screen updates: give it with --tui, or leave it out")
    if args.nonblocking and args.native:
        raise InputError("--native cannot be combined with --nonblocking (py-spy refuses it)")
    return check(WatchOptions(every=args.every, stall=args.stall, stall_start=args.stall_start, slow=args.slow, keep=args.keep, out=args.out,
                              on_hang=parse_command(args.on_hang) if args.on_hang is not None else (),
                              on_hang_timeout=args.on_hang_timeout, once=args.once, wait_start=args.wait_start,
                              job=args.job, verbose=args.verbose))


def run(hosts, args: argparse.Namespace, options) -> int:
    from app.cli.headless import session_options
    from app.session import Session
    from app.watch import OutDir, Watcher

    out = OutDir(options.out, options.keep)
    out.prepare()
    sopts = session_options(args)
    session = Session(hosts, sopts)
    if args.tui:
        from app.ui import run_watch_tui

        title = getattr(args, "slurm_title", "") or args.hosts or ",".join(args.nodelist) or "this machine"
        return run_watch_tui(lambda on_event: Watcher(session, options, sopts.collect, out, on_event,
                                                      env=dict(os.environ), hook_output=subprocess.DEVNULL),
                             fps=args.fps, title=title)
    printer = Printer(sys.stdout, out.path)
    watcher = Watcher(session, options, sopts.collect, out, printer.event, env=dict(os.environ))
    return run_headless(watcher, printer)


def run_headless(watcher, printer: Optional["Printer"] = None) -> int:
    """Run the watcher until it ends; the first Ctrl+C (or SIGTERM) ends the watch cleanly (its hooks are
    killed, its workers closed), a second aborts at once. Started with SIGINT ignored (a background job), Ctrl+C
    stays ignored and SIGTERM ends it."""
    import signal

    from app.cli.run import sigint_ignored

    loop = asyncio.new_event_loop()
    interrupted: List[int] = []

    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None

        def stop(signum: int) -> None:
            interrupted.append(signum)
            if len(interrupted) == 1:
                print(f"\nhangscope watch: {signal.Signals(signum).name}: stopping (again to abort)",
                      file=sys.stderr)
                watcher.cancel_hooks()
                task.cancel()
            else:
                os._exit(EXIT_INTERRUPTED)

        for sig in (signal.SIGTERM,) if sigint_ignored() else (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop, sig)
            except (NotImplementedError, RuntimeError):
                pass
        if printer is not None:  # the reader of our stdout went away (`| head`): the watch ends, as on SIGPIPE
            printer.on_gone = task.cancel
        try:
            return await watcher.run()
        except asyncio.CancelledError:
            return EXIT_OK if printer is not None and printer.gone and not interrupted else EXIT_INTERRUPTED
        finally:
            try:
                await asyncio.wait_for(watcher.session.close(), 10.0)
            except (asyncio.TimeoutError, Exception):
                pass
            watcher.out.close()

    try:
        return loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


class Printer:
    """Each event the watcher says, as a timestamped line (a log under nohup reads as a story). Its stream may
    fail: a pipe whose reader has gone (`| head`) ends the watch cleanly (exit 0, as SIGPIPE would end it); any
    other error (a full disk, a file past its size limit) stops the printing, said once on stderr, and the watch
    goes on writing its history and captures into --out."""

    def __init__(self, stream: TextIO, out: str = "") -> None:
        self.stream = stream
        self.out = out
        self.broken = False
        self.gone = False
        self.on_gone: Optional[Callable[[], Any]] = None

    def event(self, event) -> None:
        if not getattr(event, "shown", True) or self.broken:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(getattr(event, "at", time.time())))
        lines = event.text().split("\n")
        try:
            self.stream.write(f"{stamp} {lines[0]}\n" + "".join(f"    {line}\n" for line in lines[1:]))
            self.stream.flush()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.broken = True
        try:  # what is still buffered must not fail again at exit (the interpreter flushes stdout last)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass
        if isinstance(exc, BrokenPipeError):
            self.gone = True
            if self.on_gone is not None:
                self.on_gone()
            return
        where = f"; its history and captures go on into {self.out}" if self.out else ""
        print(f"hangscope watch: cannot write to stdout ({exc.strerror or exc}): printing stopped{where}",
              file=sys.stderr)
