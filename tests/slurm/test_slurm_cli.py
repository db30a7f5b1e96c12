"""The command line's SLURM arguments: refused combinations and a missing SLURM, before anything connects."""

from __future__ import annotations

import pytest

from app.cli import EXIT_INPUT, main


def test_transport_srun_needs_a_job(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--transport", "srun", "-w", "node01", "--print"]) == EXIT_INPUT
    assert "--transport does nothing without --slurm" in capsys.readouterr().err


def test_slurm_and_hosts_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--slurm", "12", "-w", "node01", "--print"]) == EXIT_INPUT
    assert "--slurm finds the job's nodes itself; do not also give -w node01" in capsys.readouterr().err


def test_slurm_without_slurm_installed_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without SLURM's commands
    assert main(["--slurm", "12", "--print"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "hangscope: SLURM: SLURM's scontrol is not on PATH" in err and "hint:" in err


def test_slurm_without_id_outside_an_allocation(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert main(["--slurm", "--print"]) == EXIT_INPUT
    assert "SLURM_JOB_ID is not set" in capsys.readouterr().err
