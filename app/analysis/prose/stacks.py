"""Sentences for where the stacks part (divergence.py's facts): a minority class against the majority, and every
rank at one place."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from app.analysis.divergence import IdenticalEvidence, StackEvidence
from app.analysis.facts import Fact
from app.analysis.fold import brief
from app.analysis.frames import clean, focus_frame, frame_id, group_arg, in_backward, is_library, named
from app.analysis.prose.words import where
from app.analysis.tree import StackClass
from app.model import Frame

Text = Tuple[str, str, str]  # title, detail, reason


def _parting(c: StackClass, d: StackClass, k: int) -> str:
    """Where c's path leaves d's: the first frame that differs, on both sides."""
    mine = c.frames[k] if k < len(c.frames) else None
    theirs = d.frames[k] if k < len(d.frames) else None
    after = f" after {named(c.frames[k - 1])}" if k else " at the outermost frame"
    if mine is not None and theirs is not None:
        return f"its path leaves the others'{after}: {named(mine)} here, {named(theirs)} there"
    if mine is None and theirs is not None:
        return f"its path stops{after}, where the others go on into {named(theirs)}"
    if mine is not None:
        return f"its path goes on{after} into {named(mine)}, where the others' path ends"
    return "the paths are the same"


def _why(e: StackEvidence) -> str:
    c, d = e.mine, e.theirs
    who = brief(c.who, c.size)
    past = e.past
    if e.case == "left_loop":
        same = (f", in the same iteration of `{_header(past.around)}` ({_values(past)} on both sides)"
                if past is not None and past.around is not None and past.name else "")
        return f"{who} {'is' if c.size == 1 else 'are'} past the end of a loop the others are still inside{same}"
    if e.case == "other_iteration" and past is not None and past.around is not None:
        return (f"{who} {'is' if c.size == 1 else 'are'} in another iteration of `{_header(past.around)}` than the "
                f"others ({clean(past.name, 40)}={clean(past.mine, 40)} vs {clean(past.theirs, 40)}): not out of the "
                "loop they are in, and they wait for it at their next collective")
    if e.case == "left_or_behind" and past is not None and past.around is not None:
        return (f"stacks alone cannot tell whether {who} left `{_header(e.loop)}` or "
                f"{'is' if c.size == 1 else 'are'} an iteration of `{_header(past.around)}` behind: no value of its "
                "loop variables was read")
    if e.case == "other_collective":
        return f"a rank in `{c.collective}` can never meet ranks in `{d.collective}`"
    if e.case == "same_collective":
        return (f"both wait in `{c.collective}` but called from different places, which pairs collectives that do "
                "not belong together")
    if e.case == "same_collective_library":
        return f"both wait in `{c.collective}`; their paths differ only inside libraries"
    if e.case == "others_in_collective":
        return f"the others wait in `{d.collective}` for ranks that are elsewhere"
    if e.case == "it_in_collective":
        return (f"{who} {'waits' if c.size == 1 else 'wait'} in `{c.collective}` for the others, which are "
                "elsewhere: either side may hold the other up")
    if e.case == "backward":
        return ("the others are in autograd's backward, where DDP's gradient all_reduce waits for every rank; the "
                "smallest groups are the usual suspects")
    return "no collective recognised; the smallest groups are the usual suspects"


def _header(loop: object) -> str:
    header = getattr(loop, "header", "")
    return clean(str(header).strip().rstrip(":"), 100)


def _values(past: object) -> str:
    return f"{clean(getattr(past, 'name', ''), 40)}={clean(getattr(past, 'mine', ''), 40)}"


def _iterations(n: int) -> str:
    return f"{n} iteration{'s' if n != 1 else ''}"


def _reason(e: StackEvidence) -> str:
    c, d = e.mine, e.theirs
    why = _why(e)
    if e.case == "same_collective_library":
        return why
    if e.size == "tie":
        return f"{why}; but both groups hold {c.size} ranks, so either may be the odd one"
    if e.size == "small":
        return f"{why}, and {c.size} rank{'s' if c.size != 1 else ''} stand{'s' if c.size == 1 else ''} " \
            f"against {d.size}"
    return f"{why}; but the groups are of similar size ({c.size} and {d.size})"


def stack_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, StackEvidence)
    if e.case == "many":
        rest = e.rest
        return (f"{len(rest)} more small groups of ranks are elsewhere",
                "; ".join(f"{c.label} {where(c)}" for c in rest[:20]) + ("; ..." if len(rest) > 20 else ""),
                "many different stacks: the ranks may still be running, not hung")
    c, d = e.mine, e.theirs
    who = brief(c.who, c.size)
    verb = "is" if c.size == 1 else "are"
    others = f"{d.size} other{'s' if d.size != 1 else ''}"
    if d.collective is not None:
        theirs = f"{'waits' if d.size == 1 else 'wait'} in `{d.collective}`"
    else:
        theirs = f"{'is' if d.size == 1 else 'are'} {where(d)}"
    title = f"{who} {verb} {where(c)} while {others} {theirs}"
    detail = f"{c.label}: {_parting(c, d, e.parting)}"
    inner = c.frames[-1] if c.frames else None
    if inner is not None and inner is not focus_frame(c.frames) and c.collective is None:
        detail += f"; innermost frame {named(inner)}"
    if e.case == "same_collective" and d.collective is not None:
        title = same_collective_title(e, who, verb, others)
    if e.case in ("left_loop", "other_iteration", "left_or_behind") and e.loop is not None \
            and e.loop_frame is not None:
        title, more = _past_loop(e, who, verb, others)
        detail += more
    elif e.case == "backward":
        title = (f"{who} {verb} {where(c)} while {others} {'is' if d.size == 1 else 'are'} in autograd's "
                 f"backward {where(d)}, where DDP all_reduces the gradients")
    return title, detail, _reason(e)


# the outermost frames of a main program (a script, `python -m`, a thread's bootstrap): a main thread whose stack
# starts elsewhere runs code the interpreter called as it exits (an atexit handler, a finalizer)
_PROGRAM_ROOTS = ("<module>", "_run_module_as_main", "_run_code", "_bootstrap", "_bootstrap_inner")


def exiting(c: StackClass) -> bool:
    """Whether a class's stack is code run at the interpreter's exit: no program root at its outermost frame."""
    return exiting_frames(c.frames)


def exiting_frames(frames: Sequence[Frame]) -> bool:
    """The same for frames outermost first."""
    return bool(frames) and frames[0].function not in _PROGRAM_ROOTS and not frames[0].native


def caller(c: StackClass) -> Optional[Frame]:
    """The job's frame that called the collective a class waits in (the innermost frame of the job's code)."""
    f = focus_frame(c.frames)
    return f if f is not None and not is_library(f) else None


def callers(e: StackEvidence) -> Tuple[Optional[Frame], Optional[Frame]]:
    """Where each side calls the collective from: the innermost frame of the job's code; when that is the same
    helper on both sides (a wrapper of the job's), the frames where their paths part."""
    c, d = e.mine, e.theirs
    mine, theirs = caller(c), caller(d)
    if mine is not None and theirs is not None and frame_id(mine, "function+line") == frame_id(theirs, "function+line"):
        k = e.parting
        mine = c.frames[k] if k < len(c.frames) and not is_library(c.frames[k]) else None
        theirs = d.frames[k] if k < len(d.frames) and not is_library(d.frames[k]) else None
    return mine, theirs


def same_collective_title(e: StackEvidence, who: str, verb: str, others: str) -> str:
    """Two classes in the same collective called from different places of the job's code: where each calls it
    from, that the culprit's side runs as the interpreter exits (an atexit handler) when it does, and the groups
    the calls name: calls of one collective from two places of a program are two collectives that never match."""
    c, d = e.mine, e.theirs
    mine, theirs = callers(e)
    if mine is None or theirs is None:
        return f"{who} {verb} {where(c)} while {others} wait in `{d.collective}`"
    at_exit = (", in code run as its interpreter exits (an atexit handler: its main program has ended)"
               if exiting(c) and not exiting(d) else "")
    g_mine, g_theirs = group_arg(mine), group_arg(theirs)
    group = (f" ({'its call is' if c.size == 1 else 'theirs are'} on another process group, `{clean(g_mine, 40)}`, "
             f"than the others': {'the default group' if not g_theirs else f'`{clean(g_theirs, 40)}`'})"
             if g_mine and g_mine != g_theirs else "")
    return (f"{who} {verb} in `{c.collective}` called from {named(mine)}{at_exit}, while {others} wait in "
            f"`{d.collective}` called from {named(theirs)}: two different calls, which never match{group}")


def _past_loop(e: StackEvidence, who: str, verb: str, others: str) -> Tuple[str, str]:
    """(title, more detail) for a class past the end of the loop the others are in: it left the loop, it is in
    another iteration of a loop around both, or which of the two is not known (divergence.py's table)."""
    c, d, loop, past = e.mine, e.theirs, e.loop, e.past
    assert loop is not None and e.loop_frame is not None
    short = clean(e.loop_frame.filename.rsplit("/", 1)[-1] or "?", 80)
    header = _header(loop)
    inner = f"`{header}` ({short}:{loop.line})"
    if d.collective is not None:
        they = f"wait in `{d.collective}`"
    elif in_backward(d.frames):
        they = f"are in autograd's backward, {where(d)}, where DDP all_reduces the gradients"
    else:
        they = f"are {where(d)}"
    around = past.around if past is not None else None
    at = past.around_frame if past is not None else None
    outer_file = clean((at.filename if at is not None else "").rsplit("/", 1)[-1] or "?", 80)
    outer = f"`{_header(around)}` ({outer_file}:{around.line})" if around is not None else ""
    if e.case == "other_iteration" and past is not None and around is not None:
        values = f"{clean(past.name, 40)}={clean(past.mine, 40)} vs {clean(past.theirs, 40)}"
        if past.delta is not None:
            side = "behind" if past.delta < 0 else "ahead of"
            title = (f"{who} {verb} {_iterations(abs(past.delta))} of {outer} {side} {others} ({values}), not out "
                     f"of the loop {inner} they are in: {who} {verb} {where(c)}, they {they}")
        else:
            title = (f"{who} {verb} in another iteration of {outer} than {others} ({values}), not out of the loop "
                     f"{inner} they are in: {who} {verb} {where(c)}, they {they}")
        more = (f". {who[:1].upper() + who[1:]} {'has' if c.size == 1 else 'have'} not left {inner}: "
                f"{'it is' if c.size == 1 else 'they are'} still at a later line of an earlier iteration of {outer}, "
                f"while the others went on into the next one and wait there at their next collective. A straggler: "
                f"if {who} {'moves' if c.size == 1 else 'move'} between samples the job runs at "
                f"{'its' if c.size == 1 else 'their'} pace (a slow node, a slow step); if not, what holds "
                f"{'it' if c.size == 1 else 'them'} there is the culprit") if past.delta is None or past.delta < 0 \
            else (f". {who[:1].upper() + who[1:]} went on past the others: a collective the others issue was "
                  "skipped there, or issued once more here")
        return title, more
    if e.case == "left_or_behind" and past is not None and around is not None:
        name = (around.variables + around.counters)[:1]
        var = f"`{clean(name[0], 40)}`" if name else f"the iteration of {outer}"
        title = (f"{who} {verb} past the end of the loop {inner} that {others} are in, inside {outer}: either "
                 f"{who} left it or {verb} an iteration behind ({who} {verb} {where(c)}, they {they})")
        more = (f". Stacks alone cannot tell these apart: in the same iteration of {outer}, {who} left {inner} (its "
                f"data ran out first: uneven inputs); in an earlier one, {who} {verb} behind (a straggler, and the job "
                f"may still be moving). What tells them apart: {var} on both sides (collected with --locals), and "
                f"samples over time (--samples 3): ranks that move between samples are stragglers")
        return title, more
    same = (f", in the same iteration of {outer} ({_values(past)} on both sides)"
            if past is not None and around is not None and past.name else "")
    title = (f"{who} {'has' if c.size == 1 else 'have'} left the loop {inner} that {others} are still in{same}: "
             f"{who} {verb} {where(c)}, they {they}")
    more = (f". The others still run `{header}` and wait there for collectives that {who} will not issue any more. "
            f"Usually the ranks' inputs are uneven: a rank whose data ran out leaves the loop first. Give every rank "
            f"the same number of batches (a DistributedSampler with drop_last=True), or let DDP's join() shadow the "
            f"ranks that finished")
    return title, more


def identical_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, IdenticalEvidence)
    c = e.cls
    one = c.size == 1
    if c.collective:
        at = f"wait{'s' if one else ''} in `{c.collective}`"
    elif e.ddp:
        at = f"wait{'s' if one else ''} in DDP's gradient all_reduce, inside `backward`, {where(c)}"
    else:
        at = f"{'is' if one else 'are'} {where(c)}"
    who = ("the only rank" if one else f"all {c.size} ranks") + (
        (" with a stack" if one else " with stacks") if e.incomplete else "")
    title = f"{who} {at}{'' if one else ' at the same place'}: stacks cannot tell the culprit"
    hints = []
    guess = False
    if e.network:
        hints.append("the network finding names the node whose sockets stall")
    elif e.moving:
        hints.append("their sockets moved bytes between samples: the links work")
    elif e.progressing:
        hints.append("ranks on several nodes progress between samples, so their collectives complete: the links work")
    elif e.explained:
        hints.append("the findings above say what they wait for")
    elif e.sockets:
        hints.append("no socket shows a stall; if nothing else explains the hang, check the links between the "
                     "nodes (ss -tinpo on each)")
        guess = True
    else:
        hints.append("no socket data was collected; check the links between the nodes (ss -tinpo on each)")
        guess = True
    if e.locals_missing and not e.locals_collected:
        hints.append("run with --locals to tell loop iterations apart")
    elif e.locals_missing:
        hints.append("their loop variables could not be read, so an iteration difference would not show")
    if not e.history:
        hints.append("take samples over time (w in the TUI, or --samples N) to see whether ranks progress")
    return (title, f"{c.label} share one stack; " + "; ".join(hints) + ".",
            "every rank's stack and loop iteration are identical"
            + ("; the advice is a guess, no evidence points at the network" if guess else ""))
