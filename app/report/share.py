"""What leaves the user's screen: the export bundle and the --snapshot file, default-deny.

The pattern net (app/report/redact.py, the node's rules) masks the secrets it recognises with `***`; then every
free-text value is shown only where the default-deny rule (workers/cleartext.py) finds it safe, word by word:
numbers, booleans, None, sizes and shapes, names that read like names, paths and URLs whose every component
does. Everything else is replaced by its type, length and a short keyed hash, `<str len=24 #3fa9c1e2>`: the key is
random per bundle (per file for --snapshot) and never written, so the same value hashes the same everywhere in
one bundle (rank 3's value still differs from the others', a thread name still matches its frames) and differently
in the next one (a hash cannot be matched against a guess from another bundle).

By channel: a frame's function and module are code and stay; file names and paths are judged component by
component; source lines, loop headers and locals' reprs are read as code (workers/codetext.py), so names stay,
literals and comments are judged inside their quotes and the line keeps its shape; command lines argument by
argument; thread names, process titles, error output and the analysis's sentences line by line (a line in a
language the name rules cannot read is hidden whole); strace payloads and gdb strings are reduced to sizes and
verbs first (workers/tooltext.py). A field named in `_KEPT` holds hangscope's own vocabulary or the job's
identifiers (node names, the job's store address) and is kept.

The analysis may compare raw values; what it prints goes through text() here like every other sentence.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import secrets
from typing import Any, Dict, List, Optional, Sequence, Tuple

from app.model import Frame, Local, Snapshot, StraceResult
from app.report.redact import Redactor
from workers.cleartext import (HIDDEN, clear_text, clear_word, foreign, keyed_token, plain_value, share_labelled,
                               share_name, share_text, share_words)
from workers.codetext import Token, owners, split_literal, tokens
from workers.lazyre import lazy
from workers.tooltext import gdb_text, gdb_thread_names, strace_text

RULE = "default-deny"
TOKEN_FORMAT = "<TYPE len=N #HASH>"  # TYPE: str, bytes or text; HASH: 8 hex digits of HMAC-SHA256 (per-bundle key)
# The snapshot file's "sharing" header (docs/snapshot.schema.json).
SHARING = {"rule": RULE, "token": TOKEN_FORMAT,
           "note": "a value the default-deny rule does not find safe (a number, a name, a path of names) is written "
                   "as its type, length and an HMAC-SHA256 hash keyed per file: equal values have equal hashes "
                   "within this file only; *** marks what the pattern net recognised as a secret"}
RAW = {"rule": "raw", "note": "values as collected (the pattern net's *** only): not for sharing"}

# Fields kept as they are: hangscope's own closed vocabularies, code names, numbers' units, the job's own
# identifiers. Every other string of the snapshot is a value and is judged.
_KEPT = frozenset({
    "function", "module", "variables", "counters",  # code
    "node", "job", "master_addr", "address", "hostname", "peer_names",  # the job's identifiers
    "kind", "role", "state", "code", "phase", "found_by", "launcher", "status", "via", "format", "smi",
    "xid_source", "stopped_by", "freezer", "freezer_state", "source", "hangscope_version",
    "gpu_evidence", "blocked_in", "syscall", "wchan", "top", "errors", "uuid", "bus_id", "hash",
    "NodeStatus.name", "ToolInfo.name",
})
# Not kept, though they read like vocabulary: a tool's version line, a GPU's model name and a freezer's cgroup are
# text a node (or a crafted snapshot file) writes, judged word by word like any other (`NVIDIA H100 80GB HBM3`,
# `py-spy 0.4.3` stay; a token put in them does not)
_PLAIN = frozenset({int, float, bool})
# What the decode shares between the ranks on the same stack (app/decode/replies.py interns them): judged once
# each (Sharer._once) rather than once per rank; a thread's frames tuple is shared the same way.
_SHARED_KINDS = frozenset({Frame, Local})


@functools.lru_cache(maxsize=None)
def _field_keys(cls: type) -> Tuple[Tuple[str, str], ...]:
    """A dataclass's fields with the key each is judged by: `Class.field` where _KEPT names it so, else its name.
    Every field, whatever its type hint says: what is judged is decided by the value a field holds (_walker)."""
    kind = cls.__name__
    return tuple((f.name, f"{kind}.{f.name}" if f"{kind}.{f.name}" in _KEPT or f"{kind}.{f.name}" in _NAME_FIELDS
                  else f.name) for f in dataclasses.fields(cls))


_WALKERS: Dict[type, Any] = {}  # a dataclass -> its generated walk (_walker)


def _walker(cls: type) -> Any:
    """Sharer._new for one dataclass, generated once from its fields (as dataclasses writes __init__): each value
    judged by its key unless it is a number, a flag or None, the object replaced only where a value changed. Field
    names are identifiers: dataclass fields are."""
    lines = ["def walk(s, o):", "    ch = None"]
    for name, key in _field_keys(cls):
        if not name.isidentifier():
            raise TypeError(f"{cls.__name__}.{name}: not an identifier")
        lines += [f"    v = o.{name}",
                  "    if v is not None and v.__class__ not in _PLAIN:",  # numbers, flags, None: nothing to judge
                  f"        n = s._str(v, {key!r}) if v.__class__ is str else s._obj(v, {key!r})",
                  "        if n is not v and n != v:",
                  "            if ch is None:",
                  "                ch = {}",
                  f"            ch[{name!r}] = n"]
    lines.append("    return _replace(o, **ch) if ch else o")
    env: Dict[str, Any] = {"_PLAIN": _PLAIN, "_replace": dataclasses.replace}
    exec("\n".join(lines) + "\n", env)  # from the class's own field names
    return env["walk"]


_PATH_FIELDS = frozenset({"filename", "exe", "python_exe", "path", "cgroup"})
_SOURCE_FIELDS = frozenset({"header", "items"})
# Names the job gave its threads (py-spy's thread name, an OS thread's comm): a value with no name to say what it
# is, shown only in a name's shape (workers/cleartext.py share_name), else hidden whole.
_NAME_FIELDS = frozenset({"ThreadStack.name", "OtherEnd.comm", "PipeReader.comm", "thread_name", "comm"})
# The format fields of a positional literal (a template's structure, not its data); a `%` glued after a letter or
# digit is part of the text (`Q%eK` is no field).
_FORMAT_FIELD = lazy(r"(?<![A-Za-z0-9])%(?:\([A-Za-z_]\w*\))?[-#0 +]*(?:\d+|\*)?(?:\.\d+)?[diouxXeEfFgGcrsa%]"
                     r"|\{[A-Za-z0-9_.!:<>^\[\]]*\}")


class Sharer:
    """The bundle's rule over text, values and whole snapshots; `counts` by rule as the Redactor's (the net's
    rules, and "default-deny" for every value replaced by a hash)."""

    def __init__(self, key: Optional[bytes] = None) -> None:
        self.key = key if key is not None else secrets.token_bytes(16)
        self.net = Redactor()
        self.counts = self.net.counts
        self._memo: Dict[Tuple[str, str], str] = {}
        self._replay: Dict[Tuple[str, str], Dict[str, int]] = {}  # what a memoised result counted
        # objects the decode shares between ranks, by identity (kept alive here, so an id is never reused):
        # (the object, its shared copy, what judging it counted)
        self._objs: Dict[Tuple[int, str], Tuple[Any, Any, Dict[str, int]]] = {}
        self._argvs: Dict[Tuple[str, ...], Tuple[Tuple[str, ...], Dict[str, int]]] = {}  # args(), as _replay

    # -- the token ------------------------------------------------------------------------------------
    def hide(self, kind: str, text: str) -> str:
        """`<kind len=N #hash>`: what is shown for a value the rule does not let through."""
        self.counts[RULE] += 1
        return keyed_token(self.key, kind, text)

    # -- kinds of text --------------------------------------------------------------------------------
    def whole(self, s: str) -> str:
        """A rendered file (summary.md, report.html): the net only. Its values were shared before rendering;
        the markup between them (CSS colours, anchors) is not data."""
        return self.net.text(s)

    def whole_tree(self, obj: Any) -> Any:
        """A JSON document built from shared data (speedscope's, the manifest): the net only."""
        return self.net.tree(obj)

    def text(self, s: str) -> str:
        """Free text: an error message, a thread name, a sentence of the analysis, a path."""
        if not s:
            return s
        return self._cached("text", s, lambda: share_text(self.net.text(s), self.hide))

    def name(self, s: str) -> str:
        """A thread's name or comm: kept in a name's shape, else hidden whole."""
        if not s:
            return s
        return self._cached("name", s, lambda: share_name(self.net.text(s), self.hide))

    def path(self, s: str) -> str:
        return self._cached("path", s, lambda: share_text(self.net.path(s), self.hide)) if s else s

    def source(self, line: str) -> str:
        """A source line or a loop header: the net's code rules, then its literals and comments judged."""
        return self._cached("source", line, lambda: self._code(self.net.source(line))) if line else line

    def value(self, name: str, value: str, rule: str = "secret-local") -> str:
        """A named value (a local's repr, a loop variable, an env value): the net by name, then read as code."""
        if not value:
            return value
        return self._cached("value:" + rule + ":" + name, value, lambda: self._code(self.net.value(name, value, rule)))

    def args(self, argv: Sequence[str]) -> List[str]:
        """A command line: the net's flag rules, then each argument as free text (each distinct one judged once:
        every rank of a node, and of a job, has much the same)."""
        key = tuple(argv)
        hit = self._argvs.get(key)
        if hit is not None:
            if hit[1]:
                self.counts.update(hit[1])
            return list(hit[0])
        before = dict(self.counts)
        out = [self.text(a) for a in self.net.args(argv)]
        if sum(map(len, key)) <= 65536:
            self._argvs[key] = (tuple(out), self._since(before))
        return out

    def strace(self, output: str) -> str:
        """strace's output: payloads reduced to their protocol verb (an older worker's or --raw file's bytes)."""
        hits: Dict[str, int] = {}
        out = self.text(strace_text(output, verbs=True, hits=hits))
        self.counts.update(hits)
        return out

    def gdb(self, output: str) -> str:
        hits: Dict[str, int] = {}
        out = self.text(gdb_thread_names(gdb_text(output, hits=hits), self.name))
        self.counts.update(hits)
        return out

    def _cached(self, kind: str, s: str, make: Any) -> str:
        key = (kind, s)
        out = self._memo.get(key)
        if out is None:
            before = dict(self.counts)
            out = make()
            if len(s) <= 4096:
                self._memo[key] = out
                self._replay[key] = self._since(before)
        else:
            replay = self._replay.get(key)
            if replay:
                self.counts.update(replay)
        return out

    def _since(self, before: Dict[str, int]) -> Dict[str, int]:
        """What the counts gained since `before` (a copy taken earlier): what a memoised result replays."""
        return {k: v - before.get(k, 0) for k, v in self.counts.items() if v != before.get(k, 0)}

    def _code(self, text: str) -> str:
        """Python-shaped text: names judged as words, literals and comments inside their quotes (a literal or a
        comment holding foreign words hidden whole), the rest (operators, spaces) kept."""
        out: List[str] = []
        done = 0
        toks = tokens(text)
        if foreign("".join(t.text for t in toks if t.kind == "op")):
            toks = _merge_foreign(toks)  # letters outside ASCII in the code itself: one token per run, never a letter
        for i, t in enumerate(toks):
            if t.start > done:
                out.append(text[done:t.start])
            if t.kind == "str":
                prefix, content, close = split_literal(t.text)
                kind = "bytes" if "b" in prefix.lower() else "str"
                if _positional(toks, i):
                    content = self._unnamed(content, kind)
                out.append(prefix + self._inside(content, kind) + close)
            elif t.kind == "comment":
                out.append("#" + self._inside(t.text[1:], "text"))
            elif HIDDEN.fullmatch(t.text) or (t.kind in ("name", "num") and clear_word(t.text)):
                out.append(t.text)
            elif t.kind in ("name", "num") or foreign(t.text):
                out.append(self.hide("str", t.text))
            else:
                out.append(t.text)
            done = t.end
        out.append(text[done:])
        return "".join(out)

    def _inside(self, content: str, kind: str) -> str:
        if not content:
            return content
        if foreign(content):
            return self.hide(kind, content)
        if kind == "text":  # a comment: free text, a value after a label judged as one
            content = share_labelled(content, self.hide)
        return share_words(content, self.hide, "str")

    def _unnamed(self, content: str, kind: str) -> str:
        """A literal passed positionally to a call: no name says what it is (`FTP("host", "user", "x")`), so each
        run of it (between spaces and a message's separators, format fields aside) is shown only in a name's shape
        or as a path; any other run is hidden whole, never split at its symbols."""
        if foreign(content):
            return content  # hidden whole by _inside
        def run(m: "re.Match[str]") -> str:
            r = m.group(0)
            if HIDDEN.fullmatch(r) or plain_value(r) or ("/" in r and clear_text(r)):
                return r
            return self.hide(kind, r)
        out: List[str] = []
        done = 0
        for f in _FORMAT_FIELD.finditer(content):
            out.append(_RUN_VALUE.sub(run, content[done:f.start()]) + f.group(0))
            done = f.end()
        out.append(_RUN_VALUE.sub(run, content[done:]))
        return "".join(out)

    # -- the snapshot and the analysis ----------------------------------------------------------------
    def snapshot(self, snap: Snapshot) -> Snapshot:
        """A shared copy: every field by its kind (see the module's docstring); the shape kept, so --load and the
        analysis read it (equal values stay equal: the hash is keyed per bundle, not per value)."""
        out = self._obj(snap, "")
        assert isinstance(out, Snapshot)
        return out

    def _str(self, s: str, field: str) -> str:
        if field in _KEPT or not s or HIDDEN.fullmatch(s):
            return s
        if field in _PATH_FIELDS:
            return self.path(s)
        if field in _SOURCE_FIELDS:
            return self.source(s)
        if field in _NAME_FIELDS:
            return self.name(s)
        if field == "gdb":
            return self.gdb(s)
        return self.text(s)

    def _obj(self, obj: Any, field: str) -> Any:
        if isinstance(obj, str):
            return self._str(obj, field)
        if obj.__class__ in _SHARED_KINDS or (field == "frames" and obj.__class__ is tuple and obj):
            return self._once(obj, field)
        return self._new(obj, field)

    def _once(self, obj: Any, field: str) -> Any:
        """_new for an object the decode shares between ranks (a frame, a local, a thread's frames): judged once
        per object and field, its counts replayed at every later use as the text memo replays them."""
        key = (id(obj), field)
        hit = self._objs.get(key)
        if hit is not None and hit[0] is obj:
            if hit[2]:
                self.counts.update(hit[2])
            return hit[1]
        before = dict(self.counts)
        out = self._new(obj, field)
        self._objs[key] = (obj, out, self._since(before))
        return out

    def _new(self, obj: Any, field: str) -> Any:
        if isinstance(obj, tuple):
            if not obj:
                return obj
            if field == "cmdline" and all(isinstance(a, str) for a in obj):
                return tuple(self.args(obj))
            if field in ("env", "iteration") and all(_pair(p) for p in obj):
                rule = "secret-env" if field == "env" else "secret-local"
                return tuple((k, self.value(k, v, rule)) for k, v in obj)
            if field == "source" and all(_line(p) for p in obj):
                return tuple((n, self.source(t)) for n, t in obj)
            if field in ("peer_names", "top"):
                return obj
            items = tuple(self._obj(x, field) for x in obj)
            # nothing changed: the same tuple, so that the dataclass above need not compare it value by value
            return obj if all(a is b for a, b in zip(items, obj)) else items
        if isinstance(obj, Local):
            return dataclasses.replace(obj, repr=self.value(obj.name, obj.repr))
        if isinstance(obj, StraceResult):
            return dataclasses.replace(obj, output=self.strace(obj.output),
                                       threads=obj.threads)  # per-thread syscalls and counts: numbers and names
        cls: type = obj.__class__
        walk = _WALKERS.get(cls)
        if walk is None:
            if not dataclasses.is_dataclass(obj) or isinstance(obj, type):  # no dataclass (or a dataclass class)
                return obj
            walk = _WALKERS[cls] = _walker(cls)
        return walk(self, obj)

    def tree(self, obj: Any) -> Any:
        """A to_dict() document (the analysis, GPU test results): env pairs, command lines, locals and loop
        variables by name, code names kept, every other string as free text."""
        return self._tree(obj, "")

    def _tree(self, obj: Any, key: str) -> Any:
        if isinstance(obj, str):
            return self._str(obj, key)
        if isinstance(obj, dict):
            name = obj.get("name") if isinstance(obj.get("name"), str) else None
            out: Dict[str, Any] = {}
            for k, v in obj.items():
                if k == "repr" and name is not None and isinstance(v, str):
                    out[k] = self.value(name, v)
                elif k == "name" and "repr" in obj:
                    out[k] = v  # a local's name: code
                else:
                    out[k] = self._tree(v, k)
            return out
        if isinstance(obj, list):
            if key == "cmdline" and all(isinstance(a, str) for a in obj):
                return self.args(obj)
            if key in ("env", "iteration") and all(_pair(p) for p in obj):
                rule = "secret-env" if key == "env" else "secret-local"
                return [[p[0], self.value(p[0], p[1], rule)] for p in obj]
            if key == "source" and all(_line(p) for p in obj):
                return [[p[0], self.source(p[1])] for p in obj]
            return [self._tree(v, key) for v in obj]
        return obj

    def summary(self) -> Dict[str, int]:
        return dict(sorted(self.counts.items()))


_RUN_VALUE = lazy(r"[^\s:=,;()\[\]<>'\"|]+")


def _positional(toks: List[Token], i: int) -> bool:
    """toks[i], a literal, is passed positionally to a call: its innermost owner is the call (no keyword, key or
    flag names it)."""
    names = owners(toks, i)
    return names is not None and bool(names) and names[0].endswith("()")


def _merge_foreign(toks: list) -> list:
    """Adjacent operator tokens (no space between) holding letters outside ASCII, merged into one: hashing them a
    character at a time would give a substitution cipher."""
    out: list = []
    for t in toks:
        prev = out[-1] if out else None
        if (t.kind == "op" and prev is not None and prev.kind == "op" and prev.end == t.start
                and (foreign(t.text) or foreign(prev.text))):
            out[-1] = Token("op", prev.text + t.text, prev.start, t.end)
        else:
            out.append(t)
    return out


def _pair(p: Any) -> bool:
    return isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p)


def _line(p: Any) -> bool:
    return isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], int) and isinstance(p[1], str)


def share_output(snap: Snapshot, share: Sharer) -> Snapshot:
    """The snapshot with its ranks' error output (stderr tails, elastic error files, and their paths) shared:
    what --print quotes of it, since a printed summary is pasted as often as summary.md is."""
    ranks = tuple(dataclasses.replace(r, output=tuple(
        dataclasses.replace(o, path=share.path(o.path), text=share.text(o.text)) for o in r.output))
        if r.output else r for r in snap.ranks)
    return dataclasses.replace(snap, ranks=ranks) if any(r.output for r in snap.ranks) else snap
