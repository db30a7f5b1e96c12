"""The wait model applied to the suspects: what each suspect rank's main thread is blocked in, and who can
release it, as "blocked" facts for the wait graph and the headline.

A suspect is a rank another fact singles out (its stack, its iteration, its sequence numbers, its state). Its
main thread's wait (blocking.py) and the chain of who can release it (release.py) are read once each, for at
most MAX_SUSPECTS ranks. A wait that names a mechanism other than the collective the job waits in (a future, a
socket, a child, a lock, a debugger's prompt...) is a fact of its own: it says why the rank is not where the
others are. When every rank is at one place, the dominant class's wait is read from one of its ranks: all of
them blocked in the same store key or pipe is an answer too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from app.analysis.blocking import Motion, ThreadWait
from app.analysis.facts import Confidence, Evidence, Fact, ranks_who
from app.analysis.fold import RankKey
from app.analysis.release import Context, Link, chain
from app.analysis.tree import StackClass
from app.model import JobProcess, RankSnapshot, ThreadStack

MAX_SUSPECTS = 8
# Waits that say nothing beyond where the others are: the job's own collectives and p2p calls (the stack facts
# say those), autograd's engine (DDP's all_reduce), a thread running (the progress facts say how it moves)
_NOT_A_CAUSE = frozenset({"collective", "p2p"})


@dataclass(frozen=True)
class WaitEvidence(Evidence):
    """A rank's main thread blocked in an operation, and the chain of who can release it, to the root."""

    rank: RankSnapshot
    links: Tuple[Link, ...]
    odd: bool  # the stacks single this rank out
    whole: bool = False  # about a whole class at one place (every rank waits the same way)
    size: int = 1  # the class's size when whole

    @property
    def wait(self) -> ThreadWait:
        return self.links[0].wait


def informative(w: ThreadWait) -> bool:
    """Whether a wait names a cause beyond the job's own collectives."""
    if w.state in ("stopped", "frozen", "traced", "exited", "disk"):
        return False  # the state facts say those
    if w.resource in _NOT_A_CAUSE or w.operation == "autograd backward":
        return False
    if w.state == "running":
        return False
    return w.known or w.state == "spinning"


def _ends_nowhere(links: Sequence[Link]) -> bool:
    """The chain ends in nobody who can release it, something outside the job, a person, or a held process."""
    last = links[-1]
    if last.release.nobody:
        return True
    first = last.release.parties[0] if last.release.parties else None
    return first is not None and (first.kind in ("host", "person", "itself") or bool(first.state))


def suspect_facts(ranks: Sequence[RankSnapshot], suspects: Sequence[RankKey], odd: Sequence[RankKey],
                  processes: Sequence[JobProcess], classes: Sequence[StackClass],
                  motion: Callable[[RankSnapshot, ThreadStack], Optional[Motion]],
                  by_key: Dict[RankKey, RankSnapshot], rank_at: Dict[str, RankSnapshot],
                  node_of: Dict[str, str], said: Sequence[RankKey] = ()) -> Tuple[List[Fact],
                                                                               Dict[RankKey, Tuple[Link, ...]]]:
    """"blocked" facts for the suspects (and, with none, the dominant class), and every suspect's chain of
    waits (for the headline), by rank. `said`: ranks whose thread a more specific fact already explains (a lock
    wait, the GIL held, a native call, a full pipe): their chain is kept for the headline, no fact repeats it."""
    chains: Dict[RankKey, Tuple[Link, ...]] = {}
    out: List[Fact] = []
    seen = set()
    odd_set = set(odd)
    wanted = [k for k in suspects if not (k in seen or seen.add(k))][:MAX_SUSPECTS]  # type: ignore[func-returns-value]
    whole = False
    if not wanted and classes:
        wanted, whole = list(classes[0].ranks[:1]), True
    for key in wanted:
        r = by_key.get(key)
        t = r.main_thread if r is not None else None
        if r is None or t is None or not t.frames and not t.syscall:
            continue
        ctx = Context(r, processes, rank_at, node_of, lambda th, r=r: motion(r, th),  # type: ignore[misc]
                      ranks=by_key)
        links = chain(t, ctx)
        if not links:
            continue
        chains[key] = links
        if not informative(links[0].wait) or key in said:
            continue
        size = classes[0].size if whole else 1
        conf: Confidence = "high" if (key in odd_set and (_ends_nowhere(links) or links[0].release.parties)) \
            else "medium"
        if whole:
            who = ranks_who(classes[0].ranks, classes[0].numbers)
            conf = "medium"
        else:
            who = ranks_who((key,), (r.rank,))
        out.append(Fact("blocked", who, conf, WaitEvidence(r, links, key in odd_set, whole, size)))
    return out, chains
