"""Bus bandwidth as nccl-tests defines it for all_reduce, and the sweep of message sizes.

algbw = size / time (bytes per second; shown in GB/s, 1 GB = 1e9 B, as nccl-tests does), and
busbw = algbw x 2(n-1)/n: a ring all_reduce moves 2(n-1)/n times the buffer over each rank's link, so busbw
is comparable across world sizes and with the hardware's link speed. The time is the average of one
iteration, averaged over the ranks (nccl-tests reports the same). Pure.
"""

from __future__ import annotations

import re
from typing import Optional

from app.errors import InputError
from app.gpu.model import BenchRow

GB = 1e9
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")
MAX_SIZE = 16 << 30


def bus_factor(world_size: int) -> float:
    """all_reduce's 2(n-1)/n; 0 for a single rank (nothing crosses a link)."""
    return 2.0 * (world_size - 1) / world_size if world_size > 0 else 0.0


def valid_event(ev: dict) -> bool:
    return (isinstance(ev.get("size"), int) and ev["size"] > 0 and isinstance(ev.get("count"), int)
            and isinstance(ev.get("time_avg"), (int, float)) and ev["time_avg"] > 0)


def row(ev: dict, world_size: int) -> BenchRow:
    """A BenchRow from the program's `bench` event (times in seconds)."""
    t = float(ev["time_avg"])
    algbw = ev["size"] / t / GB
    tmax = ev.get("time_max")
    return BenchRow(size=ev["size"], count=ev["count"], time_us=t * 1e6, algbw=algbw,
                    busbw=algbw * bus_factor(world_size),
                    time_max_us=float(tmax) * 1e6 if isinstance(tmax, (int, float)) else 0.0,
                    dtype=str(ev.get("dtype", "float32"))[:16], iters=int(ev.get("iters") or 0))


def peak(rows: list[BenchRow]) -> Optional[BenchRow]:
    return max(rows, key=lambda r: r.busbw, default=None)


def sweep(low: int, high: int, factor: int = 4) -> tuple[int, ...]:
    """low, low*factor, ... up to high (nccl-tests' -b/-e/-f)."""
    out, size = [], low
    while size <= high:
        out.append(size)
        size *= factor
    return tuple(out)


def parse_size(text: str) -> int:
    """"64M", "1GiB", "4096" -> bytes; InputError otherwise."""
    m = _SIZE.match(text)
    if not m or m.group(2).upper() not in _UNITS:
        raise InputError(f"{text!r} is not a size (examples: 4096, 64K, 16M, 1G)")
    value = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if not 4 <= value <= MAX_SIZE:
        raise InputError(f"size {text!r} is out of range (4 bytes to 16 GiB)")
    return value


def parse_sizes(text: str) -> tuple[int, ...]:
    """"1K,1M,64M" or a range "1K:64M" (x4 steps) or "1K:64M:2" (x2 steps)."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise InputError(f"{text!r}: a range is LOW:HIGH or LOW:HIGH:FACTOR")
        factor = int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else 4
        if factor < 2:
            raise InputError(f"{text!r}: the step factor must be at least 2")
        return sweep(parse_size(parts[0]), parse_size(parts[1]), factor)
    return tuple(parse_size(p) for p in text.split(",") if p.strip())


def human_size(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def table(rows: list[BenchRow]) -> str:
    """nccl-tests' columns: size, count, type, redop, time (us), algbw, busbw (GB/s)."""
    lines = [f"{'size':>12} {'count':>12} {'type':>8} {'redop':>6} {'time(us)':>10} {'algbw(GB/s)':>12} "
             f"{'busbw(GB/s)':>12}"]
    for r in rows:
        lines.append(f"{r.size:>12} {r.count:>12} {r.dtype:>8} {'sum':>6} {r.time_us:>10.1f} {r.algbw:>12.3f} "
                     f"{r.busbw:>12.3f}")
    best = peak(rows)
    if best is not None:
        lines.append(f"peak busbw {best.busbw:.3f} GB/s at {human_size(best.size)}B")
    return "\n".join(lines)
