"""Redaction of secrets in command lines, environment values and free text (positive and negative cases)."""

from __future__ import annotations

import pytest

from workers.redact import redact_argv, redact_env_value, redact_text, secret_name

HF = "hf_" + "a1B2" * 9
GHP = "ghp_" + "Z9" * 18


@pytest.mark.parametrize("argv, expected", [
    (["--password", "x"], ["--password", "***"]),
    (["--token=x"], ["--token=***"]),
    (["--api-key", "k-123"], ["--api-key", "***"]),
    (["--api_key=abc"], ["--api_key=***"]),
    (["--hf_token", HF], ["--hf_token", "***"]),
    (["--hfToken", "abc"], ["--hfToken", "***"]),
    (["--secret", "s3"], ["--secret", "***"]),
    (["--db-passwd", "pw"], ["--db-passwd", "***"]),
    (["--aws-credentials", "c"], ["--aws-credentials", "***"]),
    (["--auth", "user:pw"], ["--auth", "***"]),
    (["--client_secret", "xyz"], ["--client_secret", "***"]),
    (["--password", "123456"], ["--password", "***"]),  # a strong name hides even a number
    (["HF_TOKEN=abc"], ["HF_TOKEN=***"]),
    (["WANDB_API_KEY=abc123"], ["WANDB_API_KEY=***"]),
    (["bash", "-c", "export WANDB_API_KEY=abc123; python t.py"],
     ["bash", "-c", "export WANDB_API_KEY=***; python t.py"]),
    (["--url", "https://alice:s3cr3t@example.com/repo"], ["--url", "https://alice:***@example.com/repo"]),
    (["redis://:pw@cache:6379"], ["redis://:***@cache:6379"]),
    (["--model", "x", GHP], ["--model", "x", "***"]),
    (["--header=Authorization: Bearer eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0NTY3.abcDEF_-x"],
     ["--header=Authorization: Bearer ***"]),
])
def test_secrets_are_masked_and_names_kept(argv: list, expected: list) -> None:
    assert redact_argv(argv) == expected


@pytest.mark.parametrize("argv", [
    ["python", "train.py", "--lr", "0.1", "--epochs", "3"],
    ["--keyframes", "3"],  # contains KEY but is a word of its own
    ["--max-tokens", "5"],  # a count of tokens, not a token
    ["--max_new_tokens=256"],
    ["--tokenizer", "/models/llama/tokenizer.model"],
    ["--num-key-value-heads", "8"],  # ambiguous 'key': a number under it is kept
    ["--use-auth", "--lr", "0.1"],  # a secret-named switch without a value
    ["--author", "me"],
    ["--master_addr=10.0.0.1", "--master_port", "29500"],
    ["http://host:8080/path"],
    ["--keyfile", "/etc/ssl/key.pem"],  # a path to a key file is not the key
])
def test_harmless_arguments_are_kept(argv: list) -> None:
    assert redact_argv(argv) == argv


@pytest.mark.parametrize("secret", [
    HF, "AKIAIOSFODNN7EXAMPLE", "xoxb-1234567890-abcdefghij", "github_pat_" + "A1" * 15, "gho_" + "x" * 36,
    "sk-proj-" + "Ab1" * 10, "eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0NTY3.abcDEF_-x",
])
def test_token_shapes_are_masked_anywhere(secret: str) -> None:
    out = redact_text("before (" + secret + ") after")
    assert out == "before (***) after"


def test_private_key_block_is_masked_whole() -> None:
    out = redact_text("k=-----BEGIN OPENSSH PRIVATE KEY-----\nAAAAB3\nxyz\n-----END OPENSSH PRIVATE KEY----- done")
    assert "AAAAB3" not in out and out.endswith(" done")


def test_env_values() -> None:
    assert redact_env_value("NCCL_IB_AUTH_TOKEN", "x") == "***"
    assert redact_env_value("NCCL_SOCKET_IFNAME", "eth0") == "eth0"
    assert redact_env_value("NCCL_NET_PLUGIN_KEY", "8") == "8"  # weak name, numeric value
    assert secret_name("NCCL_SECRET") and not secret_name("NCCL_DEBUG")


@pytest.mark.parametrize("text", [
    'x "a.token", 5',
    'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\nValueError: bad batch token=s3cr3t-v4lue',
    "{'model.key': 3, 'password': 'hunter2hunter2'}",
])
def test_a_quoted_dotted_name_in_text_with_a_secret_word_is_kept_and_never_crashes(text: str) -> None:
    # the quoted-key rule has no separator group: a dotted key ("train.py", "a.token") once raised IndexError
    out = redact_text(text)
    assert "s3cr3t-v4lue" not in out and "hunter2hunter2" not in out
    assert ('"a.token", 5' in out) if text.startswith("x ") else True
    assert ('File "train.py", line 9' in out) if "train.py" in text else True
