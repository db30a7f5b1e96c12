"""The login side reads a worker's line as workers/protocol.py's decode does (Python's json), though orjson parses
it first (app/transport/lines.py): the same lines taken, the same lines refused, the same values with the same
types, on lines a worker writes and on hostile ones (a node's output is remote text)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.transport import lines
from workers import protocol

I64_MIN, U64_MAX = -(1 << 63), (1 << 64) - 1


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types (1 is not 1.0 nor True), -0.0 is not 0.0, NaN is NaN, key order counts."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def outcome(decode: Any, line: bytes) -> tuple[str, Any]:
    try:
        return "ok", decode(line)
    except protocol.ProtocolError:
        return "refused", None


def check(line: bytes) -> None:
    fast, slow = outcome(lines.decode, line), outcome(protocol.decode, line)
    assert fast[0] == slow[0], (line[:300], fast, slow)
    assert same(fast[1], slow[1]), (line[:300], fast[1], slow[1])


scalars = (st.none() | st.booleans() | st.integers(I64_MIN, U64_MAX)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.text(max_size=12), inner, max_size=5), max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(doc=st.dictionaries(st.text(max_size=12), values, max_size=6), ascii_only=st.booleans())
def test_every_line_a_worker_writes_reads_the_same(doc: dict, ascii_only: bool) -> None:
    check(json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


@settings(max_examples=150, deadline=None)
@given(doc=st.dictionaries(st.text(max_size=8), values, max_size=4), data=st.data())
def test_a_damaged_line_is_refused_or_read_the_same(doc: dict, data: st.DataObject) -> None:
    line = bytearray(json.dumps(doc).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(line)))
        line[at:at + data.draw(st.integers(0, 3))] = data.draw(st.binary(max_size=3))
    fast, slow = outcome(lines.decode, bytes(line)), outcome(protocol.decode, bytes(line))
    assert fast[0] == slow[0], (bytes(line), fast, slow)
    if not same(fast[1], slow[1]):  # the one documented difference: an int past 64 bits (a damaged number)
        assert big_ints_only_differ(fast[1], slow[1]), (bytes(line), fast[1], slow[1])


def big_ints_only_differ(fast: Any, slow: Any) -> bool:
    if type(slow) is int and not I64_MIN <= slow <= U64_MAX:
        return type(fast) is float and fast == float(slow)
    if type(fast) is not type(slow):
        return False
    if isinstance(slow, list):
        return len(fast) == len(slow) and all(big_ints_only_differ(x, y) for x, y in zip(fast, slow))
    if isinstance(slow, dict):
        return list(fast) == list(slow) and all(big_ints_only_differ(fast[k], slow[k]) for k in slow)
    return same(fast, slow)


@pytest.mark.parametrize("line", [
    b'{"v": NaN}', b'{"v": [Infinity, -Infinity]}',  # Python's json writes these for float nan/inf
    b'{"v": 1E400}',  # a float past the double range: inf
    b'{"v": "\\ud800"}', b'{"v": "\\udc00x"}',  # an escaped lone surrogate (json.dumps writes one for such a str)
    b'{"v": "\xff\xfe"}', b'{"v": "\xed\xa0\x80"}',  # not UTF-8: replaced, as before
    b'{"a": 1, "a": 2}', b'  {"v": -0} \n', b'{"v": -0.0}', b'{"v": 1e-400}', b'{"v": 9223372036854775808}',
])
def test_what_orjson_refuses_or_reads_differently_is_read_as_python_s_json_reads_it(line: bytes) -> None:
    check(line)


@pytest.mark.parametrize("line", [b"", b"  ", b"[1, 2]", b'"text"', b"3", b"null", b"{", b'{"a": 1} x',
                                  b"\xef\xbb\xbf{}", b'{"a": 1}\x00', b"{'a': 1}"])
def test_what_is_no_json_object_is_refused_by_both(line: bytes) -> None:
    assert outcome(lines.decode, line)[0] == outcome(protocol.decode, line)[0] == "refused"
    with pytest.raises(protocol.ProtocolError, match="not"):
        lines.decode(line)


def test_an_integer_past_64_bits_reads_as_no_integer() -> None:
    """The documented difference: json gives the int, orjson a float, which every decoder reads as unknown."""
    from app.decode.replies import _int

    msg = lines.decode(b'{"pid": 18446744073709551616, "rank": 3}')
    assert _int(msg["pid"]) is None and _int(msg["rank"]) == 3
