"""The short plain-text summary the CLI prints in headless mode: verdict, findings, classes, node failures.

Plain text only (no markup, no colour); every line passes through `clean`, so remote text cannot emit
escape sequences to the user's terminal.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from typing import Dict, List, Sequence, Set, Tuple

from app.analysis import Analysis
from app.analysis.findings import Finding
from app.analysis.fold import describe, fold_nodes
from app.analysis.frames import clean, frame_text, is_library
from app.analysis.prose.gpu import evidence_lines
from app.analysis.done import done_lines
from app.analysis.output import age_text, blamed_ranks
from app.analysis.output import blocks as output_blocks
from app.analysis.processes import skew_line, tree_lines
from app.analysis.progress import behind_summary, stuck_summary
from app.analysis.prose.graph import graph_lines
from app.analysis.prose.graph import shown as shown_graphs
from app.model import Frame, RankKey, RankSnapshot, Snapshot, rank_key

MAX_FINDINGS = 12
MAX_CLASSES = 10
FRAMES_SHOWN = 3


QUOTE = "    | "  # what each line of a rank's own error output is printed behind


def summary_text(snapshot: Snapshot, analysis: Analysis, width: int = 100) -> str:
    width = max(width, 40)
    out: List[str] = []
    out += _wrap(f"hangscope: {analysis.verdict}", width, "  ")
    out += waits_text(analysis, width)
    if analysis.findings:
        out += ["", "Findings, most likely culprit first:"]
        slurm = _slurm_ids(snapshot, {f.ranks[0] for f in analysis.findings[:MAX_FINDINGS] if len(f.ranks) == 1})
        for i, f in enumerate(analysis.findings[:MAX_FINDINGS], 1):
            out += _finding(i, f, width)
            if len(f.ranks) == 1 and f.ranks[0] in slurm:  # a SLURM user finds the rank by its task ids
                out += _wrap(slurm[f.ranks[0]], width, "      ", first="      ")
        if len(analysis.findings) > MAX_FINDINGS:
            out.append(f"  ... {len(analysis.findings) - MAX_FINDINGS} more findings in the snapshot file")
    if analysis.classes:
        out += ["", f"Stacks: {analysis.ranks_with_stacks} of {analysis.ranks_total} ranks in "
                    f"{len(analysis.classes)} group{'s' if len(analysis.classes) != 1 else ''} (largest first):"]
        splits = {s.class_index: s for s in analysis.iteration_splits}
        for c in analysis.classes[:MAX_CLASSES]:
            out += _wrap(f"{c.size:>6}  {c.label}", width, " " * 8)
            frames = _distinctive(analysis.tree.distinctive(c.index))
            if frames:
                out += _wrap(" <- ".join(frames), width, " " * 8, first=" " * 8)
            split = splits.get(c.index)
            if split is not None and (split.split or split.locals_missing):
                out += _wrap(f"iterations: {split.text(snapshot.options.locals)}", width, " " * 10, first=" " * 8)
        if len(analysis.classes) > MAX_CLASSES:
            out.append(f"  ... {len(analysis.classes) - MAX_CLASSES} more groups")
    procs = tree_lines(snapshot)
    if procs:  # the jobs' launchers and ranks' children, where they are in the job (never counted as ranks)
        out += ["", "Processes of the job (launchers, ranks, their children):"]
        out += ["  " + line for line in procs]
    written = output_blocks(snapshot, blamed_ranks(analysis.culprits))
    if written:  # what ranks wrote of an error where their node could read it back (redacted there)
        out += ["", "Recent error output (read on the nodes, redacted):"]
        for b in written:
            age = age_text(b.age)
            out += _wrap(f"{b.label}, {b.source}{', ' + age if age else ''}{' (blamed)' if b.blamed else ''}:",
                         width, "    ", first="  ")
            # every line behind a gutter: a line of the rank's own text can never pass for one of hangscope's
            # (a message with newlines in it that reads "hangscope: all ranks healthy", or a forged block header)
            out += [QUOTE + line for line in b.text.splitlines()[:40]]
    skew = skew_line(snapshot)
    if skew:
        out += [""] + _wrap(skew, width, "    ")
    done = done_lines(snapshot)
    if done:  # what hangscope did to each process (tools run, paused, resumed, read), and what it left undone
        out += ["", "What hangscope did to the processes:"]
        for line in done:
            out += _wrap(line, width, "    ", first="  ")
    if analysis.flight is not None:  # PyTorch's Flight Recorder: one line when the job does not use it
        flight = analysis.flight
        out += [""] + _wrap(flight.line + (":" if flight.rows else ""), width, "  ")
        for row in flight.rows:
            out += _wrap(f"{row.label}: {row.text}", width, "      ", first="  ")
    if analysis.progress:
        moving = sum(1 for p in analysis.progress if p.status == "progressing")
        line = "; ".join(part for part in (stuck_summary(analysis.progress), behind_summary(analysis.progress))
                         if part)
        out += ["", "Progress over samples:"]
        out += _wrap(f"{line}{'; ' if line else ''}{moving} progressing", width, "    ", first="  ")
    gpu = [(n.name, line) for n in snapshot.nodes for line in evidence_lines(n)]  # NCCL/CUDA jobs only
    if gpu:
        out += ["", "GPU evidence:"]
        for name, line in gpu[:40]:
            out += _wrap(f"{name}: {line}", width, "    ", first="  ")
    notes = [f"{n.name}: {w}" for n in snapshot.nodes for w in n.warnings]
    if notes:
        out += ["", "Notes from the nodes:"]
        for line in notes[:20]:
            out += _wrap(line, width, "    ", first="  ")
        if len(notes) > 20:  # e.g. every node of a large job reached directly when its relay could not ssh to it
            out.append(f"  and {len(notes) - 20:,} more (the snapshot file has every node's)")
    failures = node_failures(snapshot)
    if failures:
        out += ["", "Nodes:"]
        for line in failures:
            out += _wrap(line, width, "    ", first="  ")
    return "\n".join(clean(line, 10 * width) for line in out)


def waits_text(analysis: Analysis, width: int = 100) -> List[str]:
    """Who waits for whom, under the headline: `ranks 0-6 -> rank 7 (iteration: step=41 vs 40; high)`, the
    culprit and what to do next; one block per job when the snapshot holds several."""
    graphs = shown_graphs(analysis.waits)
    if not graphs:
        return []
    out = ["", "Who waits for whom:"]
    for g in graphs:
        indent = "  "
        if len(graphs) > 1:
            out += _wrap(f"job {g.job}:", width, "    ", first="  ")
            indent = "    "
        for line in graph_lines(g):
            out += _wrap(line, width, indent + "    ", first=indent)
    return out


def _slurm_ids(snapshot: Snapshot, keys: Set[RankKey]) -> Dict[RankKey, str]:
    """`RANK 3: SLURM_PROCID=1 SLURM_NODEID=1 SLURM_LOCALID=0` for those of `keys` started under srun (only the
    ranks a finding names alone: each rank's environment read for all 100k ranks was ~0.5 s, issue 27)."""
    names = ("SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID")
    out: Dict[RankKey, str] = {}
    for r in snapshot.ranks if keys else ():
        if rank_key(r) not in keys:
            continue
        ids = [f"{n}={r.env_value(n)}" for n in names if r.env_value(n) is not None]
        if ids:
            out[rank_key(r)] = f"RANK {r.rank if r.rank is not None else '?'}: {' '.join(ids)}"
    return out


def _wrap(text: str, width: int, indent: str, first: str = "") -> List[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent,
                         break_long_words=True, break_on_hyphens=False) or [first.rstrip()]


def _finding(i: int, f: Finding, width: int) -> List[str]:
    lines = _wrap(f"{i:>2}. [{f.confidence}] {f.title}", width, "      ", first="  ")
    if f.ranks_label and f.ranks_label not in f.title and f.ranks_label not in f.detail:
        lines += _wrap(f.ranks_label, width, "      ", first="      ")
    if f.detail:
        lines += _wrap(f.detail, width, "      ", first="      ")
    lines += _wrap(f"why {f.confidence}: {f.reason}", width, "      ", first="      ")
    return lines


def _distinctive(own: Sequence[Frame]) -> List[str]:
    """A class's own frames, innermost first, down to the job's own code, shortened to the innermost few
    and the last; native frames without a symbol say nothing and are left out."""
    frames = [f for f in reversed(own) if not (f.native and f.function.startswith("0x"))] or list(own[-1:])
    for i, f in enumerate(frames if len(frames) > FRAMES_SHOWN else ()):
        if not is_library(f):  # a long own part: down to the job's own code is what matters
            frames = frames[:max(i + 1, FRAMES_SHOWN)]
            break
    inner = [frame_text(f) for f in frames]
    if len(inner) > FRAMES_SHOWN:
        inner = inner[:FRAMES_SHOWN - 1] + ["...", inner[-1]]
    return inner


def node_failures(snapshot: Snapshot) -> List[str]:
    """`node[03-07]: ptrace denied (ranks 8-15)`: node and rank failures, aggregated by kind."""
    by_code: Dict[Tuple[str, str], List[str]] = defaultdict(list)
    ranks_by_code: Dict[str, List[RankSnapshot]] = defaultdict(list)
    for n in snapshot.nodes:
        if n.state in ("failed", "partial"):
            code = n.error.code if n.error else "unknown"
            by_code[(code, n.state)].append(n.name)
    for r in snapshot.ranks:
        if r.error is not None:
            ranks_by_code[r.error.code].append(r)
    lines = []
    for (code, state), names in sorted(by_code.items()):
        extra = " (partial data)" if state == "partial" else ""
        lines.append(f"{fold_nodes(names)}: {clean(code.replace('_', ' '), 60)}{extra}")
    for code, ranks in sorted(ranks_by_code.items(), key=lambda kv: -len(kv[1])):
        label = describe(ranks)
        nodes = label.rsplit(" on ", 1)[-1]
        lines.append(f"{nodes}: {clean(code.replace('_', ' '), 60)} ({label.rsplit(' on ', 1)[0]})")
    return lines
