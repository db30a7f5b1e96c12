"""The JSON Schema of the snapshot file, generated from app/model's dataclasses and their comments.

The model is the one source of truth: docs/snapshot.schema.json is this module's output, committed so users
can read and validate against it, and a test fails when the two differ (`python -m app.report.schema
docs/snapshot.schema.json` rewrites it after a model change).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import json
import pkgutil
import sys
import tokenize
import typing
from typing import Any, Dict, List, Literal, Tuple, Union

from app import model
from app.model import SCHEMA_NAME, SCHEMA_VERSION, Snapshot
from app.model.codec import AT_LEAST

DRAFT = "https://json-schema.org/draft/2020-12/schema"
# The analysis section, described at its top level only: it is a record of conclusions, not input data.
_ANALYSIS: Dict[str, Any] = {
    "verdict": {"type": "string", "description": "one plain sentence: the answer"},
    "findings": {"type": "array", "items": {"type": "object"},
                 "description": "most likely culprit first: kind, title, detail, confidence, reason, ranks"},
    "classes": {"type": "array", "items": {"type": "object"},
                "description": "equivalence classes (ranks with the same stack), largest first"},
    "tree": {"type": "object", "description": "the merged prefix tree of stacks, with rank counts"},
    "iteration_splits": {"type": "array", "items": {"type": "object"},
                         "description": "ranks of one class told apart by loop iteration"},
    "progress": {"type": "array", "items": {"type": "object"},
                 "description": "per rank: stuck, progressing or gone, when earlier samples were given"},
    "flight": {"type": ["object", "null"],
               "description": "PyTorch's Flight Recorder: state (unused, no_record, recorded), the summary line, "
                              "and rows of ranks with their last collective per process group"},
    "waits": {"type": "array", "items": {"type": "object"},
              "description": "who waits for whom, one graph per job (app/analysis/waits.py): vertices (ranks, "
                             "threads, processes, hosts), edges waiter -> waited with their evidence and strength, "
                             "the root (the culprit; several vertices: a deadlock), the headline and what to do next"},
}
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def build_schema() -> Dict[str, Any]:
    """The schema of what app.model.codec.snapshot_to_json writes (and snapshot_from_json reads)."""
    docs = _field_comments()
    defs: Dict[str, Any] = {}
    _define(Snapshot, defs, docs)
    return {
        "$schema": DRAFT,
        "$id": f"urn:{SCHEMA_NAME}:{SCHEMA_VERSION}",
        "title": "hangscope snapshot file",
        "description": (
            "One collection pass over a hung job: per-node status and per-rank stacks, written by "
            "`hangscope --snapshot FILE` and in export bundles (snapshot.json), read back by `hangscope --load "
            "FILE`. Tuples are JSON arrays. Readers ignore unknown keys: fields added later keep the same "
            "schema_version, a change that breaks readers bumps it. Values from nodes are remote text."),
        "type": "object",
        "required": ["schema", "schema_version", "snapshot"],
        "properties": {
            "schema": {"const": SCHEMA_NAME, "description": "names the format"},
            "schema_version": {"const": SCHEMA_VERSION, "description": "the format version this schema describes"},
            "sharing": {
                "type": "object",
                "description": ("how the file's values were shared (app/report/share.py): rule \"default-deny\" "
                                "(export bundles and --snapshot: a value not safe by the rule is written as "
                                "<TYPE len=N #HASH>, its type, length and a hash keyed per file) or \"raw\" "
                                "(--snapshot --raw: values as collected, the pattern net's *** only); absent in "
                                "files written before the rule"),
                "required": ["rule"],
                "properties": {"rule": {"enum": ["default-deny", "raw"]}, "token": {"type": "string"},
                               "note": {"type": "string"}},
            },
            "snapshot": {"$ref": "#/$defs/Snapshot"},
            "analysis": {
                "type": "object",
                "description": ("what hangscope's analysis concluded when the file was written (app/analysis "
                                "Analysis.to_dict()): informative; --load analyses the snapshot again"),
                "properties": _ANALYSIS,
            },
        },
        "$defs": dict(sorted(defs.items())),
    }


def _define(cls: type, defs: Dict[str, Any], docs: Dict[Tuple[str, str], str]) -> Dict[str, Any]:
    name = cls.__name__
    if name not in defs:
        defs[name] = {}  # an empty entry first: dataclasses may refer to each other
        hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))  # the module that defines it
        props: Dict[str, Any] = {}
        required: List[str] = []
        for f in dataclasses.fields(cls):
            prop = _type_schema(hints[f.name], defs, docs)
            low = AT_LEAST.get(f.name)
            if low is not None and prop.get("type") in ("integer", ["integer", "null"]):
                prop = {**prop, "minimum": low}
            doc = docs.get((name, f.name))
            if doc:
                prop = {**prop, "description": doc}
            props[f.name] = prop
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
        entry: Dict[str, Any] = {"type": "object"}
        summary = (inspect.getdoc(cls) or "").strip()
        if summary and not summary.startswith(f"{name}("):  # not the dataclass-generated signature
            entry["description"] = summary
        entry["properties"] = props
        if required:
            entry["required"] = required
        defs[name] = entry
    return {"$ref": f"#/$defs/{name}"}


def _type_schema(tp: Any, defs: Dict[str, Any], docs: Dict[Tuple[str, str], str]) -> Dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if origin is Union:
        options = [a for a in args if a is not type(None)]
        inner = [_type_schema(a, defs, docs) for a in options]
        if type(None) in args:
            if len(inner) == 1 and set(inner[0]) == {"type"}:
                return {"type": [inner[0]["type"], "null"]}
            inner.append({"type": "null"})
        return inner[0] if len(inner) == 1 else {"anyOf": inner}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (tuple, Tuple):
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _type_schema(args[0], defs, docs)}
        return {"type": "array", "prefixItems": [_type_schema(a, defs, docs) for a in args],
                "minItems": len(args), "maxItems": len(args)}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _define(tp, defs, docs)
    raise TypeError(f"no JSON Schema for {tp!r}: teach app/report/schema.py about it")


def _field_comments() -> Dict[Tuple[str, str], str]:
    """(class, field) -> the comment on the field's line, or the comment block just above it, in app/model."""
    out: Dict[Tuple[str, str], str] = {}
    for info in sorted(pkgutil.iter_modules(model.__path__), key=lambda m: m.name):
        out.update(_module_comments(inspect.getsource(importlib.import_module(f"{model.__name__}.{info.name}"))))
    return out


def _module_comments(source: str) -> Dict[Tuple[str, str], str]:
    comments: Dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: Dict[Tuple[str, str], str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            text = comments.get(stmt.lineno, "")
            if not text:
                above: List[str] = []
                n = stmt.lineno - 1
                while n in comments and lines[n - 1].lstrip().startswith("#"):
                    above.insert(0, comments[n])
                    n -= 1
                text = " ".join(above)
            if text:
                out[(node.name, stmt.target.id)] = text
    return out


def schema_text() -> str:
    return json.dumps(build_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m app.report.schema OUTPUT.json")
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        f.write(schema_text())
