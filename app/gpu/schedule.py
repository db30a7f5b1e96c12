"""Node-pair (and GPU-pair) isolation as a pure state machine: which tests to run next, and what they prove.

Rounds: every unit alone first; then disjoint pairs, all run at once; then each side of a failing or slow
pair is re-paired with a unit known to be good, until every bad pair is explained as a bad unit (it fails
with good partners too) or a bad link (both ends work with others). The caller runs each round's tests (in
parallel: a unit appears once per round) and records their outcomes; `report()` gives the matrix and verdict.
A pair is slow when its bus bandwidth is below `slow_ratio` x the median of the pairs measured so far (the
median of its round, once rounds hold several pairs), or below `min_busbw` when that is given. Bandwidth is
noisy (a busy host, a congested switch), so a slow pair is measured once more before it counts against a
node or a link: a second slow result confirms it, a normal one clears it. Failed and hung pairs are not
retested.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Collection, Optional, Sequence, cast

from app.gpu.model import CellStatus, Fault, PairCell, PairReport

BAD = ("slow", "failed", "hung")
_WORST = {"hung": 3, "failed": 2, "slow": 1}


@dataclass(frozen=True)
class Outcome:
    status: str  # "ok", "failed" or "hung" as the run ended; "slow" is decided here
    busbw: Optional[float] = None
    run_id: str = ""
    detail: str = ""


class PairIsolation:
    def __init__(self, units: Sequence[str], *, slow_ratio: float = 0.5, min_busbw: Optional[float] = None,
                 all_pairs: bool = False, singles: bool = True, scope: str = "nodes",
                 max_rounds: Optional[int] = None) -> None:
        self.units = list(dict.fromkeys(units))
        self.slow_ratio = slow_ratio
        self.min_busbw = min_busbw
        self.all_pairs = all_pairs
        self.scope = scope
        self.max_rounds = max_rounds if max_rounds is not None else 3 + 2 * len(self.units)
        self.single: dict[str, PairCell] = {}
        self.cell: dict[frozenset[str], PairCell] = {}
        self.order: list[frozenset[str]] = []
        self.rounds: list[list[tuple[str, ...]]] = []
        self._round_ids: list[list[str]] = []
        self._pending: list[tuple[frozenset[str], Outcome]] = []
        self._singles_done = not singles
        self._circle: Optional[list[list[tuple[str, str]]]] = None
        self.retested: set[frozenset[str]] = set()  # slow links measured a second time

    # -- driving ---------------------------------------------------------------------------------------------

    def next_round(self) -> list[tuple[str, ...]]:
        """The tests to run now (disjoint); [] when nothing more can be learned."""
        self._close_round()
        if len(self.rounds) >= self.max_rounds:
            return []
        if not self._singles_done:
            self._singles_done = True
            return self._start([(u,) for u in self.units])
        healthy = [u for u in self.units if u not in self.single or self.single[u].status == "ok"]
        if self.all_pairs:
            if self._circle is None:
                self._circle = _circle_rounds(healthy)
            while self._circle:
                tests: list[tuple[str, ...]] = [p for p in self._circle.pop(0) if frozenset(p) not in self.cell]
                if tests:
                    return self._start(tests)
        elif not self.cell and len(healthy) >= 2:
            return self._start([(healthy[i], healthy[i + 1]) for i in range(0, len(healthy) - 1, 2)])
        return self._start(self._resolution(healthy))

    def record(self, units: Sequence[str], outcome: Outcome) -> None:
        key = frozenset(units)
        if len(key) == 1:
            (u,) = key
            status = cast(CellStatus, outcome.status if outcome.status in ("ok", "failed", "hung") else "failed")
            self.single[u] = PairCell(u, u, status, outcome.busbw, outcome.run_id, outcome.detail)
        else:
            self._pending.append((key, outcome))
        if self._round_ids and outcome.run_id:
            self._round_ids[-1].append(outcome.run_id)

    def _start(self, tests: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
        if tests:
            self.rounds.append(tests)
            self._round_ids.append([])
        return tests

    def _close_round(self) -> None:
        """Classify the round's pairs: ok pairs far below the reference median become slow."""
        if not self._pending:
            return
        # a pair measured again is compared with the others, not with its own earlier (slow) result
        ref = self.reference([o for _, o in self._pending], exclude={k for k, _ in self._pending})
        for key, o in self._pending:
            status: str = o.status if o.status in ("ok", "failed", "hung") else "failed"
            if status == "ok" and o.busbw is not None and (
                    (ref is not None and o.busbw < self.slow_ratio * ref)
                    or (self.min_busbw is not None and o.busbw < self.min_busbw)):
                status = "slow"
            a, b = sorted(key, key=self.units.index)
            self.cell[key] = PairCell(a, b, status, o.busbw, o.run_id, o.detail)  # type: ignore[arg-type]
            if key not in self.order:
                self.order.append(key)
        self._pending = []

    def reference(self, extra: Sequence[Outcome] = (), exclude: Collection[frozenset[str]] = ()) -> Optional[float]:
        values = [c.busbw for k, c in self.cell.items() if c.status in ("ok", "slow") and c.busbw and k not in exclude]
        values += [o.busbw for o in extra if o.status == "ok" and o.busbw]
        return statistics.median(values) if values else None

    # -- what the results prove ------------------------------------------------------------------------------

    def _good(self, unit: str, excluding: Optional[str] = None) -> bool:
        """Works with at least one partner other than `excluding`."""
        return any(c.status == "ok" and unit in k and excluding not in k for k, c in self.cell.items())

    def _verdict_for(self, x: str, other: str) -> str:
        """"exonerated", "convicted" or "unknown" for side x of the bad pair {x, other}."""
        if self._good(x, excluding=other):
            return "exonerated"
        for key, c in self.cell.items():
            if x in key and other not in key and c.status in BAD:
                (p,) = key - {x}
                if self._good(p, excluding=x):
                    return "convicted"
        return "unknown"

    def _resolution(self, healthy: list[str]) -> list[tuple[str, ...]]:
        needy: list[str] = []
        for c in self.cell.values():
            if c.status in BAD:
                a, b = c.a, c.b
                for x, y in ((a, b), (b, a)):
                    if self._verdict_for(x, y) == "unknown" and x not in needy:
                        needy.append(x)
        tested = {u for k in self.cell for u in k}
        needy += [u for u in healthy if u not in tested and u not in needy and len(healthy) > 1]
        busy: set[str] = set()
        tests: list[tuple[str, ...]] = []
        for key, c in self.cell.items():
            # a slow result is evidence only once it is confirmed: measure every slow pair a second time
            if c.status == "slow" and key not in self.retested and not key & busy:
                tests.append((c.a, c.b))
                busy.update(key)
                self.retested.add(key)
        for x in needy:
            if x in busy:
                continue
            partner = self._partner(x, healthy, busy)
            if partner is not None:
                tests.append((partner, x))
                busy.update((x, partner))
        return tests

    def _partner(self, x: str, healthy: list[str], busy: set[str]) -> Optional[str]:
        """A good unit first, then one not tested yet, then another suspect; never a pair already tested."""
        free = [u for u in healthy if u != x and u not in busy and frozenset((u, x)) not in self.cell]
        for rank in (lambda u: self._good(u, excluding=x), lambda u: not any(u in k for k in self.cell),
                     lambda u: True):
            for u in free:
                if rank(u):
                    return u
        return None

    def faults(self) -> tuple[list[Fault], list[str]]:
        """The faults the results name, and the bad pairs they cannot yet explain."""
        faults: list[Fault] = []
        unclear: list[str] = []
        for u in self.units:
            s = self.single.get(u)
            if s is not None and s.status != "ok":
                faults.append(Fault("node", (u,), s.status, f"{u} {s.status} on its own"  # type: ignore[arg-type]
                                    + (f": {s.detail}" if s.detail else "")))
        convicted: dict[str, list[PairCell]] = {}
        for key in self.order:
            c = self.cell[key]
            if c.status not in BAD:
                continue
            va, vb = self._verdict_for(c.a, c.b), self._verdict_for(c.b, c.a)
            if va == vb == "exonerated":
                faults.append(Fault("link", (c.a, c.b), c.status, self._link_evidence(c)))  # type: ignore[arg-type]
            elif "convicted" in (va, vb):
                for x, v in ((c.a, va), (c.b, vb)):
                    if v == "convicted":
                        convicted.setdefault(x, [])
            else:
                unclear.append(f"{c.a}-{c.b} {c.status}")
        for x in convicted:
            bad = [c for k, c in self.cell.items() if x in k and c.status in BAD]
            how = max((c.status for c in bad), key=lambda s: _WORST[s])
            faults.append(Fault("node", (x,), how, self._node_evidence(x, bad)))  # type: ignore[arg-type]
        return faults, unclear

    def _describe(self, c: PairCell) -> str:
        bw = f" {c.busbw:.3g} GB/s" if c.busbw is not None and c.status in ("ok", "slow") else ""
        return f"{c.a}-{c.b} {c.status}{bw}"

    def _node_evidence(self, x: str, bad: list[PairCell]) -> str:
        ok = [c for k, c in self.cell.items() if x in k and c.status == "ok"]
        text = "every pair with " + x if not ok else "pairs with " + x
        text += " " + ("fails" if any(c.status != "slow" for c in bad) else "is slow") + ": "
        text += ", ".join(self._describe(c) for c in bad)
        ref = self.reference()
        if any(c.status == "slow" for c in bad) and ref:
            text += f" (median {ref:.3g} GB/s; slow below {self.slow_ratio:.0%})"
        return text

    def _link_evidence(self, c: PairCell) -> str:
        def partner(x: str, y: str) -> str:
            for k, cc in self.cell.items():
                if x in k and y not in k and cc.status == "ok":
                    return self._describe(cc)
            return ""

        again = " (again when retested)" if c.status == "slow" and frozenset((c.a, c.b)) in self.retested else ""
        return (f"{self._describe(c)}{again}, but {c.a} works with others ({partner(c.a, c.b)}) and {c.b} too "
                f"({partner(c.b, c.a)})")

    def report(self) -> PairReport:
        self._close_round()
        faults, unclear = self.faults()
        cells = [self.single[u] for u in self.units if u in self.single] + [self.cell[k] for k in self.order]
        n = len(self.units)
        untested = n * (n - 1) // 2 - len(self.cell)
        return PairReport(scope=self.scope, units=tuple(self.units), cells=tuple(cells), faults=tuple(faults),
                          verdict=verdict(self.scope, faults, unclear, cells, untested, self.reference()),
                          reference_busbw=self.reference(), slow_ratio=self.slow_ratio,
                          rounds=tuple(tuple(r) for r in self._round_ids), untested_links=untested,
                          inconclusive=tuple(unclear))


def verdict(scope: str, faults: Sequence[Fault], unclear: Sequence[str], cells: Sequence[PairCell],
            untested: int, ref: Optional[float]) -> str:
    what = "GPU" if scope != "nodes" else "node"
    parts = []
    for f in faults:
        if f.kind == "link":
            parts.append(f"the link {f.units[0]}<->{f.units[1]} is {_how(f.how)}: {f.evidence}")
        elif "on its own" in f.evidence:
            parts.append(f"{what} {f.units[0]} is broken: {f.evidence}")
        else:
            parts.append(f"{what} {f.units[0]}'s link is {_how(f.how)}: {f.evidence}")
    for u in unclear:
        parts.append(f"{u}: cannot tell which end is at fault (no known-good {what} left to pair with)")
    if not parts:
        pairs = [c for c in cells if c.a != c.b]
        bws = [c.busbw for c in pairs if c.busbw]
        span = f" (busbw {min(bws):.3g}-{max(bws):.3g} GB/s)" if bws else ""
        if not pairs and not untested:
            parts.append(f"nothing tested: a pair takes two {what}s, and fewer were there to pair")
        else:
            parts.append(f"no fault found: {len(pairs)} pair(s) ok{span}")
        if untested:
            parts.append(f"{untested} pair(s) not tested (all-pairs mode tests every link)")
    prefix = "" if scope == "nodes" else f"{scope}: "
    return prefix + "; ".join(parts)


def _how(how: str) -> str:
    return {"slow": "slow", "failed": "broken", "hung": "broken (hangs)"}.get(how, how)


def _circle_rounds(units: list[str]) -> list[list[tuple[str, str]]]:
    """Round-robin (circle method): every pair exactly once, each round disjoint."""
    ring: list[Optional[str]] = list(units) + ([None] if len(units) % 2 else [])
    n = len(ring)
    rounds = []
    for _ in range(n - 1):
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1]] + ring[1:-1]
    return rounds


