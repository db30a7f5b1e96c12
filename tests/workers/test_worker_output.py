"""A rank's recent error output read on its node (workers/collect/output.py), from real processes: the end of a
stderr that is a file, from its last traceback, redacted; nothing from a pipe, from /dev/null or from a log
without an error; torchrun's elastic error file (TORCHELASTIC_ERROR_FILE, the JSON @record writes); and the same
through the real worker's discover op, as the login side receives it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from waiting import wait_until
from worker_client import WorkerProc
from workers.collect import output

SECRET = "hunter2-very-secret-token-0123456789"
# a training-like script: progress lines, then an error it catches, prints and stays alive after
CHILD = f"""
import sys, time, traceback
for step in range(50):
    print(f"step {{step}} loss 0.{{step}}", file=sys.stderr)
def load(path):
    raise RuntimeError("checkpoint shard missing: " + path + " password={SECRET}")
try:
    load("/ckpt/shard7.pt")
except RuntimeError:
    traceback.print_exc()
sys.stderr.flush()
print("ready", flush=True)
time.sleep(600)
"""


def _start(stderr, code: str = CHILD, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=stderr,
                            env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


@pytest.fixture
def child_with_log(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    log = tmp_path / "rank3.err"
    with open(log, "wb") as f:
        proc = _start(f)
    try:
        yield proc, log
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def test_the_end_of_a_stderr_file_is_read_from_its_last_traceback_redacted(child_with_log) -> None:
    proc, log = child_with_log
    (found,) = output.collect(proc.pid, [])
    assert found["source"] == "stderr" and found["path"] == str(log) and found["size"] == log.stat().st_size
    lines = found["text"].splitlines()
    assert lines[0] == "Traceback (most recent call last):", lines
    assert lines[-1].startswith("RuntimeError: checkpoint shard missing: /ckpt/shard7.pt"), lines
    assert "step 49" not in found["text"]  # the progress lines above the traceback are not the error
    assert SECRET not in found["text"] and "password=" in found["text"]  # redacted on the node
    assert 0 <= found["age"] < 600


def test_a_pipe_dev_null_or_a_log_without_an_error_gives_nothing(tmp_path: Path) -> None:
    quiet = "import sys\nfor i in range(9): print('step', i, file=sys.stderr)\nsys.stderr.flush()\n" \
            "print('ready', flush=True)\nimport time; time.sleep(600)\n"
    log = tmp_path / "quiet.err"
    procs = []
    try:
        procs.append(_start(subprocess.PIPE))  # a pipe: reading it would take the output from its reader
        procs.append(_start(subprocess.DEVNULL))
        with open(log, "wb") as f:
            procs.append(_start(f, quiet))
        assert [output.collect(p.pid, []) for p in procs] == [[], [], []]
        assert log.read_text().count("step") == 9  # there was output, none of it an error
    finally:
        for p in procs:
            p.kill()
            p.wait()
            for stream in (p.stdout, p.stderr):
                if stream is not None:
                    stream.close()


def test_the_elastic_error_file_is_read_when_the_rank_wrote_it(child_with_log, tmp_path: Path) -> None:
    proc, _ = child_with_log
    err = tmp_path / "error.json"  # what torch.distributed.elastic's @record writes when the rank raises
    err.write_text(json.dumps({"message": {"message": f"ValueError: bad batch token={SECRET}", "extraInfo": {
        "py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
                        f"ValueError: bad batch token={SECRET}\n", "timestamp": "1795550000"}}}))
    found = output.collect(proc.pid, [("TORCHELASTIC_ERROR_FILE", str(err))])
    assert [f["source"] for f in found] == ["stderr", "error_file"]
    text = found[1]["text"]
    assert found[1]["path"] == str(err) and text.startswith("Traceback (most recent call last):")
    assert "ValueError: bad batch" in text and SECRET not in text
    assert output.collect(proc.pid, [("TORCHELASTIC_ERROR_FILE", str(tmp_path / "not-yet"))])[1:] == []


def test_the_worker_sends_it_with_the_rank(child_with_log) -> None:
    proc, log = child_with_log
    with WorkerProc() as w:
        items, done = w.call("discover", {"pids": [proc.pid]})
        assert done["type"] == "done", done
        (rank,) = [i for i in items if i.get("pid") == proc.pid]
        (found,) = rank["output"]
        assert found["path"] == str(log) and "RuntimeError: checkpoint shard missing" in found["text"]
        assert SECRET not in json.dumps(items)
    wait_until(lambda: proc.poll() is None, 5, "the process still runs: reading its output touched nothing")
