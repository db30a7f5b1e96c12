"""The worker's lines as the login side reads them: workers/protocol.py's decode, parsed by orjson first.

At 12,500 nodes x 8 ranks the login side parses ~200,000 lines a pass, and Python's json was ~17 % of a pass's
CPU (bench/scale.py, sampled with py-spy); orjson parses the same lines 2.4-2.9x faster. A line orjson refuses
goes to protocol.decode, so every line Python's json takes is still taken, with the same values: NaN and
Infinity, a number past the double range (1E400: inf), escaped lone surrogates, bytes that are not UTF-8
(replaced, as before). One difference stays, on lines no worker writes: orjson takes an integer outside the
64-bit range (below -2**63 or above 2**64 - 1) as a float where json gave an int; the decoders take only ints
where they want a number (app/decode: `type(v) is int`), so such a value reads as unknown, a bound on numbers
from a node. tests/transport/test_transport_lines.py compares both parsers on generated and hostile lines.
"""

from __future__ import annotations

from typing import Any, Dict

import orjson

from workers import protocol


def decode(line: bytes) -> Dict[str, Any]:
    """One line from a worker as a JSON object; raise protocol.ProtocolError as protocol.decode does."""
    try:
        msg = orjson.loads(line)
    except orjson.JSONDecodeError:
        return protocol.decode(line)
    if type(msg) is not dict:
        return protocol.decode(line)  # the same ProtocolError ("not a JSON object")
    return msg
