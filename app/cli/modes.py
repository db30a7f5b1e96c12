"""Which flags do something in which mode: one table, so a flag given where it does nothing (`--load` with
`--strace`, `--tar` without `--export`, a GPU-test flag in a headless collection) is refused up front with one
line saying so, instead of being ignored.

Modes: `tui` (a live collection in the TUI), `headless` (--print, --snapshot or --export: collect and report),
`load-tui` and `load` (--load: a saved snapshot in the TUI or headless: nothing is collected), `test` (--test:
GPU tests instead of a collection). A flag is "given" when it is on the command line, whatever its value
(explicit_flags parses the command line again with every default suppressed).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, FrozenSet, Literal, Optional, Sequence

from app.errors import InputError

Mode = Literal["tui", "headless", "load-tui", "load", "test"]



def _modes(*names: Mode) -> FrozenSet[Mode]:
    return frozenset(names)


LIVE = _modes("tui", "headless")
TESTS = _modes("test", "tui")  # GPU-test flags: --test, and the TUI's G key
SSH = _modes("tui", "headless", "test")

# Why a flag does nothing in a mode: said after "does nothing".
WHY: dict = {
    "tui": "in the TUI (it applies to a headless run: --print, --snapshot or --export)",
    "headless": "in a headless collection",
    "load-tui": "with --load (a saved snapshot is only read: nothing is collected)",
    "load": "with --load (a saved snapshot is only read: nothing is collected)",
    "test": "with --test (GPU tests run instead of a collection)",
}


@dataclass(frozen=True)
class Rule:
    """A flag (as the user writes it), the modes where it does something, and what else it needs."""

    flag: str
    modes: FrozenSet[Mode]
    needs: Optional[Callable[[argparse.Namespace], Optional[str]]] = None  # returns what is missing, or None
    why: str = ""  # said instead of WHY[mode] when the flag does nothing in a mode
    tests: FrozenSet[str] = frozenset()  # the --test kinds it applies to (empty: every kind)
    positional: bool = False  # named by its value too: a positional argument has no flag the user typed


def _remote(args: argparse.Namespace) -> Optional[str]:
    if args.hosts or args.nodelist or args.slurm is not None:
        return None
    return "without hosts (HOSTS, -w or --slurm): this machine is inspected without SSH"


def _export(args: argparse.Namespace) -> Optional[str]:
    return None if args.export else "without --export DIR (it writes DIR.tar.gz beside the bundle)"


def _strace(args: argparse.Namespace) -> Optional[str]:
    # the TUI runs strace on a key press (app/ui/collect.py), with --strace-data's setting
    return None if args.strace or mode_of(args) == "tui" else "without --strace SECONDS"


def _output(args: argparse.Namespace) -> Optional[str]:
    if args.snapshot or args.export or getattr(args, "json_path", None):
        return None
    return "without an output to replace (--snapshot, --export or --json)"


def _raw(args: argparse.Namespace) -> Optional[str]:
    if args.snapshot or args.print_summary:
        return None
    return "without --snapshot FILE or --print (an --export bundle is always default-deny)"


def _slurm(args: argparse.Namespace) -> Optional[str]:
    return None if args.slurm is not None else "without --slurm (nodes of a HOSTS file or -w are reached over SSH)"


RULES: dict = {
    "hosts": Rule("HOSTS", SSH, positional=True), "nodelist": Rule("-w", SSH), "slurm": Rule("--slurm", SSH),
    "transport": Rule("--transport", SSH, _slurm),
    "print_summary": Rule("--print", _modes("headless", "load", "test")),
    "snapshot": Rule("--snapshot", _modes("headless")),
    "export": Rule("--export", _modes("headless", "load")),
    "tar": Rule("--tar", _modes("headless", "load"), _export),
    "force": Rule("--force", _modes("headless", "load", "test"), _output),
    # with --snapshot or --print only, in whatever mode: said as what it needs, the TUI's and --load's screens too
    "raw": Rule("--raw", _modes("headless", "load", "tui", "load-tui"), _raw),
    "locals": Rule("--locals/--no-locals", LIVE), "native": Rule("--native", LIVE),
    "nonblocking": Rule("--nonblocking", LIVE), "strace": Rule("--strace", LIVE),
    "strace_data": Rule("--strace-data", LIVE, _strace), "gdb": Rule("--gdb", LIVE), "pids": Rule("--pid", LIVE),
    "match": Rule("--match", LIVE), "store": Rule("--store/--no-store", LIVE), "sudo": Rule("--sudo", LIVE),
    "gpu_evidence": Rule("--gpu-evidence", LIVE), "timeout": Rule("--timeout", LIVE),
    "job": Rule("--job", _modes("headless", "load")),
    "samples": Rule("--samples", _modes("headless")), "interval": Rule("--interval", _modes("headless")),
    "ssh_config": Rule("-F", SSH, _remote), "identity": Rule("-i", SSH, _remote),
    "accept_new_host_keys": Rule("--accept-new-host-keys", SSH, _remote), "fanout": Rule("--fanout", SSH, _remote),
    "relay": Rule("--relay", SSH, _remote),
    "connect_timeout": Rule("--connect-timeout", SSH, _remote), "max_hosts": Rule("--max-hosts", SSH, _remote),
    "python": Rule("--python", SSH),
    "refresh_interval": Rule("--refresh", _modes("tui")), "fps": Rule("--fps", _modes("tui", "load-tui")),
    "test": Rule("--test", _modes("test")),
    "json_path": Rule("--json", _modes("test")),
    # GPU-test flags, with the tests that read them (app/gpu/runner.py): bench sizes, the timed iterations of
    # sanity and bench (pairs time their own), the pair search's knobs, and net's reachability target
    **{dest: Rule(flag, TESTS, why="without --test (GPU-test flags apply to --test, and to the TUI's G key)",
                  tests=frozenset(tests))
       for dest, flag, tests in (
           ("backend", "--backend", ()), ("test_timeout", "--test-timeout", ()),
           ("startup_timeout", "--startup-timeout", ()), ("sizes", "--sizes", ("bench",)),
           ("iters", "--iters", ("sanity", "bench")), ("warmup", "--warmup", ("sanity", "bench")),
           ("procs_per_node", "--procs-per-node", ()), ("pair_size", "--pair-size", ("pairs",)),
           ("slow_ratio", "--slow-ratio", ("pairs",)), ("min_busbw", "--min-busbw", ("pairs",)),
           ("all_pairs", "--all-pairs", ("pairs",)), ("no_gpu_pairs", "--no-gpu-pairs", ("pairs",)),
           ("no_nccl_debug", "--no-nccl-debug", ()), ("nccl_env", "--nccl-env", ()), ("target", "--target", ("net",)),
           ("master_addr", "--master-addr", ()), ("allow_busy_gpus", "--allow-busy-gpus", ()))},
}

def mode_of(args: argparse.Namespace) -> Mode:
    headless = bool(args.print_summary or args.snapshot or args.export)
    if args.load is not None:
        return "load" if headless else "load-tui"
    if getattr(args, "test", None):
        return "test"
    return "headless" if headless else "tui"


def explicit_flags(make_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str]) -> set:
    """The dests the command line gives, whatever their values (a flag given its default value is given)."""
    parser = make_parser()
    for action in parser._actions:  # argparse offers no public way to tell "given" from "defaulted"
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(list(argv))))


def check_modes(args: argparse.Namespace, given: set) -> Mode:
    """The mode; InputError (one line) for the first flag given where it does nothing."""
    mode = mode_of(args)
    for dest, rule in RULES.items():
        if dest not in given:
            continue
        flag = f"{rule.flag} {getattr(args, dest)}" if rule.positional else rule.flag
        if mode not in rule.modes:
            why = rule.why if rule.why and mode != "test" and "test" in rule.modes else WHY[mode]
            raise InputError(f"{flag} does nothing {why}; leave it out")
        if mode == "test" and rule.tests and args.test not in rule.tests:
            raise InputError(f"{flag} does nothing with --test {args.test} (it applies to --test "
                             f"{' and '.join(sorted(rule.tests))}); leave it out")
        missing = rule.needs(args) if rule.needs is not None else None
        if missing:
            raise InputError(f"{flag} does nothing {missing}; leave it out")
    return mode
