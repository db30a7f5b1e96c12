"""The login side's redactor: the one pass every exported file, the printed summary and the --snapshot file go
through, counting what it replaced by rule.

Defence in depth: the worker already redacted every string of every reply on the node (workers/redact.py), so
this pass normally finds nothing new; it catches what an older worker or a snapshot file from elsewhere let
through. It uses the node's rules (one detector, so both sides agree on what is a secret) rather than a library
such as detect-secrets: the worker must stay stdlib-only, detect-secrets' plugins scan lines for token shapes
and keyword assignments but know nothing of our structures (locals by name, env pairs, argv flag pairs), and a
second, different detector here would hide on the login side what the TUI still shows. Names are kept and
values replaced with *** (REDACTED); counts are kept per rule, never the values.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple

from app.model import Local, Snapshot
from workers.cleartext import HIDDEN as _HIDDEN
from workers.redact import MASK
from workers.redact import _unquote as _node_unquote
from workers.redact import redact_argv as _node_redact_argv
from workers.redact import redact_named as _node_redact_named
from workers.redact import redact_path as _node_redact_path
from workers.redact import redact_source as _node_redact_source
from workers.redact import redact_text as _node_redact_text
from workers.redact import secret_name as _node_secret_name
from workers.redact import secret_value as _node_secret_value

# The same marker the node-side redactor uses, so a user sees one convention whichever side redacted.
REDACTED = MASK
_ALREADY = frozenset({REDACTED, "[REDACTED]", ""})
_MEMO_MAX = 4096  # longer strings (tool output) are rare and not worth keeping



def secret_name(name: str) -> bool:
    """True when a variable, flag or key name says its value may be a credential. The node's rule
    (workers/redact.py), so the login side hides exactly what the node would have hidden."""
    return _node_secret_name(name)


def secret_value(name: str, value: str) -> bool:
    """Whether a value under this name is hidden: strong names (TOKEN, PASSWORD) always, ambiguous ones
    (KEY, AUTH) unless the value is a number or a boolean (`--num-key-value-heads 8`)."""
    return value not in _ALREADY and _node_secret_value(name, value)


def _unquote(val: str) -> Tuple[str, str, str]:
    """Split a matched value into (opening quote, inner text, closing quote)."""
    return _node_unquote(val)


class Redactor:
    """Replaces secret values in text and snapshot data; `counts` says how many by rule."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        # A snapshot repeats the same strings (file names, functions, env values) thousands of times:
        # each distinct short string is redacted once; a hit replays its counts.
        self._memo: Dict[str, Tuple[str, Tuple[Tuple[str, int], ...]]] = {}
        self._hits: Counter = Counter()
        self._memo2: Dict[Tuple[str, str], Tuple[str, Tuple[Tuple[str, int], ...]]] = {}

    # -- free text -------------------------------------------------------------------------------------
    def text(self, s: str) -> str:
        """Redact every rule in a piece of free text (a line, a repr, a whole file)."""
        if not s:
            return s
        hit = self._memo.get(s)
        if hit is None:
            self._hits = Counter()
            out = self._text(s)
            hit = (out, tuple(self._hits.items()))
            if len(s) <= _MEMO_MAX:
                self._memo[s] = hit
        for rule, n in hit[1]:
            self.counts[rule] += n
        return hit[0]

    def _text(self, s: str) -> str:
        # the node's rules (workers/redact.py), counting by rule: one detector on both sides
        return _node_redact_text(s, self._hits)

    def _rule(self, fn: Any, s: str) -> str:
        """One of the node's structured rules over one string, memoised and counted like text()."""
        if not s:
            return s
        key = (fn.__name__, s)
        hit = self._memo2.get(key)
        if hit is None:
            hits: Counter = Counter()
            out = fn(s, hits)
            hit = (out, tuple(hits.items()))
            if len(s) <= _MEMO_MAX:
                self._memo2[key] = hit
        for rule, n in hit[1]:
            self.counts[rule] += n
        return hit[0]

    def source(self, line: str) -> str:
        """A source line or loop header: literals by what they belong to, the code's shape kept."""
        return self._rule(_node_redact_source, line)

    def path(self, path: str) -> str:
        """A file name: token shapes and random components, never secret words (a file is code)."""
        return self._rule(_node_redact_path, path)

    # -- structured values -----------------------------------------------------------------------------
    def value(self, name: str, value: str, rule: str) -> str:
        """A named value (env var, local, loop variable): replaced when the name looks secret, else read as a
        repr (its literals by the names they sit under)."""
        if secret_value(name, _unquote(value)[1]):
            self.counts[rule] += 1
            return REDACTED
        hits: Counter = Counter()
        out = _node_redact_named(name, value, hits, rule)
        self.counts.update(hits)
        return out

    def args(self, argv: Sequence[str]) -> List[str]:
        """A command line: `--secret value` pairs, `--secret=value`, short password flags, then free-text rules."""
        hits: Counter = Counter()
        out = _node_redact_argv(list(argv), hits)
        self.counts.update(hits)
        return out

    def snapshot(self, snap: Snapshot) -> Snapshot:
        """A redacted copy of a snapshot (the same rules as tree() on its to_dict() form, without the round
        trip through dicts); unchanged parts are shared with the original."""
        out = self._obj(snap, "")
        assert isinstance(out, Snapshot)
        return out

    def _obj(self, obj: Any, name: str) -> Any:
        if isinstance(obj, str):
            out = self._field(obj, name)
            return obj if out == obj else out
        if isinstance(obj, tuple):
            if not obj:
                return obj
            new: Tuple[Any, ...]
            if name == "cmdline" and all(isinstance(a, str) for a in obj):
                new = tuple(self.args(obj))
            elif name in ("env", "iteration") and all(_is_pair(p) for p in obj):
                rule = "secret-env" if name == "env" else "secret-local"
                new = tuple((self.text(k), self.value(k, v, rule)) for k, v in obj)
            elif name == "source" and all(_is_line(p) for p in obj):
                new = tuple((n, self.source(t)) for n, t in obj)
            else:
                new = tuple(self._obj(x, name) for x in obj)
            return obj if new == obj else new
        if isinstance(obj, Local):
            rep = self.value(obj.name, obj.repr, "secret-local")
            return obj if rep == obj.repr else dataclasses.replace(obj, repr=rep)
        names = _FIELDS.get(type(obj))
        if names is None:
            if not dataclasses.is_dataclass(obj):
                return obj
            names = _FIELDS[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
        changes = {}
        for field_name in names:
            value = getattr(obj, field_name)
            new_value = self._obj(value, field_name)
            if new_value is not value:
                changes[field_name] = new_value
        return dataclasses.replace(obj, **changes) if changes else obj

    def _field(self, s: str, name: str) -> str:
        """A string by the field it is in: code names kept, file names as paths, source as code, else text."""
        if name in _CODE_FIELDS:
            return s
        if name in _PATH_FIELDS:
            return self.path(s)
        if name in _SOURCE_FIELDS:
            return self.source(s)
        return self.text(s)

    def tree(self, obj: Any) -> Any:
        """Redact a to_dict() tree (snapshot or analysis): env pairs, cmdlines, locals and loop variables by
        name, every other string by the free-text rules. The shape is kept, so from_dict still reads it."""
        return self._tree(obj, "")

    def _tree(self, obj: Any, key: str) -> Any:
        if isinstance(obj, str):
            return self._field(obj, key)
        if isinstance(obj, dict):
            return self._dict(obj)
        if isinstance(obj, list):
            if key == "cmdline" and all(isinstance(a, str) for a in obj):
                return self.args(obj)
            if key in ("env", "iteration") and all(_is_pair(p) for p in obj):
                rule = "secret-env" if key == "env" else "secret-local"
                return [[self.text(p[0]), self.value(p[0], p[1], rule)] for p in obj]
            if key == "source" and all(_is_line(p) for p in obj):
                return [[p[0], self.source(p[1])] for p in obj]
            return [self._tree(v, key) for v in obj]
        return obj

    def _dict(self, d: Dict[str, Any]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        local_name = d.get("name") if isinstance(d.get("name"), str) else None
        for k, v in d.items():
            if k == "repr" and local_name is not None and isinstance(v, str):
                out[k] = self.value(local_name, v, "secret-local")  # a Local: {"name", "repr", "arg"}
            else:
                out[self.text(k)] = self._tree(v, k)
        return out

    def summary(self) -> Dict[str, int]:
        return dict(sorted(self.counts.items()))


_FIELDS: Dict[type, Tuple[str, ...]] = {}


# Fields of the model whose strings are code names (kept), paths, or source text.
_CODE_FIELDS = frozenset({"function", "module", "variables", "counters"})
_PATH_FIELDS = frozenset({"filename", "exe", "python_exe"})
_SOURCE_FIELDS = frozenset({"header", "items"})


def _is_line(p: Any) -> bool:
    return isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], int) and isinstance(p[1], str)


def _is_pair(p: Any) -> bool:
    return isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p)


def redact_text(s: str, redactor: Optional[Redactor] = None) -> str:
    """Convenience: redact one string with a fresh (or the given) redactor."""
    return (redactor or Redactor()).text(s)


# Which channel each snapshot field belongs to (a field not named here is in its parent's channel). The
# manifest counts the markers per channel: what the node replaced before sending, and what this side's pass
# replaced on top, since each replaced value leaves one marker.
_CHANNELS = {
    "cmdline": "argv", "env": "env", "locals": "locals", "iteration": "locals", "source": "source lines",
    "loops": "source lines", "frames": "stacks", "kernel_stack": "stacks", "wchan": "stacks", "name": "names",
    "exe": "process", "user": "process", "launcher": "process", "master_addr": "process", "strace": "strace",
    "gdb": "gdb", "flight": "flight recorder", "error": "errors", "output": "error output", "sockets": "network",
    "gpus": "gpus",
    "info": "node info",
}


def channel_counts(snap: Snapshot) -> Dict[str, int]:
    """How many values were replaced in each channel of a shared snapshot: the pattern net's markers and the
    default-deny rule's hash tokens, counted (never the values)."""
    counts: Counter = Counter()
    _count_markers(snap, "other", counts)
    return dict(sorted((k, v) for k, v in counts.items() if v))


def _count_markers(obj: Any, channel: str, counts: Counter) -> None:
    if isinstance(obj, str):
        if REDACTED in obj or "<" in obj:
            counts[channel] += len(_HIDDEN.findall(obj))
        return
    if isinstance(obj, (tuple, list)):
        for x in obj:
            _count_markers(x, channel, counts)
        return
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    for f in dataclasses.fields(obj):
        sub = _CHANNELS.get(f.name, channel)
        if f.name == "name" and channel in ("locals", "source lines"):
            sub = channel  # a local's or loop's own name
        _count_markers(getattr(obj, f.name), sub, counts)
