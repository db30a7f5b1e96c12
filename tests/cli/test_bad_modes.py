"""Issue 25, bad input: a flag that does nothing in the mode given is refused up front (exit 2, one line naming
the flag), instead of being ignored: collection and SSH flags with --load, --tar without --export,
--strace-data without --strace, --force alone, GPU-test flags without --test, ... In-process; nothing connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from app.cli.modes import RULES

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = str(REPO / "tests" / "data" / "scenarios" / "skip.json")
LOAD = ["--load", SNAPSHOT, "--print"]
COLLECT = ["-w", "nodeA", "--print"]


def _refused(capsys, argv: list) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("extra", [
    ["--pid", "1"], ["--strace", "1"], ["--match", "train"], ["--native"], ["--samples", "3"], ["--interval", "2"],
    ["--slurm", "12"], ["--gdb"], ["--no-locals"], ["--no-store"], ["--sudo"], ["--timeout", "5"],
    ["--gpu-evidence", "off"], ["-F", "cfg"], ["-i", "key"], ["--fanout", "2"], ["--connect-timeout", "2"],
    ["--python", "python3"], ["--max-hosts", "5"], ["--accept-new-host-keys"], ["--nonblocking"],
    ["--test", "sanity"], ["--snapshot", "x.json"], ["--refresh", "2"], ["--fps", "10"], ["-w", "nodeA"],
    ["--test-timeout", "5"], ["--transport", "ssh"], ["--relay", "8"],
])
def test_collection_ssh_and_test_flags_do_nothing_with_load(capsys, extra: list) -> None:
    line = _refused(capsys, [*LOAD, *extra])
    assert extra[0] in line and "does nothing" in line


@pytest.mark.parametrize("argv,flag,why", [
    ([*COLLECT, "--tar"], "--tar", "without --export"),
    ([*COLLECT, "--strace-data"], "--strace-data", "without --strace"),
    ([*COLLECT, "--strace", "0", "--strace-data"], "--strace-data", "without --strace"),
    ([*COLLECT, "--force"], "--force", "without an output"),
    ([*LOAD, "--force"], "--force", "without an output"),
    (["--print", "--fanout", "4"], "--fanout", "without hosts"),
    (["--print", "-F", "cfg"], "-F", "without hosts"),
    (["--print", "--relay", "off"], "--relay", "without hosts"),
    ([*COLLECT, "--transport", "srun"], "--transport", "without --slurm"),
    ([*COLLECT, "--refresh", "5"], "--refresh", "headless"),
    ([*COLLECT, "--fps", "5"], "--fps", "headless"),
    (["-w", "nodeA", "--samples", "3"], "--samples", "in the TUI"),
    (["-w", "nodeA", "--job", "29500"], "--job", "in the TUI"),
    ([*COLLECT, "--test-timeout", "5"], "--test-timeout", "without --test"),
    ([*COLLECT, "--json", "out.json"], "--json", "headless"),
    ([*COLLECT, "--sizes", "1K"], "--sizes", "without --test"),
    (["-w", "nodeA", "--test", "sanity", "--snapshot", "x.json"], "--snapshot", "with --test"),
    (["-w", "nodeA", "--test", "sanity", "--strace", "1"], "--strace", "with --test"),
    (["-w", "nodeA", "--test", "sanity", "--export", "d"], "--export", "with --test"),
    # a GPU-test flag read by other tests than the one run
    (["-w", "nodeA", "--test", "pairs", "--sizes", "1M"], "--sizes", "with --test pairs (it applies to --test bench)"),
    (["-w", "nodeA", "--test", "pairs", "--warmup", "1"], "--warmup", "with --test pairs"),
    (["-w", "nodeA", "--test", "bench", "--all-pairs"], "--all-pairs", "with --test bench"),
    (["-w", "nodeA", "--test", "net", "--pair-size", "1M"], "--pair-size", "it applies to --test pairs"),
    (["-w", "nodeA", "--test", "bench", "--target", "n1:29500"], "--target", "it applies to --test net"),
    # a positional argument is named by its value: the user typed no flag
    ([*LOAD, "some-hosts-file"], "HOSTS some-hosts-file", "with --load"),
    (["some-hosts-file", "--slurm", "12", "--print"], "HOSTS some-hosts-file", "--slurm finds the job's nodes"),
    (["-w", "gpu[1-2]", "--slurm", "12", "--print"], "-w gpu[1-2]", "--slurm finds the job's nodes"),
])
def test_a_flag_that_does_nothing_in_its_mode_is_named(capsys, argv: list, flag: str, why: str) -> None:
    line = _refused(capsys, argv)
    assert flag in line and why in line


def test_the_table_covers_every_flag_of_the_parser() -> None:
    from app.cli import build_parser

    dests = {a.dest for a in build_parser()._actions if a.dest not in ("help", "version", "quiet", "load")}
    assert dests <= set(RULES), sorted(dests - set(RULES))


@pytest.mark.parametrize("argv", [
    [*LOAD, "--export", "{tmp}/b", "--tar", "--job", "29500"],
    [*LOAD, "-q"],
])
def test_flags_that_do_something_are_still_accepted(capsys, tmp_path: Path, argv: list) -> None:
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code in (0, 2)
    if code == 2:  # --job may name no job of this snapshot: a different refusal, not "does nothing"
        assert "does nothing" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["-w", "nodeA", "--test", "bench", "--sizes", "1K", "--iters", "2", "--warmup", "0", "--backend", "gloo"],
    ["-w", "nodeA", "--test", "sanity", "--iters", "2", "--warmup", "0", "--nccl-env", "NCCL_P2P_DISABLE=1"],
    ["-w", "nodeA", "--test", "pairs", "--pair-size", "1K", "--slow-ratio", "0.4", "--all-pairs", "--no-gpu-pairs",
     "--min-busbw", "3"],
    ["-w", "nodeA", "--test", "net", "--target", "127.0.0.1:1", "--test-timeout", "5"],
])
def test_gpu_test_flags_pass_with_the_tests_that_read_them(argv: list) -> None:
    from app.cli import build_parser
    from app.cli.modes import check_modes, explicit_flags

    assert check_modes(build_parser().parse_args(argv), explicit_flags(build_parser, argv)) == "test"


@pytest.mark.parametrize("argv,mode", [
    (["-w", "nodeA", "--strace-data"], "tui"),  # the TUI runs strace on a key press, with this setting
    (["--pid", "1", "--strace-data"], "tui"),
    (["-w", "nodeA", "--print", "--raw"], "headless"),
    (["--load", "x.json", "--print", "--raw"], "load"),
])
def test_flags_that_apply_in_a_mode_without_their_headless_companion_pass(argv: list, mode: str) -> None:
    from app.cli import build_parser
    from app.cli.modes import check_modes, explicit_flags

    assert check_modes(build_parser().parse_args(argv), explicit_flags(build_parser, argv)) == mode


@pytest.mark.parametrize("argv", [["--raw"], ["--raw", "--export", "rep"], ["--load", "x.json", "--raw"],
                                  ["--load", "x.json", "--export", "rep", "--raw"]])
def test_raw_needs_a_snapshot_file_or_print_whatever_the_mode(capsys, argv: list) -> None:
    """--raw lifts default-deny from --snapshot and --print only; an export bundle is always safe to share."""
    line = _refused(capsys, argv)
    assert "--raw does nothing without --snapshot FILE or --print (an --export bundle is always default-deny)" in line


@pytest.mark.parametrize("value", ["1", "0", "-3", "wide", "10001"])
def test_a_relay_width_is_auto_off_or_two_and_more(capsys, value: str) -> None:
    line = _refused(capsys, ["-w", "nodeA", "--print", "--relay", value])
    assert "--relay" in line and "auto, off or a width from 2" in line
