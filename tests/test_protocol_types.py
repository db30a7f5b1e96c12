"""The protocol's type-checker-only names agree with what runs: ErrorCode (a Literal, for mypy) names exactly
the codes of ERROR_HINTS (the table the worker and the app use at run time)."""

from __future__ import annotations

import ast
from pathlib import Path

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
