"""Issue 25, bad input: a node list is parsed in linear time whatever its shape (a missing `]`, a trailing
zero-width space, `a[a[a[...`, `n0,n1,...`, `a[0,1,2,...]`), bounded before it is expanded, and a bad one is
refused with one line saying where it goes wrong. The old regular expression with nested repeats doubled its
time with each character of `gpu[01-08` + a stray character and ignored Ctrl+C."""

from __future__ import annotations

import time

import pytest

from app.cli import main
from app.errors import HostsError
from app.hosts import parse_hosts, parse_nodelist

SHAPES = {
    "unclosed": lambda n: "a[" * (n // 2),
    "nested": lambda n: "[" * (n // 2) + "]" * (n // 2),
    "bang": lambda n: "a" * n + "!",
    "dashes": lambda n: "a-" * (n // 2) + "!",
    "dots": lambda n: "a." * (n // 2) + "!",
    "distinct": lambda n: ",".join(f"n{i}" for i in range(n // 7)),
    "product": lambda n: "a[1-2]" * (n // 6),
    "rangelist": lambda n: "a[" + ",".join(str(i) for i in range(n // 6)) + "]",
    "comma-dup": lambda n: ",".join(["a"] * (n // 2)),
    "blanks": lambda n: "a" + " " * n + "b",
    "blanks-commas": lambda n: ", " * (n // 2) + "a",
    "bigdigits": lambda n: "a[" + "9" * n + "]",
    "commas-open": lambda n: "a[1," * (n // 4),
    "atsigns": lambda n: "u@" * (n // 2) + "h",
    "colons": lambda n: "h" + ":1" * (n // 2),
    "unclosed-zwsp": lambda n: "compute-gpu-a100-rack7z[01-08" + "\u200b" * (n // 100),
}


def _parse_time(text: str, parse) -> float:
    t0 = time.perf_counter()
    try:
        parse(text)
    except HostsError:
        pass
    return time.perf_counter() - t0


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_parses_in_linear_time(shape: str) -> None:
    # 120,000 characters: the quadratic comma split took 12 s here and the nested repeats never finished; a
    # linear pass takes well under a second even on a loaded machine
    elapsed = _parse_time(SHAPES[shape](120_000), parse_nodelist)
    assert elapsed < 3.0, f"{shape}: {elapsed:.2f} s"


@pytest.mark.parametrize("shape", ["unclosed", "bang", "dashes", "product", "rangelist", "commas-open", "atsigns"])
def test_every_shape_as_a_hosts_file_line_parses_in_linear_time(shape: str) -> None:
    line = SHAPES[shape](4000)  # a hosts line is at most 4096 characters
    lines = "\n".join([line[:4096]] * 200)
    assert _parse_time(lines, lambda t: parse_hosts(t, "hosts.txt")) < 3.0


@pytest.mark.parametrize("text,where", [
    ("compute-gpu-a100-rack7z[01-08", "the '[' at character 24 is never closed"),
    ("compute-gpu-a100-rack7z[01-08\u200b", "character 30 is U+200B (zero width space)"),
    ("gpu[01-08]\u00a0", "character 11 is U+00A0 (no-break space)"),
    ("gpu[1-[2]]", "followed by another '['"),
    ("gpu]1[", "']' at character 4 closes no '['"),
    ("gpu[8-1]", "range '8-1' at character 5 runs backwards"),
    ("gpu[1,,2]", "an empty range at character 7"),
    ("gpu[1-2/0]", "has a step of 0"),
    ("gpu[" + "9" * 5000 + "]", "more than 9 digits"),
    ("gpu[a-b]", "malformed range 'a-b' at character 5"),
    ("gpu[\uff11-\uff12]", "U+FF11"),
])
def test_a_bad_node_list_says_where_it_goes_wrong(text: str, where: str) -> None:
    with pytest.raises(HostsError) as caught:
        parse_nodelist(text)
    assert where in str(caught.value)


def test_a_list_expanding_past_max_hosts_is_refused_uncounted_by_digits(capsys) -> None:
    # 2^20000 names: counted from the text, capped, never a 6,000-digit number (Python refuses to print one)
    assert main(["-w", "a[1-2]" * 20000, "--print"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expands to more than" in err and "--max-hosts" in err


def test_node_lists_within_the_limit_still_expand_with_clustershell() -> None:
    assert [h.name for h in parse_nodelist("gpu[001-003,010],login1")] == ["gpu001", "gpu002", "gpu003", "gpu010",
                                                                           "login1"]
    assert len(parse_nodelist("a[1-2]" * 13)) == 8192
    assert len(parse_nodelist(", ".join(f"n{i}" for i in range(5000)))) == 5000


def test_a_refusal_is_one_line_without_a_hint_line(capsys) -> None:
    assert main(["-w", "gpu[1-100000]", "--print"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-hosts" in err and "hint:" not in err
