"""Bus bandwidth as nccl-tests defines it for all_reduce, and the sweep of message sizes.

algbw = size / time (bytes per second; shown in GB/s, 1 GB = 1e9 B, as nccl-tests does), and
busbw = algbw x 2(n-1)/n: a ring all_reduce moves 2(n-1)/n times the buffer over each rank's link, so busbw
is comparable across world sizes and with the hardware's link speed. The time is the average of one
iteration, averaged over the ranks (nccl-tests reports the same). Pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from app.errors import InputError
from app.inputs import numbers

if TYPE_CHECKING:  # the command line imports this module for its size parser on every run (app/cli/gpu.py)
    from app.gpu.model import BenchRow

GB = 1e9
MAX_SIZE = 16 << 30
MAX_SIZES = 64  # sizes in one --sizes list or sweep
SIZE = numbers.size(4, MAX_SIZE)  # app.inputs.numbers: the one parser of byte sizes
FACTOR = numbers.count(2, 1024, "a step factor")


def bus_factor(world_size: int) -> float:
    """all_reduce's 2(n-1)/n; 0 for a single rank (nothing crosses a link)."""
    return 2.0 * (world_size - 1) / world_size if world_size > 0 else 0.0


def valid_event(ev: dict) -> bool:
    return (isinstance(ev.get("size"), int) and ev["size"] > 0 and isinstance(ev.get("count"), int)
            and isinstance(ev.get("time_avg"), (int, float)) and ev["time_avg"] > 0)


def row(ev: dict, world_size: int) -> BenchRow:
    """A BenchRow from the program's `bench` event (times in seconds)."""
    from app.gpu.model import BenchRow

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


def parse_size(text: str, flag: str = "--pair-size") -> int:
    """"64M", "1GiB", "4096" -> bytes (4 bytes to 16 GiB); InputError (one line) otherwise."""
    return int(SIZE.parse(text, flag))


def parse_sizes(text: str, flag: str = "--sizes") -> tuple[int, ...]:
    """"1K,1M,64M" or a sweep "1K:64M" (x4 steps) or "1K:64M:2" (x2 steps): never empty, at most MAX_SIZES,
    each size in range, a sweep never backwards."""
    if not text.strip():
        raise InputError(f"{flag} is empty; expected e.g. 1K,1M,64M or 1K:1G")
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise InputError(f"{flag} {text!r}: a sweep is LOW:HIGH or LOW:HIGH:FACTOR")
        low, high = parse_size(parts[0], flag), parse_size(parts[1], flag)
        factor = int(FACTOR.parse(parts[2], f"{flag} (factor)")) if len(parts) == 3 else 4
        if low > high:
            raise InputError(f"{flag} {text!r}: the sweep runs backwards ({parts[0]} > {parts[1]})")
        sizes = sweep(low, high, factor)
    else:
        sizes = tuple(parse_size(p, flag) for p in text.split(","))
    if len(sizes) > MAX_SIZES:
        raise InputError(f"{flag} {text!r}: {len(sizes)} sizes, more than {MAX_SIZES}")
    return sizes


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
    if best is not None and best.busbw <= 0:
        lines.append("no bandwidth measured: one rank's all_reduce crosses no link between GPUs (busbw = algbw x "
                     "2(n-1)/n is 0; it takes 2 ranks or more)")
    elif best is not None:
        lines.append(f"peak busbw {best.busbw:.3f} GB/s at {human_size(best.size)}B")
    return "\n".join(lines)
