"""Equivalence classes and the merged prefix tree: exact classes, identity options, folding, robustness, and
hypothesis properties (every rank in one leaf path, order independence, sizes add up)."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from typing import List, Tuple

from hypothesis import given, settings
from hypothesis import strategies as st

from analysis_snapshots import ALL_REDUCE, BARRIER, LOADING, frame, job, rank, snapshot, stack
from app.analysis import AnalysisOptions, analyze
from app.analysis.fold import describe_keys, fold_ints, fold_nodes
from app.analysis.tree import build_tree, group_stacks
from app.model import Frame, RankSnapshot, ThreadStack
from app.model.codec import snapshot_from_json, snapshot_to_json


def names(frames: Tuple[Frame, ...]) -> List[str]:
    return [f.function for f in frames]


def test_classes_are_exact_largest_first_with_folded_labels() -> None:
    ranks = job(16, 4, rank5=LOADING, rank9=BARRIER, rank13=LOADING)
    classes = group_stacks(ranks).classes
    assert [c.size for c in classes] == [13, 2, 1]
    assert classes[0].label == "ranks 0-4,6-8,10-12,14-15 on node[01-04]"
    assert classes[1].label == "ranks 5,13 on node[02,04]"
    assert classes[2].label == "rank 9 on node03"
    # paths run outermost first, py-spy's innermost-first frames reversed
    assert names(classes[0].frames) == ["<module>", "train", "wrapper", "all_reduce"]
    assert [c.collective for c in classes] == ["all_reduce", None, "barrier"]
    assert classes[1].ranks == (("node02", 1005), ("node04", 1013))
    assert classes[1].numbers == (5, 13)


def test_tree_nodes_carry_the_ranks_that_pass_through_them() -> None:
    ranks = job(8, 4, rank5=LOADING)
    g = group_stacks(ranks)
    tree = build_tree(g.classes)
    assert tree.root.count == 8 and tree.label(tree.root) == "ranks 0-7 on node[01-02]"
    (module,) = tree.root.children
    assert module.frame is not None and module.frame.function == "<module>" and module.count == 8
    train_a, train_b = module.children  # the path splits at train: line 57 (7 ranks) and line 55 (rank 5)
    assert (train_a.frame.line, train_a.count, tree.label(train_a)) == (57, 7, "ranks 0-4,6-7 on node[01-02]")
    assert (train_b.frame.line, train_b.count, tree.label(train_b)) == (55, 1, "rank 5 on node02")
    assert tree.ranks(train_b) == (("node02", 1005),)
    leaf = train_b.children[0]
    assert leaf.frame.function == "next_batch" and leaf.ends == (1,) and not leaf.children


def test_identity_function_merges_ranks_at_other_lines_of_one_function() -> None:
    other_line = stack("all_reduce (distributed_c10d.py:2950)", "wrapper (c10d_logger.py:81)", "train (job.py:58)",
                       "<module> (job.py:120)")
    ranks = job(4, 4, rank2=other_line)
    assert [c.size for c in group_stacks(ranks).classes] == [3, 1]
    merged = group_stacks(ranks, AnalysisOptions(identity="function")).classes
    assert [c.size for c in merged] == [4]


def test_machinery_frames_fold_away_and_can_be_kept() -> None:
    boot = [frame("_run_code (<frozen runpy>:88)"), frame("_run_module_as_main (<frozen runpy>:198)")]
    elastic = frame("wrapper (/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/"
                    "errors/__init__.py:355)")
    frames = ALL_REDUCE[:-1] + (elastic, ALL_REDUCE[-1], *boot)
    ranks = [rank(0, "n1", frames), rank(1, "n1", ALL_REDUCE)]
    folded = group_stacks(ranks).classes
    assert [c.size for c in folded] == [2]  # plumbing differs, the job's path does not
    assert names(folded[0].frames) == ["<module>", "train", "wrapper", "all_reduce"]
    kept = group_stacks(ranks, AnalysisOptions(fold_machinery=False)).classes
    assert [c.size for c in kept] == [1, 1]
    assert names(kept[0].frames)[:2] == ["_run_module_as_main", "_run_code"]  # rank 0's class comes first


def test_thread_bootstrap_frames_fold_for_a_selected_thread() -> None:
    worker = stack("wait (/usr/lib/python3.11/threading.py:327)", "get (/usr/lib/python3.11/queue.py:171)",
                   "_pin_memory_loop (/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/pin_memory.py:52)",
                   "run (/usr/lib/python3.11/threading.py:982)", "_bootstrap_inner (/usr/lib/python3.11/threading.py:1045)",
                   "_bootstrap (/usr/lib/python3.11/threading.py:1002)")
    pin = ThreadStack(tid=7, name="pin_memory", frames=worker)
    ranks = [rank(r, "n1", ALL_REDUCE, threads=(pin,)) for r in range(2)] + [rank(2, "n1", ALL_REDUCE)]
    g = group_stacks(ranks, AnalysisOptions(thread="pin_memory"))
    assert names(g.classes[0].frames) == ["_pin_memory_loop", "get", "wait"]
    assert [r.rank for r in g.no_stack] == [2]
    chosen = group_stacks(ranks, AnalysisOptions(thread=lambda r: r.threads[-1]))
    assert [c.size for c in chosen.classes] == [2, 1]


def test_native_frames_kept_or_dropped() -> None:
    native = (Frame("pthread_cond_wait", "libc.so.6", 0, native=True),
              Frame("c10d::ProcessGroupGloo::allreduce(std::vector<at::Tensor>&)", "libtorch_cpu.so", 0, native=True))
    ranks = [rank(0, "n1", native + ALL_REDUCE), rank(1, "n1", ALL_REDUCE)]
    assert [c.size for c in group_stacks(ranks).classes] == [1, 1]
    assert [c.size for c in group_stacks(ranks, AnalysisOptions(native=False)).classes] == [2]


def test_ranks_without_stacks_without_rank_numbers_and_duplicates() -> None:
    no_rank = [rank(None, "n2", ALL_REDUCE, pid=p) for p in (4242, 4243)]
    dup = [rank(0, "n3", ALL_REDUCE, pid=7000), rank(0, "n4", ALL_REDUCE, pid=7000)]
    empty = rank(3, "n1", ())
    g = group_stacks([empty, *no_rank, *dup])
    assert [r.rank for r in g.no_stack] == [3]
    (c,) = g.classes
    assert c.size == 4
    assert c.label == "rank 0 and pids 4242-4243 on n[2-4]"
    assert describe_keys([("n3", 7000), ("n4", 7000)], [0, 0]) == "rank 0 (2 processes: rank numbers repeat) on n[3-4]"
    assert describe_keys([("n2", 4242)], [None]) == "pid 4242 on n2"


def test_empty_snapshot_and_ranks_without_threads() -> None:
    a = analyze(snapshot([]))
    assert a.classes == () and a.tree.root.count == 0 and a.verdict
    bare = RankSnapshot(node="n1", pid=5, start_time=1, rank=0)
    a = analyze(snapshot([bare]))
    assert a.classes == () and a.ranks_with_stacks == 0 and a.ranks_total == 1


def test_fold_helpers_match_clustershell() -> None:
    from ClusterShell.NodeSet import NodeSet
    from ClusterShell.RangeSet import RangeSet

    assert fold_ints([0, 1, 2, 3, 4, 5, 6, 8, 9, 15]) == "0-6,8-9,15" == str(RangeSet("0-6,8-9,15"))
    rng = random.Random(7)
    for _ in range(300):
        ints = rng.sample(range(60), rng.randint(1, 40))
        assert fold_ints(ints, limit=None) == str(RangeSet.fromlist([str(i) for i in ints]))
        width = rng.choice([1, 2, 3])
        prefix = rng.choice(["node", "gpu-a", "n_", "x.y"])
        nodes = [f"{prefix}{i:0{width}d}" for i in rng.sample(range(120), rng.randint(1, 12))]
        if rng.random() < 0.3:
            nodes += [f"{prefix}{i}" for i in rng.sample(range(120), 2)]  # mixed padding: NodeSet's rules
        assert fold_nodes(nodes) == str(NodeSet.fromlist(sorted(set(nodes)))), nodes
    assert fold_nodes(["rack1-n01", "rack2-n01"]) == "rack[1-2]-n01"
    assert fold_nodes(["10.0.0.1", "10.0.0.2"]) == "10.0.0.[1-2]"


# --- properties ---------------------------------------------------------------------------------------------

ALPHABET = [frame(s) for s in ("all_reduce (distributed_c10d.py:2950)", "barrier (distributed_c10d.py:4100)",
                                "wrapper (c10d_logger.py:81)", "train (job.py:57)", "train (job.py:55)",
                                "next_batch (loader.py:31)", "<module> (job.py:120)")]

rank_specs = st.lists(
    st.tuples(st.lists(st.sampled_from(range(len(ALPHABET))), max_size=5),  # innermost first; [] = no stack
              st.one_of(st.none(), st.integers(0, 20)), st.sampled_from(["n01", "n02", "n03"])),
    max_size=30)


def build(specs: List[Tuple[List[int], object, str]]) -> List[RankSnapshot]:
    return [rank(number, node, tuple(ALPHABET[i] for i in path), pid=100 + k)  # type: ignore[arg-type]
            for k, (path, number, node) in enumerate(specs)]


@settings(max_examples=150, deadline=None)
@given(rank_specs, st.randoms(use_true_random=False))
def test_every_rank_is_in_exactly_one_leaf_and_order_does_not_matter(specs, rnd) -> None:  # type: ignore[no-untyped-def]
    ranks = build(specs)
    g = group_stacks(ranks)
    tree = build_tree(g.classes)
    with_stacks = [r for r in ranks if r.threads and r.threads[0].frames]
    assert sum(c.size for c in g.classes) == len(with_stacks) == len(ranks) - len(g.no_stack)
    assert tree.root.count == len(with_stacks)
    # every rank ends in exactly one node, and the path to that node is its own stack, outermost first
    ends = {}

    def walk(node, path):  # type: ignore[no-untyped-def]
        for i in node.ends:
            for key in g.classes[i].ranks:
                assert key not in ends
                ends[key] = path
        assert node.count == sum(g.classes[i].size for i in node.classes)
        for child in node.children:
            walk(child, path + [(child.frame.function, child.frame.line)])
    walk(tree.root, [])
    assert set(ends) == {(r.node, r.pid) for r in with_stacks}
    for r in with_stacks:
        assert ends[(r.node, r.pid)] == [(f.function, f.line) for f in reversed(r.threads[0].frames)]
    # the same ranks in another order give the same classes, labels, representative frames and findings
    shuffled = list(ranks)
    rnd.shuffle(shuffled)
    a, b = analyze(snapshot(ranks)), analyze(snapshot(shuffled))
    assert [(c.ranks, c.label, c.frames) for c in a.classes] == [(c.ranks, c.label, c.frames) for c in b.classes]
    assert [f.title for f in a.findings] == [f.title for f in b.findings]
    assert a.to_dict()["tree"] == b.to_dict()["tree"]


def test_analysis_never_imports_the_ui_or_the_network_stack() -> None:
    code = textwrap.dedent("""
        import sys
        import app.analysis, app.analysis.core, app.analysis.text, app.analysis.diff, app.analysis.progress, app.analysis.network
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("textual", "asyncssh", "rich")
                     or m.startswith(("app.transport", "app.session", "app.ui")))
        print(",".join(bad))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.stdout.strip() == ""


def test_a_tree_of_one_class_from_an_analysis() -> None:
    a = analyze(snapshot(job(8, 4, rank5=LOADING, rank2=BARRIER)))
    chosen = a.classes[2]
    tree = build_tree([chosen], a.options)
    assert tree.root.classes == (chosen.index,) and tree.label(tree.root) == chosen.label
    assert tree.ranks(tree.root) == chosen.ranks
    assert chosen.label == "rank 5 on node02"
    # alone in its tree, the whole path is its own
    assert [f.function for f in tree.distinctive(chosen.index)] == ["<module>", "train", "next_batch"]


def test_stacks_thousands_of_frames_deep() -> None:
    recursion = tuple(frame(f"walk (job.py:{10 + i % 3})") for i in range(5000))
    ranks = [rank(0, "n1", ALL_REDUCE[:1] + recursion), rank(1, "n1", LOADING[:1] + recursion)]
    a = analyze(snapshot(ranks))
    assert [c.size for c in a.classes] == [1, 1] and len(a.tree.walk()) == 5003
    nodes = snapshot_from_json(snapshot_to_json(snapshot(ranks), a.to_dict()))[1]["tree"]["nodes"]
    assert len(nodes) == 5003 and max(n["depth"] for n in nodes) == 5001


def test_folded_lists_are_capped_with_how_many_more() -> None:
    from ClusterShell.RangeSet import RangeSet

    from app.analysis.fold import MAX_PARTS, fold_ints, fold_nodes

    assert fold_ints(range(0, 10_000, 2)) == ",".join(str(i) for i in range(0, 2 * MAX_PARTS, 2)) \
        + f" and {5000 - MAX_PARTS:,} more"
    assert fold_ints(range(0, 10_000, 2), limit=None).count(",") == 4999
    assert fold_ints(range(100)) == "0-99"  # one range: nothing to cap
    # capped: the first MAX_PARTS runs as ClusterShell folds them, and how many values the others hold
    rng = random.Random(11)
    for _ in range(300):
        ints = rng.sample(range(400), rng.randint(1, 300)) + list(range(rng.randint(0, 50)))
        runs = str(RangeSet.fromlist([str(i) for i in ints])).split(",")
        shown, left = runs[:MAX_PARTS], runs[MAX_PARTS:]
        held = sum(int(r.split("-")[-1]) - int(r.split("-")[0]) + 1 for r in left)
        assert fold_ints(ints) == ",".join(shown) + (f" and {held:,} more" if left else "")
    nodes = [f"gpu{i:05d}" for i in range(0, 12_500, 3)]
    folded = fold_nodes(nodes)
    assert folded.startswith("gpu[00000,00003,") and folded.endswith(f"] and {len(nodes) - MAX_PARTS:,} more")
    odd = [f"n{i}x{i}" for i in range(1000)]  # no one shape: NodeSet folds a bounded number of them
    assert fold_nodes(odd).endswith(" and 744 more")
