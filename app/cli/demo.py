"""`hangscope demo`: start a local 4-rank gloo job that hangs, investigate it, stop the job on exit."""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
from typing import Sequence

from app.cli.run import OneLineParser
from app.inputs import numbers

NPROC = numbers.count(2, 32)
WAIT = numbers.seconds(1, 3600)
# scenario -> what the culprit does (app/demo/job.py). netcut, fsstall and gpu_xid need a cluster, a stalled
# file system or a GPU fault: they are the test cluster's (tests/support/record_scenarios.py), not the demo's
SCENARIOS = {
    "skip": "one rank is one loop iteration ahead on the same line (default)",
    "dataloader": "one rank blocks in data loading",
    "die": "one rank exits",
    "healthy": "the job keeps making progress",
    "lock": "one rank's main thread waits for a lock its checkpoint thread holds",
    "deadlock": "two threads of one rank take two locks in opposite orders",
    "order": "one rank all_reduces its gradient buckets in another order",
    "uneven": "DDP, and one rank's data runs out first",
    "mismatch": "one rank all_gathers where the others all_reduce",
    "gil": "one rank in a ctypes call that never returns, holding the GIL",
    "native": "the same, not holding the GIL",
    "pipe": "one rank blocks writing to a pipe nobody reads",
    "shutdown": "one rank's main program ends in an error while a non-daemon thread keeps it alive",
    "loaderlock": "one rank's DataLoader worker waits for a stale lock file a killed job left",
    "executor": "one rank waits for its previous checkpoint upload, which waits for an acknowledgement",
    "event": "one rank waits for an event whose setter thread died",
    "queue": "one rank waits on a queue whose producer thread ended",
    "service": "one rank waits for a reply from a local metrics service that never answers",
    "subprocess": "one rank runs a hook (`tail -f`) that never exits",
    "flock": "one rank waits for a file lock another process holds",
    "storekey": "one rank waits in the job's store for keys the others wrote under another name",
    "poll": "one rank polls for a file that never appears",
    "spin": "one rank busy-waits for a log writer thread that died",
    "pdb": "one rank stopped at a breakpoint()",
    "sighandler": "one rank's signal handler waits for the step it interrupted",
    "asyncio": "one rank awaits an asyncio future its service dropped",
    "selflock": "one rank takes a non-reentrant lock it already holds",
}


def demo_main(argv: Sequence[str], hangscope_parser: argparse.ArgumentParser) -> int:
    """`hangscope_parser` is the command line's own (app.cli.build_parser), for the investigation's options."""
    parser = OneLineParser(
        prog="hangscope demo",
        description="Start a local torch.distributed (gloo, CPU) training job that hangs, then investigate it "
        "with hangscope. The job is stopped when hangscope exits.")
    parser.add_argument("--scenario", choices=tuple(SCENARIOS), default="skip", metavar="SCENARIO",
                        help="; ".join(f"{name}: {what}" for name, what in SCENARIOS.items()))
    numbers.add_number(parser, "--nproc", kind=NPROC, default=4, help="ranks")
    numbers.add_number(parser, "--timeout", kind=WAIT, default=240.0, help="seconds to wait for the hang")
    parser.add_argument("--print", dest="print_summary", action="store_true",
                        help="print the summary instead of opening the TUI (also when not in a terminal)")
    args = parser.parse_args(list(argv))
    if importlib.util.find_spec("torch") is None:
        print("hangscope demo: needs PyTorch in this Python environment to run the demo job: pip install "
              "torch==2.13.0 (a CPU build is enough; the job uses the gloo backend)", file=sys.stderr)
        return 2

    from app.demo.runner import JobFailed, start_local_job
    from app.cli.headless import collect_and_report

    print(f"hangscope demo: starting a {args.nproc}-rank gloo job (scenario {args.scenario!r}); "
          "starting torch in each rank takes ~10 s on 2 cores ...", file=sys.stderr, flush=True)
    job = start_local_job(args.scenario, args.nproc)
    # a closed terminal (SIGHUP) or a kill (SIGTERM) must still stop the job: turn them into an exit that
    # runs the finally below
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, _exit_on_signal)
    try:
        try:
            job.wait_hung(args.timeout, expected=args.nproc - 1 if args.scenario == "die" else None)
        except JobFailed as exc:
            print(f"hangscope demo: {exc}", file=sys.stderr)
            return 1
        state = "running" if args.scenario == "healthy" else "hung"
        pids = [str(int(r["pid"])) for r in job.ready.values()]
        print(f"hangscope demo: the job is {state} (launcher pid {job.proc.pid}, ranks {', '.join(pids)})",
              file=sys.stderr, flush=True)
        # only the demo's ranks: other jobs on this machine are not part of the demo
        options = hangscope_parser.parse_args([arg for p in pids for arg in ("--pid", p)])
        if args.print_summary or not (sys.stdout.isatty() and sys.stdin.isatty()):
            return collect_and_report(None, options)
        from app.cli.headless import session_options
        from app.ui import run_tui
        from app.ui.source import LiveSource

        return run_tui(LiveSource(None, session_options(options)), title=f"demo: {args.scenario}")
    except KeyboardInterrupt:
        return 130
    finally:
        job.stop()
        print("hangscope demo: job stopped", file=sys.stderr)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
