"""One bounded memo for the process-wide frame tables: the model's interned paths and bare frames
(ThreadStack.path), and decode's shared frames and native-file answers (app/decode/replies.py).

Each table is a dict shared by every snapshot the process builds, emptied as a whole when its weight (entries,
or frames for a path) would pass its limit: that bounds a TUI that runs for days and ranks whose loop counters
all differ, while a snapshot holds a few hundred distinct frames. Sharing is an optimisation only: after a
table starts over, equal values may be distinct objects, and no conclusion changes
(tests/model/test_interning.py).
"""

from __future__ import annotations

from typing import Dict, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """`get` is the dict's own bound method (the decode path calls it once per frame of every rank); `add` keeps
    the first value stored for a key (concurrent builders agree: setdefault) and counts `weight` towards the
    limit."""

    __slots__ = ("limit", "weight", "_table", "get")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.weight = 0
        self._table: Dict[K, V] = {}
        self.get = self._table.get  # the table is only ever cleared in place: this stays valid

    def add(self, key: K, value: V, weight: int = 1) -> V:
        # one lookup of the key when there is room (a tuple's hash is not cached: a thread's ~180 kept locals
        # were hashed three times a rank, app/decode/replies.py)
        table = self._table
        if self.weight + weight > self.limit:
            held = table.get(key)
            if held is not None:
                return held
            self.clear()
        got = table.setdefault(key, value)
        if got is value:
            self.weight += weight
        return got

    def clear(self) -> None:
        self._table.clear()
        self.weight = 0

    def __len__(self) -> int:
        return len(self._table)
