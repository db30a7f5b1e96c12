"""One bounded memo for the process-wide frame tables: the model's interned paths and bare frames
(ThreadStack.path), and decode's shared frames and native-file answers (app/decode/replies.py).

Each table is a dict shared by every snapshot the process builds, emptied as a whole when its weight (entries,
or frames for a path) would pass its limit: that bounds a TUI that runs for days and ranks whose loop counters
all differ, while a snapshot holds a few hundred distinct frames. Sharing is an optimisation only: after a
table starts over, or while it is sparse (a table whose keys do not come back is asked by one call in SPARSE),
equal values may be distinct objects, and no conclusion changes (tests/model/test_interning.py).
"""

from __future__ import annotations

from typing import Dict, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

# A memo whose keys do not come back (ranks whose locals all differ: each rank's 180 kept locals are a key no
# other rank has) is work lost twice a call: hashing a long key to miss, storing an entry nobody reads. Judged
# every JUDGE_EVERY lookups: while fewer than one in PAYS finds an entry, only one call in SPARSE uses it (and it
# keeps judging from those: where keys come back again, it is used by every call from the next judgement on).
JUDGE_EVERY = 1024
PAYS = 8
SPARSE = 16


class BoundedMemo(Generic[K, V]):
    """`get` is the dict's own bound method (the decode path calls it once per frame of every rank); `add` keeps
    the first value stored for a key (concurrent builders agree: setdefault) and counts `weight` towards the
    limit. Callers that ask `use()` first and count their hits get a memo that goes sparse while it does not
    pay (see JUDGE_EVERY)."""

    __slots__ = ("limit", "weight", "_table", "get", "hits", "asked", "every", "_turn")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.weight = 0
        self._table: Dict[K, V] = {}
        self.get = self._table.get  # the table is only ever cleared in place: this stays valid
        # for callers that ask use() first and count their hits (the others leave these alone)
        self.hits = 0  # lookups that found an entry since the last judgement
        self.asked = 0  # calls use() let through since then
        self.every = 1  # one call in `every` uses the memo (SPARSE while it does not pay)
        self._turn = 0

    def use(self) -> bool:
        """Whether this call should look its key up (and store what it builds on a miss): every call while the
        memo pays, one in SPARSE while it does not. A caller that asks counts its hits (`hits += 1`)."""
        if self.every != 1:
            self._turn += 1
            if self._turn < self.every:
                return False
            self._turn = 0
        self.asked += 1
        if self.asked >= JUDGE_EVERY:
            self.every = 1 if self.hits * PAYS >= self.asked else SPARSE
            self.hits = self.asked = 0
        return True

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
