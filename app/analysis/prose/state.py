"""Sentences for process states and the job's health (health.py's facts): ranks stopped, frozen, exited or in D
state; ranks not found; nodes not inspected; dumps that failed; thread counts; several jobs in one snapshot."""

from __future__ import annotations

import re
from typing import Callable, List, Optional, Sequence, Tuple

from app.analysis.facts import Fact
from app.analysis.fold import MAX_PARTS, count_phrase, describe, fold_nodes, short
from app.analysis.frames import clean
from app.analysis.health import DumpEvidence, JobsEvidence, MissingEvidence, NodeEvidence, StateEvidence
from app.analysis.health import ThreadCountEvidence, _span
from app.analysis.prose.words import who_label, who_short
from app.model import ProcessHold, RankSnapshot

Text = Tuple[str, str, str]


def _others(held: Sequence[RankSnapshot], total: int) -> str:
    others = total - len(held)
    if others <= 0:
        return ""
    them = "it" if len(held) == 1 else "them"
    return f"; the other {count_phrase(others)} wait for {them}" if others > 1 else f"; the other rank waits for {them}"


def on_each(held: Sequence[RankSnapshot], what: Callable[[RankSnapshot], str]) -> str:
    """`kill -CONT 4242` on node03, or for several ranks the command per rank, the first few."""
    parts = []
    for r in held[:4]:
        parts.append(f"`{clean(what(r), 300)}` on {clean(r.node, 80)}" if len(held) == 1 else
                     f"{short([r])}: `{clean(what(r), 300)}` on {clean(r.node, 80)}")
    return ", ".join(parts) + (", ..." if len(held) > 4 else "")


# A command hangscope suggests is its own, never text from a node or a snapshot file taken as it came: the freezer's
# control file is the one value of the node's in it, and only a plain absolute path (no shell syntax, spaces, `..`
# or quotes) is put in; the value written is the one its kind of file takes
# (a component a shared snapshot hid, `<str len=25 #3fa9c1e2>`, stays one: hangscope's own placeholder)
_COMPONENT = r"(?:[A-Za-z0-9._@:+,=-]{1,255}|<(?:str|bytes|text) len=\d{1,9} #[0-9a-f]{8}>|\*\*\*)"
_CONTROL = re.compile(r"echo (?P<value>0|THAWED) > (?P<path>(?:/" + _COMPONENT + r"){1,32}/"
                      r"(?P<file>cgroup\.freeze|freezer\.state))")
_UNPAUSE = re.compile(r"(?:docker|podman) unpause [0-9a-f]{1,64}")


def thaw_command(hold: Optional[ProcessHold]) -> str:
    """`echo 0 > /sys/fs/cgroup/.../cgroup.freeze` for a frozen rank, rebuilt from the control file the node named
    (its thaw), or "" when that is not a plain path to a freezer's control file."""
    m = _CONTROL.fullmatch(hold.thaw) if hold is not None and hold.thaw else None
    if m is None or "/../" in m.group("path") or "/./" in m.group("path"):
        return ""
    value = "0" if m.group("file") == "cgroup.freeze" else "THAWED"
    return f"echo {value} > {m.group('path')}" if value == m.group("value") else ""


def unpause_command(hold: Optional[ProcessHold]) -> str:
    """`docker unpause ID` for a rank in a container the node recognised, when it has that shape; else ""."""
    return hold.container if hold is not None and _UNPAUSE.fullmatch(hold.container) else ""


def resume_command(e: StateEvidence) -> str:
    """What resumes a held rank, as a command on its node ("" when nothing does)."""
    if e.kind == "frozen":
        return on_each(e.ranks, lambda r: thaw_command(r.hold) or f"cat /proc/{r.pid}/cgroup")
    if e.kind == "stopped":
        if e.traced and len(e.traced) == len(e.ranks):
            return ""
        return on_each(e.ranks, lambda r: f"kill -CONT {r.pid}")
    return ""


def state_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, StateEvidence)
    held = e.ranks
    if e.gone:
        who = who_short(f.who)
        one = len(f.who.keys) == 1
        return (f"{who} {'is' if one else 'are'} gone since an earlier sample",
                "a rank that exits leaves the others waiting for it forever",
                "the process was seen before and is no longer there")
    n = len(held)
    verb = "is" if n == 1 else "are"
    if e.kind == "frozen":
        first = held[0].hold
        detail = ("a frozen process does not run at all until its cgroup is thawed (a scheduler's suspend, `docker "
                  "pause`, or someone writing the freezer); SIGCONT does not thaw it. hangscope dumped it without "
                  "ptrace and left it frozen")
        if first is None or first.kind != "frozen" or not first.freezer:
            # the kernel's freezer wait says it; the node's view of the cgroup file system does not show which
            chans = sorted({t.wchan for r in held for t in r.threads if t.wchan})
            pids = ", ".join(f"`cat /proc/{r.pid}/cgroup`" for r in held[:2])
            return (f"{short(held)} {verb} frozen by the cgroup freezer (asleep in the kernel's freezer wait "
                    f"`{clean(chans[0] if chans else '__refrigerator', 40)}`; the node's view of the cgroup file "
                    f"system does not show which cgroup){_others(held, e.total)}; thaw its cgroup from the host, "
                    f"where {pids} names it",
                    detail + ". The node runs in its own cgroup namespace (a container), so the freezer's cgroup is "
                    "not visible from it: thaw it where the whole hierarchy is (the host, the container runtime: "
                    "`docker unpause`, or the scheduler's resume)",
                    "every thread sleeps in the kernel's freezer wait (" + ", ".join(clean(c, 40) for c in chans[:3])
                    + "), which only the cgroup freezer puts a task in")
        where = (f"{first.freezer} cgroup {clean(first.cgroup, 200)}" if n == 1 or
                 len({(r.node, r.hold.cgroup) for r in held if r.hold}) == 1 else "their cgroups")
        container = unpause_command(first) if n == 1 else ""
        thaw = (f"thaw with {resume_command(e)}" if all(thaw_command(r.hold) for r in held) else
                f"thaw its cgroup: {resume_command(e)} names it")
        return (f"{short(held)} {verb} frozen by the cgroup freezer ({where}){_others(held, e.total)}; {thaw}"
                + (f" (or `{clean(container, 100)}`)" if container else ""),
                detail, f"the node's {first.freezer} freezer reports the cgroup {first.freezer_state or 'FROZEN'}")
    if e.kind == "stopped":
        traced = e.traced
        signalled = [r for r in held if r not in traced]
        resumed = [r for r in held if r.resumed]
        tracers = sorted({f"PID {r.hold.tracer_pid}" + (f" ({clean(r.hold.tracer, 40)})" if r.hold.tracer else "")
                          for r in traced
                          if r.hold is not None and r.hold.tracer_pid})
        if traced and not signalled:
            why = f"by its tracer, {', '.join(tracers)}" if tracers else "in a tracing stop (a debugger holds it)"
            todo = "detach the tracer (quit the debugger) to resume it"
        else:
            tty = any(r.hold is not None and r.hold.tty for r in signalled)
            why = "SIGSTOP" + (" or Ctrl-Z in its terminal" if tty else " or job control")
            todo = resume_command(e) + (" resumes it" if n == 1 else " resume them")
        detail = ("a stopped rank never reaches the next collective, so every other rank waits for it; "
                  "hangscope dumped it without ptrace and left it stopped"
                  + ("; a tracer or debugger holds it (tracing stop)" if traced else "; someone sent it SIGSTOP")
                  + (f"; hangscope found {short(resumed)} stopped after its own tool and resumed it" if resumed else ""))
        return (f"{short(held)} {verb} stopped ({why}){_others(held, e.total)}; {todo}", detail,
                "the kernel reports the process as stopped")
    if e.kind == "exited":
        return (f"{short(held)} exited (zombie) and {verb} gone from the job",
                "an exited rank leaves the others waiting for it forever", "the kernel reports the process as a zombie")
    waits = []
    for r in held[:5]:
        chans = sorted({t.wchan for t in r.threads if t.state == "D" and t.wchan} | ({r.wchan} if r.wchan else set())
                       | ({r.hold.wchan} if r.hold is not None and r.hold.wchan else set()))
        call = ""
        if r.hold is not None and r.hold.syscall:
            call = f" ({clean(r.hold.syscall, 40)}" + (f" on {clean(r.hold.waits_on, 200)}" if r.hold.waits_on else "") + ")"
        waits.append(f"{short([r])} on {r.node} in {', '.join(clean(w, 60) for w in chans) or 'an unknown kernel wait'}"
                     f"{call}")
    on = next((r.hold.waits_on for r in held if r.hold is not None and r.hold.waits_on), "")
    return (f"{short(held)} {verb} in uninterruptible sleep (D): waiting on I/O or a driver"
            + (f" ({clean(on, 120)})" if on and n == 1 else ""),
            "; ".join(waits) + ("; ..." if n > 5 else "") +
            ". A process in D state cannot run Python until the kernel call returns (file system, "
            "GPU driver, network storage).",
            "the kernel reports D state" + (" for a few ranks" if e.few else " for many ranks alike"))


def jobs_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, JobsEvidence)
    parts = [f"{addr or '?'}:{port if port is not None else '?'} (WORLD_SIZE={ws}): {describe(rs)}"
             for (addr, port, ws), rs in e.jobs]
    return (f"the snapshot holds {len(e.jobs)} jobs", "; ".join(clean(p, 300) for p in parts)
            + ". Missing ranks are counted per job; classes mix them.",
            "ranks report different MASTER_ADDR/MASTER_PORT/WORLD_SIZE")


def node_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, NodeEvidence)
    nodes = fold_nodes(f.who.nodes)
    phrase = e.code.replace("_", " ")
    said = "; ".join(clean(m, 200) for m in e.messages)
    hint = f" What to do: {clean(e.hint, 300)}" if e.hint else ""
    if e.state == "failed":
        return (f"ranks on {nodes} unknown: node failed ({phrase})", (said + "." if said else "") + hint,
                "the node gave no data: a culprit there would be invisible, but nothing says it is there")
    return (f"ranks on {nodes} partly known: collection was cut short ({phrase})", (said + "." if said else "") + hint,
            "only part of the node's data arrived")


def number_text(world: int) -> str:
    try:
        digits = str(world)
        return digits if len(digits) <= 24 else f"{digits[:12]}... ({len(digits)} digits)"
    except ValueError:  # more digits than int->str allows (sys.set_int_max_str_digits)
        return "(a number of thousands of digits)"


def missing_label(e: MissingEvidence) -> str:
    """`ranks 0-7,1992-1999 and 1,200 more`: the first MAX_PARTS gaps (fold.py), then how many ranks more."""
    shown = e.gaps[:MAX_PARTS]
    more = sum(b - a + 1 for a, b in e.gaps[MAX_PARTS:])
    return (f"{'rank' if e.count == 1 else 'ranks'} {','.join(_span(a, b) for a, b in shown)}"
            + (f" and {more:,} more" if more else ""))


def short_of_text(e: MissingEvidence) -> str:
    return ", ".join(clean(f"{n}: {found} of {expected}", 100) for n, found, expected in e.short_of)


def missing_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, MissingEvidence)
    if e.case == "implausible":
        number = number_text(e.world)
        return (f"WORLD_SIZE={number} is not a plausible number of ranks",
                f"{describe(e.shown)} report WORLD_SIZE={number}; no job runs that many ranks (the limit taken is "
                f"{1 << 22}), so missing ranks are not counted for this job: its environment was probably set by hand "
                "or by something other than the launcher.",
                "the rank count comes from the ranks' environment, which is not plausible here")
    if e.case == "slots":
        return (f"fewer ranks than expected: {short_of_text(e)}",
                "nodes hold fewer rank processes than the slots given for them in the hosts input.",
                "the expected count comes from the hosts input, not from the job")
    label = missing_label(e)
    if e.case == "finished":
        nodes = fold_nodes(e.finished)
        barrier = (f"their launchers on {nodes} wait in torchrun's exit barrier, which an agent enters once its "
                   "ranks have all ended well, for the rest of the job to finish too")
        if f.kind == "unfinished":
            who = who_short(f.who)
            one = len(f.who.keys) == 1
            return (f"{who} {'has' if one else 'have'} not finished while {label} of {e.world} "
                    f"{'has' if e.count == 1 else 'have'} (their launchers on {nodes} wait for "
                    f"{'it' if one else 'them'} in torchrun's exit barrier)",
                    f"{label} ended well: {barrier}. What {who} {'does' if one else 'do'} is what the job waits for",
                    "the launchers' own stacks put them in the exit barrier")
        return (f"{label} have finished (WORLD_SIZE={e.world})", f"{barrier}.",
                "the launchers' own stacks put them in the exit barrier")
    title = f"{label} not found (WORLD_SIZE={e.world})"
    if e.case == "failed":
        detail = f"{fold_nodes(e.failed)} could not be inspected; the missing ranks are probably there"
        reason = "ranks on failed nodes are unknown, not necessarily gone"
    elif e.case == "hosts_short":
        were = "was" if e.inspected == 1 else "were"
        detail = (f"{count_phrase(e.inspected, 'node')} {were} inspected with {e.per_node} ranks each "
                  "(LOCAL_WORLD_SIZE), "
                  f"fewer than WORLD_SIZE={e.world}: the missing ranks are probably on nodes not in the hosts list")
        reason = "the hosts list may not cover the whole job"
    else:
        detail = (f"{count_phrase(e.count)} of the job's {e.world} did not show up on any inspected node: "
                  "a rank that exited (crashed, killed, OOM) leaves the others waiting for it forever")
        if e.short_of:
            detail += f"; nodes with fewer ranks than the others: {short_of_text(e)}"
        if e.no_launcher:
            gone = fold_nodes(e.no_launcher)
            title += (f": {gone} {'runs' if len(e.no_launcher) == 1 else 'run'} neither them nor a launcher of the job, "
                      "while the other nodes' launchers run: its launcher has exited too")
            detail += (f"; no launcher of the job runs on {gone}: a launcher that has used up its restarts (a worker "
                       "that fails at every start), was killed, or failed itself takes its ranks with it")
        reason = "every node answered and the rank is not among the processes"
    if e.addr:
        detail += f" (job {clean(e.addr, 80)}:{e.port})"
    return title, detail + ".", reason


def dump_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, DumpEvidence)
    label = who_label(f.who)
    phrase = {"not_collected": "stacks were not collected", "partial": "the connection was cut short",
              "no_thread": f"no thread named {clean(e.thread, 60)!s}",
              "empty_stack": "the dump returned no frames"}.get(e.cause, e.cause.replace("_", " "))
    detail = "; ".join(p for p in (clean(e.message, 200), clean(e.hint, 300)) if p)
    return (f"no stack for {label}: {phrase}", detail or "these ranks are left out of the classes and the tree",
            "the picture is incomplete: a culprit could hide among these ranks")


def thread_count_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, ThreadCountEvidence)
    n = len(f.who.keys)
    return (f"{who_short(f.who)} {'has' if n == 1 else 'have'} {e.count} threads while {e.usual_ranks} others have "
            f"{e.usual}",
            "a thread that died (data loader, pin memory, a communication thread) or was never started can leave a "
            "rank waiting", "thread counts also differ for harmless reasons (rank 0 hosts the store)")


def lines(texts: List[str]) -> str:
    return "; ".join(texts)
