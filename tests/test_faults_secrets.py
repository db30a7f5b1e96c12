"""Fault matrix, secrets: a rank with secrets in its environment, its argv and its locals, investigated through
the real CLI on this machine: no secret value may reach the terminal, the snapshot file or any exported file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from worker_targets import Target, rank_env, wait_blocked

REPO = Path(__file__).resolve().parent.parent
SECRETS = {
    "env": "envSecretValue-7f3a9c2e41",
    "argv": "argvSecretValue-c81d0b5e77",
    "local": "localSecretValue-19e4a6f0d3",
    "url": "urlSecretPw-5b2e8c",
    "token": "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",  # a GitHub token shape, found by its form
}

# The locals' values come from a file, so the only way they can travel is as locals (not in argv or source).
RANK = textwrap.dedent("""
    import os, sys
    def train(password, db_url, token):
        r, _w = os.pipe()
        step = 3
        print("ready", os.getpid(), flush=True)
        os.read(r, 1)
    values = open(sys.argv[1]).read().split()
    train(values[0], "postgres://admin:%s@db:5432/x" % values[1], values[2])
""")


def test_secrets_in_env_argv_and_locals_never_reach_the_screen_or_any_file(tmp_path) -> None:
    # a job of one rank: every rank of it collected is exit 0
    env = rank_env(0, WORLD_SIZE="1", HF_TOKEN=SECRETS["env"], WANDB_API_KEY=SECRETS["env"])
    values = tmp_path / "values.txt"
    values.write_text(" ".join([SECRETS["local"], SECRETS["url"], SECRETS["token"]]))
    argv = [sys.executable, "-c", RANK, str(values), "--api-key", SECRETS["argv"], f"--password={SECRETS['argv']}"]
    with Target(argv, env=env) as t:
        wait_blocked(t.pid)
        out, bundle = tmp_path / "snap.json", tmp_path / "bundle"
        res = subprocess.run([sys.executable, "-m", "app", "--pid", str(t.pid), "--snapshot", str(out),
                              "--export", str(bundle), "--tar", "--samples", "1"],
                             cwd=str(REPO), capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, NO_COLOR="1"))
    assert res.returncode == 0, res.stderr
    assert "train" in res.stdout  # the rank really was collected, with its stack
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p != values]
    assert any(p.name.endswith(".tar.gz") for p in files) and len(files) > 4
    texts = {"stdout": res.stdout, "stderr": res.stderr}
    texts.update({str(p): p.read_bytes().decode("utf-8", "replace") for p in files
                  if not p.name.endswith(".tar.gz")})
    import tarfile

    with tarfile.open(next(p for p in files if p.name.endswith(".tar.gz"))) as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member)
            if f is not None:
                texts[f"tar:{member.name}"] = f.read().decode("utf-8", "replace")
    leaks = [(where, what) for where, text in texts.items() for what, value in SECRETS.items() if value in text]
    assert leaks == []
    assert "\x1b[" not in res.stdout, "NO_COLOR and a pipe: no escape sequences in the summary"
    # the names stay, so a reader knows what was hidden
    snap_text = out.read_text()
    assert "HF_TOKEN" in snap_text or "--api-key" in snap_text
