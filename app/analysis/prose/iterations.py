"""Sentences for loop iterations (iterations.py's facts): ranks ahead or behind on the same line, loops run in
another order, and loop variables that could not be read."""

from __future__ import annotations

from typing import Optional, Tuple

from app.analysis.facts import Fact
from app.analysis.fold import brief
from app.analysis.frames import clean
from app.analysis.iterations import IterationEvidence, NoLocalsEvidence, _show, loop_of
from app.model import Frame

Text = Tuple[str, str, str]
MAX_VALUE = 60


def loop_place(frame: Frame, name: Optional[str]) -> str:
    """` at train.py:57 `for step, batch in enumerate(loader)`` (the loop header), or the frame's place."""
    loop = loop_of(frame, name) if name else None
    short = clean(frame.filename.rsplit("/", 1)[-1] or "?", 80)
    if loop is None:
        return f" at {short}:{frame.line}"
    return f" at {short}:{loop.line} `{clean(loop.header.strip().rstrip(':'), 100)}`"


def iteration_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, IterationEvidence)
    split, major = e.split, e.major
    if e.many or e.group is None:
        spread = "; ".join(f"{_show(g.coordinate, split.varying)}: {g.who}" for g in split.groups[:10])
        return (f"ranks on one stack are spread over {len(split.groups)} iterations",
                spread + ("; ..." if len(split.groups) > 10 else ""),
                "many iterations at once: the ranks may still be moving, not hung")
    g = e.group
    others = len(major.ranks)
    who = brief(g.who, len(g.ranks))
    verb = "is" if len(g.ranks) == 1 else "are"
    name, mine, theirs, frame = e.name, e.mine, e.theirs, e.frame
    at = loop_place(frame, name) if frame is not None else ""
    if e.collective:
        at = f" in `{e.collective}`," + at if at else f" in `{e.collective}`"
    delta = e.delta
    if name is None:
        title = f"{who} {verb} in another iteration than {others} others ({_show(g.coordinate, ())})"
    elif delta is not None:
        steps = f"{abs(delta)} iteration{'s' if abs(delta) != 1 else ''}"
        title = (f"{who} {verb} {steps} {'ahead' if delta > 0 else 'behind'} "
                 f"({name}={clean(mine, MAX_VALUE)} vs {clean(theirs, MAX_VALUE)}){at}")
    else:
        title = (f"{who} {'has' if len(g.ranks) == 1 else 'have'} {name}={clean(mine, MAX_VALUE)} where "
                 f"{others} others have {name}={clean(theirs, MAX_VALUE)}{at}")
    detail = (f"same stack as {major.label}, another loop iteration: {split.text()}. Collectives are matched "
              "by order, so a rank one iteration off pairs its collective with the wrong one of the others")
    if e.order is not None:
        seq, mine_seq, theirs_seq = e.order
        title = (f"{who} iterate{'s' if len(g.ranks) == 1 else ''} `{clean(seq, 80)}` in another order than {others} "
                 f"others: {name}={clean(mine, MAX_VALUE)} where they have {name}={clean(theirs, MAX_VALUE)}{at}")
        detail = (f"same stack as {major.label}, but the iteration order differs: `{clean(seq, 80)}` is "
                  f"{clean(mine_seq, 160)} on {g.who} and {clean(theirs_seq, 160)} on {major.who}, the same "
                  "elements in another order. Each rank issues one collective per element, in its own order, so "
                  "they wait in different collectives and none completes. Iterate in one order on every rank "
                  "(sorted(), not a set's or a dict's order, which can differ between processes)")
        reason = ("identical stacks; the sequence the loop runs over holds the same elements in another order on "
                  "these ranks" if f.strength == "high" else
                  "the sequence's order differs, but the groups are close in size")
    elif len(g.ranks) == others:
        reason = "the groups are the same size: either may be the odd one"
    elif delta is not None and len(g.ranks) * 3 <= others:
        reason = "identical stacks, and a loop counter puts these few ranks in another iteration"
    else:
        reason = "identical stacks, but the loop values differ in a way that is hard to rank"
    return title, detail + ".", reason


def no_locals_text(f: Fact) -> Text:
    e = f.data
    assert isinstance(e, NoLocalsEvidence)
    split = e.split
    loop_frame = next((fr for fr in split.loops if fr.loops), None)
    loop = loop_frame.loops[0] if loop_frame is not None else None
    where = f" (`{clean(loop.header.strip().rstrip(':'), 100)}`)" if loop else ""
    if e.collected:
        detail = f"the path of {e.label} runs in loops{where}, but no loop variable had a readable value"
        if loop_frame is not None and loop_frame.function == "<module>":
            if loop_frame.locals:  # a <module> frame's locals: its globals, read from the rank's memory
                detail += ("; the loop runs at module level: its globals were read from the rank's memory, but none "
                           "holds a value that compares across ranks (a number, a short string)")
            else:
                detail += ("; the loop runs at module level, where its counters are globals of __main__, which "
                           "py-spy's --locals does not show: the worker reads them from the rank's memory, and could "
                           "not here (a rank in a container; a stopped, frozen or D-state process; an interpreter "
                           "build it cannot read; an older worker); the counters between samples (CPU, socket "
                           "bytes) tell whether ranks move")
        return ("loop iterations unknown: the loop variables were not readable", detail + ".",
                "locals were collected; an iteration difference between ranks cannot show")
    detail = (f"the path of {e.label} runs in loops{where}; run with --locals to tell loop iterations apart "
              "(ranks one iteration apart show identical stacks)")
    return ("loop iterations unknown: run with --locals", detail + ".",
            "without loop variable values, identical stacks may hide an iteration difference")
