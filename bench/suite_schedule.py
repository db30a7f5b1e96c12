"""How the suite's tests would spread over N pytest-xdist workers (`--dist loadgroup`), from a run's junit file.

    python3 bench/suite_schedule.py RUN.xml [--workers 3 4]

Collects the suite here (the same collection `make test` makes: tests/conftest.py gives the tests that share a
costly fixture their xdist_group), takes each test's duration from RUN.xml (a run with --junitxml; a test not in
it counts 0), and replays xdist 3.8's LoadGroupScheduling: a group, or a test without one, is a unit; units are
queued by their number of tests (its default --loadscope-reorder), each worker gets one unit and then another
whenever two or fewer of its tests are pending. Prints each worker's busy time under the queue as xdist orders
it, in collection order, and in the order of the units' durations (longest first: the best a queue order can do).

What it cannot say: whether more workers would help. The durations are those of the run they come from; with
more workers each test is slower where the CPU is the limit (`/usr/bin/time -v` of a whole run: user+sys near
2 x wall on 2 cores means the workers compute rather than wait, and another worker only shares the same cores).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]


def durations(junit: Path) -> Dict[str, float]:
    """nodeid -> seconds (setup, call and teardown, as junit reports a test), the xdist group suffix removed."""
    out: Dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        parts = case.get("classname", "").split(".")
        name = case.get("name", "")
        if name.rfind("@") > name.rfind("]"):
            name = name[:name.rfind("@")]
        path = ("/".join(parts[:-1]) + ".py::" + parts[-1] + "::") if parts[-1][:1].isupper() else \
            ("/".join(parts) + ".py::")
        out[path + name] = float(case.get("time") or 0)
    return out


class _Recorder:
    def __init__(self) -> None:
        self.items: List[Tuple[str, Optional[str]]] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: List[pytest.Item]) -> None:
        for item in items:
            mark = item.get_closest_marker("xdist_group")
            group = (mark.args[0] if mark.args else mark.kwargs.get("name")) if mark else None
            self.items.append((item.nodeid, group))


def collect() -> List[Tuple[str, Optional[str]]]:
    recorder = _Recorder()
    code = pytest.main(["--collect-only", "-qq", "-n", "0", "-p", "no:cacheprovider", str(REPO / "tests")],
                       plugins=[recorder])
    if code not in (0, 5):
        sys.exit(f"collection failed ({code})")
    return recorder.items


def simulate(units: "OrderedDict[str, List[str]]", workers: int, seconds: Dict[str, float]) -> List[float]:
    queue = OrderedDict(units)
    pending: List[List[str]] = [[] for _ in range(workers)]
    clock = [0.0] * workers

    def assign(w: int) -> None:
        if queue:
            pending[w].extend(queue.popitem(last=False)[1])

    for w in range(workers):
        assign(w)
    for w in range(workers):
        if len(pending[w]) <= 2:
            assign(w)
    while any(pending):
        w = min((w for w in range(workers) if pending[w]), key=lambda w: clock[w])
        clock[w] += seconds.get(pending[w].pop(0), 0.0)
        if len(pending[w]) <= 2:
            assign(w)
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("junit", type=Path)
    parser.add_argument("--workers", type=int, nargs="+", default=[3, 4])
    args = parser.parse_args()
    seconds = durations(args.junit)
    items = collect()
    units: "OrderedDict[str, List[str]]" = OrderedDict()
    for nodeid, group in items:
        units.setdefault(group or nodeid, []).append(nodeid)
    known = sum(1 for nodeid, _ in items if nodeid in seconds)
    total = sum(seconds.get(nodeid, 0.0) for nodeid, _ in items)
    print(f"{len(items)} tests collected, {known} with a duration in {args.junit.name}: {total:.0f} test-seconds")
    orders = {
        "xdist (by number of tests)": OrderedDict(sorted(units.items(), key=lambda kv: -len(kv[1]))),
        "collection order": units,
        "longest unit first": OrderedDict(sorted(units.items(),
                                                 key=lambda kv: -sum(seconds.get(t, 0.0) for t in kv[1]))),
    }
    for workers in args.workers:
        for name, queue in orders.items():
            busy = simulate(queue, workers, seconds)
            print(f"{workers} workers, {name:27s} wall {max(busy):6.0f} s  busy {' '.join(f'{b:.0f}' for b in busy)}")


if __name__ == "__main__":
    main()
