"""Live: the wait model's development scenarios (issue 24), diagnosed by the real CLI on the test cluster.

Each scenario of tests/support/record_scenarios.py's DEVELOPMENT is a real torch gloo job (app/demo/job.py) hung in one
blocking operation of a library, or held, started short of a node, or throttled; `hangscope HOSTS --snapshot`
runs against it as a user runs it, and its headline is judged against the scenario's truth (bench/diagnose.py's
TRUTH: the culprit, its blocking operation and what it waits for, in words; no [high] finding naming another
rank): the same judge as the recorded goldens (tests/analysis/test_golden.py). Where the recorded golden of a
scenario is judged wrong too, the analysis is known to be wrong there (test_golden.py's WRONG_NOW) and a wrong
live headline is an expected failure; a live headline wrong where the golden is right fails.

One job at a time on a 4-node cluster of this module's own per xdist worker (start-up needs four nodes: three
launchers and the node that runs none); the two frozen scenarios share one healthy job, frozen and thawed in turn,
in test_dev_scenarios_frozen.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from cluster import Cluster
from record_scenarios import (DEVELOPMENT, Diagnosis, diagnose, started)

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

from diagnose import TRUTH, judge, judge_parts, load, said  # noqa: E402

from app.analysis import analyze  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.usefixtures("torch_support"),
              # each scenario's job starts and stops inside its test; the 4-node cluster is cheap to build once per
              # xdist worker, and the scenarios spread over the workers (the frozen pair, which shares one healthy
              # job, is in test_dev_scenarios_frozen.py)
              pytest.mark.per_worker_fixtures("a job per scenario, stopped inside its test")]
FROZEN = ("frozen_private", "frozen_private_v2")
ONE_JOB_EACH = tuple(n for n in DEVELOPMENT if n not in FROZEN)
GOLDEN = REPO / "tests" / "data" / "scenarios"


@pytest.fixture(scope="module")
def dev_cluster(cluster_factory: Callable[..., Cluster]) -> Iterator[Cluster]:
    built = cluster_factory(max(s.nodes for s in DEVELOPMENT.values()))
    try:
        yield built
    finally:
        built.close()


def flat(text: str) -> str:
    return " ".join(text.split())


def assert_right(name: str, d: Diagnosis) -> None:
    """The headline names the culprit, its blocking operation and what it waits for (the truth's words), no [high]
    finding contradicts the truth, and the CLI printed that headline first."""
    verdict = d.analysis["verdict"]
    assert flat(d.stdout).startswith(f"hangscope: {flat(verdict)[:80]}"), d.stdout
    row = judge_parts(name, TRUTH[name], d.snapshot, verdict, said(d.analysis["findings"]))
    if row.right and not row.contradicted:
        return
    snap, history = load(GOLDEN, name)
    recorded = judge(name, TRUTH[name], snap, analyze(snap, history=history))
    if not (recorded.right and not recorded.contradicted):
        pytest.xfail(f"the analysis is wrong on the recorded {name} too (test_golden.py WRONG_NOW): {row.why}; "
                     f"contradicted {list(row.contradicted)}: {verdict}")
    raise AssertionError(f"{name}: {row.why}; contradicted [high]: {list(row.contradicted)}\n{d.stdout}")


@pytest.mark.parametrize("name", ONE_JOB_EACH)
def test_the_headline_names_the_culprit_its_blocking_operation_and_what_it_waits_for(
        name: str, dev_cluster: Cluster, tmp_path: Path) -> None:
    with started(dev_cluster, DEVELOPMENT[name]) as running:
        d = diagnose(running, tmp_path)
        print(f"\n{name}: hangscope took {d.seconds:.1f} s\n{d.stdout}")
        snap = d.snapshot
        culprit = next((r for r in snap.ranks if r.rank == running.scenario.culprit), None)
        if name == "startup":  # no rank at all: the three launchers, each dumped, and no fourth
            assert snap.ranks == () and d.returncode == 1, (d.returncode, d.stderr)
            launchers = [p for p in snap.processes if p.role == "launcher"]
            assert sorted(p.node for p in launchers) == ["node01", "node02", "node03"]
            assert all(p.collected for p in launchers)
        elif name == "throttled_hidden":  # the slow node could not read its cgroup's counters: the test's premise
            assert all(r.counters is not None and r.counters.cgroup is None for r in snap.ranks if r.node == "node01")
        else:
            assert culprit is not None and culprit.collected, [r.rank for r in snap.ranks]
        if name == "loaderlock":  # the culprit's DataLoader worker is dumped because its rank waits on it
            (worker,) = [p for p in snap.processes if p.role == "child" and p.of == (culprit.pid,)]
            assert worker.why_dumped == "its rank waits on it" and worker.collected, worker
            assert any(f.function.endswith("__getitem__") for t in worker.threads for f in t.frames)
        if name == "shutdown":  # the error that ended its main program is in the snapshot, from its stderr file
            assert any("RuntimeError: mat1 and mat2 shapes cannot be multiplied" in o.text for o in culprit.output)
    assert_right(name, d)
