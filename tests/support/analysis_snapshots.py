"""Snapshots built in code for the analysis tests: realistic torch frame names, one rank per line of setup."""

from __future__ import annotations

import re
from typing import Iterable, Optional, Sequence, Tuple

from app.model import (CollectOptions, ErrorInfo, Frame, LoopInfo, NodeStatus, RankSnapshot, Snapshot,
                       TcpSocket, ThreadStack)

SITE = "/opt/venv/lib/python3.11/site-packages"
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
LOGGER = f"{SITE}/torch/distributed/c10d_logger.py"
JOB = "/home/alice/job.py"
LOADER = "/home/alice/loader.py"
STEP_LOOP = LoopInfo("for", 50, 60, "for step, batch in enumerate(loader):", ("step", "batch"))

_SPEC = re.compile(r"(?P<function>\S+) \((?P<file>[^:()]+):(?P<line>\d+)\)")
_SHORT = {"distributed_c10d.py": C10D, "c10d_logger.py": LOGGER, "job.py": JOB, "loader.py": LOADER}


def frame(spec: str, **kw: object) -> Frame:
    """`all_reduce (distributed_c10d.py:2950)`: short file names of the usual files expand to full paths."""
    m = _SPEC.fullmatch(spec)
    assert m, spec
    filename = _SHORT.get(m.group("file"), m.group("file"))
    return Frame(m.group("function"), filename, int(m.group("line")), **kw)  # type: ignore[arg-type]


def stack(*specs: str) -> Tuple[Frame, ...]:
    """Frames innermost first, as py-spy prints them."""
    return tuple(frame(s) for s in specs)


ALL_REDUCE = stack("all_reduce (distributed_c10d.py:2950)", "wrapper (c10d_logger.py:81)", "train (job.py:57)",
                   "<module> (job.py:120)")
BARRIER = stack("barrier (distributed_c10d.py:4100)", "wrapper (c10d_logger.py:81)", "train (job.py:64)",
                "<module> (job.py:120)")
LOADING = stack("next_batch (loader.py:31)", "train (job.py:55)", "<module> (job.py:120)")


def in_step(frames: Tuple[Frame, ...], step: Optional[int], at: str = "train") -> Tuple[Frame, ...]:
    """The same frames with the loop over steps on `at`, and step=N there when a step is given."""
    out = []
    for f in frames:
        if f.function == at:
            it = (("step", str(step)), ("batch", "<Tensor at 0x7f00%04x>" % (step or 0))) if step is not None else ()
            f = Frame(f.function, f.filename, f.line, loops=(STEP_LOOP,), iteration=it)
        out.append(f)
    return tuple(out)


def rank(number: Optional[int], node: str, frames: Sequence[Frame] = ALL_REDUCE, *, pid: Optional[int] = None,
         world: Optional[int] = None, threads: Sequence[ThreadStack] = (), **kw: object) -> RankSnapshot:
    """A collected rank whose main thread has `frames`; pid defaults to 1000 + rank number."""
    main = ThreadStack(tid=pid or 1000 + (number or 0), name="MainThread", frames=tuple(frames), is_main=True,
                       state=str(kw.pop("thread_state", "S")))
    return RankSnapshot(node=node, pid=pid if pid is not None else 1000 + (number or 0), start_time=1,
                        rank=number, world_size=world, collected=bool(frames) or bool(threads),
                        threads=(main, *threads) if frames or not threads else tuple(threads),
                        **kw)  # type: ignore[arg-type]


def nodes_of(ranks: Iterable[RankSnapshot], **states: str) -> Tuple[NodeStatus, ...]:
    names = sorted({r.node for r in ranks} | set(states))
    return tuple(NodeStatus(n, state=states.get(n, "done")) for n in names)  # type: ignore[arg-type]


def snapshot(ranks: Sequence[RankSnapshot], nodes: Optional[Sequence[NodeStatus]] = None, *,
             taken_at: float = 1000.0, locals: bool = False) -> Snapshot:
    return Snapshot(taken_at=taken_at, options=CollectOptions(locals=locals),
                    nodes=tuple(nodes) if nodes is not None else nodes_of(ranks), ranks=tuple(ranks))


def job(n: int = 8, per_node: int = 4, frames: Tuple[Frame, ...] = ALL_REDUCE, **odd: Tuple[Frame, ...]
        ) -> Tuple[RankSnapshot, ...]:
    """n ranks, `per_node` per node (node01, node02, ...), all on `frames` except rank<N>=frames given."""
    return tuple(rank(r, f"node{r // per_node + 1:02d}", odd.get(f"rank{r}", frames), world=n) for r in range(n))


def failed(name: str, code: str, message: str = "", state: str = "failed") -> NodeStatus:
    return NodeStatus(name, state=state, error=ErrorInfo(code, message or f"{name}: {code}", hint=f"hint for {code}",
                                                         phase="connect"))  # type: ignore[arg-type]


def sock(local: str, peer: str, **kw: object) -> TcpSocket:
    return TcpSocket(local=local, peer=peer, state=str(kw.pop("state", "ESTABLISHED")), **kw)  # type: ignore[arg-type]
