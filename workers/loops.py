"""The loops enclosing a frame's current line, and the source around it, from the frame's file (ast).

Files are parsed once per (path, mtime, size), with a bounded cache and a size cap, so a dump of many ranks
running the same script parses it once. Nothing here executes or imports the target's code.
"""

from __future__ import annotations

import ast
import os
import threading
from collections import OrderedDict

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Any, Dict, List, Optional, Tuple

MAX_FILE_BYTES = 2 << 20
MAX_CACHED_FILES = 64
MAX_LINE_CHARS = 400

if TYPE_CHECKING:
    _Scope = Tuple[int, int]  # (first line, last line) of a function or of the module


class _Loop:
    __slots__ = ("kind", "line", "end_line", "variables", "counters", "scope")

    def __init__(self, kind: str, line: int, end_line: int, variables: Tuple[str, ...],
                 counters: Tuple[str, ...], scope: _Scope) -> None:
        self.kind, self.line, self.end_line = kind, line, end_line
        self.variables, self.counters, self.scope = variables, counters, scope


class _With:
    """A `with` statement: the context managers it holds while its body runs (a lock's `with lock:`)."""
    __slots__ = ("line", "body_line", "end_line", "items", "scope")

    def __init__(self, line: int, body_line: int, end_line: int, items: Tuple[str, ...], scope: _Scope) -> None:
        self.line, self.body_line, self.end_line, self.items, self.scope = line, body_line, end_line, items, scope


class _File:
    """One parsed source file: its lines, its functions' line ranges, its loops and its `with` blocks."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.scopes: List[_Scope] = []
        self.loops: List[_Loop] = []
        self.withs: List[_With] = []
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return  # another Python version's syntax, or not Python: no loops, the source still shows
        self._visit(tree.body, (1, max(1, len(self.lines))))

    def _visit(self, body: List[ast.stmt], scope: _Scope) -> None:
        for node in body:
            self._node(node, scope)

    def _node(self, node: ast.AST, scope: _Scope) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = (node.lineno, getattr(node, "end_lineno", node.lineno) or node.lineno)
            self.scopes.append(inner)
            self._visit(node.body, inner)
            return
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            kind = "while" if isinstance(node, ast.While) else ("async for" if isinstance(node, ast.AsyncFor)
                                                                 else "for")
            variables = _names(node.target) if not isinstance(node, ast.While) else ()
            end = getattr(node, "end_lineno", None) or node.lineno
            self.loops.append(_Loop(kind, node.lineno, end, variables, _counters(node.body), scope))
        elif isinstance(node, (ast.With, ast.AsyncWith)) and node.body:
            items = tuple(_expression(i.context_expr) for i in node.items[:4])
            end = getattr(node, "end_lineno", None) or node.lineno
            self.withs.append(_With(node.lineno, node.body[0].lineno, end, items, scope))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt) or isinstance(child, ast.excepthandler):
                self._node(child, scope)
            elif isinstance(child, ast.AST) and hasattr(child, "body"):  # match cases
                self._node(child, scope)

    def scope_of(self, line: int) -> _Scope:
        """The innermost function containing line, or the whole module."""
        best: _Scope = (1, max(1, len(self.lines)))
        for first, last in self.scopes:
            if first <= line <= last and (last - first) <= (best[1] - best[0]):
                best = (first, last)
        return best

    def loops_at(self, line: int) -> List[Dict[str, Any]]:
        scope = self.scope_of(line)
        found = [lp for lp in self.loops if lp.scope == scope and lp.line <= line <= lp.end_line]
        found.sort(key=lambda lp: (lp.line, -lp.end_line))  # outermost first
        return [{"kind": lp.kind, "line": lp.line, "end_line": lp.end_line, "header": self.text(lp.line),
                 "variables": list(lp.variables), "counters": list(lp.counters)} for lp in found]

    def withs_at(self, line: int) -> List[Dict[str, Any]]:
        """The `with` blocks of line's function that contain it, outermost first; "entering" when the line is
        the statement's own header (the frame waits to enter it: a lock not acquired yet), else it holds them."""
        scope = self.scope_of(line)
        found = [w for w in self.withs if w.scope == scope and w.line <= line <= w.end_line]
        found.sort(key=lambda w: (w.line, -w.end_line))
        return [{"kind": "with", "line": w.line, "end_line": w.end_line, "header": self.text(w.line),
                 "items": list(w.items), "entering": line < w.body_line} for w in found]

    def text(self, line: int) -> str:
        if 1 <= line <= len(self.lines):
            return self.lines[line - 1].strip()[:MAX_LINE_CHARS]
        return ""


def _expression(node: ast.AST) -> str:
    """A context manager's expression as written, e.g. `self._lock` or `_metrics_lock`, capped."""
    try:
        return ast.unparse(node)[:200]  # (python 3.9+)
    except Exception:  # a very deep expression (RecursionError) or an odd node: no name, still a block
        return ""


def _names(target: ast.AST) -> Tuple[str, ...]:
    """Names bound by a loop target: `step, (x, y)` -> ("step", "x", "y"); attributes are not names."""
    if isinstance(target, ast.Name):
        return (target.id,)
    if isinstance(target, (ast.Tuple, ast.List)):
        out: Tuple[str, ...] = ()
        for elt in target.elts:
            out += _names(elt)
        return out
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return ()


def _counters(body: List[ast.stmt]) -> Tuple[str, ...]:
    """Names updated with += / -= in the loop body, not in nested loops or functions (theirs, not ours)."""
    out: List[str] = []
    stack: List[ast.AST] = list(body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef, ast.Lambda)):
            continue
        if (isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub))
                and isinstance(node.target, ast.Name) and node.target.id not in out):
            out.append(node.target.id)
        stack.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, (ast.stmt, ast.excepthandler))
                     or hasattr(c, "body"))
    return tuple(out)


class SourceCache:
    """Parsed files keyed by (path, mtime, size); thread-safe, least recently used dropped first."""

    def __init__(self, max_files: int = MAX_CACHED_FILES) -> None:
        self._lock = threading.Lock()
        self._files: "OrderedDict[Tuple[str, int, int], Optional[_File]]" = OrderedDict()
        self._max = max_files

    def get(self, path: str) -> Optional[_File]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not os.path.isfile(path) or st.st_size > MAX_FILE_BYTES:
            return None
        key = (path, st.st_mtime_ns, st.st_size)
        with self._lock:
            if key in self._files:
                self._files.move_to_end(key)
                return self._files[key]
        try:
            with open(path, "rb") as f:
                text = f.read(MAX_FILE_BYTES).decode("utf-8", "replace")
        except OSError:
            return None
        parsed = _File(text)
        with self._lock:
            self._files[key] = parsed
            while len(self._files) > self._max:
                self._files.popitem(last=False)
        return parsed


CACHE = SourceCache()


def resolve(pid: int, filename: str, in_container: bool) -> Optional[str]:
    """Where to read a frame's file from the worker: through /proc/PID/root when the target lives in
    another mount namespace, through /proc/PID/cwd for a relative name."""
    if not filename or filename.startswith("<"):
        return None
    if not os.path.isabs(filename):
        return "/proc/%d/cwd/%s" % (pid, filename)
    return "/proc/%d/root%s" % (pid, filename) if in_container else filename


def annotate(pid: int, frames: List[Tuple[str, int]], context: int, in_container: bool = False,
             want_loops: bool = True, cache: SourceCache = CACHE) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(loops, source) for (filename, line) pairs: loops keyed "<filename>:<line>", source lines keyed by
    filename then line number (as strings, JSON keys)."""
    loops: Dict[str, Any] = {}
    source: Dict[str, Dict[str, str]] = {}
    for filename, line in frames:
        if not line:
            continue
        path = resolve(pid, filename, in_container)
        parsed = cache.get(path) if path else None
        if parsed is None:
            continue
        if want_loops:
            # the loops, then the `with` blocks (kind "with") around the line: one list per frame line
            found = parsed.loops_at(line) + parsed.withs_at(line)
            if found:
                loops["%s:%d" % (filename, line)] = found
        if context >= 0:
            lines = source.setdefault(filename, {})
            for n in range(max(1, line - context), min(len(parsed.lines), line + context) + 1):
                lines[str(n)] = parsed.lines[n - 1].rstrip()[:MAX_LINE_CHARS]
    return loops, source
