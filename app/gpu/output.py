"""Follow one test run's output as it streams in from its nodes, and turn it into a TestRun at the end.

Pure (no I/O): the runner feeds each node's `(stream, local_rank, text)` lines as they arrive. Lines starting
with `HANGSCOPE-GPUTEST ` are the test program's events (JSON, validated here: remote text), stderr lines
after a faulthandler header are the stack of a stuck rank, lines with `NCCL` go to the NCCL parser.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from app.gpu import bench, nccl
from app.gpu.model import PHASES, BenchRow, NcclNode, RankResult, TestRun

EVENT = "HANGSCOPE-GPUTEST "
LOG_LINES = 400  # lines of log kept per run
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
# errors a rank reports because *another* rank went away: the rank reporting them is a victim (torch's store
# client, when the store's rank is gone: "Failed to recv, got 0 bytes. Connection was likely closed. Did the
# remote server shutdown or crash?")
_VICTIM = re.compile(r"connection (was (likely )?)?(closed|reset)|closed by (remote )?peer|broken pipe|timed out|"
                     r"timeout|communicator was aborted|socket|failed to recv|remote server shut ?down",
                     re.IGNORECASE)


@dataclass
class RankState:
    node: str
    local_rank: int
    rank: int
    phase: str = ""
    pid: Optional[int] = None
    done: bool = False
    result: Optional[dict] = None
    backend: str = ""
    device: str = ""
    gpu_name: str = ""
    missing: tuple[int, ...] = ()
    master: str = ""  # the store it was connecting to
    err_tail: deque = field(default_factory=lambda: deque(maxlen=30))
    stacks: list[list[str]] = field(default_factory=list)  # faulthandler blocks, frames innermost first
    _in_dump: bool = False

    @property
    def started(self) -> bool:
        """Imported torch and began to rendezvous: from here on, waiting is no longer start-up time."""
        return self.phase in PHASES and PHASES.index(self.phase) >= PHASES.index("store_connect") or self.done


class RunOutput:
    """The state of one run's ranks, updated line by line."""

    def __init__(self, nodes: Sequence[str], nprocs: Sequence[int]) -> None:
        self.nodes = list(nodes)
        self.ranks: dict[tuple[str, int], RankState] = {}
        offset = 0
        for node, n in zip(nodes, nprocs):
            for lr in range(n):
                self.ranks[(node, lr)] = RankState(node, lr, offset + lr)
            offset += n
        self.world_size = offset
        self.bench_events: dict[int, dict] = {}
        self.nccl_lines: dict[str, list[str]] = {n: [] for n in nodes}
        self.agent_tail: dict[str, deque] = {n: deque(maxlen=40) for n in nodes}
        self.log: deque = deque(maxlen=LOG_LINES)
        self.progress_count = 0  # phase changes and results: what "no progress" watches

    def feed(self, node: str, lines: Sequence[Any]) -> list[RankState]:
        """Apply one batch of lines from node; returns the ranks whose phase changed."""
        changed: list[RankState] = []
        for entry in lines:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 3 and isinstance(entry[2], str)):
                continue
            stream, lr, text = entry
            lr = lr if isinstance(lr, int) and not isinstance(lr, bool) else None
            self.log.append(f"[{node}:{lr if lr is not None else 'agent'}] {text}")
            if "NCCL" in text and len(self.nccl_lines[node]) < 5000:
                self.nccl_lines[node].append(text)
            state = self.ranks.get((node, lr)) if lr is not None else None
            if state is None:
                self.agent_tail[node].append(text)
                continue
            if text.startswith(EVENT):
                if self._event(state, text[len(EVENT):]):
                    changed.append(state)
            elif stream == "err":
                self._stderr(state, text)
        return changed

    def _event(self, state: RankState, payload: str) -> bool:
        try:
            ev = json.loads(payload)
        except ValueError:
            return False
        if not isinstance(ev, dict) or not isinstance(ev.get("event"), str):
            return False
        kind = ev["event"]
        if kind == "start" and isinstance(ev.get("pid"), int):
            state.pid = ev["pid"]
        elif kind == "phase" and ev.get("phase") in PHASES:
            state.phase = ev["phase"]
            if isinstance(ev.get("master"), str):
                state.master = ev["master"][:300]
            self.progress_count += 1
            return True
        elif kind == "waiting":
            missing = ev.get("missing")
            if isinstance(missing, list):
                state.missing = tuple(r for r in missing if isinstance(r, int))[:64]
        elif kind == "backend":
            state.backend, state.device = str(ev.get("backend", ""))[:20], str(ev.get("device", ""))[:40]
            state.gpu_name = str(ev.get("gpu_name", ""))[:120]
        elif kind == "result":
            state.result = ev
            self.progress_count += 1
            return True
        elif kind == "bench" and isinstance(ev.get("size"), int):
            self.bench_events[ev["size"]] = ev
            self.progress_count += 1
        elif kind == "done":
            state.done, state.phase = True, "done"
            self.progress_count += 1
            return True
        return False

    def _stderr(self, state: RankState, text: str) -> None:
        state.err_tail.append(text)
        if _THREAD.match(text) or text.startswith("Timeout ("):
            if _THREAD.match(text):
                state.stacks.append([])
            state._in_dump = True
            return
        m = _FRAME.match(text)
        if state._in_dump and m and state.stacks:
            state.stacks[-1].append(f"{m.group(3)} ({m.group(1)}:{m.group(2)})")
        elif state._in_dump and text.strip():
            state._in_dump = False

    # -- progress --------------------------------------------------------------------------------------------

    @property
    def all_started(self) -> bool:
        return all(s.started for s in self.ranks.values())

    @property
    def all_done(self) -> bool:
        return all(s.done for s in self.ranks.values())

    def node_done(self, node: str) -> bool:
        return all(s.done for s in self.ranks.values() if s.node == node)

    def not_started(self) -> list[RankState]:
        return [s for s in self.ranks.values() if not s.started]

    # -- the end ---------------------------------------------------------------------------------------------

    def results(self, stopped: bool, node_errors: dict[str, str], blame_unstarted: bool = True
                ) -> list[RankResult]:
        """Per-rank verdicts. blame_unstarted=False: the run was stopped because another node failed, so
        ranks that had not started yet are its victims, not culprits."""
        out = []
        store_stuck = {s.rank for s in self.ranks.values() if s.phase in ("store_connect", "import", "start", "")}
        waited_for = tuple(sorted({r for s in self.ranks.values() for r in s.missing}))
        for s in self.ranks.values():
            out.append(self._rank_result(s, stopped, node_errors.get(s.node, ""), store_stuck, waited_for,
                                         blame_unstarted))
        broken = [r for r in out if r.status == "broken"]
        if broken and not any(r.culprit for r in out):
            # every failure reads like a reaction to someone else's: blame the ones that failed first
            first = broken[0]
            out = [dataclasses.replace(r, culprit=True) if r is first else r for r in out]
        return out

    def _rank_result(self, s: RankState, stopped: bool, node_error: str, store_stuck: set[int],
                     waited_for: tuple[int, ...], blame_unstarted: bool) -> RankResult:
        base = RankResult(node=s.node, rank=s.rank, local_rank=s.local_rank, status="ok", pid=s.pid, phase=s.phase,
                          device=s.device, gpu_name=s.gpu_name, waiting_for=s.missing,
                          value=_float(s.result.get("value")) if s.result else None)
        if s.done:
            return base
        if s.result is not None and s.result.get("ok") is False:
            err = str(s.result.get("error", ""))[:2000]
            phase = str(s.result.get("phase") or s.phase)[:40]
            culprit = not _VICTIM.search(err) or phase in ("import", "store_connect")
            return dataclasses.replace(base, status="broken", error=err, culprit=culprit, phase=phase)
        if not s.phase:
            if stopped and not blame_unstarted and not node_error:
                # stopped because another node failed: whatever its stderr says now (a traceback from being
                # killed while importing torch) is the stop's doing, not a fault of its own
                return dataclasses.replace(base, status="not_started", error="stopped before it started")
            own = node_error or _last_error(s.err_tail)
            return dataclasses.replace(base, status="not_started", error=own or "the rank never started",
                                       culprit=True)
        if stopped:
            missing = s.missing or waited_for
            if s.phase == "store_connect":
                why = f"could not connect to the rendezvous store at {s.master or 'the master'}"
            elif s.phase == "join" and missing:
                why = "waited for rank(s) " + ", ".join(map(str, missing[:16])) + " to join"
            elif s.phase == "join":
                why = "waited for other ranks to join"
            else:
                why = f"stuck in {s.phase}"
            # the ranks already in the world say who never joined: when they do, that is the authority (a slow
            # rank whose "joined" line had not arrived yet is not to blame); otherwise blame the stragglers
            culprit = s.rank in waited_for if waited_for else s.rank in store_stuck
            if not blame_unstarted and s.phase in ("start", "import"):
                # stopped because another node failed while this rank was still starting (importing torch takes
                # seconds on a busy node): a victim of the stop, like a rank that had not started at all
                culprit = False
            return dataclasses.replace(base, status="hung", error=why, stack=tuple(_main_stack(s.stacks)),
                                       culprit=culprit)
        why = _last_error(s.err_tail) or node_error or f"exited during {s.phase} without a result"
        return dataclasses.replace(base, status="broken", error=why, culprit=not _VICTIM.search(why))

    def bench_rows(self) -> list[BenchRow]:
        return [bench.row(ev, self.world_size) for _, ev in sorted(self.bench_events.items())
                if bench.valid_event(ev)]

    def nccl_nodes(self) -> tuple[NcclNode, ...]:
        out: list[NcclNode] = []
        for node, lines in self.nccl_lines.items():
            out.extend(nccl.parse(lines, node=node))
        return tuple(n for n in out if n.version or n.network or n.socket_devices or n.ib_devices or n.warnings
                     or n.transports)

    def agent_error(self, node: str) -> str:
        return _last_error(self.agent_tail[node])


def _float(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _last_error(lines: Sequence[str]) -> str:
    """The last line that reads like an error (a traceback's final line), else ""."""
    for text in reversed(list(lines)):
        t = text.strip()
        if not t or t.startswith(("File ", "^", "~")) or _FRAME.match(text):
            continue
        if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", t) or "rror" in t or "No module" in t:
            return t[:500]
    return ""


def _main_stack(stacks: list[list[str]]) -> list[str]:
    """faulthandler prints frames innermost first; the main thread's stack ends in `<module>`."""
    for frames in stacks:
        if frames and frames[-1].startswith("<module>"):
            return frames[:40]
    return stacks[0][:40] if stacks else []


def run_message(run: TestRun, why: str = "") -> str:
    """One sentence about a finished run, naming the culprits when there are some."""
    n = len(run.ranks)
    if run.status == "ok":
        extra = f", peak busbw {run.busbw:.3g} GB/s" if run.busbw is not None else ""
        if run.busbw is not None and run.world_size < 2:  # 2(n-1)/n = 0: nothing crosses a link
            extra = ("; no bandwidth measured: one rank's all_reduce crosses no link between GPUs (it takes 2 ranks "
                     "or more)")
        return (f"{n} rank(s) on {len(run.nodes)} node(s) OK: all_reduce sum = world size {run.world_size}, "
                f"barrier passed ({run.backend or 'backend ?'}){extra}")
    culprits = run.culprits or tuple(r for r in run.ranks if r.status != "ok")
    named = "; ".join(f"rank {r.rank} ({r.node}) {r.status.replace('_', ' ')}: {r.error}" for r in culprits[:4])
    if len(culprits) > 4:
        named += f"; and {len(culprits) - 4} more"
    others = [r for r in run.ranks if r not in culprits and r.status != "ok"]
    tail = f"; {len(others)} other rank(s) waited for {'it' if len(culprits) == 1 else 'them'}" if others else ""
    errs = "; ".join(f"{node}: {e}" for node, e in run.node_errors)
    head = f"{run.status} ({why})" if why else run.status
    return f"{head}: {named or errs}{tail}" + (f" ({errs})" if errs and named else "")
