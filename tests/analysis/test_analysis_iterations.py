"""Loop-iteration diffing: same stack, different loop iteration; and what is said when values are missing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from analysis_snapshots import ALL_REDUCE, BARRIER, LOADING, STEP_LOOP, in_step, rank, snapshot
from app.analysis import analyze
from app.analysis.iterations import split_iterations
from app.analysis.tree import group_stacks
from app.model import Frame, Local, LoopInfo, Snapshot
from app.model.codec import snapshot_from_json

SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "scenarios"


def stepped(steps: dict, n: int = 8, default: int = 1203):  # type: ignore[no-untyped-def]
    return [rank(r, f"node{r // 4 + 1:02d}", in_step(ALL_REDUCE, steps.get(r, default)), world=n) for r in range(n)]


def test_one_rank_an_iteration_ahead() -> None:
    a = analyze(snapshot(stepped({7: 1204}), locals=True))
    (split,) = a.iteration_splits
    assert split.text() == "step=1203: ranks 0-6; step=1204: rank 7"
    assert split.varying == ("step",)  # the batch tensors' addresses are not iterations
    top = a.findings[0]
    assert top.kind == "iteration_split" and top.confidence == "high"
    assert top.title == "rank 7 is 1 iteration ahead (step=1204 vs 1203) in `all_reduce`, at job.py:50 `for step, " \
                        "batch in enumerate(loader)`"
    assert top.ranks == (("node02", 1007),)
    assert not any(f.kind == "all_identical" for f in a.findings)


def test_ranks_behind_by_several_iterations() -> None:
    top = analyze(snapshot(stepped({2: 1200, 3: 1200}), locals=True)).findings[0]
    assert top.title.startswith("ranks 2-3 are 3 iterations behind (step=1200 vs 1203)")


def test_values_that_are_not_counters() -> None:
    loop = LoopInfo("for", 10, 20, "for name, p in model.named_parameters():", ("name", "p"))

    def at(name: str):  # type: ignore[no-untyped-def]
        return tuple(Frame(f.function, f.filename, f.line, loops=(loop,), iteration=(("name", repr(name)),))
                     if f.function == "train" else f for f in ALL_REDUCE)
    ranks = [rank(r, "n1", at("'layer2.weight'" if r == 1 else "'layer1.weight'")) for r in range(4)]
    top = analyze(snapshot(ranks, locals=True)).findings[0]
    assert top.kind == "iteration_split" and top.confidence == "medium"
    assert top.title.startswith("rank 1 has name=")


def test_iterations_spread_widely_are_one_finding() -> None:
    a = analyze(snapshot(stepped({r: 100 + r for r in range(8)}), locals=True))
    spread = [f for f in a.findings if f.kind == "iteration_split"]
    assert len(spread) == 1 and spread[0].title == "ranks on one stack are spread over 8 iterations"


def test_loops_without_locals_say_run_with_locals() -> None:
    ranks = [rank(r, "n1", in_step(ALL_REDUCE, None)) for r in range(4)]
    a = analyze(snapshot(ranks))
    (split,) = a.iteration_splits
    assert split.locals_missing and split.text() == "no loop variable values (run with --locals)"
    f = next(f for f in a.findings if f.kind == "no_locals")
    assert "--locals" in f.title and not f.culprit
    identical = next(f for f in a.findings if f.kind == "all_identical")
    assert "run with --locals" in identical.detail
    assert a.verdict.startswith("All 4 ranks wait in `all_reduce`")


def test_same_iteration_everywhere_is_one_group() -> None:
    (split,) = split_iterations(group_stacks(stepped({})))
    assert not split.split and split.text() == "step=1203: ranks 0-7"
    assert split.groups[0].coordinate == (("step", "1203"),)


def test_classes_without_loops_have_no_split() -> None:
    assert split_iterations(group_stacks([rank(0, "n1", ALL_REDUCE), rank(1, "n1", LOADING)])) == ()


def test_outer_and_inner_loops_compare_outermost_first() -> None:
    epoch = LoopInfo("for", 40, 70, "for epoch in range(epochs):", ("epoch",))

    def at(e: int, s: int):  # type: ignore[no-untyped-def]
        return tuple(Frame(f.function, f.filename, f.line, loops=(epoch, STEP_LOOP),
                           iteration=(("epoch", str(e)), ("step", str(s)))) if f.function == "train" else f
                     for f in ALL_REDUCE)
    ranks = [rank(r, "n1", at(1, 0) if r == 3 else at(0, 99)) for r in range(6)]
    top = analyze(snapshot(ranks, locals=True)).findings[0]
    assert top.title.startswith("rank 3 is 1 iteration ahead (epoch=1 vs 0) in `all_reduce`, at job.py:40 "
                                "`for epoch in range(epochs)`")


def without_locals(snap: Snapshot) -> Snapshot:
    return dataclasses.replace(snap, ranks=tuple(dataclasses.replace(r, threads=tuple(
        dataclasses.replace(t, frames=tuple(dataclasses.replace(f, locals=()) for f in t.frames))
        for t in r.threads)) for r in snap.ranks))


def concluded(snap: Snapshot, history: tuple = ()) -> dict:
    out = analyze(snap, history=history).to_dict()
    del out["elapsed"]
    return out


def test_per_rank_locals_change_no_class_finding_or_split() -> None:
    """Every rank's frames carry locals naming its own objects, so no two ranks' frames are equal: ranks must
    still group, split by iteration and read exactly as they do without locals."""
    def with_locals(frames, r):  # type: ignore[no-untyped-def]
        return tuple(dataclasses.replace(f, locals=(Local("self", f"<DDP at 0x7f{r:04x}{i:02x}0>", True),))
                     for i, f in enumerate(frames))
    places = {5: LOADING, 9: BARRIER, 13: LOADING}
    ranks = [rank(r, f"node{r // 4 + 1:02d}", with_locals(in_step(places.get(r, ALL_REDUCE), 1204 if r == 7 else
                                                                   1203), r), world=17) for r in range(16)]
    snap = snapshot(ranks, locals=True)
    got = concluded(snap)
    assert got == concluded(without_locals(snap))
    assert [c["size"] for c in got["classes"]] == [13, 2, 1]
    assert [s["text"] for s in got["iteration_splits"]] == ["step=1203: ranks 0-4,6,8,10-12,14-15; step=1204: rank 7",
                                                            "step=1203: ranks 5,13", "step=1203: rank 9"]
    assert {f["kind"] for f in got["findings"]} >= {"iteration_split", "minority_stack", "missing_ranks"}
    # the recorded scenarios (py-spy --locals on real torch jobs), with their earlier samples as history
    for path in sorted(SCENARIOS.glob("*.earlier.json")):
        earlier = snapshot_from_json(path.read_text())[0]
        now = snapshot_from_json(path.with_name(path.name.replace(".earlier", "")).read_text())[0]
        assert any(f.locals for r in now.ranks for t in r.threads for f in t.frames), path.name
        got, bare = concluded(now, (earlier,)), concluded(without_locals(now), (without_locals(earlier),))
        # locals may explain more in words (the sequence a loop runs over, in another order: order.json), but
        # never change the groups, the iteration splits, or which findings name whom, how surely
        # (the wait graph is the findings' evidence in another shape: its words and strengths may rise with them,
        # its root and which vertex names whom may not)
        shown = ("findings", "verdict", "waits", "culprit")
        assert {k: v for k, v in got.items() if k not in shown} == \
            {k: v for k, v in bare.items() if k not in shown}, path.name
        # the culprit is the same ranks, with or without locals (how surely may rise with them, as the findings')
        assert (got["culprit"] or {}).get("ranks") == (bare["culprit"] or {}).get("ranks"), path.name
        assert [(g["root"], [(v["id"], v["ranks"]) for v in g["vertices"]], [(e["waiter"], e["waited"], e["kind"])
                                                                             for e in g["edges"]])
                for g in got["waits"]] == \
            [(g["root"], [(v["id"], v["ranks"]) for v in g["vertices"]], [(e["waiter"], e["waited"], e["kind"])
                                                                         for e in g["edges"]])
             for g in bare["waits"]], path.name
        assert [(f["kind"], f["ranks"]) for f in got["findings"]] == \
            [(f["kind"], f["ranks"]) for f in bare["findings"]], path.name
        if path.name == "order.earlier.json":  # the list in the locals makes the split certain: it only rises
            sureness = {"high": 0, "medium": 1, "low": 2}
            assert all(sureness[f["confidence"]] <= sureness[b["confidence"]]
                       for f, b in zip(got["findings"], bare["findings"]))
        else:
            assert got == bare, path.name


def test_loops_at_module_level_with_locals_on_never_say_run_with_locals() -> None:
    """nanoGPT's loop runs at module level: its counters are globals, which py-spy's --locals does not show and
    which were not read here (no `global` locals on the frame). With --locals on, nothing may tell the user to
    turn it on, and the note is not [high]."""
    from app.analysis.text import summary_text

    loop = LoopInfo("while", 250, 330, "while True:")
    frames = (Frame("all_reduce", ALL_REDUCE[-1].filename, 2950),
              Frame("<module>", "/home/alice/train.py", 305, loops=(loop,)))
    snap = snapshot([rank(r, "n1", frames) for r in range(4)], locals=True)
    a = analyze(snap)
    (split,) = a.iteration_splits
    assert split.locals_missing and split.text() == "no loop variable had a readable value"
    f = next(f for f in a.findings if f.kind == "no_locals")
    assert f.confidence == "low" and f.title == "loop iterations unknown: the loop variables were not readable"
    assert "module level, where its counters are globals" in f.detail and "could not here" in f.detail
    assert "run with --locals" not in summary_text(snap, a)


def test_module_level_globals_read_but_not_comparable_say_so_not_that_they_cannot_be_read() -> None:
    """The worker read the loop's globals (`global` locals on the `<module>` frame), but their values tell no
    iteration (an object, not a number): the note must not claim they are unreadable; read ints split the ranks."""
    loop = LoopInfo("while", 250, 330, "while True:", (), ("iter_num",))

    def module(value: str, iteration: tuple) -> tuple:  # type: ignore[type-arg]
        return (Frame("all_reduce", ALL_REDUCE[-1].filename, 2950),
                Frame("<module>", "/home/alice/train.py", 305, locals=(Local("iter_num", value),),
                      loops=(loop,), iteration=iteration))

    a = analyze(snapshot([rank(r, "n1", module("<Tensor>", ())) for r in range(4)], locals=True))
    f = next(f for f in a.findings if f.kind == "no_locals")
    assert "its globals were read from the rank's memory, but none holds a value" in f.detail
    assert "could not" not in f.detail

    ahead = analyze(snapshot([rank(r, "n1", module(str(41 + (r == 3)), (("iter_num", str(41 + (r == 3))),)))
                              for r in range(4)], locals=True))
    assert not any(f.kind == "no_locals" for f in ahead.findings)
    split = next(f for f in ahead.findings if f.kind == "iteration_split")
    assert split.title.startswith("rank 3 is 1 iteration ahead (iter_num=42 vs 41)"), split.title

    # a rank whose globals were not read (held: stopped, frozen, D) has no value: unknown, not another iteration
    held = analyze(snapshot([rank(r, "n1", module("41", (("iter_num", "41"),)) if r != 3 else module("", ()))
                             for r in range(4)], locals=True))
    (s,) = held.iteration_splits
    assert not s.split and s.text() == "iter_num=41: ranks 0-2; no values: rank 3", s.text()
    assert s.unknown is not None and s.unknown.numbers == (3,)
    assert not any(f.kind in ("iteration_split", "no_locals") for f in held.findings), held.findings


def test_the_same_elements_in_another_order_is_an_order_difference_not_an_iteration_offset() -> None:
    """`for name in names:` where one rank's `names` holds the same buckets in another order (a set's order):
    that is the cause, with both orders; other contents, or a loop over an expression, stay a plain split."""
    loop = LoopInfo("for", 20, 22, "for name in names:", ("name",))

    def ranks_with(culprit_names: str):  # type: ignore[no-untyped-def]
        out = []
        for r in range(4):
            names = culprit_names if r == 3 else "['a', 'b', 'c']"
            first = "'b'" if r == 3 else "'a'"
            out.append(rank(r, "n1", (Frame("all_reduce", ALL_REDUCE[-1].filename, 2950),
                                      Frame("sync", "/job/train.py", 21, loops=(loop,), iteration=(("name", first),),
                                            locals=(Local("names", names), Local("name", first))))))
        return snapshot(out, locals=True)

    top = analyze(ranks_with("['b', 'c', 'a']")).findings[0]
    assert top.kind == "iteration_split" and top.confidence == "high"
    assert top.title == "rank 3 iterates `names` in another order than 3 others: name='b' where they have name='a' " \
                        "at train.py:20 `for name in names`"
    assert "`names` is ['b', 'c', 'a'] on rank 3 and ['a', 'b', 'c'] on ranks 0-2" in top.detail
    other = analyze(ranks_with("['b', 'd', 'a']")).findings[0]  # not the same elements: not an order difference
    assert other.kind == "iteration_split" and "another order" not in other.title
