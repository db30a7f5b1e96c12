"""Folded labels for sets of ranks and nodes: `ranks 0-6,8-15 on node[01-04]`, `pid 4242 on node02`.

Integers are folded here (ClusterShell's RangeSet parses every member as a string and took 0.3 s for 100k
ranks, a third of the analysis budget); node names use ClusterShell's NodeSet except for the common shape
`prefix` + digits of one width, folded here the same way NodeSet does (tests compare the two).
"""

from __future__ import annotations

import re
from itertools import repeat
from operator import attrgetter, is_, itemgetter
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, cast

from app.model import RankKey, RankSnapshot, rank_key


_rank_of = attrgetter("rank")
_first = itemgetter(0)
_node_of = attrgetter("node")
_pid_of = attrgetter("pid")


# A folded list shows at most this many ranges, then says how many members it leaves out: at thousands of nodes,
# scattered failures or an iteration split over every third rank would otherwise fold into lists of thousands
# (1,093 lines of --print at 5 % failed nodes, issue 27). The snapshot file keeps every rank and node.
MAX_PARTS = 16


def fold_ints(values: Iterable[int], width: int = 0, limit: Optional[int] = MAX_PARTS) -> str:
    """Distinct integers as ranges, ascending: [0,1,2,5] -> "0-2,5"; `width` zero-pads like NodeSet. Past `limit`
    ranges (None: no limit), the first ones and "and N more": "0-2,5,7 and 1,200 more"."""
    text, more = fold_runs(values, width, limit)
    return f"{text} and {more:,} more" if more else text


def fold_runs(values: Iterable[int], width: int = 0, limit: Optional[int] = MAX_PARTS) -> Tuple[str, int]:
    """fold_ints()'s ranges, and how many of the values the ranges past `limit` hold (left out of the text)."""
    ordered = sorted(set(values))
    n = len(ordered)
    parts: List[str] = []
    # Each run is found from its first value by galloping (a slice is one run when its ends are as far apart as
    # its length), and only the first `limit` runs are looked for: the rest are counted, not found. So 100k ranks
    # in a few runs cost a few hundred comparisons, and 100k ranks split over every third rank (33k runs: an
    # iteration group) cost 16 runs' worth, not 33k (26 labels of 16k such ranks were a third of the analysis at
    # 2,000 nodes, issue 27).
    a = 0
    while a < n and (limit is None or len(parts) < limit):
        first = ordered[a]
        step, b = 1, a + 1  # ordered[a:b] is a run
        while b + step <= n and ordered[b + step - 1] - first == b + step - 1 - a:
            b += step
            step += step
        while step > 1:  # the run ends within ordered[b:b + step]: halve the step
            step //= 2
            if b + step <= n and ordered[b + step - 1] - first == b + step - 1 - a:
                b += step
        parts.append(_span(first, ordered[b - 1], width))
        a = b
    return ",".join(parts), n - a


def _span(a: int, b: int, width: int) -> str:
    return f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}"


# The shape folded without NodeSet: a prefix with no digit (NodeSet would fold digits there too) and one run
# of digits at the end.
_SIMPLE_NODE = re.compile(r"([A-Za-z_][A-Za-z_.-]*)(\d+)\Z")


_NODES_CACHE: Dict[frozenset, str] = {}  # labels repeat (a class, its findings, its tree nodes)


def fold_nodes(names: Iterable[str]) -> str:
    """Node names folded into a NodeSet string: node01..node04 -> "node[01-04]"."""
    distinct_set = frozenset(names)
    if len(distinct_set) <= 1:
        return next(iter(distinct_set), "")
    cached = _NODES_CACHE.get(distinct_set)
    if cached is None:
        if len(_NODES_CACHE) > 256:
            _NODES_CACHE.clear()
        cached = _NODES_CACHE[distinct_set] = _fold_nodes(sorted(distinct_set))
    return cached


MAX_NODESET_NAMES = 256  # names given to NodeSet (names of no one shape) before "and N more"


def _fold_nodes(distinct: List[str]) -> str:
    folded = _fold_simple(distinct)
    if folded is not None:
        return folded
    more = max(0, len(distinct) - MAX_NODESET_NAMES)
    tail = f" and {more:,} more" if more else ""
    distinct = distinct[:MAX_NODESET_NAMES]
    try:
        from ClusterShell.NodeSet import NodeSet, NodeSetException

        return str(NodeSet.fromlist(distinct)) + tail
    except (NodeSetException, ValueError, TypeError):
        # A name NodeSet cannot parse (brackets, commas): list the names as they are.
        return ",".join(distinct[:MAX_PARTS]) + (f" and {len(distinct) - MAX_PARTS + more:,} more"
                                                   if len(distinct) > MAX_PARTS else tail)


def _fold_simple(names: Sequence[str]) -> Optional[str]:
    prefix: Optional[str] = None
    widths = set()
    padded = False
    numbers: List[int] = []
    for name in names:
        m = _SIMPLE_NODE.match(name)
        if m is None:
            return None
        p, digits = m.group(1), m.group(2)
        if prefix is None:
            prefix = p
        elif p != prefix:
            return None
        widths.add(len(digits))
        padded = padded or (len(digits) > 1 and digits[0] == "0")
        numbers.append(int(digits))
    assert prefix is not None
    if not padded:
        text, more = fold_runs(numbers)
    elif len(widths) == 1:
        # One width for all: padding to it reproduces each name exactly, as NodeSet prints it.
        text, more = fold_runs(numbers, widths.pop())
    else:
        return None  # mixed padding (node1, node01): NodeSet's rules
    return f"{prefix}[{text}]" + (f" and {more:,} more" if more else "")


def describe(ranks: Sequence[RankSnapshot]) -> str:
    """A folded label for some ranks: `ranks 0-6,8-15 on node[01-04]`, `pids 11,12 on node02`."""
    return describe_keys(keys_of(ranks), tuple(map(_rank_of, ranks)))


def describe_keys(keys: Sequence[RankKey], numbers: Sequence[Optional[int]]) -> str:
    """describe() from RankKeys and their rank numbers (None where RANK is unknown), in parallel."""
    if not keys:
        return "no ranks"
    return f"{_rank_part(keys, numbers)} on {fold_nodes(map(_first, keys))}"


def label_parts(keys: Sequence[RankKey], numbers: Sequence[Optional[int]]) -> Tuple[str, str]:
    """(`ranks 0-6,8-15`, `node[01-04]`): the two halves of a label, computed once and kept."""
    if not keys:
        return "no ranks", ""
    return _rank_part(keys, numbers), fold_nodes(map(_first, keys))


def short_keys(keys: Sequence[RankKey], numbers: Sequence[Optional[int]]) -> str:
    """The rank part of a label without nodes, for sentences: `rank 5`, `ranks 0-3`, `pid 4242`."""
    return brief(_rank_part(keys, numbers), len(keys)) if keys else "no ranks"


def short(ranks: Sequence[RankSnapshot]) -> str:
    return short_keys(keys_of(ranks), tuple(map(_rank_of, ranks)))


def brief(who: str, n: int, limit: int = 48) -> str:
    """`who` for a sentence: as is when short, else `100 ranks (996,1993,2990,...)`."""
    if len(who) <= limit:
        return who
    head = who.split(" ", 1)[-1][: limit - 20].rsplit(",", 1)[0]
    return f"{n} {'processes' if who.startswith('pid') else 'ranks'} ({head},...)"


def _rank_part(keys: Sequence[RankKey], numbers: Sequence[Optional[int]]) -> str:
    distinct = set(numbers)
    unnumbered = None in distinct
    distinct.discard(None)
    known = [n for n in numbers if n is not None] if unnumbered else numbers
    text = f"{'rank' if len(distinct) == 1 else 'ranks'} {fold_ints(cast(Set[int], distinct))}" if known else ""
    if len(known) == len(keys):
        if len(distinct) < len(known):
            # two jobs (or a restarted one) in the same snapshot reuse rank numbers
            text += f" ({len(known)} processes: rank numbers repeat)"
        return text
    pids = [k[1] for k, n in zip(keys, numbers) if n is None]
    pid_text = f"{'pid' if len(pids) == 1 else 'pids'} {fold_ints(pids)}"
    return f"{text} and {pid_text}" if known else pid_text


def count_phrase(n: int, noun: str = "rank") -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def rank_lookup(ranks: Iterable[RankSnapshot]) -> Dict[RankKey, RankSnapshot]:
    """RankKey -> RankSnapshot for the ranks of a snapshot."""
    return {rank_key(r): r for r in ranks}


def keys_of(ranks: Iterable[RankSnapshot]) -> Tuple[RankKey, ...]:
    return tuple(zip(map(_node_of, ranks), map(_pid_of, ranks)))


def sort_ranks(ranks: Iterable[RankSnapshot]) -> List[RankSnapshot]:
    """Ranks by rank number (numberless last), then node and pid: the order every list is shown in."""
    ranks = list(ranks)
    numbers = list(map(_rank_of, ranks))
    if None not in numbers:
        if len(set(numbers)) == len(numbers):
            return sorted(ranks, key=_rank_of)  # unique numbers: an int key, the cheapest sort
        return sorted(ranks, key=_numbered_key)
    return sorted(ranks, key=sort_key)


def sort_key(r: RankSnapshot) -> Tuple[bool, int, str, int]:
    return (r.rank is None, r.rank if r.rank is not None else 0, r.node, r.pid)


_numbered_key = attrgetter("rank", "node", "pid")

# Ranks as positions into columns.Facts: their numbers and keys are read once, when the columns are, and a
# set of ranks is ordered and named from the columns without reading a rank again (at 100k ranks the rank
# objects are scattered among their frames: every pass over them costs a cache miss per rank, ~40 ms).


def position_key(numbers: Sequence[Optional[int]], keys: Sequence[RankKey], i: int) -> Tuple[bool, int, str, int]:
    """sort_key() of the rank at position i of the columns."""
    number = numbers[i]
    node, pid = keys[i]
    return (number is None, number if number is not None else 0, node, pid)


def sort_positions(at: Sequence[int], numbers: Sequence[Optional[int]], keys: Sequence[RankKey]) -> List[int]:
    """The positions `at` in the order sort_ranks() gives their ranks (ties included: both sorts are stable)."""
    mine = list(map(numbers.__getitem__, at))
    if any(map(is_, mine, repeat(None))):  # identity only: reads no int object
        return sorted(at, key=lambda i: position_key(numbers, keys, i))
    if len(set(mine)) == len(mine):
        return sorted(at, key=cast(Callable[[int], int], numbers.__getitem__))
    return sorted(at, key=lambda i: (numbers[i], keys[i]))  # _numbered_key


def lowest_position(at: Sequence[int], numbers: Sequence[Optional[int]], keys: Sequence[RankKey]) -> int:
    """The position in `at` of the lowest rank, the first of equals (C-level keys when every rank has a number)."""
    mine = list(map(numbers.__getitem__, at))
    if not any(map(is_, mine, repeat(None))):
        low = min(mine)  # type: ignore[type-var]
        if mine.count(low) == 1:
            return at[mine.index(low)]
    order = [position_key(numbers, keys, i) for i in at]
    return at[order.index(min(order))]
