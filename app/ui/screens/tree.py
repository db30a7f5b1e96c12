"""The merged stack tree (STAT-style): one prefix tree over all ranks' stacks, rank counts on each frame.

Children are added when a node is expanded, so a tree over many distinct stacks costs only what is open.
Branches (where ranks part ways) show which ranks take each side and the classes whose path ends there.
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static, Tree
from textual.widgets.tree import TreeNode as UiNode

from app.analysis.tree import StackTree, TreeNode
from app.ui.safe import literal
from app.ui.screens.too_small import WatchesSize

AUTO_OPEN = 300  # nodes opened at start: the whole tree when small, the top of it when not


class TreeScreen(WatchesSize, Screen[None]):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("e", "expand_all", "expand all"),
        Binding("c", "collapse_all", "collapse all"),
    ]

    def __init__(self, tree: StackTree, title: str, symbols: Sequence[str]) -> None:
        super().__init__()
        self.stack_tree = tree
        self.title_text = title
        self.symbols = list(symbols)

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble(("merged stacks of ", ""), literal(self.title_text, 200, "bold"),
                                   ("   (count: ranks through the frame; Enter/space opens and closes)", "dim")),
                     id="tree-title")
        root = self.stack_tree.root
        widget: Tree[TreeNode] = Tree(self._label(root, None), data=root, id="stack-tree")
        widget.guide_depth = 3
        yield widget
        yield Footer()

    def on_mount(self) -> None:
        widget = self.query_one("#stack-tree", Tree)
        self._fill(widget.root)
        budget = AUTO_OPEN
        queue = [widget.root]
        while queue and budget > 0:
            node = queue.pop(0)
            node.expand()
            self._fill(node)
            budget -= len(node.children)
            queue.extend(node.children)
        widget.focus()

    def _fill(self, ui: UiNode) -> None:
        data: TreeNode = ui.data  # type: ignore[assignment]
        if ui.children or not data.children:
            return
        branch = len(data.children) > 1
        for child in data.children:
            ui.add(self._label(child, data if branch else None), data=child, allow_expand=bool(child.children))

    def on_tree_node_expanded(self, event: Tree.NodeExpanded) -> None:
        self._fill(event.node)

    def _label(self, node: TreeNode, branch_of: object) -> Text:
        out = Text(no_wrap=True, end="")
        out.append(f"{node.count:>6} ", style="bold")
        if node.frame is None:
            out.append("all stacks", style="bold")
        else:
            f = node.frame
            out.append_text(literal(f.function, 80, "#87afd7" if f.native else "bold"))
            out.append(" ")
            out.append_text(literal(f.location, 80, "dim"))
        if branch_of is not None or node.frame is None:
            out.append("  ")
            out.append_text(literal(self.stack_tree.label(node), 120, "italic"))
        if node.ends:
            marks = " ".join(self.symbols[i] if i < len(self.symbols) else "?" for i in node.ends)
            out.append(f"  ◂ {marks}", style="#ffaf00")
        return out

    def action_expand_all(self) -> None:
        widget = self.query_one("#stack-tree", Tree)
        queue = [widget.root]
        opened = 0
        while queue and opened < 20000:  # a bound: a pathological tree must not freeze the screen
            node = queue.pop()
            self._fill(node)
            node.expand()
            opened += 1
            queue.extend(node.children)

    def action_collapse_all(self) -> None:
        widget = self.query_one("#stack-tree", Tree)
        widget.root.collapse_all()
        widget.root.expand()
