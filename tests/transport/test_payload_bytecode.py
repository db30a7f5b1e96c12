"""The worker payload takes its modules' code from Python's bytecode cache where it is current: the same code
as compiling them, the node's tracebacks still name <hangscope>/..., and a source newer than its cache wins."""

from __future__ import annotations

import compileall
import json
import marshal
import os
import zlib
from pathlib import Path

from app.transport import bootstrap


def _package(tmp_path: Path, body: str) -> Path:
    root = tmp_path / "workers"
    root.mkdir(exist_ok=True)
    (root / "__init__.py").write_text("")
    (root / "mod.py").write_text(body)
    return root


def _code(payload: bootstrap.Payload) -> dict:
    raw = zlib.decompress(payload.data[:payload.head])  # the first stream: the module list, then the code
    return marshal.loads(raw[raw.index(b"\n") + 1:])


def _sources(payload: bootstrap.Payload) -> dict:
    return json.loads(zlib.decompress(payload.data[payload.head:]))  # the second stream


def _filenames(code) -> set[str]:
    out = {code.co_filename}
    for c in code.co_consts:
        if hasattr(c, "co_filename"):
            out |= _filenames(c)
    return out


BODY = "def outer():\n    def inner():\n        return 'v1'\n    return inner()\nclass K:\n    def m(self):\n        return 1\n"


def test_a_cached_module_ships_the_same_code_as_a_compiled_one(tmp_path: Path) -> None:
    root = _package(tmp_path, BODY)
    compiled = bootstrap._pack(root)
    assert not list(root.rglob("*.pyc"))
    assert compileall.compile_dir(str(root), quiet=1)
    cached = bootstrap._pack(root)
    assert list(root.rglob("*.pyc"))
    # the same sources and equal code objects (marshal's back-references may differ: they follow object identity)
    assert _sources(cached) == _sources(compiled) and _sources(cached)["workers.mod"] == BODY
    assert _code(cached) == _code(compiled)
    assert _code(compiled)["workers.mod"] == compile(BODY, "<hangscope>/workers/mod.py", "exec", dont_inherit=True)
    # every code object, nested functions and methods included, is named as the node shows it
    assert _filenames(_code(cached)["workers.mod"]) == {"<hangscope>/workers/mod.py"}


def test_a_source_newer_than_its_cache_is_compiled_again(tmp_path: Path) -> None:
    root = _package(tmp_path, BODY)
    assert compileall.compile_dir(str(root), quiet=1)
    mod = root / "mod.py"
    mod.write_text(BODY.replace("v1", "v2"))
    later = mod.stat().st_mtime + 10
    os.utime(mod, (later, later))
    namespace: dict = {}
    exec(_code(bootstrap._pack(root))["workers.mod"], namespace)
    assert namespace["outer"]() == "v2"
