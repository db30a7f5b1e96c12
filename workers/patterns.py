"""Whether a --match regular expression can be searched in bounded time: the rules both sides apply (the login
node before anything connects, the worker at its trust boundary), so a pattern that backtracks without bound is
refused with a message naming it, instead of running into the node's discovery deadline.

Python's `re` backtracks. The shapes that make a search exponential in the text's length are refused:
- a repeat inside a repeat where either can match a varying number of characters: `(a+)+`, `(a*)*`, `(\\w+\\s?)*`,
  `(a{1,3})+` (each character can be split between the two repeats in exponentially many ways);
- a repeated alternation whose branches can start with the same character or match nothing: `(a|a)+`,
  `(a|ab)*`, `(\\w|\\d)+` (each character can be taken by several branches);
- a back-reference (`\\1`): it makes matching NP-hard in general;
- possessive repeats and atomic groups (`a++`, `(?>...)`): Python 3.11 syntax, which the nodes' Python 3.9 lacks.
A pattern with more than MAX_OPEN_REPEATS unbounded repeats in sequence (`.*a.*b.*c.*d`) is refused too: each
adds a factor of the text's length. What is left is polynomial of a low degree over a command line cut at 4096
characters, and the worker also stops searching once MATCH_BUDGET seconds of matching have passed.
Stdlib only, Python 3.9: this module runs on the nodes.
"""

from __future__ import annotations

import importlib
import re
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, List, Optional, Set

_parser = importlib.import_module("re._parser" if sys.version_info >= (3, 11) else "sre_parse")
_c = importlib.import_module("re._constants" if sys.version_info >= (3, 11) else "sre_constants")

MAX_OPEN_REPEATS = 3
MATCH_BUDGET = 2.0  # seconds of matching per discovery, on a node, whatever the pattern
_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT}
_NEW_SYNTAX = {getattr(_c, name) for name in ("POSSESSIVE_REPEAT", "ATOMIC_GROUP") if hasattr(_c, name)}
_ANY = "any"  # a first-character set that may hold any character
_NEW_SYNTAX_WHY = "possessive repeats and atomic groups"


def problem(pattern: str) -> Optional[str]:
    """Why `pattern` cannot be used by --match (a sentence naming it), or None when it can."""
    try:
        re.compile(pattern)
        tree = _parser.parse(pattern)
    except OverflowError:
        return "--match %r: a repeat count is too large" % (pattern,)
    except RecursionError:
        return "--match %r: nested too deeply" % (pattern,)
    except re.error as exc:
        return "--match %r is not a regular expression: %s" % (pattern, exc)
    try:
        why = _check(list(tree), 0)
        if why is None and _open_repeats(list(tree)) > MAX_OPEN_REPEATS:
            why = "more than %d unbounded repeats (.* + ...) in sequence" % MAX_OPEN_REPEATS
    except RecursionError:
        return "--match %r: nested too deeply" % (pattern,)
    if why is None:
        return None
    if why == _NEW_SYNTAX_WHY:
        return "--match %r uses %s, Python 3.11 syntax that the nodes' Python 3.9 lacks" % (pattern, why)
    return "--match %r can backtrack without bound (%s); simplify it, e.g. --match 'train\\.py'" % (pattern, why)


def _check(items: List[Any], outer: int) -> Optional[str]:
    """`outer`: how many enclosing repeats can repeat their body more than once."""
    for op, av in items:
        if op in _NEW_SYNTAX:
            return _NEW_SYNTAX_WHY
        if op == _c.GROUPREF or op == _c.GROUPREF_EXISTS:
            return "a back-reference"
        if op in _REPEATS:
            lo, hi, body = av
            body = list(body)
            if outer and (lo != hi or _varies(body)):
                return "a repeat inside a repeat"
            why = _check(body, outer + (1 if hi > 1 else 0))
        elif op == _c.SUBPATTERN:
            why = _check(list(av[-1]), outer)
        elif op == _c.BRANCH:
            branches = [list(b) for b in av[1]]
            if outer and _ambiguous(branches):
                return "an alternation inside a repeat whose branches can match alike"
            why = next((w for w in (_check(b, outer) for b in branches) if w), None)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            why = _check(list(av[1]), outer)
        else:
            why = None
        if why:
            return why
    return None


def _varies(items: List[Any]) -> bool:
    """Whether `items` can match strings of different lengths (a repeat, an option, uneven alternatives)."""
    lo, hi = _width(items)
    return lo != hi


def _width(items: List[Any]) -> Any:
    return _parser.SubPattern(_parser.State(), items).getwidth()


def _ambiguous(branches: List[List[Any]]) -> bool:
    """Alternatives of different widths, or two that can start with the same character: a repeat around them
    can split its text between them in exponentially many ways."""
    if len({_width(b) for b in branches}) > 1:
        return True
    seen: Set[Any] = set()
    for branch in branches:
        first = _first(branch)
        if first is None or first == _ANY or _ANY in seen or seen & first:
            return True
        seen |= first
    return False


def _first(items: List[Any]) -> Any:
    """The literal characters the sequence can start with; _ANY for a class or a wildcard; None when it is
    empty."""
    for op, av in items:
        if op == _c.LITERAL:
            return {av}
        if op == _c.SUBPATTERN:
            inner = _first(list(av[-1]))
            if inner is None:
                continue
            return inner
        if op == _c.AT:
            continue
        return _ANY
    return None


def _open_repeats(items: List[Any]) -> int:
    """Unbounded repeats in the whole pattern (each one can multiply a search's work by the text's length)."""
    n = 0
    for op, av in items:
        if op in _REPEATS:
            n += (1 if av[1] == _c.MAXREPEAT else 0) + _open_repeats(list(av[2]))
        elif op == _c.SUBPATTERN:
            n += _open_repeats(list(av[-1]))
        elif op == _c.BRANCH:
            n += max((_open_repeats(list(b)) for b in av[1]), default=0)
    return n
