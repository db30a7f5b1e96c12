"""workers/lazyre.py: the worker's module-level patterns are compiled at their first use, not at import.

What a user relies on: a worker's start on a node does not pay for patterns a session never uses (~20-25 ms of
CPU a node, a quarter of the start), and a lazy pattern behaves as the compiled one, also after its first use."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys

import pytest

import workers
from workers import lazyre
from workers.lazyre import LazyPattern, lazy

from worker_client import REPO

# The worker's modules (the GPU test programs run under the job's interpreter, not in the worker: left out).
MODULES = sorted(m.name for m in pkgutil.walk_packages(workers.__path__, "workers.")
                 if not m.name.startswith("workers.gputest"))


def test_every_module_level_pattern_of_the_worker_compiles_and_is_what_re_compile_gives() -> None:
    for name in MODULES:
        importlib.import_module(name)
    assert len(lazyre.MADE) >= 50, "the worker's module-level patterns are made with lazy()"
    for made in lazyre.MADE:
        pattern, flags = made._args
        compiled, plain = made.compiled(), re.compile(pattern, flags)
        assert (compiled.pattern, compiled.flags, compiled.groupindex) == (plain.pattern, plain.flags,
                                                                           plain.groupindex), made


def test_a_lazy_pattern_answers_as_the_compiled_one_before_and_after_its_first_use() -> None:
    text = "user=alice token=abc123 id=7"
    for first in ("search", "sub", "pattern"):
        lz = lazy(r"(?P<name>\w+)=(?P<value>\w+)", re.A)
        real = re.compile(r"(?P<name>\w+)=(?P<value>\w+)", re.A)
        assert "_compiled" not in lz.__dict__
        getattr(lz, first)  # whichever is used first compiles it
        assert lz.__dict__["_compiled"].pattern == real.pattern
        assert lz.search(text).group("value") == real.search(text).group("value") == "alice"
        assert lz.sub(r"\g<name>=***", text) == "user=*** token=*** id=***"
        assert [m.span() for m in lz.finditer(text)] == [m.span() for m in real.finditer(text)]
        assert lz.findall(text) == real.findall(text)
        assert lz.fullmatch("a=b") and not lz.match(" a=b")
        assert lz.split(text) == real.split(text) and lz.subn("", text) == real.subn("", text)
        assert (lz.pattern, lz.flags, lz.groups, lz.groupindex) == (real.pattern, real.flags, 2, real.groupindex)
        # after the first use the methods are re's own, bound to the compiled pattern: no wrapper on the path
        assert lz.search.__self__ is lz.__dict__["_compiled"] and type(lz.search) is type(real.search)
    assert "lazy(" in repr(lazy("x"))


def test_a_name_a_compiled_pattern_lacks_is_an_attribute_error_and_a_bad_pattern_fails_at_first_use() -> None:
    lz = lazy("a+")
    with pytest.raises(AttributeError):
        lz.no_such_method  # noqa: B018
    assert not hasattr(lz, "__len__")
    bad = LazyPattern("(unclosed")
    with pytest.raises(re.error):
        bad.search("x")


def test_starting_a_worker_compiles_none_of_its_patterns() -> None:
    # A fresh interpreter as a node's (-S, the checkout on the path): importing what the worker's entry imports
    # compiles nothing; the first redaction compiles only what that text needs.
    code = ("import json,sys; sys.path.insert(0, %r); import workers.__main__; from workers import lazyre, redact;"
            "n = lambda: sum('_compiled' in p.__dict__ for p in lazyre.MADE); a = n();"
            "redact.redact_text('a plain line of text, nothing secret'); print(json.dumps([len(lazyre.MADE), a, n()]))"
            % REPO)
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    made, at_start, after_plain_text = json.loads(done.stdout)
    assert made >= 50 and at_start == 0
    assert 0 < after_plain_text < made // 2, "plain text needs the prefilters, not the named-secret rules"
