"""Which tests must run in one pytest-xdist worker: those that share a costly fixture wider than a test.

Under xdist every worker is a pytest session of its own, so a session- or module-scoped fixture is built once per
worker that runs a test using it. For the cheap ones (the shared 4-node `cluster`: sshd in namespaces, ~1 CPU-s)
that is fine; for a fixture that starts torch jobs (the session's `hung_job`, a module's jobs: 2-3 CPU-s per
interpreter that imports torch, a dozen interpreters per job) it would double the suite's dearest work. So every
test that uses such a fixture gets an `xdist_group` mark, and tests linked by sharing any of them (a module whose
tests use both its own jobs and the hung job) get one group: `--dist loadgroup` then sends each group to one
worker, and tests without a group go wherever a worker is free. A module whose module-scoped fixtures are cheap to
build once per worker (a cluster of its own, a job started and stopped inside each test's fixture) says so with
`@pytest.mark.per_worker_fixtures("why")`, and its tests spread over the workers.
"""

from __future__ import annotations

from typing import Iterable

import pytest

# session-scoped fixtures that start torch jobs; module-scoped fixtures of the test modules are all taken as costly
SHARED_SESSION_FIXTURES = ("hung_job", "local_spawn_job")


def _resources(item: pytest.Item, tests_root: str) -> set[str]:
    """The costly shared fixtures this test uses: the session's by name, a module's as `module:<path>`."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    # by name, where the name is the session fixture's (a module may define a fixture of the same name)
    found = {name for name in SHARED_SESSION_FIXTURES
             if name in info.name2fixturedefs and info.name2fixturedefs[name][-1].scope == "session"}
    if item.get_closest_marker("per_worker_fixtures"):
        return found
    for defs in info.name2fixturedefs.values():
        for fixturedef in defs:
            if fixturedef.scope in ("module", "class", "package") and fixturedef.baseid.startswith(tests_root):
                found.add(f"module:{item.nodeid.split('::', 1)[0]}")
    return found


def group(items: Iterable[pytest.Item], tests_root: str = "tests") -> dict[str, str]:
    """nodeid -> group name for the tests that share a costly fixture (union of every linked set); adds the mark."""
    parent: dict[str, str] = {}

    def find(r: str) -> str:
        while parent.setdefault(r, r) != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    used = []
    for item in items:
        res = sorted(_resources(item, tests_root))
        if res:
            used.append((item, res))
            for other in res[1:]:
                parent[find(other)] = find(res[0])
    groups = {}
    for item, res in used:
        name = find(res[0]).replace("module:", "").replace("/", ".")
        item.add_marker(pytest.mark.xdist_group(name))
        groups[item.nodeid] = name
    return groups
