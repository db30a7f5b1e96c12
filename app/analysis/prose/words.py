"""Words the text layer shares: who a fact is about, where a class of ranks is, counts and plurals.

Every remote string passes through `clean` before it is part of a sentence.
"""

from __future__ import annotations

from typing import Optional, Sequence

from app.analysis.facts import Who
from app.analysis.fold import brief, describe_keys, fold_ints, fold_nodes, short_keys
from app.analysis.frames import clean, focus_frame, named, path_collective
from app.analysis.tree import StackClass
from app.model import Frame

__all__ = ["clean", "named", "who_short", "who_label", "nodes_text", "where", "plural", "count", "brief",
           "is_are", "one"]


def one(who: Who) -> bool:
    """Whether a subject is a single rank or process."""
    if who.keys:
        return len(who.keys) == 1
    return len(who.numbers) == 1


def who_short(who: Who, limit: int = 48) -> str:
    """`rank 5`, `ranks 0-3`, `pid 4242`, `ranks 6-7` (not found), a node's name for a host."""
    if who.keys:
        numbers = who.numbers if len(who.numbers) == len(who.keys) else (None,) * len(who.keys)
        return brief(short_keys(who.keys, numbers), len(who.keys), limit)
    if who.numbers:
        nums = [n for n in who.numbers if n is not None]
        return f"{'rank' if len(nums) == 1 else 'ranks'} {fold_ints(nums)}"
    if who.pid is not None:
        return f"pid {who.pid}"
    if who.nodes:
        return fold_nodes(who.nodes)
    if who.addresses:
        return ", ".join(clean(a, 60) for a in who.addresses[:4])
    return "no ranks"


def who_label(who: Who) -> str:
    """`ranks 0-6,8-15 on node[01-04]`, or for ranks not found `ranks 6-7` (their nodes when known)."""
    if who.keys:
        numbers = who.numbers if len(who.numbers) == len(who.keys) else (None,) * len(who.keys)
        return describe_keys(who.keys, numbers)
    if who.numbers:
        return who_short(who)
    return ""


def nodes_text(who: Who) -> str:
    return fold_nodes(who.nodes) if who.nodes else ""


def where(c: StackClass) -> str:
    """`in `all_reduce` (distributed_c10d.py:2950)` or `in `next_batch` (loader.py:31)`."""
    collective, frame = path_collective(c.frames)
    if frame is None:
        frame = focus_frame(c.frames)
    return f"in {named(frame)}" if frame is not None else "in no frame"


def plural(n: int, word: str, words: Optional[str] = None) -> str:
    return word if n == 1 else (words or word + "s")


def count(n: int, noun: str = "rank") -> str:
    return f"{n} {plural(n, noun)}"


def is_are(n: int) -> str:
    return "is" if n == 1 else "are"


def frame_place(f: Frame) -> str:
    return named(f)


def frames_text(frames: Sequence[Frame]) -> str:
    return ", ".join(named(f) for f in frames)
