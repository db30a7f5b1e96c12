"""What hangscope did to each process of a snapshot (RankSnapshot.actions, JobProcess.actions), and what it left
undone and why (RankSnapshot.notes), grouped so that ranks treated alike read as one line:
`ranks 0-6 on node[01-04]: read /proc; py-spy dump: paused ~10 ms, resumed` (issue 16.4: report exactly what
was done to each process, and never claim an effect that did not happen)."""

from __future__ import annotations

from app.analysis.fold import describe
from app.model import RankSnapshot, Snapshot

MAX_GROUPS = 12


def done_lines(snapshot: Snapshot) -> list[str]:
    """One line per group of ranks with the same actions and notes, then one per launcher or child dumped."""
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[RankSnapshot]] = {}
    for r in snapshot.ranks:
        if r.actions or r.notes:
            groups.setdefault((r.actions, r.notes), []).append(r)
    out = []
    # each group's label made once (at 100k ranks one label of a large group takes ~50 ms), used to sort and shown
    labelled = sorted(((-len(ranks), describe(ranks), key) for key, ranks in groups.items()), key=lambda g: g[:2])
    for _, label, (actions, notes) in labelled:
        text = "; ".join(actions) or "nothing"
        if notes:
            text += " (" + "; ".join(notes) + ")"
        out.append(f"{label}: {text}")
    for p in snapshot.processes:
        if p.actions:
            out.append(f"{p.kind} pid {p.pid} on {p.node}: {'; '.join(p.actions)}")
    if len(out) > MAX_GROUPS:
        out = out[:MAX_GROUPS] + [f"... {len(out) - MAX_GROUPS} more (snapshot.json has every process's)"]
    return out
