"""Loop-iteration coordinates: which iteration of its loops a frame is in, from its loop variables' values.

Computed once per frame as a dump is decoded (app.decode.replies), then compared across ranks (iterations.py). Only
values that mean the same on every rank count (`meaningful`): one filter for both.
"""

from __future__ import annotations

import re
from typing import Iterable

from app.model import Local, LoopInfo

_SCALAR = r"(?:-?\d+|-?\d+\.\d*(?:e[-+]?\d+)?|-?\d+e[-+]?\d+|True|False|\"[^\"\\,()]{0,40}\"|'[^'\\,()]{0,40}')"
_MEANINGFUL = re.compile(r"^(?:%s|\((?:%s, ){0,5}%s,?\))$" % (_SCALAR, _SCALAR, _SCALAR))


def meaningful(value: str) -> bool:
    """A repr that means the same on every rank: a number, a short string, a small tuple of those. Object
    reprs (`<Tensor at 0x7f..>`) carry addresses that differ everywhere and would split equal ranks."""
    return len(value) <= 80 and "0x" not in value and bool(_MEANINGFUL.match(value))


# `for i, x in enumerate(it):` / `for i in range(a, b[, s]):` — loops whose first variable counts up
_COUNTING = re.compile(r"^(?:async\s+)?for\s+\(?\s*(\w+)\b.*\bin\s+(enumerate|range)\((.*)\)\s*:")


def _advancing(loop: LoopInfo, values: dict[str, str]) -> dict[str, str]:
    """A frame on its for-loop's header line is fetching the next item (a data loader's next batch): the loop
    variables still hold the previous iteration. The counting variable of enumerate()/range() is given as
    the iteration being entered; the other variables are not known yet and are left out."""
    m = _COUNTING.match(loop.header)
    if m is None or m.group(1) not in values:
        return {}
    name, func, args = m.groups()
    stride = 1
    if func == "range" and args.count(",") == 2:
        last = args.rsplit(",", 1)[1].strip()
        if not re.fullmatch(r"-?\d+", last):
            return {}
        stride = int(last)
    try:
        return {name: str(int(values[name]) + stride)}
    except ValueError:
        return {}


def iteration(loops: Iterable[LoopInfo], local_vars: Iterable[Local],
              line: int = 0) -> tuple[tuple[str, str], ...]:
    """(name, value) of each loop's variables and counters, outermost loop first; `line` is the frame's
    current line (on a for-loop's header the loop is moving to its next iteration)."""
    values = {lc.name: lc.repr for lc in local_vars}
    out: list[tuple[str, str]] = []
    for loop in loops:
        names: Iterable[str] = loop.variables + loop.counters
        loop_values = values
        if line and line == loop.line and loop.kind != "while":
            ahead = _advancing(loop, values)
            loop_values = dict(values, **ahead)
            names = [n for n in names if n not in loop.variables or n in ahead]
        for name in names:
            value = loop_values.get(name)
            if value is not None and meaningful(value) and (name, value) not in out:
                out.append((name, value))
    return tuple(out)
