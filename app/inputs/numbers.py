"""Numbers on the command line: one parser per kind of number (a count, seconds, a ratio, a rate, a size in
bytes), each with a closed range that --help states.

The grammar is plain ASCII decimal, checked before any conversion: `nan`, `inf`, `1e308` out of range, a 30-digit
value, `1_0`, `0x10`, full-width or Arabic-Indic digits, `5s` and the empty string are refused with one line naming
the flag, the value and the range (Python's own int()/float() accept most of those). Every flag that takes a
number is declared through `add_number`, so its help text and its parser cannot disagree.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Union

from app.errors import InputError

Number = Union[int, float]
MAX_CHARS = 40  # longer than any number in range: int() of thousands of digits is slow, and limited since 3.11
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?", re.ASCII)
_SIZE = re.compile(r"([0-9]+)[ ]?([A-Za-z]{0,3})", re.ASCII)
SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
              "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


class NumberError(InputError):
    """A number the user gave that is not in its flag's range, or not a number at all."""

    title = "bad number"


@dataclass(frozen=True)
class Kind:
    """One kind of number and its range: lo..hi, each end closed unless *_open; `unit` is shown after it."""

    what: str  # "a whole number", "seconds", "a ratio", ...
    integer: bool
    lo: Number
    hi: Number
    lo_open: bool = False
    hi_open: bool = False
    unit: str = ""
    sizes: bool = False  # a byte count written with an optional unit suffix (64M, 1GiB)

    @property
    def range(self) -> str:
        """The range as --help and the messages state it: `1-100`, `0-60 s`, `over 0 and below 1`."""
        unit = f" {self.unit}" if self.unit else ""
        lo, hi = (_size_text(int(self.lo)), _size_text(int(self.hi))) if self.sizes else \
            (_number_text(self.lo), _number_text(self.hi))
        if self.lo_open or self.hi_open:
            low = f"over {lo}" if self.lo_open else f"from {lo}"
            high = f"below {hi}" if self.hi_open else f"up to {hi}"
            return f"{low} and {high}{unit}"
        return f"{lo}-{hi}{unit}"

    def parse(self, text: str, flag: str) -> Number:
        """The value of `text` given to `flag`; NumberError (one line) when it is not one of this kind in range."""
        value = self._convert(text, flag)
        self.check(value, flag, text)
        return value

    def check(self, value: Number, flag: str, text: str | None = None) -> None:
        """Refuse a value (from the command line or built in code) outside this kind's range."""
        shown = repr(text) if text is not None else f"{value:g}" if isinstance(value, float) else str(value)
        if isinstance(value, float) and not math.isfinite(value):
            raise NumberError(f"{flag} {shown}: expected {self.what} {self._phrase()}, a finite number")
        below = value <= self.lo if self.lo_open else value < self.lo
        above = value >= self.hi if self.hi_open else value > self.hi
        if below or above:
            raise NumberError(f"{flag} {shown}: out of range; expected {self.what} {self._phrase()}")

    def arg(self, flag: str) -> Callable[[str], Number]:
        """An argparse `type=` for `flag`. It raises NumberError (an InputError, not a ValueError), so the
        message is ours, and argparse passes it on instead of printing its own."""
        def parse(text: str) -> Number:
            return self.parse(text, flag)
        parse.__name__ = self.what  # argparse names the type in some of its own messages
        return parse

    def _phrase(self) -> str:
        r = self.range
        if self.what == "seconds" and r.endswith(" s"):
            r = r[:-2]  # "seconds from 0 to 60", not "seconds from 0 to 60 s"
        return r if r.startswith(("over", "from")) else f"from {r.replace('-', ' to ', 1)}"

    def _convert(self, text: str, flag: str) -> Number:
        s = text.strip(" \t")
        if not s:
            raise NumberError(f"{flag} is empty; expected {self.what} {self._phrase()}")
        if len(s) > MAX_CHARS:
            raise NumberError(f"{flag} {_clip(text)!r}: too long for {self.what} {self._phrase()}")
        if self.sizes:
            m = _SIZE.fullmatch(s)
            if not m or m.group(2).upper() not in SIZE_UNITS:
                raise NumberError(f"{flag} {text!r}: not a size; expected bytes {self._phrase()}, e.g. 4096, 64K, "
                                  "16M, 1G")
            return int(m.group(1)) * SIZE_UNITS[m.group(2).upper()]
        if self.integer:
            if not _INT.fullmatch(s):
                raise NumberError(f"{flag} {text!r}: not a whole number; expected {self.what} {self._phrase()} "
                                  "(ASCII digits)")
            return int(s)
        if not _DECIMAL.fullmatch(s):
            raise NumberError(f"{flag} {text!r}: not a decimal number; expected {self.what} {self._phrase()}")
        return float(s)


def count(lo: int, hi: int, what: str = "a whole number") -> Kind:
    return Kind(what, True, lo, hi)


def seconds(lo: float, hi: float, *, lo_open: bool = False) -> Kind:
    return Kind("seconds", False, lo, hi, lo_open=lo_open, unit="s")


def ratio(lo: float, hi: float, *, lo_open: bool = True, hi_open: bool = True) -> Kind:
    return Kind("a ratio", False, lo, hi, lo_open=lo_open, hi_open=hi_open)


def rate(lo: float, hi: float, unit: str, *, lo_open: bool = True) -> Kind:
    return Kind("a rate", False, lo, hi, lo_open=lo_open, unit=unit)


def size(lo: int, hi: int) -> Kind:
    return Kind("a size", True, lo, hi, sizes=True)


def add_number(group: Any, *flags: str, kind: Kind, help: str, default: Any = None, **kw: Any) -> None:
    """add_argument for a number: its parser is `kind`'s and its help ends with the range (and the default)."""
    default_text = "" if default is None else f"; default {default:g}" if isinstance(default, float) else \
        f"; default {default}"
    group.add_argument(*flags, type=kind.arg(flags[-1] if flags[-1].startswith("--") else flags[0]),
                       default=default, help=f"{help} ({kind.range}{default_text})", **kw)


def _number_text(n: Number) -> str:
    """4194304 as 4194304 (not 4.1943e+06), 0.1 as 0.1, 600.0 as 600."""
    return str(int(n)) if float(n).is_integer() else f"{n:g}"


def _size_text(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def _clip(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "..."


