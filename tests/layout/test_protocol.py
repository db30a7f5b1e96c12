"""The worker protocol's requests are typed once (workers/protocol.py) and both sides keep to them. Part of
`make check`.

The login side builds every request through an op constant (`protocol.COLLECT({...})`), so mypy checks its
argument names and types and what the reply is: a misspelt argument is a type error (proved here by running
mypy on a snippet). The worker reads arguments by name (`req.arg_int("pid")`, `req.args.get("ras")`), which no
type checker sees; this test reads the worker's sources and checks that every name it reads is an argument its
op declares, and that every declared argument is read, so a renamed argument fails here on both sides.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
PROTOCOL = ROOT / "workers" / "protocol.py"
ARG_METHODS = {"arg_int", "arg_float", "arg_bool", "arg_str", "arg_list"}

# Where the worker reads a request's arguments, and whose arguments they are (a TypedDict of workers/protocol.py).
# A new place that reads arguments must be added here: it says which op's arguments it reads.
READS: Dict[Tuple[str, str], str] = {
    ("workers/ops.py", "retire"): "RetireArgs",
    ("workers/ops.py", "push_tool"): "PushToolArgs",
    ("workers/ops.py", "_discover"): "DiscoverArgs",
    ("workers/ops.py", "dump"): "DumpArgs",
    ("workers/ops.py", "collect"): "CollectArgs",
    ("workers/ops.py", "_gpu_evidence_start"): "CollectArgs",
    ("workers/ops.py", "_dump"): "DumpOptions",
    ("workers/ops.py", "store_ranks"): "StoreRanksArgs",
    ("workers/ops.py", "detail"): "DetailArgs",
    ("workers/collect/pyspy.py", "DumpOptions.__init__"): "DumpOptions",
    ("workers/collect/traced.py", "strace"): "StraceArgs",
    ("workers/collect/traced.py", "gdb"): "GdbArgs",
    ("workers/ops_gpu.py", "gpu_stop"): "GpuStopArgs",
    ("workers/ops_gpu.py", "gpu_ports"): "GpuPortsArgs",
    ("workers/ops_gpu.py", "net_probe"): "NetProbeArgs",
    ("workers/ops_gpu.py", "gpu_python"): "GpuPythonArgs",
    ("workers/gputest/launch.py", "Launch.__init__"): "GpuLaunchArgs",
    ("workers/gputest/launch.py", "Launch._env"): "GpuLaunchArgs",
    ("workers/server.py", "Server._cancel"): "TargetArgs",
    ("workers/server.py", "Server._go"): "TargetArgs",
    ("workers/request.py", "Request.sudo"): "_Sudo",  # every op that runs tools may carry sudo
}


def _typed_dicts() -> Dict[str, Tuple[List[str], List[str]]]:
    """TypedDict name -> (its bases that are TypedDicts, its own keys), from workers/protocol.py."""
    tree = ast.parse(PROTOCOL.read_text(encoding="utf-8"))
    out: Dict[str, Tuple[List[str], List[str]]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
        if "TypedDict" not in bases and not any(b in out for b in bases):
            continue
        keys = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        out[node.name] = ([b for b in bases if b != "TypedDict"], keys)
    return out


def _keys(name: str, dicts: Dict[str, Tuple[List[str], List[str]]]) -> Set[Tuple[str, str]]:
    """(declaring class, key) for every key of a TypedDict, its bases' included."""
    bases, own = dicts[name]
    out = {(name, k) for k in own}
    for b in bases:
        out |= _keys(b, dicts)
    return out


def _ops() -> Dict[str, str]:
    """op name -> its arguments' TypedDict, from the `NAME: Op[Args, Item, Done] = Op("name")` constants."""
    out = {}
    for node in ast.parse(PROTOCOL.read_text(encoding="utf-8")).body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "Op"):
            continue
        ann = node.annotation
        assert isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple), ast.dump(ann)
        args = ann.slice.elts[0]
        name = node.value.args[0]
        assert isinstance(args, ast.Name) and isinstance(name, ast.Constant)
        out[name.value] = args.id
    return out


class _Reads(ast.NodeVisitor):
    """The argument names a module reads, by enclosing function (Class.method)."""

    def __init__(self) -> None:
        self.scope: List[str] = []
        self.found: List[Tuple[str, str, int]] = []  # (scope, name, line)

    def _nested(self, node: ast.AST, name: str) -> None:
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._nested(node, node.name)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._nested(node, node.name)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        literal = node.args[0] if node.args and isinstance(node.args[0], ast.Constant) else None
        if isinstance(f, ast.Attribute) and literal is not None and isinstance(literal.value, str):
            on_args = isinstance(f.value, ast.Attribute) and f.value.attr == "args"
            if f.attr in ARG_METHODS or (f.attr == "get" and on_args):
                self.found.append((".".join(s for s in self.scope), literal.value, node.lineno))
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.value, ast.Attribute) and node.value.attr == "args" \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            self.found.append((".".join(self.scope), node.slice.value, node.lineno))
        self.generic_visit(node)


def _worker_reads() -> List[Tuple[str, str, str, int]]:
    out = []
    for path in sorted((ROOT / "workers").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "workers/protocol.py":
            continue
        visitor = _Reads()
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        out += [(rel, scope, name, line) for scope, name, line in visitor.found]
    return out


def test_every_op_has_typed_arguments_and_a_worker_handler() -> None:
    from workers import protocol
    from workers.ops import HANDLERS

    ops = _ops()
    assert set(ops) == set(protocol.OPS), "every Op constant is in OPS"
    served = set(HANDLERS) | {protocol.GO.name, protocol.CANCEL.name, protocol.SHUTDOWN.name}  # the server's own
    assert served == set(ops), f"ops without a handler: {set(ops) - served}; handlers without an op: {served - set(ops)}"
    dicts = _typed_dicts()
    assert all(args in dicts for args in ops.values()), {op: a for op, a in ops.items() if a not in dicts}


def test_the_worker_reads_exactly_the_arguments_its_ops_declare() -> None:
    dicts = _typed_dicts()
    reads = _worker_reads()
    assert reads, "no argument reads found: the scan is broken"
    unmapped = sorted({f"{rel}: {scope} (line {line})" for rel, scope, _, line in reads if (rel, scope) not in READS})
    assert not unmapped, ("these read request arguments; say whose in READS (tests/layout/test_protocol.py): "
                          + "; ".join(unmapped))
    undeclared = [f"{rel}:{line} {scope} reads {name!r}, which {READS[(rel, scope)]} does not declare"
                  for rel, scope, name, line in reads if name not in {k for _, k in _keys(READS[(rel, scope)], dicts)}]
    assert not undeclared, "\n".join(undeclared)
    read = set()
    for rel, scope, name, _ in reads:
        read |= {(cls, k) for cls, k in _keys(READS[(rel, scope)], dicts) if k == name}
    declared = set()
    for args in _ops().values():
        declared |= _keys(args, dicts)
    unread = sorted(f"{cls}.{k}" for cls, k in declared - read)
    assert not unread, f"arguments the protocol declares and no worker code reads: {unread}"


def test_a_stale_mapping_fails_too() -> None:
    """Each READS entry still reads something: a moved function is noticed, not silently unchecked."""
    seen = {(rel, scope) for rel, scope, _, _ in _worker_reads()}
    assert not set(READS) - seen, f"READS entries that read no arguments any more: {sorted(set(READS) - seen)}"


# The login side as mypy sees it: each BAD line must be an error, and nothing else may be.
SNIPPET = '''
from workers import protocol


def good(item: protocol.CollectItem, args: protocol.CollectArgs) -> None:
    protocol.COLLECT({"native": True, "pids": [1], "gpu_evidence": "auto", "ras": False, "hold": 0.5})
    protocol.COLLECT(args)
    protocol.STRACE({"pid": 1, "start_time": None, "seconds": 1.0, "data": False})
    protocol.PUSH_TOOL({"name": "py-spy", "data_b64": "", "sha256": ""})
    if protocol.collect_item_key(item) == "dump":
        item["dump"]


def bad(item: protocol.CollectItem, args: protocol.CollectArgs) -> None:
    protocol.COLLECT({"natve": True})  # BAD: a misspelt argument
    protocol.COLLECT({"pids": "1"})  # BAD: a wrong type
    protocol.STRACE({"seconds": 1.0})  # BAD: its required pid is missing
    protocol.PUSH_TOOL(args)  # BAD: another op's arguments
    protocol.DUMP({"targets": [{"pid": 1}]})  # BAD: a target without its start_time
    item["dumpp"]  # BAD: a collect item has no such key
    if protocol.collect_item_key(item) == "rankk":  # BAD: nor is it a key collect_item_key can give
        pass
'''


def test_a_misspelt_argument_is_a_type_error(tmp_path: Path) -> None:
    path = tmp_path / "snippet.py"
    path.write_text(SNIPPET, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--python-version", "3.9", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary",
                           str(path)], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={"MYPYPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    lines = SNIPPET.splitlines()
    bad = {n for n, text in enumerate(lines, 1) if "# BAD" in text}
    errors: Dict[int, List[str]] = {}
    for out in done.stdout.splitlines():
        parts = out.split(":", 3)
        if len(parts) == 4 and parts[0].endswith("snippet.py") and parts[2].strip() == "error":
            errors.setdefault(int(parts[1]), []).append(parts[3].strip())
    assert done.returncode == 1, done.stdout + done.stderr
    assert set(errors) == bad, (f"errors on {sorted(errors)}, expected exactly on {sorted(bad)}:\n{done.stdout}")
    assert any("natve" in e for e in errors[min(bad)]), errors[min(bad)]
