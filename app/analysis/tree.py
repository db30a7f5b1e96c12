"""Equivalence classes and the merged prefix tree: one stack per rank, grouped by path (LLNL STAT's idea).

Built for 100k ranks: each rank's frames are read once (stacks.py) into raw groups; everything here (folding
machinery, dropping native frames, coarser identities, the tree) is done once per distinct path, not per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Dict, List, Optional, Sequence, Tuple

from app.analysis.fold import RankKey, describe_keys, label_parts, sort_key, sort_ranks
from app.analysis.frames import FrameId, fold_path, frame_id, path_collective
from app.analysis.options import AnalysisOptions
from app.analysis.stacks import raw_frame, raw_groups, selected_stacks
from app.model import Frame, RankSnapshot

_rank_of = attrgetter("rank")
_native = attrgetter("native")


@dataclass(frozen=True)
class StackClass:
    """Ranks whose (folded) paths are the same: `frames` is one member's path, outermost first."""

    index: int
    frames: Tuple[Frame, ...]
    ranks: Tuple[RankKey, ...]  # by rank number
    numbers: Tuple[Optional[int], ...]  # rank numbers, parallel to `ranks` (None: no RANK)
    who: str  # `ranks 0-6,8-15`
    nodes: str  # `node[01-04]`
    collective: Optional[str] = None  # the torch.distributed collective the path waits in

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def label(self) -> str:
        """`ranks 0-6,8-15 on node[01-04]`."""
        return f"{self.who} on {self.nodes}"


@dataclass(frozen=True)
class TreeNode:
    """One frame of the merged tree; `classes` pass through it, `ends` are the classes whose path ends here."""

    frame: Optional[Frame]  # None for the root
    count: int
    classes: Tuple[int, ...]
    ends: Tuple[int, ...] = ()
    children: Tuple["TreeNode", ...] = ()  # most ranks first
    depth: int = 0


@dataclass(frozen=True)
class StackTree:
    root: TreeNode
    classes: Tuple[StackClass, ...]
    own_depth: Dict[int, int] = field(default_factory=dict, compare=False)  # class -> depth it leaves the rest
    _labels: Dict[Tuple[int, ...], str] = field(default_factory=dict, compare=False, repr=False)

    def of(self, index: int) -> StackClass:
        """The class with that index (a tree may hold a subset of an analysis' classes)."""
        if index < len(self.classes) and self.classes[index].index == index:
            return self.classes[index]
        for c in self.classes:
            if c.index == index:
                return c
        raise KeyError(f"class {index} is not in this tree")

    def distinctive(self, index: int) -> Tuple[Frame, ...]:
        """A class's frames from where its path leaves every other class's (its last frame when none do)."""
        frames = self.of(index).frames
        depth = self.own_depth.get(index)
        return frames[depth - 1:] if depth else frames[-1:]

    def ranks(self, node: TreeNode) -> Tuple[RankKey, ...]:
        """The ranks that pass through a node (class by class, largest class first)."""
        return tuple(k for i in node.classes for k in self.of(i).ranks)

    def label(self, node: TreeNode) -> str:
        """The node's ranks folded, computed on demand (a tree of 100k ranks has many large nodes)."""
        text = self._labels.get(node.classes)
        if text is None:
            members = [self.of(i) for i in node.classes]
            if len(members) == 1:
                text = members[0].label
            else:
                text = describe_keys([k for c in members for k in c.ranks],
                                     [n for c in members for n in c.numbers])
            self._labels[node.classes] = text
        return text

    def walk(self) -> List[TreeNode]:
        """Every node, depth first, root first."""
        out: List[TreeNode] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out


@dataclass
class RawGroup:
    """Ranks whose stacks are identical frame by frame (function, file, line): the unit of all later work."""

    frames: Tuple[Frame, ...]  # a member's frames, outermost first
    kept: Tuple[int, ...]  # indices into `frames` that the folded path keeps
    ranks: List[RankSnapshot]
    stacks: List[Tuple[Frame, ...]]  # each member's own frames, innermost first (py-spy order)
    first: Tuple[bool, int, str, int] = (True, 0, "", 0)  # order key of the lowest member


@dataclass
class Grouping:
    """The classes with their raw groups (for iteration splitting), and the ranks without a stack."""

    classes: Tuple[StackClass, ...]
    groups: Tuple[Tuple[RawGroup, ...], ...]  # per class
    members: Tuple[Tuple[RankSnapshot, ...], ...]  # per class, in the class's rank order
    no_stack: Tuple[RankSnapshot, ...]


def group_stacks(ranks: Sequence[RankSnapshot], options: AnalysisOptions = AnalysisOptions()) -> Grouping:
    """Group ranks by the path of their selected thread into equivalence classes, largest first."""
    with_stack, stacks, no_stack = selected_stacks(ranks, options)
    raw = raw_groups(with_stack, stacks)

    by_path: Dict[Tuple[FrameId, ...], List[RawGroup]] = {}
    for members, stacks in raw.values():
        # the lowest rank's frames stand for the group, so the output does not depend on input order
        first = _lowest(members)
        outer = stacks[first][::-1]
        kept = fold_path(outer, native=options.native, fold_machinery=options.fold_machinery)
        if options.identity == "function+line" and not any(map(_native, outer)):
            path = tuple(map(raw_frame, map(outer.__getitem__, kept)))  # no native frame: ids are raw keys
        else:
            path = tuple(frame_id(outer[i], options.identity) for i in kept)
        by_path.setdefault(path, []).append(RawGroup(outer, kept, members, stacks, sort_key(members[first])))

    pending = []
    for path, groups in by_path.items():
        members = sort_ranks([r for g in groups for r in g.ranks])
        pending.append((path, groups, members))
    pending.sort(key=lambda p: (-len(p[2]), sort_key(p[2][0]), p[0]))

    classes, all_groups, all_members = [], [], []
    for index, (path, groups, members) in enumerate(pending):
        groups.sort(key=attrgetter("first"))
        lead = groups[0]
        frames = tuple(lead.frames[i] for i in lead.kept)
        keys = tuple(zip(map(attrgetter("node"), members), map(attrgetter("pid"), members)))
        numbers = tuple(map(attrgetter("rank"), members))
        collective, _ = path_collective(frames)
        classes.append(StackClass(index, frames, keys, numbers, *label_parts(keys, numbers), collective))
        all_groups.append(tuple(groups))
        all_members.append(tuple(members))
    return Grouping(tuple(classes), tuple(all_groups), tuple(all_members), tuple(sort_ranks(no_stack)))


def build_tree(classes: Sequence[StackClass], options: AnalysisOptions = AnalysisOptions()) -> StackTree:
    """Merge the classes' paths into one prefix tree whose nodes carry the classes (hence ranks) below them."""
    root = _Node(None)
    for c in classes:
        node = root
        node.classes.append(c.index)
        node.count += c.size
        for frame in c.frames:
            fid = frame_id(frame, options.identity)
            child = node.children.get(fid)
            if child is None:
                child = node.children[fid] = _Node(frame)
            child.classes.append(c.index)
            child.count += c.size
            node = child
        node.ends.append(c.index)
    frozen = root.freeze()
    own: Dict[int, int] = {}
    todo = [frozen]
    while todo:  # a class's own part starts at the first node it passes through alone
        at = todo.pop()
        if len(at.classes) == 1 and at.frame is not None:
            own.setdefault(at.classes[0], at.depth)
            continue
        todo.extend(at.children)
    return StackTree(frozen, tuple(classes), own)


class _Node:
    __slots__ = ("frame", "count", "classes", "ends", "children")

    def __init__(self, frame: Optional[Frame]) -> None:
        self.frame = frame
        self.count = 0
        self.classes: List[int] = []
        self.ends: List[int] = []
        self.children: Dict[FrameId, _Node] = {}

    def freeze(self) -> TreeNode:
        """The frozen tree, children before parents without recursion: a rank deep in a recursive function
        has stacks thousands of frames deep."""
        order: List[Tuple[_Node, int]] = []
        todo = [(self, 0)]
        while todo:
            node, depth = todo.pop()
            order.append((node, depth))
            todo.extend((child, depth + 1) for child in node.children.values())
        done: Dict[int, TreeNode] = {}
        for node, depth in reversed(order):
            kids = sorted(node.children.items(), key=lambda kv: (-kv[1].count, kv[0]))
            done[id(node)] = TreeNode(node.frame, node.count, tuple(node.classes), tuple(node.ends),
                                      tuple(done[id(child)] for _, child in kids), depth)
        return done[id(self)]


def _lowest(ranks: List[RankSnapshot]) -> int:
    """Index of the lowest rank (C-level keys when every rank has a number)."""
    numbers = list(map(_rank_of, ranks))
    if None not in numbers:
        low = min(numbers)
        if numbers.count(low) == 1:
            return numbers.index(low)
    keys = list(map(sort_key, ranks))
    return keys.index(min(keys))
