"""Who waits for whom (app/analysis/graph.py): per job, the culprit at the root of the wait graph, what to run
next, every "A waits for B" with its evidence and strength, and what each process in the graph is doing.

Data down: the screen gets the analysis's graphs. Result up: Enter dismisses it with the culprit's first rank,
which the app moves the grid's cursor to.
"""

from __future__ import annotations

from typing import ClassVar, List, Optional, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.analysis.graph import WaitGraph
from app.analysis.prose.graph import display_names
from app.model import RankKey
from app.ui.safe import literal
from app.ui.screens.too_small import WatchesSize

STRENGTH_STYLE = {"high": "bold #ff5f87", "medium": "#ffaf00", "low": "dim"}
MAX_EDGES = 60  # per job; the snapshot file has them all


def waits_text(graphs: Sequence[WaitGraph]) -> Text:
    """The graphs as the screen shows them (remote text through `literal`: never markup)."""
    out = Text(end="")
    shown = [g for g in graphs if g.edges or g.progressing or g.headline]
    if not shown:
        return Text("Nobody is seen waiting for anybody: no edge in the wait graph (one sample of a running job, "
                    "or nothing collected).", style="dim")
    for i, g in enumerate(shown):
        if i:
            out.append("\n\n")
        if len(shown) > 1 or g.job:
            out.append_text(literal(f"job {g.job or 'unidentified'}", 200, "bold underline"))
            out.append("\n")
        if g.progressing:
            out.append("nobody: the job is progressing between samples", style="bold #5fd75f")
            continue
        if g.headline:
            out.append("culprit" + (" (a deadlock: they wait for each other)" if g.deadlock else ""), style="bold")
            if g.confidence:
                out.append(f" [{g.confidence}]", style=STRENGTH_STYLE.get(g.confidence, ""))
            out.append(": ")
            out.append_text(literal(g.headline, 600, "bold"))
        if g.next:
            out.append("\nnext: ", style="bold")
            out.append_text(literal(g.next, 400))
        names = display_names(g.vertices)
        on_chain = set(g.chain) | set(g.root)
        edges = sorted(g.edges, key=lambda e: (e.waited not in on_chain, e.waiter not in on_chain))
        if edges:
            out.append("\n\nwaits for (evidence; strength):", style="dim")
        for e in edges[:MAX_EDGES]:
            out.append("\n  ")
            out.append_text(literal(names.get(e.waiter, e.waiter), 120, "bold" if e.waiter in on_chain else ""))
            out.append(" → ")
            out.append_text(literal(names.get(e.waited, e.waited), 120, "bold" if e.waited in on_chain else ""))
            out.append("  ")
            out.append_text(literal(f"{e.kind}: {e.evidence}", 200, "dim"))
            out.append(f"  {e.strength}", style=STRENGTH_STYLE.get(e.strength, ""))
        if len(edges) > MAX_EDGES:
            out.append(f"\n  ... {len(edges) - MAX_EDGES} more (in the snapshot file)", style="dim")
        doing = [v for v in g.vertices if v.state or v.doing]
        if doing:
            out.append("\n\nwhat each one is doing:", style="dim")
        for v in doing[:MAX_EDGES]:
            out.append("\n  ")
            out.append_text(literal(names.get(v.id, v.label), 120, "bold" if v.id in on_chain else ""))
            if v.state:
                out.append(" [")
                out.append_text(literal(v.state, 40, "bold #ff5f87"))
                out.append("]")
            if v.doing:
                out.append(" ")
                out.append_text(literal(v.doing, 200))
    return out


class WaitsScreen(WatchesSize, Screen[Optional[RankKey]]):
    BINDINGS: ClassVar[List[BindingType]] = [
        Binding("escape,q", "dismiss_none", "back"),
        Binding("enter", "go_to_culprit", "go to the culprit"),
    ]

    def __init__(self, graphs: Sequence[WaitGraph], culprit: Optional[RankKey] = None) -> None:
        """`culprit`: the analysis's culprit rank (Analysis.culprit), where Enter goes; the screen never picks one
        of its own."""
        super().__init__()
        self.graphs = tuple(graphs)
        self.culprit = culprit

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble(("who waits for whom", "bold"),
                                   ("   (the culprit is the root of the graph; Enter: go to it in the grid)",
                                    "dim")), id="waits-title")
        with VerticalScroll(id="waits-scroll"):
            yield Static(waits_text(self.graphs), id="waits-body")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#waits-scroll").focus()

    def action_dismiss_none(self) -> None:
        self.dismiss(None)

    def action_go_to_culprit(self) -> None:
        key = self.culprit
        if key is None:
            self.notify("the culprit is not a rank in the grid (a host, a missing rank or a launcher)", timeout=3)
            return
        self.dismiss(key)

