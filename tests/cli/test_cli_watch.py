"""`hangscope watch` as a user runs it: help, every number range-checked (nan and inf refused, exit 2) before
anything connects, unsafe --out refused; and on this machine (no SSH), a process that makes no progress is
captured: the bundle is private, --on-hang gets its path, and --once ends the watch."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def watch(*args: str, stdin: bytes | None = None, timeout: float = 60, cwd: Path | None = None,
          env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", "watch", *args], input=stdin, capture_output=True,
                          cwd=cwd or REPO, timeout=timeout, env=dict(env or os.environ, PYTHONPATH=str(REPO)))


def test_help_says_what_watch_does_and_what_it_passes_to_the_hook() -> None:
    res = watch("--help")
    assert res.returncode == 0
    out = " ".join(res.stdout.decode().split())
    for text in ("usage: hangscope watch", "--every", "--stall", "--slow", "--keep", "--on-hang", "--once", "--tui",
                 "--slurm", "HANGSCOPE_BUNDLE", "HANGSCOPE_HEADLINE", "never restarts, stops or kills anything"):
        assert text in out, text
    main = subprocess.run([sys.executable, "-m", "app", "--help"], capture_output=True, cwd=REPO, timeout=60)
    assert "hangscope watch" in main.stdout.decode()


@pytest.mark.parametrize("flag,value", [
    ("--every", "nan"), ("--every", "inf"), ("--every", "0"), ("--every", "-1"), ("--every", "1e9"),
    ("--stall", "nan"), ("--stall", "-inf"), ("--stall", "0.5"), ("--stall-start", "nan"), ("--slow", "nan"), ("--slow", "1"),
    ("--slow", "-0.1"), ("--keep", "0"), ("--keep", "-3"), ("--on-hang-timeout", "inf"), ("--wait-start", "nan"),
    ("--timeout", "nan"), ("--timeout", "0"), ("--connect-timeout", "inf"), ("--fanout", "0"), ("--fps", "0"),
])
def test_every_number_is_range_checked_before_anything_connects(tmp_path: Path, flag: str, value: str) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node-that-does-not-exist.invalid\n")
    t0 = time.monotonic()
    res = watch(str(hosts), flag, value, "--out", str(tmp_path / "out"))
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert flag in err and "Traceback" not in err
    assert time.monotonic() - t0 < 30 and not (tmp_path / "out").exists(), "refused before anything else"


WATCH_NUMBERS = ("--every", "--stall", "--stall-start", "--slow", "--keep", "--on-hang-timeout", "--wait-start",
                 "--fps", "--timeout", "--pid", "--fanout", "--connect-timeout", "--max-hosts")


@pytest.mark.parametrize("value", ["1_0", "\u0663", "\uff13", "0x10", "5s", "", " ", "1e999", "9" * 50])
def test_watch_numbers_take_only_plain_ascii_decimals_as_the_main_command_does(value: str) -> None:
    """Python's int() and float() take `1_0`, Arabic-Indic and full-width digits: the main command refuses them
    (app.inputs.numbers), and watch's flags go through the same kinds (the blind inputs-w set: watch took them
    and ran)."""
    from app.cli.watch import build_parser
    from app.errors import InputError

    for flag in WATCH_NUMBERS:
        with pytest.raises(InputError) as err:  # one line, exit 2 (app.cli.main reports it)
            build_parser().parse_args(["-w", "node01", flag, value])
        text = str(err.value)
        assert flag in text and "\n" not in text, (flag, value, text)


def test_a_flag_both_commands_take_has_one_range() -> None:
    """--timeout 601 or --fps 121 is refused by watch as by the main command (app/cli/ranges.py)."""
    from app.cli import build_parser as main_parser
    from app.cli.watch import build_parser

    from app.errors import InputError

    for flag, over in (("--timeout", "601"), ("--fps", "121"), ("--connect-timeout", "601"), ("--fanout", "4097"),
                       ("--max-hosts", "100001"), ("--pid", "4194305")):
        for parser in (main_parser(), build_parser()):
            with pytest.raises(InputError, match="out of range"):
                parser.parse_args(["-w", "node01", flag, over])


@pytest.mark.parametrize("args,expect", [
    (("--every", "30", "--stall", "10"), "shorter than --every"),
    (("--on-hang", "'unbalanced"), "--on-hang"),
    (("--on-hang", ""), "--on-hang is empty"),
    (("--native", "--nonblocking"), "--native"),
    (("--match", "("), "--match"),
    (("--fps", "10"), "--fps limits the TUI"),
    (("--job", ""), "--job is empty"),
    (("--python", ""), "--python is empty"),
])
def test_contradictions_and_bad_commands_are_refused(tmp_path: Path, args: tuple, expect: str) -> None:
    res = watch("-w", "node01", *args, "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and expect in res.stderr.decode(), res.stderr.decode()


def test_an_out_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "out").symlink_to(target)
    res = watch("--pid", str(os.getpid()), "--out", str(tmp_path / "out"), "--wait-start", "0")
    assert res.returncode == 2 and "symlink" in res.stderr.decode()
    assert list(target.iterdir()) == []


def test_hosts_come_from_stdin_with_a_dash(tmp_path: Path) -> None:
    """`hangscope watch -` reads the hosts as the main command does: the one given on stdin is the one tried
    (here it cannot be resolved: said lost, and with no job found within --wait-start 0, exit 3)."""
    res = watch("-", "--wait-start", "0", "--connect-timeout", "2", "--out", str(tmp_path / "out"),
                stdin=b"# a comment\nnohost-from-stdin.invalid\n")
    text = res.stdout.decode()
    assert res.returncode == 3, f"{text}\n{res.stderr.decode()}"
    assert "nohost-from-stdin.invalid: lost (" in text and "no job was found" in text, text


def test_slurm_is_resolved_by_the_main_commands_rules_before_anything_is_written(tmp_path: Path) -> None:
    """--slurm takes the main command's path: without SLURM's commands, and beside -w, it is refused (exit 2)
    before --out is created. Watching a SLURM job over srun end to end: tests/slurm/test_slurm_cluster.py."""
    env = dict(os.environ, PATH=str(tmp_path))  # a machine without SLURM's commands
    res = watch("--slurm", "12", "--out", str(tmp_path / "out"), env=env)
    assert res.returncode == 2 and "SLURM's scontrol is not on PATH" in res.stderr.decode(), res.stderr.decode()
    res = watch("--slurm", "12", "-w", "node01", "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and "--slurm finds the job's nodes itself; do not also give -w node01" in res.stderr.decode(), res.stderr.decode()
    res = watch("-w", "node01", "--transport", "srun", "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and "--transport srun needs --slurm" in res.stderr.decode(), res.stderr.decode()
    assert not (tmp_path / "out").exists()


STILL_RANK = """
import os, sys, time
def wait_forever(api_token):
    print("ready", flush=True)
    while True:
        time.sleep(3600)
wait_forever("hf_QmZ8aXk2Lr9VtB7cYw3NdP6sJ1eF4gHuT0")
"""
SECRETS = ("hf_QmZ8aXk2Lr9VtB7cYw3NdP6sJ1eF4gHuT0", "Tr0ub4dor-and-3", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq3Tk8vLmN")


def test_a_process_that_makes_no_progress_is_captured_and_the_hook_gets_the_bundle(tmp_path: Path) -> None:
    """This machine, no SSH: a 'rank' (RANK in its environment) that never moves is captured after --stall;
    --once ends the watch after the capture; --on-hang runs (no shell) with the bundle in its environment."""
    script = tmp_path / "still_rank.py"
    script.write_text(STILL_RANK)
    # secrets in its locals (--locals is on at a capture), its command line and its environment
    rank = subprocess.Popen([sys.executable, str(script), "--password", SECRETS[1]], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL,
                            env=dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                                     MASTER_PORT="29999", AWS_SECRET_ACCESS_KEY=SECRETS[2]))
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == b"ready"
        seen = tmp_path / "hook.json"
        hook = tmp_path / "hook.py"
        hook.write_text("import json, os, sys\njson.dump({k: v for k, v in os.environ.items() "
                        "if k.startswith('HANGSCOPE_')}, open(sys.argv[1], 'w'))\n")
        out = tmp_path / "captures"
        t0 = time.monotonic()
        res = watch("--pid", str(rank.pid), "--every", "0.5", "--stall", "2", "--stall-start", "2", "--once",
                    "--out", str(out), "--on-hang", f"{sys.executable} {hook} {seen}", "--wait-start", "30", timeout=120)
        took = time.monotonic() - t0
        text = res.stdout.decode()
        assert res.returncode == 0, f"{text}\n{res.stderr.decode()}"
        assert "has made no progress for" in text and "captured (hang)" in text, text
        captures = [p for p in out.iterdir() if p.is_dir()]
        assert len(captures) == 1
        bundle = captures[0]
        assert stat.S_IMODE(os.lstat(out).st_mode) == 0o700 and stat.S_IMODE(os.lstat(bundle).st_mode) == 0o700
        files = sorted(p.name for p in bundle.iterdir())
        assert {"snapshot.json", "summary.md", "report.html", "manifest.json", "watch.json"} <= set(files)
        assert all(stat.S_IMODE(os.lstat(bundle / f).st_mode) == 0o600 for f in files)
        doc = json.loads((bundle / "watch.json").read_text())
        assert doc["kind"] == "hang" and doc["stall_limit"] == 2
        # redacted: the local's name is there (the capture read it), no secret's value is, in any file
        everything = "\n".join((bundle / f).read_text(errors="replace") for f in files)
        assert "api_token" in everything and "wait_forever" in everything
        for secret in SECRETS:
            assert secret not in everything, f"a secret in the capture: {secret}"
        assert "api_token (arg) = ***" in (bundle / "report.html").read_text(), "the value replaced, not dropped"
        env = json.loads(seen.read_text())
        assert env["HANGSCOPE_BUNDLE"] == str(bundle) and env["HANGSCOPE_KIND"] == "hang"
        assert env["HANGSCOPE_SNAPSHOT"] == str(bundle / "snapshot.json") and env["HANGSCOPE_HEADLINE"]
        assert (out / "history.jsonl").exists()
        assert rank.poll() is None, "the rank was left running"
        assert took < 90, took
    finally:
        rank.kill()
        rank.wait(timeout=10)


def test_a_watch_started_with_sigint_ignored_goes_on_through_ctrl_c_and_sigterm_ends_it(tmp_path: Path) -> None:
    """`hangscope watch ... &` from a script (no job control) or under nohup has SIGINT ignored: the Ctrl+C typed
    for the foreground command does not end the watch (it keeps sampling); SIGTERM (kill) still ends it cleanly."""
    import signal

    from waiting import wait_until

    script = tmp_path / "still_rank.py"
    script.write_text(STILL_RANK)
    rank = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29998"))
    out = tmp_path / "captures"
    history = out / "history.jsonl"

    def samples() -> int:
        return history.read_text().count("\n") if history.exists() else 0

    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == b"ready"
        proc = subprocess.Popen([sys.executable, "-m", "app", "watch", "--pid", str(rank.pid), "--every", "0.5",
                                 "--stall", "600", "--out", str(out)], cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            wait_until(lambda: samples() >= 1 or proc.poll() is not None, 60, "the watch's first sample")
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            proc.send_signal(signal.SIGINT)
            after = samples()
            wait_until(lambda: samples() >= after + 3 or proc.poll() is not None, 60, "3 more samples")
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        assert "SIGINT" not in err and "SIGTERM: stopping" in err, err
        assert "Traceback" not in err, err
    finally:
        rank.kill()
        rank.wait(timeout=10)


def test_a_watch_whose_stdout_reader_goes_away_ends_cleanly(tmp_path: Path) -> None:
    """`hangscope watch ... | head -1`: the first line read, the pipe closed: the watch ends at its next line,
    exit 0, no traceback (a BrokenPipeError at exit made it 120 with one)."""
    proc = subprocess.Popen([sys.executable, "-m", "app", "watch", "-w", "node-that-does-not-exist.invalid",
                             "--every", "1", "--connect-timeout", "1", "--wait-start", "60", "-v",
                             "--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    try:
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    err = proc.stderr.read().decode()
    assert b"watching" in first and code == 0 and "Traceback" not in err and "Broken pipe" not in err, (code, err)


def test_an_ssh_config_that_is_a_fifo_is_refused_before_the_out_directory_is_made(tmp_path: Path) -> None:
    fifo = tmp_path / "config"
    os.mkfifo(fifo)
    res = watch("-w", "node01", "-F", str(fifo), "--out", str(tmp_path / "out"), timeout=30)
    assert res.returncode == 2 and "is a FIFO" in res.stderr.decode() and not (tmp_path / "out").exists()
