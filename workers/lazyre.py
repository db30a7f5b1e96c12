"""Module-level regular expressions compiled at their first use, not when their module is imported.

A worker is started on every node at every session, on the node's critical path. Compiling the ~55
module-level patterns of the worker's modules costs ~20-25 ms of CPU at import (the `re` parser and compiler
are pure Python): about a quarter of a worker's start, and the largest single part of it. Most of them are
never used in a session: redaction's named-secret rules run only on text that has a secret-like name in it,
the strace and gdb readers only when those tools run, the socket readers only for `ss` output. The login side
imports the redaction rules too (app/report/redact.py), so its start pays the same.

`lazy(pattern, flags)` is a drop-in for `re.compile(pattern, flags)` at module level: it returns an object with
the compiled pattern's methods and attributes. The first attribute asked for compiles the pattern and stores
the compiled pattern's bound methods on the object, so every later call is a plain attribute lookup and a
call of `re`'s own method, as fast as on the compiled pattern. Two threads that use it first at once both
compile it; either result is the same pattern. A pattern that does not compile fails at its first use, so
tests/workers/test_lazyre.py compiles every module-level pattern of workers/ once.
Stdlib only, Python 3.9: this module runs on the nodes.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, List

# What the first use copies from the compiled pattern (re.Pattern's public methods and attributes).
_FORWARD = ("search", "match", "fullmatch", "sub", "subn", "split", "findall", "finditer", "scanner",
            "pattern", "flags", "groups", "groupindex")

MADE: List[LazyPattern] = []  # every lazy pattern, in creation order (the tests compile them all)


class LazyPattern:
    """A compiled pattern's stand-in until its first use; after it, its methods are the compiled pattern's."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self._args = (pattern, flags)

    def compiled(self) -> "re.Pattern[str]":
        """The compiled pattern (compiled now if it was not yet)."""
        got = self.__dict__.get("_compiled")
        if got is None:
            got = re.compile(*self._args)
            for name in _FORWARD:
                self.__dict__[name] = getattr(got, name)
            self.__dict__["_compiled"] = got
        return got

    def __getattr__(self, name: str) -> Any:
        # Only reached for a name the instance does not hold yet: before the first use, or a name re.Pattern
        # lacks (which raises AttributeError from the compiled pattern, as re.compile's result would).
        if name.startswith("__") or name in ("_args", "_compiled"):
            raise AttributeError(name)
        return getattr(self.compiled(), name)

    def __repr__(self) -> str:
        return "lazy(%r, %r)" % self._args


def lazy(pattern: str, flags: int = 0) -> "re.Pattern[str]":
    """`re.compile(pattern, flags)`, compiled at its first use (see the module's docstring)."""
    made = LazyPattern(pattern, flags)
    MADE.append(made)
    return made  # type: ignore[return-value]
