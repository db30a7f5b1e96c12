"""Benchmark: how long the TUI takes to show a cursor move on grids of 128 to 16,384 ranks; prints a table.

Runs the real HangscopeApp headless (Textual's test driver, no terminal) on snapshots built in code. For each
key press it measures, on the wall clock, from the key event entering the app to the frame being written:
  cursor  the frame that shows the grid's cursor on its new cell,
  status  the frame whose status line names the new rank (one message later),
and, for the same moves, the lines the grid re-rendered.
Key-to-frame includes waiting for Textual's next screen update (at most 1/60 s at the default 60 fps).

    python3 bench/tui_grid.py             # the table; --moves N, --sizes 160x50,80x24
    python3 bench/tui_grid.py --fps 1000  # frames as fast as the work allows: the work without the frame wait
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)



def _fps_from_argv() -> None:
    # Textual reads its frame rate when first imported: apply --fps before importing it.
    for i, arg in enumerate(sys.argv):
        if arg == "--fps" and i + 1 < len(sys.argv):
            os.environ["TEXTUAL_FPS"] = sys.argv[i + 1]
        elif arg.startswith("--fps="):
            os.environ["TEXTUAL_FPS"] = arg.split("=", 1)[1]


_fps_from_argv()

from textual import events  # noqa: E402

from app.ui.app import HangscopeApp  # noqa: E402
from app.ui.grid_model import build_grid  # noqa: E402
from app.ui.source import ReplaySource  # noqa: E402
from app.ui.view import build_view  # noqa: E402
from app.ui.widgets.rank_grid import RankGrid  # noqa: E402
from test_ui_support import build_snapshot  # noqa: E402

KEYS = ["down"] * 20 + ["right"] * 5 + ["up"] * 10 + ["left"] * 5 + ["pagedown"] * 3 + ["pageup", "end", "home"]


def pct(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def run_case(nodes: int, per_node: int, size: Tuple[int, int], moves: int) -> Dict[str, float]:
    snap = build_snapshot(nodes=nodes, per_node=per_node, scenario="barrier", culprit=nodes * per_node - 3,
                          failed=(nodes // 2,))
    t = time.perf_counter()
    view = build_view(snap)
    analysis_s = time.perf_counter() - t
    t = time.perf_counter()
    build_grid(snap, view.class_of, view.suspects)
    layout_s = time.perf_counter() - t

    app = HangscopeApp(ReplaySource([snap]))
    rendered = [0]
    original_render = RankGrid.render_line

    def counting_render(self: RankGrid, y: int):
        rendered[0] += 1
        return original_render(self, y)

    RankGrid.render_line = counting_render  # type: ignore[method-assign]
    frames: List[float] = []
    waiters: List[Tuple[object, asyncio.Future]] = []
    try:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            await pilot.pause()
            grid = app.main.grid
            status = app.main.query_one("#status")
            display = app._display

            def hooked(screen, renderable) -> None:
                display(screen, renderable)
                frames.append(time.perf_counter())
                for cond, fut in list(waiters):
                    if not fut.done() and cond():  # type: ignore[operator]
                        fut.set_result(frames[-1])

            app._display = hooked  # type: ignore[method-assign]
            cursor_ms: List[float] = []
            status_ms: List[float] = []
            lines: List[int] = []
            loop = asyncio.get_running_loop()
            for i in range(moves):
                key = KEYS[i % len(KEYS)]
                before = grid.cursor
                row, col = before
                # where the key will put the cursor, to recognise the frame that shows it
                grid_rows = grid.model.rows
                if key in ("down", "up", "pagedown", "pageup"):
                    page = max(grid.size.height - 2, 1)
                    step = {"down": 1, "up": -1, "pagedown": page, "pageup": -page}[key]
                    row = max(0, min(row + step, len(grid_rows) - 1))
                    col = max(0, min(col, len(grid_rows[row].cells) - 1))
                elif key in ("left", "right"):
                    col = max(0, min(col + (1 if key == "right" else -1), len(grid_rows[row].cells) - 1))
                else:
                    col = 0 if key == "home" else len(grid_rows[row].cells) - 1
                target = (row, col)
                if target == before:
                    continue
                cell = grid.model.cell(*target)
                label = cell.rank.label if cell is not None and cell.rank is not None else None
                cursor_f: asyncio.Future = loop.create_future()
                status_f: asyncio.Future = loop.create_future()
                waiters[:] = [(lambda target=target: grid.cursor == target, cursor_f),
                              (lambda label=label: label is None or str(status.render()).startswith(label + " "),
                               status_f)]
                rendered[0] = 0
                t0 = time.perf_counter()
                app._driver.send_message(events.Key(key, None))  # type: ignore[union-attr]
                t_cursor = await asyncio.wait_for(cursor_f, 5)
                t_status = await asyncio.wait_for(status_f, 5)
                cursor_ms.append((t_cursor - t0) * 1000)
                status_ms.append((t_status - t0) * 1000)
                lines.append(rendered[0])
            app._display = display  # type: ignore[method-assign]
    finally:
        RankGrid.render_line = original_render  # type: ignore[method-assign]
    return {"analysis_ms": analysis_s * 1000, "layout_ms": layout_s * 1000,
            "cursor_med": statistics.median(cursor_ms), "cursor_p95": pct(cursor_ms, 0.95),
            "status_med": statistics.median(status_ms), "status_p95": pct(status_ms, 0.95),
            "status_max": max(status_ms), "lines_med": statistics.median(lines), "moves": len(cursor_ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--moves", type=int, default=60)
    parser.add_argument("--sizes", default="160x50,80x24")
    parser.add_argument("--fps", type=int, default=60, help="Textual's frame rate (its default is 60)")
    args = parser.parse_args()
    shapes = [(16, 8), (128, 8), (512, 8), (64, 64), (2048, 8)]
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    print(f"hangscope TUI grid: key press -> frame written, {args.moves} moves per row, {args.fps} fps (ms; "
          f"python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
    head = (f"{'ranks':>6} {'shape':>8} {'term':>7} {'analysis':>9} {'layout':>7} {'cursor p50':>10} "
            f"{'p95':>6} {'status p50':>10} {'p95':>6} {'max':>6} {'lines':>5}")
    print(head)
    print("-" * len(head))
    for nodes, per_node in shapes:
        for size in sizes:
            r = asyncio.run(run_case(nodes, per_node, size, args.moves))
            print(f"{nodes * per_node:>6} {f'{nodes}x{per_node}':>8} {f'{size[0]}x{size[1]}':>7} "
                  f"{r['analysis_ms']:>9.1f} {r['layout_ms']:>7.1f} {r['cursor_med']:>10.1f} {r['cursor_p95']:>6.1f} "
                  f"{r['status_med']:>10.1f} {r['status_p95']:>6.1f} {r['status_max']:>6.1f} {r['lines_med']:>5.0f}")
    print("analysis: app.analysis.analyze + view (once per snapshot); layout: grid model (once per snapshot);\n"
          "cursor/status: key event to the frame showing the cursor / the status line; lines: grid lines\n"
          "re-rendered per move (the two rows the cursor left and entered, plus the header when scrolling)")


if __name__ == "__main__":
    main()
