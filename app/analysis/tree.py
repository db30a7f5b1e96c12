"""Equivalence classes and the merged prefix tree: one stack per rank, grouped by path (LLNL STAT's idea).

Built for 100k ranks: ranks are grouped by their threads' interned paths (stacks.py) into raw groups, and are
ordered and named from the rank columns (columns.py); everything here (folding machinery, dropping native
frames, coarser identities, the tree) is done once per distinct path, not per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Dict, List, Optional, Sequence, Tuple

from app.analysis.columns import Facts, facts_of
from app.analysis.fold import RankKey, describe_keys, label_parts, lowest_position, position_key, sort_positions
from app.analysis.fold import sort_ranks
from app.analysis.frames import FrameId, fold_path, frame_id, path_collective
from app.analysis.options import AnalysisOptions
from app.analysis.stacks import Part, Selected, raw_frame, raw_groups, selected_stacks
from app.model import Frame, RankSnapshot, ThreadStack

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
    """Ranks whose stacks are identical frame by frame (function, file, line): the unit of all later work.
    Members are positions in the snapshot's ranks; Grouping.thread(i) is a member's selected thread, with its
    own frames (locals, iteration values)."""

    frames: Tuple[Frame, ...]  # the lowest member's frames, outermost first
    kept: Tuple[int, ...]  # indices into `frames` that the folded path keeps
    at: List[int]  # the members' positions in the snapshot, ascending
    parts: List[Part]  # the members by path object (ThreadStack.path, which holds loop iteration values)
    first: Tuple[bool, int, str, int] = (True, 0, "", 0)  # order key of the lowest member


@dataclass
class Grouping:
    """The classes with their raw groups (for iteration splitting), and the ranks without a stack."""

    classes: Tuple[StackClass, ...]
    groups: Tuple[Tuple[RawGroup, ...], ...]  # per class
    at: Tuple[Tuple[int, ...], ...]  # per class: its members' positions in the snapshot, in the class's order
    no_stack: Tuple[RankSnapshot, ...]
    ranks: Sequence[RankSnapshot] = ()  # the ranks the positions refer to
    selected: Optional[Selected] = None

    def members(self, index: int) -> Tuple[RankSnapshot, ...]:
        """A class's ranks, in the class's rank order."""
        return tuple(map(self.ranks.__getitem__, self.at[index]))

    def thread(self, i: int) -> ThreadStack:
        """The selected thread of the rank at position i, when it has a stack."""
        assert self.selected is not None
        return self.selected.thread(i)


def group_stacks(ranks: Sequence[RankSnapshot], options: AnalysisOptions = AnalysisOptions(),
                 known: Optional[Facts] = None) -> Grouping:
    """Group ranks by the path of their selected thread into equivalence classes, largest first. `known`: the
    ranks' columns when the caller has read them already."""
    f = facts_of(ranks, known)
    numbers, keys = f.rank, f.key
    selected = selected_stacks(ranks, f.threads, options)

    by_path: Dict[Tuple[FrameId, ...], List[RawGroup]] = {}
    for parts in raw_groups(selected.at, selected.paths).values():
        at = parts[0][1] if len(parts) == 1 else sorted(chain.from_iterable(p[1] for p in parts))
        # the lowest rank's frames stand for the group, so the output does not depend on input order
        first = lowest_position(at, numbers, keys)
        outer = selected.thread(first).frames[::-1]
        kept = fold_path(outer, native=options.native, fold_machinery=options.fold_machinery)
        if options.identity == "function+line" and not any(map(_native, outer)):
            path = tuple(map(raw_frame, map(outer.__getitem__, kept)))  # no native frame: ids are raw keys
        else:
            path = tuple(frame_id(outer[i], options.identity) for i in kept)
        by_path.setdefault(path, []).append(RawGroup(outer, kept, at, parts, position_key(numbers, keys, first)))

    pending = []
    for path, groups in by_path.items():
        at = groups[0].at if len(groups) == 1 else [i for g in groups for i in g.at]
        in_order = sort_positions(at, numbers, keys)
        pending.append((path, groups, in_order, position_key(numbers, keys, in_order[0])))
    pending.sort(key=lambda p: (-len(p[2]), p[3], p[0]))

    classes, all_groups, all_at = [], [], []
    for index, (_path, groups, in_order, _) in enumerate(pending):
        groups.sort(key=attrgetter("first"))
        lead = groups[0]
        frames = tuple(lead.frames[i] for i in lead.kept)
        collective, _ = path_collective(frames)
        class_keys = tuple(map(keys.__getitem__, in_order))
        class_numbers = tuple(map(numbers.__getitem__, in_order))
        classes.append(StackClass(index, frames, class_keys, class_numbers, *label_parts(class_keys, class_numbers),
                                  collective))
        all_groups.append(tuple(groups))
        all_at.append(tuple(in_order))
    return Grouping(tuple(classes), tuple(all_groups), tuple(all_at), tuple(sort_ranks(selected.no_stack)), ranks,
                    selected)


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
