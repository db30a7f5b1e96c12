"""The architecture as the code has it: the import contracts of pyproject.toml ([tool.importlinter]: the layers
of app/, workers/ alone, Textual only in app.ui, asyncssh only in app.transport) hold; every package folder of
app/ is placed in the layers (a new folder must say where it sits); and no modules of app/ import each other in
a circle. Part of `make check`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict, FrozenSet, List, Set

import grimp
import pytest
from importlinter import api

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
PYPROJECT = ROOT / "pyproject.toml"

# Import circles known and named, each to be broken (then its entry goes: a stale entry fails the test too).
KNOWN_CYCLES: Dict[FrozenSet[str], str] = {}


def _lint_imports() -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--config", str(PYPROJECT), "--no-cache", "--no-logo"], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)


def test_import_contracts_hold() -> None:
    done = _lint_imports()
    assert done.returncode == 0, f"lint-imports failed:\n{done.stdout}\n{done.stderr}"
    assert "broken" in done.stdout and " 0 broken" in done.stdout, done.stdout


def _layered_names() -> Set[str]:
    """Every module named in a layers contract, as a full dotted name."""
    named: Set[str] = set()
    config = api.read_configuration(str(PYPROJECT))
    for contract in config["contracts_options"]:
        if contract.get("type") != "layers":
            continue
        containers = contract.get("containers") or [""]
        for layer in contract.get("layers", []):
            for part in layer.replace("|", ":").split(":"):
                name = part.strip().strip("()")
                if name:
                    named.update(f"{c}.{name}" if c else name for c in containers)
    return named


def test_every_app_package_is_in_a_layer() -> None:
    named = _layered_names()
    folders = sorted(p.name for p in (ROOT / "app").iterdir() if (p / "__init__.py").is_file())
    assert folders, "no package folders found under app/"
    missing = [f"app/{f}/" for f in folders if f"app.{f}" not in named]
    assert not missing, (f"{', '.join(missing)}: in no layer of the layers contract in pyproject.toml "
                         "([tool.importlinter]); place each new folder in the architecture")


def _cycles(graph: grimp.ImportGraph) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            nexts = edges.get(node, [])
            if i < len(nexts):
                work.append((node, i + 1))
                child = nexts[i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1 or node in edges.get(node, []):
                    out.append(sorted(comp))
    return out


def _one_circle(graph: grimp.ImportGraph, members: List[str]) -> str:
    """One circle inside a component, with the line of each import, for the failure message."""
    inside = set(members)
    start = members[0]
    paths = {start: [start]}
    todo = [start]
    while todo:
        m = todo.pop(0)
        for n in sorted(graph.find_modules_directly_imported_by(m)):
            if n == start:
                circle = paths[m] + [start]
                steps = []
                for a, b in zip(circle, circle[1:]):
                    lines = sorted({d["line_number"] for d in graph.get_import_details(importer=a, imported=b)})
                    steps.append(f"{a} -> {b} (line {', '.join(map(str, lines))})")
                return "\n  ".join(steps)
            if n in inside and n not in paths:
                paths[n] = paths[m] + [n]
                todo.append(n)
    return " <-> ".join(members)


@pytest.fixture(scope="module")
def app_graph() -> grimp.ImportGraph:
    # Imports under `if TYPE_CHECKING:` do not run, so they make no circle at run time.
    return grimp.build_graph("app", exclude_type_checking_imports=True, cache_dir=None)


def test_no_import_cycles_in_app(app_graph: grimp.ImportGraph) -> None:
    found = {frozenset(c): c for c in _cycles(app_graph)}
    new = [c for key, c in found.items() if key not in KNOWN_CYCLES]
    assert not new, "modules of app/ import each other in a circle:\n  " + "\n\n  ".join(
        _one_circle(app_graph, c) for c in new)
    stale = [why for key, why in KNOWN_CYCLES.items() if key not in found]
    assert not stale, f"a known circle is gone: remove it from KNOWN_CYCLES in {Path(__file__).name}: {stale}"


def test_the_cycle_check_finds_a_circle() -> None:
    """The check itself: a graph with a circle through three modules is reported, with each step."""
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b, line_number=7, line_contents=f"import {b}")
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]
    assert _one_circle(graph, ["p.a", "p.b", "p.c"]) == (
        "p.a -> p.b (line 7)\n  p.b -> p.c (line 7)\n  p.c -> p.a (line 7)")


def test_what_the_cli_needs_to_connect_loads_no_analysis_core() -> None:
    """The CLI opens its connections before it loads the analysis (app/analysis/__init__.py: a thin root): the
    session, its transports and the decode load only the rooms they use, and the report's modules are loaded
    by headless.preload while the nodes work; `from app.analysis import analyze` still gives the analysis."""
    code = """if True:
        import sys
        import app.cli, app.cli.headless, app.session, app.session.session, app.transport.connect, app.decode.replies
        before = sorted(m for m in sys.modules if m.startswith("app.analysis"))
        from app.cli.headless import REPORT_MODULES, preload
        preload(("no.such.module",) + REPORT_MODULES).join()  # the failing name ends the thread, quietly
        after_bad = "app.analysis.core" in sys.modules
        preload(REPORT_MODULES).join()
        loaded = all(m in sys.modules for m in REPORT_MODULES)
        from app.analysis import Analysis, analyze
        import app.analysis
        print(repr((before, after_bad, loaded, analyze.__module__, Analysis.__module__,
                    app.analysis.progress.__name__)))
    """
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after_bad, loaded, analyze_module, analysis_module, progress = eval(out.stdout)
    assert "app.analysis.core" not in before and len(before) < 10, before
    assert not after_bad and loaded
    assert (analyze_module, analysis_module, progress) == ("app.analysis.core",) * 2 + ("app.analysis.progress",)
