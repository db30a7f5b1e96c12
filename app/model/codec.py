"""The snapshot's JSON form: a codec generic over the model's dataclasses (driven by their type hints, checked
as strictly as docs/snapshot.schema.json, which is generated from the same hints), and the snapshot file format.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import sys
import threading
import typing
from typing import Any, Iterable, Iterator, List, Literal, Optional, Tuple, Union

from app.model import SCHEMA_NAME, SCHEMA_VERSION, Frame, Snapshot

# Bounds on what a snapshot file may hold: a pid of 30 digits or a time of 1e999 is not data the model can
# carry on to the analysis and the reports (which format times as dates and sizes as counts).
MAX_INT = (1 << 63) - 1
MAX_FLOAT = 1e15  # larger than any time (seconds since 1970), duration, rate or size a snapshot carries
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain JSON-able data (tuples become lists)."""
    cls = obj.__class__
    if cls in _SCALARS:  # most values: answered before any other test
        return obj
    try:
        write = _WRITERS[cls]
    except KeyError:  # the first instance of its class
        write = _WRITERS[cls] = _writer(cls) if dataclasses.is_dataclass(cls) else None
    if write is not None:
        if cls is Frame:
            shared = getattr(_WRITING, "frames", None)
            if shared is not None:  # within snapshot_to_json: the decode shares a frame between the ranks on it
                return _shared_frame(obj, write, shared)
        return write(obj)
    if isinstance(obj, (tuple, list)):
        return [to_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


_SCALARS = frozenset((str, int, float, bool, type(None)))
# While snapshot_to_json runs in a thread: each Frame object's dict, made once and put in the document at every use
# (a thread's frames are shared by every rank on the same stack; the text written is the same); the frame is
# kept with its dict, so that its id is not reused meanwhile. `uses` counts the frames written, so that a document
# whose frames are nearly all distinct stops using the table.
_WRITING = threading.local()
_FRAMES_TRIED = 4096  # frames the table takes before it is judged: kept while a frame is met twice on average


def _shared_frame(frame: Frame, write: Any, shared: dict) -> Any:
    """A Frame's dict from the table of this write (_WRITING), made and kept there on its first use."""
    hit = shared.get(id(frame))
    if hit is not None and hit[0] is frame:
        return hit[1]
    out = write(frame)
    if len(shared) < _FRAMES_TRIED or len(shared) * 2 < _WRITING.uses:
        shared[id(frame)] = (frame, out)
    else:  # most frames met once (each rank's locals its own): the table costs more than it saves
        _WRITING.frames = None
    _WRITING.uses += 1
    return out
_WRITERS: dict = {}  # class -> its generated writer (_writer), or None for a class that is not a dataclass


def _writer(cls: Any) -> Any:
    """to_dict for one dataclass, generated once from its fields (as dataclasses writes __init__): a field
    whose type is a plain value (str, int, float, bool, None, a Literal or an Optional of them) is taken as it
    is, every other one goes through to_dict. Field names are identifiers: dataclass fields are."""
    try:
        hints = _hints(cls)
    except Exception:  # hints that do not resolve at run time (names only imported for type checking)
        hints = {}  # then every field goes through to_dict, as it always may
    items = []
    for f in dataclasses.fields(cls):
        if not f.name.isidentifier():
            raise TypeError(f"{cls.__name__}.{f.name}: not an identifier")
        items.append(f"{f.name!r}: o.{f.name}" if _plain(hints.get(f.name)) else f"{f.name!r}: _to(o.{f.name})")
    env: dict = {"_to": to_dict}
    exec(f"def write(o):\n    return {{{', '.join(items)}}}\n", env)  # from the class's own field names
    return env["write"]


def _plain(tp: Any) -> bool:
    """Whether every value of type `tp` is a JSON scalar that to_dict returns unchanged."""
    if tp in _SCALARS:
        return True
    origin = typing.get_origin(tp)
    if origin is Literal:
        return all(type(a) in _SCALARS for a in typing.get_args(tp))
    if origin is Union:
        return all(_plain(a) for a in typing.get_args(tp))
    return False


_HINTS_CACHE: dict = {}


def _hints(cls: type) -> dict:
    hints = _HINTS_CACHE.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
        _HINTS_CACHE[cls] = hints
    return hints


class _Invalid(ValueError):
    """A value that does not fit the model (and so the schema, generated from it); `path` says where."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list = []

    def where(self) -> str:
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out or "the snapshot"


_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _kind(tp: Any) -> str:
    if tp in _KINDS:
        return _KINDS[tp]
    if typing.get_origin(tp) in (tuple, Tuple):
        return "an array"
    if dataclasses.is_dataclass(tp):
        return "an object"
    return str(tp)


def _shown(value: Any) -> str:
    text = json.dumps(value)[:60] if not isinstance(value, (dict, list)) else type(value).__name__
    return "an object" if text == "dict" else "an array" if text == "list" else text


def _convert(tp: Any, value: Any, frames: dict) -> Any:
    """`value` as type `tp`, checked: the loader enforces the types the schema states (it is generated from
    these same type hints), so a wrong type is an error naming the field, never a value passed on."""
    origin = typing.get_origin(tp)
    if origin is Union:
        if value is None:
            return None
        non_none = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(non_none[0], value, frames) if len(non_none) == 1 else value
    vt = type(value)
    if tp is str or tp is bool:
        if vt is tp:
            return value
    elif tp is int:
        if vt is float:
            if not (math.isfinite(value) and abs(value) <= MAX_INT):
                raise _Invalid(f"integer {_shown(value)} is out of range (more than 64 bits)")
            if value.is_integer():  # JSON Schema's "integer" includes 1e12 and 3.0
                value, vt = int(value), int
        if vt is int:
            if not -MAX_INT <= value <= MAX_INT:
                raise _Invalid(f"integer {_shown(value)} is out of range (more than 64 bits)")
            return value
    elif tp is float:
        if vt is float or vt is int:
            if not (math.isfinite(value) and abs(value) <= MAX_FLOAT):
                raise _Invalid(f"number {_shown(value)} is out of range (finite, at most 1e15 in size)")
            return float(value)
    elif origin is Literal:
        if vt is str and value in typing.get_args(tp):
            return value
        raise _Invalid(f"{_shown(value)} is not one of {', '.join(typing.get_args(tp))}")
    elif origin in (tuple, Tuple):
        if vt is list:
            args = typing.get_args(tp)
            out = []
            if len(args) == 2 and args[1] is Ellipsis:
                item = args[0]
            elif len(value) != len(args):
                raise _Invalid(f"expected an array of {len(args)} items, got {len(value)}")
            else:
                item = None
            i = 0
            try:
                for i, v in enumerate(value):
                    out.append(_convert(item if item is not None else args[i], v, frames))
            except _Invalid as exc:
                exc.path.insert(0, i)
                raise
            return tuple(out)
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if vt is dict:
            return from_dict(tp, value, _frames=frames)
    else:
        return value
    raise _Invalid(f"expected {_kind(tp)}, got {_shown(value)}")


def _freeze(value: Any) -> Any:
    """JSON data as a hashable key: lists as tuples, objects as (key, value) tuples in their order."""
    if isinstance(value, list):
        return tuple(map(_freeze, value))
    if isinstance(value, dict):
        return tuple((k, _freeze(v)) for k, v in value.items())
    return value


T = typing.TypeVar("T")


# Integers a process or a count cannot be below, by field name wherever it occurs: a process id is positive (a pid
# of 0 or -5 would name no process, or in a command hangscope suggests, a process group); counts and sizes are
# not negative. Other integers (a rank, a time, a delta) are only bounded to 64 bits.
AT_LEAST = {"pid": 1, "tid": 1, "num_threads": 0, "ppid": 0, "tracer_pid": 0,
             "world_size": 0, "local_world_size": 0, "rss": 0, "fds_total": 0, "send_q": 0, "recv_q": 0,
             "bytes_acked": 0, "bytes_received": 0, "retransmits": 0, "slots": 0, "ranks_found": 0}


def from_dict(cls: typing.Type[T], data: dict, *, _frames: Optional[dict] = None) -> T:
    """Build a dataclass from to_dict()'s output; unknown keys (from newer versions) are ignored.

    Within one call, identical frames without locals are built once and shared: a snapshot of 100k ranks
    holds a few hundred distinct frames, so it is built faster and holds less, and each thread's interned path
    (ThreadStack.path) is derived from frames already seen. Frames are frozen, so sharing cannot be observed
    other than by `is`."""
    if not isinstance(data, dict):
        raise _Invalid(f"expected an object ({cls.__name__}), got {_shown(data)}")
    frames: dict = {} if _frames is None else _frames
    key = None
    if cls is Frame and not data.get("locals"):  # locals differ between ranks (addresses): never shared
        key = _freeze(data)
        shared = frames.get(key)
        if shared is not None:
            return shared
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            try:
                value = kwargs[f.name] = _convert(hints[f.name], data[f.name], frames)
                low = AT_LEAST.get(f.name)
                if low is not None and value.__class__ is int and value < low:
                    raise _Invalid(f"{value} is out of range (at least {low})")
            except _Invalid as exc:
                exc.path.insert(0, f.name)
                raise
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            missing = _Invalid("a required field is missing")
            missing.path.insert(0, f.name)
            raise missing
    obj = cls(**kwargs)
    if key is not None:
        frames[key] = obj
    return obj


def snapshot_to_json(snapshot: Snapshot, analysis: Optional[dict] = None, sharing: Optional[dict] = None) -> str:
    """The snapshot file format: schema header, the snapshot, the analysis results when given, and how its values
    were shared (app/report/share.py: default-deny, or raw) when given."""
    return "".join(snapshot_json_parts(snapshot, analysis, sharing))


def snapshot_json_parts(snapshot: Snapshot, analysis: Optional[dict] = None, sharing: Optional[dict] = None
                        ) -> Iterator[str]:
    """snapshot_to_json's text in the order it is written, a rank's line at a time: a file can be written from
    it without ever holding the whole text (at 12,500 nodes x 8 ranks the text is ~600 MB, and the text and its
    bytes together were over a GB beside the snapshot)."""
    doc: dict = {"schema": SCHEMA_NAME, "schema_version": SCHEMA_VERSION}
    if sharing is not None:
        doc["sharing"] = sharing
    # the snapshot is converted a line at a time as it is written (a rank's dict made, encoded and dropped), not
    # as one tree of dicts first: at 12,500 nodes x 8 ranks that tree was several GB beside the text
    doc["snapshot"] = _Model(snapshot)
    if analysis is not None:
        doc["analysis"] = analysis
    _WRITING.frames, _WRITING.uses = {}, 0
    try:
        yield from _parts(doc, 3)
    finally:
        _WRITING.frames = None


def snapshot_json_bytes(snapshot: Snapshot, analysis: Optional[dict] = None, sharing: Optional[dict] = None
                        ) -> bytes:
    """snapshot_to_json's text as UTF-8, built without the whole text beside it (a bundle keeps its files as bytes
    until they are written)."""
    out = io.BytesIO()
    for run in encode_pieces(snapshot_json_parts(snapshot, analysis, sharing)):
        out.write(run)
    return out.getvalue()  # the buffer itself, not a copy


def encode_pieces(pieces: Iterable[str], errors: str = "strict", size: int = 1 << 20) -> Iterator[bytes]:
    """Text given in pieces as UTF-8, in runs of about `size` characters (one write a run, not one a piece); the
    error handler works a code point at a time, so where the pieces are cut does not change the bytes."""
    run: List[str] = []
    held = 0
    for piece in pieces:
        run.append(piece)
        held += len(piece)
        if held >= size:
            yield "".join(run).encode("utf-8", errors)
            run, held = [], 0
    if run:
        yield "".join(run).encode("utf-8", errors)


class _Model:
    """A part of the model in a document for dumps_lines: converted by to_dict where dumps_lines reaches it (one
    level at a time above the line level, whole at it), so that the same text comes out as from to_dict's tree."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _one_level(value: Any) -> Any:
    """What to_dict makes of `value` at its top level, its parts left to convert (_Model)."""
    cls = value.__class__
    if cls in _SCALARS:
        return value
    if dataclasses.is_dataclass(cls):
        return {f.name: _Model(getattr(value, f.name)) for f in dataclasses.fields(cls)}
    if isinstance(value, (tuple, list)):
        return [_Model(x) for x in value]
    if isinstance(value, dict):
        return {str(k): _Model(v) for k, v in value.items()}
    return value


def dumps_lines(doc: Any, levels: int = 3) -> str:
    """JSON text laid out as indent=1 writes it for the outer `levels` of dicts and lists (one entry a line,
    one space of indent a level), with each entry below them on one line: a snapshot's ranks and nodes one a
    line. json.dumps with indent runs the pure-Python encoder (~5x slower than the C one: seconds at 12,500
    nodes x 8 ranks); here every line comes from the C encoder, with the same ": " and ", " separators."""
    return "".join(_parts(doc, levels))


# Characters JSON leaves raw with ensure_ascii=False that a terminal or an editor acts on: DEL and the C1 controls
# (U+009B is an 8-bit CSI), the line separators and the bidirectional controls. They occur only inside strings,
# where \uXXXX is the same value: a file `cat` shows is inert (C0 controls JSON escapes itself).
_ACTIVE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: "re.Match[str]") -> str:
    return "\\u%04x" % ord(m.group())


def inert(text: str) -> str:
    """JSON text with the characters of _ACTIVE written as \\uXXXX escapes (the same JSON value)."""
    return _ACTIVE.sub(_escape, text) if _ACTIVE.search(text) else text


def _parts(value: Any, levels: int, depth: int = 0) -> Iterator[str]:
    """dumps_lines's text, a piece at a time (below `levels`, a whole entry a piece)."""
    if value.__class__ is _Model:
        value = to_dict(value.value) if depth >= levels else _one_level(value.value)
    if depth >= levels or not isinstance(value, (dict, list)) or not value:
        yield inert(_ONE_LINE.encode(value))
        return
    pad = "\n" + " " * (depth + 1)
    if isinstance(value, dict):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            yield ("," if i else "") + pad + inert(_ONE_LINE.encode(key) if isinstance(key, str)
                                                     else f'"{_ONE_LINE.encode(key)}"') + ": "
            yield from _parts(item, levels, depth + 1)
    else:
        yield "["
        for i, item in enumerate(value):
            yield ("," if i else "") + pad
            yield from _parts(item, levels, depth + 1)
    yield "\n" + " " * depth + ("}" if isinstance(value, dict) else "]")


_ONE_LINE = json.JSONEncoder(ensure_ascii=False)


class SnapshotFormatError(ValueError):
    """A file that is not a hangscope snapshot, or of an unsupported version."""


def _bounded_int(text: str) -> Any:
    """JSON integers of more than 20 digits (a 30-digit pid, a 5000-digit number) are read as floats, never
    converted to int (int() of thousands of digits is slow, and refused past 4300 since Python 3.11): no field
    holds such a number, and the codec refuses it as out of range, naming the field."""
    return int(text) if len(text) <= 20 else float(text)


def _without_lone_surrogates(value: Any) -> Any:
    """JSON's \\udXXX escapes can make a string Python cannot encode as UTF-8 (a lone surrogate): each becomes
    U+FFFD, in keys and values, so the snapshot can be printed, exported and written again."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in value.items()}
    return value


def snapshot_from_json(text: str) -> Tuple[Snapshot, Optional[dict]]:
    """Parse and check a snapshot file's text; every way it can be wrong is a SnapshotFormatError that says
    where. Types are those of docs/snapshot.schema.json (generated from this module's type hints)."""
    try:
        doc = json.loads(text, parse_int=_bounded_int)
        if _SURROGATE_ESCAPE.search(text):
            doc = _without_lone_surrogates(doc)
    except RecursionError:
        # the C decoder refuses nesting deeper than the interpreter's recursion limit; no snapshot comes close
        raise SnapshotFormatError(f"not a hangscope snapshot: JSON nested more than {sys.getrecursionlimit()} "
                                  "levels deep") from None
    except ValueError as exc:
        raise SnapshotFormatError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA_NAME:
        raise SnapshotFormatError("not a hangscope snapshot (missing \"schema\": \"hangscope.snapshot\")")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SnapshotFormatError(f"snapshot schema version {version!r}; this hangscope reads {SCHEMA_VERSION}")
    try:
        snap = from_dict(Snapshot, doc["snapshot"])
    except _Invalid as exc:
        exc.path.insert(0, "snapshot")
        raise SnapshotFormatError(f"does not match the snapshot schema at {exc.where()}: {exc.message}") from None
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise SnapshotFormatError(f"malformed snapshot: {type(exc).__name__}: {exc}") from None
    analysis = doc.get("analysis")
    return snap, analysis if isinstance(analysis, dict) else None
