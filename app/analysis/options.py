"""How the analysis looks at stacks: which thread, what makes two frames the same, what to fold away."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

from app.analysis.frames import Identity
from app.model import RankSnapshot, ThreadStack

ThreadSelector = Callable[[RankSnapshot], Optional[ThreadStack]]


@dataclass(frozen=True)
class AnalysisOptions:
    """`thread`: "main" (the main thread), a thread name (the first thread so named), or a function that
    picks a rank's thread. `identity`: "function+line" (function, file and line) or "function" (function and
    file: ranks at different lines of one function merge). `native`: keep native frames in paths.
    `fold_machinery`: drop importlib/threading/runpy/torch-elastic plumbing frames."""

    thread: Union[str, ThreadSelector] = "main"
    identity: Identity = "function+line"
    native: bool = True
    fold_machinery: bool = True
    stuck_samples: int = 2  # a rank is stuck when this many samples in a row show the same stack and iteration
    spinning_cpu: float = 0.5  # CPU share of one core between samples above which a stuck rank spins
    sleeping_cpu: float = 0.05  # ... and below which it sleeps


def selector(options: AnalysisOptions) -> ThreadSelector:
    """The function that picks the thread of a rank the analysis merges."""
    chosen = options.thread
    if callable(chosen):
        return chosen
    if chosen == "main":
        return _main_thread
    name = chosen

    def by_name(rank: RankSnapshot) -> Optional[ThreadStack]:
        for t in rank.threads:
            if t.name == name:
                return t
        return None

    return by_name


def _main_thread(rank: RankSnapshot) -> Optional[ThreadStack]:
    return rank.main_thread
