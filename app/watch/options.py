"""hangscope watch's settings (WatchOptions) and their ranges: every number is checked here, once, before
anything connects (nan and inf refused), so the command line and any other caller get the same exit 2."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

from app.errors import InputError
from app.inputs import numbers

# Each setting's range (app.inputs.numbers: the command line parses with the same kinds, so its grammar, plain
# ASCII decimals, and its messages are the main command's); the reason for each bound is beside it
EVERY = numbers.seconds(0.5, 86400)  # below half a second the samples would cost more than they tell; a day at most
STALL = numbers.seconds(1, 7 * 86400)
SLOW = numbers.Kind("a ratio", False, 0.0, 0.99)  # a share of the job's own recent rate; 0 turns slow captures off
KEEP = numbers.count(1, 10000)
HOOK_TIMEOUT = numbers.seconds(1, 86400)
WAIT_START = numbers.seconds(0, 7 * 86400)


@dataclass(frozen=True)
class WatchOptions:
    every: float = 30.0  # seconds between cheap samples
    stall: float = 120.0  # seconds without progress before a capture (lowered under a short watchdog)
    stall_start: Optional[float] = None  # ... before a job is first seen progressing (None: max(4 x stall, 300 s))
    slow: float = 0.5  # capture a job running below this share of its recent rate for `stall`
    keep: int = 20  # capture bundles kept in `out`
    out: str = "hangscope-watch"
    on_hang: Tuple[str, ...] = ()  # argv run after each capture (app/watch/hook.py)
    on_hang_timeout: float = 300.0
    once: bool = False  # exit after the first capture
    wait_start: float = 600.0  # seconds to wait for a job to appear before giving up (exit 3)
    job: Optional[str] = None  # follow only this job
    verbose: bool = False  # print every sample, not only what changes


def check_number(flag: str, value: float, kind: numbers.Kind) -> None:
    """InputError unless value is a finite number of `kind` within its range (a caller other than the command
    line, whose parser already checked it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind.integer and not isinstance(value, int)):
        raise InputError(f"{flag} {value!r}: expected {kind.what} ({kind.range})")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{flag} {value!r}: expected {kind.what} ({kind.range}), a finite number")
    kind.check(value, flag)


def check(options: WatchOptions) -> WatchOptions:
    check_number("--every", options.every, EVERY)
    check_number("--stall", options.stall, STALL)
    if options.stall_start is not None:
        check_number("--stall-start", options.stall_start, STALL)
    check_number("--slow", options.slow, SLOW)
    check_number("--keep", options.keep, KEEP)
    check_number("--on-hang-timeout", options.on_hang_timeout, HOOK_TIMEOUT)
    check_number("--wait-start", options.wait_start, WAIT_START)
    if options.stall < options.every:
        raise InputError(f"--stall {options.stall:g} is shorter than --every {options.every:g}: a stall is only "
                         "seen between two samples", hint="give --stall at least --every (the default is 4 samples)")
    if not options.out or "\0" in options.out:
        raise InputError("--out needs a directory")
    return options
