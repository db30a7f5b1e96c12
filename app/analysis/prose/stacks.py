"""Sentences for where the stacks part (divergence.py's facts): a minority class against the majority, and every
rank at one place."""

from __future__ import annotations

from typing import Tuple

from app.analysis.divergence import IdenticalEvidence, StackEvidence
from app.analysis.facts import Fact
from app.analysis.fold import brief
from app.analysis.frames import clean, focus_frame, in_backward, named
from app.analysis.prose.words import where
from app.analysis.tree import StackClass

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
    if e.case == "left_loop":
        return f"{who} {'is' if c.size == 1 else 'are'} past the end of a loop the others are still inside"
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
    if e.case == "left_loop" and e.loop is not None and e.loop_frame is not None:
        loop, in_frame = e.loop, e.loop_frame
        short = clean(in_frame.filename.rsplit("/", 1)[-1] or "?", 80)
        header = clean(loop.header.strip().rstrip(":"), 100)
        if d.collective is not None:
            they = f"wait in `{d.collective}`"
        elif in_backward(d.frames):
            they = f"are in autograd's backward, {where(d)}, where DDP all_reduces the gradients"
        else:
            they = f"are {where(d)}"
        title = (f"{who} {'has' if c.size == 1 else 'have'} left the loop `{header}` ({short}:{loop.line}) that "
                 f"{others} are still in: {who} {verb} {where(c)}, they {they}")
        detail += (f". The others still run `{header}` and wait there for collectives that {who} will not issue "
                   f"any more. Usually the ranks' inputs are uneven: a rank whose data ran out leaves the loop "
                   f"first. Give every rank the same number of batches (a DistributedSampler with drop_last=True), "
                   f"or let DDP's join() shadow the ranks that finished")
    elif e.case == "backward":
        title = (f"{who} {verb} {where(c)} while {others} {'is' if d.size == 1 else 'are'} in autograd's "
                 f"backward {where(d)}, where DDP all_reduces the gradients")
    return title, detail, _reason(e)


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
