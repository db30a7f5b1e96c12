"""What the screens derive from a snapshot: grid layout, suspects, aggregated node states, the `/` filter."""

from __future__ import annotations

import dataclasses

from app.model import ErrorInfo, NodeStatus
from app.ui.grid_model import SYMBOLS, build_grid, column_labels
from app.ui.view import build_view, duration_text, filter_keys, node_groups, parse_ranks, progress_text
from test_ui_support import build_snapshot, later


def key(snap, rank):
    r = snap.rank_by_number(rank)
    return (r.node, r.pid)


def test_grid_rows_are_nodes_and_columns_local_ranks():
    snap = build_snapshot(nodes=3, per_node=4, failed=(1,))
    view = build_view(snap)
    grid = build_grid(snap, view.class_of, view.suspects)
    assert [r.name for r in grid.rows] == ["node01", "node02", "node03"]
    assert [c.rank.local_rank for c in grid.rows[0].cells] == [0, 1, 2, 3]
    assert [c.kind for c in grid.rows[1].cells] == ["failed"] * 4  # the failed node keeps its slots
    assert grid.position(key(snap, 9)) == (2, 1)
    assert list(column_labels(grid)) == ["0", "1", "2", "3"]


def test_missing_slots_show_as_missing_cells():
    snap = build_snapshot(nodes=2, per_node=2)
    node = dataclasses.replace(snap.nodes[0], slots=4)
    snap = dataclasses.replace(snap, nodes=(node,) + snap.nodes[1:])
    grid = build_grid(snap, {}, set())
    assert [c.kind for c in grid.rows[0].cells] == ["pending", "pending", "missing", "missing"]


def test_classes_get_distinct_symbols_and_the_odd_rank_is_a_suspect():
    snap = build_snapshot(nodes=4, per_node=2, scenario="barrier", culprit=6)
    view = build_view(snap)
    assert [c.size for c in view.classes] == [7, 1]
    assert view.classes[0].symbol != view.classes[1].symbol
    assert view.suspects == {key(snap, 6)}
    assert view.classes[1].suspect and not view.classes[0].suspect
    grid = build_grid(snap, view.class_of, view.suspects)
    cell = grid.cell(*grid.position(key(snap, 6)))
    assert cell.suspect and cell.symbol == SYMBOLS[1]


def test_same_line_other_iteration_is_a_suspect_inside_the_big_class():
    snap = build_snapshot(nodes=4, per_node=2, scenario="skip", culprit=5)
    view = build_view(snap)
    assert len(view.classes) == 1
    assert view.suspects == {key(snap, 5)}


def test_failed_nodes_are_aggregated_with_reason_and_remedy():
    snap = build_snapshot(nodes=8, per_node=1, failed=(2, 3, 4, 5, 6))
    groups = node_groups(snap.nodes, snap.ranks)
    failed = [g for g in groups if g.state == "failed"]
    assert len(failed) == 1
    g = failed[0]
    assert (g.nodes, g.reason, g.count) == ("node[03-07]", "ptrace denied (ptrace_scope=1)", 5)
    assert "ptrace_scope" in g.hint
    done = [g for g in groups if g.state == "done"]
    assert done[0].nodes == "node[01-02,08]" and done[0].ranks == 3


def test_a_node_named_in_its_own_message_still_groups():
    nodes = [NodeStatus(name=f"n{i}", state="failed", error=ErrorInfo("connect_timeout", f"n{i}: no answer in 10 s"))
             for i in (1, 2)]
    (g,) = node_groups(nodes)
    assert (g.nodes, g.reason) == ("n[1-2]", "no answer in 10 s")


def test_filter_by_rank_node_nodeset_and_frame_text():
    snap = build_snapshot(nodes=4, per_node=2, scenario="barrier", culprit=6)
    assert filter_keys(snap, "") is None
    assert filter_keys(snap, "5") == {key(snap, 5)}
    assert filter_keys(snap, "rank 0-2,7") == {key(snap, r) for r in (0, 1, 2, 7)}
    assert filter_keys(snap, "node02") == {key(snap, 2), key(snap, 3)}
    assert filter_keys(snap, "node[01,04]") == {key(snap, r) for r in (0, 1, 6, 7)}
    assert filter_keys(snap, "barrier") == {key(snap, 6)}
    assert filter_keys(snap, "ALL_REDUCE") == {key(snap, r) for r in (0, 1, 2, 3, 4, 5, 7)}
    assert filter_keys(snap, "[bold]") == set()
    assert filter_keys(snap, f"pid {snap.ranks[2].pid}, {snap.ranks[4].pid}") == {key(snap, 2), key(snap, 4)}
    assert parse_ranks("0-99999999") is None  # not a rank list anyone means: treated as text


def test_filtered_grid_keeps_only_matching_ranks_and_their_nodes():
    snap = build_snapshot(nodes=4, per_node=2, failed=(3,))
    grid = build_grid(snap, {}, set(), filter_keys(snap, "node02"))
    assert [r.name for r in grid.rows] == ["node02"]


def test_progress_from_history_reads_stuck_for():
    first = build_snapshot(nodes=2, per_node=2)
    second = later(first, 252)
    view = build_view(second, history=[first])
    assert progress_text(view.progress[key(second, 0)]).startswith("stuck for 4m12s")
    moving = later(first, 30, advance=[1])
    view = build_view(moving, history=[first])
    assert progress_text(view.progress[key(moving, 1)]) == "progressing"


def test_duration_text():
    assert [duration_text(s) for s in (0, 42, 60, 252, 3600, 3780)] == ["0s", "42s", "1m00s", "4m12s", "1h00m",
                                                                         "1h03m"]
