"""What a worker's start loads: every node pays it at every session, before its first request (bench/worker.py)."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
from pathlib import Path

from workers import compact
from workers.cleartext import keyed_token

REPO = str(Path(__file__).resolve().parents[2])


def test_a_worker_that_collects_loads_no_openssl() -> None:
    # A fresh interpreter as a node's (-S): the worker's entry imported, a stack id made and a plain text redacted,
    # as a snapshot's collect does. hashlib's import loads OpenSSL's libcrypto (~4 ms of a start) for nothing the
    # worker uses: blake2b is CPython's own, and only the login side makes keyed tokens.
    code = ("import json,sys; sys.path.insert(0, %r); import workers.__main__; from workers import compact, redact;"
            "compact.stack_id({'frames': [{'name': 'f', 'filename': 'a.py', 'line': 1}]});"
            "redact.redact_text('a plain line, token=abc123 nothing else');"
            "print(json.dumps(sorted(m for m in sys.modules if m in ('_hashlib', 'hashlib', 'hmac', '_ssl'))))"
            % REPO)
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_stack_ids_and_keyed_tokens_are_the_same_digests_as_hashlibs() -> None:
    # The same content gives the same id on every node and in every version that shipped ids (relays and the login
    # side compare them), and a token is HMAC-SHA256 under its key.
    entry = {"frames": [{"name": "train", "filename": "train.py", "line": 42, "module": None}], "loops": {}}
    text = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    assert compact.stack_id(entry) == hashlib.blake2b(text, digest_size=compact.ID_BYTES).hexdigest()
    key = b"k" * 32
    assert keyed_token(key, "str", "s3cr3t") == "<str len=6 #%s>" % hmac.new(key, b"s3cr3t", "sha256").hexdigest()[:8]
