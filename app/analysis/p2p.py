"""Point-to-point waits: a rank blocked in send/recv names its peer in the call's arguments.

torch.distributed's `send(tensor, dst)`, `recv(tensor, src)` (and isend/irecv, the *_object_list forms) carry
the peer's global rank as a local of their frame, which `--locals` reads. A rank in `recv(src=3)` waits for
rank 3; it stops waiting when rank 3 is in the matching `send(dst=it)`. An unmatched call is an edge of the
wait graph (app/analysis/graph.py): two ranks each waiting for the other (both in recv from each other, or one
in recv while its peer waits in a collective the first has not joined) are deadlocked.

Only ranks whose path waits in a point-to-point call are read (one frame's locals each), so a job of
collectives costs nothing here.
"""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from app.analysis.facts import Evidence, Fact, ranks_who
from app.analysis.fold import RankKey
from app.analysis.frames import DEF_LINE, bare_name, handle_wait, is_library
from app.analysis.tree import StackClass
from app.model import Frame, RankSnapshot

P2P = frozenset({"send", "recv", "send/recv"})


class CallRead(NamedTuple):
    """What a rank's send or receive says: its op, the peer its arguments name (None: not readable), the peer's
    argument as written (`src=3`), the frame, the tag's value when readable, and the tag as written."""

    op: str
    peer: Optional[int]
    argument: str
    frame: Frame
    tag: str = ""
    tag_text: str = ""
_SENDS = frozenset({"send", "isend", "send_object_list"})
_RECVS = frozenset({"recv", "irecv", "recv_object_list"})
_PEER_LOCALS = {"send": ("dst", "group_dst", "peer"), "recv": ("src", "group_src", "peer")}
_INT = re.compile(r"-?\d{1,9}")
MAX_READ = 4096  # ranks whose locals are read (a pipeline of 100k ranks: the first few thousand tell)


@dataclass(frozen=True)
class P2PCall:
    """One rank blocked in a point-to-point call, with the peer its arguments name (None: not readable)."""

    key: RankKey
    rank: Optional[int]
    op: str  # "send" or "recv"
    peer: Optional[int]
    argument: str  # `src=3`, or "" when the peer is unknown
    frame: Frame  # the torch.distributed frame of the call (of a handle's wait: the frame waiting on it)
    tag: str = ""  # the message tag's value, when readable (a send meets only a recv of the same tag)
    tag_text: str = ""  # ... as the call writes it (`global_step`)
    loop: str = ""  # the innermost loop of the job's code around the call, with its value: "`for i in range(n)` (i=3)"
    outer: Tuple[Tuple[str, str], ...] = ()  # the outermost loop coordinate of its stack (("step", "6"),)

    def text(self) -> str:
        return f"{self.op}({self.argument})" if self.argument else self.op


def rank_call(r: RankSnapshot) -> Optional[CallRead]:
    """The send or receive a rank's main thread waits in, read with its own number and the world's size."""
    t = r.main_thread
    return frames_call(t.frames, r.rank, r.world_size) if t is not None else None


def class_call(c: StackClass, ranks: Optional[Mapping[RankKey, RankSnapshot]] = None
               ) -> Optional[CallRead]:
    """The send or receive a class waits in: its first rank's own call when the ranks are given (a peer written
    as `(rank + 1) % world` is that rank's), else its path's: op, peer, argument, frame."""
    r = ranks.get(c.ranks[0]) if ranks is not None and c.ranks else None
    if r is not None:
        return rank_call(r)
    return frames_call(tuple(reversed(c.frames)))


# A peer written in terms of the rank's own number and the world's size: a ring's neighbours, `(rank + 1) % world`,
# `dist.get_rank() - 1`. Only these names, integers and + - * // % are read; anything else is not a number here.
_RANK_NAMES = frozenset({"rank", "global_rank", "get_rank"})
_WORLD_NAMES = frozenset({"world", "world_size", "get_world_size"})
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod}
MAX_EXPRESSION = 120


def rank_expression(text: str, rank: Optional[int], world: Optional[int]) -> Optional[int]:
    """The value of a peer's expression over the rank's number and the world's size, or None."""
    if len(text) > MAX_EXPRESSION:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None

    def value(n: ast.AST) -> Optional[int]:
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return n.value
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if isinstance(n, ast.Call) and not n.args and not n.keywords and isinstance(n.func, (ast.Name, ast.Attribute)):
            name = n.func.id if isinstance(n.func, ast.Name) else n.func.attr
            name = name if name in ("get_rank", "get_world_size") else None
        elif name in ("get_rank", "get_world_size"):
            name = None  # the function itself, not its value
        if name in _RANK_NAMES:
            return rank
        if name in _WORLD_NAMES:
            return world
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            v = value(n.operand)
            return None if v is None else (-v if isinstance(n.op, ast.USub) else v)
        if isinstance(n, ast.BinOp) and type(n.op) in _BINARY:
            a, b = value(n.left), value(n.right)
            if a is None or b is None or (isinstance(n.op, (ast.FloorDiv, ast.Mod)) and b == 0) or abs(a) > 1 << 24 \
                    or abs(b) > 1 << 24:
                return None
            return _BINARY[type(n.op)](a, b)
        return None

    return value(tree.body)


def frames_call(frames: Sequence[Frame], rank: Optional[int] = None, world: Optional[int] = None
                ) -> Optional[CallRead]:
    """The send or receive frames (innermost first) wait in: op, the peer its arguments name (None: not
    readable), the argument as written, and the frame. `rank`, `world`: the rank's number and the world's size,
    for a peer written in their terms."""
    # innermost first: the public API frame (the call the user made) is the outermost matching one
    found: Optional[Tuple[str, Frame]] = None
    for f in frames:
        if f.native or "torch/distributed/" not in f.filename.replace("\\", "/"):
            continue
        name = bare_name(f.function)
        if name in _SENDS:
            found = ("send", f)
        elif name in _RECVS:
            found = ("recv", f)
    if found is None:
        return _handle_call(frames, rank, world)
    op, frame = found
    tag = next((x.repr.strip() for x in frame.locals if x.name == "tag" and _INT.fullmatch(x.repr.strip())), "")
    for want in _PEER_LOCALS[op]:
        for local in frame.locals:
            if local.name == want and _INT.fullmatch(local.repr.strip()):
                if want.startswith("group_"):  # a rank of the group, not the global rank: say so, no edge
                    return CallRead(op, None, f"{want}={local.repr.strip()}", frame, tag, "tag" if tag else "")
                return CallRead(op, int(local.repr.strip()), f"{want}={local.repr.strip()}", frame, tag,
                                "tag" if tag else "")
    return CallRead(op, None, "", frame, tag, "tag" if tag else "")


# The peer of a send or receive made for a handle (`P2POp(dist.isend, t, peer, group=g)`, `dist.irecv(t, src=2)`),
# read from the source the node sent: the argument's position or keyword, by the call's name
_MAKERS = {"P2POp": (2, ("peer", "group_peer")), "isend": (1, ("dst", "group_dst")), "irecv": (1, ("src", "group_src")),
           "send": (1, ("dst", "group_dst")), "recv": (1, ("src", "group_src"))}
_TAG_AT = {"P2POp": 4, "isend": 3, "irecv": 3, "send": 3, "recv": 3}  # the tag's position: (op,) tensor, peer, group, tag
_MAKER_CALL = re.compile(r"\b(P2POp|isend|irecv|send|recv)\s*\(")
_P2P_OP = re.compile(r"\b(isend|irecv)\b")


def _arguments(text: str, start: int) -> List[str]:
    """The top-level arguments of the call whose `(` is at text[start - 1], as written (up to the line's end)."""
    out: List[str] = []
    cur: List[str] = []
    depth = 0
    for ch in text[start:]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _handle_call(frames: Sequence[Frame], rank: Optional[int] = None, world: Optional[int] = None
                 ) -> Optional[CallRead]:
    """A rank waiting on a send/recv handle (frames.handle_wait): its op and peer from the calls that made it, in
    its frame's source. Of a batch that both sends and receives, the receive is what it waits for (a send's data
    leaves when the socket takes it; what comes in needs the peer)."""
    frame = next((f for f in frames if not f.native), None)  # innermost Python frame
    found = handle_wait(frame) if frame is not None else None
    if frame is None or found is None or found.op not in P2P:
        return None
    lines = dict(frame.source)
    made: List[Tuple[str, str, str, str]] = []  # (op, keyword or "", peer expression, tag expression or "")
    for n in range(found.maker_line, 0, -1):
        code = lines.get(n)
        if code is None:
            break
        code = code.split("#", 1)[0]
        for m in _MAKER_CALL.finditer(code):
            name = m.group(1)
            args = _arguments(code, m.end())
            if name == "P2POp":
                kind = _P2P_OP.search(args[0]) if args else None
                if kind is None:
                    continue
                op = "send" if kind.group(1) == "isend" else "recv"
            else:
                op = "send" if name in ("isend", "send") else "recv"
            position, keywords = _MAKERS[name]
            keyword, peer = next(((kw, a.split("=", 1)[1].strip()) for a in args for kw in keywords
                                  if re.match(rf"{kw}\s*=(?!=)", a)), (keywords[0], None))
            if peer is None and len(args) > position and "=" not in args[position]:
                peer = args[position]
            tag = next((a.split("=", 1)[1].strip() for a in args if re.match(r"tag\s*=(?!=)", a)), None)
            if tag is None and len(args) > _TAG_AT[name] and "=" not in args[_TAG_AT[name]]:
                tag = args[_TAG_AT[name]]
            if peer:
                made.append((op, keyword, peer, tag or ""))
        if n < found.maker_line and DEF_LINE.match(code):
            break
    if not made:
        return CallRead("send" if found.op == "send" else "recv", None, "", frame)
    op, keyword, expr, tag_expr = next((x for x in made if x[0] == "recv"), made[0])
    tag = _local_int(tag_expr, frame) or "" if tag_expr else ""
    value = _local_int(expr, frame)
    if value is None and not keyword.startswith("group_"):
        computed = rank_expression(expr, rank, world)
        value = str(computed) if computed is not None else None
    argument = f"{keyword}={expr}" if value is None or value == expr else \
        f"{keyword}={value}" if expr == keyword else f"{keyword}={expr}={value}"
    if value is None or keyword.startswith("group_"):
        return CallRead(op, None, argument, frame, tag, tag_expr)  # not readable, or a group's rank: no edge
    return CallRead(op, int(value), argument, frame, tag, tag_expr)


def _local_int(expr: str, frame: Frame) -> Optional[str]:
    """An integer written as one, or the frame's local of that name when it holds one."""
    if _INT.fullmatch(expr):
        return expr
    return next((x.repr.strip() for x in frame.locals if x.name == expr and _INT.fullmatch(x.repr.strip())), None)



def p2p_calls(ranks: Sequence[RankSnapshot], classes: Sequence[StackClass],
              by_key: Optional[Dict[RankKey, RankSnapshot]] = None) -> List[P2PCall]:
    """The ranks of classes that wait in send/recv, each with its peer from the call's locals."""
    wanted = [k for c in classes if c.collective in P2P for k in c.ranks]
    if not wanted:
        return []
    lookup = by_key if by_key is not None else {(r.node, r.pid): r for r in ranks}
    out = []
    for k in wanted[:MAX_READ]:
        r = lookup.get(k)
        if r is None:
            continue
        call = rank_call(r)
        if call is not None:
            loop, outer = _loops(r)
            out.append(P2PCall(k, r.rank, call.op, call.peer, call.argument, call.frame, call.tag, call.tag_text,
                               loop, outer))
    return out


def _loops(r: RankSnapshot) -> Tuple[str, Tuple[Tuple[str, str], ...]]:
    """Where in its loops a rank's call stands: the innermost loop of the job's code (header and value) and the
    outermost frame's loop coordinate, for telling two ranks of one exchange apart (one in its backwards, the other
    still in its forwards; one a step ahead)."""
    t = r.main_thread
    # a loop over the handles being waited on (`for w in works: w.wait()`) says nothing of where the rank is
    frames = [f for f in (t.frames if t is not None else ()) if not is_library(f) and f.loops
              and handle_wait(f) is None]
    if not frames:
        return "", ()
    inner = frames[0]
    loop = inner.loops[-1]
    names = loop.variables + loop.counters
    values = ", ".join(f"{n}={v}" for n, v in inner.iteration if n in names)
    text = f"`{loop.header.rstrip(':').strip()}` ({inner.location}{'; ' + values if values else ''})"
    outer = next((f.iteration for f in reversed(frames) if f.iteration), ())
    return text, outer


def matched(a: P2PCall, b: Optional[P2PCall]) -> bool:
    """Whether b is the call that completes a: a send to it against its recv from a, or the other way."""
    if b is None or a.peer is None or b.peer is None:
        return False
    return a.op != b.op and a.peer == b.rank and b.peer == a.rank


def cycles(calls: Sequence[P2PCall]) -> List[List[P2PCall]]:
    """Cycles of unmatched point-to-point waits: rank a waits for b, b for ..., back to a."""
    by_rank = {c.rank: c for c in calls if c.rank is not None}
    nxt: Dict[int, int] = {}
    for c in calls:
        if c.rank is None or c.peer is None or c.peer not in by_rank or matched(c, by_rank[c.peer]):
            continue
        nxt[c.rank] = c.peer
    out: List[List[P2PCall]] = []
    done: set = set()
    for start in sorted(nxt):
        path: List[int] = []
        at: Optional[int] = start
        while at is not None and at in nxt and at not in path and at not in done:
            path.append(at)
            at = nxt[at]
        if at is not None and at in path:
            ring = path[path.index(at):]
            out.append([by_rank[x] for x in ring])
        done.update(path)
    return out


@dataclass(frozen=True)
class P2PEvidence(Evidence):
    """Unmatched point-to-point calls: a cycle of ranks each waiting for the next, or one call whose peer is
    elsewhere (`peer_class`: the class the peer's stack is in)."""

    ring: Tuple[P2PCall, ...] = ()
    call: Optional[P2PCall] = None
    peer_class: Optional[StackClass] = None
    # pairs whose peers and directions match but whose tags differ (a send meets only a recv of its tag), each
    # pair's two calls in turn; `usual`: the tag most of the waiting calls carry, when one does
    tags: Tuple[P2PCall, ...] = ()
    usual: str = ""


def tag_mismatches(calls: Sequence[P2PCall]) -> List[Tuple[P2PCall, P2PCall]]:
    """Pairs of waiting calls that name each other, one sending and one receiving, with different tags: each is
    the other's match but for the tag, so neither completes."""
    by_rank = {c.rank: c for c in calls if c.rank is not None}
    out = []
    for a in calls:
        b = by_rank.get(a.peer) if a.peer is not None else None
        if b is not None and a.rank is not None and b.rank is not None and a.rank < b.rank and matched(a, b) \
                and a.tag and b.tag and a.tag != b.tag:
            out.append((a, b))
    return out


def _tag_fact(calls: Sequence[P2PCall]) -> Optional[Fact]:
    """The ranks whose tag differs from the one most waiting calls carry, in the pairs that differ only in it.
    [high] when one tag is the most common and the odd ranks are fewer than those carrying it; else every rank of
    those pairs, [medium]."""
    pairs = tag_mismatches(calls)
    if not pairs:
        return None
    counts = Counter(c.tag for c in calls if c.tag).most_common()
    usual = counts[0][0] if len(counts) == 1 or counts[0][1] > counts[1][1] else ""
    members = sorted({c.rank: c for pair in pairs for c in pair}.values(), key=lambda c: c.rank or 0)
    odd = [c for c in members if usual and c.tag != usual] or members
    sure = bool(usual) and len(odd) < counts[0][1]
    return Fact("p2p_wait", ranks_who(tuple(c.key for c in odd), tuple(c.rank for c in odd)),
                "high" if sure else "medium",
                P2PEvidence(tags=tuple(c for pair in pairs for c in pair), usual=usual))


def p2p_facts(calls: Sequence[P2PCall], class_of: Dict[int, StackClass]) -> List[Fact]:
    """A deadlock of point-to-point calls, said as such; else each unmatched call's wait for a peer that is
    elsewhere (`class_of`: rank number -> the stack class of that rank, for the peers not in a p2p call)."""
    out: List[Fact] = []
    in_cycle: set = set()
    for ring in cycles(calls):
        in_cycle.update(c.rank for c in ring)
        out.append(Fact("p2p_wait", ranks_who(tuple(c.key for c in ring), tuple(c.rank for c in ring)), "high",
                        P2PEvidence(ring=tuple(ring))))
    tagged = _tag_fact(calls)
    if tagged is not None:
        out.append(tagged)
    by_rank = {c.rank: c for c in calls if c.rank is not None}
    for c in calls:
        if c.rank in in_cycle or c.peer is None or c.peer in by_rank:
            continue  # a peer in a p2p call of its own: matched, or part of a chain its own wait explains
        elsewhere = class_of.get(c.peer)
        if elsewhere is None:
            continue
        out.append(Fact("p2p_wait", ranks_who((c.key,), (c.rank,)), "medium",
                        P2PEvidence(call=c, peer_class=elsewhere)))
    return out
