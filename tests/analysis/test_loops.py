"""Enclosing loops of a line from a file's ast: kinds, order, variables, counters, scopes, limits, cache."""

from __future__ import annotations

import os
import textwrap

from workers import loops

SOURCE = textwrap.dedent('''\
    import asyncio

    def train(loader, epochs):
        global_step = 0
        for epoch in range(epochs):
            for step, (x, y) in enumerate(loader):
                global_step += 1
                if step % 10 == 0:
                    seen -= 1
                forward(x, y)

    def spin():
        i = 0
        while True:
            i += 1
            for k in range(3):
                j += 1
            block()

    async def consume(queue):
        async for *head, last in queue:
            await handle(last)

    def outer():
        for a in range(3):
            def inner():
                return helper()
            inner()

    for module_level in range(2):
        train([], 1)
    ''')


def write(tmp_path, text: str = SOURCE, name: str = "train.py") -> str:
    path = os.path.join(str(tmp_path), name)
    with open(path, "w") as f:
        f.write(text)
    return path


def at(path: str, line: int) -> list:
    loops_by_key, _ = loops.annotate(os.getpid(), [(path, line)], context=-1, cache=loops.SourceCache())
    return loops_by_key.get("%s:%d" % (path, line), [])


def test_nested_for_loops_outermost_first_with_their_variables(tmp_path) -> None:
    path = write(tmp_path)
    found = at(path, 10)  # forward(x, y)
    assert [(lp["kind"], lp["line"], lp["variables"]) for lp in found] == [
        ("for", 5, ["epoch"]), ("for", 6, ["step", "x", "y"])]
    assert found[1]["header"] == "for step, (x, y) in enumerate(loader):"
    assert found[1]["end_line"] == 10
    # counters belong to the loop whose body updates them, nested ifs included
    assert found[0]["counters"] == [] and found[1]["counters"] == ["global_step", "seen"]


def test_while_counter_excludes_a_nested_loops_own_counter(tmp_path) -> None:
    path = write(tmp_path)
    (loop,) = at(path, 18)  # block()
    assert (loop["kind"], loop["header"], loop["variables"], loop["counters"]) == ("while", "while True:", [],
                                                                                    ["i"])
    assert [lp["counters"] for lp in at(path, 17)] == [["i"], ["j"]]


def test_async_for_with_starred_target(tmp_path) -> None:
    (loop,) = at(write(tmp_path), 22)
    assert loop["kind"] == "async for" and loop["variables"] == ["head", "last"]


def test_only_loops_of_the_innermost_function_count(tmp_path) -> None:
    path = write(tmp_path)
    assert at(path, 27) == []  # inside inner(): outer's loop is another frame's business
    assert [lp["variables"] for lp in at(path, 28)] == [["a"]]
    assert [lp["variables"] for lp in at(path, 31)] == [["module_level"]]  # module scope
    assert at(path, 4) == []


def test_source_context_lines(tmp_path) -> None:
    path = write(tmp_path)
    _, source = loops.annotate(os.getpid(), [(path, 10), (path, 2)], context=1, want_loops=False,
                               cache=loops.SourceCache())
    assert source[path] == {"1": "import asyncio", "2": "", "3": "def train(loader, epochs):",
                            "9": "                seen -= 1", "10": "            forward(x, y)", "11": ""}


def test_unparsable_missing_huge_and_pseudo_files_give_no_loops_without_failing(tmp_path) -> None:
    bad = write(tmp_path, "def f(:\n    for x in y:\n        pass\n", "bad.py")
    assert at(bad, 3) == []
    _, source = loops.annotate(os.getpid(), [(bad, 2)], context=0, cache=loops.SourceCache())
    assert source[bad] == {"2": "    for x in y:"}  # the text still shows
    assert at(os.path.join(str(tmp_path), "missing.py"), 1) == []
    assert at("<string>", 1) == [] and at("<frozen runpy>", 3) == []
    huge = write(tmp_path, "for i in range(3):\n    pass\n" + "#" * (loops.MAX_FILE_BYTES + 1), "huge.py")
    assert at(huge, 2) == []


def test_relative_filenames_resolve_against_the_process_cwd(tmp_path, monkeypatch) -> None:
    write(tmp_path)
    monkeypatch.chdir(str(tmp_path))
    loops_by_key, _ = loops.annotate(os.getpid(), [("train.py", 10)], context=-1, cache=loops.SourceCache())
    assert len(loops_by_key["train.py:10"]) == 2


def test_cache_parses_once_and_notices_changes(tmp_path) -> None:
    path = write(tmp_path)
    cache = loops.SourceCache(max_files=2)
    first = cache.get(path)
    assert cache.get(path) is first
    write(tmp_path, SOURCE + "\n# changed\n")
    assert cache.get(path) is not first
    for n in range(3):
        cache.get(write(tmp_path, "x = %d\n" % n, "f%d.py" % n))
    assert len(cache._files) == 2  # bounded


def test_with_blocks_around_a_line_say_what_is_held_and_what_is_being_entered(tmp_path) -> None:
    from workers import loops as loopinfo

    src = tmp_path / "job.py"
    src.write_text("import threading\n_lock = threading.Lock()\n\ndef f(self):\n    with _lock:\n        x = 1\n"
                   "        with self._m, open('a') as g:\n            y = 2\n")
    found, _ = loopinfo.annotate(0, [(str(src), 5), (str(src), 8)], -1, cache=loopinfo.SourceCache())
    assert found[f"{src}:5"] == [{"kind": "with", "line": 5, "end_line": 8, "header": "with _lock:",
                                  "items": ["_lock"], "entering": True}]
    held = found[f"{src}:8"]
    assert [(w["items"], w["entering"]) for w in held] == [(["_lock"], False), (["self._m", "open('a')"], False)]
