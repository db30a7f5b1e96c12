"""Moving around the app: marks, drill-down, diff, tree, who waits for whom, history, panels, help and quitting."""

from __future__ import annotations

from typing import Optional

from app.analysis.diff import diff_ranks, diff_vs_majority
from app.analysis.processes import rank_family
from app.analysis.tree import build_tree
from app.gpu.model import GpuTestResults
from app.model import RankKey, RankSnapshot
from app.ui.core import HangscopeCore
from app.ui.grid_model import rank_key
from app.ui.screens.dialogs import HelpScreen
from app.ui.screens.diff import DiffScreen
from app.ui.screens.drill import DrillScreen
from app.ui.screens.gpu import GpuTests
from app.ui.screens.tree import TreeScreen
from app.ui.screens.waits import WaitsScreen


class NavigateMixin(HangscopeCore):
    _gpu_tests: Optional[GpuTests] = None  # created on first use: the running GPU test and the last results

    # -- marks -----------------------------------------------------------------------------------------

    def action_toggle_mark(self) -> None:
        rank = self.current_rank()
        if rank is None:
            return
        key = rank_key(rank)
        self.marked.symmetric_difference_update({key})
        self.main.grid.set_marked(self.marked)
        self._update_topbar()  # shows how many are marked

    def action_clear_marks(self) -> None:
        self.marked.clear()
        self.main.grid.set_marked(self.marked)
        self._update_topbar()

    # -- drill-down ------------------------------------------------------------------------------------

    def action_drill(self) -> None:
        rank = self.current_rank()
        if rank is not None:
            self.open_drill(rank)

    def open_drill(self, rank: RankSnapshot) -> None:
        view = self.current_view
        self.push_screen(DrillScreen(rank, self.drill_summary(rank),
                                     view is not None and view.snapshot.options.locals,
                                     rank_family(view.snapshot, rank) if view is not None else ()))
        self.fetch_detail(rank_key(rank))

    # -- diff and tree ---------------------------------------------------------------------------------

    def action_diff(self) -> None:
        view = self.current_view
        if view is None:
            return
        marked = [k for k in view.ranks if k in self.marked]
        try:
            if len(marked) == 2:
                diff = diff_ranks(view.snapshot, marked[0], marked[1], view.analysis.options)
            else:
                rank = self.current_rank()
                if rank is None:
                    return
                if len(marked) not in (0, 1):
                    self.notify(f"{len(marked)} ranks are marked; diffing this rank against its class majority")
                diff = diff_vs_majority(view.snapshot, view.analysis, rank_key(rank))
        except KeyError:
            self.notify("nothing to compare with: no other rank has a stack", severity="warning")
            return
        self.push_screen(DiffScreen(diff))

    def action_tree(self) -> None:
        view = self.current_view
        if view is None or not view.analysis.classes:
            self.notify("no stacks to merge yet", severity="warning")
            return
        chosen = self.main.classes_panel.chosen
        if chosen is not None and chosen < len(view.analysis.classes):
            tree = build_tree([view.analysis.classes[chosen]], view.analysis.options)
            title = f"class {chosen + 1}: {view.classes[chosen].label}"
        else:
            tree = view.analysis.tree
            n = len(view.snapshot.ranks)
            title = f"all {n} ranks" if n != 1 else "the only rank"
        self.push_screen(TreeScreen(tree, title, [c.symbol for c in view.classes]))

    def action_waits(self) -> None:
        view = self.current_view
        if view is None:
            self.notify("no snapshot yet", severity="warning")
            return
        culprit = view.analysis.culprit
        first = next((k for k in culprit.ranks if k in view.class_of), None) if culprit is not None else None
        self.push_screen(WaitsScreen(view.analysis.waits, first), callback=self._go_to_rank)

    def _go_to_rank(self, key: Optional[RankKey]) -> None:
        if key is not None and self.screen is self.main:
            if self.main.grid.move_to(key):
                self.main.grid.focus()
            else:
                self.notify("that rank is not in the grid (filtered out?)", timeout=3)

    # -- history ---------------------------------------------------------------------------------------

    def action_history(self, step: int) -> None:
        if not self.history:
            return
        target = max(0, min(self.position + step, len(self.history) - 1))
        if target == self.position:
            self.notify("no older snapshot" if step < 0 else "this is the newest snapshot", timeout=2)
            return
        self.position = target
        self.follow = target == len(self.history) - 1
        self.show_position()

    # -- panels, help, quit ----------------------------------------------------------------------------

    def action_focus_panel(self, name: str) -> None:
        if self.screen is self.main:
            self.main.action_focus_panel(name)

    def action_filter(self) -> None:
        if self.screen is not self.main:
            self.pop_screen()  # from the palette on another screen: the filter lives on the main screen
        if self.screen is self.main:
            self.main.action_filter()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    @property
    def gpu_tests(self) -> GpuTests:
        if self._gpu_tests is None:
            self._gpu_tests = GpuTests(self, on_results=self._keep_gpu_results)
        return self._gpu_tests

    def _keep_gpu_results(self, results: GpuTestResults) -> None:
        self.gpu_results = results  # exported with the report

    def action_gpu_tests(self) -> None:
        tests = self.gpu_tests
        if tests.running:
            tests.show_progress()
            return
        tests.open(self.source.gpu_access(), self.current_view, set(self.marked))

    def action_gpu_results(self) -> None:
        self.gpu_tests.show_results()

    async def on_unmount(self) -> None:
        # Textual calls every class's handler: this one runs next to CollectMixin's (which closes the source).
        if self._gpu_tests is not None:
            await self._gpu_tests.close()

    def action_quit_app(self) -> None:
        self.exit(return_code=self.exit_code())

    def exit_code(self) -> int:
        """0 when the newest snapshot has every rank, 1 when it is partial (or nothing was collected)."""
        if not self.history:
            return 1
        snap = self.history[-1]
        return 0 if snap.complete and snap.ranks else 1
