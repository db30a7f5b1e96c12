"""Side panels: equivalence classes (largest first), findings (likeliest culprit first), node status."""

from __future__ import annotations

from typing import List, Optional, Sequence

from rich.text import Text
from textual.message import Message
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from app.ui.safe import counted, literal
from app.ui.view import ClassView, FindingView, NodeGroup


class ClassesPanel(OptionList):
    """One option per class: its glyph and colour as in the grid, the rank count, the folded ranks and the
    frame it waits in. Selecting a class (Enter, click) highlights its ranks in the grid; again clears it."""

    class ClassChosen(Message):
        def __init__(self, index: Optional[int]) -> None:
            super().__init__()
            self.index = index

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.chosen: Optional[int] = None
        self.classes_shown: Sequence[ClassView] = ()

    def show(self, classes: Sequence[ClassView]) -> None:
        self.classes_shown = classes
        highlighted = self.highlighted
        self.clear_options()
        self.add_options([Option(self._prompt(c), id=f"class-{c.index}") for c in classes])
        if classes:
            self.highlighted = min(highlighted or 0, len(classes) - 1)
        if self.chosen is not None and self.chosen >= len(classes):
            self.chosen = None

    def _prompt(self, c: ClassView) -> Text:
        out = Text(end="")
        out.append(f"{c.symbol} ", style=f"bold {c.color}")
        out.append(f"{c.size} ", style="bold")
        out.append_text(literal(c.label, 200))
        if c.suspect:
            out.append("  suspect", style="bold #ff5f87")
        elif c.suspects:  # not the whole class: say how many of it
            out.append(f"  incl. {counted(c.suspects, 'suspect')}", style="bold #ff5f87")
        if c.where:
            out.append("\n  ")
            out.append_text(literal(c.where, 200, "dim"))
        return out

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        index = event.option_index
        self.chosen = None if self.chosen == index else index
        self.post_message(self.ClassChosen(self.chosen))


class FindingsPanel(OptionList):
    """Findings, most likely culprit first; selecting one moves the grid cursor to its first rank."""

    class FindingChosen(Message):
        def __init__(self, finding: FindingView) -> None:
            super().__init__()
            self.finding = finding

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.findings: Sequence[FindingView] = ()

    def show(self, findings: Sequence[FindingView]) -> None:
        self.findings = findings
        self.clear_options()
        if not findings:
            self.add_option(Option(Text("no findings yet", style="dim"), disabled=True))
            return
        self.add_options([Option(self._prompt(i, f)) for i, f in enumerate(findings)])

    @staticmethod
    def _prompt(i: int, f: FindingView) -> Text:
        out = Text(end="")
        out.append(f"{i + 1}. ", style="bold")
        out.append_text(literal(f.title, 300, "bold" if i == 0 else ""))
        if f.confidence:
            out.append(f"  ({f.confidence})", style="dim")
        if f.detail:
            out.append("\n   ")
            out.append_text(literal(f.detail, 600, "dim"))
        return out

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_index < len(self.findings):
            self.post_message(self.FindingChosen(self.findings[event.option_index]))


STATE_STYLE = {"failed": "bold #ff5f5f", "partial": "bold #ffaf00", "done": "#5fd75f"}


class NodesPanel(Static):
    """Node states aggregated: `node[03-07]: failed: ptrace denied (ptrace_scope=1)` and what to do."""

    def show(self, groups: Sequence[NodeGroup]) -> None:
        out = Text(end="")
        for i, g in enumerate(groups):
            if i:
                out.append("\n")
            out.append_text(literal(g.nodes, 120, "bold"))
            out.append(": ")
            out.append(g.state, style=STATE_STYLE.get(g.state, "italic"))
            if g.reason:
                out.append(": ")
                out.append_text(literal(g.reason, 300))
            if g.ranks:
                out.append(f"  ({counted(g.ranks, 'rank')})", style="dim")
            if g.hint:
                out.append("\n  → ", style="dim")
                out.append_text(literal(g.hint, 400, "dim"))
            for line in g.gpu:  # GPU evidence (Xid, ECC, nvidia-smi, NCCL RAS) of these nodes
                out.append("\n  gpu ", style="yellow")
                out.append_text(literal(line, 300))
        self.update(out if groups else Text("no nodes", style="dim"))


def node_summary(groups: Sequence[NodeGroup]) -> str:
    counts: dict = {}
    for g in groups:
        counts[g.state] = counts.get(g.state, 0) + g.count
    parts: List[str] = [f"{n} {state}" for state, n in counts.items()]
    return "nodes: " + ", ".join(parts) if parts else "nodes"
