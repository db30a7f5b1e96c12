"""The text layer: every sentence of the analysis, written last, from typed facts and the culprit.

`render(fact)` turns one Fact into the Finding screens and reports show (title, detail, why that confidence,
the caveats calibration added); RENDERERS has one function per kind of fact (a test checks none is missing).
headline.py writes the verdict and the wait graph's headline and next step; graph.py names the graph's
vertices and edges. Nothing here decides anything: what to say is in the facts.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

from app.analysis.facts import Caveat, Fact
from app.analysis.findings import Finding
from app.analysis.fold import fold_nodes
from app.analysis.frames import clean
from app.analysis.prose.gpu import gpu_text, ras_text
from app.analysis.prose.iterations import iteration_text, no_locals_text
from app.analysis.prose.jobs import flight_text, launch_text, launcher_held_text, launchers_text, network_text
from app.analysis.prose.jobs import no_data_text, rendezvous_text, store_text
from app.analysis.prose.jobs import outside_text
from app.analysis.prose.progress import progress_text, slow_text
from app.analysis.prose.stacks import identical_text, stack_text
from app.analysis.prose.state import dump_text, jobs_text, missing_text, node_text, state_text, thread_count_text
from app.analysis.prose.threads import lock_text, native_text, p2p_text
from app.analysis.prose.waits import blocked_text
from app.analysis.prose.words import one, who_label, who_short

Text = Tuple[str, str, str]

RENDERERS: Dict[str, Callable[[Fact], Text]] = {
    "progressing": progress_text, "still_running": progress_text,
    "stopped": state_text, "frozen": state_text, "exited": state_text, "uninterruptible": state_text,
    "gpu_fault": gpu_text, "nccl_ras": ras_text,
    "lock_wait": lock_text, "p2p_wait": p2p_text,
    "gil_held": native_text, "pipe_write": native_text, "native_call": native_text,
    "blocked": blocked_text,
    "slow_node": slow_text,
    "different_collective": stack_text, "minority_stack": stack_text,
    "iteration_split": iteration_text, "no_locals": no_locals_text,
    "launch_differs": launch_text, "launch_incomplete": launchers_text, "launchers_only": launchers_text,
    "launcher_held": launcher_held_text, "rendezvous_differs": rendezvous_text, "store_differs": store_text,
    "collective_lag": flight_text,
    "missing_ranks": missing_text, "unfinished": missing_text, "node_failed": node_text, "outside_peer": outside_text,
    "network_stall": network_text, "thread_count": thread_count_text, "dump_failed": dump_text,
    "all_identical": identical_text, "several_jobs": jobs_text, "no_data": no_data_text,
}


def caveat_text(c: Caveat) -> str:
    """"; but ..." for one caveat calibration added."""
    who = who_label(c.about) or who_short(c.about)
    if c.code == "progressing":
        return "; but the job is progressing, and ranks of a running job are caught at different places"
    if c.code == "progressing_stall" or c.code == "eased":
        return "; but the job is progressing between samples" if c.code == "progressing_stall" else \
            "; but the job progresses between samples"
    if c.code == "passing":
        return (f"; but {clean(who, 120)} moved between samples: a D state seen in one sample is a passing "
                "kernel wait (a page fault, a disk read), not one that holds the rank")
    if c.code == "sockets_moved":
        return f"; but the sockets of ranks on {fold_nodes(c.about.nodes)} moved bytes to their peers between samples"
    if c.code == "held":
        n = "is" if one(c.about) else "are"
        its = "its" if one(c.about) else "their"
        return f"; but {clean(who, 120)} {n} {c.kind}, which silences {its} sockets and holds the others by itself"
    if c.code == "not_moving":
        return "; but nothing moves between samples: a node short of CPU slows a job, it does not stop it"
    if c.code == "spinning":
        return f"; but {clean(who, 120)} spins on that node, which takes its CPU: the node is short of CPU because of it"
    if c.code == "not_progressing":
        return f"; but {clean(who, 120)} is {c.kind}, so the job as a whole is not progressing"
    if c.code == "root_elsewhere":
        return f"; but the wait graph's root is {clean(who, 120)}" + (f" ({c.kind.replace('_', ' ')})" if c.kind else "")
    if c.code == "upstream":
        return f"; but it waits for {clean(who, 120)}, where the wait graph ends: it is held there, not the cause"
    if c.code == "rival":
        return f"; but evidence as strong points at {clean(who, 120)}"
    if c.code == "agrees":
        return "; the stacks or process states single out the same rank"
    if c.code == "disagrees":
        return f"; but other evidence singles out {clean(who, 80)}, not these ranks"
    return ""


def render(f: Fact) -> Finding:
    title, detail, reason = RENDERERS[f.kind](f)
    reason += "".join(caveat_text(c) for c in f.caveats)
    label = who_label(f.who)
    return Finding(f.kind, clean(title, 600), detail, f.strength, reason, f.who.keys, label,
                   fold_nodes(f.who.nodes) if f.who.nodes else "", f.culprit, f.class_index)
