"""The protocol's type-checker-only names agree with what runs: ErrorCode (a Literal, for mypy) names exactly
the codes of ERROR_HINTS (the table the worker and the app use at run time)."""

from __future__ import annotations

import ast
from pathlib import Path

import testenv  # noqa: F401 (the interpreter and py-spy the stand-in and the worker use)
from worker_client import WorkerProc
from worker_targets import start_rank
from workers import protocol

PROTOCOL = Path(protocol.__file__)


def _literal(name: str) -> list[str]:
    tree = ast.parse(PROTOCOL.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            assert isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name)
            assert value.value.id == "Literal"
            elts = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
            return [e.value for e in elts if isinstance(e, ast.Constant)]
    raise AssertionError(f"{name} is not defined in {PROTOCOL}")


def test_error_code_literal_names_every_code_of_the_hints_table() -> None:
    codes = _literal("ErrorCode")
    assert len(codes) == len(set(codes))
    assert set(codes) == set(protocol.ERROR_HINTS)


def test_unknown_codes_become_internal_with_the_original_code_in_the_message() -> None:
    err = protocol.error_dict("no_such_code", "boom")
    assert err["code"] == "internal" and "no_such_code" in err["message"]
    assert err["hint"] == protocol.ERROR_HINTS["internal"]


def _keys(name: str) -> set[str]:
    """The keys a TypedDict of workers/protocol.py declares (it exists for type checkers only)."""
    tree = ast.parse(PROTOCOL.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    raise AssertionError(f"no TypedDict {name} in {PROTOCOL}")


def test_a_real_workers_messages_carry_only_the_declared_keys() -> None:
    """The shapes app/decode/replies.py is type-checked against are the ones a real worker sends: hello, and the collect
    op's rank, discovered and dump items (py-spy threads included) for a stand-in rank."""
    with start_rank(0) as t, WorkerProc() as w:
        assert set(w.hello) <= _keys("Hello") and set(w.hello["tools"]["py-spy"]) <= _keys("ToolFound")
        items, done = w.call("collect", {"pids": [t.pid], "locals": True, "loops": True, "source_context": 2})
        assert done["type"] == "done", done
        kinds = set()
        for item in items:
            data = item
            assert set(data) <= _keys("CollectItem"), data.keys()
            kinds |= set(data)
            if "rank" in data:
                assert set(data["rank"]) <= _keys("RankInfo"), set(data["rank"]) - _keys("RankInfo")
            if "dump" in data:
                dump = data["dump"]
                assert set(dump) <= _keys("DumpItem"), set(dump) - _keys("DumpItem")
                assert dump["pyspy"] and all(set(th) <= _keys("PyspyThread") for th in dump["pyspy"])
                assert dump["error"] is None
        assert kinds == {"rank", "discovered", "dump"}
    err = protocol.error_dict("timeout", "x")
    assert set(err) == _keys("ErrorDict")
