"""Sentences for where the stacks part (divergence.py's facts): a minority class against the majority, and every
rank at one place."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Iterator, Optional, Sequence, Tuple

from app.analysis.divergence import IdenticalEvidence, StackEvidence
from app.analysis.facts import Fact
from app.analysis.fold import brief
from app.analysis.frames import (clean, ddp_forward, focus_frame, frame_id, group_arg, in_backward, is_library,
                                  location, named, path_collective)
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
        return (f"a rank in {_collective(c, e.mine_backward)} can never meet ranks in "
                f"{_collective(d, e.theirs_backward)}")
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
    if e.case == "passed":
        return (f"the others ran {who}'s line in the same iteration and went on: the collective completed for them, "
                f"so {who} {'waits' if c.size == 1 else 'wait'} in it for a member that never joined it")
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
    elif e.case == "passed" and e.past is not None:
        title = (f"{who} {_in_collective(c, e.mine_backward, c.size)}, which {others} passed in the same iteration "
                 f"of `{_header(e.past.around)}` ({_values(e.past)} on both sides): "
                 f"{'it waits' if c.size == 1 else 'they wait'} there for a member that has not joined "
                 "(a broadcast's tree or a ring lets the others finish), held by the ranks elsewhere")
    elif e.case == "other_collective" and (e.mine_backward or e.theirs_backward or
                                           any(ddp_forward(x.frames) and x.collective == "broadcast" for x in (c, d))):
        title = (f"{who} {_in_collective(c, e.mine_backward, c.size)} while {others} "
                 f"{_in_collective(d, e.theirs_backward, d.size, waits=True)}: two different collectives, which never "
                 "match")
    return title, detail, _reason(e)


def _collective(c: StackClass, ddp_backward: bool) -> str:
    """A class's collective in a few words: DDP's own where it is DDP's (the gradients' all_reduce, run from autograd's
    backward; the buffers' broadcast, run at the start of DDP's forward)."""
    if ddp_backward:
        return "DDP's gradient all_reduce"
    if ddp_forward(c.frames) and c.collective == "broadcast":
        return "DDP's broadcast of the buffers"
    return f"`{c.collective}`"


def _in_collective(c: StackClass, ddp_backward: bool, size: int, waits: bool = False) -> str:
    """`is in autograd's backward (train.py:12), where DDP all_reduces the gradients`, `is in `broadcast` called from
    `ZeroRedundancyOptimizer.consolidate_state_dict` at train.py:178`, ...: where a class waits and what calls it."""
    verb = ("waits" if size == 1 else "wait") if waits else ("is" if size == 1 else "are")
    if ddp_backward:
        return f"{'is' if size == 1 else 'are'} in autograd's backward, {where(c)}, where DDP all_reduces the gradients"
    mine = caller(c)
    at = f" at {location(mine)}" if mine is not None else ""
    if ddp_forward(c.frames) and c.collective == "broadcast":
        return (f"{verb} in DDP's forward{at}, in its broadcast of the buffers from rank 0 (broadcast_buffers=True, "
                "run at the start of every forward)")
    if mine is None:
        return f"{verb} {where(c)}"
    group = group_arg(mine)
    on = f" on the process group `{clean(group, 40)}`" if group else ""
    if in_backward(c.frames):
        return f"{verb} in `{c.collective}`{on} inside autograd's backward, called from {named(mine)}"
    entry = _entry(c, mine)
    if entry is not None:
        return f"{verb} in `{c.collective}` inside {named_call(entry)}{at}"
    return f"{verb} in `{c.collective}`{on} called from {named(mine)}"


def _entry(c: StackClass, mine: Frame) -> Optional[Frame]:
    """The library call the job's frame made on the way to the collective (`ZeroRedundancyOptimizer.
    consolidate_state_dict`), when it is not the collective itself."""
    frames = c.frames  # outermost first
    for i, f in enumerate(frames):
        if f is mine and i + 1 < len(frames):
            # a library's decorator around its API (a closure: `_dcp_method_logger.<locals>...wrapper`, `inner_func`)
            # is not the call the job made: the first function below such wrappers is
            j = i + 1
            while j + 1 < len(frames) and is_library(frames[j]) and _CLOSURE in frames[j].function:
                j += 1
            nxt = frames[j]
            wrapper = nxt.filename.replace("\\", "/").endswith(_C10D_LAYER)
            return nxt if is_library(nxt) and not wrapper and path_collective(frames)[1] is not nxt else None
    return None


_CLOSURE = ".<locals>."
_PACKAGE = re.compile(r"/(?:site|dist)-packages/((?:[A-Za-z_][A-Za-z_0-9]*/){1,4})[A-Za-z_0-9]+\.py$")


# torch.distributed's own layer around a collective (its logging wrapper, the collective's module): not an API the
# job called on the way to it
_C10D_LAYER = ("torch/distributed/c10d_logger.py", "torch/distributed/distributed_c10d.py")


def named_call(f: Frame) -> str:
    """A library call by its name only (`ZeroRedundancyOptimizer.consolidate_state_dict`): where the job called it
    from is said beside it."""
    m = _PACKAGE.search(f.filename.replace("\\", "/")) if "." not in f.function else None
    # a bare function (`save`) says its package: many libraries have one of that name
    of = f" of {clean(m.group(1).rstrip('/').replace('/', '.'), 60)}" if m else ""
    return f"`{clean(f.function, 80)}`{of}"


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
    if e.case == "other_iteration" and past is not None and around is not None and past.within:
        values = f"{clean(past.name, 40)}={clean(past.mine, 40)} vs {clean(past.theirs, 40)}"
        n = abs(past.delta) if past.delta is not None else None
        side = "in another iteration of" if n is None else ("behind" if (past.delta or 0) < 0 else "ahead of")
        count = f"{_iterations(n)} " if n is not None else ""
        title = (f"{who} {verb} {count}{side} {others} in {outer} ({values}): {who} {_in_collective(c, False, c.size)}, "
                 f"they {they}")  # _within reads only a class in a collective
        more = ""
        if c.collective and past.delta is not None and past.delta < 0:
            more = (f". The others passed {who}'s line in their iteration {clean(past.mine, 40)} without stopping "
                    f"there and went on into the next one, where they wait for it: {who}'s `{c.collective}` there is "
                    "a collective they did not call (one under a condition that differs between ranks)")
        return title, more
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


def ddp_next(e: StackEvidence, who: str) -> str:
    """The next step for two different collectives one of which is DDP's gradient all_reduce (a side asleep in
    autograd's backward), by what the other side is in: DDP's forward (a backward skipped), a collective inside the
    backward (a hook or an autograd Function that only some ranks' forward set up), or a collective of the job's
    (called on some ranks only)."""
    c, d = e.mine, e.theirs
    calls = "calls" if c.size == 1 else "call"
    fwd_mine = ddp_forward(c.frames) and c.collective == "broadcast"
    fwd_theirs = ddp_forward(d.frames) and d.collective == "broadcast"
    if (fwd_mine and e.theirs_backward) or (fwd_theirs and e.mine_backward):
        how = ("went on to the next forward without the backward the others are in" if fwd_mine else
               "is in its backward while the others went on to the next forward without theirs")
        return (f"find why {who} {how}: a backward skipped on some ranks only (an exception caught around the "
                "forward, a NaN/inf or empty-batch check that `continue`s before backward); every rank must run the "
                "backward of every step: decide a skip on all ranks together (all_reduce the flag) or let DDP's "
                "join() shadow the rank that stops")
    if e.theirs_backward and in_backward(c.frames):
        mine = caller(c)
        site = f", from {named(mine)}" if mine is not None else ""
        return (f"{who} {'runs' if c.size == 1 else 'run'} `{clean(c.collective or '', 40)}` inside the backward"
                f"{site}, which the others' backward does not run: the backward runs it only where the forward used "
                "that autograd Function or registered that hook (or where a counter of its own says so), so "
                "something in the forward that differs between ranks (their data, a count, a flag) decides it; make "
                "every rank of the collective's group take the same branch (or keep collectives out of the backward)")
    if e.mine_backward:
        theirs = caller(d)
        at = f" ({location(theirs)})" if theirs is not None else ""
        return (f"find the condition under which {who} {'runs its' if c.size == 1 else 'run their'} backward where "
                f"the others call `{clean(d.collective or '', 40)}`{at}: a number of forward and backward passes "
                "that differs between ranks (a token or sample budget, a count, a check on the rank's own data); "
                "decide it the same on every rank (all_reduce the condition first)")
    mine = caller(c)
    entry = _entry(c, mine) if mine is not None else None
    what = named_call(entry) if entry is not None else f"`{clean(c.collective or '', 40)}`"
    at = f" at {location(mine)}" if mine is not None else ""
    return (f"call {what}{at} on every rank or on none: {who} {calls} it (a collective) where the others run their "
            "backward, under a branch only some ranks take (`if rank == 0:`, a condition on the rank's own values)")


# A condition on who the rank is (`if rank == 0:`, `if self.is_main:`, `if dist.get_rank() == 0:`): only the ranks
# it selects run the block, so a collective inside it is one the others never call. A count of ranks (`num_ranks`,
# `world_size`) or a test for a missing value is the same on every rank: not one.
_RANK_TEST = re.compile(r"\b(?:\w+_)?rank\b|\bget_rank\s*\(|\bis_(?:main|master|chief|leader|rank_zero)\w*|"
                        r"\b\w*main_process\b", re.I)
# a script's main guard: every rank runs what is under it
_MAIN_GUARD = re.compile(r"""__name__\s*==\s*['"]__main__['"]""")
_NOT_IDENTITY = re.compile(r"\bis\s+(?:not\s+)?None\b")
_IF = re.compile(r"(?:el)?if\s+(.{1,200}?):\s*(?:#.*)?$")


def _enclosing_ifs(c: StackClass) -> Iterator[Tuple[Frame, int, str]]:
    """(frame, line, condition) of each `if`/`elif` the job's code in view places the class's path under, innermost
    first: in each job frame (innermost outward), an enclosing `if` is a line above the frame's line, indented less,
    with only deeper lines between, of the source the node read; a loop, a `with`, a `def` or an `else:` ends the
    search in that frame."""
    for f in reversed(c.frames):
        if is_library(f) or not f.source:
            continue
        lines = dict(f.source)
        here = lines.get(f.line)
        if here is None:
            continue
        indent = len(here) - len(here.lstrip())
        for n in range(f.line - 1, min(lines) - 1, -1):
            text = lines.get(n, "")
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            lead = len(text) - len(text.lstrip())
            if lead >= indent:
                continue
            m = _IF.match(text.strip())
            if m is None:
                break
            if not _MAIN_GUARD.fullmatch(m.group(1).strip()):
                yield f, n, m.group(1).strip()
            indent = lead


def rank_branch(c: StackClass) -> Optional[Tuple[Frame, int, str]]:
    """The enclosing `if` in view that tests who the rank is (_RANK_TEST), or None."""
    return next(((f, n, test) for f, n, test in _enclosing_ifs(c)
                 if _RANK_TEST.search(test) and not _NOT_IDENTITY.search(test)), None)


def under_if(c: StackClass) -> str:
    """` under `if tokens >= next_save:` (train.py:251)`: the nearest enclosing `if` in view, "" when none."""
    found = next(_enclosing_ifs(c), None)
    if found is None:
        return ""
    f, n, test = found
    return f" under `if {clean(test, 100)}:` ({location(replace(f, line=n))})"


def call_site(c: StackClass) -> str:
    """How a class came to its collective: "`broadcast` inside `ZeroRedundancyOptimizer.consolidate_state_dict` at
    train.py:178" (the library call the job made), "`all_reduce` from `clip_global_norm` (train.py:294)"."""
    name = f"`{clean(c.collective or '', 40)}`"
    mine = caller(c)
    if mine is None:
        return name
    entry = _entry(c, mine)
    if entry is not None:
        return f"{name} inside {named_call(entry)} at {location(mine)}"
    return f"{name} from {named(mine)}"
