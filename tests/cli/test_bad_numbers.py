"""Issue 25, bad input: every numeric flag has a range that --help states, and a value outside it, or not a
plain ASCII decimal at all (nan, inf, 1e308, 30 digits, 1_0, 0x10, full-width digits), is refused before
anything connects: exit 2, one line naming the flag and the value. In-process: nothing here connects."""

from __future__ import annotations

import tempfile

import pytest

from app.cli import build_parser, main
from app.inputs import numbers

# flag -> (the flags that make it meaningful, one good value)
FLAGS = {
    "--timeout": (["-w", "nodeA", "--print"], "5"),
    "--interval": (["-w", "nodeA", "--print"], "0.5"),
    "--samples": (["-w", "nodeA", "--print"], "3"),
    "--strace": (["-w", "nodeA", "--print"], "2"),
    "--connect-timeout": (["-w", "nodeA", "--print"], "3"),
    "--fanout": (["-w", "nodeA", "--print"], "8"),
    "--max-hosts": (["-w", "nodeA", "--print"], "100"),
    "--pid": (["--print"], "4242"),
    "--refresh": (["-w", "nodeA"], "2"),
    "--fps": (["-w", "nodeA"], "20"),
    "--test-timeout": (["-w", "nodeA", "--test", "sanity"], "30"),
    "--startup-timeout": (["-w", "nodeA", "--test", "sanity"], "30"),
    "--iters": (["-w", "nodeA", "--test", "bench"], "10"),
    "--warmup": (["-w", "nodeA", "--test", "bench"], "2"),
    "--procs-per-node": (["-w", "nodeA", "--test", "sanity"], "2"),
    "--slow-ratio": (["-w", "nodeA", "--test", "pairs"], "0.4"),
    "--min-busbw": (["-w", "nodeA", "--test", "pairs"], "10"),
    "--pair-size": (["-w", "nodeA", "--test", "pairs"], "4M"),
}
BAD = ["nan", "NaN", "inf", "-inf", "1e308", "9" * 30, "1_0", "0x10", "\u0663", "\uff13", "abc", "", "   ", "5s",
       "-1", "1e999"]


def _refused(capsys, argv: list) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


@pytest.mark.parametrize("flag", sorted(FLAGS))
@pytest.mark.parametrize("value", BAD, ids=[repr(v) for v in BAD])
def test_a_bad_number_is_refused_with_one_line_naming_the_flag(capsys, flag: str, value: str) -> None:
    context, _ = FLAGS[flag]
    line = _refused(capsys, [*context, f"{flag}={value}"])
    assert line.startswith("hangscope: ") and flag in line


@pytest.mark.parametrize("argv", [
    ["--strace", "1e6"], ["--strace", "61"], ["--samples", "1e6"], ["--samples", "101"], ["--samples", "0"],
    ["--interval", "1e308"], ["--timeout", "1e308"], ["--timeout", "0"], ["--connect-timeout", "nan"],
    ["--pid", "0"], ["--pid", "4194305"], ["--pid", "1.5"], ["--fanout", "0"], ["--max-hosts", "0"],
])
def test_out_of_range_values_are_refused_before_anything_connects(capsys, argv: list) -> None:
    line = _refused(capsys, ["-w", "nodeA", "--print", *argv])
    assert argv[0] in line and ("range" in line or "whole number" in line or "decimal" in line)


def test_the_refusal_states_the_range_that_help_states(capsys) -> None:
    line = _refused(capsys, ["-w", "nodeA", "--print", "--strace", "inf"])
    assert "from 0 to 60" in line
    assert "(0-60 s; default 0)" in " ".join(build_parser().format_help().split())


@pytest.mark.parametrize("argv", [["--test", "bench", "--sizes", ""], ["--test", "bench", "--sizes", ","],
                                  ["--test", "bench", "--sizes", "1G:1K"], ["--test", "bench", "--sizes", "1:2:3:4"],
                                  ["--test", "bench", "--sizes", "1K:1G:1"], ["--test", "bench", "--sizes", "1K:32G:2"],
                                  ["--test", "bench", "--sizes", ",".join(["1K"] * 65)],
                                  ["--test", "pairs", "--pair-size", ""], ["--test", "pairs", "--pair-size", "64T"]])
def test_bad_gpu_test_sizes_are_refused(capsys, argv: list) -> None:
    line = _refused(capsys, ["-w", "nodeA", *argv])
    assert argv[2] in line


@pytest.mark.parametrize("argv", [["--timeout", "nan"], ["--timeout", "inf"], ["--timeout", "-1"],
                                  ["--nproc", "1"], ["--nproc", "1e3"]])
def test_the_demo_refuses_bad_numbers_before_it_starts_a_job(capsys, tmp_path, monkeypatch, argv: list) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    line = _refused(capsys, ["demo", *argv])
    assert argv[0] in line
    assert list(tmp_path.iterdir()) == []  # no job directory: nothing was started


@pytest.mark.parametrize("text,value", [("3", 3), (" 3 ", 3), ("+3", 3)])
def test_plain_counts_are_read(text: str, value: int) -> None:
    assert numbers.count(1, 10).parse(text, "--n") == value


@pytest.mark.parametrize("text,value", [("0.5", 0.5), ("2", 2.0), (".5", 0.5), ("1e1", 10.0), ("60", 60.0)])
def test_plain_seconds_are_read(text: str, value: float) -> None:
    assert numbers.seconds(0, 60).parse(text, "--s") == value


def test_every_numeric_flag_of_help_states_its_range() -> None:
    text = " ".join(build_parser().format_help().split())
    for flag, rng in (("--timeout", "0.1-600 s"), ("--samples", "1-100"), ("--interval", "0-3600 s"),
                      ("--strace", "0-60 s"), ("--connect-timeout", "0.1-600 s"), ("--fanout", "1-4096"),
                      ("--max-hosts", "1-100000"), ("--pid", "1-4194304"), ("--refresh", "0.5-3600 s"),
                      ("--fps", "1-120"), ("--test-timeout", "1-3600 s"), ("--startup-timeout", "1-3600 s"),
                      ("--iters", "1-10000"), ("--warmup", "0-1000"), ("--procs-per-node", "1-256"),
                      ("--slow-ratio", "over 0 and below 1"), ("--min-busbw", "over 0 and up to 100000 GB/s")):
        assert flag in text and rng in text, (flag, rng)
