"""The srun transport's node-side stage (app/transport/srun/stage.py), run for real as srun runs it: the
`python -c` argument from mux_stage, one task's environment, the payload then framed lines on its stdin.
No SLURM here (tests/slurm/test_slurm_cluster.py runs it under a real srun); this checks the framing both ways."""

from __future__ import annotations

import base64
import os
import subprocess

import pytest

import testenv
from app.transport.srun.mux import FRAME_RAW, KILL_GRACE, frame, mux_stage

pytestmark = pytest.mark.timeout(60)

# A stand-in worker (named as such: the real one is tested under srun): reads stdin to EOF, answers on both
# streams, exits 3.
ECHO = ("import sys; d = sys.stdin.buffer.read(); sys.stdout.buffer.write(d[::-1] * 300); "
        "sys.stderr.write('bye'); sys.exit(3)")


def _run(worker: list[str], payload: bytes, lines: bytes, task: str = "1") -> list[tuple[str, str, bytes]]:
    env = {**os.environ, "SLURM_PROCID": task, "SLURMD_NODENAME": "node-ä"}
    done = subprocess.run([testenv.PYTHON, "-c", mux_stage(worker, len(payload))], input=payload + lines,
                          capture_output=True, timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    frames = []
    for line in done.stdout.splitlines():
        t, kind, *data = line.split(b" ")
        assert len(line) < 1000  # srun passes lines under ~1 KB whole
        frames.append((t.decode(), kind.decode(), base64.b64decode(data[0]) if data else b""))
    return frames


def test_stage_relays_its_tasks_lines_and_frames_the_workers_streams() -> None:
    other = frame(0, "D", b"not mine") + frame(0, "E")  # task 0's lines: every task reads them, only 0 acts
    frames = _run([testenv.PYTHON, "-c", ECHO], b"hello", other + frame(1, "D", b" world") + frame(1, "E"))
    assert {t for t, _, _ in frames} == {"1"}
    assert frames[0] == ("1", "H", "node-ä".encode())
    out = b"".join(d for _, k, d in frames if k == "O")
    assert out == b"dlrow olleh" * 300
    assert max(len(d) for _, k, d in frames if k == "O") <= FRAME_RAW
    assert b"".join(d for _, k, d in frames if k == "E") == b"bye"
    assert frames[-1] == ("1", "X", b"3")


def test_stage_kills_a_worker_that_ignores_eof_after_the_grace_period() -> None:
    stubborn = "import sys, time; sys.stdin.buffer.read(); print('eof', flush=True); time.sleep(60)"
    frames = _run([testenv.PYTHON, "-c", stubborn], b"", frame(1, "K"))
    assert b"".join(d for _, k, d in frames if k == "O") == b"eof\n"
    assert frames[-1] == ("1", "X", b"-9"), f"not killed within {KILL_GRACE} s of K"


def test_stage_ends_every_worker_when_sruns_stdin_ends() -> None:
    frames = _run([testenv.PYTHON, "-c", ECHO], b"abc", b"")
    assert b"".join(d for _, k, d in frames if k == "O") == b"cba" * 300 and frames[-1][1:] == ("X", b"3")


def test_stage_takes_lines_addressed_to_every_task_or_to_its_range() -> None:
    """A request sent to many nodes goes out once (`*` or ranges, mux.targets): srun's --input=all copies each
    line to every node, so per-node lines would cost nodes^2 (issue 27)."""
    lines = (frame(b"*", "D", b"all ") + frame(b"0,2-5", "D", b"range ") + frame(b"0,2", "D", b"not ")
             + frame(b"3-4", "D", b"nor ") + frame(b"x-y", "D", b"junk ") + frame(1, "E"))
    frames = _run([testenv.PYTHON, "-c", ECHO], b"", lines, task="3")  # EOF when srun's stdin ends
    assert b"".join(d for _, k, d in frames if k == "O") == b"all range nor "[::-1] * 300
    frames = _run([testenv.PYTHON, "-c", ECHO], b"", lines, task="1")
    assert b"".join(d for _, k, d in frames if k == "O") == b"all "[::-1] * 300


def test_targets_names_every_task_or_ranges() -> None:
    from app.transport.srun.mux import targets

    assert targets([3, 1, 2, 0], 4) == b"*"
    assert targets([0, 2, 3, 4, 7], 9) == b"0,2-4,7"
    assert targets([5], 9) == b"5"
    assert targets([0, 1], -1) == b"0-1"  # not every node of the step has said which task it is
